"""GROUP BY, as Cassandra 5.0 answers it: groups by the partition key and a prefix of the
clustering columns (columns fixed by `=` may be left out), aggregates per group, the first
row's values for plain columns, LIMIT counting groups, and paging that never splits a
group."""

import pytest
from cassandra import InvalidRequest
from cassandra.query import SimpleStatement


@pytest.fixture
def grouped(session):
    session.execute("CREATE TABLE t (p int, c1 int, c2 int, v int, PRIMARY KEY (p, c1, c2))")
    insert = session.prepare("INSERT INTO t (p, c1, c2, v) VALUES (?, ?, ?, ?)")
    for p in range(4):
        for c1 in range(3):
            for c2 in range(5):
                session.execute(insert, (p, c1, c2, p * 100 + c1 * 10 + c2))
    return session


def rows(session, query, fetch_size=None):
    return [tuple(row) for row in session.execute(SimpleStatement(query, fetch_size=fetch_size))]


def test_one_row_per_partition(grouped):
    result = rows(grouped, "SELECT p, count(*), max(v) FROM t GROUP BY p")
    assert sorted(result) == [(p, 15, p * 100 + 24) for p in range(4)]


def test_one_row_per_clustering_prefix_with_every_aggregate(grouped):
    result = rows(grouped, "SELECT p, c1, count(v), min(v), max(v), sum(v), avg(v) FROM t WHERE p = 2 GROUP BY p, c1")
    assert result == [(2, c1, 5, 200 + c1 * 10, 204 + c1 * 10, 5 * (200 + c1 * 10) + 10, 202 + c1 * 10)
                      for c1 in range(3)]


def test_a_column_fixed_by_equality_may_be_left_out(grouped):
    assert rows(grouped, "SELECT c1, count(*) FROM t WHERE p = 1 GROUP BY c1") == [(c1, 5) for c1 in range(3)]
    assert rows(grouped, "SELECT c2, v FROM t WHERE p = 1 AND c1 = 2 GROUP BY c2") == [(c2, 120 + c2) for c2 in range(5)]


def test_plain_columns_give_the_first_row_of_each_group(grouped):
    assert rows(grouped, "SELECT p, c1, c2, v FROM t WHERE p = 3 GROUP BY c1") == [(3, c1, 0, 300 + c1 * 10) for c1 in range(3)]
    assert rows(grouped, "SELECT p, c1, c2 FROM t WHERE p = 3 GROUP BY c1 ORDER BY c1 DESC") == [(3, c1, 4) for c1 in (2, 1, 0)]


def test_limit_counts_groups(grouped):
    result = rows(grouped, "SELECT p, c1, count(*) FROM t GROUP BY p, c1 LIMIT 4")
    assert len(result) == 4 and all(count == 5 for _, _, count in result)


@pytest.mark.parametrize("fetch_size", [1, 2, 4, 7])
def test_paging_never_splits_a_group(grouped, fetch_size):
    unpaged = rows(grouped, "SELECT p, c1, count(*), sum(v) FROM t GROUP BY p, c1")
    assert len(unpaged) == 12
    paged = rows(grouped, "SELECT p, c1, count(*), sum(v) FROM t GROUP BY p, c1", fetch_size=fetch_size)
    assert paged == unpaged
    by_partition = rows(grouped, "SELECT p, count(*) FROM t GROUP BY p", fetch_size=fetch_size)
    assert sorted(by_partition) == [(p, 15) for p in range(4)]


def test_no_rows_no_groups(grouped):
    assert rows(grouped, "SELECT p, count(*) FROM t WHERE p = 99 GROUP BY p") == []


@pytest.mark.parametrize("query, message", [
    ("SELECT count(*) FROM t GROUP BY v", "only supported on the columns of the PRIMARY KEY, got v"),
    ("SELECT count(*) FROM t GROUP BY c1", "following their declared order in the PRIMARY KEY"),
    ("SELECT count(*) FROM t WHERE p = 1 GROUP BY p, c2", "following their declared order in the PRIMARY KEY"),
    ("SELECT count(*) FROM t GROUP BY nope", "nope"),
])
def test_groups_off_the_primary_key_order_are_refused(grouped, query, message):
    with pytest.raises(InvalidRequest) as refused:
        grouped.execute(query)
    assert message in str(refused.value)
