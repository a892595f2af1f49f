//! Ranges streamed in as files, staged writes and the store's estimates.

use super::*;

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
fn a_file_streamed_in_batches_holds_every_batch_and_one_dropped_unfinished_adds_nothing() {
    // A receiving node builds each file from chunks as they arrive (`streamed_file`).
    with_each_engine(|engine| {
        let (lower, upper) = keys::token_range(&TABLE, None, Token(5));
        let cells: Vec<(Vec<u8>, Vec<u8>)> = (0..300u32)
            .map(|row| {
                let key = row_key(b"p", &row.to_be_bytes(), "v");
                let value = format!("row {row}").into_bytes();
                (key, Cell::live(WriteTimestamp(1), value).encode())
            })
            .collect();
        let mut abandoned = engine.streamed_file();
        abandoned.add(&borrowed(&cells[..100])).expect("add");
        drop(abandoned);
        assert!(
            stored(engine, &lower, &upper).is_empty(),
            "a file dropped unfinished is not added"
        );
        let mut file = engine.streamed_file();
        for batch in cells.chunks(64) {
            file.add(&borrowed(batch)).expect("add");
        }
        file.add(&[]).expect("an empty batch adds nothing");
        file.finish().expect("finish");
        assert_eq!(stored(engine, &lower, &upper), cells);
        // A file given no entries adds nothing and is no error.
        engine.streamed_file().finish().expect("an empty file");
        assert_eq!(stored(engine, &lower, &upper), cells);
    });
}

#[test]
fn rocksdb_leaves_no_file_behind_for_a_stream_that_was_not_finished() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).expect("open");
    let cells = [(
        row_key(b"p", &1u32.to_be_bytes(), "v"),
        Cell::live(WriteTimestamp(1), b"v".to_vec()).encode(),
    )];
    let mut file = engine.streamed_file();
    file.add(&borrowed(&cells)).expect("add");
    let ingest_dir = directory.path().join("ingest");
    let files_in = |dir: &std::path::Path| std::fs::read_dir(dir).map_or(0, |d| d.count());
    assert_eq!(files_in(&ingest_dir), 1, "the file being built");
    drop(file);
    assert_eq!(files_in(&ingest_dir), 0);
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
