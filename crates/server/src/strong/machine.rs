//! What a strongly consistent tablet's Raft log carries and how its members apply it.
//!
//! An entry is one write's cells: `u32 count`, then `u32 key length | key | u32 value
//! length | value` per cell (keys and encoded cells as the engine stores them).
//!
//! Members apply entries in log order, and the log order must also be the order
//! last-write-wins sees: two writes through different coordinators carry timestamps from
//! different moments, and a later entry with an earlier timestamp would otherwise lose to
//! the entry before it. So each group keeps a clock — the newest timestamp it applied —
//! and an entry whose oldest cell is not newer than that clock has all its cells moved
//! forward by the same amount (cells of one write keep their order among themselves: a
//! tombstone and the cells a statement writes after it stay as the statement meant them).
//! Every member sees the same entries in the same order, so every member moves them the
//! same way; the clock is rebuilt by replaying the log after a restart.

use bytes::{Buf, BufMut, Bytes};
use shoal_consensus::runtime::StateMachine;
use shoal_consensus::{GroupId, LogIndex};
use shoal_model::cell::Cell;
use shoal_storage::{Engine, WriteBatch};
use std::collections::HashMap;
use std::sync::Arc;

/// Encodes `batch` as one log entry.
pub fn encode_entry(batch: &WriteBatch) -> Bytes {
    let entries = batch.entries();
    let size: usize = entries.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut out = Vec::with_capacity(4 + size);
    out.put_u32(entries.len() as u32);
    for (key, value) in entries {
        out.put_u32(key.len() as u32);
        out.put_slice(key);
        out.put_u32(value.len() as u32);
        out.put_slice(value);
    }
    Bytes::from(out)
}

/// The cells of one log entry; `None` when it is not one [`encode_entry`] wrote.
pub fn decode_entry(payload: &Bytes) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut input = payload.clone();
    if input.remaining() < 4 {
        return None;
    }
    let count = input.get_u32() as usize;
    let mut cells = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let mut field = || {
            if input.remaining() < 4 {
                return None;
            }
            let length = input.get_u32() as usize;
            if input.remaining() < length {
                return None;
            }
            Some(input.split_to(length).to_vec())
        };
        let key = field()?;
        let value = field()?;
        cells.push((key, value));
    }
    input.is_empty().then_some(cells)
}

/// The table and token of an entry's first cell (every cell of an entry is of one
/// partition), read without decoding the rest.
pub fn entry_partition(payload: &[u8]) -> Option<(shoal_model::TableId, shoal_model::Token)> {
    let length = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?) as usize;
    shoal_model::keys::table_and_token(payload.get(8..8 + length)?)
}

/// Moves every cell of one entry forward so that its oldest is newer than `clock`, and
/// returns the entry's newest timestamp after the move. Cells that do not decode are
/// left as they are.
pub fn order_after(clock: i64, cells: &mut [(Vec<u8>, Vec<u8>)]) -> i64 {
    let decoded: Vec<Option<Cell>> = cells
        .iter()
        .map(|(_, value)| Cell::decode(value).ok())
        .collect();
    let oldest = decoded.iter().flatten().map(|c| c.timestamp.0).min();
    let newest = decoded.iter().flatten().map(|c| c.timestamp.0).max();
    let (Some(oldest), Some(newest)) = (oldest, newest) else {
        return clock;
    };
    // Saturating: a group's clock starts at i64::MIN, and `MIN + 1 - oldest` must not wrap.
    let shift = clock.saturating_add(1).saturating_sub(oldest).max(0);
    if shift > 0 {
        for ((_, value), cell) in cells.iter_mut().zip(decoded) {
            if let Some(mut cell) = cell {
                cell.timestamp.0 = cell.timestamp.0.saturating_add(shift);
                *value = cell.encode();
            }
        }
    }
    newest.saturating_add(shift)
}

/// Applies committed entries to this node's engine, in each group's log order. The
/// entries of one turn of the consensus task (many groups', often dozens) are written as
/// one engine write when the turn ends, not one write each.
pub struct EngineMachine {
    engine: Arc<dyn Engine>,
    /// The newest timestamp each group applied.
    clocks: HashMap<GroupId, i64>,
    /// Cells of the entries applied this turn, not yet written.
    pending: WriteBatch,
}

impl EngineMachine {
    pub fn new(engine: Arc<dyn Engine>) -> EngineMachine {
        EngineMachine {
            engine,
            clocks: HashMap::new(),
            pending: WriteBatch::new(),
        }
    }

    /// Writes the cells applied since the last write.
    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        // The log is the durable record: the engine's own log need not be synced here
        // (a restart replays the log).
        if let Err(error) = self.engine.write(&batch) {
            tracing::error!(%error, "cannot apply strongly consistent tables' entries");
        }
    }
}

impl StateMachine for EngineMachine {
    fn apply(&mut self, group: GroupId, index: LogIndex, payload: &Bytes) {
        let Some(mut cells) = decode_entry(payload) else {
            tracing::error!(
                ?group,
                ?index,
                "a strongly consistent table's log holds an undecodable entry"
            );
            return;
        };
        let clock = self.clocks.entry(group).or_insert(i64::MIN);
        *clock = order_after(*clock, &mut cells);
        for (key, value) in cells {
            self.pending.merge(key, value);
        }
    }

    fn finish_applying(&mut self) {
        self.write_pending();
    }

    /// The group's clock: a member that starts from a snapshot moves the entries after it
    /// exactly as the members that applied them one by one.
    fn snapshot_state(&self, group: GroupId) -> Bytes {
        let clock = self.clocks.get(&group).copied().unwrap_or(i64::MIN);
        Bytes::copy_from_slice(&clock.to_le_bytes())
    }

