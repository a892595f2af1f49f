//! A group's Raft log as this node holds it in memory: the entries after a compaction
//! point, each with the term of the leader that created it. The durable copy is written
//! through [`crate::PersistBatch`]es; this is the copy the protocol reads.

use crate::{LogIndex, NodeId, Term};
use bytes::Bytes;
use std::collections::VecDeque;

/// One log entry: the term it was created in and what it carries (for a table, the
/// encoded cells of one write; empty for the no-op a new leader appends; for a
/// membership change, the group's members from then on).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    pub term: Term,
    pub kind: EntryKind,
    pub payload: Bytes,
}

/// What an entry is to the protocol.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum EntryKind {
    /// The state machine's: applied by it, opaque to the protocol.
    #[default]
    Data,
    /// The group's members from this entry on (one member added or removed at a time):
    /// in force on a member as soon as the entry is in its log, committed or not (Raft's
    /// single-server change, §4.1 of Ongaro's thesis).
    Members,
}

impl Entry {
    pub fn new(term: Term, payload: impl Into<Bytes>) -> Entry {
        Entry {
            term,
            kind: EntryKind::Data,
            payload: payload.into(),
        }
    }

    /// An entry that makes `members` the group's members.
    pub fn members(term: Term, members: &[NodeId]) -> Entry {
        let mut payload = Vec::with_capacity(members.len() * 16);
        for member in members {
            payload.extend_from_slice(&member.0);
        }
        Entry {
            term,
            kind: EntryKind::Members,
            payload: payload.into(),
        }
    }

    /// The members a membership entry names (`None` for any other entry).
    pub fn member_list(&self) -> Option<Vec<NodeId>> {
        if self.kind != EntryKind::Members {
            return None;
        }
        decode_members(&self.payload)
    }
}

/// A member list as [`Entry::members`] encodes it (16 bytes per member).
pub fn decode_members(bytes: &[u8]) -> Option<Vec<NodeId>> {
    if !bytes.len().is_multiple_of(16) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(16)
            .map(|chunk| shoal_model::HostId(chunk.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// Entries `first..=last` of a group's log.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// Index of the entry before `entries[0]` (0 for a log that was never compacted).
    before: LogIndex,
    /// Term of the entry at `before` (0 when `before` is 0).
    before_term: Term,
    entries: VecDeque<Entry>,
}

impl Log {
    /// A log holding `entries` from index `first` on; the entry before `first` had
    /// `before_term`.
    pub fn restore(first: LogIndex, before_term: Term, entries: Vec<Entry>) -> Log {
        Log {
            before: first.previous(),
            before_term,
            entries: entries.into(),
        }
    }

    pub fn last_index(&self) -> LogIndex {
        LogIndex(self.before.0 + self.entries.len() as u64)
    }

    pub fn last_term(&self) -> Term {
        self.entries
            .back()
            .map_or(self.before_term, |entry| entry.term)
    }

    /// The first index still held (after compaction).
    pub fn first_index(&self) -> LogIndex {
        self.before.next()
    }

    /// The term of the entry at `index`: `None` past the end or before the compaction
    /// point (index 0 has term 0).
    pub fn term_at(&self, index: LogIndex) -> Option<Term> {
        if index == self.before {
            return Some(self.before_term);
        }
        self.get(index).map(|entry| entry.term)
    }

    pub fn get(&self, index: LogIndex) -> Option<&Entry> {
        let offset = index.0.checked_sub(self.before.0 + 1)?;
        self.entries.get(offset as usize)
    }

    /// Appends an entry at `last_index() + 1`.
    pub fn push(&mut self, entry: Entry) -> LogIndex {
        self.entries.push_back(entry);
        self.last_index()
    }

    /// Removes every entry from `index` on (a new leader's log disagrees from there).
    pub fn truncate_from(&mut self, index: LogIndex) {
        let keep = index.0.saturating_sub(self.before.0 + 1) as usize;
        self.entries.truncate(keep);
    }

    /// Up to `max_entries` entries from `from` on, cloned (payloads are shared).
    pub fn slice(&self, from: LogIndex, max_entries: usize) -> Vec<Entry> {
        let Some(offset) = from.0.checked_sub(self.before.0 + 1) else {
            return Vec::new();
        };
        self.entries
            .iter()
            .skip(offset as usize)
            .take(max_entries)
            .cloned()
            .collect()
    }

    /// Forgets the entries up to and including `through` (applied everywhere they are
    /// needed); the log keeps the term of the last forgotten one for the matching check.
    pub fn compact_through(&mut self, through: LogIndex) {
        while self.before < through {
            let Some(entry) = self.entries.pop_front() else {
                break;
            };
            self.before = self.before.next();
            self.before_term = entry.term;
        }
    }

    /// Makes the log start after `index` (whose entry had `term`): what a snapshot
    /// replaces. Entries after `index` are kept if the log holds `index` with that term
    /// (they agree with the leader's up to there), otherwise the log is emptied.
    pub fn restart_after(&mut self, index: LogIndex, term: Term) {
        if index >= self.before && self.term_at(index) == Some(term) {
            self.compact_through(index);
            return;
        }
        self.entries.clear();
        self.before = index;
        self.before_term = term;
    }

    /// Whether a log ending at `(last_index, last_term)` is at least as up to date as this
    /// one (Raft §5.4.1): a later last term wins, and with equal terms the longer log.
    pub fn is_no_newer_than(&self, last_index: LogIndex, last_term: Term) -> bool {
        (last_term, last_index) >= (self.last_term(), self.last_index())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(term: u64) -> Entry {
        Entry::new(Term(term), Bytes::new())
    }

    #[test]
    fn indexes_terms_truncation_and_compaction_agree() {
        let mut log = Log::default();
        assert_eq!(log.last_index(), LogIndex(0));
        assert_eq!(log.term_at(LogIndex(0)), Some(Term(0)));
        for term in [1, 1, 2, 3] {
            log.push(entry(term));
        }
        assert_eq!(log.last_index(), LogIndex(4));
        assert_eq!(log.term_at(LogIndex(3)), Some(Term(2)));
        assert_eq!(log.term_at(LogIndex(5)), None);
        log.truncate_from(LogIndex(3));
        assert_eq!((log.last_index(), log.last_term()), (LogIndex(2), Term(1)));
        log.push(entry(4));
        log.compact_through(LogIndex(2));
        assert_eq!(log.first_index(), LogIndex(3));
        assert_eq!(log.term_at(LogIndex(2)), Some(Term(1)));
        assert_eq!(log.term_at(LogIndex(1)), None);
        assert_eq!(log.slice(LogIndex(3), 10), vec![entry(4)]);
        assert!(log.slice(LogIndex(1), 10).is_empty());
        assert!(log.is_no_newer_than(LogIndex(3), Term(4)));
        assert!(log.is_no_newer_than(LogIndex(1), Term(5)));
        assert!(!log.is_no_newer_than(LogIndex(2), Term(4)));
        assert!(!log.is_no_newer_than(LogIndex(9), Term(3)));
    }
}
