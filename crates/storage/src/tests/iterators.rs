//! Pooled partition iterators and reads of memory only.

use super::*;

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
