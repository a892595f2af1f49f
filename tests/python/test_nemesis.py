"""A nemesis against a real three-node cluster under load: QUORUM writes, deletes,
TTL'd writes and reads run while one node after another is killed (kill -9) and
restarted, paused (SIGSTOP) and resumed, and cut off from the other nodes by an
nftables rule on its internode traffic (nodes send from their own address, so the rule
needs nothing but addresses and the internode port).

Afterwards — every node back, hints delivered, anti-entropy repair run — every write that
was acknowledged and not deleted since is there with its value, no acknowledged deletion
has come undone, no expired row is back, and every replica answers alike. Operations that
failed (timeouts, unavailable) may or may not have happened; they are not checked.

Needs root and the `nft` command (scripts/test.sh installs nftables); every rule it adds
lives in its own table, removed at the end whatever happens."""

import random
import subprocess
import threading
import time

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, Unavailable
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    FallthroughRetryPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)

from linearizability import Operation

from shoal_process import shoal_binary
from test_cluster import ADDRESSES, peers_up_in_status, started_cluster, wait_until

NFT_TABLE = "shoal_nemesis"
WORKERS = 3
OPERATIONS_PER_WORKER = 1500
TTL_SECONDS = 2


def nft(*arguments, check=True):
    return subprocess.run(["nft", *arguments], capture_output=True, text=True, check=check, timeout=10)


def cut_off(address, internode_port):
    """Drops every internode packet to or from `address` (other nodes only)."""
    nft("add", "table", "inet", NFT_TABLE)
    nft("add", "chain", "inet", NFT_TABLE, "output", "{ type filter hook output priority 0 ; policy accept ; }")
    for direction in ("saddr", "daddr"):
        other = "daddr" if direction == "saddr" else "saddr"
        for port in ("dport", "sport"):
            nft("add", "rule", "inet", NFT_TABLE, "output", "ip", direction, address, "ip", other, "!=", address,
                "tcp", port, str(internode_port), "drop")


def heal():
    nft("delete", "table", "inet", NFT_TABLE, check=False)


@pytest.fixture
def nftables():
    try:
        heal()
        nft("list", "tables")
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.fail(f"the nemesis needs nftables (root and the nft command; scripts/test.sh installs it): {error}")
    try:
        yield
    finally:
        heal()


@pytest.fixture
def cluster(tmp_path):
    with started_cluster(tmp_path) as local:
        yield local


