"""Vector search on one node: a storage-attached index on a `vector<float, n>` column with
its similarity function, `SELECT … ORDER BY v ANN OF [...] LIMIT k` alone, within a
partition, over a token range and combined with a filter on another indexed column; the
index following overwrites, deletes and TTLs; an index created over existing data and
rebuilt when the node restarts; prepared statements; the schema tables and DESCRIBE; and
Cassandra's errors. The fixture-based tests run against Cassandra too
(`--against-cassandra`). Results are compared with an exact search done here with
Cassandra's scores (`similarity_<function>`)."""

import math
import random
import time

import pytest
from cassandra import InvalidRequest
from cassandra.cluster import Cluster
from cassandra.protocol import ConfigurationException

from shoal_process import ShoalNode
from test_indexes import when_built

DIMENSION = 8


def score(function, a, b):
    """Cassandra's similarity score, in [0, 1], higher is nearer."""
    if function == "cosine":
        dot = sum(x * y for x, y in zip(a, b))
        return (1 + dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))) / 2
    if function == "euclidean":
        return 1 / (1 + sum((x - y) ** 2 for x, y in zip(a, b)))
    return (1 + sum(x * y for x, y in zip(a, b))) / 2


def unit(vector):
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def random_vectors(rng, count):
    return [unit([rng.uniform(-1, 1) for _ in range(DIMENSION)]) for _ in range(count)]


def exact(rows, function, query, k):
    """The ids of the `k` rows nearest to `query` (rows: id -> vector)."""
    ranked = sorted(rows, key=lambda i: -score(function, rows[i], query))
    return ranked[:k]


def nearest_ids(session, query, k, where="", table="items"):
    statement = f"SELECT id FROM {table} {where} ORDER BY v ANN OF %s LIMIT {k}"
    return [row.id for row in session.execute(statement, (query,))]


def create_items(session, function, count, seed=1):
    session.execute(f"CREATE TABLE items (id int PRIMARY KEY, v vector<float, {DIMENSION}>, tag text)")
    session.execute(f"CREATE INDEX items_v ON items (v) USING 'sai' "
                    f"WITH OPTIONS = {{'similarity_function': '{function}'}}")
    rng = random.Random(seed)
    rows = dict(enumerate(random_vectors(rng, count)))
    insert = session.prepare("INSERT INTO items (id, v, tag) VALUES (?, ?, ?)")
    for i, vector in rows.items():
        session.execute(insert, (i, vector, "even" if i % 2 == 0 else "odd"))
    return rng, rows


def recall(found, expected):
    return len(set(found) & set(expected)) / len(expected)


@pytest.mark.parametrize("function", ["cosine", "euclidean", "dot_product"])
def test_nearest_rows_come_first_by_the_index_similarity(session, function):
    rng, rows = create_items(session, function, 300)
    recalls = []
    for query in random_vectors(rng, 20):
        result = list(session.execute(
            f"SELECT id, similarity_{function}(v, %s) AS s FROM items ORDER BY v ANN OF %s LIMIT 10",
            (query, query)))
        assert len(result) == 10
        scores = [row.s for row in result]
        assert scores == sorted(scores, reverse=True), "rows must come nearest first"
        recalls.append(recall([row.id for row in result], exact(rows, function, query, 10)))
    assert sum(recalls) / len(recalls) >= 0.95


def test_the_index_follows_overwrites_deletes_and_ttls(session):
    rng, rows = create_items(session, "euclidean", 100)
    target = [5.0] * DIMENSION
    assert nearest_ids(session, target, 1) != [7]
    session.execute("UPDATE items SET v = %s WHERE id = 7", (target,))
    assert nearest_ids(session, target, 1) == [7]
    # Moved away again: the old position no longer finds it.
    session.execute("UPDATE items SET v = %s WHERE id = 7", ([-5.0] * DIMENSION,))
    assert 7 not in nearest_ids(session, target, 3)
    assert nearest_ids(session, [-5.0] * DIMENSION, 1) == [7]
    # Deleted value, deleted row: never returned, and the LIMIT is still filled.
    session.execute("DELETE v FROM items WHERE id = 7")
    assert 7 not in nearest_ids(session, [-5.0] * DIMENSION, 5)
    session.execute("INSERT INTO items (id, v) VALUES (8, %s)", (target,))
    session.execute("DELETE FROM items WHERE id = 8")
    found = nearest_ids(session, target, 5)
    assert 8 not in found and len(found) == 5
    # An expired value is gone as well.
    # TTL 3, not 1: a TTL counts whole seconds from the second of the write, so a value
    # written at the end of a second with TTL 1 could expire before the next read.
    session.execute("INSERT INTO items (id, v) VALUES (9, %s) USING TTL 3", (target,))
    assert nearest_ids(session, target, 1) == [9]
    time.sleep(3.1)
    assert 9 not in nearest_ids(session, target, 5)
    # A row without a vector is never a neighbour.
    session.execute("INSERT INTO items (id, tag) VALUES (1000, 'novector')")
    assert 1000 not in nearest_ids(session, target, 200)
    assert len(nearest_ids(session, target, 200)) == 97


