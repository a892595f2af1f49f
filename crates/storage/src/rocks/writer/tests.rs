use super::*;

/// A writer over a fresh store of nothing but the data family.
fn writer_in(directory: &std::path::Path) -> Arc<Writer> {
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    let mut data = rocksdb::Options::default();
    data.set_merge_operator_associative("last_write_wins", super::super::merge_last_write_wins);
    let family = rocksdb::ColumnFamilyDescriptor::new(super::super::DATA_FAMILY, data);
    let db = DB::open_cf_descriptors(&options, directory, [family]).expect("open");
    Writer::new(Arc::new(db), super::super::DATA_FAMILY)
}

fn one_entry() -> Entries {
    vec![(b"key".to_vec(), b"value".to_vec())]
}

#[test]
fn a_caller_applies_its_batch_while_another_caller_is_applying_one() {
    // Connections served on different threads write at once; each applies its own
    // batch (RocksDB groups them) instead of handing it to the writer thread.
    let directory = tempfile::tempdir().expect("temporary directory");
    let writer = writer_in(directory.path());
    let another_applier = writer.applier.read();
    let outcome = writer.try_apply_inline(one_entry().iter());
    assert!(matches!(outcome, Inline::Applied(Ok(()))));
    drop(another_applier);
}

#[test]
fn a_caller_leaves_its_batch_to_the_writer_thread_while_the_applier_is_held_exclusively() {
    // Collapsing a hot key, staging a range...: no write may run beside them.
    let directory = tempfile::tempdir().expect("temporary directory");
    let writer = writer_in(directory.path());
    let exclusive = writer.applier.write();
    let outcome = writer.try_apply_inline(one_entry().iter());
    assert!(matches!(outcome, Inline::Declined));
    drop(exclusive);
    let outcome = writer.try_apply_inline(one_entry().iter());
    assert!(matches!(outcome, Inline::Applied(Ok(()))));
}

#[test]
fn a_key_is_hot_at_every_eighth_write_with_other_keys_written_between() {
    let counts = WriteCounts::new();
    let mut hot_writes = Vec::new();
    for write in 1..=24u32 {
        for other in 0..20u32 {
            // Other keys in between count in their own slots (none of these shares the
            // hot key's slot, which would start its count over).
            counts.record(format!("other-{write}-{other}").as_bytes());
        }
        if counts.record(b"hot") {
            hot_writes.push(write);
        }
    }
    assert_eq!(hot_writes, [8, 16, 24]);
}

#[test]
fn keys_written_fewer_times_than_the_threshold_never_turn_hot() {
    let counts = WriteCounts::new();
    for round in 0..COLLAPSE_AFTER_OPERANDS - 1 {
        for key in 0..1_000u32 {
            assert!(
                !counts.record(&key.to_be_bytes()),
                "key {key} hot after {} writes",
                round + 1
            );
        }
    }
}
