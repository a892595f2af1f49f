//! Tombstones and overwritten collections purged by compaction, never too early.

use super::*;

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
