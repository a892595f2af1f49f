"""Secondary indexes on one node: CREATE INDEX (default and `USING 'sai'`, named and
unnamed, IF NOT EXISTS) on regular, static and clustering columns, partition-key
components and collections (`CONTAINS`, `CONTAINS KEY`, `m[k] = v`); ranges (`<`, `<=`,
`>`, `>=`) over storage-attached indexes, numbers and timestamps; queries with and
without the partition key, AND of several restrictions, paging, and the index following
updates, deletes and TTLs (never a stale hit, never a missed one); DROP INDEX; the schema
tables and DESCRIBE; Cassandra's errors. Runs against Cassandra too
(`--against-cassandra`); the randomized comparison with a filtered full scan is in
`test_indexes_model.py`."""

import time

import pytest
from cassandra import InvalidRequest, ReadFailure
from cassandra.protocol import ConfigurationException
from cassandra.query import SimpleStatement


def when_built(session, query, timeout=30):
    """Runs `query` once the index it uses has been built for the data that existed when
    it was created (until then Cassandra fails the read with INDEX_NOT_AVAILABLE, Shoal
    with "not yet available as it is building")."""
    deadline = time.time() + timeout
    while True:
        try:
            return list(session.execute(query))
        except (ReadFailure, InvalidRequest) as error:
            if "INDEX_NOT_AVAILABLE" not in str(error) and "building" not in str(error) \
                    and "UNKNOWN" not in str(error):
                raise
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def users(session, using=""):
    session.execute("CREATE TABLE users (id int PRIMARY KEY, email text, country text, age int)")
    session.execute(f"CREATE INDEX users_email ON users (email) {using}")
    for i in range(20):
        session.execute("INSERT INTO users (id, email, country, age) VALUES (%s, %s, %s, %s)",
                        (i, f"user{i}@example.com", ["fr", "jp", "us"][i % 3], 20 + i % 5))


@pytest.mark.parametrize("using", ["", "USING 'sai'"])
def test_an_indexed_column_is_queried_by_equality(session, using):
    users(session, using)
    row = session.execute("SELECT id, email FROM users WHERE email = 'user7@example.com'").one()
    assert (row.id, row.email) == (7, "user7@example.com")
    assert list(session.execute("SELECT id FROM users WHERE email = 'nobody@example.com'")) == []
    select = session.prepare("SELECT id FROM users WHERE email = ?")
    assert [r.id for r in session.execute(select, ("user12@example.com",))] == [12]


def test_the_index_follows_updates_deletes_and_ttls(session):
    users(session)
    session.execute("UPDATE users SET email = 'new@example.com' WHERE id = 3")
    assert list(session.execute("SELECT id FROM users WHERE email = 'user3@example.com'")) == []
    assert [r.id for r in session.execute("SELECT id FROM users WHERE email = 'new@example.com'")] == [3]
    session.execute("DELETE FROM users WHERE id = 4")
    assert list(session.execute("SELECT id FROM users WHERE email = 'user4@example.com'")) == []
    session.execute("DELETE email FROM users WHERE id = 5")
    assert list(session.execute("SELECT id FROM users WHERE email = 'user5@example.com'")) == []
    # A TTL counts whole seconds from the second of the write, as Cassandra's does: with
    # TTL 1 a write at the end of a second expires a moment later, and the read that
    # follows could miss it. With TTL 3 it lives at least 2 s and at most 3.
    session.execute("INSERT INTO users (id, email) VALUES (100, 'brief@example.com') USING TTL 3")
    assert [r.id for r in session.execute("SELECT id FROM users WHERE email = 'brief@example.com'")] == [100]
    time.sleep(3.1)
    assert list(session.execute("SELECT id FROM users WHERE email = 'brief@example.com'")) == []
    # Two rows with one value; the old value of an overwritten row is gone.
    session.execute("UPDATE users SET email = 'new@example.com' WHERE id = 6")
    assert sorted(r.id for r in session.execute("SELECT id FROM users WHERE email = 'new@example.com'")) == [3, 6]


