"""The operator's commands (`shoal admin …`, nodetool's everyday set) against a real node:
flush, compact, tablestats, tablehistograms, compactionstats, info, ring, snapshots with a
snapshot → wipe → restore round trip that loses nothing, drain, and cleanup on a cluster."""

import json
import shutil
import subprocess

import pytest
from cassandra.cluster import Cluster, NoHostAvailable

from shoal_process import ShoalNode, shoal_binary

ADDRESS = "127.0.0.11"


def admin(node, *arguments, check=True):
    result = subprocess.run([shoal_binary(), "admin", *arguments, "--host", node.address,
                             "--port", str(node.internode_port)], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def admin_json(node, *arguments):
    return json.loads(admin(node, *arguments, "--json").stdout)


def load(node, rows):
    cluster = Cluster([node.address], port=node.port)
    session = cluster.connect()
    session.execute("CREATE KEYSPACE IF NOT EXISTS ops WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute("CREATE TABLE IF NOT EXISTS ops.t (k int PRIMARY KEY, v text)")
    insert = session.prepare("INSERT INTO ops.t (k, v) VALUES (?, ?)")
    for k in range(rows):
        session.execute(insert, (k, f"value-{k}"))
    return cluster, session


def rows_of(node):
    cluster = Cluster([node.address], port=node.port)
    try:
        return {r.k: r.v for r in cluster.connect().execute("SELECT k, v FROM ops.t")}
    finally:
        cluster.shutdown()


def test_statistics_flush_compact_info_and_ring(tmp_path):
    with ShoalNode(tmp_path / "node", address=ADDRESS) as node:
        cluster, _ = load(node, 300)
        cluster.shutdown()
        assert admin_json(node, "flush") == {"flushed": True}
        assert admin_json(node, "compact")["compacted"] is True
        tables = admin_json(node, "tablestats", "ops")["tables"]
        assert [(t["keyspace"], t["table"]) for t in tables] == [("ops", "t")]
        assert tables[0]["local_writes"] == 300 and tables[0]["disk_bytes"] > 0
        assert "running_compactions" in admin_json(node, "compactionstats")
        histograms = admin_json(node, "tablehistograms", "ops", "t")["percentiles"]
        assert [p["percentile"] for p in histograms] == ["50%", "75%", "95%", "98%", "99%", "max"]
        write_latencies = [p["write_latency_us_at_most"] for p in histograms]
        assert all(w is not None and w >= 50 for w in write_latencies) and write_latencies == sorted(write_latencies)
        info = admin_json(node, "info")
        assert info["address"] == ADDRESS and info["native_transport_active"] is True
        ring = admin_json(node, "ring", "ops", "t")["tablets"]
        assert ring and all(t["replicas"] == [ADDRESS] for t in ring)
        assert "ops" in admin(node, "tablestats").stdout  # the text form
        error = admin(node, "tablestats", "no_such_keyspace", check=False)
        assert error.returncode != 0 and "does not exist" in error.stderr


def test_snapshot_wipe_restore_loses_nothing(tmp_path):
    node = ShoalNode(tmp_path / "node", address=ADDRESS)
    with node:
        cluster, _ = load(node, 500)
        cluster.shutdown()
        expected = rows_of(node)
        assert len(expected) == 500
        snapshot = admin_json(node, "snapshot", "--tag", "before-wipe")
        assert snapshot["tag"] == "before-wipe" and snapshot["bytes"] > 0
        listed = admin_json(node, "listsnapshots")["snapshots"]
        assert [s["tag"] for s in listed] == ["before-wipe"]
        bad = admin(node, "snapshot", "--tag", "../escape", check=False)
        assert bad.returncode != 0 and "invalid snapshot tag" in bad.stderr
        assert node.stop() == 0
    # Wipe the node's store, then restore the snapshot in its place.
    store = node.data_dir / "rocksdb"
    shutil.rmtree(store)
    shutil.copytree(node.data_dir / "snapshots" / "before-wipe", store)
    with node:
        assert rows_of(node) == expected
        assert admin_json(node, "clearsnapshot", "--tag", "before-wipe") == {"removed": ["before-wipe"]}
        assert admin_json(node, "listsnapshots")["snapshots"] == []


def test_drain_stops_serving_clients_and_keeps_every_write(tmp_path):
    node = ShoalNode(tmp_path / "node", address=ADDRESS)
    with node:
        cluster, _ = load(node, 100)
        cluster.shutdown()
        assert admin_json(node, "drain") == {"drained": True}
        refused = Cluster([node.address], port=node.port, connect_timeout=3)
        with pytest.raises(NoHostAvailable):
            refused.connect()
        refused.shutdown()
        assert admin_json(node, "info")["native_transport_active"] is False
        node.kill()  # after a drain even a kill loses nothing
    with node:
        assert len(rows_of(node)) == 100


def test_cleanup_keeps_every_row_a_node_replicates(tmp_path):
    from test_cluster import ADDRESSES, LocalCluster
    local = LocalCluster(tmp_path)
    driver = None
    try:
        local.start()
        driver = Cluster([ADDRESSES[0]], port=local.cql_port)
        session = driver.connect()
        session.execute("CREATE KEYSPACE ops WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE ops.t (k int PRIMARY KEY, v text)")
        insert = session.prepare("INSERT INTO ops.t (k, v) VALUES (?, ?)")
        for k in range(300):
            session.execute(insert, (k, f"value-{k}"))
        for node in local.nodes:
            outcome = admin_json(node, "cleanup", "ops")
            # With RF 1 on three nodes, each node replicates about a third of the tablets.
            assert outcome["tablets_cleaned"] > 0
        assert len(list(session.execute("SELECT k FROM ops.t"))) == 300
    finally:
        if driver:
            driver.shutdown()
        local.stop()
