//! Which stored cells are dead for good: the one rule compaction, replica reads, digests
//! and repair share.
//!
//! A deletion in Shoal is a cell of its own. A cell tombstone shadows only its own key,
//! but a partition deletion, a range tombstone, a row deletion and a collection deletion
//! each shadow *other* keys — every cell they cover whose write timestamp is not newer.
//! Two consequences shape this module:
//!
//! - A shadowed cell is dead: compaction may drop it as soon as it meets it, replicas
//!   leave it out of what they send and of their digests, and reconciliation drops it.
//! - A covering deletion may only be dropped once nothing it shadows can still exist
//!   beneath it. Dropping it earlier is how deleted rows came back after compaction. A
//!   compaction sees only some of the data (never the memtable, often not every level), so
//!   it cannot know that by itself: it reports such a deletion as
//!   [`Verdict::PurgeableOnceCleared`], and garbage collection
//!   ([`crate::RocksEngine::collect_garbage`]) replaces every cell it still shadows by a
//!   tombstone of its own and marks it `shadow_cleared`; from then on it is
//!   [`Verdict::Purgeable`] like any tombstone.
//!
//! [`ShadowTracker`] judges `(key, cell)` pairs given in ascending key order. It works
//! because the key layout puts every deletion before what it can shadow (see
//! [`shoal_model::keys`]): by the time a cell passes, every deletion that could cover it in
//! this walk has passed already. A walk that starts in the middle of a partition must
//! first show the tracker that partition's deletions ([`visit_visible`] does).
//!
//! Purging follows Cassandra: a tombstone is purgeable `gc_grace_seconds` after its
//! deletion, an expired cell `gc_grace_seconds` after it was written (and not before it
//! expired). Tables with no known grace period (not yet in the schema this node has
//! installed, or internal) are never purged.

use crate::reader::RangeTombstone;
use crate::{Engine, Result, StorageError};
use shoal_model::fragment;
use shoal_model::keys::{self, ColumnPart};
use shoal_model::{Cell, TableId, WriteTimestamp};
use std::collections::VecDeque;

/// Range tombstones of one partition the tracker remembers; beyond this it stops using
/// further ones to shadow cells (they stay in storage and are still applied by readers,
/// only their shadowed cells are kept longer).
pub const MAX_TRACKED_RANGE_TOMBSTONES: usize = 4096;

/// What may happen to one stored cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It still matters: keep it, send it, digest it.
    Keep,
    /// A deletion met earlier in the walk covers it: dead, may be dropped now.
    Shadowed,
    /// Dead for longer than the grace period and shadowing nothing else: may be dropped.
    Purgeable,
    /// A covering deletion past its grace period that may still shadow cells elsewhere:
    /// keep it until garbage collection has cleared what it shadows.
    PurgeableOnceCleared,
}

impl Verdict {
    /// True when the cell is part of what a replica answers (data, digests, repair).
    pub fn is_visible(self) -> bool {
        self == Verdict::Keep
    }
}

/// A table's grace period as of a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    pub gc_grace_seconds: i64,
    pub now_seconds: i64,
}

impl Grace {
    /// True when `cell` has been dead for the whole grace period.
    pub fn expired_for(&self, cell: &Cell) -> bool {
        cell.dead_since(self.now_seconds)
            .is_some_and(|since| self.now_seconds >= since.saturating_add(self.gc_grace_seconds))
    }
}

/// Follows one partition's deletions through a walk in ascending key order.
#[derive(Debug, Default)]
pub struct ShadowTracker {
    /// `table id | token | partition key` of the partition being walked.
    partition: Vec<u8>,
    partition_deletion: Option<WriteTimestamp>,
    range_tombstones: Vec<RangeTombstone>,
    /// `section | clustering` of the row being walked.
    row: Vec<u8>,
    /// The newest partition-level deletion covering the current row (partition deletion
    /// and range tombstones; the static row only knows the partition deletion).
    row_partition_floor: Option<WriteTimestamp>,
    row_deletion: Option<WriteTimestamp>,
    collection_deletions: Vec<(Vec<u8>, WriteTimestamp)>,
    /// The table's truncation ([`Engine::set_truncated_at`]): every partition starts with
    /// it as its partition deletion.
    truncation: Option<WriteTimestamp>,
}

fn covered(floor: Option<WriteTimestamp>, cell: &Cell) -> bool {
    floor.is_some_and(|deleted| cell.timestamp <= deleted)
}

