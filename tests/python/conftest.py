"""Shared fixtures: one Shoal node for the session, a fresh keyspace per test."""

import itertools
import uuid

import pytest
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.policies import FallthroughRetryPolicy, RoundRobinPolicy

from shoal_process import ShoalNode

_counter = itertools.count()


def connect(node, **kwargs):
    # No driver retries: tests see exactly what the server answered.
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), retry_policy=FallthroughRetryPolicy(), request_timeout=30)
    cluster = Cluster([node.address], port=node.port, execution_profiles={EXEC_PROFILE_DEFAULT: profile}, **kwargs)
    return cluster, cluster.connect()


@pytest.fixture(scope="session")
def node(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("shoal") / "node1"
    shoal = ShoalNode(data_dir)
    shoal.start()
    yield shoal
    code = shoal.stop()
    assert code == 0, f"shoal did not shut down cleanly: {shoal.log()}"


@pytest.fixture(scope="session")
def cluster_session(node):
    cluster, session = connect(node)
    yield session
    cluster.shutdown()


@pytest.fixture
def session(cluster_session):
    """A session USEing a brand-new keyspace (RF 1)."""
    name = f"test_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    cluster_session.execute(
        f"CREATE KEYSPACE {name} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
    )
    cluster_session.set_keyspace(name)
    yield cluster_session
    cluster_session.execute(f"DROP KEYSPACE IF EXISTS {name}")
