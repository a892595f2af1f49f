"""Lightweight transactions on a three-node cluster (RF 3), through the Python driver:
every conditional form through every coordinator, SERIAL reads, concurrent compare-and-set
increments through all coordinators, and availability with a node down. The forms and the
increments run on an eventual keyspace (Paxos) and on a strongly consistent one (decided
by each tablet's Raft leader), with the same answers."""

import threading

import pytest
from cassandra import ConsistencyLevel, ReadTimeout, Unavailable, WriteTimeout
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
from cassandra.query import SimpleStatement

from test_cluster import ADDRESSES, LocalCluster, peers_up_in_status, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("lwt"))
    try:
        local.start()
        yield local
    finally:
        local.stop()


def session_on(cluster, address, consistency=ConsistencyLevel.QUORUM):
    """A session whose every request is coordinated by `address`."""
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                               retry_policy=FallthroughRetryPolicy(), consistency_level=consistency,
                               serial_consistency_level=ConsistencyLevel.SERIAL, request_timeout=30)
    driver = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return driver, driver.connect()


@pytest.fixture(scope="module")
def sessions(cluster):
    opened = [session_on(cluster, address) for address in ADDRESSES]
    first = opened[0][1]
    first.execute("CREATE KEYSPACE lwt WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
    first.execute("CREATE TABLE lwt.t (k int, c int, s int static, v int, w text, PRIMARY KEY (k, c))")
    first.execute("CREATE TABLE lwt.counter (k int PRIMARY KEY, v int)")
    for _, session in opened:
        wait_until(lambda: session.cluster.metadata.keyspaces.get("lwt") is not None
                   and "counter" in session.cluster.metadata.keyspaces["lwt"].tables, message="schema everywhere")
        session.set_keyspace("lwt")
    try:
        yield [session for _, session in opened]
    finally:
        for driver, _ in opened:
            driver.shutdown()


@pytest.fixture(scope="module", params=["eventual", "strong"])
def sessions_of_each_kind(cluster, request):
    """Sessions on every coordinator, in a keyspace of each consistency kind holding the
    same tables as `lwt`."""
    opened = [session_on(cluster, address) for address in ADDRESSES]
    first = opened[0][1]
    keyspace = f"lwt_{request.param}"
    option = " AND consistency = 'strong'" if request.param == "strong" else ""
    first.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                  f"{{'class': 'SimpleStrategy', 'replication_factor': 3}}{option}")
    first.execute(f"CREATE TABLE {keyspace}.t (k int, c int, s int static, v int, w text, PRIMARY KEY (k, c))")
    first.execute(f"CREATE TABLE {keyspace}.counter (k int PRIMARY KEY, v int)")
    for _, session in opened:
        wait_until(lambda: session.cluster.metadata.keyspaces.get(keyspace) is not None
                   and "counter" in session.cluster.metadata.keyspaces[keyspace].tables, message="schema everywhere")
        session.set_keyspace(keyspace)
    try:
        yield [session for _, session in opened]
    finally:
        for driver, _ in opened:
            driver.shutdown()


def serial(session, query, *parameters):
    return session.execute(SimpleStatement(query, consistency_level=ConsistencyLevel.SERIAL), parameters)


@pytest.mark.parametrize("coordinator", range(3))
def test_every_conditional_form_answers_as_cassandra_through_every_coordinator(sessions_of_each_kind, coordinator):
    sessions = sessions_of_each_kind
    session = sessions[coordinator]
    k = 100 + coordinator
    first = session.execute("INSERT INTO t (k, c, v, w) VALUES (%s, 1, 10, 'a') IF NOT EXISTS", (k,)).one()
    assert first.applied
    again = session.execute("INSERT INTO t (k, c, v, w) VALUES (%s, 1, 11, 'b') IF NOT EXISTS", (k,))
    assert again.column_names == ["[applied]", "k", "c", "s", "v", "w"]
    assert list(again.one()) == [False, k, 1, None, 10, "a"]

    failed = session.execute("UPDATE t SET v = 12 WHERE k = %s AND c = 1 IF v = 99 AND w = 'a'", (k,))
    assert failed.column_names == ["[applied]", "v", "w"] and list(failed.one()) == [False, 10, "a"]
    assert session.execute("UPDATE t SET v = 12 WHERE k = %s AND c = 1 IF v IN (10, 2)", (k,)).one().applied
    assert session.execute("UPDATE t SET v = 13 WHERE k = %s AND c = 1 IF v < 13", (k,)).one().applied
    assert not session.execute("UPDATE t SET v = 14 WHERE k = %s AND c = 2 IF EXISTS", (k,)).one().applied
    assert session.execute("UPDATE t SET s = 1 WHERE k = %s IF s = null", (k,)).one().applied
    assert list(session.execute("UPDATE t SET s = 2 WHERE k = %s IF s = 5", (k,)).one()) == [False, 1]

    batch = session.execute(
        f"BEGIN BATCH UPDATE t SET v = 20 WHERE k = {k} AND c = 1 IF v = 13; "
        f"INSERT INTO t (k, c, v) VALUES ({k}, 5, 50) APPLY BATCH").one()
    assert batch.applied
    refused = session.execute(
        f"BEGIN BATCH UPDATE t SET v = 21 WHERE k = {k} AND c = 1 IF v = 99; "
        f"UPDATE t SET v = 22 WHERE k = {k} AND c = 5 IF v = 98 APPLY BATCH")
    assert refused.column_names == ["[applied]", "k", "c", "v"]
    assert [list(row) for row in refused] == [[False, k, 1, 20], [False, k, 5, 50]]

    # Whichever node reads at SERIAL sees every applied conditional write.
    for other in sessions:
        rows = list(serial(other, "SELECT c, s, v FROM t WHERE k = %s", k))
        assert [(r.c, r.s, r.v) for r in rows] == [(1, 1, 20), (5, 1, 50)]

    assert session.execute("DELETE FROM t WHERE k = %s AND c = 5 IF EXISTS", (k,)).one().applied
    assert not session.execute("DELETE FROM t WHERE k = %s AND c = 5 IF EXISTS", (k,)).one().applied
    prepared = session.prepare("UPDATE t SET w = ? WHERE k = ? AND c = 1 IF w = ?")
    assert session.execute(prepared, ("z", k, "a")).one().applied
    assert [r.w for r in serial(sessions[(coordinator + 1) % 3], "SELECT w FROM t WHERE k = %s AND c = 1", k)] == ["z"]


