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
//! - [`shadow`] is the one rule for which stored cells are dead for good — shadowed by a
//!   deletion or past their grace period — shared by compaction, garbage collection,
//!   replica reads and digests. A deletion is never dropped while a cell it shadows may
//!   still exist: that is what keeps deleted data deleted.
//! - Durability policy (periodic sync or epoch group commit) is the server's: it calls
//!   [`Engine::sync`] and decides when a write may be acknowledged.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod in_memory;
pub mod memory;
pub mod read_view;
pub mod reader;
pub mod rocks;
pub mod shadow;

#[cfg(test)]
mod tests;

pub use in_memory::InMemory;
pub use memory::{MemoryEngine, SnapshotCursor};
pub use read_view::ReadView;
pub use rocks::{RocksEngine, RocksOptions, WriteDeferral};

/// What can go wrong below the storage boundary.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O error: {0}")]
    Io(String),
    #[error("corrupt data in storage: {0}")]
    Corrupt(String),
    /// The data directory was written by a Shoal with another storage format.
    #[error("unsupported storage format: {0}")]
    UnsupportedFormat(String),
    /// A WAL sync failed: the node stops acknowledging writes (see fsyncgate).
    #[error("storage is poisoned after a failed sync and accepts no more writes: {0}")]
    Poisoned(String),
    /// A read of memory only ([`Engine::scan_in_memory`]) came to data that is on disk.
    #[error("the read needs data that is not in memory")]
    NotInMemory,
}

pub type Result<T> = std::result::Result<T, StorageError>;

use shoal_model::{TableId, WriteTimestamp};

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

/// Streamed entries on their way into the store as one file ([`Engine::streamed_file`]).
/// Dropped before [`StreamedFile::finish`], it adds nothing and leaves nothing behind.
pub trait StreamedFile {
    /// Adds `entries`: `(key, stored value)` in strictly increasing key order, every key
    /// greater than those of earlier batches.
    fn add(&mut self, entries: &[(&[u8], &[u8])]) -> Result<()>;
    /// Adds the file to the store, each entry merged with what its key holds by
    /// last-write-wins (as [`Engine::ingest`]); durable on return.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// [`Engine::streamed_file`] of an engine without files: a write batch, written and
/// synced at the end.
struct CollectedBatch<'a, E: Engine + ?Sized> {
    engine: &'a E,
    batch: WriteBatch,
}

