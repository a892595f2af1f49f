//! The RocksDB [`Engine`]: what real nodes store their data in.
//!
//! - Cell writes are RocksDB *merge* operands; the associative merge operator keeps the
//!   last-write-wins winner, so writes never read (blind writes).
//! - A compaction filter drops deletions and expired cells older than their table's
//!   `gc_grace_seconds`.
//! - A fixed 24-byte prefix extractor (`table id | token`) feeds prefix bloom filters, so a
//!   partition read skips files that cannot hold its token. Scans that cross tokens use
//!   total-order seeks.
//! - The WAL is written on every batch but synced only by [`Engine::sync`] (called by the
//!   commit policy in [`crate::commit`]), never per request.
//! - Metadata lives in its own column family and is synced on every write.

use crate::{Cursor, Engine, GcGraceTable, Result, StorageError, WriteBatch};
use rocksdb::compaction_filter::Decision;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBRawIteratorWithThreadMode, MergeOperands,
    Options, ReadOptions, SliceTransform, WriteOptions, DB,
};
use shoal_model::keys::TOKEN_PREFIX_LENGTH;
use shoal_model::Cell;
use std::path::Path;
use std::sync::Arc;

const DATA_FAMILY: &str = "data";
const METADATA_FAMILY: &str = "metadata";

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
            memtable_mib: 64,
            background_jobs: 2,
        }
    }
}

pub struct RocksEngine {
    db: DB,
    gc_grace: Arc<GcGraceTable>,
}

fn io_error(error: rocksdb::Error) -> StorageError {
    StorageError::Io(error.into_string())
}

fn merge_last_write_wins(
    _key: &[u8],
    existing: Option<&[u8]>,
    operands: &MergeOperands,
) -> Option<Vec<u8>> {
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
    pub fn open(path: &Path, options: &RocksOptions) -> Result<RocksEngine> {
        let gc_grace = Arc::new(GcGraceTable::default());

        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        db_options.set_max_background_jobs(options.background_jobs);
        db_options.set_bytes_per_sync(1 << 20);

        let cache = Cache::new_lru_cache(options.block_cache_mib << 20);
        let mut table_options = BlockBasedOptions::default();
        table_options.set_block_cache(&cache);
        table_options.set_bloom_filter(10.0, false);
        table_options.set_whole_key_filtering(false);
        table_options.set_cache_index_and_filter_blocks(true);
        table_options.set_pin_l0_filter_and_index_blocks_in_cache(true);

        let mut data_options = Options::default();
        data_options.set_block_based_table_factory(&table_options);
        data_options.set_prefix_extractor(SliceTransform::create_fixed_prefix(TOKEN_PREFIX_LENGTH));
        data_options.set_memtable_prefix_bloom_ratio(0.1);
        data_options.set_write_buffer_size(options.memtable_mib << 20);
        data_options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        data_options.set_merge_operator_associative("shoal_last_write_wins", merge_last_write_wins);
        // A hot key updated again and again would pile up merge operands in the memtable,
        // and every read would merge them all; past a few, the write merges them instead.
        data_options.set_max_successive_merges(8);
        let filter_grace = Arc::clone(&gc_grace);
        data_options.set_compaction_filter("shoal_purge", move |_level, key, value| {
            if crate::purgeable(
                key,
                value,
                &filter_grace,
                shoal_model::timestamp::now_seconds(),
            ) {
                Decision::Remove
            } else {
                Decision::Keep
            }
        });

        let metadata_options = Options::default();
        let families = vec![
            ColumnFamilyDescriptor::new(DATA_FAMILY, data_options),
            ColumnFamilyDescriptor::new(METADATA_FAMILY, metadata_options),
        ];
        let db = DB::open_cf_descriptors(&db_options, path, families).map_err(io_error)?;
        Ok(RocksEngine { db, gc_grace })
    }

    fn data(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(DATA_FAMILY)
            .ok_or_else(|| StorageError::Corrupt("missing data column family".into()))
    }

    fn metadata(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db
            .cf_handle(METADATA_FAMILY)
            .ok_or_else(|| StorageError::Corrupt("missing metadata column family".into()))
    }

    /// Compacts everything now (tests and `shoal admin compact`).
    ///
    /// Two passes: RocksDB hands the compaction filter only full values, and a cell that was
    /// only ever written as merge operands becomes a full value in the compaction that
    /// merges it; the next one may then purge it. Background compactions get there over
    /// time the same way.
    pub fn compact_all(&self) -> Result<()> {
        let data = self.data()?;
        for _ in 0..2 {
            self.db.compact_range_cf(data, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}

struct RocksCursor<'a> {
    iterator: DBRawIteratorWithThreadMode<'a, DB>,
    reverse: bool,
}

impl Cursor for RocksCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        if self.iterator.valid() {
            Some((self.iterator.key()?, self.iterator.value()?))
        } else {
            None
        }
    }

    fn advance(&mut self) {
        if self.reverse {
            self.iterator.prev();
        } else {
            self.iterator.next();
        }
    }

    fn skip_to(&mut self, key: &[u8]) {
        if self.reverse {
            // Last key < `key`: seek_for_prev finds the last key <= key.
            self.iterator.seek_for_prev(key);
            if self.iterator.valid() && self.iterator.key() == Some(key) {
                self.iterator.prev();
            }
        } else {
            self.iterator.seek(key);
        }
    }

    fn status(&self) -> Result<()> {
        self.iterator.status().map_err(io_error)
    }
}

