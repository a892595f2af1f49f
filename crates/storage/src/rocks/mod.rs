//! The RocksDB [`Engine`]: what real nodes store their data in.
//!
//! - Cell writes are RocksDB *merge* operands; the associative merge operator keeps the
//!   last-write-wins winner, so writes never read (blind writes).
//! - A compaction filter (one per compaction, from [`PurgeFilterFactory`]) walks keys in
//!   order with a [`ShadowTracker`]: it drops cells shadowed by a deletion it has passed,
//!   and tombstones and expired cells past their table's `gc_grace_seconds` — except a
//!   deletion covering other keys, which it only reports to garbage collection
//!   ([`RocksEngine::collect_garbage`]) until that has cleared what it shadows.
//! - A fixed 24-byte prefix extractor (`table id | token`) feeds prefix bloom filters, so a
//!   partition read skips files that cannot hold its token. Scans that cross tokens use
//!   total-order seeks.
//! - The WAL is written on every batch but synced only by [`Engine::sync`] (called by the
//!   commit policy in [`crate::commit`]), never per request.
//! - Metadata lives in its own column family and is synced on every write.

pub(crate) mod compressibility;
mod cursor;
mod filter;
mod garbage;
mod ingest;
pub(crate) mod iterator_pool;
pub(crate) mod level0;
mod open;
mod pack;
mod staging;
mod writer;

use crate::shadow;
use crate::{Cursor, Engine, GarbageReport, Result, StorageError, TableRules, WriteBatch};
use cursor::DirectedCursor;
use filter::PurgeFilterFactory;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, MergeOperands, Options, ReadOptions,
    SliceTransform, DB,
};
use shoal_model::keys::{self, TOKEN_PREFIX_LENGTH};
use shoal_model::{fragment, Cell, CellKind, TableId};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
pub use writer::WriteDeferral;
use writer::{Operation, Writer};

const DATA_FAMILY: &str = "data";
/// Read-ahead of a streaming cursor: it reads its range once, sequentially, in reads of
/// this size. Not larger: streaming's threads run at the idle priority, but one inside a
/// system call is not preempted (`PREEMPT_NONE` kernels), and copying a read out of the
/// page cache takes the core for as long as the copy. Measured on a 2-core machine
/// (`bench/wakeup-latency`), a normal thread waking every millisecond beside an
/// idle-priority thread reading 4 MiB at a time woke 525 µs late at p99; beside one
/// reading 512 KiB at a time, 115 µs (and 55 µs beside a thread that only computes). The
/// kernel's own read-ahead keeps a cold range's disk reads sequential.
const STREAM_READAHEAD_BYTES: usize = 512 << 10;
const METADATA_FAMILY: &str = "metadata";
/// Metadata key of the storage format version ([`keys::STORAGE_FORMAT_VERSION`]).
const FORMAT_KEY: &[u8] = b"storage/format";

/// Files level 0 collects before they are compacted into the next level (see
/// [`RocksEngine::open`]).
const LEVEL0_FILES_BEFORE_COMPACTION: i32 = 16;
/// Level-0 files at which RocksDB slows writes down, and at which it stops them: as far
/// above the compaction trigger as RocksDB's defaults (20 and 36) are above its default
/// trigger of 4, so that batching compactions never stalls a write that its defaults
/// would not.
const LEVEL0_FILES_SLOWING_WRITES: i32 = LEVEL0_FILES_BEFORE_COMPACTION + 16;
const LEVEL0_FILES_STOPPING_WRITES: i32 = LEVEL0_FILES_BEFORE_COMPACTION + 32;

/// Tunables of the RocksDB engine (from the node's configuration).
#[derive(Debug, Clone)]
pub struct RocksOptions {
    /// Shared block cache for data blocks, in MiB.
    pub block_cache_mib: usize,
    /// Size of one memtable, in MiB.
    pub memtable_mib: usize,
    /// Background compaction and flush threads.
    pub background_jobs: i32,
}

