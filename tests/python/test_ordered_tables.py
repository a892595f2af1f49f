"""Ordered tables (issue 11): `WITH partitioner = 'ordered'` keeps partitions in key order,
so a token range is a key range; a table fed with sequential keys splits its tablets by
size and the balancer spreads them over every node.

One cluster of three real nodes (replication factor 1, so that spreading means moving
data) with a split threshold of 1 MiB, shared by the tests of this module.
"""

import os

import pytest
from cassandra.query import SimpleStatement

from test_elastic import ElasticCluster, connect, wait_until

ROWS = 8000
FIRST_KEY = -1000  # negative keys sort before positive ones
PAD_BYTES = 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = ElasticCluster(tmp_path_factory.mktemp("ordered"), config_lines=["tablet_split_mib = 1"])
    try:
        cluster.start(3)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def loaded(cluster):
    """`ordered.events`: ROWS sequential bigint keys of 1 KB of incompressible bytes, written
    in key order (the pattern that piles onto one node in ByteOrdered Cassandra), flushed."""
    driver, session = connect(cluster)
    try:
        session.execute("CREATE KEYSPACE ordered WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE ordered.events (k bigint PRIMARY KEY, pad blob) "
                        "WITH partitioner = 'ordered'")
        insert = session.prepare("INSERT INTO ordered.events (k, pad) VALUES (?, ?)")
        for start in range(FIRST_KEY, FIRST_KEY + ROWS, 200):
            futures = [session.execute_async(insert, (k, os.urandom(PAD_BYTES)))
                       for k in range(start, min(start + 200, FIRST_KEY + ROWS))]
            for future in futures:
                future.result()
    finally:
        driver.shutdown()
    for address in cluster.running():
        cluster.admin("flush", host=address)
    return list(range(FIRST_KEY, FIRST_KEY + ROWS))


def tablets_meeting(tablets, first, last):
    """The tablets (of a ring, in token order) holding any token of [first, last]."""
    holding, after = [], None
    for tablet in tablets:
        starts_below_last = after is None or after < last
        if starts_below_last and tablet["last_token"] >= first:
            holding.append(tablet)
        after = tablet["last_token"]
    return holding


def data_tablets(cluster):
    """The tablets of `ordered.events` holding the loaded keys. A bigint key's token on an
    ordered table is the key itself, so those are the tablets meeting [FIRST_KEY, last]."""
    return tablets_meeting(cluster.ring("ordered", "events"), FIRST_KEY, FIRST_KEY + ROWS - 1)


def test_sequential_keys_split_their_tablets_and_spread_over_every_node(cluster, loaded):
    def spread():
        tablets = data_tablets(cluster)
        nodes = {replica for tablet in tablets for replica in tablet["replicas"]}
        return (len(tablets) >= 4 and nodes == set(cluster.running())
                and not any(tablet["moving"] for tablet in tablets))

    wait_until(spread, timeout=120, message="the loaded key range split and spread over all three nodes")
    driver, session = connect(cluster)
    try:
        # The token of a bigint key on an ordered table is the key: order is visible.
        assert session.execute("SELECT token(k) FROM ordered.events WHERE k = 5").one()[0] == 5
        assert session.execute("SELECT token(k) FROM ordered.events WHERE k = -7").one()[0] == -7
    finally:
        driver.shutdown()


@pytest.mark.parametrize("coordinator", [0, 1, 2])
def test_scans_return_exactly_the_rows_in_key_order_across_tablets_and_pages(cluster, loaded, coordinator):
    address = cluster.running()[coordinator]
    driver, session = connect(cluster, addresses=[address])
    try:
        whole = SimpleStatement("SELECT k FROM ordered.events", fetch_size=333)
        assert [row.k for row in session.execute(whole)] == loaded
        # `token(k) >= token(?) LIMIT n`: the next n keys, whichever tablets hold them.
        following = session.prepare("SELECT k FROM ordered.events WHERE token(k) >= token(?) LIMIT 250")
        for start in (FIRST_KEY, -1, 0, 3999, FIRST_KEY + ROWS - 100):
            expected = [k for k in loaded if k >= start][:250]
            assert [row.k for row in session.execute(following, (start,))] == expected
        window = session.execute("SELECT k FROM ordered.events WHERE token(k) > token(100) "
                                 "AND token(k) <= token(2100)")
        assert [row.k for row in window] == list(range(101, 2101))
    finally:
        driver.shutdown()


