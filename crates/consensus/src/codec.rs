//! The byte layout of messages and of durable epoch records: fixed-width little-endian
//! integers, `u32` counts and lengths, payloads as they are. Decoding never trusts its
//! input: every count and length is checked against what is left, so a torn or hostile
//! record is an error, never a panic or a huge allocation. Payloads decoded from a
//! [`Bytes`] share its memory.

use crate::log::{decode_members, Entry, EntryKind};
use crate::message::{
    Append, EpochAck, EpochBatch, Message, Refusal, RefusalReason, VoteReply, VoteRequest,
};
use crate::node::{LogWrite, PersistBatch};
use crate::{Epoch, GroupId, HardState, LogIndex, Term};
use bytes::{BufMut, Bytes};

/// Bytes that are not a valid message or record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "undecodable consensus bytes: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

const MESSAGE_EPOCH: u8 = 1;
const MESSAGE_EPOCH_ACK: u8 = 2;
const MESSAGE_VOTE: u8 = 3;
const MESSAGE_VOTE_REPLY: u8 = 4;
const REFUSAL_STALE_TERM: u8 = 1;
const REFUSAL_GAP: u8 = 2;
const REFUSAL_UNKNOWN_GROUP: u8 = 3;
const WRITE_TRUNCATE: u8 = 1;
const WRITE_APPEND: u8 = 2;
const WRITE_SNAPSHOT: u8 = 3;

/// An upper bound of what [`encode_message`] writes (to allocate a frame once).
pub fn encoded_message_len(message: &Message) -> usize {
    match message {
        Message::Epoch(batch) => {
            13 + batch
                .appends
                .iter()
                .map(|append| 48 + entries_len(&append.entries))
                .sum::<usize>()
        }
        Message::EpochAck(ack) => 13 + ack.refusals.len() * 17,
        Message::Vote(_) | Message::VoteReply(_) => 40,
    }
}

/// An upper bound of what [`encode_persist_batch`] writes.
pub fn encoded_persist_batch_len(batch: &PersistBatch) -> usize {
    16 + batch.hard_states.len() * 33
        + batch
            .writes
            .iter()
            .map(|write| match write {
                LogWrite::Truncate { .. } => 17,
                LogWrite::Append { entries, .. } => 17 + entries_len(entries),
                LogWrite::Snapshot { members, state, .. } => {
                    33 + 16 * members.len() + 4 + state.len()
                }
            })
            .sum::<usize>()
}

fn entries_len(entries: &[Entry]) -> usize {
    4 + entries
        .iter()
        .map(|entry| 12 + entry.payload.len())
        .sum::<usize>()
}

pub fn encode_message(message: &Message, out: &mut Vec<u8>) {
    match message {
        Message::Epoch(batch) => {
            out.put_u8(MESSAGE_EPOCH);
            out.put_u64_le(batch.epoch.0);
            out.put_u32_le(batch.appends.len() as u32);
            for append in &batch.appends {
                out.put_u64_le(append.group.0);
                out.put_u64_le(append.term.0);
                out.put_u64_le(append.previous_index.0);
                out.put_u64_le(append.previous_term.0);
                out.put_u64_le(append.commit.0);
                out.put_u64_le(append.compact_through.0);
                encode_entries(&append.entries, out);
            }
        }
        Message::EpochAck(ack) => {
            out.put_u8(MESSAGE_EPOCH_ACK);
            out.put_u64_le(ack.epoch.0);
            out.put_u32_le(ack.refusals.len() as u32);
            for refusal in &ack.refusals {
                out.put_u64_le(refusal.group.0);
                match refusal.reason {
                    RefusalReason::StaleTerm(term) => {
                        out.put_u8(REFUSAL_STALE_TERM);
                        out.put_u64_le(term.0);
                    }
                    RefusalReason::Gap { from } => {
                        out.put_u8(REFUSAL_GAP);
                        out.put_u64_le(from.0);
                    }
                    RefusalReason::UnknownGroup => out.put_u8(REFUSAL_UNKNOWN_GROUP),
                }
            }
        }
        Message::Vote(request) => {
            out.put_u8(MESSAGE_VOTE);
            out.put_u64_le(request.group.0);
            out.put_u64_le(request.term.0);
            out.put_u64_le(request.last_index.0);
            out.put_u64_le(request.last_term.0);
            out.put_u8(request.pre_vote as u8);
        }
        Message::VoteReply(reply) => {
            out.put_u8(MESSAGE_VOTE_REPLY);
            out.put_u64_le(reply.group.0);
            out.put_u64_le(reply.term.0);
            out.put_u8(reply.granted as u8);
            out.put_u8(reply.pre_vote as u8);
        }
    }
}

