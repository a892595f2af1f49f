"""Counters on one node: counter tables, `UPDATE … SET c = c + ?`, counter batches, reads,
aggregates and JSON, DELETE, and Cassandra's errors for every invalid mix. Runs against
Cassandra too (`--against-cassandra`). Counters on three nodes and under faults are in
`test_counters_cluster.py`."""

import json
import time

import pytest
from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.protocol import ConfigurationException
from cassandra.query import BatchStatement, BatchType, SimpleStatement


def page_views(session):
    session.execute("CREATE TABLE views (page text, day int, hits counter, bytes counter, PRIMARY KEY (page, day))")


def test_counters_are_incremented_decremented_and_read(session):
    page_views(session)
    session.execute("UPDATE views SET hits = hits + 1 WHERE page = 'home' AND day = 1")
    session.execute("UPDATE views SET hits = hits + 4, bytes = bytes + 100 WHERE page = 'home' AND day = 1")
    session.execute("UPDATE views SET hits = hits - 2 WHERE page = 'home' AND day = 1")
    increment = session.prepare("UPDATE views SET hits = hits + ? WHERE page = ? AND day = ?")
    for day in (1, 2, 2):
        session.execute(increment, (10, "home", day))
    rows = {r.day: (r.hits, r.bytes) for r in session.execute("SELECT day, hits, bytes FROM views WHERE page = 'home'")}
    assert rows == {1: (13, 100), 2: (20, None)}
    # A counter never incremented reads as null; its type is counter (a 64-bit integer).
    result = session.execute("SELECT hits FROM views WHERE page = 'nothing' AND day = 1")
    assert list(result) == []
    session.execute("UPDATE views SET hits = hits - 9223372036854775807 WHERE page = 'big' AND day = 1")
    assert session.execute("SELECT hits FROM views WHERE page = 'big' AND day = 1").one().hits == -9223372036854775807


def test_a_counter_batch_increments_several_rows_and_tables(session):
    page_views(session)
    session.execute("CREATE TABLE totals (page text PRIMARY KEY, hits counter)")
    session.execute(
        "BEGIN COUNTER BATCH "
        "UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1; "
        "UPDATE views SET hits = hits + 2 WHERE page = 'a' AND day = 1; "
        "UPDATE views SET hits = hits + 5 WHERE page = 'b' AND day = 1; "
        "UPDATE totals SET hits = hits + 8 WHERE page = 'all'; "
        "APPLY BATCH")
    batch = BatchStatement(batch_type=BatchType.COUNTER)
    batch.add(session.prepare("UPDATE totals SET hits = hits + ? WHERE page = ?"), (2, "all"))
    session.execute(batch)
    hits = {(r.page, r.day): r.hits for r in session.execute("SELECT page, day, hits FROM views")}
    assert hits == {("a", 1): 3, ("b", 1): 5}
    assert session.execute("SELECT hits FROM totals WHERE page = 'all'").one().hits == 10


def test_counters_are_deleted_by_column_and_by_row(session):
    page_views(session)
    session.execute("UPDATE views SET hits = hits + 3, bytes = bytes + 7 WHERE page = 'a' AND day = 1")
    session.execute("UPDATE views SET hits = hits + 3 WHERE page = 'a' AND day = 2")
    session.execute("DELETE bytes FROM views WHERE page = 'a' AND day = 1")
    row = session.execute("SELECT hits, bytes FROM views WHERE page = 'a' AND day = 1").one()
    assert (row.hits, row.bytes) == (3, None)
    session.execute("DELETE FROM views WHERE page = 'a' AND day = 2")
    assert session.execute("SELECT * FROM views WHERE page = 'a' AND day = 2").one() is None
    session.execute("DELETE FROM views WHERE page = 'a'")
    assert list(session.execute("SELECT * FROM views WHERE page = 'a'")) == []


def test_counters_aggregate_and_read_as_json(session):
    page_views(session)
    for day, hits in ((1, 5), (2, 7), (3, 11)):
        session.execute(f"UPDATE views SET hits = hits + {hits} WHERE page = 'a' AND day = {day}")
    row = session.execute("SELECT sum(hits), max(hits), count(hits) FROM views WHERE page = 'a'").one()
    assert tuple(row) == (23, 11, 3)
    document = json.loads(session.execute("SELECT JSON day, hits FROM views WHERE page = 'a' AND day = 2").one()[0])
    assert document == {"day": 2, "hits": 7}


