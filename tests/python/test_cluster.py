"""A real three-node cluster (processes on 127.0.0.1-3): discovery and token-aware
routing, consistency levels across nodes, last-write-wins between coordinators, node
failure (kill -9), hints, schema catch-up, anti-entropy repair, paged scans across
tablets, events, and no lost QUORUM write when a node dies under load. (Joins into a
cluster holding data, leaving and replacing nodes: `test_elastic.py`.)"""

import contextlib
import socket
import struct
import subprocess
import threading
import time
import uuid

import pytest
from cassandra import ConsistencyLevel, ReadTimeout, Unavailable, WriteTimeout, WriteType
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    FallthroughRetryPolicy,
    TokenAwarePolicy,
    WhiteListRoundRobinPolicy,
)
from cassandra.query import SimpleStatement

from shoal_process import ShoalNode, free_port_on_all, shoal_binary
from test_protocol import ERROR, READY, error_of, frame, read_frame, started

ADDRESSES = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
HINT_WINDOW_MS = 8000


class LocalCluster:
    def __init__(self, base, size=3):
        self.cql_port = free_port_on_all(ADDRESSES + ["127.0.0.4"])
        self.internode_port = free_port_on_all(ADDRESSES + ["127.0.0.4"])
        self.config = base / "cluster.toml"
        self.config.write_text(f"max_hint_window_ms = {HINT_WINDOW_MS}\n")
        self.nodes = [self.make_node(base, address) for address in ADDRESSES[:size]]

    def make_node(self, base, address):
        return ShoalNode(
            base / f"node-{address}",
            address=address,
            port=self.cql_port,
            internode_port=self.internode_port,
            seeds=[ADDRESSES[0]],
            config=self.config,
        )

    def start(self):
        for node in self.nodes:
            node.start(timeout=60)
        # As ccm does: ready once every node is up and normal (a joining node takes its
        # share of the system tables' tablets first; drivers list it once it is normal).
        first = self.nodes[0]
        try:
            # Generous: seen in CI taking over 60 s, a tablet stream to the joining node
            # stalling until its chunk timeout (under investigation; see the migration log).
            wait_until(lambda: peers_up_in_status(self, len(self.nodes), [first.address], first.config), timeout=120,
                       message="every node up and normal")
        except AssertionError as error:
            status = subprocess.run([shoal_binary(), "admin", "status", "--host", first.address, "--port",
                                     str(self.internode_port)], capture_output=True, text=True, timeout=30)
            stacks = [node.dump_stacks() for node in self.nodes]
            raise AssertionError(f"{error}; status:\n{status.stdout}{status.stderr}\nstacks: {stacks}") from None
        return self

    def stop(self):
        for node in self.nodes:
            node.kill()


@contextlib.contextmanager
def started_cluster(base, size=3):
    """A LocalCluster, started; afterwards every node is stopped whatever happened (paused
    ones resumed first, so that they can be)."""
    local = LocalCluster(base, size)
    try:
        local.start()
        yield local
    finally:
        for node in local.nodes:
            if node.process is not None and node.process.poll() is None:
                node.resume()
        local.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        local.start()
        yield local
    finally:
        local.stop()


def profile(addresses=None, consistency=ConsistencyLevel.ONE):
    policy = WhiteListRoundRobinPolicy(addresses) if addresses else TokenAwarePolicy(DCAwareRoundRobinPolicy())
    return ExecutionProfile(load_balancing_policy=policy, retry_policy=FallthroughRetryPolicy(),
                            consistency_level=consistency, request_timeout=30)


def connect(cluster, addresses=None, consistency=ConsistencyLevel.ONE):
    contact = addresses or [n.address for n in cluster.nodes if n.process and n.process.poll() is None]
    driver = Cluster(contact, port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile(addresses, consistency)})
    return driver, driver.connect()


def wait_until(condition, timeout=30, message="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {message}")


def new_keyspace(session, rf):
    name = f"c_{uuid.uuid4().hex[:8]}"
    session.execute(f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}")
    return name


def keyspace_with_table(cluster, rf):
    """A new keyspace of replication factor `rf` holding `t (k int PRIMARY KEY, v text)`,
    created through the first node; its name."""
    driver, session = connect(cluster, [ADDRESSES[0]])
    try:
        ks = new_keyspace(session, rf)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v text)")
        return ks
    finally:
        driver.shutdown()


def at(consistency, text):
    return SimpleStatement(text, consistency_level=consistency)


def read_on(cluster, address, query, consistency=ConsistencyLevel.ONE):
    driver, session = connect(cluster, [address], consistency)
    try:
        return list(session.execute(query))
    finally:
        driver.shutdown()


