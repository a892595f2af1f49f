"""Authentication and authorization with Cassandra's semantics (`shoal server --auth`):
logging in with the Python driver's plain-text provider and cqlsh, wrong credentials,
an unprivileged role refused on every statement path, GRANT/REVOKE of permissions and of
roles, LIST statements, system_auth, and GRANT and REVOKE taking effect on every node of
a three-node cluster."""

import subprocess
import time
import uuid

import pytest
from cassandra import AuthenticationFailed, InvalidRequest, Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT, NoHostAvailable
from cassandra.policies import FallthroughRetryPolicy, WhiteListRoundRobinPolicy
from cassandra.query import BatchStatement, SimpleStatement

from shoal_process import ShoalNode
from test_cluster import LocalCluster
from test_cqlsh import CQLSH

# How long a GRANT or REVOKE may take to hold on a node other than the one that ran it
# (README: as soon as the node applies the Raft entry; well under a second when healthy).
PROPAGATION_BOUND_SECONDS = 5


def login(address, port, user, password):
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([address]),
                               retry_policy=FallthroughRetryPolicy(), request_timeout=30)
    cluster = Cluster([address], port=port, auth_provider=PlainTextAuthProvider(user, password),
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return cluster, cluster.connect()


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory):
    node = ShoalNode(tmp_path_factory.mktemp("auth") / "node", address="127.0.0.6", extra_args=["--auth"])
    node.start()
    yield node
    code = node.stop()
    assert code == 0, node.log()


@pytest.fixture(scope="module")
def admin(auth_node):
    cluster, session = login(auth_node.address, auth_node.port, "cassandra", "cassandra")
    yield session
    cluster.shutdown()


@pytest.fixture
def keyspace(admin):
    name = f"auth_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    admin.execute(f"CREATE TABLE {name}.t (k int PRIMARY KEY, v text)")
    admin.execute(f"INSERT INTO {name}.t (k, v) VALUES (1, 'one')")
    yield name
    admin.execute(f"DROP KEYSPACE {name}")


@pytest.fixture
def user(admin, auth_node):
    """A role that may log in and holds no permission, logged in."""
    name = f"user_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE ROLE {name} WITH PASSWORD = 'pw-{name}' AND LOGIN = true")
    cluster, session = login(auth_node.address, auth_node.port, name, f"pw-{name}")
    yield name, session
    cluster.shutdown()
    admin.execute(f"DROP ROLE IF EXISTS {name}")


def test_wrong_password_unknown_role_and_no_credentials_are_refused(auth_node):
    for user, password in [("cassandra", "wrong"), ("nobody", "cassandra")]:
        with pytest.raises(NoHostAvailable) as error:
            login(auth_node.address, auth_node.port, user, password)
        failure = next(iter(error.value.errors.values()))
        assert isinstance(failure, AuthenticationFailed)
        assert "Bad credentials" in str(failure) and "incorrect" in str(failure)
    anonymous = Cluster([auth_node.address], port=auth_node.port)
    with pytest.raises(NoHostAvailable) as error:
        anonymous.connect()
    assert "requires authentication" in str(error.value)
    anonymous.shutdown()


def test_a_role_without_login_cannot_log_in(admin, auth_node):
    admin.execute("CREATE ROLE IF NOT EXISTS app_group WITH PASSWORD = 'pw'")
    with pytest.raises(NoHostAvailable) as error:
        login(auth_node.address, auth_node.port, "app_group", "pw")
    assert "not permitted to log in" in str(error.value)


def refused(session, statement, *values):
    with pytest.raises(Unauthorized) as error:
        session.execute(statement, values or None)
    return str(error.value)


def test_an_unprivileged_role_is_refused_on_every_path(admin, user, keyspace):
    name, session = user
    table = f"{keyspace}.t"
    assert "no SELECT permission on <table" in refused(session, f"SELECT * FROM {table}")
    assert "no MODIFY permission" in refused(session, f"INSERT INTO {table} (k, v) VALUES (2, 'x')")
    assert "no MODIFY permission" in refused(session, f"UPDATE {table} SET v = 'x' WHERE k = 1")
    assert "no MODIFY permission" in refused(session, f"DELETE FROM {table} WHERE k = 1")
    assert "no MODIFY permission" in refused(session, f"INSERT INTO {table} (k, v) VALUES (3, 'x') IF NOT EXISTS")
    assert "no MODIFY permission" in refused(session, f"TRUNCATE {table}")
    # Prepared statements are checked when they run, with their cached plan.
    select = session.prepare(f"SELECT * FROM {table} WHERE k = ?")
    assert "no SELECT permission" in refused(session, select, 1)
    batch = BatchStatement()
    batch.add(session.prepare(f"INSERT INTO {table} (k, v) VALUES (?, ?)"), (4, "x"))
    with pytest.raises(Unauthorized):
        session.execute(batch)
    with pytest.raises(Unauthorized):
        session.execute(f"BEGIN BATCH INSERT INTO {table} (k, v) VALUES (5, 'x'); APPLY BATCH")
    assert "no SELECT permission on <table system_auth.roles>" in refused(session, "SELECT * FROM system_auth.roles")
    assert "<all keyspaces>" in refused(
        session, "CREATE KEYSPACE nope WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}")
    assert "no CREATE permission on <keyspace" in refused(session, f"CREATE TABLE {keyspace}.u (k int PRIMARY KEY)")
    assert "no ALTER permission" in refused(session, f"ALTER TABLE {table} ADD w int")
    assert "no DROP permission" in refused(session, f"DROP TABLE {table}")
    assert "no DROP permission" in refused(session, f"DROP KEYSPACE {keyspace}")
    assert "<all roles>" in refused(session, "CREATE ROLE other")
    assert "AUTHORIZE" in refused(session, f"GRANT SELECT ON {table} TO {name}")
    with pytest.raises(Unauthorized):
        session.execute("LIST ALL PERMISSIONS")
    # What every driver reads to learn the cluster stays readable.
    assert session.execute("SELECT release_version FROM system.local").one() is not None
    assert admin.execute(f"SELECT * FROM {table}").one().v == "one"


