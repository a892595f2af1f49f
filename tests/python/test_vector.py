"""The vector type of Cassandra 5.0, `vector<T, n>`: stored and returned in Cassandra's
wire format (fixed-width elements back to back, others each with a vint length), checked
for its dimension with Cassandra's message, shown by the schema tables and DESCRIBE, in
JSON, and scored by the similarity functions. Runs against Cassandra too
(`--against-cassandra`)."""

import json

import pytest
from cassandra import InvalidRequest


def test_a_float_vector_is_written_and_read_back(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 3>)")
    session.execute("INSERT INTO t (k, v) VALUES (1, [1.0, 2.5, -3])")
    insert = session.prepare("INSERT INTO t (k, v) VALUES (?, ?)")
    session.execute(insert, (2, [0.5, 0.25, 0.125]))
    rows = {row.k: row.v for row in session.execute("SELECT k, v FROM t")}
    assert rows == {1: [1.0, 2.5, -3.0], 2: [0.5, 0.25, 0.125]}
    select = session.prepare("SELECT v FROM t WHERE k = ?")
    assert session.execute(select, (2,)).one().v == [0.5, 0.25, 0.125]


def test_vectors_of_variable_width_elements_round_trip(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, words vector<text, 2>, lists vector<frozen<list<int>>, 2>)")
    long_word = "w" * 300
    session.execute(session.prepare("INSERT INTO t (k, words, lists) VALUES (?, ?, ?)"),
                    (1, ["a", long_word], [[1, 2], [3]]))
    session.execute("INSERT INTO t (k, words) VALUES (2, ['x', 'yz'])")
    row = session.execute("SELECT words, lists FROM t WHERE k = 1").one()
    assert row.words == ["a", long_word]
    assert row.lists == [[1, 2], [3]]
    assert session.execute("SELECT words FROM t WHERE k = 2").one().words == ["x", "yz"]


def test_a_literal_of_the_wrong_dimension_is_refused(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 3>)")
    with pytest.raises(InvalidRequest) as refused:
        session.execute("INSERT INTO t (k, v) VALUES (1, [1.0, 2.0])")
    assert "Invalid vector literal for v of type vector<float, 3>; expected 3 elements, but given 2" in str(refused.value)
    with pytest.raises(InvalidRequest):
        session.execute("INSERT INTO t (k, v) VALUES (1, [1.0, 2.0, 3.0, 4.0])")
    assert list(session.execute("SELECT * FROM t")) == []


def test_a_vector_of_no_dimension_cannot_be_declared(session):
    with pytest.raises(InvalidRequest) as refused:
        session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 0>)")
    assert "vectors may only have positive dimensions; given 0" in str(refused.value)


def test_the_schema_tables_and_describe_show_the_vector_type(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 3>)")
    keyspace = session.keyspace
    column = session.execute(
        "SELECT type FROM system_schema.columns WHERE keyspace_name = %s AND table_name = 't' AND column_name = 'v'",
        (keyspace,)).one()
    assert column.type == "vector<float, 3>"
    session.execute("ALTER TABLE t ADD w vector<int, 2>")
    session.execute("INSERT INTO t (k, w) VALUES (1, [7, 8])")
    assert session.execute("SELECT w FROM t WHERE k = 1").one().w == [7, 8]


def test_vectors_in_json(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 2>)")
    session.execute("""INSERT INTO t JSON '{"k": 1, "v": [1.5, -2.0]}'""")
    assert session.execute("SELECT v FROM t WHERE k = 1").one().v == [1.5, -2.0]
    document = json.loads(session.execute("SELECT JSON k, v FROM t").one()[0])
    assert document == {"k": 1, "v": [1.5, -2.0]}
    with pytest.raises(InvalidRequest):
        session.execute("""INSERT INTO t JSON '{"k": 2, "v": [1.5]}'""")


def test_similarity_functions_score_a_column_against_a_literal(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v vector<float, 2>)")
    session.execute("INSERT INTO t (k, v) VALUES (1, [1.0, 0.0])")
    session.execute("INSERT INTO t (k, v) VALUES (2, [0.0, 1.0])")
    session.execute("INSERT INTO t (k, v) VALUES (3, [0.0, 0.0])")

    def scores(function, literal, keys=(1, 2)):
        return [session.execute(f"SELECT {function}(v, {literal}) FROM t WHERE k = {k}").one()[0] for k in keys]

    assert scores("similarity_cosine", "[1.0, 0.0]") == [1.0, 0.5]
    assert scores("similarity_euclidean", "[1.0, 0.0]") == [1.0, pytest.approx(1 / 3)]
    assert scores("similarity_dot_product", "[1.0, 0.0]") == [1.0, 0.5]
    # Either argument may be the literal.
    row = session.execute("SELECT similarity_euclidean([0.0, 1.0], v) FROM t WHERE k = 2").one()
    assert row[0] == 1.0
    with pytest.raises(InvalidRequest) as zero:
        session.execute("SELECT similarity_cosine(v, [1.0, 0.0]) FROM t WHERE k = 3")
    assert "all-zero vectors" in str(zero.value)
    with pytest.raises(InvalidRequest):
        session.execute("SELECT similarity_cosine(v, [1.0, 0.0, 2.0]) FROM t WHERE k = 1")
    with pytest.raises(InvalidRequest):
        session.execute("SELECT similarity_cosine(k, [1.0]) FROM t WHERE k = 1")


def test_cqlsh_describes_and_prints_vectors(node):
    from test_cqlsh import cqlsh
    result = cqlsh(node, "CREATE KEYSPACE IF NOT EXISTS vector_ks WITH replication = "
                         "{'class': 'SimpleStrategy', 'replication_factor': 1};"
                         "CREATE TABLE IF NOT EXISTS vector_ks.items (id int PRIMARY KEY, embedding vector<float, 3>);"
                         "INSERT INTO vector_ks.items (id, embedding) VALUES (1, [0.5, 1.5, 2.5]);"
                         "DESCRIBE TABLE vector_ks.items;"
                         "SELECT * FROM vector_ks.items;")
    assert result.returncode == 0, result.stderr
    assert "embedding vector<float, 3>" in result.stdout
    assert "[0.5, 1.5, 2.5]" in result.stdout
