//! One suite every [`Engine`] passes, run against [`MemoryEngine`] and [`RocksEngine`].

mod iterators;
mod model;
mod purge;
mod streaming;
mod writes;

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