impl ShadowTracker {
    pub fn new() -> ShadowTracker {
        ShadowTracker::default()
    }

    /// The truncation of the table whose keys come next: every partition entered from now
    /// on starts covered by it. Set it whenever the walk reaches another table.
    pub fn set_truncation(&mut self, truncation: Option<WriteTimestamp>) {
        self.truncation = truncation;
    }

    /// Judges the cell stored under `key`. Keys must come in ascending order. `grace`
    /// `None` never purges (shadowing still applies). Keys that do not parse as user
    /// data are kept.
    pub fn judge(&mut self, key: &[u8], cell: &Cell, grace: Option<Grace>) -> Verdict {
        let Some((partition, rest)) = keys::split_at_partition_end(key) else {
            return Verdict::Keep;
        };
        if self.partition != partition {
            *self = ShadowTracker {
                partition: partition.to_vec(),
                partition_deletion: self.truncation,
                truncation: self.truncation,
                ..ShadowTracker::default()
            };
        }
        let standing = |covering: bool| -> Verdict {
            match grace {
                Some(grace) if grace.expired_for(cell) => {
                    let cleared = matches!(
                        cell.kind,
                        shoal_model::CellKind::Tombstone {
                            shadow_cleared: true,
                            ..
                        }
                    );
                    if covering && !cleared {
                        Verdict::PurgeableOnceCleared
                    } else {
                        Verdict::Purgeable
                    }
                }
                _ => Verdict::Keep,
            }
        };
        match rest.first() {
            Some(&keys::SECTION_PARTITION_DELETION) => {
                if !cell.is_tombstone() {
                    return Verdict::Keep;
                }
                self.partition_deletion = self.partition_deletion.max(Some(cell.timestamp));
                standing(true)
            }
            Some(&keys::SECTION_RANGE_TOMBSTONE) => {
                let Some((start, start_inclusive, end, end_inclusive)) =
                    keys::parse_range_tombstone(rest)
                else {
                    return Verdict::Keep;
                };
                if !cell.is_tombstone() {
                    return Verdict::Keep;
                }
                if covered(self.partition_deletion, cell) {
                    return Verdict::Shadowed;
                }
                if self.range_tombstones.len() < MAX_TRACKED_RANGE_TOMBSTONES {
                    self.range_tombstones.push(RangeTombstone {
                        start: start.to_vec(),
                        start_inclusive,
                        end: end.to_vec(),
                        end_inclusive,
                        timestamp: cell.timestamp,
                    });
                }
                standing(true)
            }
            Some(&keys::SECTION_STATIC_ROW) | Some(&keys::SECTION_ROW) => {
                let Some((section, clustering, part)) = keys::split_row_key(rest) else {
                    return Verdict::Keep;
                };
                let row_length = 1 + clustering.len();
                if self.row != rest[..row_length] {
                    self.enter_row(&rest[..row_length], section, clustering);
                }
                let row_floor = self.row_partition_floor.max(self.row_deletion);
                match keys::parse_column_part(part) {
                    Some(ColumnPart::RowDeletion) => {
                        if !cell.is_tombstone() {
                            return Verdict::Keep;
                        }
                        if covered(self.row_partition_floor, cell) {
                            return Verdict::Shadowed;
                        }
                        self.row_deletion = self.row_deletion.max(Some(cell.timestamp));
                        standing(true)
                    }
                    Some(ColumnPart::RowMarker) => {
                        if covered(row_floor, cell) {
                            Verdict::Shadowed
                        } else {
                            standing(false)
                        }
                    }
                    Some(ColumnPart::CollectionDeletion { column }) => {
                        if !cell.is_tombstone() {
                            return Verdict::Keep;
                        }
                        if covered(row_floor, cell) {
                            return Verdict::Shadowed;
                        }
                        self.collection_deletions
                            .push((column.to_vec(), cell.timestamp));
                        standing(true)
                    }
                    Some(ColumnPart::Cell { column, .. }) => {
                        let collection_floor = self
                            .collection_deletions
                            .iter()
                            .filter(|(name, _)| name == column)
                            .map(|(_, timestamp)| *timestamp)
                            .max();
                        if covered(row_floor.max(collection_floor), cell) {
                            Verdict::Shadowed
                        } else {
                            standing(false)
                        }
                    }
                    None => Verdict::Keep,
                }
            }
            _ => Verdict::Keep,
        }
    }

