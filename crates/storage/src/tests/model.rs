//! Random histories of writes, deletions, flushes, compactions and garbage collection:
//! whatever the engines do to their files, a read returns what the same writes read from
//! an engine that never compacts.

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
