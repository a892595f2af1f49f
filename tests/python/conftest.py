"""Shared fixtures: one Shoal node for the session, a fresh keyspace per test.

`pytest --against-cassandra tests/python/test_json.py` runs the tests that use these
fixtures against Apache Cassandra 5.0 instead (the one `bench/compare` fetches and starts
on 127.0.0.1:9042): the way to check that Shoal answers as Cassandra does.
"""

import importlib.machinery
import importlib.util
import itertools
import tempfile
import uuid
from pathlib import Path

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


def pytest_addoption(parser):
    parser.addoption("--against-cassandra", action="store_true",
                     help="run against Apache Cassandra 5.0 (bench/cassandra) instead of Shoal")


class CassandraNode:
    """A single Apache Cassandra node on 127.0.0.1:9042, started by bench/compare."""

    def __init__(self):
        path = Path(__file__).resolve().parents[2] / "bench" / "compare"
        loader = importlib.machinery.SourceFileLoader("compare", str(path))
        self.compare = importlib.util.module_from_spec(importlib.util.spec_from_loader("compare", loader))
        loader.exec_module(self.compare)
        self.address, self.port = "127.0.0.1", 9042
        self.processes = self.compare.start_cassandra(Path(tempfile.mkdtemp(prefix="cassandra-")), 1, self.port)

    def stop(self):
        self.processes.stop()
        return 0


@pytest.fixture(scope="session")
def node(tmp_path_factory, request):
    if request.config.getoption("--against-cassandra"):
        cassandra = CassandraNode()
        yield cassandra
        cassandra.stop()
        return
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