pub fn decode_message(bytes: Bytes) -> Result<Message, DecodeError> {
    let mut reader = Reader::new(bytes);
    let message = match reader.u8()? {
        MESSAGE_EPOCH => {
            let epoch = Epoch(reader.u64()?);
            let count = reader.count(49)?;
            let mut appends = Vec::with_capacity(count);
            for _ in 0..count {
                appends.push(Append {
                    group: GroupId(reader.u64()?),
                    term: Term(reader.u64()?),
                    previous_index: LogIndex(reader.u64()?),
                    previous_term: Term(reader.u64()?),
                    commit: LogIndex(reader.u64()?),
                    compact_through: LogIndex(reader.u64()?),
                    entries: reader.entries()?,
                });
            }
            Message::Epoch(EpochBatch { epoch, appends })
        }
        MESSAGE_EPOCH_ACK => {
            let epoch = Epoch(reader.u64()?);
            let count = reader.count(9)?;
            let mut refusals = Vec::with_capacity(count);
            for _ in 0..count {
                let group = GroupId(reader.u64()?);
                let reason = match reader.u8()? {
                    REFUSAL_STALE_TERM => RefusalReason::StaleTerm(Term(reader.u64()?)),
                    REFUSAL_GAP => RefusalReason::Gap {
                        from: LogIndex(reader.u64()?),
                    },
                    REFUSAL_UNKNOWN_GROUP => RefusalReason::UnknownGroup,
                    _ => return Err(DecodeError("unknown refusal")),
                };
                refusals.push(Refusal { group, reason });
            }
            Message::EpochAck(EpochAck { epoch, refusals })
        }
        MESSAGE_VOTE => Message::Vote(VoteRequest {
            group: GroupId(reader.u64()?),
            term: Term(reader.u64()?),
            last_index: LogIndex(reader.u64()?),
            last_term: Term(reader.u64()?),
            pre_vote: reader.flag()?,
        }),
        MESSAGE_VOTE_REPLY => Message::VoteReply(VoteReply {
            group: GroupId(reader.u64()?),
            term: Term(reader.u64()?),
            granted: reader.flag()?,
            pre_vote: reader.flag()?,
        }),
        _ => return Err(DecodeError("unknown message")),
    };
    reader.finish()?;
    Ok(message)
}

pub fn encode_persist_batch(batch: &PersistBatch, out: &mut Vec<u8>) {
    out.put_u64_le(batch.epoch.0);
    out.put_u32_le(batch.hard_states.len() as u32);
    for (group, hard_state) in &batch.hard_states {
        out.put_u64_le(group.0);
        out.put_u64_le(hard_state.term.0);
        match hard_state.voted_for {
            Some(node) => {
                out.put_u8(1);
                out.put_slice(&node.0);
            }
            None => out.put_u8(0),
        }
    }
    out.put_u32_le(batch.writes.len() as u32);
    for write in &batch.writes {
        match write {
            LogWrite::Truncate { group, from } => {
                out.put_u8(WRITE_TRUNCATE);
                out.put_u64_le(group.0);
                out.put_u64_le(from.0);
            }
            LogWrite::Append {
                group,
                first,
                entries,
            } => {
                out.put_u8(WRITE_APPEND);
                out.put_u64_le(group.0);
                out.put_u64_le(first.0);
                encode_entries(entries, out);
            }
            LogWrite::Snapshot {
                group,
                index,
                term,
                members,
                state,
            } => {
                out.put_u8(WRITE_SNAPSHOT);
                out.put_u64_le(group.0);
                out.put_u64_le(index.0);
                out.put_u64_le(term.0);
                out.put_u32_le(members.len() as u32);
                for member in members {
                    out.put_slice(&member.0);
                }
                out.put_u32_le(state.len() as u32);
                out.put_slice(state);
            }
        }
    }
}

