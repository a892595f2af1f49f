"""Ordered tables of strongly consistent keyspaces split too (issue 11): a tablet that grows
past the split size is planned to split, its Raft group is fenced, and once every member
applied the fence the halves get groups of their own. Writes that meet the fence wait and
go to the half that holds them; nothing acknowledged is lost, and the halves' groups keep
ordering writes after everything the old group applied (its clock), also after a restart.

One cluster of three real nodes, replication factor 3 (every node holds every tablet, so
a split moves no data and the halves stay on all three), split threshold 1 MiB.
"""

import os
import threading

import pytest
from cassandra.query import SimpleStatement

from test_elastic import ElasticCluster, connect, wait_until
from test_ordered_tables import TABLETS_PER_NODE, tablets_meeting

ROWS = 6000
FIRST_KEY = -1000
PAD_BYTES = 1000
PROBE = FIRST_KEY + 3
# Far in the future: every timestamp the old group applies after the probe is moved past it.
FUTURE_MICROS = 4_000_000_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = ElasticCluster(tmp_path_factory.mktemp("strong-splits"), config_lines=["tablet_split_mib = 1"])
    try:
        cluster.start(3)
        yield cluster
    finally:
        cluster.stop()


def table_tablets(cluster, host=None):
    return cluster.ring("strong_ordered", "events", host=host)


def holding_loaded_keys(tablets):
    return tablets_meeting(tablets, FIRST_KEY, FIRST_KEY + ROWS - 1)


@pytest.fixture(scope="module")
def split(cluster):
    """`strong_ordered.events` loaded with ROWS sequential keys of 1 KB, in key order, while
    its tablets split; a writer keeps updating keys all along. Returns the loaded keys and
    the writer's last acknowledged value of each key it wrote."""
    driver, session = connect(cluster)
    try:
        session.execute("CREATE KEYSPACE strong_ordered WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 3} AND consistency = 'strong'")
        session.execute("CREATE TABLE strong_ordered.events (k bigint PRIMARY KEY, v int, pad blob) "
                        "WITH partitioner = 'ordered'")
        session.execute(f"INSERT INTO strong_ordered.events (k, v) VALUES ({PROBE}, 1) USING TIMESTAMP {FUTURE_MICROS}")
        before = len(holding_loaded_keys(table_tablets(cluster)))

        acknowledged, failures, stop = {}, [], threading.Event()

        def keep_writing():
            update = session.prepare("UPDATE strong_ordered.events SET v = ? WHERE k = ?")
            version = 0
            while not stop.is_set():
                version += 1
                key = FIRST_KEY + 10 + (version * 37) % (ROWS - 20)
                try:
                    session.execute(update, (version, key))
                    acknowledged[key] = version
                except Exception as error:  # every write must be taken, split or not
                    failures.append(f"{key}: {error!r}")

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            insert = session.prepare("INSERT INTO strong_ordered.events (k, pad) VALUES (?, ?)")
            for start in range(FIRST_KEY, FIRST_KEY + ROWS, 200):
                futures = [session.execute_async(insert, (k, os.urandom(PAD_BYTES)))
                           for k in range(start, min(start + 200, FIRST_KEY + ROWS))]
                for future in futures:
                    future.result()
            for address in cluster.running():
                cluster.admin("flush", host=address)
            wait_until(lambda: len(holding_loaded_keys(table_tablets(cluster))) >= before + 3, timeout=120,
                       message="the strongly consistent table's tablets split")
        finally:
            stop.set()
            writer.join(timeout=60)
        assert not failures, f"writes refused while tablets split: {failures[:5]}"
        assert len(acknowledged) > 20, "the writer kept writing through the splits"
        return list(range(FIRST_KEY, FIRST_KEY + ROWS)), acknowledged
    finally:
        driver.shutdown()


