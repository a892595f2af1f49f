"""The balancer evens out bytes per node as well as tablets (issue 10).

Two real nodes, replication factor 1 (a tablet's bytes live on one node), and an ordered
table (a bigint key's token is the key, so rows can be aimed at chosen tablets) that never
splits. Both nodes hold eight tablets; all the data goes into two tablets of the first
node. Counts are even, so only bytes can ask for a move: the first node gives one loaded
tablet to the second and takes an empty one back.
"""

import os

import pytest

from test_elastic import ElasticCluster, connect, wait_until

ROWS_PER_TABLET = 100
# 20 MB per loaded tablet: a move must bring two nodes at least 16 MiB closer.
ROW_BYTES = 200_000


@pytest.fixture
def cluster(tmp_path):
    cluster = ElasticCluster(tmp_path, config_lines=["tablet_split_mib = 0"])
    try:
        cluster.start(2)
        yield cluster
    finally:
        cluster.stop()


def test_a_node_holding_the_data_trades_a_loaded_tablet_for_an_empty_one(cluster):
    driver, session = connect(cluster)
    try:
        session.execute("CREATE KEYSPACE skew WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE skew.blobs (k bigint PRIMARY KEY, pad blob) "
                        "WITH partitioner = 'ordered'")
        ring = cluster.ring("skew", "blobs")
        heavy = cluster.running()[0]
        loaded = [tablet for tablet in ring if tablet["replicas"] == [heavy]][:2]
        assert len(loaded) == 2, ring
        keys = [tablet["last_token"] - i for tablet in loaded for i in range(ROWS_PER_TABLET)]
        insert = session.prepare("INSERT INTO skew.blobs (k, pad) VALUES (?, ?)")
        for start in range(0, len(keys), 20):
            futures = [session.execute_async(insert, (k, os.urandom(ROW_BYTES)))
                       for k in keys[start:start + 20]]
            for future in futures:
                future.result()
        for address in cluster.running():
            cluster.admin("flush", host=address)

        loaded_ids = {tablet["id"] for tablet in loaded}

        def traded():
            ring = cluster.ring("skew", "blobs")
            if any(tablet["moving"] for tablet in ring):
                return False
            holders = {tablet["replicas"][0] for tablet in ring if tablet["id"] in loaded_ids}
            return len(holders) == 2

        wait_until(traded, timeout=90, message="one loaded tablet moved to the other node")
        ring = cluster.ring("skew", "blobs")
        per_node = {address: sum(1 for t in ring if t["replicas"] == [address])
                    for address in cluster.running()}
        assert sorted(per_node.values()) == [8, 8], ring
        rows = {row.k for row in session.execute("SELECT k FROM skew.blobs")}
        assert rows == set(keys)
    finally:
        driver.shutdown()