impl<E: Engine + ?Sized> StreamedFile for CollectedBatch<'_, E> {
    fn add(&mut self, entries: &[(&[u8], &[u8])]) -> Result<()> {
        for (key, value) in entries {
            self.batch.merge(key.to_vec(), value.to_vec());
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.engine.write(&self.batch)?;
        self.engine.sync()
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
    /// last-write-wins. Blocks the calling thread until applied: async callers use
    /// [`Engine::write_async`].
    fn write(&self, batch: &WriteBatch) -> Result<()>;

    /// Applies `batch` like [`Engine::write`] without blocking the caller's thread: the
    /// future resolves once the batch is applied. Engines that write in place resolve at
    /// once.
    fn write_async(&self, batch: WriteBatch) -> futures::future::BoxFuture<'static, Result<()>> {
        let result = self.write(&batch);
        Box::pin(async move { result })
    }

    /// A cursor over keys in `[lower, upper)`, ascending or (if `reverse`) descending.
    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>>;

    /// A cursor like [`Engine::scan`] that reads only what the engine holds in memory
    /// and never waits for a disk: when the next entry is in a file block not cached, the
    /// cursor stops there and its status is [`StorageError::NotInMemory`]. A read that
    /// must not block its thread (a point read on a runtime worker) tries this first and
    /// reads again where it may wait ([`InMemory`]). Engines that hold everything in
    /// memory read as [`Engine::scan`] does (the default).
    fn scan_in_memory<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        self.scan(lower, upper, reverse)
    }

    /// A forward cursor over `[lower, upper)` for streaming a range to another node: one
    /// consistent view of the range, read sequentially, without filling the block cache
    /// that foreground reads rely on.
    fn stream_range<'a>(&'a self, lower: &[u8], upper: &[u8]) -> Result<Box<dyn Cursor + 'a>> {
        self.scan(lower, upper, false)
    }

    /// Adds `entries` — `(key, stored value)`, in strictly increasing key order, as
    /// another node's [`Engine::stream_range`] returned them — merging each with what the
    /// key holds by last-write-wins, like [`Engine::write`], but as a whole file that
    /// bypasses the memtable and the write-ahead log where the engine can. Durable on
    /// return. The same as one [`Engine::streamed_file`] given all of them.
    fn ingest(&self, entries: &[(&[u8], &[u8])]) -> Result<()> {
        let mut file = self.streamed_file();
        file.add(entries)?;
        file.finish()
    }

    /// A file to build of streamed entries, given a batch at a time as they arrive (see
    /// [`StreamedFile`]), so that a receiving node holds a batch, not a whole file, in
    /// memory. Engines without files collect the entries and write them at the end (the
    /// default).
    fn streamed_file(&self) -> Box<dyn StreamedFile + '_> {
        Box::new(CollectedBatch {
            engine: self,
            batch: WriteBatch::new(),
        })
    }

    /// Removes every key in `[lower, upper)` (TRUNCATE, DROP TABLE).
    fn delete_range(&self, lower: &[u8], upper: &[u8]) -> Result<()>;

    /// Sets the writes to `[lower, upper)` aside from now on, until
    /// [`Engine::release_staged_writes`]: a range this node is about to receive by
    /// [`Engine::ingest`], so that its writes meanwhile do not stand in the way of the
    /// files (see the RocksDB engine's `staging`). Reads do not see the writes set aside
    /// until they are released; nobody reads a range that is still being received. Drops
    /// whatever an earlier staging of the range left. Engines without files keep writing
    /// as usual (the default).
    fn stage_writes(&self, _lower: &[u8], _upper: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Ends [`Engine::stage_writes`] for `[lower, upper)` and every staged range it
    /// overlaps, adding the writes set aside to the data; answers how many stored entries
    /// it added.
    fn release_staged_writes(&self, _lower: &[u8], _upper: &[u8]) -> Result<usize> {
        Ok(0)
    }

    /// Makes every write that has returned so far durable.
    fn sync(&self) -> Result<()>;

    /// Writes memtables out to files (`shoal admin flush`).
    fn flush(&self) -> Result<()>;

    /// Compacts everything now and collects garbage in between, so that everything
    /// purgeable at this moment is gone afterwards (`shoal admin compact`, tests).
    fn compact_all(&self) -> Result<()>;

    /// Node metadata (schema, identity): a separate key space, durable on return.
    fn put_metadata(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Several metadata entries, durable on return. An engine that can write them at once
    /// syncs once for all: a node joining a cluster receives the metadata log's hundreds
    /// of entries in one append, and a sync each took it tens of milliseconds.
    fn put_metadata_all(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (key, value) in entries {
            self.put_metadata(key, value)?;
        }
        Ok(())
    }
    fn delete_metadata(&self, key: &[u8]) -> Result<()>;
    /// Several metadata entries deleted, durably on return; synced once where the engine
    /// can ([`Engine::put_metadata_all`]).
    fn delete_metadata_all(&self, keys: &[Vec<u8>]) -> Result<()> {
        for key in keys {
            self.delete_metadata(key)?;
        }
        Ok(())
    }
    /// Every metadata entry whose key starts with `prefix`, in key order.
    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Tells compaction how long deletions of `table_id` must be kept before they may be
    /// purged (the table's `gc_grace_seconds`). Until this is called for a table, nothing
    /// of it is purged.
    fn set_gc_grace_seconds(&self, table_id: TableId, seconds: i32);

    /// The grace period registered for `table_id`, if any.
    fn gc_grace_seconds(&self, table_id: &TableId) -> Option<i32>;

    /// Hides every cell of `table_id` written at or before `at`, as if every partition of
    /// the table had a partition deletion at `at` (TRUNCATE; DROP TABLE at the end of
    /// time): reads skip those cells, compaction drops them, and cells arriving late (a
    /// hint, a slow replica, repair from a replica that missed the truncation) stay dead.
    /// Engines that hold no data of their own ignore it.
    fn set_truncated_at(&self, _table_id: TableId, _at: WriteTimestamp) {}

    /// The truncation registered for `table_id`, if any.
    fn truncated_at(&self, _table_id: &TableId) -> Option<WriteTimestamp> {
        None
    }

    /// Lets compaction drop deletions that cover other keys once their grace period is
    /// over: every cell such a deletion still shadows gets a tombstone of its own, and the
    /// deletion is marked (see [`shadow`]). Call it regularly; it does work proportional
    /// to the deletions that compaction found expired.
    fn collect_garbage(&self) -> Result<GarbageReport>;

    /// Approximate bytes stored, for `nodetool status`-style load reports.
    fn approximate_size_bytes(&self) -> u64;

    /// Approximate bytes stored for keys in `[lower, upper)` (a table's size), if the
    /// engine can tell.
    fn approximate_range_bytes(&self, _lower: &[u8], _upper: &[u8]) -> Option<u64> {
        None
    }

    /// Approximate number of cells stored in each of `ranges` (`[lower, upper)` each; a
    /// row fragment counts the cells it holds), if the engine can tell: what a replica
    /// tells coordinators of the tablets it holds, so that a scan asks for as many at
    /// once as its LIMIT needs.
    fn approximate_range_cells(&self, _ranges: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u64>> {
        None
    }

    /// Fits compaction to the recent write load; the node calls it about once a second.
    /// The RocksDB engine compacts level 0 late while writes are heavy and at once when
    /// they go quiet, so reads stop paying for the files flushes left (see
    /// `rocks::level0`). Does nothing by default.
    fn adapt_compaction(&self) {}

    /// Releases what reads keep for reuse once it has gone unused for a while; the node
    /// calls it about once a second. The RocksDB engine drops idle pooled iterators, which
    /// keep flushed memtables and compacted-away files alive (see `rocks::iterator_pool`).
    /// Does nothing by default.
    fn release_idle_readers(&self) {}

    /// Writes a consistent copy of everything stored (data and metadata) into
    /// `directory`, which must not exist: hard links to the immutable files where the
    /// file system allows, so a snapshot is cheap and takes little space at first.
    fn checkpoint(&self, _directory: &std::path::Path) -> Result<()> {
        Err(StorageError::Io(
            "this engine keeps nothing on disk to snapshot".into(),
        ))
    }

    /// The engine's own figures (compactions, flushes, memtables, files), as
    /// levels (gauges) for the metrics endpoint.
    fn statistics(&self) -> Vec<EngineStatistic> {
        Vec::new()
    }
}

/// One figure the engine reports about itself ([`Engine::statistics`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStatistic {
    /// A metric name, without the `shoal_` prefix: `storage_live_data_bytes`.
    pub name: &'static str,
    pub help: &'static str,
    /// A level (it goes up and down), not a running total.
    pub value: u64,
}

/// What one garbage collection pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GarbageReport {
    /// Covering deletions whose shadowed cells were cleared (compaction may now drop them).
    pub deletions_cleared: u64,
    /// Cells that were still shadowed by them and got a tombstone of their own.
    pub cells_tombstoned: u64,
}