def test_a_growing_strong_table_splits_and_every_node_sees_the_same_halves_on_every_replica(cluster, split):
    # A node applies the metadata log a moment after another: their views meet.
    def views_agree():
        views[:] = [holding_loaded_keys(table_tablets(cluster, host=address)) for address in cluster.running()]
        return all(view == views[0] for view in views)

    views = []
    wait_until(views_agree, timeout=30, message="every node has the same tablet map")
    assert len(views[0]) >= 4
    # Replication factor 3 on three nodes: each half stays on all of them.
    assert all(len(tablet["replicas"]) == 3 for tablet in views[0])


@pytest.mark.parametrize("coordinator", [0, 1, 2])
def test_every_row_and_every_acknowledged_write_is_read_through_every_node(cluster, split, coordinator):
    loaded, acknowledged = split
    driver, session = connect(cluster, addresses=[cluster.running()[coordinator]])
    try:
        rows = session.execute(SimpleStatement("SELECT k, v FROM strong_ordered.events", fetch_size=500))
        seen = {row.k: row.v for row in rows}
        assert sorted(seen) == sorted(set(loaded) | {PROBE})
        for key, version in acknowledged.items():
            assert seen[key] == version, f"key {key}: read {seen[key]}, acknowledged {version}"
    finally:
        driver.shutdown()


def test_the_halves_order_writes_after_everything_the_split_group_applied_also_after_a_restart(cluster, split):
    driver, session = connect(cluster)
    try:
        # Stamped long before the probe's first write, but later in the log: it wins, as it
        # would have in the unsplit group.
        session.execute(f"UPDATE strong_ordered.events USING TIMESTAMP 1 SET v = 2 WHERE k = {PROBE}")
        assert session.execute(f"SELECT v FROM strong_ordered.events WHERE k = {PROBE}").one().v == 2
        applied = session.execute(f"UPDATE strong_ordered.events SET v = 3 WHERE k = {PROBE} IF v = 2").one()
        assert applied[0] is True
    finally:
        driver.shutdown()

    restarted = cluster.running()[1]
    cluster.nodes[restarted].kill()
    cluster.nodes[restarted].start(timeout=60)
    wait_until(lambda: cluster.settled(3), timeout=60, message="the restarted node back")
    driver, session = connect(cluster, addresses=[restarted])
    try:
        session.execute(f"UPDATE strong_ordered.events USING TIMESTAMP 2 SET v = 4 WHERE k = {PROBE}")
        assert session.execute(f"SELECT v FROM strong_ordered.events WHERE k = {PROBE}").one().v == 4
        count = session.execute("SELECT count(*) FROM strong_ordered.events").one()[0]
        assert count == ROWS  # the probe is one of the loaded keys
    finally:
        driver.shutdown()


def test_empty_neighbours_merge_behind_both_fences_and_the_merged_groups_serve_every_request(cluster, split):
    """The splits took the table past the tablets it was created with; pairs of empty
    neighbours (the rest of the key space) then merge, each behind the fences of both its
    groups, until the table is back at that count while the loaded range stays split.
    Keys across the whole key space, merged tablets included, are written, read in order
    and updated conditionally."""
    created_with = TABLETS_PER_NODE * len(cluster.running())
    wait_until(lambda: len(table_tablets(cluster)) == created_with, timeout=120,
               message=f"empty pieces merged back to {created_with} tablets")
    assert len(holding_loaded_keys(table_tablets(cluster))) >= 4
    driver, session = connect(cluster)
    try:
        insert = session.prepare("INSERT INTO strong_ordered.events (k, v) VALUES (?, ?)")
        step = 2**64 // 200
        keys = [-(2**63) + 1 + i * step for i in range(200)]
        for k in keys:
            session.execute(insert, (k, 1))
        written = set(keys)
        scanned = SimpleStatement("SELECT k FROM strong_ordered.events", fetch_size=500)
        assert [row.k for row in session.execute(scanned) if row.k in written] == keys
        for k in keys[::40]:
            applied = session.execute(f"UPDATE strong_ordered.events SET v = 2 WHERE k = {k} IF v = 1").one()
            assert applied[0] is True
            assert session.execute(f"SELECT v FROM strong_ordered.events WHERE k = {k}").one().v == 2
    finally:
        driver.shutdown()
