"""Counters on a real three-node cluster with RF=3.

- Increments sent through every node as coordinator add up, and every node reads the same
  total at every consistency level.
- Under faults: clients increment through every coordinator at QUORUM while one replica
  is killed (kill -9) and restarted and another is paused (SIGSTOP) and resumed. Afterwards
  (every node back, repair run) each counter is at least the sum of the increments that
  were acknowledged and at most that plus the increments whose outcome is unknown (a
  timeout may or may not have applied one) — nothing acknowledged is lost, nothing is
  counted twice, whichever replica is asked.
"""

import random
import subprocess
import threading
import time

from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement

import pytest

from shoal_process import shoal_binary
from test_cluster import ADDRESSES, peers_up_in_status, started_cluster, wait_until

COUNTERS = 12


def session_on(cluster, address, consistency=ConsistencyLevel.QUORUM, timeout=10):
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                               retry_policy=FallthroughRetryPolicy(), consistency_level=consistency,
                               request_timeout=timeout)
    driver = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return driver, driver.connect()


@pytest.fixture
def cluster(tmp_path):
    with started_cluster(tmp_path) as local:
        yield local


def create_schema(cluster, keyspace="counting", replication_factor=3):
    driver, session = session_on(cluster, ADDRESSES[0], timeout=30)
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        f"{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}")
        session.execute(f"CREATE TABLE {keyspace}.c (k int PRIMARY KEY, n counter)")
    finally:
        driver.shutdown()


def read_counters(cluster, address, consistency, keyspace="counting"):
    driver, session = session_on(cluster, address, consistency, timeout=30)
    try:
        select = session.prepare(f"SELECT n FROM {keyspace}.c WHERE k = ?")
        values = {}
        for key in range(COUNTERS):
            row = session.execute(select, (key,)).one()
            values[key] = 0 if row is None else row.n
        return values
    finally:
        driver.shutdown()


def test_increments_through_every_coordinator_add_up_on_every_replica(cluster):
    create_schema(cluster)
    expected = {key: 0 for key in range(COUNTERS)}
    for number, address in enumerate(ADDRESSES):
        driver, session = session_on(cluster, address)
        try:
            increment = session.prepare("UPDATE counting.c SET n = n + ? WHERE k = ?")
            for key in range(COUNTERS):
                delta = (number + 1) * (key + 1)
                session.execute(increment, (delta, key))
                expected[key] += delta
            session.execute(SimpleStatement("UPDATE counting.c SET n = n - 1 WHERE k = 0"))
            expected[0] -= 1
        finally:
            driver.shutdown()
    for address in ADDRESSES:
        for consistency in (ConsistencyLevel.ONE, ConsistencyLevel.QUORUM, ConsistencyLevel.ALL):
            if consistency == ConsistencyLevel.ONE:
                continue  # checked after ALL, which repairs what ONE might not have seen yet
            assert read_counters(cluster, address, consistency) == expected, (address, consistency)
    # A read at ALL read-repaired every replica: each alone now answers the total.
    for address in ADDRESSES:
        assert read_counters(cluster, address, ConsistencyLevel.ONE) == expected, address


def test_a_coordinator_that_holds_no_replica_forwards_increments_to_a_leader(cluster):
    # RF=1 on three nodes: most counters live on another node than the coordinator, which
    # forwards the increment to the one replica to lead it.
    create_schema(cluster, "single", replication_factor=1)
    expected = {key: 0 for key in range(COUNTERS)}
    for number, address in enumerate(ADDRESSES):
        driver, session = session_on(cluster, address, ConsistencyLevel.ONE)
        try:
            increment = session.prepare("UPDATE single.c SET n = n + ? WHERE k = ?")
            for key in range(COUNTERS):
                session.execute(increment, (number + key, key))
                expected[key] += number + key
        finally:
            driver.shutdown()
    for address in ADDRESSES:
        assert read_counters(cluster, address, ConsistencyLevel.ONE, keyspace="single") == expected, address


class Tally:
    """Per counter: the sum of acknowledged increments and of the unknown ones."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acknowledged = {key: 0 for key in range(COUNTERS)}
        self.unknown = {key: 0 for key in range(COUNTERS)}

    def record(self, key, delta, acknowledged):
        with self.lock:
            (self.acknowledged if acknowledged else self.unknown)[key] += delta


def incrementer(cluster, address, number, tally, stop):
    rng = random.Random(number)
    driver, session = session_on(cluster, address, timeout=5)
    try:
        increment = session.prepare("UPDATE counting.c SET n = n + ? WHERE k = ?")
        while not stop.is_set():
            key, delta = rng.randrange(COUNTERS), rng.randint(1, 5)
            try:
                session.execute(increment, (delta, key))
                tally.record(key, delta, acknowledged=True)
            except Exception:
                # A timeout, an unavailable replica set or a lost connection: the increment
                # may or may not have been applied.
                tally.record(key, delta, acknowledged=False)
                time.sleep(0.05)
            time.sleep(0.002)
    finally:
        driver.shutdown()


def test_counters_under_kills_and_pauses_lose_and_double_nothing(cluster):
    create_schema(cluster)
    tally = Tally()
    stop = threading.Event()
    # Two clients per coordinator, so every node leads and forwards increments.
    workers = [threading.Thread(target=incrementer, args=(cluster, address, n * 10 + i, tally, stop))
               for n, address in enumerate(ADDRESSES) for i in range(2)]
    for worker in workers:
        worker.start()
    try:
        first, second, third = cluster.nodes
        time.sleep(3)
        second.kill()
        time.sleep(4)
        second.start(timeout=60)
        time.sleep(3)
        third.pause()
        time.sleep(4)
        third.resume()
        time.sleep(3)
        first.kill()
        time.sleep(3)
        first.start(timeout=60)
        time.sleep(3)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    print(f"acknowledged {sum(tally.acknowledged.values())}, unknown {sum(tally.unknown.values())}")
    assert sum(tally.acknowledged.values()) > 500, "too few increments got through to judge anything"

    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=60, message="every node to see all up")
    repair = subprocess.run([shoal_binary(), "admin", "repair", "counting", "--host", ADDRESSES[0],
                             "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=300)
    assert repair.returncode == 0, repair.stdout + repair.stderr
    for address in ADDRESSES:
        # After repair every replica alone has every shard.
        values = read_counters(cluster, address, ConsistencyLevel.ONE)
        for key in range(COUNTERS):
            low, high = tally.acknowledged[key], tally.acknowledged[key] + tally.unknown[key]
            assert low <= values[key] <= high, (
                f"{address}: counter {key} is {values[key]}, expected between {low} (acknowledged) "
                f"and {high} (with the {tally.unknown[key]} of unknown outcome)")
