//! Node-local storage: cells in key ranges, nothing about networking or CQL.
//!
//! - [`Engine`] is the boundary every storage implementation stands behind:
//!   [`RocksEngine`] for real nodes, [`MemoryEngine`] for tests. Both pass the same suite
//!   (`tests.rs`).
//! - Writes are *blind*: [`WriteBatch`] carries encoded [`shoal_model::Cell`]s that the
//!   engine merges with whatever is stored under the same key by last-write-wins
//!   ([`shoal_model::Cell::reconcile_encoded`]) — a RocksDB merge operator, so a write never
//!   reads first.
//! - Keys follow [`shoal_model::keys`]: a table's token range is one contiguous key range.
//! - [`reader`] turns raw cells back into rows: it applies partition, range, row and
//!   collection deletions and TTL expiry, so callers only ever see live data.
//! - Durability policy (periodic sync or epoch group commit) is the server's: it calls
//!   [`Engine::sync`] and decides when a write may be acknowledged.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod memory;
pub mod reader;
pub mod rocks;

#[cfg(test)]
mod tests;

pub use memory::{MemoryEngine, SnapshotCursor};
pub use rocks::{RocksEngine, RocksOptions};

/// What can go wrong below the storage boundary.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O error: {0}")]
    Io(String),
    #[error("corrupt data in storage: {0}")]
    Corrupt(String),
    /// A WAL sync failed: the node stops acknowledging writes (see fsyncgate).
    #[error("storage is poisoned after a failed sync and accepts no more writes: {0}")]
    Poisoned(String),
}

pub type Result<T> = std::result::Result<T, StorageError>;

/// A set of cell writes applied atomically. Each entry is `(key, encoded cell)`, merged by
/// last-write-wins with what the key already holds.
#[derive(Debug, Default, Clone)]
pub struct WriteBatch {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl WriteBatch {
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    pub fn merge(&mut self, key: Vec<u8>, encoded_cell: Vec<u8>) {
        self.entries.push((key, encoded_cell));
    }

    pub fn into_entries(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.entries
    }

    pub fn entries(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn extend(&mut self, other: WriteBatch) {
        self.entries.extend(other.entries);
    }
}

impl From<Vec<(Vec<u8>, Vec<u8>)>> for WriteBatch {
    /// A batch of `(key, encoded cell)` entries, e.g. cells received from another node.
    fn from(entries: Vec<(Vec<u8>, Vec<u8>)>) -> WriteBatch {
        WriteBatch { entries }
    }
}

/// A positioned iterator over `[lower, upper)` in one direction.
pub trait Cursor {
    /// The current entry, or `None` when the range is exhausted.
    fn current(&self) -> Option<(&[u8], &[u8])>;
    /// Moves to the next entry in the cursor's direction.
    fn advance(&mut self);
    /// Forward cursors: moves to the first key `>= key`. Reverse cursors: to the last key
    /// `< key`. Never moves outside the cursor's range.
    fn skip_to(&mut self, key: &[u8]);
    /// An I/O or corruption error met while iterating, checked when iteration ends.
    fn status(&self) -> Result<()>;
}

/// A node's local storage engine.
///
/// Durability rule: [`Engine::write`] is atomic and visible to reads when it returns, and
/// durable once a later [`Engine::sync`] has returned. Metadata writes are durable on
/// return.
pub trait Engine: Send + Sync + 'static {
    /// Applies every cell of `batch`, reconciling each with the stored cell by
    /// last-write-wins.
    fn write(&self, batch: &WriteBatch) -> Result<()>;

    /// A cursor over keys in `[lower, upper)`, ascending or (if `reverse`) descending.
    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>>;

    /// Removes every key in `[lower, upper)` (TRUNCATE, DROP TABLE).
    fn delete_range(&self, lower: &[u8], upper: &[u8]) -> Result<()>;

    /// Makes every write that has returned so far durable.
    fn sync(&self) -> Result<()>;

    /// Node metadata (schema, identity): a separate key space, durable on return.
    fn put_metadata(&self, key: &[u8], value: &[u8]) -> Result<()>;
    fn delete_metadata(&self, key: &[u8]) -> Result<()>;
    /// Every metadata entry whose key starts with `prefix`, in key order.
    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Tells compaction how long deletions of `table_id` must be kept before they may be
    /// purged (the table's `gc_grace_seconds`).
    fn set_gc_grace_seconds(&self, table_id: [u8; 16], seconds: i32);

    /// Approximate bytes stored, for `nodetool status`-style load reports.
    fn approximate_size_bytes(&self) -> u64;
}

/// Decides whether compaction may drop a stored cell: deletions and expired values whose
/// death is older than the table's grace period. Shared by every engine.
pub(crate) fn purgeable(
    key: &[u8],
    encoded_cell: &[u8],
    gc_grace: &GcGraceTable,
    now_seconds: i32,
) -> bool {
    let Some(table_id) = key
        .get(..shoal_model::keys::TABLE_ID_LENGTH)
        .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
    else {
        return false;
    };
    let Ok(cell) = shoal_model::Cell::decode(encoded_cell) else {
        return false;
    };
    match cell.dead_since() {
        Some(since) => {
            let grace = gc_grace.get(&table_id);
            now_seconds as i64 >= since as i64 + grace as i64
        }
        None => false,
    }
}

/// Per-table gc_grace_seconds, readable from compaction threads.
#[derive(Default)]
pub(crate) struct GcGraceTable {
    seconds_by_table: parking_lot::RwLock<std::collections::HashMap<[u8; 16], i32>>,
}

/// Cassandra's default gc_grace_seconds (10 days), used for tables not yet registered.
pub const DEFAULT_GC_GRACE_SECONDS: i32 = 864_000;

impl GcGraceTable {
    pub(crate) fn get(&self, table_id: &[u8; 16]) -> i32 {
        self.seconds_by_table
            .read()
            .get(table_id)
            .copied()
            .unwrap_or(DEFAULT_GC_GRACE_SECONDS)
    }

    pub(crate) fn set(&self, table_id: [u8; 16], seconds: i32) {
        self.seconds_by_table.write().insert(table_id, seconds);
    }
}
