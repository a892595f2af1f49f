"""Secondary indexes against a model: random writes, overwrites, deletes (cells, rows,
partitions, ranges), TTLs, collection updates, flushes and compactions — and, on a
cluster, a node joining so tablets (and their indexes) move — after which every index
query — equality, `CONTAINS` and ranges — returns exactly what a filtered full scan
returns: never a stale hit, never a missed one.

The model is the table itself read whole (`SELECT *`, a full scan) and filtered here.
The operations are drawn from a fixed seed, so a failure replays the same way."""

import random
import subprocess
import time

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy

from shoal_process import ShoalNode, shoal_binary
from test_cluster import ADDRESSES, peers_up_in_status, started_cluster, wait_until

VALUES = 6
PARTITIONS = 40


def admin(node, *arguments):
    result = subprocess.run([shoal_binary(), "admin", *arguments, "--host", node.address,
                             "--port", str(node.internode_port)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def create_schema(session, keyspace, replication_factor):
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                    f"{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}")
    session.execute(f"CREATE TABLE {keyspace}.t (p int, c int, v int, s int static, tags set<int>, "
                    "PRIMARY KEY (p, c)) WITH gc_grace_seconds = 0")
    session.execute(f"CREATE INDEX ON {keyspace}.t (v)")
    session.execute(f"CREATE INDEX ON {keyspace}.t (s) USING 'sai'")
    session.execute(f"CREATE INDEX ON {keyspace}.t (tags)")
    session.execute(f"CREATE INDEX ON {keyspace}.t (c)")


def random_operation(session, keyspace, rng):
    p, c, value = rng.randrange(PARTITIONS), rng.randrange(5), rng.randrange(VALUES)
    table = f"{keyspace}.t"
    choice = rng.random()
    if choice < 0.35:
        session.execute(f"INSERT INTO {table} (p, c, v) VALUES ({p}, {c}, {value})")
    elif choice < 0.45:
        session.execute(f"INSERT INTO {table} (p, c, v) VALUES ({p}, {c}, {value}) USING TTL 1")
    elif choice < 0.55:
        session.execute(f"UPDATE {table} SET s = {value} WHERE p = {p}")
    elif choice < 0.65:
        session.execute(f"UPDATE {table} SET tags = tags + {{{value}, {value + 1}}} WHERE p = {p} AND c = {c}")
    elif choice < 0.7:
        session.execute(f"UPDATE {table} SET tags = tags - {{{value}}} WHERE p = {p} AND c = {c}")
    elif choice < 0.78:
        session.execute(f"DELETE v FROM {table} WHERE p = {p} AND c = {c}")
    elif choice < 0.86:
        session.execute(f"DELETE FROM {table} WHERE p = {p} AND c = {c}")
    elif choice < 0.9:
        session.execute(f"DELETE FROM {table} WHERE p = {p} AND c >= {c}")
    elif choice < 0.93:
        session.execute(f"DELETE FROM {table} WHERE p = {p}")
    else:
        session.execute(f"UPDATE {table} SET v = {value} WHERE p = {p} AND c = {c}")


def check_against_full_scan(session, keyspace):
    rows = list(session.execute(f"SELECT p, c, v, s, tags FROM {keyspace}.t"))
    for value in range(VALUES + 1):
        queries = {
            f"v = {value}": lambda r: r.v == value,
            f"s = {value}": lambda r: r.s == value,
            f"tags CONTAINS {value}": lambda r: r.tags is not None and value in r.tags,
            f"c = {value}": lambda r: r.c == value,
            # Ranges over the storage-attached index.
            f"s > {value}": lambda r: r.s is not None and r.s > value,
            f"s <= {value}": lambda r: r.s is not None and r.s <= value,
            f"s >= {value - 1} AND s < {value + 2}": lambda r: r.s is not None and value - 1 <= r.s < value + 2,
        }
        for restriction, matches in queries.items():
            expected = sorted((r.p, r.c) for r in rows if matches(r))
            found = sorted((r.p, r.c) for r in session.execute(
                f"SELECT p, c FROM {keyspace}.t WHERE {restriction}"))
            assert found == expected, f"{restriction}: index {found} != full scan {expected}"


def run_model(session, keyspace, flush_and_compact, rounds=6, operations=120, seed=7):
    rng = random.Random(seed)
    for round_number in range(rounds):
        for _ in range(operations):
            random_operation(session, keyspace, rng)
        # Rows written with a TTL of 1 s expire within 2 s: let them, so that none
        # expires between the full scan and the index queries it is compared with.
        time.sleep(2.1)
        if round_number % 2 == 1:
            flush_and_compact()
        check_against_full_scan(session, keyspace)


def test_index_queries_equal_a_filtered_full_scan_on_one_node(tmp_path):
    node = ShoalNode(tmp_path / "node")
    node.start()
    try:
        driver = Cluster([node.address], port=node.port)
        session = driver.connect()
        # Data first, then indexes over it (built in the background), then more writes.
        session.execute("CREATE KEYSPACE pre WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE pre.t (k int PRIMARY KEY, v int)")
        insert = session.prepare("INSERT INTO pre.t (k, v) VALUES (?, ?)")
        for k in range(3000):
            session.execute(insert, (k, k % 7))
        session.execute("CREATE INDEX pre_v ON pre.t (v)")
        builds = admin(node, "indexbuilds")
        assert "pre_v" in builds and "pre.t" in builds, builds
        assert sorted(r.k for r in session.execute("SELECT k FROM pre.t WHERE v = 3")) == list(range(3, 3000, 7))

        create_schema(session, "model", 1)
        run_model(session, "model", lambda: (admin(node, "flush"), admin(node, "compact")))
        driver.shutdown()
    finally:
        assert node.stop() == 0, node.log()


def test_index_queries_equal_a_filtered_full_scan_on_a_cluster_while_a_node_joins(tmp_path):
    with started_cluster(tmp_path) as cluster:
        profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy(ADDRESSES[:3]),
                                   retry_policy=FallthroughRetryPolicy(), consistency_level=ConsistencyLevel.QUORUM,
                                   request_timeout=30)
        driver = Cluster(ADDRESSES[:3], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        session = driver.connect()
        # RF 2 (a replica holds some of the tablets) and RF 3 (every node holds them all).
        create_schema(session, "model", 2)
        create_schema(session, "model3", 3)

        def flush_and_compact():
            for node in cluster.nodes:
                admin(node, "flush")
                admin(node, "compact")

        run_model(session, "model", flush_and_compact, rounds=3)
        run_model(session, "model3", flush_and_compact, rounds=2, seed=5)
        # A fourth node joins: tablets move to it, their index entries with them.
        joiner = cluster.make_node(tmp_path, "127.0.0.4")
        cluster.nodes.append(joiner)
        joiner.start(timeout=90)
        wait_until(lambda: peers_up_in_status(cluster, 4, [ADDRESSES[0]]), timeout=120,
                   message="the new node to be up and normal")
        run_model(session, "model", flush_and_compact, rounds=3, seed=11)
        run_model(session, "model3", flush_and_compact, rounds=2, seed=13)
        # Every coordinator, the new one included, answers alike.
        for address in ADDRESSES[:3] + ["127.0.0.4"]:
            profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                                       retry_policy=FallthroughRetryPolicy(),
                                       consistency_level=ConsistencyLevel.QUORUM, request_timeout=30)
            one = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
            try:
                through = one.connect()
                check_against_full_scan(through, "model")
                check_against_full_scan(through, "model3")
            finally:
                one.shutdown()
        driver.shutdown()