impl Engine for RocksEngine {
    fn write(&self, batch: &WriteBatch) -> Result<()> {
        let data = self.data()?;
        let mut rocks_batch = rocksdb::WriteBatch::default();
        for (key, cell) in batch.entries() {
            rocks_batch.merge_cf(data, key, cell);
        }
        let mut write_options = WriteOptions::default();
        write_options.set_sync(false);
        self.db
            .write_opt(rocks_batch, &write_options)
            .map_err(io_error)
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        let data = self.data()?;
        let mut read_options = ReadOptions::default();
        read_options.set_iterate_lower_bound(lower.to_vec());
        read_options.set_iterate_upper_bound(upper.to_vec());
        let within_one_token = lower.len() >= TOKEN_PREFIX_LENGTH
            && upper.len() >= TOKEN_PREFIX_LENGTH
            && lower[..TOKEN_PREFIX_LENGTH] == upper[..TOKEN_PREFIX_LENGTH];
        if within_one_token {
            read_options.set_prefix_same_as_start(true);
        } else {
            read_options.set_total_order_seek(true);
        }
        let mut iterator = self.db.raw_iterator_cf_opt(data, read_options);
        if reverse {
            iterator.seek_to_last();
        } else {
            iterator.seek_to_first();
        }
        Ok(Box::new(RocksCursor { iterator, reverse }))
    }

    fn delete_range(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        let data = self.data()?;
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(data, lower, upper);
        let mut write_options = WriteOptions::default();
        write_options.set_sync(true);
        self.db.write_opt(batch, &write_options).map_err(io_error)
    }

    fn sync(&self) -> Result<()> {
        self.db.flush_wal(true).map_err(io_error)
    }

    fn put_metadata(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut write_options = WriteOptions::default();
        write_options.set_sync(true);
        self.db
            .put_cf_opt(self.metadata()?, key, value, &write_options)
            .map_err(io_error)
    }

    fn delete_metadata(&self, key: &[u8]) -> Result<()> {
        let mut write_options = WriteOptions::default();
        write_options.set_sync(true);
        self.db
            .delete_cf_opt(self.metadata()?, key, &write_options)
            .map_err(io_error)
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

    fn set_gc_grace_seconds(&self, table_id: [u8; 16], seconds: i32) {
        self.gc_grace.set(table_id, seconds);
    }

    fn approximate_size_bytes(&self) -> u64 {
        let Ok(data) = self.data() else { return 0 };
        let live = self
            .db
            .property_int_value_cf(data, "rocksdb.estimate-live-data-size")
            .ok()
            .flatten()
            .unwrap_or(0);
        let memtables = self
            .db
            .property_int_value_cf(data, "rocksdb.cur-size-all-mem-tables")
            .ok()
            .flatten()
            .unwrap_or(0);
        live + memtables
    }
}