impl Default for RocksOptions {
    fn default() -> Self {
        RocksOptions {
            block_cache_mib: 256,
            memtable_mib: 16,
            background_jobs: 2,
        }
    }
}

pub struct RocksEngine {
    /// Iterators partition reads reuse ([`iterator_pool`]); cleared before `db` closes.
    partition_iterators: iterator_pool::IteratorPool,
    /// The same for partition reads of memory only ([`Engine::scan_in_memory`]).
    partition_iterators_in_memory: iterator_pool::IteratorPool,
    db: Arc<DB>,
    /// The data column family's options, for files built to be ingested.
    data_options: Options,
    /// The same without compression, for ingested files not worth compressing.
    uncompressed_data_options: Options,
    /// Where files to ingest are built.
    ingest_dir: std::path::PathBuf,
    /// Names files to ingest uniquely.
    ingest_count: std::sync::atomic::AtomicU64,
    rules: Arc<TableRules>,
    /// Keys of expired covering deletions compaction met, for [`RocksEngine::collect_garbage`].
    garbage: Arc<Mutex<BTreeSet<Vec<u8>>>>,
    /// Every write to the data column family goes through it.
    writer: Arc<Writer>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
    /// Adds built files to the store at the node's normal priority ([`ingest`]).
    ingester: ingest::Ingester,
    /// When level 0 is compacted ([`level0`]), kept by [`Engine::adapt_compaction`].
    level0: Mutex<level0::Level0Policy>,
}

