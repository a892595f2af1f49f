//! One suite every [`Engine`] passes, run against [`MemoryEngine`] and [`RocksEngine`].

use crate::reader::{self, ClusteringSlice, Flow, PartitionHeader, Row, Visitor};
use crate::{Engine, MemoryEngine, RocksEngine, RocksOptions, WriteBatch};
use shoal_model::keys;
use shoal_model::{Cell, TableId, Token, WriteTimestamp};

const TABLE: TableId = TableId([3; 16]);
const NOW: i64 = 1_000_000;

fn with_each_engine(test: impl Fn(&dyn Engine)) {
    test(&MemoryEngine::new());
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine =
        RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open rocksdb");
    test(&engine);
}

fn row_key(partition: &[u8], clustering: &[u8], column: &str) -> Vec<u8> {
    let mut key = keys::partition_prefix(&TABLE, Token(1), partition);
    key.push(keys::SECTION_ROW);
    key.extend_from_slice(clustering);
    keys::push_column_part(&mut key, |k| keys::push_cell_column(k, column, b""));
    key
}

fn marker_key(partition: &[u8], clustering: &[u8]) -> Vec<u8> {
    let mut key = keys::partition_prefix(&TABLE, Token(1), partition);
    key.push(keys::SECTION_ROW);
    key.extend_from_slice(clustering);
    keys::push_column_part(&mut key, |k| k.push(keys::COLUMN_ROW_MARKER));
    key
}

/// Owned `(key, value)` entries as the borrowed pairs `Engine::ingest` takes.
pub(crate) fn borrowed(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<(&[u8], &[u8])> {
    entries
        .iter()
        .map(|(k, v)| (k.as_slice(), v.as_slice()))
        .collect()
}

fn write(engine: &dyn Engine, key: Vec<u8>, cell: Cell) {
    let mut batch = WriteBatch::new();
    batch.merge(key, cell.encode());
    engine.write(&batch).expect("write");
}

#[derive(Default)]
struct Collect {
    rows: Vec<(Vec<u8>, Row)>,
}

impl Visitor for Collect {
    fn partition(&mut self, _header: &PartitionHeader) -> Flow {
        Flow::Continue
    }
    fn row(&mut self, header: &PartitionHeader, row: Row) -> Flow {
        self.rows.push((header.key.clone(), row));
        Flow::Continue
    }
}

fn read(engine: &dyn Engine, partition: &[u8], now: i64) -> Vec<Row> {
    read_in_order(engine, partition, false, now)
}

/// Every row of `partition`, in clustering order or (if `reverse`) against it.
fn read_in_order(engine: &dyn Engine, partition: &[u8], reverse: bool, now: i64) -> Vec<Row> {
    let mut collect = Collect::default();
    reader::read_partition(
        engine,
        &TABLE,
        Token(1),
        partition,
        &[ClusteringSlice::all()],
        reverse,
        now,
        &mut collect,
    )
    .expect("read");
    collect.rows.into_iter().map(|(_, row)| row).collect()
}

fn value_of(row: &Row, column: &str) -> Option<Vec<u8>> {
    row.column(column).map(|c| c.cells[0].1.value.clone())
}

#[test]
fn last_write_wins_whatever_the_arrival_order() {
    with_each_engine(|engine| {
        let key = row_key(b"p", b"a", "v");
        write(
            engine,
            key.clone(),
            Cell::live(WriteTimestamp(20), b"new".to_vec()),
        );
        write(
            engine,
            key.clone(),
            Cell::live(WriteTimestamp(10), b"old".to_vec()),
        );
        let rows = read(engine, b"p", NOW);
        assert_eq!(value_of(&rows[0], "v"), Some(b"new".to_vec()));
    });
}

#[test]
fn partition_deletion_hides_older_cells_only() {
    with_each_engine(|engine| {
        write(
            engine,
            row_key(b"p", b"a", "v"),
            Cell::live(WriteTimestamp(10), b"1".to_vec()),
        );
        write(
            engine,
            row_key(b"p", b"b", "v"),
            Cell::live(WriteTimestamp(30), b"2".to_vec()),
        );
        let mut deletion = keys::partition_prefix(&TABLE, Token(1), b"p");
        deletion.push(keys::SECTION_PARTITION_DELETION);
        write(engine, deletion, Cell::tombstone(WriteTimestamp(20), NOW));
        let rows = read(engine, b"p", NOW);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].clustering, b"b".to_vec());
    });
}

#[test]
fn range_tombstones_and_row_deletions_apply() {
    with_each_engine(|engine| {
        for clustering in [&b"a"[..], b"b", b"c", b"d"] {
            write(
                engine,
                marker_key(b"p", clustering),
                Cell::live(WriteTimestamp(10), vec![]),
            );
        }
        let mut range = keys::partition_prefix(&TABLE, Token(1), b"p");
        keys::push_range_tombstone(&mut range, b"b", true, b"c", false);
        write(engine, range, Cell::tombstone(WriteTimestamp(11), NOW));
        let mut row_deletion = keys::partition_prefix(&TABLE, Token(1), b"p");
        row_deletion.push(keys::SECTION_ROW);
        row_deletion.extend_from_slice(b"d");
        keys::push_column_part(&mut row_deletion, |k| k.push(keys::COLUMN_ROW_DELETION));
        write(
            engine,
            row_deletion,
            Cell::tombstone(WriteTimestamp(11), NOW),
        );
        let clusterings: Vec<Vec<u8>> = read(engine, b"p", NOW)
            .into_iter()
            .map(|r| r.clustering)
            .collect();
        assert_eq!(clusterings, vec![b"a".to_vec(), b"c".to_vec()]);
    });
}

#[test]
fn expired_cells_vanish_and_purge_after_grace() {
    with_each_engine(|engine| {
        let key = row_key(b"p", b"a", "v");
        write(
            engine,
            key,
            Cell::with_ttl(WriteTimestamp(10), b"x".to_vec(), 5, NOW),
        );
        assert_eq!(read(engine, b"p", NOW + 4).len(), 1);
        assert!(read(engine, b"p", NOW + 5).is_empty());
    });
}

#[test]
fn slices_and_reverse_reads() {
    with_each_engine(|engine| {
        for clustering in [&b"a"[..], b"b", b"c", b"d"] {
            write(
                engine,
                row_key(b"p", clustering, "v"),
                Cell::live(WriteTimestamp(1), clustering.to_vec()),
            );
        }
        let mut collect = Collect::default();
        let slice = ClusteringSlice {
            lower: b"b".to_vec(),
            upper: Some(b"d".to_vec()),
        };
        reader::read_partition(
            engine,
            &TABLE,
            Token(1),
            b"p",
            &[slice],
            true,
            NOW,
            &mut collect,
        )
        .expect("read");
        let clusterings: Vec<Vec<u8>> = collect
            .rows
            .into_iter()
            .map(|(_, r)| r.clustering)
            .collect();
        assert_eq!(clusterings, vec![b"c".to_vec(), b"b".to_vec()]);
    });
}

