"""Strongly consistent keyspaces (`AND consistency = 'strong'`) on a real three-node
cluster: every write and read of their tables goes through the tablet's Raft group, so a
write acknowledged through one node is what every node reads next, whatever consistency
level the request names; a paused or killed leader is replaced; concurrent register
operations through all three coordinators are linearizable; and what such a keyspace does
not take yet is refused with a clear error."""

import random
import threading
import time
import uuid

import pytest
from cassandra import ConsistencyLevel, InvalidRequest, ReadTimeout, WriteTimeout
from cassandra.protocol import ConfigurationException
from cassandra.query import SimpleStatement

from linearizability import Operation, check
from test_cluster import ADDRESSES, connect, peers_up_in_status, started_cluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with started_cluster(tmp_path_factory.mktemp("strong")) as local:
        yield local


def strong_keyspace(session):
    name = f"s_{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', "
                    f"'replication_factor': 3}} AND consistency = 'strong'")
    session.execute(f"CREATE TABLE {name}.t (k int PRIMARY KEY, v int)")
    return name


def at(consistency, text):
    return SimpleStatement(text, consistency_level=consistency)


def sessions_per_node(cluster):
    """One driver per node, each sending every request to that node only."""
    return [connect(cluster, [address]) for address in ADDRESSES]


def test_the_option_is_described_kept_and_what_strong_tables_do_not_take_is_refused(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]])
    try:
        ks = strong_keyspace(session)
        described = session.execute(f"DESCRIBE KEYSPACE {ks}").one()
        assert "AND consistency = 'strong'" in described.create_statement
        with pytest.raises(ConfigurationException, match="cannot be changed"):
            session.execute(f"ALTER KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', "
                            f"'replication_factor': 3}} AND consistency = 'eventual'")
        with pytest.raises(ConfigurationException, match="Invalid consistency 'total'"):
            session.execute("CREATE KEYSPACE bad_consistency WITH replication = {'class': 'SimpleStrategy', "
                            "'replication_factor': 1} AND consistency = 'total'")
        with pytest.raises(InvalidRequest, match="strongly consistent keyspace"):
            session.execute(f"CREATE INDEX ON {ks}.t (v)")
        session.execute(f"CREATE TABLE {ks}.hits (k int PRIMARY KEY, n counter)")
        with pytest.raises(InvalidRequest, match="strongly consistent keyspace"):
            session.execute(f"UPDATE {ks}.hits SET n = n + 1 WHERE k = 1")
        # An eventual keyspace shows no such option.
        session.execute("CREATE KEYSPACE IF NOT EXISTS plain_ks WITH replication = {'class': 'SimpleStrategy', "
                        "'replication_factor': 1}")
        assert "consistency" not in session.execute("DESCRIBE KEYSPACE plain_ks").one().create_statement
    finally:
        driver.shutdown()


def test_a_write_through_one_node_is_read_through_every_other_at_once_even_at_one(cluster):
    connections = sessions_per_node(cluster)
    try:
        ks = strong_keyspace(connections[0][1])
        sessions = [session for _, session in connections]
        for k in range(60):
            writer = sessions[k % 3]
            writer.execute(at(ConsistencyLevel.ONE, f"INSERT INTO {ks}.t (k, v) VALUES ({k % 7}, {k})"))
            for reader in sessions:
                row = reader.execute(at(ConsistencyLevel.ONE, f"SELECT v FROM {ks}.t WHERE k = {k % 7}")).one()
                assert row is not None and row.v == k, f"write {k} through node {k % 3 + 1} not read back"
        # A logged batch on one partition is one entry.
        sessions[1].execute(f"BEGIN BATCH INSERT INTO {ks}.t (k, v) VALUES (100, 1); "
                            f"UPDATE {ks}.t SET v = 2 WHERE k = 100; APPLY BATCH")
        assert sessions[2].execute(f"SELECT v FROM {ks}.t WHERE k = 100").one().v == 2
        with pytest.raises(InvalidRequest, match="one partition"):
            sessions[0].execute(f"BEGIN BATCH INSERT INTO {ks}.t (k, v) VALUES (1, 1); "
                                f"INSERT INTO {ks}.t (k, v) VALUES (2, 2); APPLY BATCH")
    finally:
        for driver, _ in connections:
            driver.shutdown()