@pytest.mark.parametrize("statement, message", [
    ("CREATE TABLE bad (k int PRIMARY KEY, c counter, v int)", "Cannot mix counter and non counter columns in the same table"),
    ("CREATE TABLE bad (k counter PRIMARY KEY, c counter)", "counter type is not supported for PRIMARY KEY column 'k'"),
    ("CREATE TABLE bad (k int PRIMARY KEY, c counter) WITH default_time_to_live = 10", "Cannot set default_time_to_live on a table with counters"),
    ("CREATE TABLE bad (k int PRIMARY KEY, c list<counter>)", "Counters are not allowed inside collections: list<counter>"),
    ("INSERT INTO views (page, day, hits) VALUES ('a', 1, 1)", "INSERT statements are not allowed on counter tables, use UPDATE instead"),
    ("UPDATE views SET hits = 5 WHERE page = 'a' AND day = 1", "Cannot set the value of counter column hits (counters can only be incremented/decremented, not set)"),
    ("UPDATE views USING TTL 10 SET hits = hits + 1 WHERE page = 'a' AND day = 1", "Cannot provide custom TTL for counter updates"),
    ("UPDATE views USING TIMESTAMP 10 SET hits = hits + 1 WHERE page = 'a' AND day = 1", "Cannot provide custom timestamp for counter updates"),
    ("UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1 IF hits = 1", "Conditions on counters are not supported"),
    ("DELETE FROM views USING TIMESTAMP 5 WHERE page = 'a' AND day = 1", "Cannot provide custom timestamp for counter updates"),
    ("UPDATE views SET hits = hits + null WHERE page = 'a' AND day = 1", "Invalid null value for counter increment/decrement"),
    ("BEGIN BATCH UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1; APPLY BATCH", "Cannot include a counter statement in a logged batch"),
    ("BEGIN COUNTER BATCH INSERT INTO plain (k, v) VALUES (1, 1); APPLY BATCH", "Cannot include non-counter statement in a counter batch"),
    ("BEGIN UNLOGGED BATCH UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1; INSERT INTO plain (k, v) VALUES (1, 1); APPLY BATCH",
     "Counter and non-counter mutations cannot exist in the same batch"),
])
def test_invalid_counter_statements_get_cassandras_errors(session, statement, message):
    page_views(session)
    session.execute("CREATE TABLE plain (k int PRIMARY KEY, v int)")
    with pytest.raises(InvalidRequest) as refused:
        session.execute(statement)
    assert message in str(refused.value)
    assert list(session.execute("SELECT * FROM views")) == []


@pytest.mark.parametrize("statement, message", [
    ("ALTER TABLE views ADD other int", 'views: Cannot have a non counter column ("other") in a counter table'),
    ("ALTER TABLE plain ADD other counter", 'plain: Cannot have a counter column ("other") in a non counter table'),
])
def test_mixing_counter_and_other_columns_by_alter_table_is_refused(session, statement, message):
    page_views(session)
    session.execute("CREATE TABLE plain (k int PRIMARY KEY, v int)")
    with pytest.raises(ConfigurationException) as refused:
        session.execute(statement)
    assert message in str(refused.value)


def test_a_counters_write_time_is_its_latest_increments(session):
    page_views(session)
    session.execute("UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1")
    row = session.execute("SELECT writetime(hits), ttl(hits) FROM views WHERE page = 'a' AND day = 1").one()
    now_micros = int(time.time() * 1_000_000)
    assert abs(row[0] - now_micros) < 60_000_000
    assert row[1] is None


def test_counter_updates_at_any_are_refused(session):
    page_views(session)
    statement = SimpleStatement("UPDATE views SET hits = hits + 1 WHERE page = 'a' AND day = 1",
                                consistency_level=ConsistencyLevel.ANY)
    with pytest.raises(InvalidRequest) as refused:
        session.execute(statement)
    assert "Consistency level ANY is not yet supported for counter table views" in str(refused.value)


def test_an_unlogged_batch_of_counters_is_applied(session):
    page_views(session)
    session.execute("BEGIN UNLOGGED BATCH UPDATE views SET hits = hits + 2 WHERE page = 'a' AND day = 1; "
                    "UPDATE views SET hits = hits + 3 WHERE page = 'a' AND day = 1; APPLY BATCH")
    assert session.execute("SELECT hits FROM views WHERE page = 'a' AND day = 1").one().hits == 5


def test_static_counters(session):
    session.execute("CREATE TABLE s (k int, c int, total counter static, hits counter, PRIMARY KEY (k, c))")
    session.execute("UPDATE s SET total = total + 5 WHERE k = 1")
    session.execute("UPDATE s SET hits = hits + 1, total = total + 1 WHERE k = 1 AND c = 1")
    rows = list(session.execute("SELECT c, total, hits FROM s WHERE k = 1"))
    assert [(r.c, r.total, r.hits) for r in rows] == [(1, 6, 1)]