#[test]
fn scans_walk_partitions_in_key_order_and_stop_on_request() {
    with_each_engine(|engine| {
        for partition in [&b"x"[..], b"y", b"z"] {
            for clustering in [&b"1"[..], b"2"] {
                write(
                    engine,
                    row_key(partition, clustering, "v"),
                    Cell::live(WriteTimestamp(1), vec![1]),
                );
            }
        }
        struct FirstRowOfEach(Vec<Vec<u8>>);
        impl Visitor for FirstRowOfEach {
            fn partition(&mut self, _: &PartitionHeader) -> Flow {
                Flow::Continue
            }
            fn row(&mut self, header: &PartitionHeader, _: Row) -> Flow {
                self.0.push(header.key.clone());
                if self.0.len() == 2 {
                    Flow::Stop
                } else {
                    Flow::NextPartition
                }
            }
        }
        let mut visitor = FirstRowOfEach(Vec::new());
        reader::scan_partitions(
            engine,
            &keys::table_prefix(&TABLE),
            &keys::table_end(&TABLE),
            NOW,
            &mut visitor,
        )
        .expect("scan");
        assert_eq!(visitor.0, vec![b"x".to_vec(), b"y".to_vec()]);

        engine
            .delete_range(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE))
            .expect("delete range");
        let mut collect = Collect::default();
        reader::scan_partitions(
            engine,
            &keys::table_prefix(&TABLE),
            &keys::table_end(&TABLE),
            NOW,
            &mut collect,
        )
        .expect("scan");
        assert!(collect.rows.is_empty());
    });
}

#[test]
fn metadata_is_kept_by_prefix() {
    with_each_engine(|engine| {
        engine.put_metadata(b"schema/a", b"1").expect("put");
        engine.put_metadata(b"schema/b", b"2").expect("put");
        engine.put_metadata(b"other", b"3").expect("put");
        engine.delete_metadata(b"schema/a").expect("delete");
        let entries = engine.metadata_with_prefix(b"schema/").expect("scan");
        assert_eq!(entries, vec![(b"schema/b".to_vec(), b"2".to_vec())]);
    });
}

#[test]
fn metadata_written_and_deleted_together_is_so_after_a_reopen() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let entries: Vec<(Vec<u8>, Vec<u8>)> = (0u32..300)
        .map(|i| (format!("log/{i:05}").into_bytes(), i.to_be_bytes().to_vec()))
        .collect();
    {
        let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
        engine.put_metadata(b"log/00000", b"old").expect("put");
        engine.put_metadata_all(&entries).expect("put all");
    }
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("reopen");
    assert_eq!(engine.metadata_with_prefix(b"log/").expect("scan"), entries);
    let doomed: Vec<Vec<u8>> = entries[..200].iter().map(|(key, _)| key.clone()).collect();
    engine.delete_metadata_all(&doomed).expect("delete all");
    drop(engine);
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("reopen");
    assert_eq!(
        engine.metadata_with_prefix(b"log/").expect("scan"),
        entries[200..]
    );
    let memory = MemoryEngine::new();
    memory.put_metadata_all(&entries).expect("put all");
    memory.delete_metadata_all(&doomed).expect("delete all");
    assert_eq!(
        memory.metadata_with_prefix(b"log/").expect("scan"),
        entries[200..]
    );
}

#[test]
fn rocksdb_data_survives_reopen_after_sync() {
    let directory = tempfile::tempdir().expect("temporary directory");
    {
        let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
        write(
            &engine,
            row_key(b"p", b"a", "v"),
            Cell::live(WriteTimestamp(1), b"kept".to_vec()),
        );
        engine.sync().expect("sync");
    }
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("reopen");
    let rows = read(&engine, b"p", NOW);
    assert_eq!(value_of(&rows[0], "v"), Some(b"kept".to_vec()));
}

#[test]
fn compaction_purges_old_tombstones_only_after_grace() {
    let engine = MemoryEngine::new();
    engine.set_gc_grace_seconds(TABLE, 100);
    write(
        &engine,
        row_key(b"p", b"a", "v"),
        Cell::tombstone(WriteTimestamp(1), NOW),
    );
    engine.compact(NOW + 99);
    assert_eq!(engine.stored_key_count(), 1);
    engine.compact(NOW + 100);
    assert_eq!(engine.stored_key_count(), 0);
}

#[test]
fn rocksdb_compaction_purges_deletions_past_their_grace_period() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    engine.set_gc_grace_seconds(TABLE, 0);
    let now = shoal_model::timestamp::now_seconds();
    write(
        &engine,
        row_key(b"p", b"a", "v"),
        Cell::tombstone(WriteTimestamp(1), now - 10),
    );
    write(
        &engine,
        row_key(b"p", b"b", "v"),
        Cell::live(WriteTimestamp(1), b"kept".to_vec()),
    );
    let count = |engine: &RocksEngine| {
        let mut cursor = engine
            .scan(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE), false)
            .expect("scan");
        let mut keys = 0;
        while cursor.current().is_some() {
            keys += 1;
            cursor.advance();
        }
        keys
    };
    assert_eq!(count(&engine), 2);
    engine.compact_all().expect("compact");
    assert_eq!(
        count(&engine),
        1,
        "the old tombstone is purged, the live cell stays"
    );
}

#[test]
fn rocksdb_compacts_level0_once_writes_go_quiet() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let level0_files = |engine: &RocksEngine| {
        engine
            .statistics()
            .iter()
            .find(|statistic| statistic.name == "storage_level0_files")
            .map(|statistic| statistic.value)
            .expect("level-0 file count")
    };
    let partitions: Vec<String> = (0..3).map(|n| format!("p{n}")).collect();
    for partition in &partitions {
        write(
            &engine,
            row_key(partition.as_bytes(), b"a", "v"),
            Cell::live(WriteTimestamp(1), partition.as_bytes().to_vec()),
        );
        engine.flush().expect("flush");
    }
    assert_eq!(level0_files(&engine), 3);
    // Just opened counts as busy: the files wait for the batching trigger.
    engine.adapt_compaction_at(std::time::Instant::now());
    assert_eq!(level0_files(&engine), 3);
    // No memtable switch for a while: level 0 is compacted away.
    engine.adapt_compaction_at(std::time::Instant::now() + crate::rocks::level0::QUIET_AFTER);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while level0_files(&engine) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "level 0 still holds {} files",
            level0_files(&engine)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for partition in &partitions {
        let rows = read(&engine, partition.as_bytes(), NOW);
        assert_eq!(rows.len(), 1, "{partition} is still there");
        assert_eq!(value_of(&rows[0], "v"), Some(partition.as_bytes().to_vec()));
    }
}

/// The keys of `partition`, as `[lower, upper)`.
fn partition_bounds(partition: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let lower = keys::partition_prefix(&TABLE, Token(1), partition);
    let upper = keys::increment_prefix(&lower).expect("a partition prefix ends");
    (lower, upper)
}

/// The values of column `v` in partition `partition`, row by row, read `reverse`d or not.
fn values_of_v(engine: &dyn Engine, partition: &[u8], reverse: bool) -> Vec<Vec<u8>> {
    read_in_order(engine, partition, reverse, NOW)
        .iter()
        .filter_map(|row| value_of(row, "v"))
        .collect()
}

