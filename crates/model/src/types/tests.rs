use super::*;

#[test]
fn type_text_round_trips() {
    for text in [
        "int",
        "text",
        "list<int>",
        "frozen<set<text>>",
        "map<text, frozen<list<int>>>",
        "frozen<tuple<int, text>>",
        "vector<float, 3>",
        "vector<frozen<list<int>>, 2>",
    ] {
        assert_eq!(CqlType::parse(text).unwrap().to_string(), text);
    }
    assert_eq!(CqlType::parse("varchar").unwrap(), CqlType::Text);
    assert!(CqlType::parse("list<list<int>>").is_err());
    assert_eq!(
        CqlType::parse("frozen<ks.address>").unwrap(),
        CqlType::UdtName {
            keyspace: Some("ks".into()),
            name: "address".into(),
            frozen: true
        }
    );
    assert_eq!(
        CqlType::parse("list<address>").unwrap_err(),
        "Non-frozen UDTs are not allowed inside collections: list<address>"
    );
    assert_eq!(
        CqlType::parse("vector<float, 0>").unwrap_err(),
        "vectors may only have positive dimensions; given 0"
    );
    assert!(CqlType::parse("vector<float>").is_err());
    assert!(CqlType::parse("vector<counter, 2>").is_err());
}

#[test]
fn vectors_of_fixed_width_elements_have_a_fixed_width() {
    let floats = CqlType::parse("vector<float, 3>").unwrap();
    assert_eq!(floats.fixed_width(), Some(12));
    assert_eq!(
        CqlType::parse("vector<text, 3>").unwrap().fixed_width(),
        None
    );
    assert_eq!(
        floats.marshal_class(),
        "org.apache.cassandra.db.marshal.VectorType(org.apache.cassandra.db.marshal.FloatType , 3)"
    );
}
