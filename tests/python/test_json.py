"""JSON in CQL, as Cassandra 5.0 answers it: INSERT JSON (DEFAULT NULL / DEFAULT UNSET,
literal or bound), SELECT JSON, toJson() in selections and fromJson() in terms."""

import datetime
import json
import uuid

import pytest
from cassandra import FunctionFailure, InvalidRequest

TABLE = """CREATE TABLE t (k int PRIMARY KEY, a ascii, big bigint, b blob, flag boolean,
    d date, dec decimal, dbl double, dur duration, f float, ip inet, small smallint,
    txt text, tm time, ts timestamp, tu timeuuid, tiny tinyint, u uuid, vi varint,
    l list<int>, s set<text>, m map<text, int>, mi map<int, text>, tup tuple<int, text>,
    fl frozen<list<int>>)"""

ROW = {
    "k": 1,
    "a": "abc",
    "big": -9000000000,
    "b": "0xcafe",
    "flag": True,
    "d": "2021-05-06",
    "dec": 3.25,
    "dbl": 2.5,
    "dur": "1h30m",
    "f": 1.5,
    "ip": "192.168.1.2",
    "small": 300,
    "txt": "h\u00e9llo \"quoted\"",
    "tm": "01:02:03.500000000",
    "ts": "2020-01-02 03:04:05.000Z",
    "tu": "50554d6e-29bb-11e5-b345-feff819cdc9f",
    "tiny": -7,
    "u": "123e4567-e89b-12d3-a456-426614174000",
    "vi": 12345678901234567890,
    "l": [3, 1, 2],
    "s": ["a", "b"],
    "m": {"x": 1, "y": 2},
    "mi": {"1": "one", "2": "two"},
    "tup": [1, "t"],
    "fl": [5, 6],
}


@pytest.fixture
def table(session):
    session.execute(TABLE)
    return session


def select_json(session, query):
    """The rows of a SELECT JSON, each parsed from its one `[json]` column."""
    result = session.execute(query)
    assert result.column_names == ["[json]"]
    return [json.loads(r[0]) for r in result]


def test_insert_json_then_select_json_gives_back_every_type(table):
    table.execute(f"INSERT INTO t JSON '{json.dumps(ROW).replace(chr(39), chr(39) * 2)}'")
    (row,) = select_json(table, "SELECT JSON * FROM t WHERE k = 1")
    assert row == ROW
    typed = table.execute("SELECT ts, b, l, m, vi FROM t WHERE k = 1").one()
    assert typed.ts == datetime.datetime(2020, 1, 2, 3, 4, 5)
    assert typed.b == b"\xca\xfe"
    assert typed.l == [3, 1, 2]
    assert typed.m == {"x": 1, "y": 2}
    assert typed.vi == 12345678901234567890


def test_the_result_column_is_named_json_and_is_text(table):
    table.execute("INSERT INTO t (k, txt) VALUES (1, 'x')")
    result = table.execute("SELECT JSON k, txt FROM t WHERE k = 1")
    assert result.column_names == ["[json]"]
    assert result.column_types[0].typename == "varchar"
    assert json.loads(result.one()[0]) == {"k": 1, "txt": "x"}


def test_missing_columns_are_null_by_default_and_kept_with_default_unset(table):
    table.execute("INSERT INTO t (k, txt, small, l) VALUES (1, 'old', 5, [1])")
    table.execute("""INSERT INTO t JSON '{"k": 1, "txt": "new"}' DEFAULT UNSET""")
    row = table.execute("SELECT txt, small, l FROM t WHERE k = 1").one()
    assert (row.txt, row.small, row.l) == ("new", 5, [1])
    table.execute("""INSERT INTO t JSON '{"k": 1, "txt": "newer"}' DEFAULT NULL""")
    row = table.execute("SELECT txt, small, l FROM t WHERE k = 1").one()
    assert (row.txt, row.small, row.l) == ("newer", None, None)
    table.execute("""INSERT INTO t JSON '{"k": 1, "small": 9}'""")
    row = table.execute("SELECT txt, small FROM t WHERE k = 1").one()
    assert (row.txt, row.small) == (None, 9)


def test_a_prepared_insert_json_binds_the_text(table):
    insert = table.prepare("INSERT INTO t JSON ?")
    table.execute(insert, [json.dumps({"k": 7, "big": "42", "flag": "true", "ts": 1577934245000})])
    row = table.execute("SELECT big, flag, ts FROM t WHERE k = 7").one()
    assert (row.big, row.flag) == (42, True)
    assert row.ts == datetime.datetime(2020, 1, 2, 3, 4, 5)


