"""The read scheduler on a real node: while scans keep every read thread busy, point
reads are served at once, ahead of the queued scans and with the CPU first, so their
latency stays close to what it is on an idle node; the scans still finish; `shoal admin
tpstats` shows what each class of reads waited."""

import random
import subprocess
import time

from cassandra.cluster import Cluster

from shoal_process import ShoalNode, shoal_binary
from test_operations import admin_json

ROWS = 20_000


def point_read_p99(session, reads=400):
    select = session.prepare("SELECT field0 FROM ycsb.usertable WHERE y_id = ?")
    latencies = []
    for _ in range(reads):
        key = f"user{random.randrange(ROWS)}"
        started = time.perf_counter()
        session.execute(select, (key,))
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    return latencies[int(len(latencies) * 0.99) - 1]


def bench(node, *arguments):
    return [shoal_binary(), "bench", "mix", "--contact", f"{node.address}:{node.port}", "--records", str(ROWS),
            *arguments]


def test_point_reads_stay_fast_while_scans_saturate_the_node_and_the_scans_finish(tmp_path):
    node = ShoalNode(tmp_path / "node")
    node.start()
    scans = None
    try:
        subprocess.run(bench(node, "--phase", "load", "--concurrency", "32"), check=True, capture_output=True,
                       timeout=300)
        driver = Cluster([node.address], port=node.port)
        session = driver.connect()
        idle = point_read_p99(session)
        # Scans only (token ranges of 1..10,000 rows), from 32 clients: far more than the
        # node's read threads can serve at once.
        scans = subprocess.Popen(bench(node, "--phase", "run", "--point-share", "0", "--concurrency", "32",
                                       "--duration-seconds", "20"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        time.sleep(3)
        busy = point_read_p99(session)
        before = {c["class"]: c for c in admin_json(node, "tpstats")["classes"]}
        output, _ = scans.communicate(timeout=120)
        assert scans.returncode == 0, output
        driver.shutdown()
        statistics = {c["class"]: c for c in admin_json(node, "tpstats")["classes"]}
        # The scans ran through the scheduler and were queued (more than the read threads
        # at once), and every one of them finished.
        assert statistics["scan"]["served"] > 50 and statistics["scan"]["queued"] == 0
        assert before["scan"]["mean_wait_ms"] > 0
        assert "RANGE" in output and "errors" in output
        range_line = next(line for line in output.splitlines() if line.strip().startswith("RANGE"))
        assert range_line.split()[-1] in ("-", "0"), range_line
        # Point reads never waited in the queue behind the scans.
        assert statistics["local_point"]["served"] == 0
        assert busy <= max(25 * idle, 0.05), f"point read p99 {busy * 1000:.1f} ms busy, {idle * 1000:.1f} ms idle"
    finally:
        if scans is not None and scans.poll() is None:
            scans.kill()
        node.kill()
