"""TLS on the CQL port: required and optional modes, with the Python driver and cqlsh,
logins over TLS, a client that does not trust the certificate, a certificate replaced
on disk and served without a restart, client certificates required by a CA, and a clear
error at start-up for a bad key."""

import os
import socket
import ssl
import subprocess
import time

import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable

from shoal_process import ShoalNode
from test_cqlsh import CQLSH

ADDRESS = "127.0.0.8"


def make_certificate(directory, name):
    """A self-signed certificate for ADDRESS and its key, as PEM files."""
    certificate, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(certificate), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=IP:{ADDRESS}"], check=True, capture_output=True)
    return certificate, key


def trusting(certificate):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(certificate))
    context.check_hostname = False
    return context


def tls_node(directory, mode, certificate, key, extra_args=()):
    config = directory / "tls.toml"
    config.write_text(f'client_tls = "{mode}"\ntls_certificate = "{certificate}"\ntls_private_key = "{key}"\n')
    return ShoalNode(directory / "node", address=ADDRESS, config=config, extra_args=list(extra_args))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("certificates"), "shoal")


@pytest.fixture(scope="module")
def required_node(tmp_path_factory, certificate):
    node = tls_node(tmp_path_factory.mktemp("tls"), "required", *certificate, extra_args=["--auth"])
    node.start()
    yield node
    assert node.stop() == 0, node.log()


def test_the_driver_logs_in_over_tls(required_node, certificate):
    cluster = Cluster([required_node.address], port=required_node.port, ssl_context=trusting(certificate[0]),
                      auth_provider=PlainTextAuthProvider("cassandra", "cassandra"))
    session = cluster.connect()
    assert session.execute("SELECT release_version FROM system.local").one() is not None
    cluster.shutdown()


def test_plain_clients_and_clients_that_do_not_trust_the_certificate_are_refused(required_node, tmp_path):
    plain = Cluster([required_node.address], port=required_node.port,
                    auth_provider=PlainTextAuthProvider("cassandra", "cassandra"), connect_timeout=3)
    with pytest.raises(NoHostAvailable):
        plain.connect()
    plain.shutdown()
    other, _ = make_certificate(tmp_path, "stranger")
    distrustful = Cluster([required_node.address], port=required_node.port, ssl_context=trusting(other),
                          auth_provider=PlainTextAuthProvider("cassandra", "cassandra"))
    with pytest.raises(NoHostAvailable) as error:
        distrustful.connect()
    assert "certificate verify failed" in str(error.value)
    distrustful.shutdown()


def test_cqlsh_connects_with_ssl(required_node, certificate):
    environment = {**os.environ, "SSL_CERTFILE": str(certificate[0]), "SSL_VALIDATE": "true"}
    result = subprocess.run([CQLSH, "--ssl", "-u", "cassandra", "-p", "cassandra", required_node.address,
                             str(required_node.port), "-e", "SELECT cluster_name FROM system.local"],
                            capture_output=True, text=True, timeout=60, env=environment)
    assert result.returncode == 0, result.stderr
    assert "Shoal Cluster" in result.stdout


def served_certificate(node):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((node.address, node.port), timeout=10) as raw:
        with context.wrap_socket(raw) as wrapped:
            return wrapped.getpeercert(binary_form=True)


def der(certificate):
    return ssl.PEM_cert_to_DER_cert(certificate.read_text())


def test_optional_tls_serves_both_and_a_replaced_certificate_is_served_without_a_restart(tmp_path):
    certificate, key = make_certificate(tmp_path, "first")
    with tls_node(tmp_path, "optional", certificate, key) as node:
        plain = Cluster([node.address], port=node.port)
        assert plain.connect().execute("SELECT key FROM system.local").one().key == "local"
        plain.shutdown()
        encrypted = Cluster([node.address], port=node.port, ssl_context=trusting(certificate))
        assert encrypted.connect().execute("SELECT key FROM system.local").one().key == "local"
        encrypted.shutdown()
        assert served_certificate(node) == der(certificate)

        replacement, replacement_key = make_certificate(tmp_path, "second")
        os.replace(replacement_key, key)
        os.replace(replacement, certificate)
        deadline = time.time() + 10
        while served_certificate(node) != der(certificate):
            assert time.time() < deadline, "the replaced certificate was not served within 10 s"
            time.sleep(0.2)
        assert node.process.poll() is None


