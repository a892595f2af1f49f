//! Paging state: where the next page of a SELECT starts.
//!
//! The state names the last row returned — its token, partition key and clustering (or
//! no clustering, meaning "that partition is finished") — plus how much of LIMIT and PER
//! PARTITION LIMIT is left. Clients echo it back opaquely; a state that does not decode is
//! a protocol error, never a panic.

use crate::CqlError;
use shoal_model::Token;

const FORMAT_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagingState {
    pub token: Token,
    pub partition_key: Vec<u8>,
    /// `None`: the partition was finished; resume at the next one.
    pub clustering: Option<Vec<u8>>,
    /// Rows still allowed by LIMIT.
    pub remaining: u64,
    /// Rows already returned from the current partition (for PER PARTITION LIMIT).
    pub partition_rows: u64,
}

impl PagingState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.partition_key.len());
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.token.0.to_be_bytes());
        out.extend_from_slice(&(self.partition_key.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.partition_key);
        match &self.clustering {
            Some(clustering) => {
                out.push(1);
                out.extend_from_slice(&(clustering.len() as u32).to_be_bytes());
                out.extend_from_slice(clustering);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&self.remaining.to_be_bytes());
        out.extend_from_slice(&self.partition_rows.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<PagingState, CqlError> {
        let invalid = || CqlError::protocol("Invalid value for the paging state");
        let mut position = 0;
        let mut take = |length: usize| -> Result<&[u8], CqlError> {
            let slice = bytes.get(position..position + length).ok_or_else(invalid)?;
            position += length;
            Ok(slice)
        };
        if take(1)?[0] != FORMAT_VERSION {
            return Err(invalid());
        }
        let token = Token(i64::from_be_bytes(
            take(8)?.try_into().map_err(|_| invalid())?,
        ));
        let key_length = u32::from_be_bytes(take(4)?.try_into().map_err(|_| invalid())?) as usize;
        let partition_key = take(key_length)?.to_vec();
        let clustering = match take(1)?[0] {
            0 => None,
            1 => {
                let length =
                    u32::from_be_bytes(take(4)?.try_into().map_err(|_| invalid())?) as usize;
                Some(take(length)?.to_vec())
            }
            _ => return Err(invalid()),
        };
        let remaining = u64::from_be_bytes(take(8)?.try_into().map_err(|_| invalid())?);
        let partition_rows = u64::from_be_bytes(take(8)?.try_into().map_err(|_| invalid())?);
        if position != bytes.len() {
            return Err(invalid());
        }
        Ok(PagingState {
            token,
            partition_key,
            clustering,
            remaining,
            partition_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paging_state_round_trips_and_rejects_garbage() {
        let state = PagingState {
            token: Token(-42),
            partition_key: b"key".to_vec(),
            clustering: Some(vec![1, 2, 3]),
            remaining: 10,
            partition_rows: 2,
        };
        assert_eq!(PagingState::decode(&state.encode()).unwrap(), state);
        assert!(PagingState::decode(&[]).is_err());
        assert!(PagingState::decode(&[1, 2, 3]).is_err());
        let mut truncated = state.encode();
        truncated.pop();
        assert!(PagingState::decode(&truncated).is_err());
    }
}