/// Partition reads reuse pooled RocksDB iterators (`rocks::iterator_pool`). A reused
/// iterator must read only the partition it is reused for — here every partition shares
/// one token, so only the iterator's bounds tell them apart — and see every write made
/// since it was last used, also once a flush or a compaction has changed the files under
/// it.
#[test]
fn a_reused_partition_iterator_reads_only_its_partition_and_every_write_since() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let put = |partition: &[u8], clustering: &[u8], timestamp: i64, value: &[u8]| {
        write(
            &engine,
            row_key(partition, clustering, "v"),
            Cell::live(WriteTimestamp(timestamp), value.to_vec()),
        )
    };
    put(b"p1", b"a", 1, b"one");
    put(b"p2", b"a", 1, b"two");
    assert_eq!(values_of_v(&engine, b"p1", false), vec![b"one".to_vec()]);
    assert_eq!(values_of_v(&engine, b"p2", false), vec![b"two".to_vec()]);
    assert_eq!(
        engine.partition_iterators().len(),
        1,
        "the second read reused the first one's iterator"
    );

    put(b"p1", b"a", 2, b"uno");
    put(b"p1", b"b", 2, b"new row");
    assert_eq!(
        values_of_v(&engine, b"p1", false),
        vec![b"uno".to_vec(), b"new row".to_vec()]
    );
    assert_eq!(
        values_of_v(&engine, b"p1", true),
        vec![b"new row".to_vec(), b"uno".to_vec()]
    );

    // A read keeps its iterator across a flush; the iterator is then refreshed onto
    // the flushed file.
    put(b"p2", b"a", 3, b"dos");
    let (lower, upper) = partition_bounds(b"p2");
    let cursor = engine.scan(&lower, &upper, false).expect("scan");
    assert!(cursor.current().is_some(), "p2 holds a row");
    engine.flush().expect("flush");
    drop(cursor);
    assert_eq!(engine.partition_iterators().len(), 1);
    put(b"p2", b"b", 3, b"tres");
    assert_eq!(
        values_of_v(&engine, b"p2", false),
        vec![b"dos".to_vec(), b"tres".to_vec()]
    );
    engine.compact_all().expect("compact");
    put(b"p1", b"c", 4, b"after compaction");
    assert_eq!(
        values_of_v(&engine, b"p1", false),
        vec![
            b"uno".to_vec(),
            b"new row".to_vec(),
            b"after compaction".to_vec()
        ]
    );
    assert_eq!(values_of_v(&engine, b"p3", false), Vec::<Vec<u8>>::new());
}

/// Threads sharing the iterator pool each read back every write they made, whichever
/// pooled iterator they are handed and whatever the other threads flush meanwhile.
#[test]
fn every_reader_of_the_iterator_pool_reads_its_own_writes() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    std::thread::scope(|scope| {
        for thread in 0..4u8 {
            let engine = &engine;
            scope.spawn(move || {
                let partition = [b'p', thread];
                for round in 1..=200i64 {
                    let value = round.to_be_bytes().to_vec();
                    write(
                        engine,
                        row_key(&partition, b"a", "v"),
                        Cell::live(WriteTimestamp(round), value.clone()),
                    );
                    if thread == 0 && round % 50 == 0 {
                        engine.flush().expect("flush");
                    }
                    assert_eq!(
                        values_of_v(engine, &partition, round % 2 == 0),
                        vec![value],
                        "thread {thread}, round {round}"
                    );
                }
            });
        }
    });
}

/// Pooled iterators keep flushed memtables and compacted-away files alive, so the ones
/// left unused are released.
#[test]
fn idle_partition_iterators_are_released() {
    use crate::rocks::iterator_pool::{IDLE_LIMIT, POOL_CAPACITY};
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    write(
        &engine,
        row_key(b"p", b"a", "v"),
        Cell::live(WriteTimestamp(1), b"x".to_vec()),
    );
    // More cursors open at once than the pool keeps.
    let (lower, upper) = partition_bounds(b"p");
    let cursors: Vec<_> = (0..POOL_CAPACITY + 4)
        .map(|_| engine.scan(&lower, &upper, false).expect("scan"))
        .collect();
    assert!(cursors.iter().all(|cursor| cursor.current().is_some()));
    drop(cursors);
    let pool = engine.partition_iterators();
    assert_eq!(
        pool.len(),
        POOL_CAPACITY,
        "the pool keeps at most its capacity"
    );
    let now = std::time::Instant::now();
    assert_eq!(pool.drop_idle(now, IDLE_LIMIT), POOL_CAPACITY, "just used");
    assert_eq!(
        pool.drop_idle(now + IDLE_LIMIT, IDLE_LIMIT),
        0,
        "idle for the limit"
    );
    assert_eq!(values_of_v(&engine, b"p", false), vec![b"x".to_vec()]);
    engine.flush().expect("flush");
    assert_eq!(pool.len(), 0, "a flush releases the pooled iterators");
}

/// A read through [`crate::InMemory`] answers from memtables and the block cache, and
/// stops at a block on disk instead of reading it, saying so. Once a read of everything
/// has brought the block into the cache, a read of memory — on the pooled iterator that
/// stopped before — answers it.
#[test]
fn a_read_of_memory_stops_at_data_on_disk_until_it_is_cached() {
    use crate::{InMemory, StorageError};
    use std::sync::Arc;
    let directory = tempfile::tempdir().expect("temporary directory");
    {
        let engine: Arc<dyn Engine> =
            Arc::new(RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open"));
        write(
            engine.as_ref(),
            row_key(b"on disk", b"a", "v"),
            Cell::live(WriteTimestamp(1), b"flushed".to_vec()),
        );
        let memory = InMemory::new(Arc::clone(&engine));
        assert_eq!(
            values_of_v(&memory, b"on disk", false),
            vec![b"flushed".to_vec()]
        );
        assert!(!memory.needed_disk(), "a memtable is in memory");
        drop(memory);
        engine.flush().expect("flush");
    }
    // Opened again, the node's block cache is empty.
    let engine: Arc<dyn Engine> =
        Arc::new(RocksEngine::open(directory.path(), &RocksOptions::default()).expect("reopen"));
    let engine = &engine;
    let read_on_disk = |engine: &dyn Engine| {
        reader::read_partition(
            engine,
            &TABLE,
            Token(1),
            b"on disk",
            &[ClusteringSlice::all()],
            false,
            NOW,
            &mut Collect::default(),
        )
    };
    let memory = InMemory::new(Arc::clone(engine));
    assert!(matches!(
        read_on_disk(&memory),
        Err(StorageError::NotInMemory)
    ));
    assert!(memory.needed_disk(), "the row is in a file not read yet");
    // A wider read of memory only stops at the same block.
    let mut wide = engine
        .scan_in_memory(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE), false)
        .expect("scan");
    while wide.current().is_some() {
        wide.advance();
    }
    assert!(matches!(wide.status(), Err(StorageError::NotInMemory)));

    assert_eq!(
        values_of_v(engine.as_ref(), b"on disk", false),
        vec![b"flushed".to_vec()],
        "a read of everything reads the file"
    );
    let memory = InMemory::new(Arc::clone(engine));
    assert_eq!(
        values_of_v(&memory, b"on disk", false),
        vec![b"flushed".to_vec()],
        "the block read is cached now"
    );
    assert!(!memory.needed_disk());
    assert!(
        memory.write(&WriteBatch::new()).is_err(),
        "the view is read-only"
    );
}

/// Engines that hold everything in memory answer every read of memory.
#[test]
fn a_memory_engine_never_needs_the_disk() {
    let engine = std::sync::Arc::new(MemoryEngine::new());
    write(
        engine.as_ref(),
        row_key(b"p", b"a", "v"),
        Cell::live(WriteTimestamp(1), b"x".to_vec()),
    );
    let memory = crate::InMemory::new(engine);
    assert_eq!(values_of_v(&memory, b"p", false), vec![b"x".to_vec()]);
    assert!(!memory.needed_disk());
}

fn partition_deletion_key(partition: &[u8]) -> Vec<u8> {
    let mut key = keys::partition_prefix(&TABLE, Token(1), partition);
    key.push(keys::SECTION_PARTITION_DELETION);
    key
}

fn element_key(partition: &[u8], clustering: &[u8], column: &str, element: &[u8]) -> Vec<u8> {
    let mut key = keys::partition_prefix(&TABLE, Token(1), partition);
    key.push(keys::SECTION_ROW);
    key.extend_from_slice(clustering);
    keys::push_column_part(&mut key, |k| keys::push_cell_column(k, column, element));
    key
}

