"""Cassandra 5.0's native functions in selections, nested as deep as wanted: math, blob
conversions, CAST, time conversions, collection functions, masking functions, and
functions of aggregates and aggregates of functions — the result column's name, its type
and its value as Cassandra 5.0 gives them (`--against-cassandra` checks that)."""

import datetime
import decimal

import pytest
from cassandra import InvalidRequest
from cassandra.util import Date, SortedSet


@pytest.fixture
def row(session):
    session.execute("""CREATE TABLE t (k int PRIMARY KEY, i int, b bigint, d double, f float, dec decimal,
        vi varint, s smallint, ti tinyint, txt text, bl blob, ts timestamp, tu timeuuid, dt date,
        l list<int>, m map<text, int>, st set<int>)""")
    session.execute("""INSERT INTO t (k, i, b, d, f, dec, vi, s, ti, txt, bl, ts, tu, dt, l, m, st)
        VALUES (1, -7, 12345678901, 2.5, -1.5, 3.14159, 99, 3, -2, 'h\u00e9', 0x0000002a,
        '2024-01-31 12:34:56.789+0000', 50554d6e-29bb-11e5-b345-feff819cdc9f, '2024-02-29',
        [3, 1, 2], {'a': 1, 'b': 5}, {4, 9})""")
    session.execute("INSERT INTO t (k) VALUES (2)")
    return session


# (selector, result column name, CQL type name as the driver reports it, value)
CASES = [
    ("abs(i)", "system.abs(i)", "int", 7),
    ("abs(b)", "system.abs(b)", "bigint", 12345678901),
    ("abs(d)", "system.abs(d)", "double", 2.5),
    ("abs(f)", "system.abs(f)", "float", 1.5),
    ("abs(dec)", "system.abs(dec)", "decimal", decimal.Decimal("3.14159")),
    ("abs(vi)", "system.abs(vi)", "varint", 99),
    ("abs(s)", "system.abs(s)", "smallint", 3),
    ("abs(ti)", "system.abs(ti)", "tinyint", 2),
    ("exp(i)", "system.exp(i)", "int", 0),
    ("exp(d)", "system.exp(d)", "double", 12.182493960703473),
    ("log(i)", "system.log(i)", "int", 0),
    ("log(d)", "system.log(d)", "double", 0.9162907318741551),
    ("log10(d)", "system.log10(d)", "double", 0.3979400086720376),
    ("round(d)", "system.round(d)", "double", 3.0),
    ("round(f)", "system.round(f)", "float", -1.0),
    ("round(i)", "system.round(i)", "int", -7),
    ("round(dec)", "system.round(dec)", "decimal", decimal.Decimal("3")),
    ("intasblob(i)", "system.intasblob(i)", "blob", b"\xff\xff\xff\xf9"),
    ("blobasint(bl)", "system.blobasint(bl)", "int", 42),
    ("bigintasblob(b)", "system.bigintasblob(b)", "blob", b"\x00\x00\x00\x02\xdf\xdc\x1c5"),
    ("textasblob(txt)", "system.textasblob(txt)", "blob", "h\u00e9".encode()),
    ("blobastext(textasblob(txt))", "system.blobastext(system.textasblob(txt))", "varchar", "h\u00e9"),
    ("blobasint(intasblob(i))", "system.blobasint(system.intasblob(i))", "int", -7),
    ("blobasint(i)", "system.blobasint(i)", "int", -7),
    ("round(vi)", "system.round(vi)", "varint", 99),
    ("cast(d as text)", "cast(d as text)", "varchar", "2.5"),
    ("cast(f as text)", "cast(f as text)", "varchar", "-1.5"),
    ("cast(i as text)", "cast(i as text)", "varchar", "-7"),
    ("cast(d as int)", "cast(d as int)", "int", 2),
    ("cast(i as double)", "cast(i as double)", "double", -7.0),
    ("cast(dec as text)", "cast(dec as text)", "varchar", "3.14159"),
    ("cast(ts as date)", "cast(ts as date)", "date", Date(19753)),
    ("cast(ts as text)", "cast(ts as text)", "varchar", "2024-01-31T12:34:56.789Z"),
    ("cast(b as varint)", "cast(b as varint)", "varint", 12345678901),
    ("cast(f as decimal)", "cast(f as decimal)", "decimal", decimal.Decimal("-1.5")),
    ("cast(tu as timestamp)", "cast(tu as timestamp)", "timestamp", datetime.datetime(2015, 7, 14, 0, 0, 18, 805000)),
    ("cast(dt as timestamp)", "cast(dt as timestamp)", "timestamp", datetime.datetime(2024, 2, 29)),
    ("cast(i as bigint)", "cast(i as bigint)", "bigint", -7),
    ("cast(txt as text)", "txt", "varchar", "h\u00e9"),
    ("totimestamp(tu)", "system.totimestamp(tu)", "timestamp", datetime.datetime(2015, 7, 14, 0, 0, 18, 805000)),
    ("todate(tu)", "system.todate(tu)", "date", Date(16630)),
    ("todate(ts)", "system.todate(ts)", "date", Date(19753)),
    ("tounixtimestamp(ts)", "system.tounixtimestamp(ts)", "bigint", 1706704496789),
    ("tounixtimestamp(dt)", "system.tounixtimestamp(dt)", "bigint", 1709164800000),
    ("totimestamp(dt)", "system.totimestamp(dt)", "timestamp", datetime.datetime(2024, 2, 29)),
    ("tounixtimestamp(totimestamp(tu))", "system.tounixtimestamp(system.totimestamp(tu))", "bigint", 1436832018805),
    ("map_keys(m)", "system.map_keys(m)", "set", SortedSet(["a", "b"])),
    ("map_values(m)", "system.map_values(m)", "list", [1, 5]),
    ("collection_count(l)", "system.collection_count(l)", "int", 3),
    ("collection_min(l)", "system.collection_min(l)", "int", 1),
    ("collection_max(st)", "system.collection_max(st)", "int", 9),
    ("collection_sum(l)", "system.collection_sum(l)", "int", 6),
    ("collection_avg(l)", "system.collection_avg(l)", "int", 2),
    ("abs(abs(i))", "system.abs(system.abs(i))", "int", 7),
    ("tojson(abs(i))", "system.tojson(system.abs(i))", "varchar", "7"),
]