    /// The engine's write-ahead log is synced: every entry applied is durable in the
    /// table's storage, and the consensus log may forget it.
    fn make_durable(&mut self) -> Result<(), String> {
        self.write_pending();
        self.engine.sync().map_err(|error| error.to_string())
    }

    fn restore_state(&mut self, group: GroupId, state: &Bytes) {
        match <[u8; 8]>::try_from(state.as_ref()) {
            Ok(bytes) => {
                self.clocks.insert(group, i64::from_le_bytes(bytes));
            }
            Err(_) => tracing::error!(
                ?group,
                "a strongly consistent tablet's snapshot carries no clock"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::timestamp::WriteTimestamp;

    fn cell(timestamp: i64, value: &str) -> Vec<u8> {
        Cell::live(WriteTimestamp(timestamp), value.as_bytes().to_vec()).encode()
    }

    fn timestamps(cells: &[(Vec<u8>, Vec<u8>)]) -> Vec<i64> {
        cells
            .iter()
            .map(|(_, v)| Cell::decode(v).expect("a cell").timestamp.0)
            .collect()
    }

    #[test]
    fn entries_round_trip_and_garbage_is_refused() {
        let mut batch = WriteBatch::new();
        batch.merge(b"k1".to_vec(), cell(5, "a"));
        batch.merge(b"k2".to_vec(), cell(6, "b"));
        let payload = encode_entry(&batch);
        assert_eq!(decode_entry(&payload).expect("decodes"), batch.entries());
        assert!(decode_entry(&payload.slice(..payload.len() - 1)).is_none());
        assert!(decode_entry(&Bytes::from_static(b"\0\0\0\x09")).is_none());
    }

    #[test]
    fn a_later_entry_with_an_older_timestamp_is_moved_after_the_clock_keeping_its_own_order() {
        // Applied first: timestamp 100. The next entry was stamped 90 and 95 elsewhere.
        let mut cells = vec![
            (b"a".to_vec(), cell(90, "x")),
            (b"b".to_vec(), cell(95, "y")),
        ];
        let clock = order_after(100, &mut cells);
        assert_eq!(timestamps(&cells), vec![101, 106]);
        assert_eq!(clock, 106);
        // An entry already newer than the clock keeps its timestamps.
        let mut newer = vec![(b"a".to_vec(), cell(200, "z"))];
        assert_eq!(order_after(clock, &mut newer), 200);
        assert_eq!(timestamps(&newer), vec![200]);
    }

    #[test]
    fn the_first_entry_of_a_group_keeps_its_timestamps() {
        let mut cells = vec![(b"a".to_vec(), cell(500, "x"))];
        assert_eq!(order_after(i64::MIN, &mut cells), 500);
        assert_eq!(timestamps(&cells), vec![500]);
    }

    #[test]
    fn members_applying_the_same_log_end_with_the_same_cells_whatever_the_stamps() {
        let log: Vec<Bytes> = [(50, "first"), (40, "second"), (45, "third")]
            .into_iter()
            .map(|(timestamp, value)| {
                let mut batch = WriteBatch::new();
                batch.merge(b"key".to_vec(), cell(timestamp, value));
                encode_entry(&batch)
            })
            .collect();
        let engine = Arc::new(shoal_storage::MemoryEngine::new());
        let mut machine = EngineMachine::new(Arc::clone(&engine) as Arc<dyn Engine>);
        // One turn of the consensus task: the three entries are written together.
        for (index, payload) in log.iter().enumerate() {
            machine.apply(GroupId(1), LogIndex(index as u64 + 1), payload);
        }
        machine.finish_applying();
        // The last entry in the log wins, although its own stamp was not the newest.
        let (cells, _) =
            shoal_replication::replica::read_visible(engine.as_ref(), b"key", b"kez", 10)
                .expect("reads");
        let winner = Cell::decode(&cells[0].1).expect("a cell");
        assert_eq!(winner.value, b"third");
    }

    #[test]
    fn a_member_starting_from_a_snapshot_moves_later_entries_as_the_others_did() {
        let entry = |timestamp: i64, value: &str| {
            let mut batch = WriteBatch::new();
            batch.merge(b"key".to_vec(), cell(timestamp, value));
            encode_entry(&batch)
        };
        let first = Arc::new(shoal_storage::MemoryEngine::new());
        let mut member = EngineMachine::new(Arc::clone(&first) as Arc<dyn Engine>);
        member.apply(GroupId(1), LogIndex(1), &entry(500, "old"));
        member.finish_applying();
        let snapshot = member.snapshot_state(GroupId(1));
        member.apply(GroupId(1), LogIndex(2), &entry(100, "late"));
        member.finish_applying();

        let second = Arc::new(shoal_storage::MemoryEngine::new());
        let mut newcomer = EngineMachine::new(Arc::clone(&second) as Arc<dyn Engine>);
        newcomer.restore_state(GroupId(1), &snapshot);
        newcomer.apply(GroupId(1), LogIndex(2), &entry(100, "late"));
        newcomer.finish_applying();
        let read = |engine: &shoal_storage::MemoryEngine| {
            shoal_replication::replica::read_visible(engine, b"key", b"kez", 10)
                .expect("reads")
                .0
        };
        assert_eq!(read(&second), read(&first));
        assert_eq!(
            Cell::decode(&read(&second)[0].1)
                .expect("a cell")
                .timestamp
                .0,
            501
        );
    }
}
