//! The compaction filter: one [`PurgeFilter`] per compaction, judging the compaction's
//! full values in key order with a [`ShadowTracker`] (see [`crate::shadow`]).

use crate::shadow::{Grace, ShadowTracker, Verdict};
use crate::TableRules;
use parking_lot::Mutex;
use rocksdb::compaction_filter::{CompactionFilter, Decision};
use rocksdb::compaction_filter_factory::{CompactionFilterContext, CompactionFilterFactory};
use shoal_model::{fragment, Cell, TableId, WriteTimestamp};
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::sync::Arc;

/// Expired covering deletions remembered for garbage collection; compaction offers them
/// again later when this is full.
const MAX_GARBAGE_CANDIDATES: usize = 65_536;

/// Creates a [`PurgeFilter`] for every compaction.
pub(super) struct PurgeFilterFactory {
    pub(super) rules: Arc<TableRules>,
    pub(super) garbage: Arc<Mutex<BTreeSet<Vec<u8>>>>,
}

impl CompactionFilterFactory for PurgeFilterFactory {
    type Filter = PurgeFilter;

    fn create(&mut self, _context: CompactionFilterContext) -> PurgeFilter {
        PurgeFilter {
            rules: Arc::clone(&self.rules),
            garbage: Arc::clone(&self.garbage),
            tracker: ShadowTracker::new(),
            now_seconds: shoal_model::timestamp::now_seconds(),
            table: None,
        }
    }

    fn name(&self) -> &CStr {
        c"shoal_purge"
    }
}

/// One compaction's filter: sees the compaction's full values in key order (merge
/// operands are never shown to it, and are kept).
pub(super) struct PurgeFilter {
    rules: Arc<TableRules>,
    garbage: Arc<Mutex<BTreeSet<Vec<u8>>>>,
    tracker: ShadowTracker,
    now_seconds: i64,
    /// The last table seen, its grace period (`None`: never purge) and its truncation.
    table: Option<(TableId, Option<Grace>, Option<WriteTimestamp>)>,
}

impl PurgeFilter {
    /// The grace period and truncation of the table `key` belongs to; the tracker learns
    /// the truncation when the table changes.
    fn rules_for(&mut self, key: &[u8]) -> (Option<Grace>, Option<WriteTimestamp>) {
        let Some(table) = TableId::of_key(key) else {
            return (None, None);
        };
        match &self.table {
            Some((cached, grace, truncation)) if *cached == table => (*grace, *truncation),
            _ => {
                let grace = self.rules.get(&table).map(|seconds| Grace {
                    gc_grace_seconds: seconds as i64,
                    now_seconds: self.now_seconds,
                });
                let truncation = self.rules.truncated_at(&table);
                self.tracker.set_truncation(truncation);
                self.table = Some((table, grace, truncation));
                (grace, truncation)
            }
        }
    }
}

impl PurgeFilter {
    /// A fragment goes once every part of it is dead (shadowed or purgeable); until then it
    /// is kept whole, dead parts included — they cover nothing, so keeping them never
    /// keeps a deletion alive longer, and RocksDB's filter API cannot hand back a value we
    /// own to replace it with.
    fn filter_fragment(&mut self, key: &[u8], value: &[u8], grace: Option<Grace>) -> Decision {
        let Ok(view) = fragment::FragmentView::parse(value) else {
            return Decision::Keep;
        };
        let (marker, cells) = self.tracker.judge_fragment(key, &view, grace);
        let dead = |verdict: &Verdict| matches!(verdict, Verdict::Shadowed | Verdict::Purgeable);
        if marker.iter().chain(&cells).all(dead) {
            Decision::Remove
        } else {
            Decision::Keep
        }
    }
}

impl CompactionFilter for PurgeFilter {
    fn filter(&mut self, _level: u32, key: &[u8], value: &[u8]) -> Decision {
        // Tables without a registered grace period or truncation are left alone.
        let (grace, truncation) = self.rules_for(key);
        if grace.is_none() && truncation.is_none() {
            return Decision::Keep;
        }
        if fragment::is_stored_fragment(key, value) {
            return self.filter_fragment(key, value, grace);
        }
        let Ok(cell) = Cell::decode(value) else {
            return Decision::Keep;
        };
        match self.tracker.judge(key, &cell, grace) {
            Verdict::Keep => Decision::Keep,
            Verdict::Shadowed | Verdict::Purgeable => Decision::Remove,
            Verdict::PurgeableOnceCleared => {
                let mut garbage = self.garbage.lock();
                if garbage.len() < MAX_GARBAGE_CANDIDATES {
                    garbage.insert(key.to_vec());
                }
                Decision::Keep
            }
        }
    }

    fn name(&self) -> &CStr {
        c"shoal_purge"
    }
}