/// Per-table rules storage applies, readable from compaction threads: gc_grace_seconds
/// (a table not registered here — not yet in the installed schema, or internal — is never
/// purged) and truncations ([`Engine::set_truncated_at`]).
#[derive(Default)]
pub(crate) struct TableRules {
    seconds_by_table: parking_lot::RwLock<std::collections::HashMap<TableId, i32>>,
    truncated: parking_lot::RwLock<std::collections::HashMap<TableId, WriteTimestamp>>,
}

/// Cassandra's default gc_grace_seconds (10 days).
pub const DEFAULT_GC_GRACE_SECONDS: i32 = 864_000;

impl TableRules {
    pub(crate) fn get(&self, table_id: &TableId) -> Option<i32> {
        self.seconds_by_table.read().get(table_id).copied()
    }

    pub(crate) fn set(&self, table_id: TableId, seconds: i32) {
        self.seconds_by_table.write().insert(table_id, seconds);
    }

    pub(crate) fn truncated_at(&self, table_id: &TableId) -> Option<WriteTimestamp> {
        let truncated = self.truncated.read();
        if truncated.is_empty() {
            return None;
        }
        truncated.get(table_id).copied()
    }

    /// Records a truncation; a later one replaces an earlier, never the reverse.
    pub(crate) fn set_truncated_at(&self, table_id: TableId, at: WriteTimestamp) {
        let mut truncated = self.truncated.write();
        let entry = truncated.entry(table_id).or_insert(at);
        *entry = (*entry).max(at);
    }
}
