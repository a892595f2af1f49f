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
//!
//! A log also carries two control entries, for splitting or merging its tablet
//! ([`GroupRecords`]), each naming the plan it serves: a **fence** — every write entry
//! after it is refused ([`Applied::Refused`]: it changes nothing on any member, and its
//! proposer is told so) — and an **unfence**, which lifts that plan's fence when the plan
//! is abandoned (an unfence of another plan, late, changes nothing). Once every member has
//! applied the fence, each holds the same final state of the tablet, and the clock they
//! all reached is where the groups of the new tablets start theirs (the tablet map keeps
//! it: their *clock floor*).

use bytes::{Buf, BufMut, Bytes};
use shoal_consensus::runtime::{Applied, StateMachine};
use shoal_consensus::{GroupId, LogIndex};
use shoal_model::cell::Cell;
use shoal_storage::{Engine, WriteBatch};
use std::collections::HashMap;
use std::sync::Arc;

/// The first four bytes of a control entry (a write entry starts with its cell count,
/// never this many).
const CONTROL_MARK: u32 = u32::MAX;
/// A control entry's kind, after [`CONTROL_MARK`].
const FENCE: u8 = 1;
const UNFENCE: u8 = 2;

/// The entry that fences a group for split or merge `plan`: no write entry after it takes
/// effect.
pub fn fence_entry(plan: u64) -> Bytes {
    control_entry(FENCE, plan)
}

/// The entry that lifts the fence of split or merge `plan` (abandoned).
pub fn unfence_entry(plan: u64) -> Bytes {
    control_entry(UNFENCE, plan)
}

fn control_entry(kind: u8, plan: u64) -> Bytes {
    let mut out = Vec::with_capacity(13);
    out.put_u32(CONTROL_MARK);
    out.put_u8(kind);
    out.put_u64(plan);
    Bytes::from(out)
}

/// The control entry `payload` is, if it is one: its kind and plan.
fn control(payload: &[u8]) -> Option<(u8, u64)> {
    let (mark, rest) = payload.split_first_chunk::<4>()?;
    if u32::from_be_bytes(*mark) != CONTROL_MARK {
        return None;
    }
    let (kind, plan) = rest.split_first()?;
    Some((*kind, u64::from_be_bytes(plan.try_into().ok()?)))
}

/// Where a group's fence stands on this member: the fence's index, the split or merge
/// plan it serves, and the group's clock when it was applied (final: no write after it takes
/// effect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub index: LogIndex,
    pub plan: u64,
    pub clock: i64,
}

/// What the machine knows of each group beyond its cells, shared with the node's
/// [`super::StrongTables`]: the fences applied (a leader refuses writes to a fenced group
/// before proposing them; a split or merge waits for every member's fence) and the clock
/// floors of groups a split or merge made (set from the tablet map before the group is
/// added).
#[derive(Default)]
pub struct GroupRecords {
    fences: parking_lot::Mutex<HashMap<GroupId, Fence>>,
    floors: parking_lot::Mutex<HashMap<GroupId, i64>>,
}

impl GroupRecords {
    /// The fence `group` has applied here, if any.
    pub fn fence(&self, group: GroupId) -> Option<Fence> {
        self.fences.lock().get(&group).copied()
    }

    /// `group` starts its clock at `floor` (the newest timestamp of the group or groups its
    /// tablet was split or merged from).
    pub fn set_floor(&self, group: GroupId, floor: i64) {
        self.floors.lock().insert(group, floor);
    }

    fn floor(&self, group: GroupId) -> i64 {
        self.floors.lock().get(&group).copied().unwrap_or(i64::MIN)
    }

    /// Forgets a group that left this node.
    pub fn forget(&self, group: GroupId) {
        self.fences.lock().remove(&group);
        self.floors.lock().remove(&group);
    }
}

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
    records: Arc<GroupRecords>,
    /// Cells of the entries applied this turn, not yet written.
    pending: WriteBatch,
}

