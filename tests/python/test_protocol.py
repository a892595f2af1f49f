"""The native protocol itself, spoken over a raw socket: version negotiation, frame
limits, malformed frames, many streams in flight, LZ4 compression."""

import socket
import time
import struct

import pytest
from cassandra.cluster import Cluster

from conftest import connect

OPTIONS, STARTUP, QUERY, ERROR, READY, SUPPORTED, RESULT = 0x05, 0x01, 0x07, 0x00, 0x02, 0x06, 0x08


def frame(version, stream, opcode, body=b"", flags=0):
    return struct.pack(">BBhBI", version, flags, stream, opcode, len(body)) + body


def read_frame(sock):
    header = b""
    while len(header) < 9:
        chunk = sock.recv(9 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    version, flags, stream, opcode, length = struct.unpack(">BBhBI", header)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return version, flags, stream, opcode, body


def string_map(entries):
    out = struct.pack(">H", len(entries))
    for key, value in entries.items():
        out += struct.pack(">H", len(key)) + key.encode() + struct.pack(">H", len(value)) + value.encode()
    return out


def query_body(text, consistency=1):
    return struct.pack(">I", len(text)) + text.encode() + struct.pack(">HB", consistency, 0)


def error_of(body):
    code = struct.unpack(">i", body[:4])[0]
    length = struct.unpack(">H", body[4:6])[0]
    return code, body[6 : 6 + length].decode()


@pytest.fixture
def raw(node):
    sock = socket.create_connection((node.address, node.port), timeout=10)
    yield sock
    sock.close()


def started(sock):
    sock.sendall(frame(4, 0, STARTUP, string_map({"CQL_VERSION": "3.0.0"})))
    assert read_frame(sock)[3] == READY


@pytest.mark.parametrize("version", [3, 5, 6, 0x41, 0x42])
def test_other_protocol_versions_get_the_drivers_message(raw, version):
    raw.sendall(frame(version, 3, OPTIONS))
    response_version, _, stream, opcode, body = read_frame(raw)
    assert response_version == 0x84 and stream == 3 and opcode == ERROR
    code, message = error_of(body)
    assert code == 0x000A
    assert "Invalid or unsupported protocol version" in message


def test_options_lists_cql_version_and_compression(raw):
    raw.sendall(frame(4, 1, OPTIONS))
    _, _, _, opcode, body = read_frame(raw)
    assert opcode == SUPPORTED
    assert b"CQL_VERSION" in body and b"COMPRESSION" in body and b"lz4" in body
    assert b"SCYLLA" not in body


def test_queries_before_startup_are_refused(raw):
    raw.sendall(frame(4, 1, QUERY, query_body("SELECT * FROM system.local")))
    _, _, _, opcode, body = read_frame(raw)
    assert opcode == ERROR and error_of(body)[0] == 0x000A


def test_oversized_frames_are_refused_and_the_connection_survives(raw):
    started(raw)
    big = 17 * 1024 * 1024
    raw.sendall(struct.pack(">BBhBI", 4, 0, 5, QUERY, big))
    chunk = b"\x00" * (1024 * 1024)
    for _ in range(17):
        raw.sendall(chunk)
    _, _, stream, opcode, body = read_frame(raw)
    assert stream == 5 and opcode == ERROR
    code, message = error_of(body)
    assert code == 0x000A and "too big" in message
    raw.sendall(frame(4, 6, QUERY, query_body("SELECT key FROM system.local")))
    assert read_frame(raw)[3] == RESULT


def test_malformed_bodies_get_protocol_errors(raw):
    started(raw)
    for garbage in [b"", b"\x00\x00\x00\x10abc", b"\xff\xff\xff\xff", b"\x00\x00\x00\x01x\x00\x63\x00"]:
        raw.sendall(frame(4, 9, QUERY, garbage))
        _, _, stream, opcode, body = read_frame(raw)
        assert stream == 9 and opcode == ERROR
    raw.sendall(frame(4, 7, 0x42))
    assert read_frame(raw)[3] == ERROR
    raw.sendall(frame(4, 8, QUERY, query_body("SELECT key FROM system.local")))
    assert read_frame(raw)[3] == RESULT


def test_many_streams_in_flight_on_one_connection(raw):
    started(raw)
    streams = list(range(1, 301))
    raw.sendall(b"".join(frame(4, s, QUERY, query_body("SELECT key FROM system.local")) for s in streams))
    seen = set()
    for _ in streams:
        _, _, stream, opcode, _ = read_frame(raw)
        assert opcode == RESULT
        seen.add(stream)
    assert seen == set(streams)


def test_driver_with_lz4_compression(node):
    cluster, session = connect(node, compression="lz4")
    try:
        assert session.execute("SELECT key FROM system.local").one().key == "local"
        rows = list(session.execute("SELECT * FROM system_schema.columns"))
        assert len(rows) > 20
    finally:
        cluster.shutdown()


def test_driver_negotiates_down_to_v4(node):
    cluster = Cluster([node.address], port=node.port)
    try:
        cluster.connect()
        assert cluster.protocol_version == 4
    finally:
        cluster.shutdown()


def test_concurrent_async_requests(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    insert = session.prepare("INSERT INTO t (k, v) VALUES (?, ?)")
    futures = [session.execute_async(insert, (i, i)) for i in range(2000)]
    for future in futures:
        future.result()
    assert session.execute("SELECT count(*) FROM t").one().count == 2000


def test_requests_beyond_the_in_flight_limit_get_overloaded(tmp_path):
    from shoal_process import ShoalNode

    config = tmp_path / "tight.toml"
    config.write_text('commitlog_sync = "group"\nmax_requests_in_flight_per_connection = 2\n')
    node = ShoalNode(tmp_path / "node", config=config)
    with node:
        sock = socket.create_connection((node.address, node.port), timeout=10)
        try:
            started(sock)
            setup = [
                "CREATE KEYSPACE o WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
                "CREATE TABLE o.t (k int PRIMARY KEY)",
            ]
            for i, statement in enumerate(setup):
                sock.sendall(frame(4, i + 1, QUERY, query_body(statement)))
                assert read_frame(sock)[3] == RESULT
            count = 300
            sock.sendall(b"".join(frame(4, 100 + i, QUERY, query_body(f"INSERT INTO o.t (k) VALUES ({i})")) for i in range(count)))
            overloaded = succeeded = 0
            for _ in range(count):
                _, _, _, opcode, body = read_frame(sock)
                if opcode == RESULT:
                    succeeded += 1
                else:
                    code, message = error_of(body)
                    assert code == 0x1001 and "Too many requests in flight" in message
                    overloaded += 1
            assert succeeded >= 2 and overloaded > 0
            # The connection keeps working once the burst is over.
            sock.sendall(frame(4, 5, QUERY, query_body("SELECT k FROM o.t LIMIT 1")))
            assert read_frame(sock)[3] == RESULT
        finally:
            sock.close()


def test_point_reads_are_not_stuck_behind_a_scan_on_the_same_connection(session):
    session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
    insert = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
    from cassandra.query import BatchStatement, BatchType

    for k in range(60):
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for c in range(1000):
            batch.add(insert, (k, c, "x" * 20))
        session.execute(batch)
    finished = {}

    def done(name):
        return lambda _: finished.setdefault(name, time.monotonic())

    scan = session.execute_async("SELECT count(*) FROM t")
    scan.add_callback(done("scan"))
    point = session.prepare("SELECT v FROM t WHERE k = ? AND c = ?")
    points = [session.execute_async(point, (i, i)) for i in range(20)]
    for i, future in enumerate(points):
        future.add_callback(done(f"point{i}"))
    assert scan.result().one().count == 60_000
    for future in points:
        assert future.result().one().v == "x" * 20
    last_point = max(finished[f"point{i}"] for i in range(20))
    assert last_point < finished["scan"], "point reads waited for the scan"
