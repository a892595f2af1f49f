//! Fuzzing what this crate decodes from bytes a peer or the disk hands it: stored cells,
//! values of every type (as bound by clients and stored in cells), clustering components
//! and storage keys. Each must answer with a value or an error, never panic, and allocate
//! in proportion to its input. `cargo test -p shoal-model fuzz` runs a short round; the
//! long run is `PROPTEST_CASES=1000000 cargo test --release -p shoal-model fuzz`.

use crate::clustering::decode_component;
use crate::keys;
use crate::{Cell, CqlType, Value, WriteTimestamp};
use proptest::collection::vec;
use proptest::prelude::*;

fn types() -> Vec<CqlType> {
    let native = [
        "ascii",
        "bigint",
        "blob",
        "boolean",
        "decimal",
        "double",
        "duration",
        "float",
        "inet",
        "int",
        "smallint",
        "text",
        "time",
        "timestamp",
        "timeuuid",
        "tinyint",
        "uuid",
        "varint",
        "date",
    ];
    let mut all: Vec<CqlType> = native
        .iter()
        .filter_map(|name| CqlType::native_from_name(name))
        .collect();
    let int = Box::new(CqlType::Int);
    let text = Box::new(CqlType::Text);
    all.push(CqlType::List {
        element: text.clone(),
        frozen: true,
    });
    all.push(CqlType::Set {
        element: Box::new(CqlType::Decimal),
        frozen: true,
    });
    all.push(CqlType::Map {
        key: text,
        value: Box::new(CqlType::List {
            element: int.clone(),
            frozen: true,
        }),
        frozen: true,
    });
    all.push(CqlType::Tuple(vec![
        CqlType::Int,
        CqlType::Varint,
        CqlType::Uuid,
    ]));
    all.push(CqlType::Vector {
        element: Box::new(CqlType::Float),
        dimension: 3,
    });
    all.push(CqlType::Vector {
        element: Box::new(CqlType::Text),
        dimension: 2,
    });
    all.push(CqlType::Udt(Box::new(crate::types::UserType {
        keyspace: "ks".into(),
        name: "address".into(),
        fields: vec![
            ("street".into(), CqlType::Text),
            ("zip".into(), CqlType::Int),
        ],
        frozen: true,
    })));
    all
}

#[test]
fn every_type_is_fuzzed() {
    assert_eq!(types().len(), 26, "a native type name was not recognised");
}

proptest! {
    #[test]
    fn stored_cells_decode_or_are_refused(bytes in vec(any::<u8>(), 0..64)) {
        let _ = Cell::decode(&bytes);
    }

    #[test]
    fn mutated_cells_decode_or_are_refused(
        ttl in 0i32..1000,
        value in vec(any::<u8>(), 0..16),
        flips in vec((any::<usize>(), any::<u8>()), 1..4),
        keep in 0usize..48,
    ) {
        let mut bytes = Cell::with_ttl(WriteTimestamp(42), value, ttl, 1_000).encode();
        for (position, byte) in flips {
            let index = position % bytes.len();
            bytes[index] = byte;
        }
        bytes.truncate(keep);
        let _ = Cell::decode(&bytes);
    }

    #[test]
    fn values_of_every_type_deserialize_or_are_refused(which in 0usize..25, bytes in vec(any::<u8>(), 0..64)) {
        let cql_type = &types()[which];
        let _ = Value::deserialize(cql_type, &bytes);
        let _ = decode_component(&bytes, cql_type, false);
        let _ = decode_component(&bytes, cql_type, true);
    }

    #[test]
    fn storage_keys_parse_or_are_refused(bytes in vec(any::<u8>(), 0..80)) {
        if let Some((_, rest)) = keys::split_at_partition_end(&bytes) {
            let _ = keys::split_row_key(rest);
            let _ = keys::parse_range_tombstone(rest);
            if let Some((_, _, part)) = keys::split_row_key(rest) {
                let _ = keys::parse_column_part(part);
            }
        }
        let _ = keys::parse_column_part(&bytes);
    }
}