class History:
    """What the clients were told, per key."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acknowledged = {}   # key -> value of an acknowledged write
        self.deleted = set()     # keys whose deletion was acknowledged
        self.uncertain = set()   # keys with an operation whose outcome is unknown
        self.expiring = set()    # keys written with a TTL (acknowledged)
        self.stale_reads = []    # (key, expected, seen) read at QUORUM after an acknowledged write

    def outcome(self, key, operation, value=None, failed=False):
        with self.lock:
            if failed:
                self.uncertain.add(key)
            elif operation == "write":
                self.acknowledged[key] = value
            elif operation == "delete":
                self.deleted.add(key)
            elif operation == "expiring":
                self.expiring.add(key)


def worker(session, table, number, history, stop):
    rng = random.Random(number)
    insert = session.prepare(f"INSERT INTO {table} (k, v) VALUES (?, ?)")
    insert_ttl = session.prepare(f"INSERT INTO {table} (k, v) VALUES (?, ?) USING TTL {TTL_SECONDS}")
    delete = session.prepare(f"DELETE FROM {table} WHERE k = ?")
    select = session.prepare(f"SELECT v FROM {table} WHERE k = ?")
    written = []
    for operation_number in range(OPERATIONS_PER_WORKER):
        if stop.is_set():
            return
        key = number * 1_000_000 + operation_number
        choice = rng.random()
        try:
            if choice < 0.6 or not written:
                session.execute(insert, (key, key))
                history.outcome(key, "write", key)
                written.append(key)
            elif choice < 0.75:
                victim = written.pop(rng.randrange(len(written)))
                try:
                    session.execute(delete, (victim,))
                    history.outcome(victim, "delete")
                except Exception:
                    history.outcome(victim, "delete", failed=True)
            elif choice < 0.85:
                session.execute(insert_ttl, (key, key))
                history.outcome(key, "expiring")
            else:
                target = written[rng.randrange(len(written))]
                row = session.execute(select, (target,)).one()
                if row is None or row.v != target:
                    with history.lock:
                        history.stale_reads.append((target, target, row))
        except Exception:
            history.outcome(key, "write", failed=True)
        time.sleep(0.002)


def nemesis(cluster, stop):
    """Kill, pause and cut off each node in turn, giving the cluster time in between."""
    first, second, third = cluster.nodes
    steps = []

    def kill_and_restart(node):
        node.kill()
        time.sleep(4)
        node.start(timeout=60)

    def pause_and_resume(node):
        node.pause()
        time.sleep(4)
        node.resume()

    def partition_and_heal(node):
        cut_off(node.address, cluster.internode_port)
        time.sleep(4)
        heal()

    steps = [(kill_and_restart, second), (pause_and_resume, third), (partition_and_heal, first),
             (kill_and_restart, third), (pause_and_resume, first), (partition_and_heal, second)]
    for step, node in steps:
        if stop.is_set():
            return
        step(node)
        time.sleep(3)


def register_client(session, number, histories, lock, stop, keys, read, write, write_must_apply):
    """One client of `registers_under_nemesis`: half reads (`read`), a quarter blind
    writes (`write`, which must answer `[applied]` true when `write_must_apply`), a
    quarter compare-and-sets from the value it last read, on random registers of `keys`.
    An operation whose outcome is unknown is recorded as such; one refused before
    anything was proposed, or a failed read, is left out."""
    rng = random.Random(number)
    cas = session.prepare("UPDATE r SET v = ? WHERE k = ? IF v = ?")
    last_seen = {}
    while not stop.is_set():
        key = rng.randrange(keys)
        value = rng.randrange(5)
        choice = rng.random()
        invoked = time.monotonic()
        if choice < 0.5:
            try:
                row = session.execute(read, (key,)).one()
            except Exception:
                time.sleep(0.05)
                continue  # a read that failed tells nothing
            last_seen[key] = row.v if row else None
            operation = Operation("read", invoked, time.monotonic(), result=last_seen[key], client=number)
        else:
            expected = last_seen.get(key, 0)
            try:
                if choice < 0.75:
                    result = session.execute(write, (value, key))
                    if write_must_apply:
                        assert result.one().applied, "the registers exist from the start: IF EXISTS always holds"
                    operation = Operation("write", invoked, time.monotonic(), value=value, client=number)
                else:
                    applied = session.execute(cas, (value, key, expected)).one().applied
                    operation = Operation("cas", invoked, time.monotonic(), value=value, expected=expected,
                                          result=applied, client=number)
            except (Unavailable, InvalidRequest):
                time.sleep(0.05)
                continue  # refused before anything was proposed
            except Exception:
                kind = "write" if choice < 0.75 else "cas"
                operation = Operation(kind, invoked, None, value=value, expected=expected, client=number)
                time.sleep(0.05)
        with lock:
            histories[key].append(operation)
        time.sleep(0.03)


def registers_under_nemesis(cluster, sessions, client, keys, clients_per_coordinator, rounds):
    """Runs `client(session, number, histories, lock, stop)` threads — `clients_per_coordinator`
    on each of `sessions` — through `rounds` of the nemesis, and returns each register's
    history (`{key: [Operation]}`) once every client has stopped."""
    histories = {key: [] for key in range(keys)}
    lock = threading.Lock()
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(session, index * clients_per_coordinator + n, histories, lock,
                                                      stop))
               for index, session in enumerate(sessions) for n in range(clients_per_coordinator)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)
        for _ in range(rounds):
            nemesis(cluster, threading.Event())
        time.sleep(3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return histories


def test_acknowledged_writes_survive_and_deletions_stay_under_kills_pauses_and_partitions(cluster, nftables):
    profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
                               retry_policy=FallthroughRetryPolicy(), consistency_level=ConsistencyLevel.QUORUM,
                               request_timeout=10)
    driver = Cluster(ADDRESSES, port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    session = driver.connect()
    history = History()
    stop = threading.Event()
    try:
        session.execute("CREATE KEYSPACE nemesis WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE nemesis.t (k int PRIMARY KEY, v int) WITH gc_grace_seconds = 3600")
        workers = [threading.Thread(target=worker, args=(session, "nemesis.t", n, history, stop)) for n in range(WORKERS)]
        chaos = threading.Thread(target=nemesis, args=(cluster, stop))
        for thread in workers + [chaos]:
            thread.start()
        chaos.join(timeout=240)
        stop.set()
        for thread in workers:
            thread.join(timeout=60)
        assert not chaos.is_alive(), "the nemesis did not finish"
    finally:
        stop.set()
        heal()
        driver.shutdown()

    # Everything back: every node up in every node's view, hints delivered, replicas
    # repaired (as an operator would after an incident).
    for node in cluster.nodes:
        if node.process.poll() is not None:
            node.start(timeout=60)
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=60, message="every node to see all up")
    time.sleep(TTL_SECONDS + 3)
    repair = subprocess.run([shoal_binary(), "admin", "repair", "nemesis", "--host", ADDRESSES[0],
                             "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=300)
    assert repair.returncode == 0, repair.stdout + repair.stderr

    assert len(history.acknowledged) > 500, "too little load got through to judge anything"
    assert not history.stale_reads, f"QUORUM reads missed acknowledged writes: {history.stale_reads[:5]}"
    certain = {k: v for k, v in history.acknowledged.items() if k not in history.deleted and k not in history.uncertain}
    deleted = history.deleted - history.uncertain
    expired = history.expiring - history.uncertain
    keys = sorted(set(certain) | deleted | expired)
    views = {}
    for address in ADDRESSES:
        profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                                   retry_policy=FallthroughRetryPolicy(), consistency_level=ConsistencyLevel.ONE,
                                   request_timeout=30)
        reader = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        try:
            reading = reader.connect()
            select = reading.prepare("SELECT v FROM nemesis.t WHERE k = ?")
            results = execute_concurrent_with_args(reading, select, [(k,) for k in keys], concurrency=64)
            views[address] = {}
            for key, (success, result) in zip(keys, results):
                assert success, f"reading {key} on {address} failed: {result}"
                row = result.one()
                views[address][key] = None if row is None else row.v
        finally:
            reader.shutdown()
    for address, view in views.items():
        lost = [k for k, v in certain.items() if view[k] != v]
        assert not lost, f"{address}: acknowledged writes lost or changed: {lost[:10]} of {len(lost)}"
        back = [k for k in deleted if view[k] is not None]
        assert not back, f"{address}: deleted rows are back: {back[:10]} of {len(back)}"
        alive = [k for k in expired if view[k] is not None]
        assert not alive, f"{address}: expired rows are back: {alive[:10]} of {len(alive)}"
    first = views[ADDRESSES[0]]
    for address in ADDRESSES[1:]:
        differing = [k for k in keys if views[address][k] != first[k]]
        assert not differing, f"replicas disagree after repair on {differing[:10]}"