def test_grant_and_revoke_take_effect_on_the_next_request(admin, user, keyspace):
    name, session = user
    table = f"{keyspace}.t"
    admin.execute(f"GRANT SELECT ON {table} TO {name}")
    assert session.execute(f"SELECT v FROM {table} WHERE k = 1").one().v == "one"
    refused(session, f"INSERT INTO {table} (k, v) VALUES (2, 'x')")
    admin.execute(f"GRANT MODIFY ON KEYSPACE {keyspace} TO {name}")
    session.execute(f"INSERT INTO {table} (k, v) VALUES (2, 'two')")
    assert session.execute(f"INSERT INTO {table} (k, v) VALUES (2, 'x') IF NOT EXISTS").one()[0] is False
    rows = admin.execute(f"LIST ALL PERMISSIONS OF {name}")
    assert {(r.resource, r.permission) for r in rows} == {
        (f"<table {table}>", "SELECT"), (f"<keyspace {keyspace}>", "MODIFY")}
    admin.execute(f"REVOKE SELECT ON {table} FROM {name}")
    refused(session, f"SELECT v FROM {table} WHERE k = 1")


def test_revoking_mid_paging_refuses_the_next_page(admin, user, keyspace):
    name, session = user
    table = f"{keyspace}.t"
    for k in range(10, 30):
        admin.execute(f"INSERT INTO {table} (k, v) VALUES ({k}, 'x')")
    admin.execute(f"GRANT SELECT ON {table} TO {name}")
    result = session.execute(SimpleStatement(f"SELECT * FROM {table}", fetch_size=5))
    assert len(result.current_rows) == 5 and result.has_more_pages
    admin.execute(f"REVOKE SELECT ON {table} FROM {name}")
    with pytest.raises(Unauthorized):
        result.fetch_next_page()


def test_permissions_are_inherited_through_granted_roles(admin, user, keyspace):
    name, session = user
    reader = f"reader_{uuid.uuid4().hex[:6]}"
    admin.execute(f"CREATE ROLE {reader}")
    admin.execute(f"GRANT SELECT ON KEYSPACE {keyspace} TO {reader}")
    admin.execute(f"GRANT {reader} TO {name}")
    assert session.execute(f"SELECT v FROM {keyspace}.t WHERE k = 1").one().v == "one"
    assert {r.role for r in admin.execute(f"LIST ROLES OF {name}")} == {name, reader}
    members = admin.execute(f"SELECT member FROM system_auth.role_members WHERE role = '{reader}'")
    assert [r.member for r in members] == [name]
    with pytest.raises(InvalidRequest, match="is a member of"):
        admin.execute(f"GRANT {name} TO {reader}")
    admin.execute(f"REVOKE {reader} FROM {name}")
    refused(session, f"SELECT v FROM {keyspace}.t WHERE k = 1")
    admin.execute(f"DROP ROLE {reader}")


def test_a_creator_holds_every_permission_on_what_it_creates(admin, user):
    name, session = user
    admin.execute(f"GRANT CREATE ON ALL KEYSPACES TO {name}")
    created = f"mine_{uuid.uuid4().hex[:6]}"
    session.execute(f"CREATE KEYSPACE {created} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}")
    session.execute(f"CREATE TABLE {created}.t (k int PRIMARY KEY, v int)")
    session.execute(f"INSERT INTO {created}.t (k, v) VALUES (1, 1)")
    assert session.execute(f"SELECT v FROM {created}.t").one().v == 1
    session.execute(f"DROP KEYSPACE {created}")
    # Dropping forgets the grants on it.
    assert not [r for r in admin.execute(f"LIST ALL PERMISSIONS OF {name}") if created in r.resource]