def test_a_filter_on_another_indexed_column(session):
    rng, rows = create_items(session, "cosine", 200)
    session.execute("CREATE INDEX items_tag ON items (tag) USING 'sai'")
    when_built(session, "SELECT id FROM items WHERE tag = 'even'")
    evens = {i: v for i, v in rows.items() if i % 2 == 0}
    for query in random_vectors(rng, 5):
        found = nearest_ids(session, query, 7, where="WHERE tag = 'even'")
        assert found == exact(evens, "cosine", query, 7)
    assert nearest_ids(session, rows[3], 5, where="WHERE tag = 'none'") == []


def test_within_a_partition_rows_are_ordered_exactly(session):
    session.execute(f"CREATE TABLE chunks (doc int, chunk int, v vector<float, {DIMENSION}>, "
                    "PRIMARY KEY (doc, chunk))")
    session.execute("CREATE INDEX ON chunks (v) USING 'sai'")
    rng = random.Random(3)
    vectors = {}
    for doc in range(5):
        for chunk in range(20):
            vectors[(doc, chunk)] = random_vectors(rng, 1)[0]
            session.execute("INSERT INTO chunks (doc, chunk, v) VALUES (%s, %s, %s)",
                            (doc, chunk, vectors[(doc, chunk)]))
    query = random_vectors(rng, 1)[0]
    result = [row.chunk for row in session.execute(
        "SELECT chunk FROM chunks WHERE doc = 2 ORDER BY v ANN OF %s LIMIT 4", (query,))]
    in_doc = {chunk: vectors[(2, chunk)] for chunk in range(20)}
    assert result == exact(in_doc, "cosine", query, 4)
    # Across the table, (doc, chunk) rows of every partition compete.
    everywhere = [(row.doc, row.chunk) for row in session.execute(
        "SELECT doc, chunk FROM chunks ORDER BY v ANN OF %s LIMIT 10", (query,))]
    assert recall(everywhere, exact(vectors, "cosine", query, 10)) >= 0.9


def test_prepared_with_markers_for_the_vector_and_the_limit(session):
    rng, rows = create_items(session, "dot_product", 50)
    select = session.prepare("SELECT id FROM items ORDER BY v ANN OF ? LIMIT ?")
    assert [c.name for c in select.column_metadata] == ["v", "[limit]"]
    query = rows[11]
    assert [row.id for row in session.execute(select, (query, 1))] == [11]
    assert len(list(session.execute(select, (query, 6)))) == 6


def test_results_come_in_one_page_nearest_first(session):
    rng, rows = create_items(session, "cosine", 60)
    query = random_vectors(rng, 1)[0]
    statement = session.prepare("SELECT id FROM items ORDER BY v ANN OF ? LIMIT 15")
    statement.fetch_size = 4
    result = session.execute(statement, (query,))
    assert [row.id for row in result] == nearest_ids(session, query, 15)
    assert len(nearest_ids(session, query, 15)) == 15


def test_a_token_range_limits_the_search(session):
    rng, rows = create_items(session, "cosine", 100)
    query = random_vectors(rng, 1)[0]
    in_range = {row.id for row in session.execute("SELECT id FROM items WHERE token(id) > 0")}
    found = nearest_ids(session, query, 5, where="WHERE token(id) > 0")
    assert len(found) == 5 and set(found) <= in_range
    assert recall(found, exact({i: rows[i] for i in in_range}, "cosine", query, 5)) >= 0.8


def test_an_index_over_existing_data(session):
    session.execute(f"CREATE TABLE items (id int PRIMARY KEY, v vector<float, {DIMENSION}>)")
    rng = random.Random(5)
    rows = dict(enumerate(random_vectors(rng, 120)))
    for i, vector in rows.items():
        session.execute("INSERT INTO items (id, v) VALUES (%s, %s)", (i, vector))
    session.execute("CREATE INDEX ON items (v) USING 'sai' WITH OPTIONS = {'similarity_function': 'euclidean'}")
    query = random_vectors(rng, 1)[0]
    found = when_built(session, f"SELECT id FROM items ORDER BY v ANN OF {query} LIMIT 5")
    assert recall([row.id for row in found], exact(rows, "euclidean", query, 5)) >= 0.8


