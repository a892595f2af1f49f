"""What is deleted stays deleted: deletions keep hiding what they shadow through
memtable flushes and compactions, also when their grace period is over and compaction
purges them (gc_grace_seconds = 0 makes every tombstone purgeable at once)."""

import pytest

from conftest import connect
from shoal_process import ShoalNode

FILLER_ROWS = 6000
FILLER_BYTES = 2000


@pytest.fixture(scope="module")
def small_memtables(tmp_path_factory):
    """A node whose 1 MiB memtables flush and compact after a few MiB of writes."""
    base = tmp_path_factory.mktemp("deletions")
    config = base / "shoal.toml"
    config.write_text("memtable_mib = 1\n")
    node = ShoalNode(base / "node", config=config)
    node.start()
    cluster, session = connect(node)
    session.execute("CREATE KEYSPACE del WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.set_keyspace("del")
    try:
        yield session
    finally:
        cluster.shutdown()
        node.stop()


def churn(session, table):
    """Writes enough other data (~12 MiB) through 1 MiB memtables to flush and compact
    the files holding the earlier writes several times."""
    insert = session.prepare(f"INSERT INTO {table} (k, v) VALUES (?, ?)")
    filler = "x" * FILLER_BYTES
    for k in range(1000, 1000 + FILLER_ROWS):
        session.execute(insert, (k, filler))


def test_a_deleted_row_does_not_come_back_after_compaction(small_memtables):
    session = small_memtables
    session.execute("CREATE TABLE rows (k int PRIMARY KEY, v text) WITH gc_grace_seconds = 0")
    session.execute("INSERT INTO rows (k, v) VALUES (1, 'old')")
    session.execute("DELETE FROM rows WHERE k = 1")
    churn(session, "rows")
    assert list(session.execute("SELECT v FROM rows WHERE k = 1")) == []


def test_deleted_rows_of_a_partition_do_not_come_back_after_compaction(small_memtables):
    session = small_memtables
    session.execute("CREATE TABLE wide (k int, c int, v text, PRIMARY KEY (k, c)) WITH gc_grace_seconds = 0")
    session.execute("CREATE TABLE wide_filler (k int PRIMARY KEY, v text)")
    for c in range(10):
        session.execute("INSERT INTO wide (k, c, v) VALUES (1, %s, 'old')", (c,))
    session.execute("DELETE FROM wide WHERE k = 1 AND c >= 3 AND c < 6")
    session.execute("DELETE FROM wide WHERE k = 1 AND c = 8")
    churn(session, "wide_filler")
    rows = [row.c for row in session.execute("SELECT c FROM wide WHERE k = 1")]
    assert rows == [0, 1, 2, 6, 7, 9]
    session.execute("DELETE FROM wide WHERE k = 1")
    churn(session, "wide_filler")
    assert list(session.execute("SELECT c FROM wide WHERE k = 1")) == []


def test_an_overwritten_set_does_not_regain_its_old_elements_after_compaction(small_memtables):
    session = small_memtables
    session.execute("CREATE TABLE sets (k int PRIMARY KEY, s set<text>, v text) WITH gc_grace_seconds = 0")
    session.execute("INSERT INTO sets (k, s) VALUES (1, {'a'})")
    session.execute("UPDATE sets SET s = {'b'} WHERE k = 1")
    churn(session, "sets")
    assert session.execute("SELECT s FROM sets WHERE k = 1").one().s == {"b"}
