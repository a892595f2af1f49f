//! Opening the engine: the column families and their options (block cache, bloom and
//! prefix filters, memtable, compression per level, level 0's thresholds, the merge
//! operator and the compaction filter), the writer, and the check of the on-disk format.

use super::*;

impl RocksEngine {
    pub fn open(path: &Path, options: &RocksOptions) -> Result<RocksEngine> {
        let rules = Arc::new(TableRules::default());

        let mut db_options = Options::default();
        db_options.create_if_missing(true);
        db_options.create_missing_column_families(true);
        db_options.set_max_background_jobs(options.background_jobs);
        db_options.set_bytes_per_sync(1 << 20);

        // HyperClockCache: lookups without a shard mutex (an LRU cache locks one on every
        // block a read touches). An estimated entry charge of 0 sizes its table as it fills.
        let cache = Cache::new_hyper_clock_cache(options.block_cache_mib << 20, 0);
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
        // Files of the first two levels are rewritten within seconds under load: compressing
        // them costs CPU on every flush and early compaction for little space.
        data_options.set_compression_per_level(&[
            rocksdb::DBCompressionType::None,
            rocksdb::DBCompressionType::None,
            rocksdb::DBCompressionType::Lz4,
            rocksdb::DBCompressionType::Lz4,
            rocksdb::DBCompressionType::Lz4,
            rocksdb::DBCompressionType::Lz4,
            rocksdb::DBCompressionType::Lz4,
        ]);
        // Level 0 is compacted into the next level once it holds 16 files (RocksDB's
        // default is 4). Under writes to keys spread over the whole table, every such
        // compaction rewrites the files of that level the flushed keys fall in — nearly all
        // of it — so compacting four times as much at a time quarters that rewriting.
        // Measured with `bench/write-path --skip-cassandra` (1M keys, the same binary with
        // and without, 3 rounds): at 8 files 19% less server CPU per write than at 4 and 9%
        // more writes/s (`bench/results/2026-11-27-write-path`). With `bench/thread-cpu`,
        // 16 files against 8 alternating on one machine: compaction 4.4-5.0 µs of CPU per
        // write against 6.4-8.5, the whole node 22.1-22.9 against 23.8-27.6
        // (`bench/results/2026-11-28-write-path-level0-16`). Point reads check the extra
        // files' prefix filters, which stay in the cache
        // (`set_pin_l0_filter_and_index_blocks_in_cache`). This is the trigger while writes
        // are heavy; once they go quiet, `level0` lowers it so that no file stays in level
        // 0 for reads to pay for.
        data_options.set_level_zero_file_num_compaction_trigger(LEVEL0_FILES_BEFORE_COMPACTION);
        data_options.set_level_zero_slowdown_writes_trigger(LEVEL0_FILES_SLOWING_WRITES);
        data_options.set_level_zero_stop_writes_trigger(LEVEL0_FILES_STOPPING_WRITES);
        data_options.set_merge_operator_associative("shoal_last_write_wins", merge_last_write_wins);
        // Hot keys' operands are collapsed by the writer (see `writer`), not by
        // `max_successive_merges`, which searches the memtable on every write.
        let garbage = Arc::new(Mutex::new(BTreeSet::new()));
        data_options.set_compaction_filter_factory(PurgeFilterFactory {
            rules: Arc::clone(&rules),
            garbage: Arc::clone(&garbage),
        });

        let metadata_options = Options::default();
        // Writes staged while a tablet streams in (`staging`): cells like the data's, few.
        let mut staged_options = Options::default();
        staged_options
            .set_merge_operator_associative("shoal_last_write_wins", merge_last_write_wins);
        let families = vec![
            ColumnFamilyDescriptor::new(DATA_FAMILY, data_options.clone()),
            ColumnFamilyDescriptor::new(METADATA_FAMILY, metadata_options),
            ColumnFamilyDescriptor::new(staging::STAGED_FAMILY, staged_options),
        ];
        let db = Arc::new(DB::open_cf_descriptors(&db_options, path, families).map_err(io_error)?);
        let recovered = staging::release_everything(
            &db,
            column_family(&db, staging::STAGED_FAMILY)?,
            column_family(&db, DATA_FAMILY)?,
        )?;
        if recovered > 0 {
            tracing::info!(
                entries = recovered,
                "moved the writes staged before a restart into the data"
            );
        }
        let writer = Writer::new(Arc::clone(&db), DATA_FAMILY);
        let writer_thread = std::thread::Builder::new()
            .name("shoal-writer".into())
            .spawn({
                let writer = Arc::clone(&writer);
                move || writer.run()
            })
            .map_err(|e| StorageError::Io(format!("cannot start the writer thread: {e}")))?;
        let ingester = ingest::Ingester::start(Arc::clone(&db), Arc::clone(&writer))?;
        let ingest_dir = path.join("ingest");
        // Files left by an ingestion a crash interrupted are of no use.
        let _ = std::fs::remove_dir_all(&ingest_dir);
        // Files of ingested entries that would not compress are built without (see
        // `compressibility`); `SstFileWriter` takes the last level's compression.
        let mut uncompressed_data_options = data_options.clone();
        uncompressed_data_options.set_compression_per_level(&[rocksdb::DBCompressionType::None]);
        uncompressed_data_options.set_compression_type(rocksdb::DBCompressionType::None);
        let engine = RocksEngine {
            partition_iterators: iterator_pool::IteratorPool::new(iterator_pool::Tier::All),
            partition_iterators_in_memory: iterator_pool::IteratorPool::new(
                iterator_pool::Tier::Memory,
            ),
            db,
            data_options,
            uncompressed_data_options,
            ingest_dir,
            ingest_count: std::sync::atomic::AtomicU64::new(0),
            rules,
            garbage,
            writer,
            writer_thread: Some(writer_thread),
            ingester,
            level0: Mutex::new(level0::Level0Policy::new(
                LEVEL0_FILES_BEFORE_COMPACTION,
                std::time::Instant::now(),
            )),
        };
        engine.check_format(path)?;
        Ok(engine)
    }

    /// Refuses data written in another storage format; records the format in a new store.
    pub(super) fn check_format(&self, path: &Path) -> Result<()> {
        let expected = keys::STORAGE_FORMAT_VERSION.to_be_bytes();
        let stored = self
            .db
            .get_cf(self.metadata()?, FORMAT_KEY)
            .map_err(io_error)?;
        match stored {
            Some(version) if version == expected => Ok(()),
            Some(version) => {
                let found = <[u8; 4]>::try_from(version.as_slice())
                    .map(|bytes| format!("format {}", u32::from_be_bytes(bytes)))
                    .unwrap_or_else(|_| format!("an unknown format ({} bytes)", version.len()));
                Err(StorageError::UnsupportedFormat(format!(
                    "{} holds data in storage {found}, but this Shoal reads format {}; start it with an empty data directory",
                    path.display(),
                    keys::STORAGE_FORMAT_VERSION
                )))
            }
            None => {
                let mut first = self.db.raw_iterator_cf(self.data()?);
                first.seek_to_first();
                if first.valid() {
                    return Err(StorageError::UnsupportedFormat(format!(
                        "{} holds data written by an older Shoal (before storage format {}); start it with an empty data directory",
                        path.display(),
                        keys::STORAGE_FORMAT_VERSION
                    )));
                }
                self.put_metadata(FORMAT_KEY, &expected)
            }
        }
    }
}