def test_schema_tables_and_describe_show_the_similarity_function(session):
    session.execute("CREATE TABLE items (id int PRIMARY KEY, v vector<float, 3>)")
    session.execute("CREATE CUSTOM INDEX items_v ON items (v) USING 'StorageAttachedIndex' "
                    "WITH OPTIONS = {'similarity_function': 'euclidean'}")
    keyspace = session.keyspace
    row = session.execute("SELECT kind, options FROM system_schema.indexes "
                          "WHERE keyspace_name = %s AND table_name = 'items' AND index_name = 'items_v'",
                          (keyspace,)).one()
    assert row.kind == "CUSTOM"
    assert dict(row.options) == {"class_name": "StorageAttachedIndex", "similarity_function": "euclidean",
                                 "target": "v"}


@pytest.mark.parametrize("statement, error, message", [
    ("CREATE INDEX ON ints (v) USING 'sai'", InvalidRequest,
     "SAI ANN indexes are only allowed on vector columns with float elements"),
    ("CREATE INDEX ON one (v) USING 'sai' WITH OPTIONS = {'similarity_function': 'cosine'}", InvalidRequest,
     "Cosine similarity is not supported for single-dimension vectors"),
    ("CREATE INDEX ON fresh (v) USING 'sai' WITH OPTIONS = {'similarity_function': 'bogus'}", InvalidRequest,
     "Similarity function BOGUS was not recognized"),
    ("CREATE INDEX ON fresh (v) USING 'sai' WITH OPTIONS = {'foo': 'bar'}", ConfigurationException,
     "Properties specified [foo] are not understood by StorageAttachedIndex"),
    ("SELECT pk FROM plain ORDER BY v ANN OF [1, 0, 0] LIMIT 3", InvalidRequest,
     "ANN ordering by vector requires the column to be indexed"),
    ("SELECT pk FROM ints ORDER BY v ANN OF [1, 0, 0] LIMIT 3", InvalidRequest,
     "ANN ordering is only supported on float vector indexes"),
    ("SELECT pk FROM t ORDER BY v ANN OF [1, 0, 0]", InvalidRequest,
     "Top-K queries must have a limit specified"),
    ("SELECT pk FROM t ORDER BY v ANN OF [1, 0, 0] LIMIT 1001", InvalidRequest,
     "Use of ANN OF in an ORDER BY clause requires a LIMIT that is not greater than 1000. LIMIT was 1001"),
    ("SELECT pk FROM t ORDER BY v ANN OF [1, 0] LIMIT 3", InvalidRequest,
     "Invalid vector literal for v of type vector<float, 3>; expected 3 elements, but given 2"),
    ("SELECT pk FROM t WHERE n = 3 ORDER BY v ANN OF [1, 0, 0] LIMIT 3 ALLOW FILTERING", InvalidRequest,
     "ANN ordering by vector requires all restricted column(s) to be indexed"),
    ("SELECT pk FROM t WHERE v = [1, 0, 0] ALLOW FILTERING", InvalidRequest,
     "Vector indexes only support ANN queries"),
    ("SELECT count(*) FROM t ORDER BY v ANN OF [1, 0, 0] LIMIT 3", InvalidRequest,
     "Top-K queries can not be run with aggregation"),
    ("SELECT pk FROM t ORDER BY v ANN OF [1, 0, 0], ck LIMIT 3", InvalidRequest,
     "ANN ordering does not support any other ordering"),
    ("SELECT pk FROM t ORDER BY n ANN OF [1, 0, 0] LIMIT 3", InvalidRequest,
     "Unexpected receiver type 'int'; only list and vector are expected"),
    ("SELECT pk FROM t WHERE pk IN (1, 2) ORDER BY v ANN OF [1, 0, 0] LIMIT 3", InvalidRequest,
     "Select on indexed columns and with IN clause for the PRIMARY KEY are not supported"),
    ("SELECT pk FROM t ORDER BY v ANN OF [1, 0, 0] PER PARTITION LIMIT 1 LIMIT 3", InvalidRequest,
     "Top-K queries do not support per-partition limits"),
    ("SELECT pk FROM t ORDER BY v ANN OF null LIMIT 3", InvalidRequest,
     "Unsupported null value for column v"),
    ("CREATE INDEX second ON t (v) USING 'sai'", InvalidRequest,
     "Index second is a duplicate of existing index t_v"),
    ("CREATE INDEX second ON t (v) USING 'sai' WITH OPTIONS = {'similarity_function': 'euclidean'}",
     InvalidRequest, "Cannot create more than one storage-attached index on the same column: v"),
])
def test_errors_are_cassandras(session, statement, error, message):
    session.execute("CREATE TABLE t (pk int, ck int, v vector<float, 3>, n int, PRIMARY KEY (pk, ck))")
    session.execute("CREATE INDEX t_v ON t (v) USING 'sai'")
    session.execute("CREATE TABLE ints (pk int PRIMARY KEY, v vector<int, 3>)")
    session.execute("CREATE TABLE one (pk int PRIMARY KEY, v vector<float, 1>)")
    session.execute("CREATE TABLE plain (pk int PRIMARY KEY, v vector<float, 3>)")
    session.execute("CREATE TABLE fresh (pk int PRIMARY KEY, v vector<float, 3>)")
    with pytest.raises(error) as raised:
        session.execute(statement)
    assert message in str(raised.value)


