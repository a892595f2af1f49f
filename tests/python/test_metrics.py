"""The Prometheus endpoint: what one node exports after requests, and a real Prometheus
server (Debian's `prometheus`) scraping a three-node cluster and computing a request
rate for every node, each of which also reports the replica requests it served."""

import json
import re
import shutil
from pathlib import Path
import subprocess
import time
import urllib.parse
import urllib.request

from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster
from cassandra.query import SimpleStatement

from shoal_process import ShoalNode, free_port, free_port_on_all
from test_cluster import ADDRESSES, LocalCluster


def scrape(address, port):
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def value(text, line_start):
    for line in text.splitlines():
        if line.startswith(line_start + " ") or line.startswith(line_start + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_node_exports_request_latencies_errors_tables_and_storage(tmp_path):
    port = free_port_on_all(["127.0.0.10"])
    config = tmp_path / "metrics.toml"
    config.write_text(f"metrics_port = {port}\n")
    with ShoalNode(tmp_path / "node", address="127.0.0.10", config=config) as node:
        cluster = Cluster([node.address], port=node.port)
        session = cluster.connect()
        session.execute("CREATE KEYSPACE m WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE m.t (k int PRIMARY KEY, v int)")
        insert = session.prepare("INSERT INTO m.t (k, v) VALUES (?, ?)")
        for k in range(50):
            session.execute(insert, (k, k))
        session.execute("SELECT v FROM m.t WHERE k = 1")
        for k in range(40, 50):
            session.execute("DELETE FROM m.t WHERE k = %s", (k,))
        assert len(list(session.execute("SELECT k FROM m.t"))) == 40
        try:
            session.execute("SELECT * FROM m.no_such_table")
        except Exception:
            pass
        # A strongly consistent keyspace's writes go through its consensus log.
        session.execute("CREATE KEYSPACE strong_m WITH replication = {'class': 'SimpleStrategy', "
                        "'replication_factor': 1} AND consistency = 'strong'")
        session.execute("CREATE TABLE strong_m.t (k int PRIMARY KEY, v int)")
        for k in range(5):
            session.execute(SimpleStatement(f"INSERT INTO strong_m.t (k, v) VALUES ({k}, {k})",
                                            consistency_level=ConsistencyLevel.ONE))
        text = scrape(node.address, port)
        cluster.shutdown()
    assert value(text, 'shoal_request_latency_seconds_count{class="write",consistency="LOCAL_ONE"}') == 60
    assert value(text, 'shoal_request_latency_seconds_count{class="point_read",consistency="LOCAL_ONE"}') == 1
    assert value(text, 'shoal_request_errors_total{code="0x2200"}') == 1
    assert value(text, 'shoal_table_writes_total{keyspace="m",table="t"}') == 60
    assert value(text, 'shoal_table_tombstones_read_total{keyspace="m",table="t"}') >= 10
    assert value(text, "shoal_read_repairs_total") == 0
    assert value(text, "shoal_client_connections_accepted_total") >= 1
    assert value(text, "shoal_storage_memtable_bytes") > 0
    assert value(text, "shoal_raft_is_leader") == 1
    # Members by state: the one node is normal, and every state is there, at 0 if empty.
    assert value(text, 'shoal_cluster_members_in_state{state="normal"}') == 1
    assert value(text, 'shoal_cluster_members_in_state{state="joining"}') == 0
    assert value(text, 'shoal_cluster_members_in_state{state="leaving"}') == 0
    assert value(text, "shoal_tablet_migrations") == 0
    assert value(text, "shoal_consensus_entries_committed_total") >= 5
    assert value(text, "shoal_consensus_log_syncs_total") >= 1
    assert value(text, "shoal_consensus_log_bytes_total") > 0
    # The dashboard in the repo asks only for what a node exports.
    dashboard = (Path(__file__).resolve().parents[2] / "docs" / "grafana" / "shoal.json").read_text()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("shoal_")}
    for name in set(re.findall(r"shoal_[a-z0-9_]+", dashboard)):
        assert name in exported, f"the dashboard queries {name}, which no node exports"


def prometheus_query(port, query):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["data"]["result"]


def test_prometheus_scrapes_a_three_node_cluster_and_computes_a_request_rate(tmp_path):
    prometheus_binary = shutil.which("prometheus")
    assert prometheus_binary, "scripts/test.sh installs Debian's prometheus package"
    local = LocalCluster(tmp_path)
    metrics_port = free_port_on_all(ADDRESSES)
    local.config.write_text(f"metrics_port = {metrics_port}\n")
    web_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: shoal\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(f'{a}:{metrics_port}') for a in ADDRESSES)}]\n")
    prometheus = None
    driver = None
    try:
        local.start()
        prometheus = subprocess.Popen(
            [prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web_port}"],
            stdout=open(tmp_path / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
        driver = Cluster([ADDRESSES[0]], port=local.cql_port)
        session = driver.connect()
        session.execute("CREATE KEYSPACE rated WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE rated.t (k int PRIMARY KEY, v int)")
        insert = session.prepare("INSERT INTO rated.t (k, v) VALUES (?, ?)")
        deadline = time.time() + 60
        rates = {}
        k = 0
        while time.time() < deadline:
            # Keep writing through every node (the driver spreads requests over them).
            for _ in range(200):
                session.execute(insert, (k, k))
                k += 1
            try:
                result = prometheus_query(
                    web_port, 'sum by (instance) (rate(shoal_request_latency_seconds_count{class="write"}[10s]))')
            except OSError:
                continue  # Prometheus is still starting
            rates = {r["metric"]["instance"]: float(r["value"][1]) for r in result}
            if len(rates) == 3 and all(rate > 0 for rate in rates.values()):
                break
        assert len(rates) == 3 and all(rate > 0 for rate in rates.values()), \
            f"write rates per node: {rates}; prometheus log: {(tmp_path / 'prometheus.log').read_text()[-2000:]}"
        up = prometheus_query(web_port, "up")
        assert sorted(float(r["value"][1]) for r in up) == [1.0, 1.0, 1.0]
        # Every node coordinated writes and every write went to all three replicas: each
        # node served replica requests for the other two (which its streaming yields to).
        for address in ADDRESSES:
            served = value(scrape(address, metrics_port), "shoal_replica_request_latency_seconds_count")
            assert served and served > 0, f"{address} reports {served} replica requests served"
    finally:
        if driver:
            driver.shutdown()
        if prometheus:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        local.stop()
