"""Elastic Shoal (issue 10): nodes join, leave, are removed and replaced while the cluster
holds data and clients read and write at QUORUM.

Every test runs its own cluster of real `shoal server` processes on 127.0.0.1-6 and a
workload whose threads each own a share of the keys and write increasing versions of
them: a write acknowledged at QUORUM must be read back at QUORUM with that version or a
later one, during the moves (no missing or old row) and afterwards through every node.
"""

import json
import random
import socket
import subprocess
import threading
import time
import uuid

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import FallthroughRetryPolicy, RoundRobinPolicy, WhiteListRoundRobinPolicy

from shoal_process import ShoalNode, free_port_on_all, shoal_binary

ADDRESSES = [f"127.0.0.{i}" for i in range(1, 7)]
# Keys the workload writes and reads, and rows that are only there to be streamed.
WORKLOAD_KEYS = 2000
FILLER_FIRST_KEY = 1_000_000
PAYLOAD = b"x" * 1000


class ElasticCluster:
    """Up to six local nodes sharing a CQL and an internode port, seeded by 127.0.0.1."""

    def __init__(self, base, config_lines=()):
        self.base = base
        self.cql_port = free_port_on_all(ADDRESSES)
        self.internode_port = free_port_on_all(ADDRESSES)
        self.config = base / "elastic.toml"
        self.config.write_text("\n".join(config_lines) + "\n")
        self.nodes = {}

    def node(self, address, extra_args=(), fresh=False):
        data_dir = self.base / f"node-{address}{'-' + uuid.uuid4().hex[:6] if fresh else ''}"
        node = ShoalNode(data_dir, address=address, port=self.cql_port, internode_port=self.internode_port,
                         seeds=[ADDRESSES[0]], config=self.config, extra_args=["--worker-threads", "1", *extra_args])
        self.nodes[address] = node
        return node

    def start(self, count):
        for address in ADDRESSES[:count]:
            self.node(address).start(timeout=60)
        wait_until(lambda: self.settled(count), timeout=60, message=f"{count} nodes up and normal")
        return self

    def running(self):
        return [a for a, n in self.nodes.items() if n.process and n.process.poll() is None]

    def admin(self, *args, host=None, timeout=120, check=True):
        host = host or self.running()[0]
        result = subprocess.run([shoal_binary(), "admin", *args, "--host", host, "--port", str(self.internode_port)],
                                capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, f"shoal admin {' '.join(args)} failed: {result.stdout}{result.stderr}"
        return result

    def admin_json(self, *args, host=None):
        return json.loads(self.admin(*args, "--json", host=host).stdout)

    def status(self, host=None):
        """`{address: (status letters, host id)}` as `shoal admin status` prints them."""
        result = self.admin("status", host=host, check=False)
        members = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1] in ADDRESSES:
                members[parts[1]] = (parts[0], next(p for p in parts if p.count("-") == 4))
        return members

    def migrations(self, host=None):
        return self.admin_json("streams", host=host)["migrations"]

    def settled(self, count, host=None):
        """`count` members, every one up and normal, no migration under way."""
        try:
            members = self.status(host)
            return (len(members) == count and all(letters == "UN" for letters, _ in members.values())
                    and not self.migrations(host))
        except (subprocess.SubprocessError, json.JSONDecodeError, AssertionError):
            return False

    def ring(self, keyspace, table, host=None):
        return self.admin_json("ring", keyspace, table, host=host)["tablets"]

    def stop(self):
        for node in self.nodes.values():
            node.kill()