impl Drop for RocksEngine {
    fn drop(&mut self) {
        // Pooled iterators must not outlive the database they read.
        self.clear_pooled_iterators();
        self.ingester.stop();
        // The writer thread ends once it has applied what is queued.
        self.writer.close();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

/// Makes every write so far durable with a WAL sync of its own. A write with
/// `sync = true` would instead make RocksDB's whole write group wait for the fsync —
/// every client write that happened to join it — which cluster metadata (written on every
/// tablet-migration step) and range removals must not do to foreground traffic.
fn sync_wal(db: &DB) -> Result<()> {
    db.flush_wal(true).map_err(io_error)
}

/// Memtable entries counted per key range at most, for a scan's estimates
/// ([`RocksEngine::approximate_range_cells`]): more than a scan chunk asks of one tablet.
const MEMTABLE_ENTRIES_COUNTED: u64 = 4096;

/// Entries of the files read for their cells per entry when the memtables hold none of
/// the ranges estimated.
const FILE_ENTRIES_SAMPLED: u64 = 256;

/// Entries walked and the cells they hold ([`fragment::cells_held`]).
#[derive(Debug, Default, Clone, Copy)]
struct EntriesAndCells {
    entries: u64,
    cells: u64,
}

impl EntriesAndCells {
    fn plus(self, other: &EntriesAndCells) -> EntriesAndCells {
        EntriesAndCells {
            entries: self.entries + other.entries,
            cells: self.cells + other.cells,
        }
    }

    /// One when nothing was counted.
    fn cells_per_entry(&self) -> f64 {
        if self.entries == 0 {
            1.0
        } else {
            self.cells as f64 / self.entries as f64
        }
    }
}

/// Counts up to `most` entries from `lower` on, and the cells they hold.
fn count_cells(
    mut iterator: rocksdb::DBRawIterator<'_>,
    lower: &[u8],
    most: u64,
) -> EntriesAndCells {
    iterator.seek(lower);
    let mut counted = EntriesAndCells::default();
    while counted.entries < most {
        let Some(value) = iterator.value() else { break };
        counted.entries += 1;
        counted.cells += fragment::cells_held(value) as u64;
        iterator.next();
    }
    counted
}

/// Reads of the keys of `[lower, upper)`, across partitions (so not by prefix).
fn bounded_read_options(lower: &[u8], upper: &[u8]) -> ReadOptions {
    let mut read_options = ReadOptions::default();
    read_options.set_iterate_lower_bound(lower.to_vec());
    read_options.set_iterate_upper_bound(upper.to_vec());
    read_options.set_total_order_seek(true);
    read_options
}

/// Reads of the keys of `[lower, upper)` once, front to back, without filling the block
/// cache with them (the blocks foreground reads keep hot stay).
fn range_read_options(lower: &[u8], upper: &[u8]) -> ReadOptions {
    let mut read_options = bounded_read_options(lower, upper);
    read_options.fill_cache(false);
    read_options
}

/// The handle of column family `name` (every one is opened with the store).
fn column_family<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily> {
    db.cf_handle(name)
        .ok_or_else(|| StorageError::Corrupt(format!("missing {name} column family")))
}

fn io_error(error: rocksdb::Error) -> StorageError {
    match error.kind() {
        // A read of the memtables and the block cache only came to a block on disk.
        rocksdb::ErrorKind::Incomplete => StorageError::NotInMemory,
        _ => StorageError::Io(error.into_string()),
    }
}

fn merge_last_write_wins(
    key: &[u8],
    existing: Option<&[u8]>,
    operands: &MergeOperands,
) -> Option<Vec<u8>> {
    if pack::is_marker_key(key) {
        return Some(shoal_model::fragment::join_encoded(
            existing.into_iter().chain(operands.iter()),
        ));
    }
    let mut winner: Option<&[u8]> = existing;
    for operand in operands.iter() {
        winner = Some(match winner {
            Some(current) => Cell::reconcile_encoded(current, operand),
            None => operand,
        });
    }
    winner.map(<[u8]>::to_vec)
}

impl RocksEngine {
    /// The entries of `[lower, upper)` still in memtables and the cells they hold (a row
    /// fragment holds several), counted up to [`MEMTABLE_ENTRIES_COUNTED`] entries:
    /// RocksDB's size estimates cover files only, and a tablet written since the last
    /// flush would otherwise look empty. A memtable-only iterator touches no file, and the
    /// cap bounds the walk; a count at the cap only undercounts a tablet that already
    /// holds more than a scan chunk asks for.
    fn memtable_cells(
        &self,
        data: &rocksdb::ColumnFamily,
        lower: &[u8],
        upper: &[u8],
    ) -> EntriesAndCells {
        let mut read_options = range_read_options(lower, upper);
        read_options.set_read_tier(rocksdb::ReadTier::Memtable);
        count_cells(
            self.db.raw_iterator_cf_opt(data, read_options),
            lower,
            MEMTABLE_ENTRIES_COUNTED,
        )
    }

    /// A cursor over `[lower, upper)` of the data reading `tier`: a partition read (most
    /// often a point read) on a pooled iterator, anything wider on one of its own.
    fn cursor(
        &self,
        tier: iterator_pool::Tier,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + '_>> {
        let data = self.data()?;
        let within_one_token = lower.len() >= TOKEN_PREFIX_LENGTH
            && upper.len() >= TOKEN_PREFIX_LENGTH
            && lower[..TOKEN_PREFIX_LENGTH] == upper[..TOKEN_PREFIX_LENGTH];
        if within_one_token {
            let pool = match tier {
                iterator_pool::Tier::All => &self.partition_iterators,
                iterator_pool::Tier::Memory => &self.partition_iterators_in_memory,
            };
            let cursor = pool.cursor(&self.db, data, lower, upper, reverse)?;
            return Ok(Box::new(cursor));
        }
        let mut read_options = bounded_read_options(lower, upper);
        tier.apply(&mut read_options);
        let iterator = self.db.raw_iterator_cf_opt(data, read_options);
        Ok(Box::new(DirectedCursor::start(iterator, reverse)))
    }

    /// Drops every pooled iterator, and with them the memtables and files they keep.
    fn clear_pooled_iterators(&self) {
        self.partition_iterators.clear();
        self.partition_iterators_in_memory.clear();
    }

    fn data(&self) -> Result<&rocksdb::ColumnFamily> {
        column_family(&self.db, DATA_FAMILY)
    }

    /// [`Engine::adapt_compaction`] as if it were `now` (tests give the clock).
    pub(crate) fn adapt_compaction_at(&self, now: std::time::Instant) {
        let memtable_bytes = self.data_property("rocksdb.cur-size-active-mem-table");
        let mut policy = self.level0.lock();
        let Some(trigger) = policy.observe(now, memtable_bytes) else {
            return;
        };
        let Ok(data) = self.data() else { return };
        let trigger = trigger.to_string();
        if let Err(error) = self
            .db
            .set_options_cf(data, &[("level0_file_num_compaction_trigger", &trigger)])
        {
            tracing::warn!(%error, trigger, "cannot change the level-0 compaction trigger");
        }
    }

    /// True when column family `family` holds a key in `[lower, upper)`.
    fn holds_any(&self, family: &str, lower: &[u8], upper: &[u8]) -> Result<bool> {
        let mut iterator = self.db.raw_iterator_cf_opt(
            column_family(&self.db, family)?,
            range_read_options(lower, upper),
        );
        iterator.seek_to_first();
        iterator.status().map_err(io_error)?;
        Ok(iterator.valid())
    }

    /// The iterators partition reads reuse.
    #[cfg(test)]
    pub(crate) fn partition_iterators(&self) -> &iterator_pool::IteratorPool {
        &self.partition_iterators
    }

    /// The data column family's files at `level`.
    #[cfg(test)]
    pub(crate) fn files_at_level(&self, level: usize) -> u64 {
        self.data_property(&format!("rocksdb.num-files-at-level{level}"))
    }

    /// An integer property of the data column family; 0 when RocksDB does not give it.
    fn data_property(&self, name: &str) -> u64 {
        let Ok(data) = self.data() else { return 0 };
        self.db
            .property_int_value_cf(data, name)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    fn metadata(&self) -> Result<&rocksdb::ColumnFamily> {
        column_family(&self.db, METADATA_FAMILY)
    }

    /// Compacts the keys of `[lower, upper)` (and whatever files they share).
    pub fn compact_range(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        self.db
            .compact_range_cf(self.data()?, Some(lower), Some(upper));
        Ok(())
    }
}

impl Engine for RocksEngine {
    fn write(&self, batch: &WriteBatch) -> Result<()> {
        futures::executor::block_on(
            self.writer
                .submit_now(Operation::Cells(batch.entries().to_vec())),
        )
    }

    fn write_async(&self, batch: WriteBatch) -> BoxFuture<'static, Result<()>> {
        self.writer.submit(Operation::Cells(batch.into_entries()))
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        self.cursor(iterator_pool::Tier::All, lower, upper, reverse)
    }

    fn scan_in_memory<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        self.cursor(iterator_pool::Tier::Memory, lower, upper, reverse)
    }

    fn stream_range<'a>(&'a self, lower: &[u8], upper: &[u8]) -> Result<Box<dyn Cursor + 'a>> {
        let data = self.data()?;
        // Streaming reads a range once, front to back: large sequential reads.
        let mut read_options = range_read_options(lower, upper);
        read_options.set_readahead_size(STREAM_READAHEAD_BYTES);
        let iterator = self.db.raw_iterator_cf_opt(data, read_options);
        Ok(Box::new(DirectedCursor::start(iterator, false)))
    }

    fn streamed_file(&self) -> Box<dyn crate::StreamedFile + '_> {
        let number = self
            .ingest_count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::new(ingest::FileBuilder::new(
            self,
            self.ingest_dir.join(format!("stream-{number}.sst")),
        ))
    }

    fn delete_range(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        // Nothing stored there, staged or not (a node about to receive a tablet it never
        // held): no range tombstone. One would overlap every file ingested into the range
        // afterwards and keep them all in level 0, where they pile up and stall writes
        // until compacted.
        if !self.holds_any(DATA_FAMILY, lower, upper)?
            && !self.holds_any(staging::STAGED_FAMILY, lower, upper)?
        {
            return Ok(());
        }
        futures::executor::block_on(self.writer.submit_now(Operation::DeleteRange {
            lower: lower.to_vec(),
            upper: upper.to_vec(),
        }))
    }

    fn stage_writes(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        self.writer.stage(lower, upper)
    }

    fn release_staged_writes(&self, lower: &[u8], upper: &[u8]) -> Result<usize> {
        self.writer.release(lower, upper)
    }

    fn sync(&self) -> Result<()> {
        sync_wal(&self.db)
    }

    fn flush(&self) -> Result<()> {
        self.db.flush_cf(self.data()?).map_err(io_error)?;
        // Pooled iterators would keep the flushed memtable alive until their next use.
        self.clear_pooled_iterators();
        Ok(())
    }

    fn compact_all(&self) -> Result<()> {
        self.compact_in_passes()?;
        // ... and the compacted-away files, whose space an operator compacts to get back.
        self.clear_pooled_iterators();
        Ok(())
    }

    fn put_metadata(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.db
            .put_cf(self.metadata()?, key, value)
            .map_err(io_error)?;
        sync_wal(&self.db)
    }

    fn put_metadata_all(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let metadata = self.metadata()?;
        let mut batch = rocksdb::WriteBatch::default();
        for (key, value) in entries {
            batch.put_cf(metadata, key, value);
        }
        self.db.write(batch).map_err(io_error)?;
        sync_wal(&self.db)
    }

    fn delete_metadata_all(&self, keys: &[Vec<u8>]) -> Result<()> {
        let metadata = self.metadata()?;
        let mut batch = rocksdb::WriteBatch::default();
        for key in keys {
            batch.delete_cf(metadata, key);
        }
        self.db.write(batch).map_err(io_error)?;
        sync_wal(&self.db)
    }

    fn delete_metadata(&self, key: &[u8]) -> Result<()> {
        self.db.delete_cf(self.metadata()?, key).map_err(io_error)?;
        sync_wal(&self.db)
    }

    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut iterator = self.db.raw_iterator_cf(self.metadata()?);
        iterator.seek(prefix);
        let mut entries = Vec::new();
        while iterator.valid() {
            let (Some(key), Some(value)) = (iterator.key(), iterator.value()) else {
                break;
            };
            if !key.starts_with(prefix) {
                break;
            }
            entries.push((key.to_vec(), value.to_vec()));
            iterator.next();
        }
        iterator.status().map_err(io_error)?;
        Ok(entries)
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
        let candidates = std::mem::take(&mut *self.garbage.lock());
        let now_seconds = shoal_model::timestamp::now_seconds();
        let mut report = GarbageReport::default();
        for key in candidates {
            if let Some(tombstoned) = self.clear_shadow(&key, now_seconds)? {
                report.deletions_cleared += 1;
                report.cells_tombstoned += tombstoned;
            }
        }
        Ok(report)
    }

    fn approximate_range_bytes(&self, lower: &[u8], upper: &[u8]) -> Option<u64> {
        let data = self.data().ok()?;
        let range = rocksdb::Range::new(lower, upper);
        let on_disk = self.db.get_approximate_sizes_cf(data, &[range]);
        on_disk.first().copied()
    }

    /// Each range's bytes in SST files times the column family's entries per byte
    /// (RocksDB's estimated key count over its SST and memtable bytes), plus the range's
    /// cells still in memtables ([`RocksEngine::memtable_cells`], which RocksDB's size
    /// estimates do not cover).
    fn approximate_range_cells(&self, ranges: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u64>> {
        let data = self.data().ok()?;
        let in_memory: Vec<EntriesAndCells> = ranges
            .iter()
            .map(|(lower, upper)| self.memtable_cells(data, lower, upper))
            .collect();
        let on_disk = self.data_property("rocksdb.total-sst-files-size");
        if on_disk == 0 {
            return Some(in_memory.iter().map(|counted| counted.cells).collect());
        }
        // Files are measured in entries; a row fragment is one entry holding a row's
        // cells. The memtables' cells per entry stand for the files' (the same table,
        // written the same way); with nothing in memory, the first entries of the files.
        let mut sample = in_memory
            .iter()
            .fold(EntriesAndCells::default(), |sum, counted| sum.plus(counted));
        if sample.entries == 0 {
            if let Some((lower, upper)) = ranges.first() {
                let iterator = self
                    .db
                    .raw_iterator_cf_opt(data, range_read_options(lower, upper));
                sample = count_cells(iterator, lower, FILE_ENTRIES_SAMPLED);
            }
        }
        let cells_per_entry = sample.cells_per_entry();
        let entries_per_byte = self.data_property("rocksdb.estimate-num-keys") as f64
            / (on_disk + self.data_property("rocksdb.cur-size-all-mem-tables")) as f64;
        let file_ranges: Vec<rocksdb::Range> = ranges
            .iter()
            .map(|(lower, upper)| rocksdb::Range::new(lower, upper))
            .collect();
        let bytes = self.db.get_approximate_sizes_cf(data, &file_ranges);
        Some(
            bytes
                .into_iter()
                .zip(in_memory)
                .map(|(bytes, in_memory)| {
                    (bytes as f64 * entries_per_byte * cells_per_entry).round() as u64
                        + in_memory.cells
                })
                .collect(),
        )
    }

    fn adapt_compaction(&self) {
        self.adapt_compaction_at(std::time::Instant::now());
    }

    fn release_idle_readers(&self) {
        let now = std::time::Instant::now();
        self.partition_iterators
            .drop_idle(now, iterator_pool::IDLE_LIMIT);
        self.partition_iterators_in_memory
            .drop_idle(now, iterator_pool::IDLE_LIMIT);
    }

    fn checkpoint(&self, directory: &Path) -> Result<()> {
        // Unsynced WAL entries would be copied too, but flushing first makes the copy
        // self-contained in SST files.
        self.db.flush_cf(self.data()?).map_err(io_error)?;
        let checkpoint = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(io_error)?;
        checkpoint.create_checkpoint(directory).map_err(io_error)
    }

    fn statistics(&self) -> Vec<crate::EngineStatistic> {
        // (RocksDB property, metric name, help)
        const PROPERTIES: [(&str, &str, &str); 9] = [
            (
                "rocksdb.estimate-live-data-size",
                "storage_live_data_bytes",
                "Bytes of live data on disk (estimate).",
            ),
            (
                "rocksdb.total-sst-files-size",
                "storage_sst_files_bytes",
                "Bytes of all SST files, obsolete versions included.",
            ),
            (
                "rocksdb.cur-size-all-mem-tables",
                "storage_memtable_bytes",
                "Bytes held in memtables.",
            ),
            (
                "rocksdb.num-running-compactions",
                "storage_running_compactions",
                "Compactions running now.",
            ),
            (
                "rocksdb.num-running-flushes",
                "storage_running_flushes",
                "Memtable flushes running now.",
            ),
            (
                "rocksdb.estimate-pending-compaction-bytes",
                "storage_pending_compaction_bytes",
                "Bytes compaction still has to rewrite (estimate).",
            ),
            (
                "rocksdb.num-files-at-level0",
                "storage_level0_files",
                "SST files in level 0 (reads check each).",
            ),
            (
                "rocksdb.estimate-num-keys",
                "storage_keys",
                "Keys stored (estimate; every cell is one key).",
            ),
            (
                "rocksdb.actual-delayed-write-rate",
                "storage_delayed_write_rate_bytes",
                "Write rate RocksDB is throttling to (0: not throttling).",
            ),
        ];
        let Ok(data) = self.data() else {
            return Vec::new();
        };
        PROPERTIES
            .iter()
            .filter_map(|(property, name, help)| {
                let value = self.db.property_int_value_cf(data, *property).ok()??;
                Some(crate::EngineStatistic { name, help, value })
            })
            .collect()
    }

    fn approximate_size_bytes(&self) -> u64 {
        self.data_property("rocksdb.estimate-live-data-size")
            + self.data_property("rocksdb.cur-size-all-mem-tables")
    }
}