def test_many_matches_are_paged(session):
    session.execute("CREATE TABLE events (id int PRIMARY KEY, kind text)")
    session.execute("CREATE INDEX ON events (kind)")
    insert = session.prepare("INSERT INTO events (id, kind) VALUES (?, ?)")
    for i in range(300):
        session.execute(insert, (i, "odd" if i % 2 else "even"))
    statement = SimpleStatement("SELECT id FROM events WHERE kind = 'odd'", fetch_size=17)
    result = session.execute(statement)
    ids = [r.id for r in result]
    assert sorted(ids) == list(range(1, 300, 2))
    assert len(ids) == len(set(ids))
    limited = [r.id for r in session.execute("SELECT id FROM events WHERE kind = 'even' LIMIT 7")]
    assert len(limited) == 7 and all(i % 2 == 0 for i in limited)


def test_an_existing_table_is_indexed_when_the_index_is_created(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
    for i in range(200):
        session.execute("INSERT INTO t (k, v) VALUES (%s, %s)", (i, f"v{i % 10}"))
    session.execute("CREATE INDEX t_v ON t (v)")
    ids = sorted(r.k for r in when_built(session, "SELECT k FROM t WHERE v = 'v3'"))
    assert ids == list(range(3, 200, 10))


def test_static_clustering_and_partition_key_columns_are_indexed(session):
    session.execute("CREATE TABLE t (a int, b int, c int, s text static, v int, PRIMARY KEY ((a, b), c))")
    session.execute("CREATE INDEX ON t (s)")
    session.execute("CREATE INDEX ON t (c)")
    session.execute("CREATE INDEX ON t (b)")
    for a in range(3):
        for b in range(2):
            session.execute("INSERT INTO t (a, b, s) VALUES (%s, %s, %s)", (a, b, f"s{a}"))
            for c in range(3):
                session.execute("INSERT INTO t (a, b, c, v) VALUES (%s, %s, %s, %s)", (a, b, c, a * 100 + b * 10 + c))
    rows = sorted((r.a, r.b, r.c) for r in session.execute("SELECT a, b, c FROM t WHERE s = 's1'"))
    assert rows == [(1, b, c) for b in range(2) for c in range(3)]
    rows = sorted(r.v for r in session.execute("SELECT v FROM t WHERE c = 2"))
    assert rows == sorted(a * 100 + b * 10 + 2 for a in range(3) for b in range(2))
    rows = sorted(r.v for r in session.execute("SELECT v FROM t WHERE b = 1"))
    assert rows == sorted(a * 100 + 10 + c for a in range(3) for c in range(3))


def test_collections_are_indexed_by_values_keys_and_entries(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, tags set<text>, scores list<int>, attrs map<text, text>, "
                    "fixed frozen<list<int>>)")
    session.execute("CREATE INDEX ON t (tags)")
    session.execute("CREATE INDEX ON t (VALUES(scores))")
    session.execute("CREATE INDEX ON t (KEYS(attrs))")
    session.execute("CREATE INDEX attrs_entries ON t (ENTRIES(attrs))")
    session.execute("CREATE INDEX ON t (FULL(fixed))")
    session.execute("INSERT INTO t (k, tags, scores, attrs, fixed) VALUES (1, {'a', 'b'}, [1, 2], {'color': 'red'}, [1, 2])")
    session.execute("INSERT INTO t (k, tags, scores, attrs, fixed) VALUES (2, {'b'}, [2, 3], {'size': 'big', 'color': 'blue'}, [3])")
    assert sorted(r.k for r in session.execute("SELECT k FROM t WHERE tags CONTAINS 'b'")) == [1, 2]
    assert [r.k for r in session.execute("SELECT k FROM t WHERE tags CONTAINS 'a'")] == [1]
    assert [r.k for r in session.execute("SELECT k FROM t WHERE scores CONTAINS 3")] == [2]
    assert sorted(r.k for r in session.execute("SELECT k FROM t WHERE attrs CONTAINS KEY 'color'")) == [1, 2]
    assert [r.k for r in session.execute("SELECT k FROM t WHERE attrs['color'] = 'blue'")] == [2]
    assert [r.k for r in session.execute("SELECT k FROM t WHERE fixed = [1, 2]")] == [1]
    session.execute("UPDATE t SET tags = tags - {'b'} WHERE k = 2")
    assert [r.k for r in session.execute("SELECT k FROM t WHERE tags CONTAINS 'b'")] == [1]


def test_several_restrictions_combine(session):
    users(session, "USING 'sai'")
    session.execute("CREATE INDEX ON users (country) USING 'sai'")
    rows = sorted(r.id for r in when_built(session, "SELECT id FROM users WHERE country = 'jp' AND email = 'user4@example.com'"))
    assert rows == [4]
    # A restriction on a column without an index needs ALLOW FILTERING.
    with pytest.raises(InvalidRequest) as refused:
        session.execute("SELECT id FROM users WHERE country = 'jp' AND age = 21")
    assert "ALLOW FILTERING" in str(refused.value)
    rows = sorted(r.id for r in session.execute("SELECT id FROM users WHERE country = 'jp' AND age = 21 ALLOW FILTERING"))
    assert rows == [i for i in range(20) if i % 3 == 1 and 20 + i % 5 == 21]
    # With the partition key named, the index is not needed.
    assert [r.id for r in session.execute("SELECT id FROM users WHERE id = 4 AND email = 'user4@example.com'")] == [4]


def test_drop_index_and_the_schema_tables(session):
    keyspace = session.keyspace
    users(session)
    session.execute("CREATE INDEX IF NOT EXISTS users_email ON users (email)")
    session.execute("CREATE INDEX ON users (country) USING 'sai'")
    indexes = {r.index_name: (r.kind, dict(r.options)) for r in session.execute(
        "SELECT index_name, kind, options FROM system_schema.indexes WHERE keyspace_name = %s AND table_name = 'users'",
        (keyspace,))}
    assert indexes["users_email"] == ("COMPOSITES", {"target": "email"})
    assert indexes["users_country_idx"][0] == "CUSTOM"
    assert indexes["users_country_idx"][1]["target"] == "country"
    described = [r.create_statement for r in session.execute(f"DESCRIBE TABLE {keyspace}.users")]
    assert f"CREATE INDEX users_email ON {keyspace}.users (email);" in described
    assert f"CREATE CUSTOM INDEX users_country_idx ON {keyspace}.users (country) USING 'sai';" in described
    session.execute("DROP INDEX users_email")
    with pytest.raises(InvalidRequest) as refused:
        session.execute("SELECT id FROM users WHERE email = 'user1@example.com'")
    assert "ALLOW FILTERING" in str(refused.value)
    session.execute("DROP INDEX IF EXISTS users_email")
    with pytest.raises(InvalidRequest):
        session.execute("DROP INDEX users_email")


@pytest.mark.parametrize("statement, message", [
    ("CREATE INDEX ON t (nosuchcolumn)", "Undefined column name nosuchcolumn"),
    ("CREATE INDEX ON t (k)", "Cannot create secondary index on the only partition key column k"),
    ("CREATE INDEX ON t (KEYS(v))", "Cannot create keys() index on v. Non-collection columns only support simple indexes"),
    ("CREATE INDEX ON nosuchtable (v)", "nosuchtable"),
])
def test_bad_index_statements_get_clear_errors(session, statement, message):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    with pytest.raises(InvalidRequest) as refused:
        session.execute(statement)
    assert message in str(refused.value)


def test_an_unknown_index_class_is_refused(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    with pytest.raises(ConfigurationException) as refused:
        session.execute("CREATE INDEX ON t (v) USING 'org.example.NoSuchIndex'")
    assert "Unable to find custom indexer class 'org.example.NoSuchIndex'" in str(refused.value)


def test_an_indexed_column_cannot_be_dropped_and_a_renamed_key_keeps_its_index(session):
    session.execute("CREATE TABLE t (k int, c int, v int, PRIMARY KEY (k, c))")
    session.execute("CREATE INDEX t_v ON t (v)")
    session.execute("CREATE INDEX t_c ON t (c)")
    with pytest.raises(InvalidRequest) as refused:
        session.execute("ALTER TABLE t DROP v")
    assert "Cannot drop column v because it has dependent secondary indexes (t_v)" in str(refused.value)
    session.execute("INSERT INTO t (k, c, v) VALUES (1, 2, 3)")
    session.execute("ALTER TABLE t RENAME c TO d")
    assert [tuple(r) for r in session.execute("SELECT k, d FROM t WHERE d = 2")] == [(1, 2)]


def test_a_duplicate_index_is_refused(session):
    session.execute("CREATE TABLE t (k int PRIMARY KEY, v int)")
    session.execute("CREATE INDEX one ON t (v)")
    with pytest.raises(InvalidRequest) as refused:
        session.execute("CREATE INDEX two ON t (v)")
    assert "duplicate of existing index one" in str(refused.value)
    with pytest.raises(Exception) as refused:
        session.execute("CREATE INDEX one ON t (v)")
    assert "already exists" in str(refused.value)


def readings(session):
    """A table of sensor readings with storage-attached indexes on an int, a bigint, a
    double and a timestamp, values on both sides of zero, and one legacy index."""
    session.execute("CREATE TABLE readings (id int PRIMARY KEY, site text, level int, total bigint, "
                    "ratio double, at timestamp, note int)")
    for column in ("level", "total", "ratio", "at", "site"):
        session.execute(f"CREATE INDEX ON readings ({column}) USING 'sai'")
    session.execute("CREATE INDEX ON readings (note)")
    insert = session.prepare("INSERT INTO readings (id, site, level, total, ratio, at, note) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)")
    for i in range(60):
        session.execute(insert, (i, ["north", "south"][i % 2], i - 30, (i - 30) * 10**12, (i - 30) / 7,
                                 1_700_000_000_000 + i * 60_000, i % 4))


def ids(session, query, parameters=None):
    return sorted(r.id for r in session.execute(query, parameters))


def test_a_storage_attached_index_answers_ranges_without_allow_filtering(session):
    readings(session)
    assert ids(session, "SELECT id FROM readings WHERE level > 25") == list(range(56, 60))
    assert ids(session, "SELECT id FROM readings WHERE level >= -2 AND level < 3") == list(range(28, 33))
    assert ids(session, "SELECT id FROM readings WHERE level <= -29") == [0, 1]
    assert ids(session, "SELECT id FROM readings WHERE level > 10 AND level < 5") == []
    with pytest.raises(InvalidRequest) as refused:
        session.execute("SELECT id FROM readings WHERE level > 0 AND level >= 27")
    assert "More than one restriction was found for the start bound on level" in str(refused.value)
    assert ids(session, "SELECT id FROM readings WHERE total < -28000000000000") == [0, 1]
    assert ids(session, "SELECT id FROM readings WHERE ratio > 3.9") == [58, 59]
    assert ids(session, "SELECT id FROM readings WHERE ratio >= -0.2 AND ratio <= 0.2") == [29, 30, 31]
    assert ids(session, "SELECT id FROM readings WHERE at >= '2023-11-14 22:50:00+0000' "
                        "AND at < '2023-11-14 22:53:00+0000'") == [37, 38, 39]
    # A range and an equality on indexed columns, and a range with markers.
    assert ids(session, "SELECT id FROM readings WHERE site = 'north' AND level > 24") == [56, 58]
    select = session.prepare("SELECT id FROM readings WHERE level >= ? AND level < ?")
    assert ids(session, select, (5, 8)) == [35, 36, 37]


def test_a_range_over_an_index_is_paged_and_follows_updates(session):
    readings(session)
    statement = SimpleStatement("SELECT id, level FROM readings WHERE level >= -20", fetch_size=7)
    found = [(r.id, r.level) for r in session.execute(statement)]
    assert sorted(found) == [(i, i - 30) for i in range(10, 60)]
    assert len(found) == len(set(found))
    assert len(list(session.execute("SELECT id FROM readings WHERE level >= -20 LIMIT 9"))) == 9
    session.execute("UPDATE readings SET level = 1000 WHERE id = 3")
    session.execute("DELETE FROM readings WHERE id = 59")
    session.execute("DELETE level FROM readings WHERE id = 58")
    assert ids(session, "SELECT id FROM readings WHERE level > 26") == [3, 57]
    assert ids(session, "SELECT id FROM readings WHERE level < -26") == [0, 1, 2]


def test_a_range_on_a_legacy_index_still_needs_allow_filtering(session):
    readings(session)
    with pytest.raises(InvalidRequest) as refused:
        session.execute("SELECT id FROM readings WHERE note > 2")
    assert "ALLOW FILTERING" in str(refused.value)
    assert ids(session, "SELECT id FROM readings WHERE note > 2 ALLOW FILTERING") == list(range(3, 60, 4))