impl EngineMachine {
    pub fn new(engine: Arc<dyn Engine>, records: Arc<GroupRecords>) -> EngineMachine {
        EngineMachine {
            engine,
            clocks: HashMap::new(),
            records,
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

    /// `group`'s clock: the newest timestamp it applied, or its floor before its first.
    fn clock(&mut self, group: GroupId) -> &mut i64 {
        let records = &self.records;
        self.clocks
            .entry(group)
            .or_insert_with(|| records.floor(group))
    }

    fn apply_control(
        &mut self,
        group: GroupId,
        index: LogIndex,
        (kind, plan): (u8, u64),
    ) -> Applied {
        match kind {
            FENCE => {
                let clock = *self.clock(group);
                let mut fences = self.records.fences.lock();
                // Applied again (a replay), or another plan's: the first fence stands
                // until its own unfence.
                fences.entry(group).or_insert(Fence { index, plan, clock });
            }
            UNFENCE => {
                let mut fences = self.records.fences.lock();
                if fences
                    .get(&group)
                    .is_some_and(|fence| fence.plan == plan && fence.index < index)
                {
                    fences.remove(&group);
                }
            }
            _ => tracing::error!(?group, ?index, kind, "an unknown control entry"),
        }
        Applied::Done
    }
}

impl StateMachine for EngineMachine {
    fn apply(&mut self, group: GroupId, index: LogIndex, payload: &Bytes) -> Applied {
        if let Some(control) = control(payload) {
            return self.apply_control(group, index, control);
        }
        if self
            .records
            .fence(group)
            .is_some_and(|fence| fence.index < index)
        {
            return Applied::Refused;
        }
        let Some(mut cells) = decode_entry(payload) else {
            tracing::error!(
                ?group,
                ?index,
                "a strongly consistent table's log holds an undecodable entry"
            );
            return Applied::Done;
        };
        let clock = self.clock(group);
        *clock = order_after(*clock, &mut cells);
        for (key, value) in cells {
            self.pending.merge(key, value);
        }
        Applied::Done
    }

    fn finish_applying(&mut self) {
        self.write_pending();
    }

    /// The group's clock, and its fence if it has one: a member that starts from a
    /// snapshot moves the entries after it exactly as the members that applied them one
    /// by one, and refuses the same ones.
    fn snapshot_state(&self, group: GroupId) -> Bytes {
        let clock = self
            .clocks
            .get(&group)
            .copied()
            .unwrap_or_else(|| self.records.floor(group));
        let mut state = Vec::with_capacity(24);
        state.extend_from_slice(&clock.to_le_bytes());
        if let Some(fence) = self.records.fence(group) {
            state.extend_from_slice(&fence.index.0.to_le_bytes());
            state.extend_from_slice(&fence.plan.to_le_bytes());
        }
        Bytes::from(state)
    }

    /// The engine's write-ahead log is synced: every entry applied is durable in the
    /// table's storage, and the consensus log may forget it.
    fn make_durable(&mut self) -> Result<(), String> {
        self.write_pending();
        self.engine.sync().map_err(|error| error.to_string())
    }

    fn restore_state(&mut self, group: GroupId, state: &Bytes) {
        let word = |at: usize| -> Option<[u8; 8]> { state.get(at..at + 8)?.try_into().ok() };
        let Some(clock) = word(0).filter(|_| matches!(state.len(), 8 | 24)) else {
            tracing::error!(
                ?group,
                "a strongly consistent tablet's snapshot carries no clock"
            );
            return;
        };
        let clock = i64::from_le_bytes(clock).max(self.records.floor(group));
        self.clocks.insert(group, clock);
        let mut fences = self.records.fences.lock();
        match word(8).zip(word(16)) {
            Some((index, plan)) => {
                let index = LogIndex(u64::from_le_bytes(index));
                let plan = u64::from_le_bytes(plan);
                fences.insert(group, Fence { index, plan, clock });
            }
            None => {
                fences.remove(&group);
            }
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
        let mut machine =
            EngineMachine::new(Arc::clone(&engine) as Arc<dyn Engine>, Arc::default());
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
        let mut member = EngineMachine::new(Arc::clone(&first) as Arc<dyn Engine>, Arc::default());
        member.apply(GroupId(1), LogIndex(1), &entry(500, "old"));
        member.finish_applying();
        let snapshot = member.snapshot_state(GroupId(1));
        member.apply(GroupId(1), LogIndex(2), &entry(100, "late"));
        member.finish_applying();

        let second = Arc::new(shoal_storage::MemoryEngine::new());
        let mut newcomer =
            EngineMachine::new(Arc::clone(&second) as Arc<dyn Engine>, Arc::default());
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

    fn write_entry(timestamp: i64, value: &str) -> Bytes {
        let mut batch = WriteBatch::new();
        batch.merge(b"key".to_vec(), cell(timestamp, value));
        encode_entry(&batch)
    }

    fn visible(engine: &shoal_storage::MemoryEngine) -> Vec<u8> {
        let (cells, _) =
            shoal_replication::replica::read_visible(engine, b"key", b"kez", 10).expect("reads");
        Cell::decode(&cells[0].1).expect("a cell").value
    }

    #[test]
    fn writes_after_a_fence_are_refused_on_every_member_until_it_is_lifted() {
        let engine = Arc::new(shoal_storage::MemoryEngine::new());
        let records = Arc::new(GroupRecords::default());
        let mut machine =
            EngineMachine::new(Arc::clone(&engine) as Arc<dyn Engine>, Arc::clone(&records));
        let group = GroupId(7);
        assert_eq!(
            machine.apply(group, LogIndex(1), &write_entry(100, "before")),
            Applied::Done
        );
        assert_eq!(
            machine.apply(group, LogIndex(2), &fence_entry(3)),
            Applied::Done
        );
        let fence = Fence {
            index: LogIndex(2),
            plan: 3,
            clock: 100,
        };
        assert_eq!(records.fence(group), Some(fence));
        // Another plan's fence, late, does not move it; another plan's unfence does not
        // lift it.
        machine.apply(group, LogIndex(3), &fence_entry(4));
        machine.apply(group, LogIndex(4), &unfence_entry(2));
        assert_eq!(records.fence(group), Some(fence));
        assert_eq!(
            machine.apply(group, LogIndex(5), &write_entry(200, "after")),
            Applied::Refused
        );
        // A replay of the entries before the fence still applies them.
        assert_eq!(
            machine.apply(group, LogIndex(1), &write_entry(100, "before")),
            Applied::Done
        );
        machine.finish_applying();
        assert_eq!(visible(&engine), b"before");
        // Other groups are not fenced.
        assert_eq!(
            machine.apply(GroupId(8), LogIndex(3), &write_entry(150, "elsewhere")),
            Applied::Done
        );

        assert_eq!(
            machine.apply(group, LogIndex(6), &unfence_entry(3)),
            Applied::Done
        );
        assert_eq!(records.fence(group), None);
        assert_eq!(
            machine.apply(group, LogIndex(7), &write_entry(200, "after")),
            Applied::Done
        );
        machine.finish_applying();
        assert_eq!(visible(&engine), b"after");
    }

    #[test]
    fn a_fence_travels_with_a_snapshot_and_a_split_half_starts_at_its_floor() {
        let records = Arc::new(GroupRecords::default());
        let engine = Arc::new(shoal_storage::MemoryEngine::new());
        let mut member =
            EngineMachine::new(Arc::clone(&engine) as Arc<dyn Engine>, Arc::clone(&records));
        let group = GroupId(1);
        member.apply(group, LogIndex(1), &write_entry(500, "x"));
        member.apply(group, LogIndex(2), &fence_entry(1));
        let snapshot = member.snapshot_state(group);

        let other_records = Arc::new(GroupRecords::default());
        let mut newcomer = EngineMachine::new(
            Arc::new(shoal_storage::MemoryEngine::new()) as Arc<dyn Engine>,
            Arc::clone(&other_records),
        );
        newcomer.restore_state(group, &snapshot);
        assert_eq!(other_records.fence(group), records.fence(group));
        assert_eq!(
            newcomer.apply(group, LogIndex(3), &write_entry(600, "y")),
            Applied::Refused
        );

        // A half of the split tablet: its group starts at the fenced clock, so a later
        // write stamped earlier still comes after everything the tablet held.
        let half = GroupId(2);
        records.set_floor(half, records.fence(group).expect("fenced").clock);
        member.apply(half, LogIndex(1), &write_entry(10, "late"));
        member.finish_applying();
        assert_eq!(visible(&engine), b"late");
    }
}