def test_role_statements_answer_as_cassandra(admin, user, auth_node):
    name, session = user
    with pytest.raises(InvalidRequest, match="already exists"):
        admin.execute(f"CREATE ROLE {name}")
    admin.execute(f"CREATE ROLE IF NOT EXISTS {name}")
    with pytest.raises(InvalidRequest, match="doesn't exist"):
        admin.execute("DROP ROLE no_such_role")
    admin.execute("DROP ROLE IF EXISTS no_such_role")
    with pytest.raises(InvalidRequest, match="Cannot DROP primary role"):
        admin.execute("DROP ROLE cassandra")
    with pytest.raises(InvalidRequest, match="does not support"):
        admin.execute(f"GRANT DESCRIBE ON ALL KEYSPACES TO {name}")
    # A role changes its own password, not its superuser status.
    session.execute(f"ALTER ROLE {name} WITH PASSWORD = 'changed'")
    with pytest.raises(Unauthorized):
        session.execute(f"ALTER ROLE {name} WITH SUPERUSER = true")
    cluster, _ = login(auth_node.address, auth_node.port, name, "changed")
    cluster.shutdown()
    roles = {r.role: r for r in admin.execute("LIST ROLES")}
    assert roles["cassandra"].super and roles[name].login and not roles[name].super
    assert name in {r.name for r in admin.execute("LIST USERS")}
    assert [r.role for r in session.execute("LIST ROLES")] == [name]
    stored = admin.execute(f"SELECT salted_hash FROM system_auth.roles WHERE role = '{name}'").one()
    assert stored.salted_hash.startswith("$2") and "changed" not in stored.salted_hash


def test_legacy_user_statements_create_roles_that_log_in(admin, auth_node):
    admin.execute("CREATE USER IF NOT EXISTS legacy WITH PASSWORD 'old' NOSUPERUSER")
    admin.execute("ALTER USER legacy WITH PASSWORD 'new'")
    cluster, session = login(auth_node.address, auth_node.port, "legacy", "new")
    assert session.execute("SELECT cluster_name FROM system.local").one() is not None
    cluster.shutdown()
    admin.execute("DROP USER legacy")


def test_cqlsh_logs_in_with_a_user_and_password(auth_node):
    command = [CQLSH, auth_node.address, str(auth_node.port), "-e", "LIST ROLES"]
    result = subprocess.run(command + ["-u", "cassandra", "-p", "cassandra"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "cassandra" in result.stdout
    result = subprocess.run(command + ["-u", "cassandra", "-p", "wrong"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "incorrect" in result.stderr


def test_roles_and_grants_survive_a_restart(tmp_path):
    node = ShoalNode(tmp_path / "node", address="127.0.0.7", extra_args=["--auth"])
    with node:
        cluster, admin = login(node.address, node.port, "cassandra", "cassandra")
        admin.execute("CREATE ROLE keeper WITH PASSWORD = 'kept' AND LOGIN = true")
        admin.execute("ALTER ROLE cassandra WITH PASSWORD = 'rotated'")
        cluster.shutdown()
        assert node.stop() == 0
        node.start()
        for user, password in [("keeper", "kept"), ("cassandra", "rotated")]:
            cluster, _ = login(node.address, node.port, user, password)
            cluster.shutdown()
        with pytest.raises(NoHostAvailable):
            login(node.address, node.port, "cassandra", "cassandra")


def wait_until(condition, message):
    deadline = time.time() + PROPAGATION_BOUND_SECONDS
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {PROPAGATION_BOUND_SECONDS} s: {message}")


def can_read(session, table):
    try:
        session.execute(f"SELECT * FROM {table}")
        return True
    except Unauthorized:
        return False


def test_grant_and_revoke_hold_on_every_node_of_a_cluster(tmp_path):
    local = LocalCluster(tmp_path)
    local.config.write_text('authenticator = "PasswordAuthenticator"\nauthorizer = "CassandraAuthorizer"\n')
    drivers = []
    try:
        local.start()
        admin_driver, admin = login(local.nodes[0].address, local.cql_port, "cassandra", "cassandra")
        drivers.append(admin_driver)
        admin.execute("CREATE KEYSPACE spread WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        admin.execute("CREATE TABLE spread.t (k int PRIMARY KEY, v int)")
        admin.execute("CREATE ROLE reader WITH PASSWORD = 'pw' AND LOGIN = true")
        sessions = []
        for node in local.nodes:
            # Every node knows the role (and its password) the first node created.
            wait_until(lambda: _try_login(drivers, sessions, node.address, local.cql_port), f"login on {node.address}")
        for session in sessions:
            assert not can_read(session, "spread.t")
        admin.execute("GRANT SELECT ON spread.t TO reader")
        for node, session in zip(local.nodes, sessions):
            wait_until(lambda: can_read(session, "spread.t"), f"GRANT on {node.address}")
        admin.execute("REVOKE SELECT ON spread.t FROM reader")
        for node, session in zip(local.nodes, sessions):
            wait_until(lambda: not can_read(session, "spread.t"), f"REVOKE on {node.address}")
    finally:
        for driver in drivers:
            driver.shutdown()
        local.stop()


def _try_login(drivers, sessions, address, port):
    try:
        driver, session = login(address, port, "reader", "pw")
    except NoHostAvailable:
        return False
    drivers.append(driver)
    sessions.append(session)
    return True