pub fn decode_persist_batch(bytes: Bytes) -> Result<PersistBatch, DecodeError> {
    let mut reader = Reader::new(bytes);
    let epoch = Epoch(reader.u64()?);
    let count = reader.count(17)?;
    let mut hard_states = Vec::with_capacity(count);
    for _ in 0..count {
        let group = GroupId(reader.u64()?);
        let term = Term(reader.u64()?);
        let voted_for = if reader.flag()? {
            Some(shoal_model::HostId(reader.array16()?))
        } else {
            None
        };
        hard_states.push((group, HardState { term, voted_for }));
    }
    let count = reader.count(17)?;
    let mut writes = Vec::with_capacity(count);
    for _ in 0..count {
        let write = match reader.u8()? {
            WRITE_TRUNCATE => LogWrite::Truncate {
                group: GroupId(reader.u64()?),
                from: LogIndex(reader.u64()?),
            },
            WRITE_APPEND => LogWrite::Append {
                group: GroupId(reader.u64()?),
                first: LogIndex(reader.u64()?),
                entries: reader.entries()?,
            },
            WRITE_SNAPSHOT => {
                let group = GroupId(reader.u64()?);
                let index = LogIndex(reader.u64()?);
                let term = Term(reader.u64()?);
                let count = reader.count(16)?;
                let mut members = Vec::with_capacity(count);
                for _ in 0..count {
                    members.push(shoal_model::HostId(reader.array16()?));
                }
                let length = reader.u32()? as usize;
                let start = reader.position;
                reader.take(length)?;
                LogWrite::Snapshot {
                    group,
                    index,
                    term,
                    members,
                    state: reader.bytes.slice(start..start + length),
                }
            }
            _ => return Err(DecodeError("unknown log write")),
        };
        writes.push(write);
    }
    reader.finish()?;
    Ok(PersistBatch {
        epoch,
        hard_states,
        writes,
    })
}

/// An entry's term field carries its kind in the top bit (terms never come near 2^63).
const MEMBERS_ENTRY_BIT: u64 = 1 << 63;

fn encode_entries(entries: &[Entry], out: &mut Vec<u8>) {
    out.put_u32_le(entries.len() as u32);
    for entry in entries {
        let kind = match entry.kind {
            EntryKind::Data => 0,
            EntryKind::Members => MEMBERS_ENTRY_BIT,
        };
        out.put_u64_le(entry.term.0 | kind);
        out.put_u32_le(entry.payload.len() as u32);
        out.put_slice(&entry.payload);
    }
}

struct Reader {
    bytes: Bytes,
    position: usize,
}

impl Reader {
    fn new(bytes: Bytes) -> Reader {
        Reader { bytes, position: 0 }
    }