def assert_one_column(result, name, type_name, value):
    """The result has one column of that name and type, and its one row that value."""
    assert result.column_names == [name]
    assert result.column_types[0].typename == type_name
    assert result.one()[0] == value


@pytest.mark.parametrize("selector, name, type_name, value", CASES, ids=[c[0] for c in CASES])
def test_a_function_answers_as_cassandra_does(row, selector, name, type_name, value):
    assert_one_column(row.execute(f"SELECT {selector} FROM t WHERE k = 1"), name, type_name, value)


def test_functions_of_null_are_null(row):
    result = row.execute("SELECT abs(i), cast(d as int), intasblob(i), todate(ts), map_keys(m) FROM t WHERE k = 2").one()
    assert list(result) == [None, None, None, None, None]


def test_functions_nest_around_now(row):
    today = row.execute("SELECT todate(now()), tounixtimestamp(now()) FROM t WHERE k = 1").one()
    assert isinstance(today[0], Date)
    assert abs(today[1] - int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)) < 600_000


@pytest.mark.parametrize("selector", ["abs(txt)", "intasblob(b)", "intasblob(txt)", "map_keys(l)", "cast(bl as int)",
                                      "cast(st as text)", "blobastext(i)", "nosuchfunction(i)"])
def test_a_function_given_the_wrong_type_is_refused(row, selector):
    with pytest.raises(InvalidRequest):
        row.execute(f"SELECT {selector} FROM t WHERE k = 1")


