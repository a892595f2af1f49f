"""Paging: every SELECT pages, and pages together return each row exactly once."""

import pytest
from cassandra.query import SimpleStatement


@pytest.mark.parametrize("fetch_size", [1, 7, 100, 5000])
def test_full_scan_pages_return_every_row_once(session, fetch_size):
    session.execute("CREATE TABLE t (k int, c int, v int, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
    expected = set()
    for k in range(40):
        for c in range(k % 5):
            session.execute(insert, (k, c, k * c))
            expected.add((k, c))
    result = session.execute(SimpleStatement("SELECT k, c FROM t", fetch_size=fetch_size))
    rows = [(r.k, r.c) for r in result]
    assert len(rows) == len(expected)
    assert set(rows) == expected
    tokens = [r.t for r in session.execute(SimpleStatement("SELECT token(k) AS t FROM t", fetch_size=fetch_size))]
    assert tokens == sorted(tokens)


def test_partition_pages_forward_and_reversed(session):
    session.execute("CREATE TABLE t (k int, c int, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c) VALUES (1, ?)")
    for c in range(53):
        session.execute(insert, (c,))
    forward = [r.c for r in session.execute(SimpleStatement("SELECT c FROM t WHERE k = 1", fetch_size=10))]
    assert forward == list(range(53))
    backward = [r.c for r in session.execute(SimpleStatement("SELECT c FROM t WHERE k = 1 ORDER BY c DESC", fetch_size=10))]
    assert backward == list(reversed(range(53)))


def test_paging_respects_limit_and_per_partition_limit(session):
    session.execute("CREATE TABLE t (k int, c int, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c) VALUES (?, ?)")
    for k in range(10):
        for c in range(10):
            session.execute(insert, (k, c))
    limited = list(session.execute(SimpleStatement("SELECT k, c FROM t LIMIT 33", fetch_size=5)))
    assert len(limited) == 33
    per_partition = list(session.execute(SimpleStatement("SELECT k, c FROM t PER PARTITION LIMIT 3", fetch_size=4)))
    assert len(per_partition) == 30
    assert all(r.c < 3 for r in per_partition)
    in_query = list(session.execute(SimpleStatement("SELECT k, c FROM t WHERE k IN (1, 2, 3) AND c > 4", fetch_size=3)))
    assert [(r.k, r.c) for r in in_query] == [(k, c) for k in (1, 2, 3) for c in range(5, 10)]


def test_distinct_pages(session):
    session.execute("CREATE TABLE t (k int, c int, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c) VALUES (?, ?)")
    for k in range(25):
        for c in range(3):
            session.execute(insert, (k, c))
    keys = [r.k for r in session.execute(SimpleStatement("SELECT DISTINCT k FROM t", fetch_size=4))]
    assert sorted(keys) == list(range(25))


def test_manual_paging_state_round_trip(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY)")
    for k in range(20):
        session.execute("INSERT INTO t (k) VALUES (%s)", (k,))
    statement = SimpleStatement("SELECT k FROM t", fetch_size=8)
    first = session.execute(statement)
    page = list(first.current_rows)
    assert len(page) == 8 and first.paging_state is not None
    second = session.execute(statement, paging_state=first.paging_state)
    assert len(second.current_rows) == 8
    assert not set(r.k for r in page) & set(r.k for r in second.current_rows)