def peers_up(session, count):
    rows = session.execute("SELECT peer FROM system.peers").all()
    return len(rows) == count


def test_all_nodes_are_discovered_and_requests_route_to_replicas(cluster):
    driver, session = connect(cluster)
    try:
        hosts = driver.metadata.all_hosts()
        assert sorted(h.address for h in hosts) == ADDRESSES
        wait_until(lambda: all(h.is_up for h in driver.metadata.all_hosts()), message="all hosts up")
        # Each node reports its own tokens; together they form one ring.
        tokens = [t for h in hosts for t in driver.metadata.token_map.token_to_host_owner if driver.metadata.token_map.token_to_host_owner[t] == h]
        assert len(tokens) >= 3 * 8
        ks = new_keyspace(session, 1)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        insert = session.prepare(f"INSERT INTO {ks}.t (k, v) VALUES (?, ?)")
        assert insert.routing_key_indexes == [0]
        for k in range(30):
            result = session.execute(insert, (k, k))
            replicas = driver.metadata.get_replicas(ks, insert.bind((k, k)).routing_key)
            assert len(replicas) == 1
            # Token-aware routing sent the write to the replica itself.
            assert result.response_future.coordinator_host.address == replicas[0].address
    finally:
        driver.shutdown()


def test_writes_at_all_through_one_node_are_readable_at_one_through_each(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]])
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v text)")
        for k in range(50):
            session.execute(at(ConsistencyLevel.ALL, f"INSERT INTO {ks}.t (k, v) VALUES ({k}, 'v{k}')"))
    finally:
        driver.shutdown()
    for address in ADDRESSES:
        for k in (0, 17, 49):
            rows = read_on(cluster, address, f"SELECT v FROM {ks}.t WHERE k = {k}")
            assert [r.v for r in rows] == [f"v{k}"], address


def test_a_statement_prepared_on_one_node_executes_on_another_that_never_saw_it(cluster):
    # A client that prepared its statements before a node joined (or restarted) executes
    # them there without preparing them again: the node finds them on its peers, in the
    # keyspace they were prepared in. Each driver here knows one node only, so the second
    # node never prepared the statement; answered UNPREPARED, the executing driver would
    # re-prepare it in its own session, which has no keyspace, and fail.
    ks = keyspace_with_table(cluster, 3)
    preparing = Cluster([ADDRESSES[0]], port=cluster.cql_port,
                        execution_profiles={EXEC_PROFILE_DEFAULT: profile([ADDRESSES[0]])})
    executing = Cluster([ADDRESSES[1]], port=cluster.cql_port,
                        execution_profiles={EXEC_PROFILE_DEFAULT: profile([ADDRESSES[1]], ConsistencyLevel.ALL)})
    try:
        session = preparing.connect(ks)
        insert = session.prepare("INSERT INTO t (k, v) VALUES (?, ?)")
        select = session.prepare("SELECT v FROM t WHERE k = ?")
        elsewhere = executing.connect()
        for k in range(5):
            elsewhere.execute(insert.bind((k, f"v{k}")))
        assert [r.v for r in elsewhere.execute(select.bind((3,)))] == ["v3"]
    finally:
        preparing.shutdown()
        executing.shutdown()
    rows = read_on(cluster, ADDRESSES[2], f"SELECT k, v FROM {ks}.t", ConsistencyLevel.ALL)
    assert sorted((r.k, r.v) for r in rows) == [(k, f"v{k}") for k in range(5)]

    # A statement no node prepared is still UNPREPARED (0x2500), with its id.
    unknown = bytes(range(16))
    sock = socket.create_connection((ADDRESSES[1], cluster.cql_port), timeout=10)
    try:
        started(sock)
        execute = struct.pack(">H", len(unknown)) + unknown + struct.pack(">HB", 1, 0)
        sock.sendall(frame(4, 1, 0x0A, execute))
        _, _, _, opcode, body = read_frame(sock)
        assert opcode == ERROR
        code, message = error_of(body)
        assert code == 0x2500, message
        assert body[6 + struct.unpack(">H", body[4:6])[0]:] == struct.pack(">H", 16) + unknown
    finally:
        sock.close()


def test_with_rf2_any_node_coordinates_any_request(cluster):
    ks = keyspace_with_table(cluster, 2)
    for writer in ADDRESSES:
        driver, session = connect(cluster, [writer], ConsistencyLevel.QUORUM)
        try:
            for k in range(20):
                session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, '{writer}')")
        finally:
            driver.shutdown()
        for reader in ADDRESSES:
            for consistency in (ConsistencyLevel.ONE, ConsistencyLevel.QUORUM):
                rows = read_on(cluster, reader, f"SELECT k, v FROM {ks}.t WHERE k IN (0, 7, 19)", consistency)
                assert sorted((r.k, r.v) for r in rows) == [(0, writer), (7, writer), (19, writer)]


