//! Cells: the unit of storage and of last-write-wins reconciliation.
//!
//! Every write, whether a value, an expiring value (TTL) or a deletion, is a cell stamped
//! with its [`WriteTimestamp`]. Writes never read what is already stored: two cells for
//! the same place are reconciled later — in the memtable, in compaction, or on read — by
//! [`Cell::reconcile`], which is commutative and associative, so every replica converges on
//! the same winner whatever order writes arrive in.
//!
//! Encoded form (the value stored under a cell's key):
//! `kind: u8 | timestamp: i64 BE | [ttl_seconds: i32, expires_at: i32] (expiring) |
//! [deleted_at: i32] (tombstone) | value bytes (live and expiring)`.

use crate::{DecodeError, WriteTimestamp};
use std::cmp::Ordering;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellKind {
    /// A value that lives until overwritten or deleted.
    Live,
    /// A value written with a TTL: it reads as deleted from `expires_at` (seconds) on.
    Expiring { ttl_seconds: i32, expires_at: i32 },
    /// A deletion, made at `deleted_at` (seconds; used for tombstone purging after
    /// gc_grace_seconds).
    Tombstone { deleted_at: i32 },
}

/// One stored cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub timestamp: WriteTimestamp,
    pub kind: CellKind,
    /// The serialized value (empty for tombstones and row markers).
    pub value: Vec<u8>,
}

const KIND_LIVE: u8 = 0;
const KIND_EXPIRING: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;

impl Cell {
    pub fn live(timestamp: WriteTimestamp, value: Vec<u8>) -> Cell {
        Cell {
            timestamp,
            kind: CellKind::Live,
            value,
        }
    }

    /// A live cell, or an expiring one when `ttl_seconds > 0`.
    pub fn with_ttl(
        timestamp: WriteTimestamp,
        value: Vec<u8>,
        ttl_seconds: i32,
        now_seconds: i32,
    ) -> Cell {
        if ttl_seconds > 0 {
            Cell {
                timestamp,
                kind: CellKind::Expiring {
                    ttl_seconds,
                    expires_at: now_seconds.saturating_add(ttl_seconds),
                },
                value,
            }
        } else {
            Cell::live(timestamp, value)
        }
    }

    pub fn tombstone(timestamp: WriteTimestamp, deleted_at: i32) -> Cell {
        Cell {
            timestamp,
            kind: CellKind::Tombstone { deleted_at },
            value: Vec::new(),
        }
    }

    pub fn is_tombstone(&self) -> bool {
        matches!(self.kind, CellKind::Tombstone { .. })
    }

    /// True when the cell holds a value at `now_seconds` (not deleted, not expired).
    pub fn is_live(&self, now_seconds: i32) -> bool {
        match self.kind {
            CellKind::Live => true,
            CellKind::Expiring { expires_at, .. } => now_seconds < expires_at,
            CellKind::Tombstone { .. } => false,
        }
    }

    /// Seconds of TTL left at `now_seconds`, for `SELECT TTL(column)`.
    pub fn remaining_ttl(&self, now_seconds: i32) -> Option<i32> {
        match self.kind {
            CellKind::Expiring { expires_at, .. } => Some((expires_at - now_seconds).max(0)),
            _ => None,
        }
    }

    /// When this cell stopped being live (a deletion or an expiry), in seconds; `None` for
    /// live cells. Purging compares this with gc_grace_seconds.
    pub fn dead_since(&self) -> Option<i32> {
        match self.kind {
            CellKind::Live => None,
            CellKind::Expiring { expires_at, .. } => Some(expires_at),
            CellKind::Tombstone { deleted_at } => Some(deleted_at),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17 + self.value.len());
        self.encode_into(&mut out);
        out
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self.kind {
            CellKind::Live => {
                out.push(KIND_LIVE);
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
            }
            CellKind::Expiring {
                ttl_seconds,
                expires_at,
            } => {
                out.push(KIND_EXPIRING);
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
                out.extend_from_slice(&ttl_seconds.to_be_bytes());
                out.extend_from_slice(&expires_at.to_be_bytes());
            }
            CellKind::Tombstone { deleted_at } => {
                out.push(KIND_TOMBSTONE);
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
                out.extend_from_slice(&deleted_at.to_be_bytes());
            }
        }
        out.extend_from_slice(&self.value);
    }