    /// Judges a row fragment stored under the marker's key `key` (decision 0018): its
    /// marker and each of its cells as if each were stored under a key of its own. Keys
    /// must come in ascending order, as for [`ShadowTracker::judge`]; the fragment's cells
    /// are judged at the marker's place, which is sound because only partition, range and
    /// row deletions — all sorted before the marker — can shadow a simple cell. Answers
    /// the marker's verdict (if it has one) and one verdict per cell, in the fragment's
    /// order; a part that does not decode is kept.
    pub fn judge_fragment(
        &mut self,
        key: &[u8],
        fragment: &shoal_model::fragment::FragmentView<'_>,
        grace: Option<Grace>,
    ) -> (Option<Verdict>, Vec<Verdict>) {
        let marker = fragment.marker.map(|marker| match Cell::decode(marker) {
            Ok(cell) => self.judge(key, &cell, grace),
            Err(_) => Verdict::Keep,
        });
        let Some(row) = shoal_model::fragment::marker_row(key) else {
            return (marker, vec![Verdict::Keep; fragment.cells.len()]);
        };
        let cells = fragment
            .cells
            .iter()
            .map(|(name, encoded)| match Cell::decode(encoded) {
                Ok(cell) => {
                    let cell_key = shoal_model::fragment::simple_cell_key(row, name);
                    self.judge(&cell_key, &cell, grace)
                }
                Err(_) => Verdict::Keep,
            })
            .collect();
        (marker, cells)
    }

    fn enter_row(&mut self, row: &[u8], section: u8, clustering: &[u8]) {
        self.row.clear();
        self.row.extend_from_slice(row);
        self.row_deletion = None;
        self.collection_deletions.clear();
        self.row_partition_floor = if section == keys::SECTION_ROW {
            // Rows come in ascending clustering order: a range tombstone that ends before
            // this row can cover no later one.
            self.range_tombstones
                .retain(|tombstone| !tombstone.ends_before(clustering));
            self.range_tombstones
                .iter()
                .filter(|tombstone| tombstone.covers(clustering))
                .map(|tombstone| tombstone.timestamp)
                .chain(self.partition_deletion)
                .max()
        } else {
            self.partition_deletion
        };
    }
}

fn decode(value: &[u8]) -> Result<Cell> {
    Cell::decode(value).map_err(|e| StorageError::Corrupt(e.0))
}

/// The truncation of the table `key` belongs to, as `engine` knows it.
pub fn truncation_for(engine: &dyn Engine, key: &[u8]) -> Option<WriteTimestamp> {
    engine.truncated_at(&TableId::of_key(key)?)
}

/// The grace period of the table `key` belongs to, as `engine` knows it.
pub fn grace_for(engine: &dyn Engine, key: &[u8], now_seconds: i64) -> Option<Grace> {
    let table = TableId::of_key(key)?;
    engine.gc_grace_seconds(&table).map(|seconds| Grace {
        gc_grace_seconds: seconds as i64,
        now_seconds,
    })
}

/// Feeds the tracker every key of `[lower, upper)` without visiting it.
fn show_tracker(
    engine: &dyn Engine,
    tracker: &mut ShadowTracker,
    lower: &[u8],
    upper: &[u8],
) -> Result<()> {
    if lower >= upper {
        return Ok(());
    }
    let mut cursor = engine.scan(lower, upper, false)?;
    while let Some((key, value)) = cursor.current() {
        judge_stored(tracker, key, value, None)?;
        cursor.advance();
    }
    cursor.status()
}

/// A stored cell under the key a write names it by, its encoding and its verdict.
type JudgedCell<'v> = (Vec<u8>, &'v [u8], Verdict);

/// Judges one stored entry — a cell, or a row fragment's marker and cells (decision
/// 0018) — and answers its parts under the keys a write names them by, each with its
/// verdict, in key order.
fn judge_stored<'v>(
    tracker: &mut ShadowTracker,
    key: &[u8],
    value: &'v [u8],
    grace: Option<Grace>,
) -> Result<Vec<JudgedCell<'v>>> {
    let parts = fragment::expand(key, value).map_err(|e| StorageError::Corrupt(e.0))?;
    parts
        .into_iter()
        .map(|(part_key, encoded)| {
            let verdict = tracker.judge(&part_key, &decode(encoded)?, grace);
            Ok((part_key, encoded, verdict))
        })
        .collect()
}

