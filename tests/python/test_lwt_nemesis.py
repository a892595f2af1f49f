"""Linearizability of lightweight transactions under a nemesis: clients on every
coordinator read at SERIAL, write (`UPDATE … IF EXISTS`) and compare-and-set
(`UPDATE … IF v = ?`) a few registers while nodes are killed (kill -9) and restarted,
paused (SIGSTOP) and resumed, and cut off from the others by nftables. Every history is
then checked (tests/python/linearizability.py): zero violations.

Operations whose outcome the client could not learn (timeouts, lost connections) count as
unknown — they may have happened at any moment after they began, or never. Refusals that
happen before anything is proposed (`Unavailable`) are known not to have happened.

The suite runs one round of the nemesis; a longer run:
    SHOAL_LWT_NEMESIS_ROUNDS=10 scripts/test.sh tests/python/test_lwt_nemesis.py
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
ROUNDS = int(os.environ.get("SHOAL_LWT_NEMESIS_ROUNDS", "1"))


def connect(cluster, address, keyspace="lwt"):
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                               retry_policy=FallthroughRetryPolicy(), consistency_level=ConsistencyLevel.QUORUM,
                               serial_consistency_level=ConsistencyLevel.SERIAL, request_timeout=10)
    driver = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                     connect_timeout=5)
    return driver, driver.connect(keyspace)


def client(session, number, histories, lock, stop):
    read = session.prepare("SELECT v FROM r WHERE k = ?")
    read.consistency_level = ConsistencyLevel.SERIAL
    write = session.prepare("UPDATE r SET v = ? WHERE k = ? IF EXISTS")
    register_client(session, number, histories, lock, stop, KEYS, read, write, write_must_apply=True)


def test_lightweight_transactions_are_linearizable_under_kills_pauses_and_partitions(cluster, nftables):  # noqa: F811
    driver, setup = connect(cluster, ADDRESSES[0], keyspace=None)
    try:
        setup.execute("CREATE KEYSPACE IF NOT EXISTS lwt WITH replication = "
                      "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        setup.execute("CREATE TABLE lwt.r (k int PRIMARY KEY, v int)")
        for key in range(KEYS):
            setup.execute("INSERT INTO lwt.r (k, v) VALUES (%s, 0) IF NOT EXISTS", (key,))
        assert setup.cluster.control_connection.wait_for_schema_agreement(wait_time=30)
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
    successful_cas = sum(1 for history in histories.values() for op in history if op.kind == "cas" and op.result)
    assert completed > 200 and successful_cas > 10, f"too little happened: {completed} ops, {successful_cas} cas"
    violations = [key for key, history in histories.items() if not check(history, initial=0)]
    assert not violations, f"not linearizable: keys {violations} ({completed} ops, {unknown} unknown)"
    # Every node answers a SERIAL read once the nemesis is over.
    for address in ADDRESSES:
        driver, session = connect(cluster, address)
        try:
            wait_until(lambda: session.execute("SELECT count(*) FROM r").one()[0] == KEYS, timeout=30,
                       message=f"{address} serves again")
        finally:
            driver.shutdown()