fn collection_deletion_key(partition: &[u8], clustering: &[u8], column: &str) -> Vec<u8> {
    let mut key = keys::partition_prefix(&TABLE, Token(1), partition);
    key.push(keys::SECTION_ROW);
    key.extend_from_slice(clustering);
    keys::push_column_part(&mut key, |k| keys::push_collection_deletion(k, column));
    key
}

/// Every engine, each compacted the way it compacts.
fn with_each_compacting_engine(test: impl Fn(&dyn Engine)) {
    with_each_engine(|engine| {
        engine.set_gc_grace_seconds(TABLE, 0);
        test(engine)
    });
}

#[test]
fn a_deleted_partition_stays_deleted_after_its_tombstone_is_purged() {
    // The reported defect: with gc_grace_seconds = 0, compaction dropped the partition
    // deletion and kept the row it shadowed, which came back.
    with_each_compacting_engine(|engine| {
        write(
            engine,
            marker_key(b"p", b"a"),
            Cell::live(WriteTimestamp(10), Vec::new()),
        );
        write(
            engine,
            row_key(b"p", b"a", "v"),
            Cell::live(WriteTimestamp(10), b"old".to_vec()),
        );
        engine.flush().expect("flush");
        write(
            engine,
            partition_deletion_key(b"p"),
            Cell::tombstone(WriteTimestamp(20), NOW),
        );
        engine.compact_all().expect("compact");
        assert!(
            read(engine, b"p", NOW).is_empty(),
            "the deleted row is back"
        );
        engine.compact_all().expect("compact again");
        assert!(
            read(engine, b"p", NOW).is_empty(),
            "the deleted row is back"
        );
        // A newer write is not affected by the old deletion.
        write(
            engine,
            row_key(b"p", b"b", "v"),
            Cell::live(WriteTimestamp(30), b"new".to_vec()),
        );
        engine.compact_all().expect("compact");
        let rows = read(engine, b"p", NOW);
        assert_eq!(rows.len(), 1);
        assert_eq!(value_of(&rows[0], "v"), Some(b"new".to_vec()));
    });
}

#[test]
fn an_overwritten_collection_keeps_only_its_new_elements_after_compaction() {
    // `INSERT s = {'a'}` then `UPDATE SET s = {'b'}`: the overwrite is a collection
    // deletion just before the new element. After compaction it read {'a', 'b'}.
    with_each_compacting_engine(|engine| {
        write(
            engine,
            element_key(b"p", b"r", "s", b"a"),
            Cell::live(WriteTimestamp(10), Vec::new()),
        );
        engine.flush().expect("flush");
        write(
            engine,
            collection_deletion_key(b"p", b"r", "s"),
            Cell::tombstone(WriteTimestamp(19), NOW),
        );
        write(
            engine,
            element_key(b"p", b"r", "s", b"b"),
            Cell::live(WriteTimestamp(20), Vec::new()),
        );
        engine.compact_all().expect("compact");
        let rows = read(engine, b"p", NOW);
        let elements: Vec<Vec<u8>> = rows[0]
            .column("s")
            .expect("the set")
            .cells
            .iter()
            .map(|(path, _)| path.clone())
            .collect();
        assert_eq!(elements, vec![b"b".to_vec()]);
    });
}

#[test]
fn nothing_is_purged_from_a_table_whose_grace_period_is_unknown() {
    // Until the schema is installed a node does not know a table's grace period; a
    // compaction in that window must not purge anything of it.
    with_each_engine(|engine| {
        write(
            engine,
            row_key(b"p", b"a", "v"),
            Cell::tombstone(WriteTimestamp(1), 0),
        );
        engine.compact_all().expect("compact");
        let mut cursor = engine
            .scan(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE), false)
            .expect("scan");
        assert!(cursor.current().is_some(), "the tombstone was purged");
        cursor.advance();
    });
}

#[test]
fn a_store_written_in_another_format_is_refused() {
    let directory = tempfile::tempdir().expect("temporary directory");
    {
        let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
        engine
            .put_metadata(b"storage/format", &1u32.to_be_bytes())
            .expect("write");
    }
    let error = RocksEngine::open(directory.path(), &RocksOptions::default())
        .err()
        .expect("refused");
    let message = error.to_string();
    assert!(
        message.contains("storage format 1, but this Shoal reads format"),
        "{message}"
    );
    assert!(!message.contains("corrupt"), "{message}");
}

/// Random histories of writes, deletions, flushes, compactions and garbage collection:
/// whatever the engines do to their files, a read returns what the same writes read from
/// an engine that never compacts.
mod model {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Write {
        Live(u8),
        Expired,
        Expiring(u8),
        Tombstone,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Cell {
            partition: u8,
            /// `None`: the static row.
            row: Option<u8>,
            column: u8,
            element: Option<u8>,
            write: Write,
        },
        Marker {
            partition: u8,
            row: u8,
        },
        RowDeletion {
            partition: u8,
            row: u8,
        },
        RangeDeletion {
            partition: u8,
            from: u8,
            to: u8,
        },
        PartitionDeletion {
            partition: u8,
        },
        CollectionDeletion {
            partition: u8,
            row: u8,
            column: u8,
        },
        Flush,
        Compact {
            from: u8,
            to: u8,
        },
        CollectGarbage,
    }

    fn op() -> impl Strategy<Value = Op> {
        let write = prop_oneof![
            (0u8..4).prop_map(Write::Live),
            Just(Write::Expired),
            (0u8..4).prop_map(Write::Expiring),
            Just(Write::Tombstone),
        ];
        prop_oneof![
            6 => (0u8..3, proptest::option::weighted(0.8, 0u8..4), 0u8..2, proptest::option::of(0u8..3), write)
                .prop_map(|(partition, row, column, element, write)| Op::Cell { partition, row, column, element, write }),
            2 => (0u8..3, 0u8..4).prop_map(|(partition, row)| Op::Marker { partition, row }),
            1 => (0u8..3, 0u8..4).prop_map(|(partition, row)| Op::RowDeletion { partition, row }),
            1 => (0u8..3, 0u8..4, 0u8..4).prop_map(|(partition, a, b)| Op::RangeDeletion { partition, from: a.min(b), to: a.max(b) }),
            1 => (0u8..3).prop_map(|partition| Op::PartitionDeletion { partition }),
            1 => (0u8..3, 0u8..4, 0u8..2).prop_map(|(partition, row, column)| Op::CollectionDeletion { partition, row, column }),
            2 => Just(Op::Flush),
            2 => (0u8..4, 0u8..4).prop_map(|(a, b)| Op::Compact { from: a.min(b), to: a.max(b) }),
            1 => Just(Op::CollectGarbage),
        ]
    }

    fn partition_prefix(partition: u8) -> Vec<u8> {
        keys::partition_prefix(&TABLE, Token(partition as i64), &[partition])
    }

    fn row_prefix(partition: u8, row: Option<u8>) -> Vec<u8> {
        let mut key = partition_prefix(partition);
        match row {
            Some(row) => {
                key.push(keys::SECTION_ROW);
                key.push(row);
            }
            None => key.push(keys::SECTION_STATIC_ROW),
        }
        key
    }

    fn with_part(mut key: Vec<u8>, part: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        keys::push_column_part(&mut key, part);
        key
    }

