"""Linearizability of a strongly consistent keyspace under a nemesis: clients on every
coordinator read and write a few registers with plain statements (at ONE: the keyspace
makes every one linearizable whatever the level) and compare-and-set them with conditional
updates (decided by the tablet's leader, between the plain writes) while nodes are killed
(kill -9) and
restarted, paused (SIGSTOP) and resumed, and cut off from the others by nftables. Every
history is then checked (tests/python/linearizability.py): zero violations.

A write whose outcome the client could not learn (a timeout, a lost connection) counts as
unknown: it may have happened at any moment after it began, or never. A read that failed
tells nothing and is left out.

The suite runs one round of the nemesis; a longer run:
    SHOAL_STRONG_NEMESIS_ROUNDS=10 scripts/test.sh tests/python/test_strong_nemesis.py
Needs root and the `nft` command, as tests/python/test_nemesis.py does."""

import os

from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy

from linearizability import check
from test_cluster import ADDRESSES, wait_until
from test_nemesis import cluster, nftables, register_client, registers_under_nemesis  # noqa: F401  (fixtures)

KEYS = 16
CLIENTS_PER_COORDINATOR = 2
ROUNDS = int(os.environ.get("SHOAL_STRONG_NEMESIS_ROUNDS", "1"))


def connect(cluster, address, keyspace="strong_registers"):
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                               retry_policy=FallthroughRetryPolicy(), consistency_level=ConsistencyLevel.ONE,
                               request_timeout=10)
    driver = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                     connect_timeout=5)
    return driver, driver.connect(keyspace)


def client(session, number, histories, lock, stop):
    read = session.prepare("SELECT v FROM r WHERE k = ?")
    write = session.prepare("UPDATE r SET v = ? WHERE k = ?")
    register_client(session, number, histories, lock, stop, KEYS, read, write, write_must_apply=False)


def test_a_strongly_consistent_keyspace_is_linearizable_under_kills_pauses_and_partitions(cluster, nftables):  # noqa: F811
    driver, setup = connect(cluster, ADDRESSES[0], keyspace=None)
    try:
        setup.execute("CREATE KEYSPACE IF NOT EXISTS strong_registers WITH replication = "
                      "{'class': 'SimpleStrategy', 'replication_factor': 3} AND consistency = 'strong'")
        setup.execute("CREATE TABLE strong_registers.r (k int PRIMARY KEY, v int)")
        assert setup.cluster.control_connection.wait_for_schema_agreement(wait_time=30)
        for key in range(KEYS):
            setup.execute("INSERT INTO strong_registers.r (k, v) VALUES (%s, 0)", (key,))
    finally:
        driver.shutdown()
    connections = [connect(cluster, address) for address in ADDRESSES]
    try:
        histories = registers_under_nemesis(cluster, [session for _, session in connections], client, KEYS,
                                            CLIENTS_PER_COORDINATOR, ROUNDS)
    finally:
        for connected, _ in connections:
            connected.shutdown()
    completed = sum(1 for history in histories.values() for op in history if op.completed is not None)
    unknown = sum(1 for history in histories.values() for op in history if op.completed is None)
    writes = sum(1 for history in histories.values() for op in history if op.kind == "write" and op.completed)
    successful_cas = sum(1 for history in histories.values() for op in history if op.kind == "cas" and op.result)
    assert completed > 200 and writes > 25 and successful_cas > 10, \
        f"too little happened: {completed} ops, {writes} writes, {successful_cas} cas"
    violations = [key for key, history in histories.items() if not check(history, initial=0)]
    assert not violations, f"not linearizable: keys {violations} ({completed} ops, {unknown} unknown)"
    # Every node serves reads and writes again once the nemesis is over.
    for address in ADDRESSES:
        driver, session = connect(cluster, address)
        try:
            wait_until(lambda: session.execute("SELECT count(*) FROM r").one()[0] == KEYS, timeout=30,
                       message=f"{address} serves again")
        finally:
            driver.shutdown()