def test_list_element_operations_read_the_list_from_its_replicas_not_the_coordinator(cluster):
    """`l[i] = v`, `DELETE l[i]` and `l = l - [...]` read the list first; a coordinator that
    holds no replica of the partition must read it from the replicas."""
    driver, session = connect(cluster)
    try:
        ks = new_keyspace(session, 1)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, l list<text>)")
        session.execute(f"INSERT INTO {ks}.t (k, l) VALUES (1, ['a', 'b', 'c', 'd'])")
        replica = driver.metadata.get_replicas(ks, session.prepare(f"SELECT l FROM {ks}.t WHERE k = ?").bind((1,)).routing_key)[0]
    finally:
        driver.shutdown()
    others = [a for a in ADDRESSES if a != replica.address]
    for consistency in (ConsistencyLevel.ONE, ConsistencyLevel.QUORUM):
        driver, session = connect(cluster, [others[0]], consistency)
        try:
            session.execute(f"UPDATE {ks}.t SET l[0] = 'A' WHERE k = 1")
            session.execute(f"DELETE l[1] FROM {ks}.t WHERE k = 1")
            session.execute(f"UPDATE {ks}.t SET l = l - ['c'] WHERE k = 1")
            assert session.execute(f"SELECT l FROM {ks}.t WHERE k = 1").one().l == ["A", "d"]
            session.execute(f"UPDATE {ks}.t SET l = ['a', 'b', 'c', 'd'] WHERE k = 1")
        finally:
            driver.shutdown()


def test_conflicting_writes_through_different_coordinators_converge_on_the_newest(cluster):
    ks = keyspace_with_table(cluster, 3)
    writes = [(ADDRESSES[0], 300, "newest"), (ADDRESSES[1], 100, "oldest"), (ADDRESSES[2], 200, "middle")]
    for address, timestamp, value in writes:
        driver, session = connect(cluster, [address], ConsistencyLevel.ONE)
        try:
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES (1, '{value}') USING TIMESTAMP {timestamp}")
        finally:
            driver.shutdown()
    for address in ADDRESSES:
        wait_until(lambda: [r.v for r in read_on(cluster, address, f"SELECT v FROM {ks}.t WHERE k = 1")] == ["newest"],
                   timeout=10, message=f"newest value on {address}")
        rows = read_on(cluster, address, f"SELECT v, writetime(v) AS w FROM {ks}.t WHERE k = 1", ConsistencyLevel.ALL)
        assert [(r.v, r.w) for r in rows] == [("newest", 300)]


def test_paged_scans_across_the_cluster_return_every_row_exactly_once(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]])
    try:
        ks = new_keyspace(session, 2)
        session.execute(f"CREATE TABLE {ks}.t (k int, c int, v int, PRIMARY KEY (k, c))")
        insert = session.prepare(f"INSERT INTO {ks}.t (k, c, v) VALUES (?, ?, ?)")
        expected = set()
        for k in range(300):
            for c in range(k % 4):
                session.execute(insert, (k, c, k * c))
                expected.add((k, c))
    finally:
        driver.shutdown()
    for address in ADDRESSES:
        for consistency in (ConsistencyLevel.ONE, ConsistencyLevel.QUORUM):
            driver, session = connect(cluster, [address], consistency)
            try:
                statement = SimpleStatement(f"SELECT k, c FROM {ks}.t", fetch_size=37)
                rows = [(r.k, r.c) for r in session.execute(statement)]
                assert len(rows) == len(expected)
                assert set(rows) == expected
                # Token order, as Cassandra returns a full scan.
                tokens = [r.t for r in session.execute(SimpleStatement(f"SELECT token(k) AS t FROM {ks}.t", fetch_size=50))]
                assert tokens == sorted(tokens)
                limited = list(session.execute(SimpleStatement(f"SELECT k FROM {ks}.t LIMIT 123", fetch_size=50)))
                assert len(limited) == 123
            finally:
                driver.shutdown()


def register_for_events(address, port):
    sock = socket.create_connection((address, port), timeout=30)
    started(sock)
    kinds = ["TOPOLOGY_CHANGE", "STATUS_CHANGE", "SCHEMA_CHANGE"]
    body = struct.pack(">H", len(kinds)) + b"".join(struct.pack(">H", len(k)) + k.encode() for k in kinds)
    sock.sendall(frame(4, 1, 0x0B, body))
    assert read_frame(sock)[3] == READY
    return sock