    fn take(&mut self, length: usize) -> Result<&[u8], DecodeError> {
        let end = self
            .position
            .checked_add(length)
            .filter(|end| *end <= self.bytes.len())
            .ok_or(DecodeError("truncated"))?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError("a flag that is neither 0 nor 1")),
        }
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes: [u8; 4] = self
            .take(4)?
            .try_into()
            .map_err(|_| DecodeError("truncated"))?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let bytes: [u8; 8] = self
            .take(8)?
            .try_into()
            .map_err(|_| DecodeError("truncated"))?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn array16(&mut self) -> Result<[u8; 16], DecodeError> {
        self.take(16)?
            .try_into()
            .map_err(|_| DecodeError("truncated"))
    }

    /// A count of items each at least `item_bytes` long: more than the bytes left could
    /// hold is refused before anything is allocated for them.
    fn count(&mut self, item_bytes: usize) -> Result<usize, DecodeError> {
        let count = self.u32()? as usize;
        let left = self.bytes.len() - self.position;
        if count.saturating_mul(item_bytes) > left {
            return Err(DecodeError("a count larger than the bytes that follow"));
        }
        Ok(count)
    }

    fn entries(&mut self) -> Result<Vec<Entry>, DecodeError> {
        let count = self.count(12)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let term_and_kind = self.u64()?;
            let kind = if term_and_kind & MEMBERS_ENTRY_BIT == 0 {
                EntryKind::Data
            } else {
                EntryKind::Members
            };
            let term = Term(term_and_kind & !MEMBERS_ENTRY_BIT);
            let length = self.u32()? as usize;
            let start = self.position;
            self.take(length)?;
            let payload = self.bytes.slice(start..start + length);
            if kind == EntryKind::Members && decode_members(&payload).is_none() {
                return Err(DecodeError("a membership entry that names no members"));
            }
            entries.push(Entry {
                term,
                kind,
                payload,
            });
        }
        Ok(entries)
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.position == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(term: u64, payload: &'static [u8]) -> Entry {
        Entry::new(Term(term), Bytes::from_static(payload))
    }

    fn messages() -> Vec<Message> {
        vec![
            Message::Epoch(EpochBatch {
                epoch: Epoch(9),
                appends: vec![Append {
                    group: GroupId(3),
                    term: Term(2),
                    previous_index: LogIndex(4),
                    previous_term: Term(1),
                    entries: vec![
                        entry(2, b"cells"),
                        entry(2, b""),
                        Entry::members(Term(2), &[shoal_model::HostId([1; 16])]),
                    ],
                    commit: LogIndex(4),
                    compact_through: LogIndex(3),
                }],
            }),
            Message::EpochAck(EpochAck {
                epoch: Epoch(9),
                refusals: vec![
                    Refusal {
                        group: GroupId(1),
                        reason: RefusalReason::StaleTerm(Term(5)),
                    },
                    Refusal {
                        group: GroupId(2),
                        reason: RefusalReason::Gap { from: LogIndex(3) },
                    },
                    Refusal {
                        group: GroupId(4),
                        reason: RefusalReason::UnknownGroup,
                    },
                ],
            }),
            Message::Vote(VoteRequest {
                group: GroupId(1),
                term: Term(3),
                last_index: LogIndex(10),
                last_term: Term(2),
                pre_vote: true,
            }),
            Message::VoteReply(VoteReply {
                group: GroupId(1),
                term: Term(3),
                granted: true,
                pre_vote: false,
            }),
        ]
    }

    #[test]
    fn messages_and_records_round_trip() {
        for message in messages() {
            let mut bytes = Vec::new();
            encode_message(&message, &mut bytes);
            assert!(bytes.len() <= encoded_message_len(&message));
            assert_eq!(decode_message(Bytes::from(bytes)), Ok(message));
        }
        let batch = PersistBatch {
            epoch: Epoch(7),
            hard_states: vec![(
                GroupId(1),
                HardState {
                    term: Term(4),
                    voted_for: Some(shoal_model::HostId([3; 16])),
                },
            )],
            writes: vec![
                LogWrite::Truncate {
                    group: GroupId(1),
                    from: LogIndex(5),
                },
                LogWrite::Append {
                    group: GroupId(1),
                    first: LogIndex(5),
                    entries: vec![entry(4, b"x")],
                },
                LogWrite::Snapshot {
                    group: GroupId(2),
                    index: LogIndex(40),
                    term: Term(3),
                    members: vec![shoal_model::HostId([5; 16]), shoal_model::HostId([6; 16])],
                    state: Bytes::from_static(b"clock"),
                },
            ],
        };
        let mut bytes = Vec::new();
        encode_persist_batch(&batch, &mut bytes);
        assert!(bytes.len() <= encoded_persist_batch_len(&batch));
        assert_eq!(decode_persist_batch(Bytes::from(bytes)), Ok(batch));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_message(Bytes::from(bytes.clone()));
            let _ = decode_persist_batch(Bytes::from(bytes));
        }

        #[test]
        fn any_cut_or_flipped_message_decodes_or_is_refused(
            which in 0usize..4,
            cut in 0usize..200,
            flip in 0usize..200,
        ) {
            let mut bytes = Vec::new();
            encode_message(&messages()[which], &mut bytes);
            if let Some(byte) = bytes.get_mut(flip) {
                *byte ^= 0x5a;
            }
            bytes.truncate(cut);
            let _ = decode_message(Bytes::from(bytes));
        }
    }
}
