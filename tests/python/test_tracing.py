"""Query tracing as Cassandra users know it: the driver's `trace=True` and cqlsh's
`TRACING ON` get a trace id back and read the trace from `system_traces`; on a cluster the
trace names the replicas the coordinator asked and can be read through any node;
`shoal admin settraceprobability` traces requests nobody asked to trace; `netstats` shows
the node's messages to its peers."""

import json
import subprocess
import time
import uuid

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from shoal_process import shoal_binary
from test_cluster import ADDRESSES, LocalCluster, connect, wait_until
from test_cqlsh import cqlsh


def activities(trace):
    return [event.description for event in trace.events]


def test_a_traced_read_and_write_come_back_with_their_trace(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    written = session.execute("INSERT INTO t (k, v) VALUES (1, 'one')", trace=True)
    write_trace = written.get_query_trace(max_wait_sec=10)
    assert write_trace.request_type == "Execute CQL3 query"
    assert write_trace.duration.total_seconds() > 0
    assert write_trace.parameters["query"] == "INSERT INTO t (k, v) VALUES (1, 'one')"
    assert any(a.startswith("Parsing INSERT") for a in activities(write_trace))
    assert any(a.startswith("Writing at LOCAL_ONE") for a in activities(write_trace))
    assert activities(write_trace)[-1] == "Request complete"

    read = session.execute(SimpleStatement("SELECT v FROM t WHERE k = 1"), trace=True)
    assert read.one().v == "one"
    read_trace = read.get_query_trace(max_wait_sec=10)
    assert "Read 1 live rows" in activities(read_trace)
    elapsed = [event.source_elapsed for event in read_trace.events]
    assert elapsed == sorted(elapsed)
    assert read_trace.trace_id != write_trace.trace_id


def test_prepared_statements_and_errors_are_traced(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    select = session.prepare("SELECT v FROM t WHERE k = ?")
    result = session.execute(select, (7,), trace=True)
    trace = result.get_query_trace(max_wait_sec=10)
    assert trace.request_type == "Execute CQL3 prepared query"
    assert trace.parameters["query"] == "SELECT v FROM t WHERE k = ?"
    assert "Read 0 live rows" in activities(trace)


def test_untraced_requests_come_back_without_a_trace(session):
    result = session.execute("SELECT release_version FROM system.local")
    assert result.get_query_trace() is None


def test_cqlsh_tracing_on_prints_the_trace(node):
    result = cqlsh(node, "CREATE KEYSPACE IF NOT EXISTS tracing_ks WITH replication = "
                         "{'class': 'SimpleStrategy', 'replication_factor': 1};"
                         "CREATE TABLE IF NOT EXISTS tracing_ks.t (k int PRIMARY KEY);"
                         "TRACING ON; SELECT * FROM tracing_ks.t WHERE k = 1;")
    assert result.returncode == 0, result.stderr
    assert "Tracing session:" in result.stdout
    assert "Request complete" in result.stdout


def admin(node, *arguments, check=True):
    result = subprocess.run([shoal_binary(), "admin", *arguments, "--host", node.address,
                             "--port", str(node.internode_port)], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("tracing"))
    try:
        local.start()
        yield local
    finally:
        local.stop()


def test_a_cluster_trace_names_the_replicas_and_is_readable_through_every_node(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.QUORUM)
    try:
        session.execute("CREATE KEYSPACE traced WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE traced.t (k int PRIMARY KEY, v int)")
        session.execute("INSERT INTO traced.t (k, v) VALUES (1, 1)")
        result = session.execute("SELECT v FROM traced.t WHERE k = 1", trace=True)
        trace = result.get_query_trace(max_wait_sec=10)
        remote = [a for a in activities(trace) if a.startswith("Sending") and "READ" in a]
        assert remote, activities(trace)
        assert all(f"/{ADDRESSES[0]}" not in a for a in remote)
        assert any(a.startswith("/127.0.0.") and "answered" in a for a in activities(trace))
        assert trace.coordinator == ADDRESSES[0]
    finally:
        driver.shutdown()
    for address in ADDRESSES:
        driver, session = connect(cluster, [address])
        try:
            rows = list(session.execute("SELECT duration FROM system_traces.sessions WHERE session_id = %s",
                                        (trace.trace_id,)))
            assert len(rows) == 1 and rows[0].duration > 0, address
        finally:
            driver.shutdown()


def test_settraceprobability_traces_requests_nobody_asked_to_trace(cluster):
    node = cluster.nodes[1]
    bad = admin(node, "settraceprobability", "1.5", check=False)
    assert bad.returncode != 0 and "between 0 and 1" in bad.stderr
    assert json.loads(admin(node, "gettraceprobability", "--json").stdout) == {"trace_probability": 0.0}
    admin(node, "settraceprobability", "1")
    marker = f"sampled_{uuid.uuid4().hex[:8]}"
    driver, session = connect(cluster, [node.address])
    try:
        session.execute(f"SELECT key FROM system.local WHERE key = '{marker}'")
        admin(node, "settraceprobability", "0")
        assert json.loads(admin(node, "gettraceprobability", "--json").stdout) == {"trace_probability": 0.0}

        def sampled():
            rows = session.execute(SimpleStatement("SELECT coordinator, parameters FROM system_traces.sessions",
                                                   consistency_level=ConsistencyLevel.ALL))
            return [r for r in rows if marker in (r.parameters or {}).get("query", "")]
        wait_until(lambda: sampled(), timeout=15, message="the sampled request's trace")
        assert str(sampled()[0].coordinator) == node.address
    finally:
        driver.shutdown()


def test_netstats_shows_the_mode_and_the_messages_to_each_peer(cluster):
    driver, session = connect(cluster, [ADDRESSES[0]], ConsistencyLevel.ALL)
    try:
        session.execute("CREATE KEYSPACE IF NOT EXISTS netstats WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE IF NOT EXISTS netstats.t (k int PRIMARY KEY)")
        for k in range(20):
            session.execute("INSERT INTO netstats.t (k) VALUES (%s)", (k,))
    finally:
        driver.shutdown()
    stats = json.loads(admin(cluster.nodes[0], "netstats", "--json").stdout)
    assert stats["mode"] == "NORMAL" and stats["streams"] == []
    peers = {p["address"].split(":")[0]: p for p in stats["peers"]}
    assert set(ADDRESSES[1:3]) <= set(peers)
    assert all(peers[a]["completed"] >= 20 and peers[a]["connected"] for a in ADDRESSES[1:3])
    text = admin(cluster.nodes[0], "netstats").stdout
    assert "mode: NORMAL" in text and "streams: none" in text