    /// The write an op makes, stamped `timestamp`; `None` for maintenance ops.
    fn mutation(op: &Op, timestamp: i64) -> Option<(Vec<u8>, Cell)> {
        let timestamp = WriteTimestamp(timestamp);
        let deletion = Cell::tombstone(timestamp, NOW);
        let long_ago = 1_000;
        Some(match op {
            Op::Cell {
                partition,
                row,
                column,
                element,
                write,
            } => {
                let path: Vec<u8> = element.iter().copied().collect();
                let key = with_part(row_prefix(*partition, *row), |k| {
                    keys::push_cell_column(k, &format!("c{column}"), &path)
                });
                let cell = match write {
                    Write::Live(value) => Cell::live(timestamp, vec![*value]),
                    Write::Expired => Cell::with_ttl(timestamp, vec![9], 10, long_ago),
                    Write::Expiring(value) => {
                        Cell::with_ttl(timestamp, vec![*value], 1_000_000_000, NOW * 2000)
                    }
                    Write::Tombstone => deletion,
                };
                (key, cell)
            }
            Op::Marker { partition, row } => (
                with_part(row_prefix(*partition, Some(*row)), |k| {
                    k.push(keys::COLUMN_ROW_MARKER)
                }),
                Cell::live(timestamp, Vec::new()),
            ),
            Op::RowDeletion { partition, row } => (
                with_part(row_prefix(*partition, Some(*row)), |k| {
                    k.push(keys::COLUMN_ROW_DELETION)
                }),
                deletion,
            ),
            Op::RangeDeletion {
                partition,
                from,
                to,
            } => {
                let mut key = partition_prefix(*partition);
                keys::push_range_tombstone(&mut key, &[*from], true, &[*to], true);
                (key, deletion)
            }
            Op::PartitionDeletion { partition } => {
                let mut key = partition_prefix(*partition);
                key.push(keys::SECTION_PARTITION_DELETION);
                (key, deletion)
            }
            Op::CollectionDeletion {
                partition,
                row,
                column,
            } => (
                with_part(row_prefix(*partition, Some(*row)), |k| {
                    keys::push_collection_deletion(k, &format!("c{column}"))
                }),
                deletion,
            ),
            Op::Flush | Op::Compact { .. } | Op::CollectGarbage => return None,
        })
    }

    fn everything(engine: &dyn Engine) -> Vec<(Vec<u8>, Row, Option<Row>)> {
        struct All(Vec<(Vec<u8>, Row, Option<Row>)>);
        impl Visitor for All {
            fn partition(&mut self, _: &PartitionHeader) -> Flow {
                Flow::Continue
            }
            fn row(&mut self, header: &PartitionHeader, row: Row) -> Flow {
                self.0
                    .push((header.key.clone(), row, header.static_row.clone()));
                Flow::Continue
            }
            fn partition_end(&mut self, header: &PartitionHeader) -> Flow {
                if let Some(static_row) = &header.static_row {
                    self.0.push((header.key.clone(), static_row.clone(), None));
                }
                Flow::Continue
            }
        }
        let mut all = All(Vec::new());
        reader::scan_partitions(
            engine,
            &keys::table_prefix(&TABLE),
            &keys::table_end(&TABLE),
            shoal_model::timestamp::now_seconds(),
            &mut all,
        )
        .expect("scan");
        all.0
    }