def test_scans_through_every_node_see_every_acknowledged_write_even_at_one(cluster):
    connections = sessions_per_node(cluster)
    try:
        ks = strong_keyspace(connections[0][1])
        sessions = [session for _, session in connections]
        keys = 40
        for version in range(4):
            for k in range(keys):
                writer = sessions[(k + version) % 3]
                writer.execute(at(ConsistencyLevel.ONE, f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {version})"))
            # A scan over every tablet, right after the last acknowledgement, through each
            # node and in pages: each chunk is read at its tablet's leader.
            for reader in sessions:
                scan = SimpleStatement(f"SELECT k, v FROM {ks}.t", consistency_level=ConsistencyLevel.ONE,
                                       fetch_size=7)
                rows = sorted((row.k, row.v) for row in reader.execute(scan))
                assert rows == [(k, version) for k in range(keys)]
        # A partition read backwards, with a limit, sees the newest rows too.
        sessions[0].execute(f"CREATE TABLE {ks}.events (k int, c int, v int, PRIMARY KEY (k, c))")
        for c in range(30):
            sessions[c % 3].execute(at(ConsistencyLevel.ONE, f"INSERT INTO {ks}.events (k, c, v) VALUES (1, {c}, {c})"))
            for reader in sessions:
                newest = reader.execute(at(ConsistencyLevel.ONE, f"SELECT c FROM {ks}.events WHERE k = 1 "
                                                                 "ORDER BY c DESC LIMIT 2")).all()
                assert [row.c for row in newest] == list(range(c, max(c - 2, -1), -1))
    finally:
        for driver, _ in connections:
            driver.shutdown()


def eventually_written(session, statement, timeout=30):
    """Writes until one attempt is acknowledged (an election may be under way)."""
    deadline = time.time() + timeout
    while True:
        try:
            session.execute(statement)
            return
        except WriteTimeout:
            if time.time() > deadline:
                raise


def test_writes_go_on_while_a_node_is_paused_and_a_killed_node_catches_up_on_restart(cluster):
    connections = sessions_per_node(cluster)
    try:
        ks = strong_keyspace(connections[0][1])
        sessions = [session for _, session in connections]
        for k in range(20):
            sessions[0].execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {k})")
        paused = cluster.nodes[1]
        paused.pause()
        try:
            # Whoever led the tablets, the two others carry on (after an election where
            # the paused node led).
            # ALL names three replicas: an eventual keyspace would refuse; here a majority
            # of the group is what every write and read needs.
            for k in range(20):
                eventually_written(sessions[k % 2 * 2],
                                   at(ConsistencyLevel.ALL, f"UPDATE {ks}.t SET v = {k + 100} WHERE k = {k}"))
            for k in range(20):
                row = sessions[2].execute(at(ConsistencyLevel.ALL, f"SELECT v FROM {ks}.t WHERE k = {k}")).one()
                assert row.v == k + 100
        finally:
            paused.resume()
        # Resumed, it reads (through the leaders) what was written while it was paused.
        for k in range(20):
            assert sessions[1].execute(f"SELECT v FROM {ks}.t WHERE k = {k}").one().v == k + 100

        victim = cluster.nodes[2]
        victim.kill()
        for k in range(20):
            eventually_written(sessions[0], f"UPDATE {ks}.t SET v = {k + 200} WHERE k = {k}")
        victim.start(timeout=60)
        wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="the node to be up")
        for driver, _ in connections[2:]:
            driver.shutdown()
        connections[2] = connect(cluster, [victim.address])
        # What was written while it was down reaches it through the log: reads through it
        # see it, and with node 1 paused it and node 2 are the majority that serves them.
        for k in range(20):
            row = connections[2][1].execute(f"SELECT v FROM {ks}.t WHERE k = {k}").one()
            assert row.v == k + 200
        cluster.nodes[0].pause()
        try:
            for k in range(20):
                deadline = time.time() + 30
                while True:
                    try:
                        row = connections[2][1].execute(f"SELECT v FROM {ks}.t WHERE k = {k}").one()
                        break
                    except Exception:
                        if time.time() > deadline:
                            raise
                assert row.v == k + 200
        finally:
            cluster.nodes[0].resume()
    finally:
        for driver, _ in connections:
            driver.shutdown()


