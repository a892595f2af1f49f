"""The CQL language through the Python driver: DDL, DML, SELECT features, batches,
bind markers. Each test runs in a fresh keyspace."""

import time

import pytest
from cassandra import InvalidRequest
from cassandra.query import BatchStatement, BatchType, SimpleStatement


def test_create_table_if_not_exists_and_drop(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    session.execute("CREATE TABLE IF NOT EXISTS t (k int PRIMARY KEY, v text)")
    session.execute("DROP TABLE t")
    session.execute("DROP TABLE IF EXISTS t")
    with pytest.raises(InvalidRequest):
        session.execute("DROP TABLE t")


def test_network_topology_keyspace_and_alter(cluster_session):
    s = cluster_session
    s.execute("CREATE KEYSPACE IF NOT EXISTS nts_ks WITH replication = {'class': 'NetworkTopologyStrategy', 'datacenter1': 1} AND durable_writes = false")
    row = s.execute("SELECT replication, durable_writes FROM system_schema.keyspaces WHERE keyspace_name = 'nts_ks'").one()
    assert row.replication == {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "datacenter1": "1"}
    assert row.durable_writes is False
    s.execute("ALTER KEYSPACE nts_ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
    row = s.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = 'nts_ks'").one()
    assert row.replication["class"] == "org.apache.cassandra.locator.SimpleStrategy"
    s.execute("DROP KEYSPACE nts_ks")


def test_compound_partition_key_and_clustering_order(session):
    session.execute(
        "CREATE TABLE events (day text, kind text, ts int, payload text, PRIMARY KEY ((day, kind), ts)) "
        "WITH CLUSTERING ORDER BY (ts DESC)"
    )
    for ts in range(5):
        session.execute("INSERT INTO events (day, kind, ts, payload) VALUES ('mon', 'a', %s, %s)", (ts, f"p{ts}"))
    rows = session.execute("SELECT ts FROM events WHERE day = 'mon' AND kind = 'a'")
    assert [r.ts for r in rows] == [4, 3, 2, 1, 0]
    rows = session.execute("SELECT ts FROM events WHERE day = 'mon' AND kind = 'a' ORDER BY ts ASC")
    assert [r.ts for r in rows] == [0, 1, 2, 3, 4]
    rows = session.execute("SELECT ts FROM events WHERE day = 'mon' AND kind = 'a' AND ts >= 1 AND ts < 4")
    assert [r.ts for r in rows] == [3, 2, 1]


def test_truncate_and_use(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    session.execute("INSERT INTO t (k, v) VALUES (1, 1)")
    session.execute("TRUNCATE t")
    assert list(session.execute("SELECT * FROM t")) == []
    keyspace = session.keyspace
    session.execute(f"USE {keyspace}")
    session.execute("INSERT INTO t (k, v) VALUES (2, 2)")
    assert session.execute("SELECT v FROM t WHERE k = 2").one().v == 2


def test_last_write_wins_by_timestamp(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    session.execute("INSERT INTO t (k, v) VALUES (1, 'new') USING TIMESTAMP 2000")
    session.execute("INSERT INTO t (k, v) VALUES (1, 'old') USING TIMESTAMP 1000")
    row = session.execute("SELECT v, writetime(v) AS wt FROM t WHERE k = 1").one()
    assert (row.v, row.wt) == ("new", 2000)
    session.execute("DELETE FROM t USING TIMESTAMP 1500 WHERE k = 1")
    assert session.execute("SELECT v FROM t WHERE k = 1").one().v == "new"
    session.execute("DELETE FROM t USING TIMESTAMP 2500 WHERE k = 1")
    assert session.execute("SELECT v FROM t WHERE k = 1").one() is None


def test_writetime_and_ttl_of_a_non_frozen_collection_list_each_element(session):
    session.execute("CREATE TYPE IF NOT EXISTS point (x int, y int)")
    session.execute("CREATE TABLE t (k int PRIMARY KEY, tags set<text>, scores list<int>, attrs map<text, int>, "
                    "at point, v int)")
    session.execute("INSERT INTO t (k, tags, scores, attrs, at, v) VALUES (1, {'a'}, [1], {'m': 1}, {x: 1, y: 0}, 7) "
                    "USING TIMESTAMP 1000 AND TTL 800")
    session.execute("UPDATE t USING TIMESTAMP 2000 AND TTL 500 SET tags = tags + {'b'}, scores = scores + [2], "
                    "attrs['n'] = 2, at.y = 2 WHERE k = 1")
    row = session.execute("SELECT writetime(tags) AS wt, ttl(tags) AS tl, writetime(scores) AS ws, "
                          "writetime(attrs) AS wa, writetime(at) AS wp, ttl(at) AS tp, maxwritetime(tags) AS mt, "
                          "maxwritetime(v) AS mv FROM t WHERE k = 1").one()
    assert row.wt == [1000, 2000]
    assert 790 <= row.tl[0] <= 800 and 490 <= row.tl[1] <= 500
    assert row.ws == [1000, 2000]
    assert row.wa == [1000, 2000]
    assert row.wp == [1000, 2000]
    assert 790 <= row.tp[0] <= 800 and 490 <= row.tp[1] <= 500
    assert (row.mt, row.mv) == (2000, 1000)
    # A collection without cells has no write time.
    session.execute("INSERT INTO t (k, v) VALUES (2, 1)")
    row = session.execute("SELECT writetime(tags) AS wt, maxwritetime(tags) AS mt FROM t WHERE k = 2").one()
    assert (row.wt, row.mt) == (None, None)
    with pytest.raises(InvalidRequest) as refused:
        session.execute("SELECT writetime(k) FROM t")
    assert "Cannot use selection function writetime on PRIMARY KEY part k" in str(refused.value)


def test_ttl_expires_cells_and_rows(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, a text, b text)")
    session.execute("INSERT INTO t (k, a) VALUES (1, 'x') USING TTL 1")
    session.execute("UPDATE t USING TTL 100 SET b = 'y' WHERE k = 2")
    row = session.execute("SELECT ttl(b) AS left FROM t WHERE k = 2").one()
    assert 95 <= row.left <= 100
    time.sleep(2.1)
    assert session.execute("SELECT * FROM t WHERE k = 1").one() is None
    assert session.execute("SELECT b FROM t WHERE k = 2").one().b == "y"


def test_default_time_to_live(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int) WITH default_time_to_live = 1")
    session.execute("INSERT INTO t (k, v) VALUES (1, 1)")
    assert session.execute("SELECT v FROM t WHERE k = 1").one().v == 1
    time.sleep(2.1)
    assert session.execute("SELECT v FROM t WHERE k = 1").one() is None


def test_deletes_cell_row_range_partition(session):
    session.execute("CREATE TABLE t (k int, c int, v text, w text, PRIMARY KEY (k, c))")
    for c in range(6):
        session.execute("INSERT INTO t (k, c, v, w) VALUES (1, %s, 'v', 'w')", (c,))
    session.execute("DELETE v FROM t WHERE k = 1 AND c = 0")
    row = session.execute("SELECT v, w FROM t WHERE k = 1 AND c = 0").one()
    assert (row.v, row.w) == (None, "w")
    session.execute("DELETE FROM t WHERE k = 1 AND c = 1")
    session.execute("DELETE FROM t WHERE k = 1 AND c >= 3 AND c < 5")
    assert [r.c for r in session.execute("SELECT c FROM t WHERE k = 1")] == [0, 2, 5]
    session.execute("DELETE FROM t WHERE k = 1")
    assert list(session.execute("SELECT c FROM t WHERE k = 1")) == []
    # A write newer than the partition deletion is visible again.
    session.execute("INSERT INTO t (k, c, v) VALUES (1, 9, 'again')")
    assert [r.c for r in session.execute("SELECT c FROM t WHERE k = 1")] == [9]


def test_update_without_insert_has_no_row_marker(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    session.execute("UPDATE t SET v = 'x' WHERE k = 1")
    session.execute("DELETE v FROM t WHERE k = 1")
    assert session.execute("SELECT * FROM t WHERE k = 1").one() is None
    session.execute("INSERT INTO t (k, v) VALUES (2, 'x')")
    session.execute("DELETE v FROM t WHERE k = 2")
    assert session.execute("SELECT * FROM t WHERE k = 2").one().v is None


def test_collection_operations(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, l list<int>, s set<text>, m map<text, int>)")
    session.execute("INSERT INTO t (k, l, s, m) VALUES (1, [1, 2], {'a'}, {'x': 1})")
    session.execute("UPDATE t SET l = l + [3], s = s + {'b', 'c'}, m = m + {'y': 2} WHERE k = 1")
    session.execute("UPDATE t SET l = [0] + l WHERE k = 1")
    session.execute("UPDATE t SET s = s - {'a'}, m = m - {'x'} WHERE k = 1")
    session.execute("UPDATE t SET m['z'] = 26, l[1] = 10 WHERE k = 1")
    row = session.execute("SELECT l, s, m FROM t WHERE k = 1").one()
    assert row.l == [0, 10, 2, 3]
    assert set(row.s) == {"b", "c"}
    assert row.m == {"y": 2, "z": 26}
    session.execute("UPDATE t SET l = l - [2] WHERE k = 1")
    session.execute("DELETE m['y'], l[0] FROM t WHERE k = 1")
    row = session.execute("SELECT l, m FROM t WHERE k = 1").one()
    assert row.l == [10, 3]
    assert row.m == {"z": 26}
    session.execute("UPDATE t SET s = {'only'} WHERE k = 1")
    assert set(session.execute("SELECT s FROM t WHERE k = 1").one().s) == {"only"}
    with pytest.raises(InvalidRequest, match="out of bound"):
        session.execute("UPDATE t SET l[7] = 1 WHERE k = 1")


def test_select_features(session):
    session.execute("CREATE TABLE t (k int, c int, v int, s text static, PRIMARY KEY (k, c))")
    for k in range(3):
        session.execute("UPDATE t SET s = %s WHERE k = %s", (f"static{k}", k))
        for c in range(4):
            session.execute("INSERT INTO t (k, c, v) VALUES (%s, %s, %s)", (k, c, k * 10 + c))
    assert [r.c for r in session.execute("SELECT c FROM t WHERE k IN (0, 1) AND c IN (1, 3)")] == [1, 3, 1, 3]
    assert len(list(session.execute("SELECT * FROM t LIMIT 5"))) == 5
    per_partition = list(session.execute("SELECT k, c FROM t PER PARTITION LIMIT 2"))
    assert len(per_partition) == 6 and all(r.c < 2 for r in per_partition)
    assert sorted(r.k for r in session.execute("SELECT DISTINCT k FROM t")) == [0, 1, 2]
    assert session.execute("SELECT count(*) FROM t").one().count == 12
    assert session.execute("SELECT count(*) AS n FROM t WHERE k = 1").one().n == 4
    row = session.execute("SELECT max(v) AS hi, min(v) AS lo, sum(v) AS total FROM t WHERE k = 2").one()
    assert (row.hi, row.lo, row.total) == (23, 20, 86)
    assert session.execute("SELECT s FROM t WHERE k = 2 LIMIT 1").one().s == "static2"
    filtered = list(session.execute("SELECT k, c FROM t WHERE v > 20 ALLOW FILTERING"))
    assert sorted((r.k, r.c) for r in filtered) == [(2, 1), (2, 2), (2, 3)]
    with pytest.raises(InvalidRequest, match="ALLOW FILTERING"):
        session.execute("SELECT * FROM t WHERE v > 20")


def test_token_ranges_cover_the_table_exactly_once(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    for k in range(100):
        session.execute("INSERT INTO t (k, v) VALUES (%s, %s)", (k, k))
    tokens = [r.t for r in session.execute("SELECT token(k) AS t FROM t")]
    assert tokens == sorted(tokens), "full scans return partitions in token order"
    middle = tokens[50]
    low = [r.k for r in session.execute("SELECT k FROM t WHERE token(k) <= %s", (middle,))]
    high = [r.k for r in session.execute("SELECT k FROM t WHERE token(k) > %s", (middle,))]
    assert len(low) == 51 and len(high) == 49
    assert sorted(low + high) == list(range(100))


def test_static_only_partition_is_returned(session):
    session.execute("CREATE TABLE t (k int, c int, v int, s int static, PRIMARY KEY (k, c))")
    session.execute("INSERT INTO t (k, s) VALUES (1, 7)")
    row = session.execute("SELECT * FROM t WHERE k = 1").one()
    assert (row.k, row.c, row.s, row.v) == (1, None, 7, None)


def test_batches_logged_and_unlogged(session):
    session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
    for batch_type in (BatchType.LOGGED, BatchType.UNLOGGED):
        batch = BatchStatement(batch_type=batch_type)
        for c in range(3):
            batch.add(insert, (batch_type.value, c, "x"))
        batch.add(SimpleStatement("DELETE FROM t WHERE k = %s AND c = 0"), (batch_type.value,))
        session.execute(batch)
        assert [r.c for r in session.execute("SELECT c FROM t WHERE k = %s", (batch_type.value,))] == [1, 2]
    session.execute("BEGIN BATCH INSERT INTO t (k, c, v) VALUES (5, 1, 'a'); UPDATE t SET v = 'b' WHERE k = 5 AND c = 2; APPLY BATCH")
    assert [r.v for r in session.execute("SELECT v FROM t WHERE k = 5")] == ["a", "b"]


def test_named_and_positional_bind_markers(session):
    session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
    named = session.prepare("INSERT INTO t (k, c, v) VALUES (:key, :col, :val)")
    session.execute(named, {"key": 1, "col": 2, "val": "named"})
    positional = session.prepare("SELECT v FROM t WHERE k = ? AND c = ?")
    assert session.execute(positional, (1, 2)).one().v == "named"
    in_marker = session.prepare("SELECT c FROM t WHERE k = ? AND c IN ?")
    assert [r.c for r in session.execute(in_marker, (1, [2, 3]))] == [2]
    limit = session.prepare("SELECT c FROM t WHERE k = ? LIMIT ?")
    assert len(list(session.execute(limit, (1, 1)))) == 1


def test_prepared_statements_route_by_partition_key(session):
    session.execute("CREATE TABLE t (a int, b text, c int, v int, PRIMARY KEY ((a, b), c))")
    prepared = session.prepare("SELECT * FROM t WHERE b = ? AND a = ? AND c = ?")
    assert prepared.routing_key_indexes == [1, 0]
    insert = session.prepare("INSERT INTO t (c, b, a, v) VALUES (?, ?, ?, ?)")
    assert insert.routing_key_indexes == [2, 1]


def test_lightweight_transactions_on_one_node(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    assert session.execute("INSERT INTO t (k, v) VALUES (1, 1) IF NOT EXISTS").one().applied
    second = session.execute("INSERT INTO t (k, v) VALUES (1, 2) IF NOT EXISTS").one()
    assert not second.applied and second.v == 1
    assert session.execute("UPDATE t SET v = 3 WHERE k = 1 IF v = 1").one().applied
    assert not session.execute("UPDATE t SET v = 4 WHERE k = 1 IF v = 1").one().applied
    assert session.execute("DELETE FROM t WHERE k = 1 IF EXISTS").one().applied
    assert session.execute("SELECT * FROM t WHERE k = 1").one() is None


def test_token_of_a_bound_key_on_the_right_of_a_relation(session):
    session.execute("CREATE TABLE t (k text PRIMARY KEY, v int)")
    for i in range(30):
        session.execute("INSERT INTO t (k, v) VALUES (%s, %s)", (f"key{i}", i))
    by_token = [(r.t, r.k) for r in session.execute("SELECT k, token(k) AS t FROM t")]
    start_token, start = by_token[10]
    scan = session.prepare("SELECT k FROM t WHERE token(k) >= token(?) LIMIT 5")
    assert [r.k for r in session.execute(scan, (start,))] == [k for _, k in by_token[10:15]]


def test_conditions_on_collection_elements(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, m map<text, int>, l list<text>)")
    session.execute("INSERT INTO t (k, m, l) VALUES (1, {'a': 1}, ['x', 'y'])")
    assert session.execute("UPDATE t SET m['a'] = 2 WHERE k = 1 IF m['a'] = 1").one()[0] is True
    assert session.execute("UPDATE t SET m['a'] = 3 WHERE k = 1 IF m['a'] = 1").one()[0] is False
    assert session.execute("UPDATE t SET m['b'] = 1 WHERE k = 1 IF m['b'] = null").one()[0] is True
    assert session.execute("UPDATE t SET l[1] = 'z' WHERE k = 1 IF l[1] = 'y'").one()[0] is True
    assert session.execute(session.prepare("UPDATE t SET m['c'] = 1 WHERE k = 1 IF l[0] = ?"), ("nope",)).one()[0] is False
    row = session.execute("SELECT m, l FROM t WHERE k = 1").one()
    assert row.m == {"a": 2, "b": 1} and row.l == ["x", "z"]


def test_select_using_timeout_bounds_how_long_the_coordinator_takes(session):
    """ScyllaDB's `USING TIMEOUT` (its drivers add it to their metadata queries): a read
    within the time answers as usual; one that needs longer is a ReadTimeout; a timeout
    that is not a positive duration of days at most is refused."""
    from cassandra import ReadTimeout
    from cassandra.concurrent import execute_concurrent_with_args
    from cassandra.util import Duration

    session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
    execute_concurrent_with_args(session, insert, [(k, c, "x" * 64) for k in range(50) for c in range(400)],
                                 concurrency=64)
    assert session.execute("SELECT v FROM t WHERE k = 1 AND c = 1 USING TIMEOUT 10s").one().v == "x" * 64
    prepared = session.prepare("SELECT v FROM t WHERE k = ? AND c = ? USING TIMEOUT ?")
    assert session.execute(prepared, (2, 2, Duration(0, 0, 5_000_000_000))).one().v == "x" * 64
    # Counting 20,000 rows takes far more than a millisecond.
    with pytest.raises(ReadTimeout):
        session.execute("SELECT count(*) FROM t USING TIMEOUT 1ms")
    for bad in ["1mo", "0s"]:
        with pytest.raises(InvalidRequest, match="USING TIMEOUT"):
            session.execute(f"SELECT v FROM t WHERE k = 1 USING TIMEOUT {bad}")
