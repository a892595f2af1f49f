//! Hot keys, concurrent writers, deferred writes and truncation.

use super::*;

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
