"""System tables as Cassandra presents them, driver metadata, DESCRIBE and events."""

import time

from conftest import connect

SYSTEM_SCHEMA_TABLES = {"keyspaces", "tables", "columns", "dropped_columns", "triggers", "views", "types", "functions", "aggregates", "indexes"}


def column_types(session, keyspace, table):
    rows = session.execute(
        "SELECT column_name, type, kind FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s",
        (keyspace, table),
    )
    return {r.column_name: (r.type, r.kind) for r in rows}


def test_system_local_has_cassandras_columns(cluster_session, node):
    row = cluster_session.execute("SELECT * FROM system.local WHERE key = 'local'").one()
    assert row.key == "local"
    assert row.partitioner == "org.apache.cassandra.dht.Murmur3Partitioner"
    assert row.native_protocol_version == "4"
    assert row.data_center == "datacenter1" and row.rack == "rack1"
    assert row.rpc_port == node.port
    assert len(row.tokens) > 0 and row.host_id is not None and row.schema_version is not None
    types = column_types(cluster_session, "system", "local")
    assert types["tokens"] == ("set<text>", "regular")
    assert types["truncated_at"] == ("map<uuid, blob>", "regular")
    assert types["key"] == ("text", "partition_key")


def test_peers_tables_exist_and_are_empty_on_one_node(cluster_session):
    assert list(cluster_session.execute("SELECT * FROM system.peers")) == []
    assert list(cluster_session.execute("SELECT * FROM system.peers_v2")) == []
    peers_v2 = column_types(cluster_session, "system", "peers_v2")
    assert peers_v2["peer_port"] == ("int", "clustering")
    assert peers_v2["native_address"] == ("inet", "regular")


def test_all_system_schema_tables_answer(cluster_session):
    for table in SYSTEM_SCHEMA_TABLES:
        cluster_session.execute(f"SELECT * FROM system_schema.{table}")
    tables = {r.table_name for r in cluster_session.execute("SELECT table_name FROM system_schema.tables WHERE keyspace_name = 'system_schema'")}
    assert SYSTEM_SCHEMA_TABLES <= tables


def test_schema_rows_describe_user_tables(session):
    session.execute("CREATE TABLE t (k int, c text, v map<text, int>, s int static, PRIMARY KEY (k, c)) WITH CLUSTERING ORDER BY (c DESC) AND comment = 'hi'")
    keyspace = session.keyspace
    types = column_types(session, keyspace, "t")
    assert types == {
        "k": ("int", "partition_key"),
        "c": ("text", "clustering"),
        "v": ("map<text, int>", "regular"),
        "s": ("int", "static"),
    }
    order = session.execute(
        "SELECT clustering_order FROM system_schema.columns WHERE keyspace_name = %s AND table_name = 't' AND column_name = 'c'",
        (keyspace,),
    ).one()
    assert order.clustering_order == "desc"
    table = session.execute("SELECT comment, flags, id FROM system_schema.tables WHERE keyspace_name = %s AND table_name = 't'", (keyspace,)).one()
    assert table.comment == "hi" and "compound" in table.flags


def test_driver_metadata_and_schema_agreement(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    cluster = session.cluster
    assert cluster.control_connection.wait_for_schema_agreement()
    table = cluster.metadata.keyspaces[session.keyspace].tables["t"]
    assert [c.name for c in table.partition_key] == ["k"]
    assert "CREATE TABLE" in table.export_as_string()


def test_schema_change_events_reach_registered_drivers(node, session):
    other_cluster, _ = connect(node)
    try:
        keyspace = session.keyspace
        session.execute("CREATE TABLE pushed (k int PRIMARY KEY)")
        deadline = time.time() + 15
        while time.time() < deadline:
            tables = other_cluster.metadata.keyspaces.get(keyspace)
            if tables is not None and "pushed" in tables.tables:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the second driver never saw the new table")
    finally:
        other_cluster.shutdown()


def test_describe_statements(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    keyspace = session.keyspace
    names = [r.name for r in session.execute("DESCRIBE KEYSPACES")]
    assert keyspace in names and "system" in names
    table = session.execute(f"DESCRIBE TABLE {keyspace}.t").one()
    assert table.create_statement.startswith(f"CREATE TABLE {keyspace}.t (")
    assert "k int PRIMARY KEY" in table.create_statement
    rows = list(session.execute(f"DESCRIBE KEYSPACE {keyspace}"))
    assert rows[0].create_statement.startswith(f"CREATE KEYSPACE {keyspace} WITH replication")
    assert [r.name for r in session.execute("DESCRIBE TABLES")] == ["t"]
    assert session.execute("DESCRIBE CLUSTER").one().partitioner == "org.apache.cassandra.dht.Murmur3Partitioner"
