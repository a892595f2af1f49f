#![allow(clippy::unwrap_used)]
//! The core of the single-node scope through the Rust `scylla` driver (default settings):
//! connect, DDL, prepared statements with token-aware routing, batches, paging, types,
//! errors, LZ4 compression. The node runs in-process on a free loopback port.

// The server's integration-test helpers (free ports and the rest), shared rather than copied.
#[path = "../../server/tests/common/mod.rs"]
mod common;

use common::free_ports;
use futures::TryStreamExt;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::Batch;
use scylla::statement::unprepared::Statement;
use shoal_server::config::Config;
use shoal_server::Node;

async fn start_node(directory: &std::path::Path) -> Node {
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.to_path_buf(),
        cql_port,
        internode_port,
        ..Config::default()
    };
    Node::start(config).await.expect("node starts")
}

async fn connect(node: &Node, compression: bool) -> Session {
    let mut builder = SessionBuilder::new().known_node_addr(node.cql_address());
    if compression {
        builder = builder.compression(Some(scylla::frame::Compression::Lz4));
    }
    builder.build().await.expect("driver connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scylla_driver_runs_ddl_dml_batches_and_paging() {
    let directory = tempfile::tempdir().unwrap();
    let node = start_node(directory.path()).await;
    let session = connect(&node, false).await;

    session
        .query_unpaged("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}", &[])
        .await
        .unwrap();
    session.await_schema_agreement().await.unwrap();
    session.use_keyspace("ks", false).await.unwrap();
    session
        .query_unpaged("CREATE TABLE t (k int, c int, v text, tags set<text>, PRIMARY KEY (k, c)) WITH CLUSTERING ORDER BY (c DESC)", &[])
        .await
        .unwrap();

    let insert = session
        .prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
        .await
        .unwrap();
    assert!(
        insert.is_token_aware(),
        "the partition key markers are reported"
    );
    for k in 0..20 {
        for c in 0..25 {
            session
                .execute_unpaged(&insert, (k, c, format!("v{k}-{c}")))
                .await
                .unwrap();
        }
    }

    // Point read through a prepared statement.
    let select = session
        .prepare("SELECT v FROM t WHERE k = ? AND c = ?")
        .await
        .unwrap();
    let rows = session
        .execute_unpaged(&select, (3, 7))
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (value,): (String,) = rows.single_row().unwrap();
    assert_eq!(value, "v3-7");

    // Clustering order DESC, and ORDER BY reversing it.
    let rows = session
        .query_unpaged("SELECT c FROM t WHERE k = 1 LIMIT 3", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let clusterings: Vec<i32> = rows
        .rows::<(i32,)>()
        .unwrap()
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(clusterings, vec![24, 23, 22]);

    // Tokens match the driver's own Murmur3 (token-aware routing relies on it).
    let token_query = session
        .prepare("SELECT token(k) FROM t WHERE k = ? LIMIT 1")
        .await
        .unwrap();
    let rows = session
        .execute_unpaged(&token_query, (5,))
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (server_token,): (i64,) = rows.single_row().unwrap();
    let driver_token = insert.calculate_token(&(5, 0, "x")).unwrap().unwrap();
    assert_eq!(server_token, driver_token.value());

    // A batch of prepared and simple statements.
    let mut batch = Batch::default();
    batch.append_statement(insert.clone());
    batch.append_statement("UPDATE t SET tags = tags + {'a', 'b'} WHERE k = 100 AND c = 1");
    session
        .batch(&batch, ((100, 1, "batched"), ()))
        .await
        .unwrap();
    let rows = session
        .query_unpaged("SELECT v, tags FROM t WHERE k = 100", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (v, tags): (String, Vec<String>) = rows.single_row().unwrap();
    assert_eq!(
        (v.as_str(), tags),
        ("batched", vec!["a".to_string(), "b".to_string()])
    );

    // Paging over the whole table returns every row once.
    let mut scan = Statement::new("SELECT k, c FROM t");
    scan.set_page_size(37);
    let all: Vec<(i32, i32)> = session
        .query_iter(scan, &[])
        .await
        .unwrap()
        .rows_stream::<(i32, i32)>()
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(all.len(), 20 * 25 + 1);
    let distinct: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len());

    // Errors come back as errors; the session keeps working.
    let error = session
        .query_unpaged("SELECT nope FROM t", &[])
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("Undefined column name nope"),
        "{error}"
    );
    let error = session.query_unpaged("SELEC 1", &[]).await.unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("syntax")
            || error.to_string().contains("no viable"),
        "{error}"
    );
    session
        .query_unpaged("SELECT k FROM t LIMIT 1", &[])
        .await
        .unwrap();

    drop(session);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scylla_driver_with_lz4_and_many_concurrent_requests() {
    let directory = tempfile::tempdir().unwrap();
    let node = start_node(directory.path()).await;
    let session = connect(&node, true).await;
    session
        .query_unpaged("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}", &[])
        .await
        .unwrap();
    session
        .query_unpaged("CREATE TABLE ks.kv (k bigint PRIMARY KEY, v blob)", &[])
        .await
        .unwrap();
    let insert = session
        .prepare("INSERT INTO ks.kv (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    let value = vec![7u8; 100];
    let writes = (0..2000i64).map(|k| {
        let session = &session;
        let insert = &insert;
        let value = value.clone();
        async move { session.execute_unpaged(insert, (k, value)).await }
    });
    for result in futures::future::join_all(writes).await {
        result.unwrap();
    }
    let rows = session
        .query_unpaged("SELECT count(*) FROM ks.kv", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (count,): (i64,) = rows.single_row().unwrap();
    assert_eq!(count, 2000);
    drop(session);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scylla_driver_logs_in_with_a_password_and_is_held_to_its_permissions() {
    let directory = tempfile::tempdir().unwrap();
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.path().to_path_buf(),
        cql_port,
        internode_port,
        authenticator: shoal_server::config::Authenticator::PasswordAuthenticator,
        authorizer: shoal_server::config::Authorizer::CassandraAuthorizer,
        ..Config::default()
    };
    let node = Node::start(config).await.expect("node starts");
    let address = node.cql_address();
    let login = |user: &'static str, password: &'static str| async move {
        SessionBuilder::new()
            .known_node_addr(address)
            .user(user, password)
            .build()
            .await
    };
    assert!(login("cassandra", "wrong").await.is_err());
    let admin = login("cassandra", "cassandra").await.unwrap();
    for statement in [
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
        "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        "CREATE ROLE app WITH PASSWORD = 'app-pw' AND LOGIN = true",
    ] {
        admin.query_unpaged(statement, &[]).await.unwrap();
    }
    let app = login("app", "app-pw").await.unwrap();
    let insert = app
        .prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    let error = app.execute_unpaged(&insert, (1, 1)).await.unwrap_err();
    assert!(
        error.to_string().contains("no MODIFY permission"),
        "{error}"
    );
    admin
        .query_unpaged("GRANT MODIFY ON ks.t TO app", &[])
        .await
        .unwrap();
    app.execute_unpaged(&insert, (1, 1)).await.unwrap();
    drop((app, admin));
    node.stop().await;
}

/// A self-signed certificate for 127.0.0.1 and its key (PEM files), made by `openssl`.
fn make_certificate(directory: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let certificate = directory.join("node.crt");
    let key = directory.join("node.key");
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args([
            "-subj",
            "/CN=shoal",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&certificate)
        .output()
        .expect("openssl runs");
    assert!(status.status.success(), "{status:?}");
    (certificate, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scylla_driver_connects_over_tls_and_only_when_it_trusts_the_certificate() {
    use openssl::ssl::{SslContextBuilder, SslMethod, SslVerifyMode};
    let directory = tempfile::tempdir().unwrap();
    let (certificate, key) = make_certificate(directory.path());
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.path().join("data"),
        cql_port,
        internode_port,
        client_tls: shoal_server::config::ClientTls::Required,
        tls_certificate: Some(certificate.clone()),
        tls_private_key: Some(key),
        ..Config::default()
    };
    let node = Node::start(config).await.expect("node starts");
    let connect = |trusted: Option<&std::path::Path>| {
        let mut context = SslContextBuilder::new(SslMethod::tls()).unwrap();
        context.set_verify(SslVerifyMode::PEER);
        if let Some(trusted) = trusted {
            context.set_ca_file(trusted).unwrap();
        }
        SessionBuilder::new()
            .known_node_addr(node.cql_address())
            .tls_context(Some(context.build()))
    };
    let session = connect(Some(&certificate)).build().await.unwrap();
    let rows = session
        .query_unpaged("SELECT key FROM system.local", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    assert_eq!(rows.rows_num(), 1);
    assert!(connect(None).build().await.is_err());
    assert!(SessionBuilder::new()
        .known_node_addr(node.cql_address())
        .build()
        .await
        .is_err());
    drop(session);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scylla_driver_learns_which_prepared_statements_are_lightweight_transactions() {
    let directory = tempfile::tempdir().unwrap();
    let node = start_node(directory.path()).await;
    let session = connect(&node, false).await;
    session
        .query_unpaged("CREATE KEYSPACE lwt WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}", &[])
        .await
        .unwrap();
    session
        .query_unpaged("CREATE TABLE lwt.t (k int PRIMARY KEY, v int)", &[])
        .await
        .unwrap();
    // Marked: the driver sends every one of them on a partition to the same replica.
    for conditional in [
        "INSERT INTO lwt.t (k, v) VALUES (?, ?) IF NOT EXISTS",
        "UPDATE lwt.t SET v = ? WHERE k = ? IF v = ?",
        "DELETE FROM lwt.t WHERE k = ? IF EXISTS",
        "BEGIN BATCH UPDATE lwt.t SET v = ? WHERE k = ? IF v = 1; APPLY BATCH",
    ] {
        let prepared = session.prepare(conditional).await.unwrap();
        assert!(prepared.is_confirmed_lwt(), "{conditional}");
    }
    for plain in [
        "INSERT INTO lwt.t (k, v) VALUES (?, ?)",
        "UPDATE lwt.t SET v = ? WHERE k = ?",
        "SELECT v FROM lwt.t WHERE k = ?",
    ] {
        let prepared = session.prepare(plain).await.unwrap();
        assert!(!prepared.is_confirmed_lwt(), "{plain}");
    }
    // A marked statement still runs as a lightweight transaction.
    let insert = session
        .prepare("INSERT INTO lwt.t (k, v) VALUES (?, ?) IF NOT EXISTS")
        .await
        .unwrap();
    for (value, applied) in [(1, true), (2, false)] {
        let result = session.execute_unpaged(&insert, (1, value)).await.unwrap();
        let rows = result.into_rows_result().unwrap();
        let row = rows.first_row::<scylla::value::Row>().unwrap();
        assert_eq!(
            row.columns[0],
            Some(scylla::value::CqlValue::Boolean(applied))
        );
    }
}
