"""cqlsh (from PyPI) against a Shoal node: `-e`, an interactive session, DESCRIBE,
CONSISTENCY, COPY TO and COPY FROM."""

import os
import shutil
import subprocess
import sys

import pexpect
import pytest

CQLSH = shutil.which("cqlsh") or os.path.join(os.path.dirname(sys.executable), "cqlsh")


def cqlsh(node, statements, timeout=60):
    result = subprocess.run(
        [CQLSH, node.address, str(node.port), "-e", statements],
        capture_output=True, text=True, timeout=timeout,
    )
    return result


def test_cqlsh_e_runs_ddl_and_dml(node):
    result = cqlsh(node, (
        "CREATE KEYSPACE IF NOT EXISTS cqlsh_ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};"
        "CREATE TABLE IF NOT EXISTS cqlsh_ks.users (id int PRIMARY KEY, name text, tags set<text>);"
        "INSERT INTO cqlsh_ks.users (id, name, tags) VALUES (1, 'ada', {'x'});"
        "SELECT * FROM cqlsh_ks.users;"
    ))
    assert result.returncode == 0, result.stderr
    assert "ada" in result.stdout and "(1 rows)" in result.stdout


def test_cqlsh_describe(node):
    cqlsh(node, "CREATE KEYSPACE IF NOT EXISTS cqlsh_ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};"
                "CREATE TABLE IF NOT EXISTS cqlsh_ks.users (id int PRIMARY KEY, name text, tags set<text>);")
    result = cqlsh(node, "DESCRIBE KEYSPACES")
    assert result.returncode == 0, result.stderr
    assert "cqlsh_ks" in result.stdout and "system_schema" in result.stdout
    result = cqlsh(node, "DESCRIBE TABLE cqlsh_ks.users")
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE cqlsh_ks.users" in result.stdout and "id int PRIMARY KEY" in result.stdout
    result = cqlsh(node, "USE cqlsh_ks; DESCRIBE TABLES")
    assert "users" in result.stdout


def test_cqlsh_errors_are_printed_not_crashing(node):
    result = cqlsh(node, "SELECT * FROM no_such_keyspace.t")
    assert "InvalidRequest" in result.stderr or "does not exist" in result.stderr


def test_cqlsh_interactive_session_with_consistency(node):
    child = pexpect.spawn(CQLSH, [node.address, str(node.port)], timeout=30, encoding="utf-8")
    try:
        child.expect("cqlsh>")
        child.sendline("CREATE KEYSPACE IF NOT EXISTS inter WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};")
        child.expect("cqlsh>")
        child.sendline("USE inter;")
        child.expect(r"cqlsh:inter>")
        child.sendline("CREATE TABLE IF NOT EXISTS t (k int PRIMARY KEY, v text);")
        child.expect(r"cqlsh:inter>")
        child.sendline("CONSISTENCY QUORUM;")
        child.expect("Consistency level set to QUORUM")
        child.expect(r"cqlsh:inter>")
        child.sendline("INSERT INTO t (k, v) VALUES (1, 'typed');")
        child.expect(r"cqlsh:inter>")
        child.sendline("SELECT * FROM t;")
        child.expect("typed")
        child.expect(r"\(1 rows\)")
        child.expect(r"cqlsh:inter>")
        child.sendline("EXIT")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_cqlsh_copy_to_and_from(node, tmp_path):
    setup = (
        "CREATE KEYSPACE IF NOT EXISTS copy_ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};"
        "CREATE TABLE IF NOT EXISTS copy_ks.src (k int, c int, v text, PRIMARY KEY (k, c));"
        "CREATE TABLE IF NOT EXISTS copy_ks.dst (k int, c int, v text, PRIMARY KEY (k, c));"
    )
    inserts = "".join(f"INSERT INTO copy_ks.src (k, c, v) VALUES ({i % 13}, {i}, 'row {i}');" for i in range(300))
    assert cqlsh(node, setup + inserts).returncode == 0
    csv = tmp_path / "rows.csv"
    exported = cqlsh(node, f"COPY copy_ks.src (k, c, v) TO '{csv}'", timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert "300 rows exported" in exported.stdout, exported.stdout
    assert len(csv.read_text().splitlines()) == 300
    imported = cqlsh(node, f"COPY copy_ks.dst (k, c, v) FROM '{csv}'", timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert "300 rows imported" in imported.stdout, imported.stdout
    counted = cqlsh(node, "SELECT count(*) FROM copy_ks.dst")
    assert " 300" in counted.stdout


def test_cqlsh_prints_and_describes_user_defined_types(node):
    result = cqlsh(node, (
        "CREATE KEYSPACE IF NOT EXISTS cqlsh_udt WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1};"
        "CREATE TYPE IF NOT EXISTS cqlsh_udt.address (street text, zip int);"
        "CREATE TABLE IF NOT EXISTS cqlsh_udt.users (id int PRIMARY KEY, home frozen<address>, work address);"
        "INSERT INTO cqlsh_udt.users (id, home, work) VALUES (1, {street: 'Main St', zip: 12345}, {zip: 7});"
        "SELECT * FROM cqlsh_udt.users;"
        "DESCRIBE TYPE cqlsh_udt.address;"
    ))
    assert result.returncode == 0, result.stderr
    assert "{street: 'Main St', zip: 12345}" in result.stdout
    assert "{street: null, zip: 7}" in result.stdout
    assert "CREATE TYPE cqlsh_udt.address (" in result.stdout and "zip int" in result.stdout