def test_registers_written_and_read_through_every_coordinator_are_linearizable(cluster):
    connections = sessions_per_node(cluster)
    try:
        ks = strong_keyspace(connections[0][1])
        sessions = [session for _, session in connections]
        keys = range(4)
        histories = {k: [] for k in keys}
        lock = threading.Lock()
        stop = threading.Event()
        counter = iter(range(1, 1_000_000))

        def client(number):
            rng = random.Random(number)
            session = sessions[number % 3]
            while not stop.is_set():
                k = rng.choice(keys)
                invoked = time.monotonic()
                if rng.random() < 0.5:
                    with lock:
                        value = next(counter)
                    try:
                        session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {value})")
                        operation = Operation("write", invoked, time.monotonic(), value=value, client=number)
                    except Exception:
                        operation = Operation("write", invoked, None, value=value, client=number)
                else:
                    try:
                        row = session.execute(f"SELECT v FROM {ks}.t WHERE k = {k}").one()
                        operation = Operation("read", invoked, time.monotonic(), result=row.v if row else None,
                                              client=number)
                    except Exception:
                        operation = Operation("read", invoked, None, client=number)
                with lock:
                    histories[k].append(operation)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        time.sleep(4)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        assert sum(len(h) for h in histories.values()) > 100
        broken = [k for k, history in histories.items() if not check(history)]
        assert broken == [], f"not linearizable: keys {broken}"
    finally:
        for driver, _ in connections:
            driver.shutdown()


def test_without_a_majority_writes_and_reads_time_out_instead_of_answering(cluster):
    connections = sessions_per_node(cluster)
    try:
        ks = strong_keyspace(connections[0][1])
        session = connections[0][1]
        session.execute(f"INSERT INTO {ks}.t (k, v) VALUES (1, 1)")
        others = cluster.nodes[1:]
        for node in others:
            node.pause()
        try:
            with pytest.raises(WriteTimeout) as write_timeout:
                session.execute(f"UPDATE {ks}.t SET v = 2 WHERE k = 1")
            assert write_timeout.value.required_responses == 2
            with pytest.raises(ReadTimeout) as read_timeout:
                session.execute(f"SELECT v FROM {ks}.t WHERE k = 1")
            assert read_timeout.value.required_responses == 2
        finally:
            for node in others:
                node.resume()
        wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="the nodes to be up")
        # The timed-out update may or may not have been applied; a new one is.
        eventually_written(session, f"UPDATE {ks}.t SET v = 3 WHERE k = 1")
        assert connections[2][1].execute(f"SELECT v FROM {ks}.t WHERE k = 1").one().v == 3
    finally:
        for driver, _ in connections:
            driver.shutdown()


def test_a_node_outside_a_tablets_group_reaches_it_through_its_members(cluster):
    # Replication factor 1: each tablet's group is one node, so most requests arrive at a
    # node that holds no replica and must find the leader through the members.
    connections = sessions_per_node(cluster)
    try:
        name = f"s_{uuid.uuid4().hex[:8]}"
        sessions = [session for _, session in connections]
        sessions[0].execute(f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', "
                            f"'replication_factor': 1}} AND consistency = 'strong'")
        sessions[0].execute(f"CREATE TABLE {name}.t (k int PRIMARY KEY, v int)")
        for k in range(30):
            sessions[k % 3].execute(f"INSERT INTO {name}.t (k, v) VALUES ({k}, {k * 10})")
            for reader in sessions:
                assert reader.execute(f"SELECT v FROM {name}.t WHERE k = {k}").one().v == k * 10
    finally:
        for driver, _ in connections:
            driver.shutdown()