def wait_until(condition, timeout=60, message="condition", interval=0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def connect(cluster, addresses=None, consistency=ConsistencyLevel.QUORUM):
    addresses = addresses or cluster.running()
    policy = WhiteListRoundRobinPolicy(addresses) if len(addresses) == 1 else RoundRobinPolicy()
    profile = ExecutionProfile(load_balancing_policy=policy, retry_policy=FallthroughRetryPolicy(),
                               consistency_level=consistency, request_timeout=20)
    driver = Cluster(addresses, port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                     protocol_version=4)
    return driver, driver.connect()


def create_table(cluster, rf=3, filler_rows=1000):
    """The workload's keys at version 0, and `filler_rows` of 1 KB more to stream."""
    driver, session = connect(cluster)
    try:
        session.execute("CREATE KEYSPACE elastic WITH replication = "
                        f"{{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
        session.execute("CREATE TABLE elastic.t (k int PRIMARY KEY, v bigint, pad blob)")
        insert = session.prepare("INSERT INTO elastic.t (k, v, pad) VALUES (?, ?, ?)")
        keys = list(range(WORKLOAD_KEYS)) + [FILLER_FIRST_KEY + i for i in range(filler_rows)]
        results = execute_concurrent_with_args(session, insert, [(k, 0, PAYLOAD) for k in keys],
                                               concurrency=64)
        assert all(ok for ok, _ in results)
    finally:
        driver.shutdown()
    for address in cluster.running():
        cluster.admin("flush", host=address)
    return WORKLOAD_KEYS + filler_rows


class QuorumWorkload:
    """Threads writing increasing versions of their own keys at QUORUM and reading them
    back at QUORUM: a read older than the last acknowledged write of its key is a
    violation."""

    def __init__(self, cluster, threads=3, rows=WORKLOAD_KEYS):
        self.driver, self.session = connect(cluster)
        self.insert = self.session.prepare("INSERT INTO elastic.t (k, v, pad) VALUES (?, ?, ?)")
        self.select = self.session.prepare("SELECT v FROM elastic.t WHERE k = ?")
        self.acked = {k: 0 for k in range(rows)}
        self.violations = []
        self.errors = []
        self.counts = {"write_ok": 0, "write_failed": 0, "read_ok": 0, "read_failed": 0}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i, threads, rows), daemon=True)
                        for i in range(threads)]

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def run(self, index, threads, rows):
        rng = random.Random(index)
        version = 0
        keys = list(range(index, rows, threads))
        while not self.stopping.is_set():
            key = rng.choice(keys)
            if rng.random() < 0.5:
                version += 1
                try:
                    self.session.execute(self.insert, (key, version, PAYLOAD))
                    self.acked[key] = version
                    self.count("write_ok")
                except Exception as error:
                    self.count("write_failed")
                    self.errors.append(repr(error)[:200])
            else:
                expected = self.acked[key]
                try:
                    row = self.session.execute(self.select, (key,)).one()
                    self.count("read_ok")
                    if row is None or row.v < expected:
                        self.violations.append((key, expected, None if row is None else row.v))
                except Exception as error:
                    self.count("read_failed")
                    self.errors.append(repr(error)[:200])

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)
        self.driver.shutdown()

    def check(self):
        print(f"workload: {self.counts}")
        for error in sorted(set(self.errors))[:15]:
            print("  ", error)
        assert not self.violations, f"reads older than an acknowledged write: {self.violations[:10]}"
        total_writes = self.counts["write_ok"] + self.counts["write_failed"]
        assert self.counts["write_ok"] > 0 and self.counts["read_ok"] > 0, self.counts
        # Moves cost a few requests at most (a coordinator fenced out, a timeout while a
        # node is killed); the workload keeps going.
        assert self.counts["write_failed"] <= max(20, total_writes // 10), self.counts


def assert_everything_readable(cluster, acked, rows, consistency=ConsistencyLevel.QUORUM):
    """Every acknowledged version (or a later one), and every row, through every running
    node."""
    for address in cluster.running():
        driver, session = connect(cluster, [address], consistency)
        try:
            count = session.execute("SELECT count(*) FROM elastic.t", timeout=120).one()[0]
            assert count == rows, f"through {address}: {count} rows, not {rows}"
            select = session.prepare("SELECT v FROM elastic.t WHERE k = ?")
            keys = sorted(acked)
            results = execute_concurrent_with_args(session, select, [(k,) for k in keys], concurrency=32,
                                                   raise_on_first_error=False)
            problems = []
            for key, (ok, result) in zip(keys, results):
                row = result.one() if ok else None
                if row is None or row.v < acked[key]:
                    problems.append((key, acked[key], result if not ok else (row and row.v)))
            assert not problems, f"through {address}: {len(problems)} rows missing or old, e.g. {problems[:5]}"
        finally:
            driver.shutdown()


def assert_fully_replicated(cluster, rf=3):
    members = cluster.status()
    hosts = {host_id for _, host_id in members.values()}
    for tablet in cluster.ring("elastic", "t"):
        replicas = tablet["replicas"]
        assert tablet["moving"] is None, tablet
        assert len(replicas) == rf and len(set(replicas)) == rf, tablet
        assert all(r in members for r in replicas), (tablet, members)
    return hosts


@pytest.fixture
def elastic(tmp_path):
    clusters = []

    def make(config_lines=()):
        cluster = ElasticCluster(tmp_path, config_lines)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def test_a_cluster_with_data_grows_to_five_and_shrinks_back_under_quorum_load(elastic):
    cluster = elastic().start(3)
    rows = create_table(cluster, filler_rows=5000)
    with QuorumWorkload(cluster) as workload:
        # One node joins, then two at once.
        cluster.node(ADDRESSES[3]).start(timeout=60)
        wait_until(lambda: cluster.settled(4), timeout=120, message="the fourth node to join")
        assert_fully_replicated(cluster)
        for address in ADDRESSES[4:6]:
            cluster.node(address).launch()
        for address in ADDRESSES[4:6]:
            cluster.nodes[address].wait_listening(timeout=60)
        wait_until(lambda: cluster.settled(6), timeout=180, message="two nodes joining at once")
        # Tablets and primaries are even: every node holds its share (±1 per table).
        tablets = cluster.ring("elastic", "t")
        held = {a: sum(a in t["replicas"] for t in tablets) for a in ADDRESSES}
        assert max(held.values()) - min(held.values()) <= 1, held
        # Primaries are evened out once the table has settled (a metadata-only change).
        def primaries():
            tablets = cluster.ring("elastic", "t")
            return {a: sum(t["replicas"][0] == a for t in tablets) for a in ADDRESSES}

        try:
            wait_until(lambda: max(primaries().values()) - min(primaries().values()) <= 1, timeout=30,
                       message="even primaries")
        except AssertionError as timed_out:
            # Say where the primaries ended, not where they started.
            raise AssertionError(f"{timed_out}: still {primaries()}, status {cluster.status()}") from None
        # Back to three by decommission, one after another.
        for address in reversed(ADDRESSES[3:6]):
            cluster.admin("decommission", host=address, timeout=300)
            cluster.nodes[address].kill()
            wait_until(lambda: cluster.settled(len(cluster.running())), timeout=120,
                       message=f"{address} to leave")
        time.sleep(1)
    workload.check()
    assert sorted(cluster.status()) == ADDRESSES[:3]
    assert_fully_replicated(cluster)
    assert_everything_readable(cluster, workload.acked, rows)


def test_a_node_killed_during_its_join_resumes_and_nothing_is_lost(elastic):
    # Streaming capped at 1 MiB/s so the join is still streaming when the node is killed.
    cluster = elastic(["stream_throughput_mib_per_s = 1"]).start(3)
    rows = create_table(cluster, filler_rows=20000)
    with QuorumWorkload(cluster) as workload:
        joining = cluster.node(ADDRESSES[3])
        joining.start(timeout=60)
        wait_until(lambda: cluster.status().get(ADDRESSES[3], ("",))[0] == "UJ", timeout=30,
                   message="the node to show as joining")
        wait_until(lambda: cluster.admin_json("streams", host=ADDRESSES[3])["receiving"],
                   timeout=60, message="streaming to the joining node")
        joining.kill()
        # Its migrations are aborted: every tablet keeps its three replicas on the others.
        wait_until(lambda: not cluster.migrations(), timeout=60, message="the aborted migrations to end")
        tablets = cluster.ring("elastic", "t")
        assert all(len(t["replicas"]) == 3 and ADDRESSES[3] not in t["replicas"] for t in tablets)
        # Restarted, it resumes joining and finishes.
        joining.start(timeout=60)
        wait_until(lambda: cluster.settled(4), timeout=180, message="the join to finish after the restart")
    workload.check()
    assert_fully_replicated(cluster)
    assert_everything_readable(cluster, workload.acked, rows, ConsistencyLevel.ALL)


def test_a_source_killed_during_streaming_then_removed_leaves_every_tablet_fully_replicated(elastic):
    cluster = elastic(["stream_throughput_mib_per_s = 1"]).start(3)
    rows = create_table(cluster, filler_rows=20000)
    with QuorumWorkload(cluster) as workload:
        cluster.node(ADDRESSES[3]).start(timeout=60)
        receiving = []
        wait_until(lambda: receiving.extend(cluster.admin_json("streams", host=ADDRESSES[3])["receiving"])
                   or receiving, timeout=60, message="streaming")
        source = receiving[0]["from"][0]
        cluster.nodes[source].kill()
        # The tablets it was giving up stream from the other replicas instead.
        survivors = [a for a in ADDRESSES[:4] if a != source]
        wait_until(lambda: not cluster.migrations(host=survivors[0])
                   and cluster.status(survivors[0]).get(ADDRESSES[3], ("",))[0] == "UN",
                   timeout=180, message="the join to finish without the dead source")
        dead_id = cluster.status(survivors[0])[source][1]
        cluster.admin("removenode", dead_id, host=survivors[0], timeout=300)
        wait_until(lambda: cluster.settled(3, host=survivors[0]), timeout=120, message="removenode")
    workload.check()
    assert source not in cluster.status(survivors[0])
    assert_fully_replicated(cluster)
    assert_everything_readable(cluster, workload.acked, rows, ConsistencyLevel.ALL)


def test_a_dead_node_is_replaced_by_a_new_one_at_the_same_address(elastic):
    cluster = elastic().start(3)
    rows = create_table(cluster, filler_rows=5000)
    victim = ADDRESSES[2]
    old_id = cluster.status()[victim][1]
    with QuorumWorkload(cluster) as workload:
        cluster.nodes[victim].kill()
        wait_until(lambda: cluster.status(ADDRESSES[0]).get(victim, ("",))[0].startswith("D"), timeout=30,
                   message="the dead node to be seen down")
        # A new node (empty data directory) at the same address replaces it.
        replacement = cluster.node(victim, extra_args=["--replace-address", victim], fresh=True)
        replacement.start(timeout=60)
        wait_until(lambda: cluster.settled(3), timeout=180, message="the replacement to take over")
    workload.check()
    members = cluster.status()
    assert sorted(members) == ADDRESSES[:3]
    assert members[victim][1] != old_id, "the replacement has a host id of its own"
    assert_fully_replicated(cluster)
    assert_everything_readable(cluster, workload.acked, rows, ConsistencyLevel.ALL)


def test_a_node_started_with_join_ring_false_enters_the_cluster_only_once_told(elastic):
    cluster = elastic().start(3)
    rows = create_table(cluster, filler_rows=2000)
    waiting = cluster.node(ADDRESSES[3], extra_args=["--join-ring", "false"]).launch()
    waiting.wait_for_log("shoal admin join", timeout=60)
    # It answers the operator, but it is no member and serves no client yet.
    result = cluster.admin("info", host=ADDRESSES[3], check=False)
    assert result.returncode != 0 and "waits for `shoal admin join`" in result.stderr, result.stderr
    assert ADDRESSES[3] not in cluster.status()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ADDRESSES[3], cluster.cql_port), timeout=5).close()
    with QuorumWorkload(cluster) as workload:
        told = cluster.admin("join", "--wait", host=ADDRESSES[3], timeout=240)
        assert "joined" in told.stdout, told.stdout
        # `--wait` has returned: as the node itself applies the metadata, it is a normal
        # member among normal members and nothing moves any more.
        members = cluster.status(host=ADDRESSES[3])
        assert sorted(members) == ADDRESSES[:4], members
        assert all(letters[1] == "N" for letters, _ in members.values()), members
        assert cluster.migrations(host=ADDRESSES[3]) == []
        waiting.wait_listening(timeout=60)
        wait_until(lambda: cluster.settled(4), timeout=180, message="every node to see the join")
    result = cluster.admin("join", host=ADDRESSES[3], check=False)
    assert result.returncode != 0 and "joined the cluster already" in result.stderr, result.stderr
    workload.check()
    assert any(ADDRESSES[3] in tablet["replicas"] for tablet in cluster.ring("elastic", "t"))
    assert_fully_replicated(cluster)
    assert_everything_readable(cluster, workload.acked, rows)