def test_conditional_errors_match_cassandra(sessions):
    session = sessions[0]
    cases = [
        ("UPDATE t USING TIMESTAMP 5 SET v = 1 WHERE k = 1 AND c = 1 IF v = 1",
         "Cannot provide custom timestamp for conditional updates"),
        ("BEGIN BATCH UPDATE t SET v = 1 WHERE k = 1 AND c = 1 IF v = 1; "
         "INSERT INTO t (k, c, v) VALUES (2, 1, 1) APPLY BATCH", "Batch with conditions cannot span multiple partitions"),
        ("UPDATE t SET v = 1 WHERE k IN (1, 2) AND c = 1 IF v = 5",
         "IN on the partition key is not supported with conditional updates"),
        ("UPDATE t SET v = 1 WHERE k = 1 AND c = 1 IF v > null", 'Invalid comparison with null for operator ">"'),
    ]
    for query, message in cases:
        with pytest.raises(Exception, match=message):
            session.execute(query)
    with pytest.raises(Exception, match="SERIAL is not supported as conditional update commit consistency"):
        session.execute(SimpleStatement("UPDATE t SET v = 1 WHERE k = 1 AND c = 1 IF v = 1",
                                        consistency_level=ConsistencyLevel.SERIAL))


def test_concurrent_cas_increments_through_every_coordinator_lose_no_update(sessions_of_each_kind):
    """Two clients per coordinator each add 1 to one shared value 15 times by
    compare-and-set. Every applied increment is in the final value, none twice."""
    sessions = sessions_of_each_kind
    session = sessions[0]
    session.execute("INSERT INTO counter (k, v) VALUES (1, 0)")
    applied = []
    unknown = []
    failures = []
    lock = threading.Lock()

    def client(session):
        read = session.prepare("SELECT v FROM counter WHERE k = 1")
        read.consistency_level = ConsistencyLevel.SERIAL
        cas = session.prepare("UPDATE counter SET v = ? WHERE k = 1 IF v = ?")
        done = 0
        attempts = 0
        while done < 15 and attempts < 400:
            attempts += 1
            try:
                current = session.execute(read).one().v
            except ReadTimeout:
                # Contention from the other coordinators can outlast a SERIAL read's
                # contention timeout; a read changes nothing, so it is asked again.
                continue
            try:
                if session.execute(cas, (current + 1, current)).one().applied:
                    done += 1
                    with lock:
                        applied.append(current + 1)
            except WriteTimeout:
                with lock:
                    unknown.append(current + 1)
        if done < 15:
            with lock:
                failures.append(f"only {done} increments in {attempts} attempts")

    def guarded(session):
        try:
            client(session)
        except Exception as error:  # noqa: BLE001 - any failure of a client fails the test
            with lock:
                failures.append(f"a client failed: {error!r}")

    threads = [threading.Thread(target=guarded, args=(s,)) for s in sessions for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a client did not finish in 5 minutes"
    assert not failures
    final = serial(sessions[1], "SELECT v FROM counter WHERE k = 1").one().v
    # Each applied increment moved the value from n to n+1: no value twice.
    assert len(set(applied)) == len(applied), "two increments applied from the same value"
    assert len(applied) <= final <= len(applied) + len(unknown)
    assert final == max(applied + [v for v in unknown if v <= final])


def test_with_one_node_down_lwt_works_and_with_two_down_it_is_unavailable(cluster, sessions):
    session = sessions[0]
    third = cluster.nodes[2]
    third.kill()
    try:
        wait_until(lambda: not peers_up_in_status(cluster, 3, [cluster.nodes[0].address], cluster.nodes[0].config),
                   timeout=30, message="the third node seen down")
        assert session.execute("INSERT INTO t (k, c, v) VALUES (300, 1, 1) IF NOT EXISTS").one().applied
        assert session.execute("UPDATE t SET v = 2 WHERE k = 300 AND c = 1 IF v = 1").one().applied
        assert [r.v for r in serial(sessions[1], "SELECT v FROM t WHERE k = 300")] == [2]
        second = cluster.nodes[1]
        second.kill()
        try:
            wait_until(lambda: not peers_up_in_status(cluster, 2, [cluster.nodes[0].address], cluster.nodes[0].config),
                       timeout=30, message="the second node seen down")
            with pytest.raises(Unavailable) as raised:
                session.execute("UPDATE t SET v = 3 WHERE k = 300 AND c = 1 IF v = 2")
            assert raised.value.consistency == ConsistencyLevel.SERIAL
        finally:
            second.start(timeout=60)
    finally:
        third.start(timeout=60)
        wait_until(lambda: peers_up_in_status(cluster, 3, [cluster.nodes[0].address], cluster.nodes[0].config),
                   timeout=60, message="every node back")
    # The value decided while two replicas were down is there once they are back (read
    # through the restarted node, on a new connection).
    driver, fresh = session_on(cluster, cluster.nodes[2].address)
    try:
        assert [r.v for r in serial(fresh, "SELECT v FROM lwt.t WHERE k = 300")] == [2]
    finally:
        driver.shutdown()