/// Whether a key's section byte is one of a row's: a regular or the static row.
fn is_row_section(section: u8) -> bool {
    section == keys::SECTION_ROW || section == keys::SECTION_STATIC_ROW
}

/// When `lower` falls inside a row after the row's marker key — a chunked read resuming
/// after one of a fragment's cells — the row's start (`partition | section |
/// clustering`) and its marker key: the fragment there holds cells at and after `lower`
/// that the scan from `lower` does not meet.
fn row_resumed_inside(engine: &dyn Engine, lower: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let Some((partition, rest)) = keys::split_at_partition_end(lower) else {
        return Ok(None);
    };
    // Only a key past a row's section byte can be inside that row. A read from a
    // partition's start or its header — every replica's point read — needs no look back,
    // which would cost an iterator and a backward seek through every level.
    let past_a_row_section = rest.len() > 1 && is_row_section(rest[0]);
    if !past_a_row_section {
        return Ok(None);
    }
    let cursor = engine.scan(partition, lower, true)?;
    let Some((before, _)) = cursor.current() else {
        return Ok(None);
    };
    let row = keys::split_at_partition_end(before)
        .and_then(|(partition, rest)| {
            let (section, clustering, _) = keys::split_row_key(rest)?;
            is_row_section(section).then_some(partition.len() + 1 + clustering.len())
        })
        .map(|length| before[..length].to_vec());
    drop(cursor);
    let Some(row) = row else {
        return Ok(None);
    };
    let inside =
        lower.len() > row.len() && lower.starts_with(&row) && lower[row.len()] <= keys::COLUMN_CELL;
    let marker = fragment::marker_key(&row);
    Ok((inside && marker.as_slice() < lower).then_some((row, marker)))
}