def test_decommission_is_refused_when_the_rest_cannot_hold_the_replication_factor(elastic):
    cluster = elastic().start(3)
    create_table(cluster, filler_rows=0)
    result = cluster.admin("decommission", host=ADDRESSES[2], check=False)
    assert result.returncode != 0
    assert "Not enough live nodes to maintain replication factor in keyspace elastic" in result.stderr
    assert cluster.settled(3)
    # removenode of a live node is refused too: it must decommission.
    live_id = cluster.status()[ADDRESSES[1]][1]
    result = cluster.admin("removenode", live_id, check=False)
    assert result.returncode != 0 and "is alive" in result.stderr


def test_shoal_cluster_add_grows_a_local_cluster_that_holds_data(tmp_path):
    binary = shoal_binary()
    directory = tmp_path / "local"
    started = subprocess.run([binary, "cluster", "start", "--nodes", "2", "--dir", str(directory), "--detach"],
                             capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        driver = Cluster(["127.0.0.1"], protocol_version=4)
        session = driver.connect()
        session.execute("CREATE KEYSPACE grow WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}")
        session.execute("CREATE TABLE grow.t (k int PRIMARY KEY, v int)")
        insert = session.prepare("INSERT INTO grow.t (k, v) VALUES (?, ?)")
        execute_concurrent_with_args(session, insert, [(k, k) for k in range(500)], concurrency=32)
        driver.shutdown()
        added = subprocess.run([binary, "cluster", "add", "--dir", str(directory)], capture_output=True, text=True,
                               timeout=180)
        assert added.returncode == 0, added.stdout + added.stderr
        assert "node 3 up on 127.0.0.3" in added.stdout

        def settled():
            status = subprocess.run([binary, "admin", "status"], capture_output=True, text=True, timeout=30).stdout
            streams = subprocess.run([binary, "admin", "streams", "--json"], capture_output=True, text=True,
                                     timeout=30).stdout
            return status.count("UN ") == 3 and json.loads(streams)["migrations"] == []

        wait_until(settled, timeout=120, message="the added node to take its share")
        profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy(["127.0.0.3"]),
                                   consistency_level=ConsistencyLevel.ALL)
        driver = Cluster(["127.0.0.3"], execution_profiles={EXEC_PROFILE_DEFAULT: profile}, protocol_version=4)
        session = driver.connect()
        rows = {r.k: r.v for r in session.execute("SELECT k, v FROM grow.t")}
        driver.shutdown()
        assert rows == {k: k for k in range(500)}
    finally:
        subprocess.run([binary, "cluster", "stop", "--dir", str(directory)], capture_output=True, timeout=120)


