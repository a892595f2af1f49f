//! Writes set aside while a tablet streams in, so that its files go to the bottom level.
//!
//! A node that takes over a tablet (the pending replica of a migration) receives the
//! tablet's writes from `WriteBoth` on and its older data afterwards, as files ingested
//! without the memtable ([`super::RocksEngine`]'s `ingest`). RocksDB places an ingested
//! file in the lowest level where no file's key range overlaps it, and only when the
//! memtable holds none of its keys; otherwise the memtable is flushed first and the file
//! lands in level 0 above the flushed one. So the writes a pending replica takes while it
//! streams would send every file it ingests to level 0 — a flushed file holds keys from
//! all over the key space — and the node would then compact everything it received while
//! it joins. Under `bench/elastic`'s write load the new node did: 24 files ingested into
//! level 0 and 443 MiB compacted during a 2.3 s join.
//!
//! Instead, from the moment the node is told to prepare for the tablet until its data is
//! in, writes to the range are *staged*: the [`super::writer`] applies them to a column
//! family of their own ([`STAGED_FAMILY`]) instead of the data. When the stream ends they
//! are moved into the data in one atomic batch ([`release_batch`]). Cells reconcile by
//! last-write-wins whatever order they are applied in, so applying the staged writes after
//! the ingested files gives the same data as the other order.
//!
//! Nobody reads a pending replica's range until it has the data (`ReadNew`), which comes
//! after the stream ends, so no reader misses a staged write. A crash loses only the list
//! of staged ranges: the writes themselves are in the write-ahead log like any other, and
//! opening the engine moves whatever is staged into the data ([`release_everything`]).

use super::{io_error, range_read_options};
use crate::Result;
use rocksdb::{ColumnFamily, WriteBatch, DB};

/// The column family staged writes are kept in.
pub(super) const STAGED_FAMILY: &str = "staged";

/// Staged cells moved into the data per batch when the engine opens.
const RECOVERY_BATCH_ENTRIES: usize = 4096;

/// The key ranges whose writes are staged: `[lower, upper)` each, few at a time (the
/// tablets a node is receiving at once), so a linear search is the fast one.
#[derive(Debug, Default)]
pub(super) struct StagedRanges {
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
}

impl StagedRanges {
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// True when writes to `key` are staged.
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.ranges
            .iter()
            .any(|(lower, upper)| lower.as_slice() <= key && key < upper.as_slice())
    }

    /// Stages writes to `[lower, upper)` (again: nothing changes).
    pub(super) fn add(&mut self, lower: &[u8], upper: &[u8]) {
        if !self
            .ranges
            .iter()
            .any(|(l, u)| l.as_slice() == lower && u.as_slice() == upper)
        {
            self.ranges.push((lower.to_vec(), upper.to_vec()));
        }
    }

    /// Stops staging every range that overlaps `[lower, upper)`; answers those ranges.
    pub(super) fn remove_overlapping(
        &mut self,
        lower: &[u8],
        upper: &[u8],
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let (released, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ranges)
            .into_iter()
            .partition(|(l, u)| l.as_slice() < upper && lower < u.as_slice());
        self.ranges = kept;
        released
    }
}

/// Adds to `batch` the staged cells of each range, as merge operands of the data (a
/// resolved value is a valid operand: the merge operator is associative), and their
/// removal from the staging family; answers how many stored entries it moves.
pub(super) fn release_batch(
    db: &DB,
    staged: &ColumnFamily,
    data: &ColumnFamily,
    ranges: &[(Vec<u8>, Vec<u8>)],
    batch: &mut WriteBatch,
) -> Result<usize> {
    let mut moved = 0;
    for (lower, upper) in ranges {
        let mut cells = db.raw_iterator_cf_opt(staged, range_read_options(lower, upper));
        cells.seek_to_first();
        while let (Some(key), Some(value)) = (cells.key(), cells.value()) {
            batch.merge_cf(data, key, value);
            moved += 1;
            cells.next();
        }
        cells.status().map_err(io_error)?;
        batch.delete_range_cf(staged, lower, upper);
    }
    Ok(moved)
}

/// Moves every staged cell into the data (a node that stopped while receiving a tablet),
/// [`RECOVERY_BATCH_ENTRIES`] at a time; answers how many. Runs before the engine takes
/// writes.
pub(super) fn release_everything(
    db: &DB,
    staged: &ColumnFamily,
    data: &ColumnFamily,
) -> Result<usize> {
    let mut moved = 0;
    let mut batch = WriteBatch::default();
    let mut cells = db.raw_iterator_cf(staged);
    cells.seek_to_first();
    while let (Some(key), Some(value)) = (cells.key(), cells.value()) {
        batch.merge_cf(data, key, value);
        batch.delete_cf(staged, key);
        moved += 1;
        if moved % RECOVERY_BATCH_ENTRIES == 0 {
            db.write(std::mem::take(&mut batch)).map_err(io_error)?;
        }
        cells.next();
    }
    cells.status().map_err(io_error)?;
    db.write(batch).map_err(io_error)?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_staged_inside_a_staged_range_only() {
        let mut staged = StagedRanges::default();
        assert!(!staged.contains(b"m"));
        staged.add(b"c", b"f");
        staged.add(b"c", b"f");
        assert_eq!(
            staged.ranges.len(),
            1,
            "staging a range again changes nothing"
        );
        assert!(staged.contains(b"c"));
        assert!(staged.contains(b"e\xff"));
        assert!(!staged.contains(b"f"), "the upper bound is excluded");
        assert!(!staged.contains(b"b"));
    }

    #[test]
    fn releasing_a_range_releases_every_staged_range_it_overlaps() {
        let mut staged = StagedRanges::default();
        staged.add(b"a", b"c");
        staged.add(b"d", b"g");
        staged.add(b"k", b"m");
        let released = staged.remove_overlapping(b"b", b"e");
        assert_eq!(
            released,
            vec![
                (b"a".to_vec(), b"c".to_vec()),
                (b"d".to_vec(), b"g".to_vec())
            ]
        );
        assert!(!staged.contains(b"a") && !staged.contains(b"f"));
        assert!(
            staged.contains(b"l"),
            "a range it does not touch stays staged"
        );
    }
}