def test_text_keys_are_kept_in_byte_order_even_when_they_share_a_prefix(cluster):
    driver, session = connect(cluster)
    try:
        session.execute("CREATE KEYSPACE IF NOT EXISTS ordered WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE ordered.names (name text PRIMARY KEY, n int) WITH partitioner = 'ordered'")
        # Keys sharing more than eight leading bytes share a token; lengths disagree with order.
        names = ["user:0000000042", "user:00000000", "user:000000009", "user:0000000041z", "a",
                 "user:0000000041", "zz", "user:1", "ユーザー"]
        insert = session.prepare("INSERT INTO ordered.names (name, n) VALUES (?, ?)")
        for n, name in enumerate(names):
            session.execute(insert, (name, n))
        paged = SimpleStatement("SELECT name FROM ordered.names", fetch_size=3)
        expected = sorted(names, key=lambda name: name.encode())
        assert [row.name for row in session.execute(paged)] == expected
        # A token is a key's first eight bytes: `>=` starts at the first key sharing them,
        # `>` skips every key that does.
        def token(name):
            return name.encode()[:8].ljust(8, b"\0")

        bound = "user:00000000"
        at_least = session.execute(f"SELECT name FROM ordered.names WHERE token(name) >= token('{bound}') LIMIT 4")
        assert [row.name for row in at_least] == [n for n in expected if token(n) >= token(bound)][:4]
        beyond = session.execute(f"SELECT name FROM ordered.names WHERE token(name) > token('{bound}') LIMIT 4")
        assert [row.name for row in beyond] == [n for n in expected if token(n) > token(bound)][:4]
        described = session.execute("DESCRIBE TABLE ordered.names").one().create_statement
        assert "partitioner = 'ordered'" in described
    finally:
        driver.shutdown()


TABLETS_PER_NODE = 8  # what a table is created with, per node (shoal_cluster::TABLETS_PER_NODE)


def test_tablets_emptied_by_a_truncate_merge_back_to_what_the_table_was_created_with(cluster, loaded):
    """Runs last: it empties `ordered.events`. The split pieces, now holding nothing, are
    brought onto the same nodes by the balancer and merged, until the table has the
    tablets it was created with; the table serves reads and writes throughout."""
    created_with = TABLETS_PER_NODE * len(cluster.running())
    wait_until(lambda: len(data_tablets(cluster)) >= 4, timeout=120, message="the load split its tablets")
    assert len(cluster.ring("ordered", "events")) > created_with
    driver, session = connect(cluster)
    try:
        session.execute("TRUNCATE ordered.events")
        for address in cluster.running():
            cluster.admin("compact", host=address)

        def merged_back():
            tablets = cluster.ring("ordered", "events")
            return len(tablets) == created_with and not any(tablet["moving"] for tablet in tablets)

        wait_until(merged_back, timeout=180, message=f"the emptied table merged back to {created_with} tablets")
        # Keys across the whole former range land in the merged tablets and read back in order.
        insert = session.prepare("INSERT INTO ordered.events (k, pad) VALUES (?, ?)")
        keys = list(range(FIRST_KEY, FIRST_KEY + ROWS, 97))
        for k in keys:
            session.execute(insert, (k, b"x"))
        assert [row.k for row in session.execute("SELECT k FROM ordered.events")] == keys
    finally:
        driver.shutdown()