def test_a_bad_private_key_stops_the_node_with_a_message_naming_it(tmp_path):
    certificate, key = make_certificate(tmp_path, "broken")
    key.write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    node = tls_node(tmp_path, "required", certificate, key)
    node.launch()
    assert node.process.wait(timeout=30) != 0
    assert str(key) in node.log() and "private key" in node.log()


def test_clients_without_a_certificate_of_the_clients_ca_are_refused(tmp_path):
    from test_internode_tls import make_ca, make_node_certificate
    ca = make_ca(tmp_path, "client-ca")
    server_certificate, server_key = make_node_certificate(tmp_path, ca, ADDRESS)
    config = tmp_path / "mutual.toml"
    config.write_text(f'client_tls = "required"\ntls_certificate = "{server_certificate}"\n'
                      f'tls_private_key = "{server_key}"\nclient_tls_ca_certificate = "{ca[0]}"\n')
    clients = tmp_path / "clients"
    clients.mkdir()
    client_certificate, client_key = make_node_certificate(clients, ca, "127.0.0.200")
    other_ca = make_ca(clients, "other-ca")
    stranger_certificate, stranger_key = make_node_certificate(clients, other_ca, "127.0.0.201")
    with ShoalNode(tmp_path / "node", address=ADDRESS, config=config) as node:
        with_certificate = trusting(ca[0])
        with_certificate.load_cert_chain(str(client_certificate), str(client_key))
        cluster = Cluster([node.address], port=node.port, ssl_context=with_certificate)
        assert cluster.connect().execute("SELECT key FROM system.local").one().key == "local"
        cluster.shutdown()

        stranger = trusting(ca[0])
        stranger.load_cert_chain(str(stranger_certificate), str(stranger_key))
        for context in (trusting(ca[0]), stranger):
            refused = Cluster([node.address], port=node.port, ssl_context=context, connect_timeout=5)
            with pytest.raises(NoHostAvailable):
                refused.connect()
            refused.shutdown()



def test_large_answers_to_a_slow_reader_over_tls_all_arrive(required_node, certificate):
    """Answers bigger than the socket can take, to a client that reads slowly: every byte of
    them arrives (over TLS, a write can leave its last records in the session's buffer
    when the socket is full; the server flushes them after every write)."""
    from test_protocol import QUERY, RESULT, STARTUP, frame, query_body, read_frame, string_map

    cluster = Cluster([required_node.address], port=required_node.port, ssl_context=trusting(certificate[0]),
                      auth_provider=PlainTextAuthProvider("cassandra", "cassandra"))
    session = cluster.connect()
    session.execute("CREATE KEYSPACE IF NOT EXISTS big_answers WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    session.execute("CREATE TABLE IF NOT EXISTS big_answers.blobs (k int PRIMARY KEY, v blob)")
    value = os.urandom(1 << 20)
    session.execute("INSERT INTO big_answers.blobs (k, v) VALUES (1, %s)", (value,))
    cluster.shutdown()

    class SlowReader:
        """Hands `read_frame` at most 16 KiB per call, pausing first, so the server's socket
        stays full while it writes."""

        def __init__(self, sock):
            self.sock = sock

        def recv(self, count):
            time.sleep(0.0005)
            return self.sock.recv(min(count, 16 << 10))

    plain = socket.create_connection((required_node.address, required_node.port), timeout=10)
    with trusting(certificate[0]).wrap_socket(plain) as sock:
        sock.sendall(frame(4, 0, STARTUP, string_map({"CQL_VERSION": "3.0.0"})))
        assert read_frame(sock)[3] == 0x03  # AUTHENTICATE
        token = b"\0cassandra\0cassandra"
        sock.sendall(frame(4, 0, 0x0F, len(token).to_bytes(4, "big") + token))
        assert read_frame(sock)[3] == 0x10  # AUTH_SUCCESS
        requests = 32
        sock.sendall(b"".join(frame(4, stream, QUERY, query_body("SELECT v FROM big_answers.blobs WHERE k = 1"))
                              for stream in range(requests)))
        time.sleep(0.5)
        answered = set()
        for _ in range(requests):
            _, _, stream, opcode, body = read_frame(SlowReader(sock))
            assert opcode == RESULT and value in body
            answered.add(stream)
        assert answered == set(range(requests))
