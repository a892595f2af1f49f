use super::*;

#[test]
fn a_udt_value_may_lack_its_trailing_fields_and_one_field_is_read_alone() {
    let address = CqlType::Udt(Box::new(crate::types::UserType {
        keyspace: "ks".into(),
        name: "address".into(),
        fields: vec![
            ("street".into(), CqlType::Text),
            ("zip".into(), CqlType::Int),
            ("city".into(), CqlType::Text),
        ],
        frozen: true,
    }));
    // Written before `ALTER TYPE address ADD city text`.
    let old = Value::Tuple(vec![Some(Value::Text("Main".into())), None]).serialize();
    assert_eq!(
        Value::deserialize(&address, &old).unwrap(),
        Value::Tuple(vec![Some(Value::Text("Main".into())), None, None])
    );
    assert_eq!(tuple_element(&old, 0), Some(b"Main".to_vec()));
    assert_eq!(tuple_element(&old, 1), None);
    assert_eq!(tuple_element(&old, 2), None);
    let too_long = Value::Tuple(vec![Some(Value::Int(1)); 4]).serialize();
    assert!(Value::deserialize(&address, &too_long).is_err());
}

#[test]
fn bytes_called_canonical_round_trip_unchanged_and_the_others_do_not() {
    let cases: &[(&str, &[u8])] = &[
        ("blob", b""),
        ("blob", b"\xff\x00"),
        ("text", "héllo".as_bytes()),
        ("text", b"\xff"),
        ("ascii", b"plain"),
        ("ascii", "é".as_bytes()),
        ("int", &[0, 0, 0, 7]),
        ("int", &[0, 7]),
        ("int", b""),
        ("bigint", &[1; 8]),
        ("time", &[0; 8]),
        ("time", &[0x7f; 8]),
        ("timeuuid", &[0x10; 16]),
        ("timeuuid", &[0x40; 16]),
        ("inet", &[127, 0, 0, 1]),
        ("inet", &[127, 0, 1]),
        // Valid, but read back as another encoding of the same value.
        ("boolean", &[2]),
        ("varint", &[0, 1]),
    ];
    for (name, bytes) in cases {
        let cql_type = CqlType::parse(name).unwrap();
        let unchanged =
            Value::deserialize(&cql_type, bytes).is_ok_and(|value| value.serialize() == *bytes);
        assert_eq!(
            Value::is_canonical_serialized(&cql_type, bytes),
            unchanged,
            "{name} {bytes:?}"
        );
    }
}

fn round_trip(cql_type: &str, value: Value) {
    let cql_type = CqlType::parse(cql_type).unwrap();
    let bytes = value.serialize();
    assert_eq!(Value::deserialize(&cql_type, &bytes).unwrap(), value);
}

#[test]
fn values_round_trip() {
    round_trip("int", Value::Int(-7));
    round_trip("text", Value::Text("héllo".into()));
    round_trip(
        "varint",
        Value::Varint(BigInt::from(-123456789012345678i64) * 1000),
    );
    round_trip(
        "decimal",
        Value::Decimal {
            unscaled: BigInt::from(31415),
            scale: 4,
        },
    );
    round_trip(
        "duration",
        Value::Duration {
            months: 14,
            days: -3,
            nanoseconds: 3_600_000_000_001,
        },
    );
    round_trip("list<int>", Value::List(vec![Value::Int(3), Value::Int(1)]));
    round_trip(
        "map<text, int>",
        Value::Map(vec![(Value::Text("a".into()), Value::Int(1))]),
    );
    round_trip(
        "frozen<tuple<int, text>>",
        Value::Tuple(vec![Some(Value::Int(1)), None]),
    );
}

#[test]
fn malformed_values_are_errors() {
    assert!(Value::deserialize(&CqlType::Int, &[1, 2, 3]).is_err());
    assert!(Value::deserialize(&CqlType::Text, &[0xff, 0xfe]).is_err());
    assert!(Value::deserialize(&CqlType::parse("list<int>").unwrap(), &[0, 0, 0, 9]).is_err());
    assert!(Value::deserialize(&CqlType::Duration, &[0xff]).is_err());
}

#[test]
fn vectors_of_fixed_width_elements_are_their_elements_back_to_back() {
    let floats = Value::Vector(vec![Value::Float(1.0), Value::Float(-2.5)]);
    let bytes = floats.serialize();
    assert_eq!(
        bytes,
        [1.0f32.to_be_bytes(), (-2.5f32).to_be_bytes()].concat()
    );
    round_trip("vector<float, 2>", floats);
    let short = Value::deserialize(&CqlType::parse("vector<float, 3>").unwrap(), &bytes);
    assert!(short.unwrap_err().0.contains("Expected 12 bytes"));
}

#[test]
fn vectors_of_variable_width_elements_carry_a_vint_length_each() {
    let long_text = "x".repeat(200);
    let texts = Value::Vector(vec![
        Value::Text("ab".into()),
        Value::Text(long_text.clone()),
    ]);
    let bytes = texts.serialize();
    // 2 fits one byte; 200 needs the two-byte form (0b10 prefix).
    assert_eq!(&bytes[..3], &[2, b'a', b'b']);
    assert_eq!(&bytes[3..5], &[0x80, 200]);
    round_trip("vector<text, 2>", texts);
    let vector_type = CqlType::parse("vector<text, 3>").unwrap();
    assert!(Value::deserialize(&vector_type, &bytes).is_err());
    let one = CqlType::parse("vector<text, 1>").unwrap();
    assert!(Value::deserialize(&one, &bytes).is_err());
    round_trip(
        "vector<frozen<list<int>>, 1>",
        Value::Vector(vec![Value::List(vec![Value::Int(4)])]),
    );
}

#[test]
fn decimals_compare_by_magnitude() {
    let one_point_five = Value::Decimal {
        unscaled: BigInt::from(15),
        scale: 1,
    };
    let one_point_twenty = Value::Decimal {
        unscaled: BigInt::from(120),
        scale: 2,
    };
    assert_eq!(one_point_five.compare(&one_point_twenty), Ordering::Greater);
}