    /// Runs `ops` against the model and both engines; timestamps are the op's position
    /// (`ordered`) or the given ones.
    fn check(ops: &[(Op, i64)], gc_grace_seconds: i32) {
        let model = MemoryEngine::new();
        let memory = MemoryEngine::new();
        let directory = tempfile::tempdir().expect("temporary directory");
        let rocks = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
        for engine in [&memory as &dyn Engine, &rocks] {
            engine.set_gc_grace_seconds(TABLE, gc_grace_seconds);
        }
        for (op, timestamp) in ops {
            if let Some((key, cell)) = mutation(op, *timestamp) {
                for engine in [&model as &dyn Engine, &memory, &rocks] {
                    write(engine, key.clone(), cell.clone());
                }
                continue;
            }
            match op {
                Op::Flush => rocks.flush().expect("flush"),
                Op::Compact { from, to } => {
                    let upper = keys::increment_prefix(&partition_prefix(*to)).expect("upper");
                    rocks
                        .compact_range(&partition_prefix(*from), &upper)
                        .expect("compact");
                    memory.compact(shoal_model::timestamp::now_seconds());
                }
                Op::CollectGarbage => {
                    rocks.collect_garbage().expect("garbage");
                }
                _ => {}
            }
            assert_eq!(
                everything(&memory),
                everything(&model),
                "memory after {op:?}"
            );
        }
        let expected = everything(&model);
        assert_eq!(everything(&rocks), expected, "rocksdb");
        rocks.compact_all().expect("compact");
        assert_eq!(
            everything(&rocks),
            expected,
            "rocksdb after a full compaction"
        );
        memory.compact_all().expect("compact");
        assert_eq!(
            everything(&memory),
            expected,
            "memory after a full compaction"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Arrival order is timestamp order and deletions are purgeable at once
        /// (gc_grace_seconds = 0): purging must never bring anything back.
        #[test]
        fn purging_never_resurrects(ops in proptest::collection::vec(op(), 1..60)) {
            let ops: Vec<(Op, i64)> = ops.into_iter().enumerate().map(|(i, op)| (op, i as i64 + 1)).collect();
            check(&ops, 0);
        }

        /// Writes arrive in any timestamp order (within the grace period, which is long):
        /// dropping shadowed cells must never change what a read returns.
        #[test]
        fn dropping_shadowed_cells_never_changes_a_read(
            ops in proptest::collection::vec((op(), 1i64..40), 1..60)
        ) {
            check(&ops, i32::MAX);
        }
    }
}

#[test]
fn a_hot_key_keeps_last_write_wins_through_collapses() {
    // Hundreds of writes to one key, in scrambled timestamp order: the writer collapses
    // the key's operands into a value every few writes, and the newest timestamp still
    // wins, also against older writes that arrive after a collapse.
    with_each_engine(|engine| {
        let key = row_key(b"hot", b"a", "v");
        let mut newest = 0;
        for i in 0..500i64 {
            let timestamp = (i * 7919) % 1000;
            newest = newest.max(timestamp);
            write(
                engine,
                key.clone(),
                Cell::live(WriteTimestamp(timestamp), timestamp.to_be_bytes().to_vec()),
            );
        }
        let rows = read(engine, b"hot", NOW);
        assert_eq!(value_of(&rows[0], "v"), Some(newest.to_be_bytes().to_vec()));
        write(engine, key, Cell::live(WriteTimestamp(1), b"old".to_vec()));
        let rows = read(engine, b"hot", NOW);
        assert_eq!(value_of(&rows[0], "v"), Some(newest.to_be_bytes().to_vec()));
    });
}

#[test]
fn concurrent_writes_to_a_hot_key_keep_last_write_wins() {
    // Four threads write one key at once, in scrambled timestamp order: batches are applied
    // by their callers or queued for the writer thread, and the key's operands are collapsed
    // by whichever applier sees it become hot. The newest timestamp wins all the same.
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = std::sync::Arc::new(
        RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open"),
    );
    let key = row_key(b"hot", b"a", "v");
    let writers: Vec<_> = (0..4i64)
        .map(|writer| {
            let engine = std::sync::Arc::clone(&engine);
            let key = key.clone();
            std::thread::spawn(move || {
                for i in 0..500i64 {
                    let timestamp = (i * 7919 + writer * 13) % 2000;
                    let mut batch = WriteBatch::new();
                    batch.merge(
                        key.clone(),
                        Cell::live(WriteTimestamp(timestamp), timestamp.to_be_bytes().to_vec())
                            .encode(),
                    );
                    futures::executor::block_on(engine.write_async(batch)).expect("write");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    let newest = (0..4i64)
        .flat_map(|writer| (0..500i64).map(move |i| (i * 7919 + writer * 13) % 2000))
        .max()
        .expect("writes");
    let rows = read(engine.as_ref(), b"hot", NOW);
    assert_eq!(value_of(&rows[0], "v"), Some(newest.to_be_bytes().to_vec()));
}

#[test]
fn writes_collected_by_a_deferral_land_together_when_it_is_applied() {
    use futures::FutureExt;
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let deferral = crate::WriteDeferral::begin();
    let mut pending: Vec<_> = (0..3u8)
        .map(|i| {
            let mut batch = WriteBatch::new();
            batch.merge(
                row_key(&[i], b"a", "v"),
                Cell::live(WriteTimestamp(1), vec![i]).encode(),
            );
            engine.write_async(batch)
        })
        .collect();
    // A synchronous write is never deferred: it would wait for itself.
    write(
        &engine,
        row_key(b"sync", b"a", "v"),
        Cell::live(WriteTimestamp(1), b"now".to_vec()),
    );
    assert_eq!(read(&engine, b"sync", NOW).len(), 1);
    assert!(
        pending
            .iter_mut()
            .all(|write| write.now_or_never().is_none()),
        "deferred writes wait for the deferral to be applied"
    );
    assert!(read(&engine, &[0], NOW).is_empty());
    assert_eq!(deferral.apply(), 3);
    for write in pending {
        write.now_or_never().expect("applied").expect("write");
    }
    for i in 0..3u8 {
        let rows = read(&engine, &[i], NOW);
        assert_eq!(value_of(&rows[0], "v"), Some(vec![i]));
    }
    // Closed: writes apply at once again.
    let mut batch = WriteBatch::new();
    batch.merge(
        row_key(b"after", b"a", "v"),
        Cell::live(WriteTimestamp(1), b"x".to_vec()).encode(),
    );
    engine
        .write_async(batch)
        .now_or_never()
        .expect("applied at once")
        .expect("write");
}

#[test]
fn concurrent_writers_all_land() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = std::sync::Arc::new(
        RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open"),
    );
    let writers: Vec<_> = (0..4u8)
        .map(|writer| {
            let engine = std::sync::Arc::clone(&engine);
            std::thread::spawn(move || {
                for i in 0..250u32 {
                    let mut batch = WriteBatch::new();
                    let partition = [writer, (i >> 8) as u8, i as u8];
                    batch.merge(
                        row_key(&partition, b"a", "v"),
                        Cell::live(WriteTimestamp(1), vec![writer]).encode(),
                    );
                    futures::executor::block_on(engine.write_async(batch)).expect("write");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    let mut cursor = engine
        .scan(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE), false)
        .expect("scan");
    let mut count = 0;
    while cursor.current().is_some() {
        count += 1;
        cursor.advance();
    }
    assert_eq!(count, 1000);
}

#[test]
fn a_truncated_table_hides_what_was_written_before_even_when_it_arrives_late() {
    with_each_engine(|engine| {
        // No grace period registered: a truncation applies all the same (DROP TABLE
        // leaves no schema, hence no grace, behind).
        write(
            engine,
            row_key(b"p", b"a", "v"),
            Cell::live(WriteTimestamp(10), b"before".to_vec()),
        );
        engine.set_truncated_at(TABLE, WriteTimestamp(20));
        assert!(read(engine, b"p", NOW).is_empty(), "truncated data is read");
        // A hint, a slow replica or a repair delivers an old cell after the truncation.
        write(
            engine,
            row_key(b"p", b"b", "v"),
            Cell::live(WriteTimestamp(15), b"late".to_vec()),
        );
        assert!(
            read(engine, b"p", NOW).is_empty(),
            "a late old cell is read"
        );
        let mut visible = 0;
        crate::shadow::visit_visible(
            engine,
            &keys::table_prefix(&TABLE),
            &keys::table_end(&TABLE),
            NOW,
            |_, _| {
                visible += 1;
                true
            },
        )
        .expect("walk");
        assert_eq!(visible, 0, "a replica would send truncated cells");
        // What is written after the truncation is there, and compaction keeps it while
        // it drops what the truncation hides.
        write(
            engine,
            row_key(b"p", b"c", "v"),
            Cell::live(WriteTimestamp(30), b"after".to_vec()),
        );
        engine.compact_all().expect("compact");
        let rows = read(engine, b"p", NOW);
        assert_eq!(rows.len(), 1);
        assert_eq!(value_of(&rows[0], "v"), Some(b"after".to_vec()));
        let mut stored = 0;
        let mut cursor = engine
            .scan(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE), false)
            .expect("scan");
        while cursor.current().is_some() {
            stored += 1;
            cursor.advance();
        }
        assert_eq!(stored, 1, "compaction keeps truncated cells");
    });
}

/// Two engines of the same kind (the source and destination of a stream).
fn with_each_engine_pair(test: impl Fn(&dyn Engine, &dyn Engine)) {
    test(&MemoryEngine::new(), &MemoryEngine::new());
    let (first, second) = (
        tempfile::tempdir().expect("temporary directory"),
        tempfile::tempdir().expect("temporary directory"),
    );
    let open = |directory: &tempfile::TempDir| {
        RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open rocksdb")
    };
    test(&open(&first), &open(&second));
}

/// The cells stored in `[lower, upper)`, a row fragment's each under its own key.
fn stored(engine: &dyn Engine, lower: &[u8], upper: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut cursor = engine.scan(lower, upper, false).expect("scan");
    let mut entries = Vec::new();
    while let Some((key, value)) = cursor.current() {
        let parts = shoal_model::fragment::expand(key, value).expect("stored entry");
        entries.extend(parts.into_iter().map(|(key, cell)| (key, cell.to_vec())));
        cursor.advance();
    }
    entries
}

#[test]
fn a_streamed_range_reconciles_with_what_the_destination_already_holds() {
    // The destination receives writes while the range is streamed to it (a tablet being
    // moved): whichever is newer wins, per cell, whether it came by stream or by write,
    // and deletions travel like any cell.
    with_each_engine_pair(|source, destination| {
        let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
        for row in 0..200u32 {
            let clustering = row.to_be_bytes();
            write(
                source,
                row_key(b"p", &clustering, "v"),
                Cell::live(WriteTimestamp(10), b"streamed".to_vec()),
            );
        }
        write(
            source,
            row_key(b"p", &7u32.to_be_bytes(), "v"),
            Cell::tombstone(WriteTimestamp(11), NOW),
        );
        // Newer on the destination for row 1, older for row 2.
        write(
            destination,
            row_key(b"p", &1u32.to_be_bytes(), "v"),
            Cell::live(WriteTimestamp(20), b"written".to_vec()),
        );
        write(
            destination,
            row_key(b"p", &2u32.to_be_bytes(), "v"),
            Cell::live(WriteTimestamp(5), b"older".to_vec()),
        );
        let mut cursor = source.stream_range(&lower, &upper).expect("stream");
        let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let ingest = |chunk: &[(Vec<u8>, Vec<u8>)]| {
            destination.ingest(&borrowed(chunk)).expect("ingest");
        };
        while let Some((key, value)) = cursor.current() {
            chunk.push((key.to_vec(), value.to_vec()));
            if chunk.len() == 64 {
                ingest(&std::mem::take(&mut chunk));
            }
            cursor.advance();
        }
        cursor.status().expect("stream status");
        ingest(&chunk);
        let value = |row: u32| -> Option<Vec<u8>> {
            stored(destination, &lower, &upper)
                .into_iter()
                .find(|(key, _)| *key == row_key(b"p", &row.to_be_bytes(), "v"))
                .map(|(_, value)| Cell::decode(&value).expect("cell").value)
        };
        assert_eq!(value(0), Some(b"streamed".to_vec()));
        assert_eq!(value(1), Some(b"written".to_vec()));
        assert_eq!(value(2), Some(b"streamed".to_vec()));
        let deleted = stored(destination, &lower, &upper)
            .into_iter()
            .find(|(key, _)| *key == row_key(b"p", &7u32.to_be_bytes(), "v"))
            .map(|(_, value)| Cell::decode(&value).expect("cell"));
        assert!(deleted.is_some_and(|cell| !cell.is_live(NOW)));
        assert_eq!(stored(destination, &lower, &upper).len(), 200);
        // Writes after the ingestion still win over it by timestamp, and a hot key keeps
        // collapsing correctly afterwards.
        for i in 0..50i64 {
            write(
                destination,
                row_key(b"p", &3u32.to_be_bytes(), "v"),
                Cell::live(WriteTimestamp(100 + i), b"after".to_vec()),
            );
        }
        assert_eq!(value(3), Some(b"after".to_vec()));
    });
}

/// Rows 0..100 of partition `p` (timestamp 10) as a source streams them: stored entries
/// of `[lower, upper)`.
fn streamed_rows(lower: &[u8], upper: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let directory = tempfile::tempdir().expect("temporary directory");
    let source = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    for row in 0..100u32 {
        write(
            &source,
            row_key(b"p", &row.to_be_bytes(), "v"),
            Cell::live(WriteTimestamp(10), b"streamed".to_vec()),
        );
    }
    let mut cursor = source.stream_range(lower, upper).expect("stream");
    let mut entries = Vec::new();
    while let Some((key, value)) = cursor.current() {
        entries.push((key.to_vec(), value.to_vec()));
        cursor.advance();
    }
    cursor.status().expect("stream status");
    entries
}

/// A RocksDB engine in `directory` that stages the writes to `[lower, upper)`.
fn open_staging(directory: &std::path::Path, lower: &[u8], upper: &[u8]) -> RocksEngine {
    let engine = RocksEngine::open(directory, &RocksOptions::default()).expect("open");
    engine.stage_writes(lower, upper).expect("stage");
    engine
}

/// Writes row `row` of partition `p`: `value` at `timestamp`.
fn write_row(engine: &dyn Engine, row: u32, timestamp: i64, value: &[u8]) {
    write(
        engine,
        row_key(b"p", &row.to_be_bytes(), "v"),
        Cell::live(WriteTimestamp(timestamp), value.to_vec()),
    );
}

/// The value of row `row` of partition `p`, if the engine holds one.
fn row_value(engine: &dyn Engine, lower: &[u8], upper: &[u8], row: u32) -> Option<Vec<u8>> {
    stored(engine, lower, upper)
        .into_iter()
        .find(|(key, _)| *key == row_key(b"p", &row.to_be_bytes(), "v"))
        .map(|(_, value)| Cell::decode(&value).expect("cell").value)
}

#[test]
fn writes_staged_while_a_range_streams_in_join_its_data_when_released() {
    let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = open_staging(directory.path(), &lower, &upper);
    // The tablet's writes while it streams in: one newer than the streamed row, one older.
    write_row(&engine, 1, 20, b"written");
    write_row(&engine, 2, 5, b"older");
    assert!(
        stored(&engine, &lower, &upper).is_empty(),
        "set aside until released"
    );
    engine
        .ingest(&borrowed(&streamed_rows(&lower, &upper)))
        .expect("ingest");
    // The writes did not stand in the way: the file went below level 0, where it would
    // have had to be compacted.
    assert_eq!(engine.files_at_level(0), 0);
    assert!(
        engine
            .release_staged_writes(&lower, &upper)
            .expect("release")
            > 0
    );
    assert_eq!(
        row_value(&engine, &lower, &upper, 0).as_deref(),
        Some(&b"streamed"[..])
    );
    assert_eq!(
        row_value(&engine, &lower, &upper, 1).as_deref(),
        Some(&b"written"[..])
    );
    assert_eq!(
        row_value(&engine, &lower, &upper, 2).as_deref(),
        Some(&b"streamed"[..])
    );
    assert_eq!(stored(&engine, &lower, &upper).len(), 100);
    // Released, the range takes writes directly again.
    write_row(&engine, 3, 30, b"after");
    assert_eq!(
        row_value(&engine, &lower, &upper, 3).as_deref(),
        Some(&b"after"[..])
    );
    assert_eq!(
        engine.release_staged_writes(&lower, &upper).expect("again"),
        0
    );
}

#[test]
fn writes_staged_when_a_node_stopped_join_the_data_when_it_opens_again() {
    let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
    let directory = tempfile::tempdir().expect("temporary directory");
    {
        let engine = open_staging(directory.path(), &lower, &upper);
        write_row(&engine, 1, 20, b"written");
    }
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("reopen");
    assert_eq!(
        row_value(&engine, &lower, &upper, 1).as_deref(),
        Some(&b"written"[..])
    );
    // Nothing is staged any more: a write reads back at once.
    write_row(&engine, 2, 20, b"direct");
    assert_eq!(
        row_value(&engine, &lower, &upper, 2).as_deref(),
        Some(&b"direct"[..])
    );
}

#[test]
fn a_range_removed_while_staged_loses_its_staged_writes_too() {
    let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = open_staging(directory.path(), &lower, &upper);
    write_row(&engine, 1, 20, b"truncated");
    // Removed before anything streamed in (TRUNCATE): the staged write goes.
    engine.delete_range(&lower, &upper).expect("remove");
    engine
        .release_staged_writes(&lower, &upper)
        .expect("release");
    assert!(stored(&engine, &lower, &upper).is_empty());
    // And removed after some did: the streamed rows and the staged write go.
    engine.stage_writes(&lower, &upper).expect("stage");
    engine
        .ingest(&borrowed(&streamed_rows(&lower, &upper)))
        .expect("ingest");
    write_row(&engine, 1, 20, b"truncated");
    engine.delete_range(&lower, &upper).expect("remove");
    engine
        .release_staged_writes(&lower, &upper)
        .expect("release");
    assert!(stored(&engine, &lower, &upper).is_empty());
}

#[test]
fn ingested_values_read_back_whether_or_not_their_file_is_compressed() {
    // Values that do not compress are ingested in an uncompressed file, values that do in
    // a compressed one (`rocks::compressibility`); either way every cell reads back as
    // streamed, after a compaction too.
    let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
    for (partition, compressible) in [(b"random".as_slice(), false), (b"text".as_slice(), true)] {
        let directory = tempfile::tempdir().expect("temporary directory");
        let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
        let cells: Vec<(Vec<u8>, Vec<u8>)> = (0..2000u32)
            .map(|row| {
                let value = if compressible {
                    format!("row {row} of a table whose values repeat themselves").into_bytes()
                } else {
                    crate::rocks::compressibility::incompressible_bytes(u64::from(row), 200)
                };
                let key = row_key(partition, &row.to_be_bytes(), "v");
                (key, Cell::live(WriteTimestamp(1), value).encode())
            })
            .collect();
        let entries = borrowed(&cells);
        assert_eq!(
            crate::rocks::compressibility::worth_compressing(&entries),
            compressible
        );
        engine.ingest(&entries).expect("ingest");
        assert_eq!(stored(&engine, &lower, &upper), cells);
        engine.compact_all().expect("compact");
        assert_eq!(stored(&engine, &lower, &upper), cells);
    }
}

#[test]
fn rocksdb_estimates_count_cells_not_yet_flushed() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    // Two key ranges of the table: tokens up to 0, and above.
    let below = keys::token_range(&TABLE, None, Token(0));
    let above = keys::token_range(&TABLE, Some(Token(0)), Token(i64::MAX));
    let cell_in = |token: i64, partition: &str| {
        let mut key = keys::partition_prefix(&TABLE, Token(token), partition.as_bytes());
        key.push(keys::SECTION_ROW);
        keys::push_column_part(&mut key, |k| keys::push_cell_column(k, "v", b""));
        key
    };
    let estimate = |engine: &RocksEngine| {
        engine
            .approximate_range_cells(&[below.clone(), above.clone()])
            .expect("rocksdb estimates")
    };
    assert_eq!(estimate(&engine), vec![0, 0]);
    for n in 0..100 {
        write(
            &engine,
            cell_in(1 + n, &format!("p{n}")),
            Cell::live(WriteTimestamp(1), b"x".to_vec()),
        );
    }
    // Nothing flushed yet: the hundred cells are all in the memtable, all above token 0.
    assert_eq!(estimate(&engine), vec![0, 100]);
    // Written again, a cell is still one cell.
    write(
        &engine,
        cell_in(1, "p0"),
        Cell::live(WriteTimestamp(2), b"y".to_vec()),
    );
    assert_eq!(estimate(&engine), vec![0, 100]);
    // Flushed, they are estimated from the files alone — not counted twice — and none
    // lies below token 0.
    engine.flush().expect("flush");
    let flushed = estimate(&engine);
    assert_eq!(flushed[0], 0);
    assert!(flushed[1] <= 150, "{flushed:?}");
}

#[test]
fn rocksdb_estimates_count_the_cells_of_row_fragments() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let table = keys::token_range(&TABLE, None, Token(i64::MAX));
    let estimate = |engine: &RocksEngine| {
        engine
            .approximate_range_cells(std::slice::from_ref(&table))
            .expect("rocksdb estimates")[0]
    };
    // 200 rows of a marker and three columns, one INSERT each: one stored entry per row
    // (decision 0018), four cells.
    for n in 0..200u32 {
        let clustering = n.to_be_bytes();
        let mut batch = WriteBatch::new();
        batch.merge(
            marker_key(b"p", &clustering),
            Cell::live(WriteTimestamp(1), Vec::new()).encode(),
        );
        for column in ["a", "b", "c"] {
            let cell = Cell::live(WriteTimestamp(1), b"x".to_vec());
            batch.merge(row_key(b"p", &clustering, column), cell.encode());
        }
        engine.write(&batch).expect("write");
    }
    assert_eq!(estimate(&engine), 800);
    // Flushed, the files' entries are rows; each still counts its four cells.
    engine.flush().expect("flush");
    let flushed = estimate(&engine);
    assert!((600..=1200).contains(&flushed), "{flushed}");
}

#[test]
fn a_walk_of_visible_cells_from_a_partition_start_or_from_inside_a_row_meets_every_cell_after_it() {
    with_each_engine(|engine| {
        // Two rows of a marker and three columns, one INSERT each: in RocksDB, one stored
        // entry per row (a fragment, decision 0018).
        let clusterings: [&[u8]; 2] = [b"r1", b"r2"];
        let mut every_cell = Vec::new();
        for clustering in clusterings {
            let mut batch = WriteBatch::new();
            let marker = marker_key(b"p", clustering);
            batch.merge(
                marker.clone(),
                Cell::live(WriteTimestamp(1), Vec::new()).encode(),
            );
            every_cell.push(marker);
            for column in ["a", "b", "c"] {
                let key = row_key(b"p", clustering, column);
                let cell = Cell::live(WriteTimestamp(1), b"x".to_vec());
                batch.merge(key.clone(), cell.encode());
                every_cell.push(key);
            }
            engine.write(&batch).expect("write");
        }
        every_cell.sort();
        let walk = |lower: &[u8]| {
            let mut visited = Vec::new();
            crate::shadow::visit_visible(engine, lower, &keys::table_end(&TABLE), NOW, |key, _| {
                visited.push(key.to_vec());
                true
            })
            .expect("walk");
            visited
        };
        // From the partition's start, as a replica's point read walks it.
        let partition = keys::partition_prefix(&TABLE, Token(1), b"p");
        assert_eq!(walk(&partition), every_cell);
        // Resuming inside the first row after its marker, as a chunked read may: the rest
        // of that row's cells (stored in the fragment under the marker's key, before where
        // the walk starts), then the next row's.
        let resume = row_key(b"p", b"r1", "b");
        let after_resume: Vec<Vec<u8>> = every_cell
            .iter()
            .filter(|key| key.as_slice() >= resume.as_slice())
            .cloned()
            .collect();
        assert_eq!(after_resume.len(), 6);
        assert_eq!(walk(&resume), after_resume);
    });
}

#[test]
fn files_streamed_in_together_while_clients_write_all_read_back() {
    // While clients write, the engine adds streamed files several at a time (`rocks::ingest`):
    // files of four ranges streamed at once, three each, beside a steady stream of writes to
    // a fifth range, all read back as written.
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let key_at = |token: i64| {
        let mut key = keys::partition_prefix(&TABLE, Token(token), b"p");
        key.push(keys::SECTION_ROW);
        keys::push_column_part(&mut key, |k| keys::push_cell_column(k, "v", b""));
        key
    };
    let cell_of = |token: i64| {
        Cell::live(
            WriteTimestamp(1),
            format!("cell at token {token}").into_bytes(),
        )
    };
    let cell_at = |token: i64| (key_at(token), cell_of(token).encode());
    let range = |index: i64| {
        keys::token_range(
            &TABLE,
            Some(Token(index * 10_000)),
            Token((index + 1) * 10_000),
        )
    };
    const FILES: i64 = 3;
    const CELLS_PER_FILE: i64 = 500;
    let streamed = |index: i64| -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        (0..FILES)
            .map(|file| {
                let first = index * 10_000 + 1 + file * CELLS_PER_FILE;
                (first..first + CELLS_PER_FILE).map(cell_at).collect()
            })
            .collect()
    };
    let written_token = |n: i64| 4 * 10_000 + 1 + n;
    let streaming_done = std::sync::atomic::AtomicBool::new(false);
    let written = std::thread::scope(|scope| {
        let writes = scope.spawn(|| {
            let mut n = 0;
            while !streaming_done.load(std::sync::atomic::Ordering::Acquire) || n < 100 {
                write(&engine, key_at(written_token(n)), cell_of(written_token(n)));
                n += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            n
        });
        let streams: Vec<_> = (0..4)
            .map(|index| {
                let engine = &engine;
                scope.spawn(move || {
                    for file in streamed(index) {
                        engine.ingest(&borrowed(&file)).expect("ingest");
                    }
                })
            })
            .collect();
        for stream in streams {
            stream.join().expect("stream");
        }
        streaming_done.store(true, std::sync::atomic::Ordering::Release);
        writes.join().expect("writes")
    });
    for index in 0..4 {
        let (lower, upper) = range(index);
        let expected: Vec<_> = streamed(index).into_iter().flatten().collect();
        assert_eq!(stored(&engine, &lower, &upper), expected, "range {index}");
    }
    let (lower, upper) = range(4);
    let expected: Vec<_> = (0..written).map(|n| cell_at(written_token(n))).collect();
    assert_eq!(stored(&engine, &lower, &upper), expected);
}