def test_tojson_in_a_selection(table):
    table.execute("INSERT INTO t (k, l, m, ts, txt) VALUES (1, [1, 2], {'a': 1}, 0, 'x')")
    row = table.execute("SELECT toJson(l), toJson(m), toJson(ts), toJson(txt), toJson(dbl) FROM t WHERE k = 1").one()
    assert list(row) == ["[1, 2]", '{"a": 1}', '"1970-01-01 00:00:00.000Z"', '"x"', "null"]
    result = table.execute("SELECT toJson(k) FROM t WHERE k = 1")
    assert result.column_names == ["system.tojson(k)"]


def test_select_json_names_keys_as_the_selection_names_them(session):
    session.execute('CREATE TABLE q (k int PRIMARY KEY, "MixedCase" int, v text)')
    session.execute("""INSERT INTO q JSON '{"k": 1, "\\"MixedCase\\"": 5, "V": "lower"}'""")
    (row,) = select_json(session, 'SELECT JSON k, "MixedCase", v AS alias, writetime(v) FROM q WHERE k = 1')
    assert set(row) == {"k", '"MixedCase"', "alias", "writetime(v)"}
    assert (row["k"], row['"MixedCase"'], row["alias"]) == (1, 5, "lower")
    assert isinstance(row["writetime(v)"], int)


def test_fromjson_in_values_and_assignments(table):
    table.execute("""INSERT INTO t (k, l, m, u) VALUES (2, fromJson('[3, 4]'), fromJson('{"b": 2}'),
                     fromJson('"123e4567-e89b-12d3-a456-426614174000"'))""")
    table.execute("""UPDATE t SET s = fromJson('["z", "y", "z"]'), txt = fromJson('null') WHERE k = 2""")
    row = table.execute("SELECT l, m, s, u, txt FROM t WHERE k = 2").one()
    assert (row.l, row.m, row.s) == ([3, 4], {"b": 2}, {"y", "z"})
    assert row.u == uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
    assert row.txt is None
    prepared = table.prepare("UPDATE t SET mi = fromJson(?) WHERE k = 2")
    table.execute(prepared, ['{"7": "seven"}'])
    assert table.execute("SELECT mi FROM t WHERE k = 2").one().mi == {7: "seven"}


def test_aggregates_come_back_as_json(table):
    for k in range(3):
        table.execute(f"INSERT INTO t (k, small) VALUES ({k}, {k * 10})")
    (row,) = select_json(table, "SELECT JSON count(*), max(small) FROM t")
    assert row == {"count": 3, "system.max(small)": 20}


@pytest.mark.parametrize("statement, message", [
    ("""INSERT INTO t JSON '{"k": 1, "nope": 2}'""", "unrecognized column"),
    ("""INSERT INTO t JSON '{"k": 1, "txt": }'""", "Could not decode JSON"),
    ("""INSERT INTO t JSON '[1, 2]'""", "Could not decode JSON string as a map"),
    ("""INSERT INTO t JSON '{"k": "one"}'""", "Error decoding JSON value for k: Unable to make int from 'one'"),
    ("""INSERT INTO t JSON '{"k": 1, "small": 70000}'""", "Unable to make short from '70000'"),
    ("""INSERT INTO t JSON '{"k": 1, "b": "cafe"}'""", "0x"),
    ("""INSERT INTO t JSON '{"txt": "no key"}'""", "Invalid null value in condition for column k"),
])
def test_bad_json_is_an_invalid_request_that_says_why(table, statement, message):
    with pytest.raises(InvalidRequest) as refused:
        table.execute(statement)
    assert message in str(refused.value)


def test_insert_json_takes_conditions_and_ttl(table):
    applied = table.execute("""INSERT INTO t JSON '{"k": 3, "txt": "first"}' IF NOT EXISTS USING TTL 1000""").one()
    assert applied[0] is True
    again = table.execute("""INSERT INTO t JSON '{"k": 3, "txt": "second"}' IF NOT EXISTS""").one()
    assert again[0] is False
    row = table.execute("SELECT txt, ttl(txt) FROM t WHERE k = 3").one()
    assert row.txt == "first" and 0 < row[1] <= 1000


def test_fromjson_of_a_value_it_cannot_read_is_a_function_failure(table):
    with pytest.raises(FunctionFailure) as failed:
        table.execute("""INSERT INTO t (k, l) VALUES (1, fromJson('{"not": "a list"}'))""")
    assert "Expected a list" in str(failed.value)
    with pytest.raises(FunctionFailure):
        table.execute("INSERT INTO t (k, txt) VALUES (1, fromJson('not json'))")