def test_a_joining_node_indexes_the_rows_it_receives(elastic):
    """Streamed tablets arrive as files, not writes: the receiver indexes what it ingests,
    so a secondary index lookup finds every row wherever its tablet went."""
    cluster = elastic().start(1)
    driver, session = connect(cluster, consistency=ConsistencyLevel.ONE)
    try:
        session.execute("CREATE KEYSPACE indexed WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE indexed.t (k int PRIMARY KEY, colour text, size int)")
        session.execute("CREATE INDEX ON indexed.t (colour)")
        insert = session.prepare("INSERT INTO indexed.t (k, colour, size) VALUES (?, ?, ?)")
        colours = ["red", "green", "blue", "grey"]
        results = execute_concurrent_with_args(session, insert, [(k, colours[k % 4], k) for k in range(2000)],
                                               concurrency=64)
        assert all(ok for ok, _ in results)
    finally:
        driver.shutdown()
    cluster.node(ADDRESSES[1]).start(timeout=60)
    wait_until(lambda: cluster.settled(2), timeout=120, message="the second node to join")
    tablets = cluster.ring("indexed", "t")
    assert any(t["replicas"] == [ADDRESSES[1]] for t in tablets), tablets
    for address in ADDRESSES[:2]:
        driver, session = connect(cluster, [address], consistency=ConsistencyLevel.ONE)
        try:
            rows = session.execute("SELECT k, size FROM indexed.t WHERE colour = 'blue'")
            assert sorted((r.k, r.size) for r in rows) == [(k, k) for k in range(2, 2000, 4)], address
        finally:
            driver.shutdown()


