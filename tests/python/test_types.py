"""Every native type, collections, frozen collections and tuples round-trip through the
driver, as literals and as bound values, and as clustering keys in the right order."""

import datetime
import decimal
import ipaddress
import uuid

import pytest
from cassandra.util import Date, Duration, Time

VALUES = {
    "ascii": ("'abc'", "abc"),
    "bigint": ("-9000000000", -9000000000),
    "blob": ("0xcafe", b"\xca\xfe"),
    "boolean": ("true", True),
    "date": ("'2021-05-06'", Date(datetime.date(2021, 5, 6))),
    "decimal": ("3.25", decimal.Decimal("3.25")),
    "double": ("2.5e10", 2.5e10),
    "duration": ("1h30m", Duration(0, 0, 5_400_000_000_000)),
    "float": ("1.5", 1.5),
    "inet": ("'192.168.1.2'", "192.168.1.2"),
    "int": ("-42", -42),
    "smallint": ("300", 300),
    "text": ("'héllo'", "héllo"),
    "time": ("'01:02:03.5'", Time(3_723_500_000_000)),
    "timestamp": ("'2020-01-02 03:04:05+0000'", datetime.datetime(2020, 1, 2, 3, 4, 5)),
    "timeuuid": ("50554d6e-29bb-11e5-b345-feff819cdc9f", uuid.UUID("50554d6e-29bb-11e5-b345-feff819cdc9f")),
    "tinyint": ("-7", -7),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", uuid.UUID("123e4567-e89b-12d3-a456-426614174000")),
    "varchar": ("'v'", "v"),
    "varint": ("123456789012345678901234567890", 123456789012345678901234567890),
}


@pytest.mark.parametrize("cql_type", sorted(VALUES))
def test_native_type_literal_and_bound(session, cql_type):
    literal, expected = VALUES[cql_type]
    session.execute(f"CREATE TABLE t (k int PRIMARY KEY, v {cql_type})")
    session.execute(f"INSERT INTO t (k, v) VALUES (1, {literal})")
    assert session.execute("SELECT v FROM t WHERE k = 1").one().v == expected
    session.execute(session.prepare("INSERT INTO t (k, v) VALUES (?, ?)"), (2, expected))
    assert session.execute("SELECT v FROM t WHERE k = 2").one().v == expected
    session.execute("INSERT INTO t (k, v) VALUES (3, null)")
    assert session.execute("SELECT v FROM t WHERE k = 3").one().v is None


def test_collections_frozen_and_tuples(session):
    session.execute(
        "CREATE TABLE t (k int PRIMARY KEY, l list<text>, s set<int>, m map<text, frozen<list<int>>>, "
        "fl frozen<list<int>>, fs frozen<set<text>>, fm frozen<map<int, text>>, tu frozen<tuple<int, text, boolean>>)"
    )
    session.execute(
        "INSERT INTO t (k, l, s, m, fl, fs, fm, tu) VALUES "
        "(1, ['b', 'a'], {3, 1, 2}, {'x': [1, 2]}, [3, 3], {'z', 'y'}, {2: 'two', 1: 'one'}, (1, 'a', true))"
    )
    row = session.execute("SELECT * FROM t WHERE k = 1").one()
    assert row.l == ["b", "a"]
    assert list(row.s) == [1, 2, 3]
    assert row.m == {"x": [1, 2]}
    assert row.fl == [3, 3]
    assert list(row.fs) == ["y", "z"]
    assert row.fm == {1: "one", 2: "two"}
    assert row.tu == (1, "a", True)
    prepared = session.prepare("INSERT INTO t (k, l, s, m, tu) VALUES (?, ?, ?, ?, ?)")
    session.execute(prepared, (2, ["q"], {9}, {"k": [7]}, (2, None, False)))
    row = session.execute("SELECT l, s, m, tu FROM t WHERE k = 2").one()
    assert (row.l, list(row.s), row.m, row.tu) == (["q"], [9], {"k": [7]}, (2, None, False))


@pytest.mark.parametrize(
    "cql_type,values",
    [
        ("int", [-5, -1, 0, 3, 100]),
        ("bigint", [-(2**40), -1, 0, 2**40]),
        ("text", ["", "a", "a\x00", "ab", "b"]),
        ("double", [-1e300, -2.5, 0.0, 1.0, 1e300]),
        ("timestamp", [datetime.datetime(1960, 1, 1), datetime.datetime(1970, 1, 1), datetime.datetime(2030, 1, 1)]),
        ("varint", [-(10**30), -1, 0, 255, 10**30]),
        ("uuid", [uuid.UUID(int=1), uuid.UUID(int=2**120)]),
        ("blob", [b"", b"\x00", b"\x00\x01", b"\xff"]),
        ("frozen<list<int>>", [[], [1], [1, 2], [2]]),
    ],
)
@pytest.mark.parametrize("order", ["ASC", "DESC"])
def test_clustering_order_for_each_type(session, cql_type, values, order):
    session.execute(f"CREATE TABLE t (k int, c {cql_type}, PRIMARY KEY (k, c)) WITH CLUSTERING ORDER BY (c {order})")
    insert = session.prepare("INSERT INTO t (k, c) VALUES (0, ?)")
    for value in reversed(values):
        session.execute(insert, (value,))
    got = [r.c for r in session.execute("SELECT c FROM t WHERE k = 0")]
    expected = values if order == "ASC" else list(reversed(values))
    if cql_type == "blob":
        got = [bytes(g) for g in got]
    assert got == expected
    # A slice in the middle of the range.
    lower, upper = values[1], values[-2]
    sliced = [r.c for r in session.execute("SELECT c FROM t WHERE k = 0 AND c >= %s AND c <= %s", (lower, upper))]
    if cql_type == "blob":
        sliced = [bytes(g) for g in sliced]
    inner = values[1:-1]
    assert sliced == (inner if order == "ASC" else list(reversed(inner)))


def test_inet_v6_and_cql_functions(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, i inet, u timeuuid, ts timestamp)")
    session.execute("INSERT INTO t (k, i, u, ts) VALUES (1, '::1', now(), toTimestamp(now()))")
    row = session.execute("SELECT i, u, ts, toTimestamp(u) AS from_uuid FROM t WHERE k = 1").one()
    assert ipaddress.ip_address(row.i) == ipaddress.ip_address("::1")
    assert row.u.version == 1
    assert abs((row.from_uuid - row.ts).total_seconds()) < 5
