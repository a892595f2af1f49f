"""Bad input gets the right CQL error code and a readable message; the connection
survives."""

import pytest
from cassandra import AlreadyExists, ConsistencyLevel, InvalidRequest, Unavailable
from cassandra.protocol import ConfigurationException, SyntaxException
from cassandra.query import SimpleStatement


def test_syntax_error(session):
    with pytest.raises(SyntaxException):
        session.execute("SELEKT * FROM t")
    with pytest.raises(SyntaxException):
        session.execute("SELECT * FROM t WHERE k = 'unterminated")


def test_unknown_keyspace_table_and_column(session):
    with pytest.raises(InvalidRequest, match="does not exist"):
        session.execute("SELECT * FROM no_such_keyspace.t")
    with pytest.raises(InvalidRequest, match="does not exist"):
        session.execute("SELECT * FROM no_such_table")
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    with pytest.raises(InvalidRequest, match="Undefined column name nope"):
        session.execute("SELECT nope FROM t")
    with pytest.raises(InvalidRequest, match="Undefined column name nope"):
        session.execute("INSERT INTO t (k, nope) VALUES (1, 2)")


def test_wrong_types_and_missing_keys(session):
    session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
    with pytest.raises(InvalidRequest, match="Invalid"):
        session.execute("INSERT INTO t (k, c, v) VALUES ('one', 1, 'x')")
    with pytest.raises(InvalidRequest, match="Invalid"):
        session.execute("INSERT INTO t (k, c, v) VALUES (1, 1, 42)")
    with pytest.raises(InvalidRequest, match="Some clustering keys are missing: c"):
        session.execute("INSERT INTO t (k, v) VALUES (1, 'x')")
    with pytest.raises(InvalidRequest, match="Some partition key parts are missing: k"):
        session.execute("UPDATE t SET v = 'x' WHERE c = 1")
    session.execute("CREATE TABLE small (k tinyint PRIMARY KEY)")
    with pytest.raises(InvalidRequest, match="out of range"):
        session.execute("INSERT INTO small (k) VALUES (1000)")
    prepared = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
    with pytest.raises(Exception):
        session.execute(prepared, ("not an int", 1, "x"))


def test_already_exists_and_configuration_errors(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY)")
    with pytest.raises(AlreadyExists):
        session.execute("CREATE TABLE t (k int PRIMARY KEY)")
    with pytest.raises(AlreadyExists):
        session.execute(f"CREATE KEYSPACE {session.keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    with pytest.raises(ConfigurationException):
        session.execute("CREATE KEYSPACE bad WITH replication = {'class': 'NoSuchStrategy'}")
    with pytest.raises(ConfigurationException):
        session.execute("CREATE KEYSPACE bad WITH replication = {'class': 'SimpleStrategy'}")


def test_unavailable_for_consistency_beyond_the_replicas_alive(cluster_session):
    s = cluster_session
    s.execute("CREATE KEYSPACE IF NOT EXISTS rf3 WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
    s.execute("CREATE TABLE IF NOT EXISTS rf3.t (k int PRIMARY KEY, v int)")
    s.execute(SimpleStatement("INSERT INTO rf3.t (k, v) VALUES (1, 1)", consistency_level=ConsistencyLevel.ONE))
    with pytest.raises(Unavailable) as raised:
        s.execute(SimpleStatement("SELECT * FROM rf3.t WHERE k = 1", consistency_level=ConsistencyLevel.QUORUM))
    assert raised.value.consistency == ConsistencyLevel.QUORUM
    assert raised.value.required_replicas == 2 and raised.value.alive_replicas == 1
    with pytest.raises(Unavailable):
        s.execute(SimpleStatement("INSERT INTO rf3.t (k, v) VALUES (2, 2)", consistency_level=ConsistencyLevel.ALL))
    assert s.execute(SimpleStatement("SELECT v FROM rf3.t WHERE k = 1", consistency_level=ConsistencyLevel.ONE)).one().v == 1
    s.execute("DROP KEYSPACE rf3")


def test_filtering_and_order_by_rules(session):
    session.execute("CREATE TABLE t (k int, c int, v int, PRIMARY KEY (k, c))")
    with pytest.raises(InvalidRequest, match="ALLOW FILTERING"):
        session.execute("SELECT * FROM t WHERE c = 1")
    with pytest.raises(InvalidRequest, match="ORDER BY is only supported"):
        session.execute("SELECT * FROM t ORDER BY c DESC")
    with pytest.raises(InvalidRequest, match="Order by is currently only supported on the clustered columns"):
        session.execute("SELECT * FROM t WHERE k = 1 ORDER BY v DESC")
    with pytest.raises(InvalidRequest, match="LIMIT must be strictly positive"):
        session.execute("SELECT * FROM t LIMIT 0")


def test_errors_do_not_break_the_connection(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY)")
    for _ in range(20):
        with pytest.raises(Exception):
            session.execute("THIS IS NOT CQL")
    session.execute("INSERT INTO t (k) VALUES (1)")
    assert session.execute("SELECT k FROM t").one().k == 1