def next_event(sock):
    while True:
        _, _, stream, opcode, body = read_frame(sock)
        if stream == -1 and opcode == 0x0C:
            length = struct.unpack(">H", body[:2])[0]
            kind = body[2:2 + length].decode()
            rest = body[2 + length:]
            length = struct.unpack(">H", rest[:2])[0]
            return kind, rest[2:2 + length].decode(), rest[2 + length:]


def test_a_killed_node_leaves_quorum_working_then_catches_up_through_hints_and_schema(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.QUORUM)
    events = register_for_events(ADDRESSES[0], cluster.cql_port)
    victim = cluster.nodes[2]
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        victim.kill()
        # QUORUM keeps working; these writes become hints for the dead replica.
        for k in range(100):
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {k})")
        assert len(list(session.execute(f"SELECT * FROM {ks}.t"))) == 100
        # The failure detector convicts it: ALL is refused before anything is sent.
        wait_until(lambda: event_seen(events, "STATUS_CHANGE", "DOWN"), timeout=15, message="STATUS_CHANGE DOWN")
        with pytest.raises(Unavailable) as raised:
            session.execute(at(ConsistencyLevel.ALL, f"INSERT INTO {ks}.t (k, v) VALUES (1000, 1)"))
        assert raised.value.consistency == ConsistencyLevel.ALL
        assert (raised.value.required_replicas, raised.value.alive_replicas) == (3, 2)
        with pytest.raises(Unavailable):
            session.execute(at(ConsistencyLevel.ALL, f"SELECT * FROM {ks}.t WHERE k = 1"))
        # A schema change while it is down.
        session.execute(f"CREATE TABLE {ks}.made_while_down (k int PRIMARY KEY)")
        victim.start(timeout=60)
        wait_until(lambda: event_seen(events, "STATUS_CHANGE", "UP"), timeout=15, message="STATUS_CHANGE UP")
    finally:
        events.close()
        driver.shutdown()

    def caught_up():
        rows = read_on(cluster, victim.address, f"SELECT k FROM {ks}.t", ConsistencyLevel.ONE)
        return len(rows) == 100

    # Reads at ONE on the returned node are local: they see the hints once replayed.
    wait_until(caught_up, timeout=30, message="hints replayed to the returned node")
    rows = read_on(cluster, victim.address,
                   f"SELECT table_name FROM system_schema.tables WHERE keyspace_name = '{ks}'")
    assert sorted(r.table_name for r in rows) == ["made_while_down", "t"]
    driver, session = connect(cluster, [victim.address])
    try:
        wait_until(lambda: driver.control_connection.wait_for_schema_agreement(wait_time=1), timeout=20,
                   message="schema agreement")
    finally:
        driver.shutdown()


_seen_events = []


def event_seen(sock, kind, change):
    sock.settimeout(0.5)
    try:
        while True:
            _seen_events.append(next_event(sock)[:2])
    except (socket.timeout, TimeoutError):
        pass
    finally:
        sock.settimeout(30)
    return (kind, change) in _seen_events