def test_a_blob_of_the_wrong_length_is_refused(row):
    with pytest.raises(InvalidRequest):
        row.execute("SELECT blobasbigint(bl) FROM t WHERE k = 1")


def test_functions_in_values(row):
    row.execute("INSERT INTO t (k, bl, i, b) VALUES (3, intasblob(42), blobasint(0x0000002a), abs(-5))")
    assert tuple(row.execute("SELECT bl, i, b FROM t WHERE k = 3").one()) == (b"\x00\x00\x00*", 42, 5)
    prepared = row.prepare("UPDATE t SET bl = bigintasblob(?) WHERE k = 3")
    row.execute(prepared, [1])
    assert row.execute("SELECT bl FROM t WHERE k = 3").one().bl == b"\x00" * 7 + b"\x01"


# Aggregates inside functions and functions inside aggregates, over rows k = 1 and k = 2
# (k = 2 has nulls only, which aggregates skip).
AGGREGATE_CASES = [
    ("abs(max(i))", "system.abs(system.max(i))", "int", 7),
    ("abs(min(i))", "system.abs(system.min(i))", "int", 7),
    ("max(abs(i))", "system.max(system.abs(i))", "int", 7),
    ("round(avg(d))", "system.round(system.avg(d))", "double", 3.0),
    ("tojson(max(b))", "system.tojson(system.max(b))", "varchar", "12345678901"),
    ("count(abs(i))", "system.count(system.abs(i))", "bigint", 1),
    ("sum(abs(s))", "system.sum(system.abs(s))", "smallint", 3),
    ("cast(count(*) as text)", "cast(count as text)", "varchar", "2"),
    ("collection_max(map_values(m))", "system.collection_max(system.map_values(m))", "int", 5),
]


@pytest.mark.parametrize("selector, name, type_name, value", AGGREGATE_CASES, ids=[c[0] for c in AGGREGATE_CASES])
def test_functions_and_aggregates_nest_either_way(row, selector, name, type_name, value):
    assert_one_column(row.execute(f"SELECT {selector} FROM t"), name, type_name, value)


MASK_CASES = [
    ("mask_null(txt)", "system.mask_null(txt)", "varchar", None),
    ("mask_default(txt)", "system.mask_default(txt)", "varchar", "****"),
    ("mask_default(i)", "system.mask_default(i)", "int", 0),
    ("mask_default(d)", "system.mask_default(d)", "double", 0.0),
    ("mask_default(l)", "system.mask_default(l)", "list", []),
    ("mask_replace(i, 99)", "system.mask_replace(i, 99)", "int", 99),
    ("mask_replace(txt, 'x')", "system.mask_replace(txt, 'x')", "varchar", "x"),
    ("mask_inner(txt, 1, 0)", "system.mask_inner(txt, 1, 0)", "varchar", "h*"),
    ("mask_outer(txt, 1, 0, '#')", "system.mask_outer(txt, 1, 0, '#')", "varchar", "#\u00e9"),
    ("mask_hash(i)", "system.mask_hash(i)", "blob",
     bytes.fromhex("f81d728fbe732bf3983cb1966619796aa54b3e09526719a86860b557af9650bc")),
]


@pytest.mark.parametrize("selector, name, type_name, value", MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_masking_functions_hide_a_value_and_keep_its_type(row, selector, name, type_name, value):
    assert_one_column(row.execute(f"SELECT {selector} FROM t WHERE k = 1"), name, type_name, value)


def test_masking_a_null_and_bad_masking_arguments(row):
    masked = row.execute("SELECT mask_default(txt), mask_replace(i, 5), mask_inner(txt, 1, 1), mask_hash(i) "
                         "FROM t WHERE k = 2").one()
    assert list(masked) == ["****", 5, None, None]
    for selector in ["mask_inner(txt, 1)", "mask_inner(i, 1, 1)", "mask_inner(txt, 1, 1, 'ab')", "mask_null()"]:
        with pytest.raises(InvalidRequest):
            row.execute(f"SELECT {selector} FROM t WHERE k = 1")
