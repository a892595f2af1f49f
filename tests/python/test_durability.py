"""Durability: restarts keep data; in `group` commit mode every acknowledged write
survives `kill -9`."""

import threading
import time

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import NoHostAvailable
from cassandra.query import SimpleStatement

from conftest import connect
from shoal_process import ShoalNode

KEYSPACE = "durable"


def create_schema(session):
    session.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {KEYSPACE}.t (k int, c int, v text, PRIMARY KEY (k, c))")


def all_rows(session):
    return {(r.k, r.c): r.v for r in session.execute(SimpleStatement(f"SELECT k, c, v FROM {KEYSPACE}.t", fetch_size=1000))}


@pytest.mark.parametrize("mode", ["periodic", "group"])
def test_clean_restart_keeps_schema_and_data(tmp_path, mode):
    node = ShoalNode(tmp_path / "node", commitlog_sync=mode)
    with node:
        cluster, session = connect(node)
        create_schema(session)
        for i in range(200):
            session.execute(f"INSERT INTO {KEYSPACE}.t (k, c, v) VALUES (%s, %s, %s)", (i % 7, i, f"v{i}"))
        session.execute(f"DELETE FROM {KEYSPACE}.t WHERE k = 0")
        before = all_rows(session)
        cluster.shutdown()
        assert node.stop() == 0
        node.start()
        cluster, session = connect(node)
        assert all_rows(session) == before
        assert "t" in cluster.metadata.keyspaces[KEYSPACE].tables
        cluster.shutdown()


def test_group_commit_acknowledged_writes_survive_kill_9(tmp_path):
    node = ShoalNode(tmp_path / "node", commitlog_sync="group")
    with node:
        cluster, session = connect(node)
        create_schema(session)
        insert = session.prepare(f"INSERT INTO {KEYSPACE}.t (k, c, v) VALUES (?, ?, ?)")
        acknowledged = {}
        lock = threading.Lock()
        stop = threading.Event()

        def writer(worker):
            i = 0
            while not stop.is_set() and i < 100_000:
                key = (worker, i)
                try:
                    session.execute(insert, (worker, i, f"w{worker}-{i}"), timeout=5)
                except (OperationTimedOut, NoHostAvailable, Exception):
                    return
                with lock:
                    acknowledged[key] = f"w{worker}-{i}"
                i += 1

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        node.kill()
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        cluster.shutdown()
        assert len(acknowledged) > 100, "the load should have acknowledged writes before the kill"

        node.start()
        cluster, session = connect(node)
        stored = all_rows(session)
        lost = [key for key, value in acknowledged.items() if stored.get(key) != value]
        assert not lost, f"{len(lost)} acknowledged writes were lost, e.g. {lost[:5]}"
        cluster.shutdown()
