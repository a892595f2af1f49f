"""Mutual TLS between nodes: a three-node cluster whose nodes hold certificates of one CA
forms, replicates (eventual and strongly consistent keyspaces, whose consensus streams are
TLS too) and answers `shoal admin` (with the node's config); a peer without a
certificate, or with one of another CA, gets nothing from a node's internode port; a
certificate renewed on disk is served without a restart; a node joining a cluster that
holds data receives its share of it, streamed through TLS sessions."""

import json
import os
import random
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path

from cassandra import ConsistencyLevel
from cassandra.cluster import Cluster, ExecutionProfile, EXEC_PROFILE_DEFAULT
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.policies import WhiteListRoundRobinPolicy

from shoal_process import shoal_binary
from test_cluster import ADDRESSES, LocalCluster, wait_until


def openssl(*arguments):
    subprocess.run(["openssl", *arguments], check=True, capture_output=True)


def make_ca(directory, name):
    certificate, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(certificate), "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    return certificate, key


def make_node_certificate(directory, ca, address):
    """A certificate for `address`, signed by `ca`, usable as server and as client."""
    key, request, certificate = (directory / f"{address}{suffix}" for suffix in (".key", ".csr", ".crt"))
    extensions = directory / f"{address}.ext"
    extensions.write_text(f"subjectAltName=IP:{address}\nbasicConstraints=critical,CA:FALSE\n"
                          "extendedKeyUsage=serverAuth,clientAuth\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(request), "-subj", f"/CN={address}")
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
            "-out", str(certificate), "-days", "2", "-extfile", str(extensions))
    return certificate, key


def internode_admin(node, config, *arguments):
    """`shoal admin ARGUMENTS` against `node`, over TLS with the node's own config."""
    return subprocess.run([shoal_binary(), "admin", *arguments, "--host", node.address, "--port",
                           str(node.internode_port), "--config", str(config)],
                          capture_output=True, text=True, timeout=60)


def internode_status(node, config):
    return internode_admin(node, config, "status")


def secure_node(directory, ca, node):
    """Gives `node` a certificate of `ca` and a config turning internode TLS on; returns
    the config."""
    certificate, key = make_node_certificate(directory, ca, node.address)
    config = directory / f"{node.address}.toml"
    config.write_text(f'internode_tls = true\ntls_certificate = "{certificate}"\n'
                      f'tls_private_key = "{key}"\ntls_ca_certificate = "{ca[0]}"\n')
    node.config = config
    return config


def served_certificate(address, port, context):
    """The certificate a node's internode port presents to a peer."""
    with socket.create_connection((address, port), timeout=10) as raw:
        with context.wrap_socket(raw) as wrapped:
            return wrapped.getpeercert(binary_form=True)


def internode_protocol_version():
    """The internode protocol version every frame carries, read from its one definition
    (`server::internode::PROTOCOL_VERSION`): a frame of another version closes the
    connection, which would pass for a refusal here."""
    source = (Path(__file__).resolve().parents[2] / "crates" / "server" / "src" / "internode" / "mod.rs").read_text()
    return int(re.search(r"pub const PROTOCOL_VERSION: u8 = (\d+);", source).group(1))


INTERNODE_PROTOCOL_VERSION = internode_protocol_version()