    pub fn decode(bytes: &[u8]) -> Result<Cell, DecodeError> {
        let header = |length: usize| {
            if bytes.len() < length {
                Err(DecodeError::new("Truncated cell"))
            } else {
                Ok(())
            }
        };
        header(9)?;
        let timestamp =
            WriteTimestamp(i64::from_be_bytes(bytes[1..9].try_into().unwrap_or([0; 8])));
        let int_at = |at: usize| i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        match bytes[0] {
            KIND_LIVE => Ok(Cell::live(timestamp, bytes[9..].to_vec())),
            KIND_EXPIRING => {
                header(17)?;
                Ok(Cell {
                    timestamp,
                    kind: CellKind::Expiring {
                        ttl_seconds: int_at(9),
                        expires_at: int_at(13),
                    },
                    value: bytes[17..].to_vec(),
                })
            }
            KIND_TOMBSTONE => {
                header(13)?;
                Ok(Cell::tombstone(timestamp, int_at(9)))
            }
            other => Err(DecodeError(format!("Unknown cell kind {other}"))),
        }
    }

    /// Which of two encoded cells wins. Higher timestamp wins; on a tie a tombstone beats a
    /// value, then an expiring cell beats a live one, then the larger expiry, then the larger
    /// value bytes — Cassandra's tie-breaks, and deterministic on every replica.
    pub fn reconcile_encoded<'a>(a: &'a [u8], b: &'a [u8]) -> &'a [u8] {
        match (Cell::decode(a), Cell::decode(b)) {
            (Ok(x), Ok(y)) => {
                if x.precedence(&y) == Ordering::Less {
                    b
                } else {
                    a
                }
            }
            // An undecodable operand loses to a decodable one; two bad ones keep the first.
            (Ok(_), Err(_)) => a,
            (Err(_), Ok(_)) => b,
            (Err(_), Err(_)) => a,
        }
    }

    /// The winner of two cells for the same place.
    pub fn reconcile(self, other: Cell) -> Cell {
        if self.precedence(&other) == Ordering::Less {
            other
        } else {
            self
        }
    }

    fn precedence(&self, other: &Cell) -> Ordering {
        let rank = |cell: &Cell| match cell.kind {
            CellKind::Live => (0, 0),
            CellKind::Expiring { expires_at, .. } => (1, expires_at),
            CellKind::Tombstone { deleted_at } => (2, deleted_at),
        };
        self.timestamp
            .cmp(&other.timestamp)
            .then_with(|| rank(self).0.cmp(&rank(other).0))
            .then_with(|| self.value.cmp(&other.value))
            .then_with(|| rank(self).1.cmp(&rank(other).1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_timestamp_wins_in_any_order() {
        let old = Cell::live(WriteTimestamp(10), b"old".to_vec());
        let new = Cell::live(WriteTimestamp(20), b"new".to_vec());
        assert_eq!(old.clone().reconcile(new.clone()), new);
        assert_eq!(new.clone().reconcile(old), new);
    }

    #[test]
    fn tombstone_wins_a_timestamp_tie() {
        let value = Cell::live(WriteTimestamp(10), b"v".to_vec());
        let deletion = Cell::tombstone(WriteTimestamp(10), 5);
        assert_eq!(value.clone().reconcile(deletion.clone()), deletion);
        assert_eq!(deletion.clone().reconcile(value), deletion);
    }

    #[test]
    fn cells_round_trip_and_bad_bytes_are_errors() {
        for cell in [
            Cell::live(WriteTimestamp(-3), b"abc".to_vec()),
            Cell::with_ttl(WriteTimestamp(7), b"x".to_vec(), 60, 1000),
            Cell::tombstone(WriteTimestamp(9), 123),
        ] {
            assert_eq!(Cell::decode(&cell.encode()).unwrap(), cell);
        }
        assert!(Cell::decode(&[1, 2]).is_err());
        assert!(Cell::decode(&[9; 20]).is_err());
    }

    #[test]
    fn expiring_cells_die_at_their_expiry() {
        let cell = Cell::with_ttl(WriteTimestamp(1), vec![], 10, 100);
        assert!(cell.is_live(109));
        assert!(!cell.is_live(110));
        assert_eq!(cell.remaining_ttl(104), Some(6));
    }
}