/// Visits the *visible* cells of `[lower, upper)` in key order — neither shadowed nor
/// purgeable — which is what a replica sends, digests and compares in repair. When
/// `lower` falls inside a partition (a chunked read resuming), that partition's deletions
/// before it are shown to the tracker first, so what it covers stays hidden. `visit`
/// returns `false` to stop; the result is `true` when the whole range was visited.
pub fn visit_visible(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    now_seconds: i64,
    mut visit: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<bool> {
    let mut tracker = ShadowTracker::new();
    // Visible cells of row fragments not visited yet, in key order: they go out between
    // the row's stored keys, where their keys sort.
    let mut pending: VecDeque<(Vec<u8>, Vec<u8>)> = VecDeque::new();
    if let Some((row, marker)) = row_resumed_inside(engine, lower)? {
        tracker.set_truncation(truncation_for(engine, &row));
        seed_mid_partition(engine, &mut tracker, lower, &marker)?;
        let mut after_marker = marker.clone();
        after_marker.push(0);
        let cursor = engine.scan(&marker, &after_marker, false)?;
        if let Some((key, value)) = cursor.current() {
            let grace = grace_for(engine, key, now_seconds);
            for (part_key, encoded, verdict) in judge_stored(&mut tracker, key, value, grace)? {
                if verdict.is_visible() && part_key.as_slice() >= lower {
                    pending.push_back((part_key, encoded.to_vec()));
                }
            }
        }
        cursor.status()?;
    }
    let mut cursor = engine.scan(lower, upper, false)?;
    if let Some((first, _)) = cursor.current() {
        tracker.set_truncation(truncation_for(engine, first));
        seed_mid_partition(engine, &mut tracker, lower, first)?;
    }
    let mut grace: Option<(Vec<u8>, Option<Grace>)> = None;
    while let Some((key, value)) = cursor.current() {
        while pending
            .front()
            .is_some_and(|(next, _)| next.as_slice() < key)
        {
            if let Some((next, cell)) = pending.pop_front() {
                if !visit(&next, &cell) {
                    cursor.status()?;
                    return Ok(false);
                }
            }
        }
        let table = &key[..key.len().min(keys::TABLE_ID_LENGTH)];
        if grace.as_ref().is_none_or(|(cached, _)| cached != table) {
            grace = Some((table.to_vec(), grace_for(engine, key, now_seconds)));
            tracker.set_truncation(truncation_for(engine, key));
        }
        let table_grace = grace.as_ref().and_then(|(_, g)| *g);
        if fragment::is_stored_fragment(key, value) {
            for (part_key, encoded, verdict) in judge_stored(&mut tracker, key, value, table_grace)?
            {
                if verdict.is_visible() {
                    pending.push_back((part_key, encoded.to_vec()));
                }
            }
        } else {
            let cell = decode(value)?;
            if tracker.judge(key, &cell, table_grace).is_visible() && !visit(key, value) {
                cursor.status()?;
                return Ok(false);
            }
        }
        cursor.advance();
    }
    cursor.status()?;
    for (key, cell) in pending {
        if !visit(&key, &cell) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// When `first` (the first key at or after `lower`) belongs to a partition — or a row —
/// that started before `lower`, shows the tracker the deletions it skipped.
fn seed_mid_partition(
    engine: &dyn Engine,
    tracker: &mut ShadowTracker,
    lower: &[u8],
    first: &[u8],
) -> Result<()> {
    let Some((partition, rest)) = keys::split_at_partition_end(first) else {
        return Ok(());
    };
    if partition >= lower {
        return Ok(());
    }
    let mut deletions_end = partition.to_vec();
    deletions_end.push(keys::SECTION_STATIC_ROW);
    let deletions_upper = std::cmp::min(deletions_end.as_slice(), lower).to_vec();
    show_tracker(engine, tracker, partition, &deletions_upper)?;
    if let Some((_, clustering, _)) = keys::split_row_key(rest) {
        let row = &first[..partition.len() + 1 + clustering.len()];
        if row < lower {
            let row_lower = std::cmp::max(row, deletions_upper.as_slice()).to_vec();
            show_tracker(engine, tracker, &row_lower, lower)?;
        }
    }
    Ok(())
}

/// Drops the shadowed cells of `cells` (sorted by key): what reconciliation keeps.
pub fn without_shadowed(cells: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut tracker = ShadowTracker::new();
    cells
        .into_iter()
        .filter(|(key, value)| match Cell::decode(value) {
            Ok(cell) => tracker.judge(key, &cell, None) != Verdict::Shadowed,
            Err(_) => true,
        })
        .collect()
}

/// The key range a covering deletion stored under `key` covers: `[lower, upper)`, and
/// for a range tombstone the tombstone itself (rows inside the range must still be
/// checked with [`RangeTombstone::covers`]).
pub(crate) fn coverage(key: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Option<RangeTombstone>)> {
    let (partition, rest) = keys::split_at_partition_end(key)?;
    let end_of = |prefix: &[u8]| keys::increment_prefix(prefix);
    match *rest.first()? {
        keys::SECTION_PARTITION_DELETION => Some((partition.to_vec(), end_of(partition)?, None)),
        keys::SECTION_RANGE_TOMBSTONE => {
            let (start, start_inclusive, end, end_inclusive) = keys::parse_range_tombstone(rest)?;
            let mut rows = partition.to_vec();
            rows.push(keys::SECTION_ROW);
            let upper = end_of(&rows)?;
            Some((
                rows,
                upper,
                Some(RangeTombstone {
                    start: start.to_vec(),
                    start_inclusive,
                    end: end.to_vec(),
                    end_inclusive,
                    timestamp: WriteTimestamp(0),
                }),
            ))
        }
        keys::SECTION_STATIC_ROW | keys::SECTION_ROW => {
            let (_, clustering, part) = keys::split_row_key(rest)?;
            let row = &key[..partition.len() + 1 + clustering.len()];
            match keys::parse_column_part(part)? {
                ColumnPart::RowDeletion => Some((row.to_vec(), end_of(row)?, None)),
                ColumnPart::CollectionDeletion { column } => {
                    let mut cells = row.to_vec();
                    keys::push_cell_column(&mut cells, &String::from_utf8_lossy(column), b"");
                    let upper = end_of(&cells)?;
                    Some((cells, upper, None))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The row marker's key of the row a collection deletion stored under `key` belongs to
/// (where a row fragment keeps the row's simple cells), or `None` for other keys.
pub(crate) fn marker_of_collection_deletion(key: &[u8]) -> Option<Vec<u8>> {
    let (partition, rest) = keys::split_at_partition_end(key)?;
    let (_, clustering, part) = keys::split_row_key(rest)?;
    if !matches!(
        keys::parse_column_part(part)?,
        ColumnPart::CollectionDeletion { .. }
    ) {
        return None;
    }
    Some(fragment::marker_key(
        &key[..partition.len() + 1 + clustering.len()],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::Token;

    const TABLE: TableId = TableId([9; 16]);

    fn partition() -> Vec<u8> {
        keys::partition_prefix(&TABLE, Token(5), b"p")
    }

    fn row_key(clustering: &[u8], part: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut key = partition();
        key.push(keys::SECTION_ROW);
        key.extend_from_slice(clustering);
        keys::push_column_part(&mut key, part);
        key
    }

    fn cell_key(clustering: &[u8], column: &str, path: &[u8]) -> Vec<u8> {
        row_key(clustering, |k| keys::push_cell_column(k, column, path))
    }

    fn live(timestamp: i64) -> Cell {
        Cell::live(WriteTimestamp(timestamp), b"v".to_vec())
    }

    fn deletion(timestamp: i64, deleted_at: i64) -> Cell {
        Cell::tombstone(WriteTimestamp(timestamp), deleted_at)
    }

    #[test]
    fn a_partition_deletion_shadows_older_cells_and_not_newer_ones() {
        let mut tracker = ShadowTracker::new();
        let mut deletion_key = partition();
        deletion_key.push(keys::SECTION_PARTITION_DELETION);
        assert_eq!(
            tracker.judge(&deletion_key, &deletion(20, 100), None),
            Verdict::Keep
        );
        assert_eq!(
            tracker.judge(&cell_key(b"a", "v", b""), &live(20), None),
            Verdict::Shadowed,
            "a tie goes to the deletion"
        );
        assert_eq!(
            tracker.judge(&cell_key(b"b", "v", b""), &live(21), None),
            Verdict::Keep
        );
    }

    #[test]
    fn an_expired_covering_deletion_waits_for_its_shadow_to_be_cleared() {
        let grace = Some(Grace {
            gc_grace_seconds: 10,
            now_seconds: 1_000,
        });
        let mut tracker = ShadowTracker::new();
        let marker = row_key(b"a", |k| k.push(keys::COLUMN_ROW_DELETION));
        assert_eq!(
            tracker.judge(&marker, &deletion(5, 100), grace),
            Verdict::PurgeableOnceCleared
        );
        let cleared = Cell {
            kind: shoal_model::CellKind::Tombstone {
                deleted_at: 100,
                shadow_cleared: true,
            },
            ..deletion(5, 100)
        };
        let mut tracker = ShadowTracker::new();
        assert_eq!(tracker.judge(&marker, &cleared, grace), Verdict::Purgeable);
        // A cell tombstone covers only itself: purgeable alone.
        assert_eq!(
            tracker.judge(&cell_key(b"a", "v", b""), &deletion(6, 100), grace),
            Verdict::Purgeable
        );
        // Within the grace period nothing is purgeable.
        let young = Some(Grace {
            gc_grace_seconds: 10_000,
            now_seconds: 1_000,
        });
        let mut tracker = ShadowTracker::new();
        assert_eq!(
            tracker.judge(&marker, &deletion(5, 100), young),
            Verdict::Keep
        );
    }

    #[test]
    fn a_collection_deletion_shadows_only_its_column_of_its_row() {
        let mut tracker = ShadowTracker::new();
        let collection = row_key(b"a", |k| keys::push_collection_deletion(k, "s"));
        tracker.judge(&collection, &deletion(10, 1), None);
        assert_eq!(
            tracker.judge(&cell_key(b"a", "s", b"x"), &live(9), None),
            Verdict::Shadowed
        );
        assert_eq!(
            tracker.judge(&cell_key(b"a", "t", b""), &live(9), None),
            Verdict::Keep
        );
        assert_eq!(
            tracker.judge(&cell_key(b"b", "s", b"x"), &live(9), None),
            Verdict::Keep,
            "another row"
        );
    }

    #[test]
    fn range_tombstones_shadow_rows_inside_their_bounds() {
        let mut tracker = ShadowTracker::new();
        let mut range = partition();
        keys::push_range_tombstone(&mut range, b"b", true, b"c", false);
        tracker.judge(&range, &deletion(10, 1), None);
        assert_eq!(
            tracker.judge(&cell_key(b"a", "v", b""), &live(1), None),
            Verdict::Keep
        );
        assert_eq!(
            tracker.judge(&cell_key(b"b", "v", b""), &live(1), None),
            Verdict::Shadowed
        );
        assert_eq!(
            tracker.judge(&cell_key(b"c", "v", b""), &live(1), None),
            Verdict::Keep,
            "exclusive end"
        );
    }
}