def internode_reply(address, port, context):
    """What a TLS client gets from a node's internode port after sending a frame."""
    with socket.create_connection((address, port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw) as wrapped:
                # A Status request (bincode: variant 3 of Message), framed as nodes frame it
                # (protocol version: `server::internode::PROTOCOL_VERSION`).
                payload = (3).to_bytes(4, "little")
                frame = (9 + len(payload)).to_bytes(4, "big") + bytes([INTERNODE_PROTOCOL_VERSION]) \
                    + (1).to_bytes(8, "big") + payload
                wrapped.sendall(frame)
                return wrapped.recv(4096)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            return b""


def test_nodes_of_one_ca_form_a_cluster_and_strangers_get_nothing(tmp_path):
    ca = make_ca(tmp_path, "cluster-ca")
    local = LocalCluster(tmp_path)
    configs = {node.address: secure_node(tmp_path, ca, node) for node in local.nodes}
    driver = None
    try:
        local.start()
        profile = ExecutionProfile(consistency_level=ConsistencyLevel.ALL, request_timeout=30)
        driver = Cluster([ADDRESSES[0]], port=local.cql_port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        session = driver.connect()
        session.execute("CREATE KEYSPACE sealed WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}")
        session.execute("CREATE TABLE sealed.t (k int PRIMARY KEY, v int)")
        for k in range(20):
            session.execute("INSERT INTO sealed.t (k, v) VALUES (%s, %s)", (k, k))
        assert len(list(session.execute("SELECT * FROM sealed.t"))) == 20

        # A strongly consistent keyspace: its writes commit only when a majority of each
        # tablet's Raft group has them, over the consensus streams between the nodes.
        session.execute("CREATE KEYSPACE sealed_strong WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 3} AND consistency = 'strong'")
        session.execute("CREATE TABLE sealed_strong.t (k int PRIMARY KEY, v int)")
        for address in ADDRESSES[:3]:
            only_this_node = ExecutionProfile(consistency_level=ConsistencyLevel.QUORUM, request_timeout=30,
                                              load_balancing_policy=WhiteListRoundRobinPolicy([address]))
            with Cluster([address], port=local.cql_port,
                         execution_profiles={EXEC_PROFILE_DEFAULT: only_this_node}) as through:
                node_session = through.connect()
                for k in range(10):
                    node_session.execute("UPDATE sealed_strong.t SET v = %s WHERE k = %s", (k, k))
                    assert node_session.execute("SELECT v FROM sealed_strong.t WHERE k = %s", (k,)).one().v == k
        assert sorted(row.k for row in session.execute("SELECT k FROM sealed_strong.t")) == list(range(10))
        status = internode_status(local.nodes[0], configs[ADDRESSES[0]])
        assert status.returncode == 0, status.stderr
        assert status.stdout.count("UN ") == 3, status.stdout

        without_config = subprocess.run([shoal_binary(), "admin", "status", "--host", ADDRESSES[0], "--port",
                                         str(local.internode_port)], capture_output=True, text=True, timeout=60)
        assert without_config.returncode != 0

        no_certificate = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        no_certificate.load_verify_locations(str(ca[0]))
        no_certificate.check_hostname = False
        assert internode_reply(ADDRESSES[0], local.internode_port, no_certificate) == b""

        other_ca = make_ca(tmp_path, "other-ca")
        stranger = make_node_certificate(tmp_path, other_ca, "127.0.0.4")
        strange = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        strange.load_verify_locations(str(ca[0]))
        strange.check_hostname = False
        strange.load_cert_chain(str(stranger[0]), str(stranger[1]))
        assert internode_reply(ADDRESSES[0], local.internode_port, strange) == b""

        # The same request with a certificate of the cluster's CA is answered.
        member = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        member.load_verify_locations(str(ca[0]))
        member.check_hostname = False
        certificate, key = make_node_certificate(tmp_path, ca, "127.0.0.4")
        member.load_cert_chain(str(certificate), str(key))
        assert len(internode_reply(ADDRESSES[0], local.internode_port, member)) > 0

        # A node's certificate replaced on disk is served to new peers without a restart,
        # and the cluster keeps working with it.
        first = ADDRESSES[0]
        renewed_dir = tmp_path / "renewed"
        renewed_dir.mkdir()
        renewed, renewed_key = make_node_certificate(renewed_dir, ca, first)
        os.replace(renewed_key, tmp_path / f"{first}.key")
        os.replace(renewed, tmp_path / f"{first}.crt")
        expected = ssl.PEM_cert_to_DER_cert((tmp_path / f"{first}.crt").read_text())
        deadline = time.time() + 10
        while served_certificate(first, local.internode_port, member) != expected:
            assert time.time() < deadline, "the renewed certificate was not served within 10 s"
            time.sleep(0.2)
        status = internode_status(local.nodes[1], configs[ADDRESSES[1]])
        assert status.returncode == 0 and status.stdout.count("UN ") == 3, status.stdout + status.stderr
    finally:
        if driver:
            driver.shutdown()
        local.stop()


def test_a_node_joining_a_tls_cluster_receives_its_share_of_the_data(tmp_path):
    """Streaming through TLS: a fourth node joins three that hold 8 MiB and takes over its
    share of the tablets, their files pulled in chunks of a couple of MiB through the
    internode TLS sessions; afterwards every row reads back exactly, through the new node,
    which now holds some of them."""
    ca = make_ca(tmp_path, "cluster-ca")
    local = LocalCluster(tmp_path)
    configs = {node.address: secure_node(tmp_path, ca, node) for node in local.nodes}
    joining = local.make_node(tmp_path, "127.0.0.4")
    joining_config = secure_node(tmp_path, ca, joining)
    values = {k: random.Random(k).randbytes(4096) for k in range(2000)}
    driver = None
    try:
        local.start()
        driver = Cluster([ADDRESSES[0]], port=local.cql_port, protocol_version=4)
        session = driver.connect()
        session.execute("CREATE KEYSPACE streamed WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
        session.execute("CREATE TABLE streamed.t (k int PRIMARY KEY, v blob)")
        insert = session.prepare("INSERT INTO streamed.t (k, v) VALUES (?, ?)")
        results = execute_concurrent_with_args(session, insert, list(values.items()), concurrency=32)
        assert all(ok for ok, _ in results)
        driver.shutdown()
        driver = None
        for node in local.nodes:
            flushed = internode_admin(node, configs[node.address], "flush")
            assert flushed.returncode == 0, flushed.stdout + flushed.stderr

        joining.start(timeout=60)

        def settled():
            status = internode_admin(joining, joining_config, "status")
            streams = internode_admin(joining, joining_config, "streams", "--json")
            return (status.returncode == 0 and status.stdout.count("UN ") == 4 and streams.returncode == 0
                    and json.loads(streams.stdout)["migrations"] == [])

        wait_until(settled, timeout=120, message="the fourth node to join and take its share")
        ring = internode_admin(joining, joining_config, "ring", "streamed", "t", "--json")
        assert ring.returncode == 0, ring.stdout + ring.stderr
        held = [tablet for tablet in json.loads(ring.stdout)["tablets"] if joining.address in tablet["replicas"]]
        assert held, f"the joined node holds no tablet of streamed.t: {ring.stdout}"

        through_joined = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([joining.address]),
                                          consistency_level=ConsistencyLevel.ONE, request_timeout=30)
        driver = Cluster([joining.address], port=local.cql_port, protocol_version=4,
                         execution_profiles={EXEC_PROFILE_DEFAULT: through_joined})
        session = driver.connect()
        assert {row.k: row.v for row in session.execute("SELECT k, v FROM streamed.t")} == values
    finally:
        if driver:
            driver.shutdown()
        local.stop()
        joining.kill()