def test_changing_the_replication_factor_adds_and_drops_replicas_with_their_data(elastic):
    cluster = elastic().start(3)
    rows = create_table(cluster, rf=1, filler_rows=2000)
    driver, session = connect(cluster)
    try:
        session.execute("ALTER KEYSPACE elastic WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        wait_until(lambda: cluster.settled(3) and all(len(t["replicas"]) == 3 for t in cluster.ring("elastic", "t")),
                   timeout=120, message="every tablet to have three replicas")
        # Every replica holds every row: ALL through any node reads each one.
        assert_everything_readable(cluster, {k: 0 for k in range(WORKLOAD_KEYS)}, rows, ConsistencyLevel.ALL)
        session.execute("ALTER KEYSPACE elastic WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}")
        wait_until(lambda: cluster.settled(3) and all(len(t["replicas"]) == 2 for t in cluster.ring("elastic", "t")),
                   timeout=120, message="every tablet to have two replicas")
        assert_fully_replicated(cluster, rf=2)
        assert_everything_readable(cluster, {k: 0 for k in range(WORKLOAD_KEYS)}, rows, ConsistencyLevel.ALL)
    finally:
        driver.shutdown()


def test_lightweight_transactions_lose_no_update_while_tablets_move(elastic):
    """Compare-and-set increments through every coordinator while a fourth node joins and
    then leaves again. A tablet's Paxos state moves with its data, so every increment
    applied is in the final value and none is applied twice from the same value."""
    cluster = elastic().start(3)
    driver, session = connect(cluster)
    partitions = list(range(12))
    try:
        session.execute("CREATE KEYSPACE elastic WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE elastic.registers (k int PRIMARY KEY, v int)")
        for k in partitions:
            session.execute("INSERT INTO elastic.registers (k, v) VALUES (%s, 0)", (k,))
    finally:
        driver.shutdown()
    applied = {k: [] for k in partitions}
    unknown = {k: [] for k in partitions}
    counts = {"applied": 0, "lost race": 0, "unknown": 0, "read failed": 0}
    lock = threading.Lock()
    stopping = threading.Event()
    failures = []
    errors = set()

    def client(address, index):
        driver, session = connect(cluster, [address])
        try:
            read = session.prepare("SELECT v FROM elastic.registers WHERE k = ?")
            read.consistency_level = ConsistencyLevel.SERIAL
            cas = session.prepare("UPDATE elastic.registers SET v = ? WHERE k = ? IF v = ?")
            rng = random.Random(index)
            while not stopping.is_set():
                k = rng.choice(partitions)
                try:
                    current = session.execute(read, (k,)).one().v
                except Exception:  # noqa: BLE001 - a read changes nothing; ask again
                    with lock:
                        counts["read failed"] += 1
                    continue
                try:
                    outcome = "applied" if session.execute(cas, (current + 1, k, current)).one().applied \
                        else "lost race"
                except Exception as error:  # noqa: BLE001 - a timeout or a refusal mid-round: maybe applied
                    outcome = "unknown"
                    with lock:
                        errors.add(repr(error)[:160])
                with lock:
                    counts[outcome] += 1
                    if outcome == "applied":
                        applied[k].append(current + 1)
                    elif outcome == "unknown":
                        unknown[k].append(current + 1)
        except Exception as error:  # noqa: BLE001 - any other failure of a client fails the test
            failures.append(f"a client of {address} failed: {error!r}")
        finally:
            driver.shutdown()

    threads = [threading.Thread(target=client, args=(address, i), daemon=True)
               for i, address in enumerate(ADDRESSES[:3] * 2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        cluster.node(ADDRESSES[3]).start(timeout=60)
        wait_until(lambda: cluster.settled(4), timeout=120, message="the fourth node to join")
        # Tablets of the table moved to the new node (and move away again below).
        assert any(ADDRESSES[3] in t["replicas"] for t in cluster.ring("elastic", "registers"))
        time.sleep(2)
        cluster.admin("decommission", host=ADDRESSES[3], timeout=300)
        cluster.nodes[ADDRESSES[3]].kill()
        wait_until(lambda: cluster.settled(3), timeout=120, message="the fourth node to leave")
        time.sleep(2)
    finally:
        stopping.set()
        for thread in threads:
            thread.join(timeout=60)
    print(f"lightweight transactions: {counts}")
    for error in sorted(errors)[:10]:
        print("  ", error)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads), "a client did not stop"
    assert counts["applied"] > 0, counts
    driver, session = connect(cluster, consistency=ConsistencyLevel.SERIAL)
    try:
        read = session.prepare("SELECT v FROM elastic.registers WHERE k = ?")
        for k in partitions:
            final = session.execute(read, (k,)).one().v
            mine = applied[k]
            # Each applied increment moved the value from n to n+1: no value twice, none lost.
            assert len(set(mine)) == len(mine), f"partition {k}: two increments applied from one value"
            assert len(mine) <= final <= len(mine) + len(unknown[k]), (k, final, len(mine), len(unknown[k]))
            assert final == max(mine + [v for v in unknown[k] if v <= final] + [0]), (k, final)
    finally:
        driver.shutdown()