def test_repair_heals_a_replica_that_missed_writes_past_the_hint_window(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.QUORUM)
    victim = cluster.nodes[1]
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        victim.kill()
        time.sleep(HINT_WINDOW_MS / 1000 + 2.5)
        for k in range(200):
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {k})")
        victim.start(timeout=60)
        wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=20, message="every node to see all up")
    finally:
        driver.shutdown()
    # No hints were kept: the returned replica lacks the writes (reads at ONE are local).
    missing = read_on(cluster, victim.address, f"SELECT k FROM {ks}.t")
    assert len(missing) < 200
    # Reads at ONE are answered locally, and one in ten also compares the replicas in the
    # background and repairs the stale one.
    absent = next(k for k in range(200) if k not in {r.k for r in missing})
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.ONE)
    try:
        for _ in range(10):
            assert session.execute(f"SELECT k FROM {ks}.t WHERE k = {absent}").one() is not None
    finally:
        driver.shutdown()
    wait_until(lambda: read_on(cluster, victim.address, f"SELECT k FROM {ks}.t WHERE k = {absent}") != [],
               timeout=10, message="background read repair")
    # QUORUM through the stale replica: its data and the other replica's digest differ, so
    # the coordinator reads both in full, answers the newest and repairs itself first.
    stale = next(k for k in range(200) if k not in {r.k for r in missing} and k != absent)
    rows = read_on(cluster, victim.address, f"SELECT k, v FROM {ks}.t WHERE k = {stale}", ConsistencyLevel.QUORUM)
    assert [(r.k, r.v) for r in rows] == [(stale, stale)]
    assert read_on(cluster, victim.address, f"SELECT k FROM {ks}.t WHERE k = {stale}") != []
    result = subprocess.run([shoal_binary(), "admin", "repair", ks, "--host", ADDRESSES[0],
                             "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "cell(s) repaired" in result.stdout
    assert len(read_on(cluster, victim.address, f"SELECT k FROM {ks}.t")) == 200
    # A second repair finds nothing to do.
    again = subprocess.run([shoal_binary(), "admin", "repair", ks, "t", "--host", ADDRESSES[2],
                            "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "0 cell(s) repaired" in again.stdout


def peers_up_in_status(cluster, count, hosts=ADDRESSES[:1], config=None):
    """True when each of `hosts` sees `count` nodes up and normal (`shoal admin status`;
    `config`: a node's configuration, whose certificates the command needs under TLS)."""
    for host in hosts:
        command = [shoal_binary(), "admin", "status", "--host", host, "--port", str(cluster.internode_port)]
        if config:
            command += ["--config", str(config)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if result.returncode != 0 or result.stdout.count("UN ") != count:
            return False
    return True


def test_admin_status_lists_every_node(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3), timeout=20, message="three nodes up")
    result = subprocess.run([shoal_binary(), "admin", "status", "--host", ADDRESSES[1],
                             "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=30)
    for address in ADDRESSES:
        assert address in result.stdout
    assert "Datacenter: datacenter1" in result.stdout
    assert result.stdout.count("voter") == 3


def test_no_acknowledged_quorum_write_is_lost_when_a_node_dies_under_load(cluster):
    driver, session = connect(cluster, None, ConsistencyLevel.QUORUM)
    ks = new_keyspace(session, 3)
    session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
    insert = session.prepare(f"INSERT INTO {ks}.t (k, v) VALUES (?, ?)")
    acknowledged, stop = [], threading.Event()

    def writer(offset):
        k = offset
        while not stop.is_set():
            try:
                session.execute(insert, (k, k))
                acknowledged.append(k)
            except Exception:
                pass  # not acknowledged: may or may not be there
            k += 8

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    victim = cluster.nodes[1]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        victim.kill()
        time.sleep(3)
        victim.start(timeout=60)
        time.sleep(1.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    try:
        assert len(acknowledged) > 100
        select = session.prepare(f"SELECT v FROM {ks}.t WHERE k = ?")
        lost = [k for k in acknowledged if session.execute(select, (k,)).one() is None]
        assert lost == []
    finally:
        driver.shutdown()


def test_a_paused_replica_gives_write_and_read_timeouts_with_counts(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up")
    driver, session = connect(cluster, [ADDRESSES[0]])
    victim = cluster.nodes[2]
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        session.execute(at(ConsistencyLevel.ALL, f"INSERT INTO {ks}.t (k, v) VALUES (1, 1)"))
        victim.pause()
        try:
            # Still believed alive: the request goes out and the replica never answers.
            try:
                result = session.execute(at(ConsistencyLevel.ALL, f"INSERT INTO {ks}.t (k, v) VALUES (2, 2)"),
                                         trace=True)
            except WriteTimeout as error:
                write_timeout = error
            else:
                pytest.fail(unexpected_success(cluster, ks, victim, "a write", result))
            assert write_timeout.consistency == ConsistencyLevel.ALL
            assert (write_timeout.received_responses, write_timeout.required_responses) == (2, 3)
            assert write_timeout.write_type == WriteType.SIMPLE
            # Once convicted, ALL is refused up front; QUORUM still answers.
            wait_until(lambda: unavailable_at_all(session, ks), timeout=15, message="conviction")
            assert session.execute(at(ConsistencyLevel.QUORUM, f"SELECT v FROM {ks}.t WHERE k = 2")).one().v == 2
        finally:
            victim.resume()
        wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=20, message="the node to be up again")
        victim.pause()
        try:
            try:
                result = session.execute(at(ConsistencyLevel.ALL, f"SELECT v FROM {ks}.t WHERE k = 1"), trace=True)
            except ReadTimeout as error:
                read_timeout = error
            else:
                pytest.fail(unexpected_success(cluster, ks, victim, "a read", result))
            assert (read_timeout.received_responses, read_timeout.required_responses) == (2, 3)
        finally:
            victim.resume()
        wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=20, message="the node to be up again")
    finally:
        driver.shutdown()


def unexpected_success(cluster, ks, victim, what, result):
    """Why `what` at ALL may have succeeded with `victim` paused (seen in CI, not
    reproduced): the request's trace, the table's tablets and the victim's state."""
    try:
        trace = result.get_query_trace(max_wait_sec=10)
        events = "\n".join(f"  {event.source}: {event.description}" for event in trace.events)
    except Exception as error:  # the explanation must not hide the failure
        events = f"  (no trace: {error})"
    ring = subprocess.run([shoal_binary(), "admin", "ring", ks, "t", "--host", ADDRESSES[0],
                           "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=30)
    status = subprocess.run([shoal_binary(), "admin", "status", "--host", ADDRESSES[0],
                             "--port", str(cluster.internode_port)], capture_output=True, text=True, timeout=30)
    state = open(f"/proc/{victim.process.pid}/stat").read().split()[2]
    return (f"{what} at ALL succeeded with {victim.address} paused (process state {state}); its trace:\n"
            f"{events}\nthe table's tablets:\n{ring.stdout}{ring.stderr}"
            f"the members as {ADDRESSES[0]} sees them:\n{status.stdout}{status.stderr}")


def unavailable_at_all(session, ks):
    try:
        session.execute(at(ConsistencyLevel.ALL, f"SELECT v FROM {ks}.t WHERE k = 1"))
    except Unavailable:
        return True
    except ReadTimeout:
        return False
    return False


def test_any_succeeds_with_only_a_hint_which_reaches_the_replica_when_it_returns(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up")
    driver, session = connect(cluster)
    victim = cluster.nodes[2]
    try:
        ks = new_keyspace(session, 1)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        prepared = session.prepare(f"INSERT INTO {ks}.t (k, v) VALUES (?, ?)")
        # A key whose only replica is the victim.
        def replica_of(k):
            replicas = driver.metadata.get_replicas(ks, prepared.bind((k, 0)).routing_key)
            return replicas[0].address if replicas else None

        wait_until(lambda: replica_of(0) is not None, timeout=20, message="the driver's token map")
        key = next(k for k in range(1000) if replica_of(k) == victim.address)
        victim.kill()
        wait_until(lambda: not peers_up_in_status(cluster, 3), timeout=15, message="conviction")
    finally:
        driver.shutdown()
    driver, session = connect(cluster, [ADDRESSES[0]])
    try:
        with pytest.raises(Unavailable):
            session.execute(at(ConsistencyLevel.ONE, f"INSERT INTO {ks}.t (k, v) VALUES ({key}, 1)"))
        session.execute(at(ConsistencyLevel.ANY, f"INSERT INTO {ks}.t (k, v) VALUES ({key}, 42)"))
    finally:
        driver.shutdown()
    victim.start(timeout=60)
    wait_until(lambda: [r.v for r in read_on(cluster, victim.address, f"SELECT v FROM {ks}.t WHERE k = {key}")] == [42],
               timeout=30, message="the hint to reach the returned replica")


def test_shoal_cluster_starts_reports_and_stops_a_local_cluster(tmp_path):
    binary = shoal_binary()
    directory = tmp_path / "local"
    started = subprocess.run([binary, "cluster", "start", "--nodes", "2", "--dir", str(directory), "--detach"],
                             capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        wait_until(lambda: subprocess.run([binary, "cluster", "status", "--dir", str(directory)],
                                          capture_output=True, text=True, timeout=30).stdout.count("UN ") == 2,
                   timeout=20, message="two nodes up")
        driver = Cluster(["127.0.0.1"], port=9042)
        try:
            session = driver.connect()
            assert sorted(h.address for h in driver.metadata.all_hosts()) == ["127.0.0.1", "127.0.0.2"]
            session.execute("CREATE KEYSPACE k WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}")
        finally:
            driver.shutdown()
        # A second cluster on the same addresses is refused: its nodes could not listen,
        # and this cluster's nodes would answer in their place.
        second = subprocess.run([binary, "cluster", "start", "--nodes", "1", "--dir", str(tmp_path / "second"),
                                 "--detach"], capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert "127.0.0.1:9042 is in use" in second.stderr and "another local cluster" in second.stderr, second.stderr
    finally:
        stopped = subprocess.run([binary, "cluster", "stop", "--dir", str(directory)],
                                 capture_output=True, text=True, timeout=120)
    assert "stopped 2 node(s)" in stopped.stdout
    status = subprocess.run([binary, "cluster", "status", "--dir", str(directory)], capture_output=True, text=True, timeout=30)
    assert status.stdout.count("stopped") == 2


def test_a_joining_node_is_announced_once_normal_and_schema_changes_are_pushed_by_every_node(tmp_path):
    addresses = ["127.0.0.5", "127.0.0.6"]
    cql_port = free_port_on_all(addresses)
    internode_port = free_port_on_all(addresses)
    first, second = (ShoalNode(tmp_path / address, address=address, port=cql_port, internode_port=internode_port,
                               seeds=[addresses[0]]) for address in addresses)
    events = None
    try:
        first.start(timeout=60)
        events = register_for_events(addresses[0], cql_port)
        second.start(timeout=60)
        seen = []

        def saw(kind, change):
            events.settimeout(0.5)
            try:
                while True:
                    seen.append(next_event(events))
            except (socket.timeout, TimeoutError):
                pass
            return any(k == kind and c == change for k, c, _ in seen)

        wait_until(lambda: saw("TOPOLOGY_CHANGE", "NEW_NODE"), timeout=15, message="TOPOLOGY_CHANGE NEW_NODE")
        new_node = next(rest for k, c, rest in seen if k == "TOPOLOGY_CHANGE" and c == "NEW_NODE")
        assert socket.inet_ntoa(new_node[1:5]) == addresses[1]
        # Announced up as well, but only once it is normal: drivers hear nothing of a node
        # while it joins (as of Cassandra's, whose native transport starts after bootstrap).
        wait_until(lambda: saw("STATUS_CHANGE", "UP"), timeout=15, message="STATUS_CHANGE UP")
        about_second = [(k, c) for k, c, rest in seen
                        if k in ("TOPOLOGY_CHANGE", "STATUS_CHANGE") and socket.inet_ntoa(rest[1:5]) == addresses[1]]
        assert about_second[:2] == [("TOPOLOGY_CHANGE", "NEW_NODE"), ("STATUS_CHANGE", "UP")], about_second
        # DDL through the second node; the first node pushes the event to its clients.
        driver = Cluster([addresses[1]], port=cql_port,
                         execution_profiles={EXEC_PROFILE_DEFAULT: profile([addresses[1]])})
        try:
            driver.connect().execute(
                "CREATE KEYSPACE pushed WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}")
        finally:
            driver.shutdown()
        wait_until(lambda: saw("SCHEMA_CHANGE", "CREATED"), timeout=15, message="SCHEMA_CHANGE from the other node")
    finally:
        if events:
            events.close()
        first.kill()
        second.kill()


def test_truncate_and_drop_remove_the_data_on_every_node(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up")
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.ALL)
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        for k in range(20):
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {k})")
        session.execute(f"TRUNCATE {ks}.t")
        for address in ADDRESSES:
            assert read_on(cluster, address, f"SELECT * FROM {ks}.t") == []
        for k in range(5):
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES ({k}, {k})")
        session.execute(f"DROP TABLE {ks}.t")
        session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
        for address in ADDRESSES:
            assert read_on(cluster, address, f"SELECT * FROM {ks}.t") == []
    finally:
        driver.shutdown()


def test_a_partition_too_large_to_gather_whole_reads_in_chunks_at_quorum(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up")
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.QUORUM)
    try:
        ks = new_keyspace(session, 3)
        session.execute(f"CREATE TABLE {ks}.series (k int, t int, v int, PRIMARY KEY (k, t))")
        insert = session.prepare(f"INSERT INTO {ks}.series (k, t, v) VALUES (1, ?, ?)")
        rows = 6000  # two cells a row: beyond what a point read gathers whole
        for start in range(0, rows, 200):
            futures = [session.execute_async(insert, (t, t * 2)) for t in range(start, start + 200)]
            for future in futures:
                future.result()
    finally:
        driver.shutdown()
    for address in ADDRESSES:
        driver, session = connect(cluster, [address], ConsistencyLevel.QUORUM)
        try:
            first = list(session.execute(f"SELECT t, v FROM {ks}.series WHERE k = 1 LIMIT 5"))
            assert [(r.t, r.v) for r in first] == [(t, t * 2) for t in range(5)]
            last = list(session.execute(f"SELECT t FROM {ks}.series WHERE k = 1 ORDER BY t DESC LIMIT 3"))
            assert [r.t for r in last] == [rows - 1, rows - 2, rows - 3]
            paged = [r.t for r in session.execute(SimpleStatement(f"SELECT t FROM {ks}.series WHERE k = 1",
                                                                  fetch_size=1000))]
            assert paged == list(range(rows))
            sliced = list(session.execute(f"SELECT t FROM {ks}.series WHERE k = 1 AND t >= 4000 AND t < 4003"))
            assert [r.t for r in sliced] == [4000, 4001, 4002]
            # Backwards, chunk by chunk from the end, across the whole partition.
            descending = [r.t for r in session.execute(SimpleStatement(
                f"SELECT t FROM {ks}.series WHERE k = 1 ORDER BY t DESC", fetch_size=1000))]
            assert descending == list(reversed(range(rows)))
        finally:
            driver.shutdown()
    # A range deletion sorts at the start of the partition: chunks read backwards from the
    # end must still see it.
    driver, session = connect(cluster, [ADDRESSES[1]], ConsistencyLevel.QUORUM)
    try:
        session.execute(f"DELETE FROM {ks}.series WHERE k = 1 AND t >= 1000 AND t < 5000")
        descending = [r.t for r in session.execute(SimpleStatement(
            f"SELECT t FROM {ks}.series WHERE k = 1 ORDER BY t DESC", fetch_size=700))]
        assert descending == list(reversed(range(5000, rows))) + list(reversed(range(1000)))
    finally:
        driver.shutdown()


def test_schema_changes_continue_when_the_metadata_leader_dies(cluster):
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up")
    first = cluster.nodes[0]  # it bootstrapped the cluster: the first leader
    first.kill()
    try:
        driver, session = connect(cluster, [ADDRESSES[1]], ConsistencyLevel.QUORUM)
        try:
            ks = new_keyspace(session, 3)
            session.execute(f"CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)")
            session.execute(f"INSERT INTO {ks}.t (k, v) VALUES (1, 1)")
            assert session.execute(f"SELECT v FROM {ks}.t WHERE k = 1").one().v == 1
        finally:
            driver.shutdown()
    finally:
        first.start(timeout=60)
    wait_until(lambda: peers_up_in_status(cluster, 3, ADDRESSES), timeout=30, message="all nodes up again")
    # The returned node catches up on the metadata log from the new leader.
    wait_until(lambda: [r.table_name for r in read_on(
        cluster, ADDRESSES[0], f"SELECT table_name FROM system_schema.tables WHERE keyspace_name = '{ks}'")] == ["t"],
        timeout=20, message="the schema on the returned node")


def test_seeds_form_a_cluster_whatever_order_they_start_in(tmp_path):
    """`--seeds A,B` with B started first: B waits for A, A bootstraps, B joins. (Both
    used to wait for a leader until their deadline and exit.)"""
    addresses = ["127.0.0.5", "127.0.0.6"]
    cql_port = free_port_on_all(addresses)
    internode_port = free_port_on_all(addresses)
    first, second = [
        ShoalNode(tmp_path / f"node-{address}", address=address, port=cql_port,
                  internode_port=internode_port, seeds=addresses)
        for address in addresses
    ]
    try:
        second.launch()
        second.wait_for_log("waiting for a seed to let this node join")
        first.start(timeout=60)
        second.wait_listening(timeout=60)
        driver = Cluster([first.address], port=cql_port)
        try:
            session = driver.connect()
            wait_until(lambda: len(list(session.execute("SELECT peer FROM system.peers"))) == 1,
                       message="the second seed to be a peer of the first")
        finally:
            driver.shutdown()
    finally:
        second.kill()
        first.kill()


def test_concurrent_joins_never_make_more_than_three_metadata_voters(tmp_path):
    """Four nodes joining one seed at the same moment: the first two to be admitted become
    voters, the others learners — never more than three voters (the leader admits one
    join at a time)."""
    addresses = [f"127.0.0.{n}" for n in range(7, 12)]
    cql_port = free_port_on_all(addresses)
    internode_port = free_port_on_all(addresses)
    nodes = [ShoalNode(tmp_path / f"node-{address}", address=address, port=cql_port,
                       internode_port=internode_port, seeds=addresses[:1])
             for address in addresses]
    try:
        nodes[0].start(timeout=60)
        for node in nodes[1:]:
            node.launch()
        for node in nodes[1:]:
            node.wait_listening(timeout=90)

        def status():
            result = subprocess.run([shoal_binary(), "admin", "status", "--host", addresses[0],
                                     "--port", str(internode_port)], capture_output=True, text=True, timeout=30)
            return result.stdout if result.returncode == 0 else ""

        wait_until(lambda: status().count("UN ") == 5, timeout=30, message="all five nodes up")
        lines = [line for line in status().splitlines() if line.startswith("UN ")]
        assert sum(" voter" in line for line in lines) == 3, "\n".join(lines)
        assert sum(" learner" in line for line in lines) == 2, "\n".join(lines)
    finally:
        for node in nodes:
            node.kill()