def test_a_restarted_node_rebuilds_its_vector_index(tmp_path):
    node = ShoalNode(tmp_path / "node")
    node.start()
    try:
        driver = Cluster([node.address], port=node.port)
        session = driver.connect()
        session.execute("CREATE KEYSPACE vectors WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.set_keyspace("vectors")
        rng, rows = create_items(session, "euclidean", 150)
        query = random_vectors(rng, 1)[0]
        before = nearest_ids(session, query, 10)
        driver.shutdown()
        assert node.stop() == 0
        node.start()
        driver = Cluster([node.address], port=node.port)
        session = driver.connect("vectors")
        # The graph is built again from the stored rows (until then, searches are exact).
        after = nearest_ids(session, query, 10)
        assert recall(before, exact(rows, "euclidean", query, 10)) >= 0.9
        assert recall(after, exact(rows, "euclidean", query, 10)) >= 0.9
        driver.shutdown()
    finally:
        node.stop()


def test_on_three_nodes_every_coordinator_finds_the_same_neighbours(tmp_path):
    """RF=3 (every node holds every tablet) and RF=1 (each node a third): the answers merge
    tablets and replicas; with one node down QUORUM still answers on RF=3."""
    from cassandra import ConsistencyLevel
    from cassandra.cluster import ExecutionProfile, EXEC_PROFILE_DEFAULT
    from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
    from test_cluster import ADDRESSES, started_cluster

    def session_on(cluster, address, consistency):
        profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                                   retry_policy=FallthroughRetryPolicy(), consistency_level=consistency,
                                   request_timeout=30)
        driver = Cluster([address], port=cluster.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        return driver, driver.connect()

    with started_cluster(tmp_path) as cluster:
        driver, session = session_on(cluster, ADDRESSES[0], ConsistencyLevel.ALL)
        rng = random.Random(11)
        rows = dict(enumerate(random_vectors(rng, 300)))
        for keyspace, factor in (("replicated", 3), ("spread", 1)):
            session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                            f"{{'class': 'SimpleStrategy', 'replication_factor': {factor}}}")
            session.execute(f"CREATE TABLE {keyspace}.items (id int PRIMARY KEY, v vector<float, {DIMENSION}>)")
            session.execute(f"CREATE INDEX ON {keyspace}.items (v) USING 'sai'")
            insert = session.prepare(f"INSERT INTO {keyspace}.items (id, v) VALUES (?, ?)")
            for i, vector in rows.items():
                session.execute(insert, (i, vector))
        driver.shutdown()
        queries = random_vectors(rng, 10)
        truth = [exact(rows, "cosine", query, 10) for query in queries]

        def answers(address, keyspace, consistency):
            driver, session = session_on(cluster, address, consistency)
            try:
                return [nearest_ids(session, query, 10, table=f"{keyspace}.items") for query in queries]
            finally:
                driver.shutdown()

        for keyspace, consistency in (("replicated", ConsistencyLevel.ONE), ("replicated", ConsistencyLevel.QUORUM),
                                      ("spread", ConsistencyLevel.ONE)):
            first = None
            for address in ADDRESSES:
                found = answers(address, keyspace, consistency)
                average = sum(recall(f, t) for f, t in zip(found, truth)) / len(truth)
                assert average >= 0.95, (keyspace, consistency, address, average)
                assert all(len(f) == 10 for f in found)
                first = first or found
        cluster.nodes[2].kill()
        found = answers(ADDRESSES[0], "replicated", ConsistencyLevel.QUORUM)
        assert sum(recall(f, t) for f, t in zip(found, truth)) / len(truth) >= 0.95


def test_truncate_empties_the_index(session):
    rng, rows = create_items(session, "cosine", 80)
    session.execute("TRUNCATE items")
    query = random_vectors(rng, 1)[0]
    assert nearest_ids(session, query, 10) == []
    session.execute("INSERT INTO items (id, v) VALUES (500, %s)", (query,))
    assert nearest_ids(session, query, 10) == [500]
