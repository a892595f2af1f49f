//! An in-memory [`Engine`] for tests: a sorted map under a lock. Cursors iterate a copy of
//! their range taken when they are created, which is simple and, for tests, fast enough.

use crate::shadow::{self, ShadowTracker, Verdict};
use crate::{Cursor, Engine, GarbageReport, Result, TableRules, WriteBatch};
use parking_lot::RwLock;
use shoal_model::{Cell, TableId};
use std::collections::BTreeMap;

#[derive(Default)]
pub struct MemoryEngine {
    data: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
    metadata: RwLock<BTreeMap<Vec<u8>, Vec<u8>>>,
    rules: TableRules,
}

impl MemoryEngine {
    pub fn new() -> MemoryEngine {
        MemoryEngine::default()
    }

    /// Compacts everything as of `now_seconds`: drops shadowed cells and everything past
    /// its grace period. Unlike one RocksDB compaction this sees every version of every
    /// key (there is only one), so a covering deletion can go in the same pass as what it
    /// shadows.
    pub fn compact(&self, now_seconds: i64) -> GarbageReport {
        let mut data = self.data.write();
        let mut tracker = ShadowTracker::new();
        let mut report = GarbageReport::default();
        data.retain(|key, value| {
            let grace = shadow::grace_for(self, key, now_seconds);
            let truncation = shadow::truncation_for(self, key);
            if grace.is_none() && truncation.is_none() {
                return true;
            }
            let Ok(cell) = Cell::decode(value) else {
                return true;
            };
            tracker.set_truncation(truncation);
            match tracker.judge(key, &cell, grace) {
                Verdict::Keep => true,
                Verdict::Shadowed | Verdict::Purgeable => false,
                Verdict::PurgeableOnceCleared => {
                    report.deletions_cleared += 1;
                    false
                }
            }
        });
        report
    }

    /// Number of stored keys, live or not.
    pub fn stored_key_count(&self) -> usize {
        self.data.read().len()
    }
}

/// A cursor over entries already collected, in the order given (`reverse`: descending,
/// which `skip_to` honours).
pub struct SnapshotCursor {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    position: usize,
    reverse: bool,
}

impl SnapshotCursor {
    pub fn new(entries: Vec<(Vec<u8>, Vec<u8>)>, reverse: bool) -> SnapshotCursor {
        SnapshotCursor {
            entries,
            position: 0,
            reverse,
        }
    }
}

impl Cursor for SnapshotCursor {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.entries
            .get(self.position)
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
    }

    fn advance(&mut self) {
        self.position += 1;
    }

    fn skip_to(&mut self, key: &[u8]) {
        while let Some((current, _)) = self.entries.get(self.position) {
            let before_target = if self.reverse {
                current.as_slice() >= key
            } else {
                current.as_slice() < key
            };
            if !before_target {
                break;
            }
            self.position += 1;
        }
    }

    fn status(&self) -> Result<()> {
        Ok(())
    }
}

impl Engine for MemoryEngine {
    fn write(&self, batch: &WriteBatch) -> Result<()> {
        let mut data = self.data.write();
        for (key, cell) in batch.entries() {
            match data.get_mut(key) {
                Some(existing) => {
                    let winner = Cell::reconcile_encoded(existing, cell).to_vec();
                    *existing = winner;
                }
                None => {
                    data.insert(key.clone(), cell.clone());
                }
            }
        }
        Ok(())
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        let data = self.data.read();
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = if lower < upper {
            data.range(lower.to_vec()..upper.to_vec())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        if reverse {
            entries.reverse();
        }
        Ok(Box::new(SnapshotCursor::new(entries, reverse)))
    }

    fn delete_range(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        let mut data = self.data.write();
        let doomed: Vec<Vec<u8>> = data
            .range(lower.to_vec()..upper.to_vec())
            .map(|(k, _)| k.clone())
            .collect();
        for key in doomed {
            data.remove(&key);
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn compact_all(&self) -> Result<()> {
        self.compact(shoal_model::timestamp::now_seconds());
        Ok(())
    }

    fn put_metadata(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.metadata.write().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete_metadata(&self, key: &[u8]) -> Result<()> {
        self.metadata.write().remove(key);
        Ok(())
    }

    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .metadata
            .read()
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn set_gc_grace_seconds(&self, table_id: TableId, seconds: i32) {
        self.rules.set(table_id, seconds);
    }

    fn gc_grace_seconds(&self, table_id: &TableId) -> Option<i32> {
        self.rules.get(table_id)
    }

    fn set_truncated_at(&self, table_id: TableId, at: shoal_model::WriteTimestamp) {
        self.rules.set_truncated_at(table_id, at);
    }

    fn truncated_at(&self, table_id: &TableId) -> Option<shoal_model::WriteTimestamp> {
        self.rules.truncated_at(table_id)
    }

    fn collect_garbage(&self) -> Result<GarbageReport> {
        Ok(self.compact(shoal_model::timestamp::now_seconds()))
    }

    fn approximate_size_bytes(&self) -> u64 {
        self.data
            .read()
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }

    /// Exact: the entries stored in each range.
    fn approximate_range_cells(&self, ranges: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u64>> {
        let data = self.data.read();
        Some(
            ranges
                .iter()
                .map(|(lower, upper)| {
                    data.range::<[u8], _>((
                        std::ops::Bound::Included(lower.as_slice()),
                        std::ops::Bound::Excluded(upper.as_slice()),
                    ))
                    .count() as u64
                })
                .collect(),
        )
    }
}
