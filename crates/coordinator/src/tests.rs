//! Statement execution against the in-memory engine: behaviour that is easier to pin down
//! here than through a driver (paging states, bind-marker metadata, schema persistence).

use crate::{Coordinator, NodeInfo, Session};
use shoal_cql::request::{BoundValue, QueryParameters};
use shoal_cql::response::ResultBody;
use shoal_cql::ErrorCode;
use shoal_model::{CqlType, Value};
use shoal_storage::{Engine, MemoryEngine};
use std::sync::Arc;

fn info() -> NodeInfo {
    NodeInfo {
        cluster_name: "test".into(),
        address: "127.0.0.1".parse().unwrap(),
        cql_port: 9042,
        datacenter: "datacenter1".into(),
        rack: "rack1".into(),
        host_id: shoal_model::HostId([1; 16]),
        tokens: vec![0],
        gossip_generation: 1,
        read_scheduling: crate::schedule::Ordering::PointFirst { narrow_first: true },
        read_threads: 2,
        scan_nice: crate::schedule::SCAN_THREAD_NICE,
        range_request_timeout: shoal_replication::RANGE_READ_TIMEOUT,
    }
}

fn coordinator(engine: Arc<dyn Engine>) -> Arc<Coordinator> {
    Arc::new(Coordinator::local(engine, info()).unwrap())
}

fn run(
    coordinator: &Arc<Coordinator>,
    session: &mut Session,
    text: &str,
    parameters: &QueryParameters,
) -> Result<ResultBody, shoal_cql::CqlError> {
    // Scans run on tokio's blocking pool, so they need a runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(coordinator.query(session, text, parameters))
}

fn ok(coordinator: &Arc<Coordinator>, session: &mut Session, text: &str) -> ResultBody {
    run(coordinator, session, text, &QueryParameters::default())
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn setup(coordinator: &Arc<Coordinator>) -> Session {
    let mut session = Session::default();
    ok(coordinator, &mut session, "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}");
    ok(coordinator, &mut session, "USE ks");
    session
}

/// The first column of every row, as i32.
fn ints(result: &ResultBody) -> (Vec<i32>, Option<Vec<u8>>) {
    let ResultBody::Rows(rows) = result else {
        panic!("not rows: {result:?}")
    };
    let columns = rows.columns.len();
    let mut values = Vec::new();
    let mut position = 0;
    let content = &rows.rows.content;
    for _ in 0..rows.rows.row_count {
        for column in 0..columns {
            let length = i32::from_be_bytes(content[position..position + 4].try_into().unwrap());
            position += 4;
            if length >= 0 {
                if column == 0 {
                    let Value::Int(v) = Value::deserialize(
                        &CqlType::Int,
                        &content[position..position + length as usize],
                    )
                    .unwrap() else {
                        panic!()
                    };
                    values.push(v);
                }
                position += length as usize;
            }
        }
    }
    (values, rows.paging_state.clone())
}

#[test]
fn reversed_partition_pages_resume_after_the_last_row() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int, c int, PRIMARY KEY (k, c))",
    );
    for i in 0..10 {
        ok(
            &c,
            &mut session,
            &format!("INSERT INTO t (k, c) VALUES (1, {i})"),
        );
    }
    let mut parameters = QueryParameters {
        page_size: Some(4),
        ..QueryParameters::default()
    };
    let mut seen = Vec::new();
    loop {
        let result = run(
            &c,
            &mut session,
            "SELECT c FROM t WHERE k = 1 ORDER BY c DESC",
            &parameters,
        )
        .unwrap();
        let (page, state) = ints(&result);
        assert!(page.len() <= 4);
        seen.extend(page);
        match state {
            Some(state) => parameters.paging_state = Some(state),
            None => break,
        }
    }
    assert_eq!(seen, (0..10).rev().collect::<Vec<_>>());
}

#[test]
fn a_garbled_paging_state_is_a_protocol_error() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(&c, &mut session, "CREATE TABLE t (k int PRIMARY KEY)");
    let parameters = QueryParameters {
        page_size: Some(2),
        paging_state: Some(vec![9, 9, 9]),
        ..QueryParameters::default()
    };
    let error = run(&c, &mut session, "SELECT k FROM t", &parameters).unwrap_err();
    assert_eq!(error.code, ErrorCode::Protocol);
}

#[test]
fn prepared_statements_describe_their_markers() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let session = setup(&c);
    let mut session = session;
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (a int, b text, c int, m map<text, int>, PRIMARY KEY ((a, b), c))",
    );
    let ResultBody::Prepared(prepared) = c
        .prepare(
            &session,
            "UPDATE t USING TTL ? SET m[?] = ? WHERE b = ? AND a = ? AND c IN ?",
        )
        .unwrap()
    else {
        panic!("not prepared")
    };
    let described: Vec<(String, String)> = prepared
        .bind_columns
        .iter()
        .map(|c| (c.name.clone(), c.cql_type.to_string()))
        .collect();
    assert_eq!(
        described,
        vec![
            ("[ttl]".into(), "int".into()),
            ("key(m)".into(), "text".into()),
            ("value(m)".into(), "int".into()),
            ("b".into(), "text".into()),
            ("a".into(), "int".into()),
            ("in(c)".into(), "list<int>".into()),
        ]
    );
    assert_eq!(prepared.partition_key_indexes, vec![4, 3]);
    // Executing it binds by those types.
    let parameters = QueryParameters {
        values: vec![
            BoundValue::Bytes(60i32.to_be_bytes().to_vec()),
            BoundValue::Bytes(b"x".to_vec()),
            BoundValue::Bytes(7i32.to_be_bytes().to_vec()),
            BoundValue::Bytes(b"b".to_vec()),
            BoundValue::Bytes(1i32.to_be_bytes().to_vec()),
            BoundValue::Bytes(Value::List(vec![Value::Int(3)]).serialize()),
        ],
        ..QueryParameters::default()
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(c.execute(&mut session, &prepared.id, &parameters))
        .unwrap();
    let (values, _) = ints(&ok(
        &c,
        &mut session,
        "SELECT c FROM t WHERE a = 1 AND b = 'b'",
    ));
    assert_eq!(values, vec![3]);
}

/// A coordinator over `engine` with the table `ks.t (k int PRIMARY KEY, v int)`, and a
/// session in `ks`.
fn with_table_t(engine: &Arc<dyn Engine>) -> (Arc<Coordinator>, Session) {
    let c = coordinator(Arc::clone(engine));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int)",
    );
    (c, session)
}

#[test]
fn the_schema_survives_a_restart_and_unknown_ids_are_unprepared() {
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    {
        let (c, mut session) = with_table_t(&engine);
        ok(&c, &mut session, "INSERT INTO t (k, v) VALUES (5, 6)");
    }
    let c = coordinator(engine);
    let mut session = Session::default();
    let (values, _) = ints(&ok(&c, &mut session, "SELECT k FROM ks.t"));
    assert_eq!(values, vec![5]);
    let error = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(c.execute(&mut session, &[1, 2, 3], &QueryParameters::default()))
        .unwrap_err();
    assert!(matches!(error.code, ErrorCode::Unprepared { .. }));
}

/// Answers lookups with what `node` prepared, or, when `lying`, with another statement.
struct OtherNode {
    node: Arc<Coordinator>,
    lying: bool,
}

impl crate::prepared::PreparedElsewhere for OtherNode {
    fn find<'a>(
        &'a self,
        id: &'a [u8],
    ) -> futures::future::BoxFuture<'a, Option<crate::prepared::StatementText>> {
        Box::pin(async move {
            let mut found = self.node.prepared_statement_text(id)?;
            if self.lying {
                found.text = "DELETE FROM t WHERE k = ?".into();
            }
            Some(found)
        })
    }
}

#[test]
fn a_statement_prepared_on_another_node_is_adopted_in_its_keyspace_if_its_text_hashes_to_the_id() {
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (first, session) = with_table_t(&engine);
    let ResultBody::Prepared(insert) = first
        .prepare(&session, "INSERT INTO t (k, v) VALUES (?, ?)")
        .unwrap()
    else {
        panic!("not prepared")
    };
    let parameters = QueryParameters {
        values: vec![
            BoundValue::Bytes(5i32.to_be_bytes().to_vec()),
            BoundValue::Bytes(6i32.to_be_bytes().to_vec()),
        ],
        ..QueryParameters::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for lying in [true, false] {
        // Another node over the same store: it has the schema, not the statement.
        let second = coordinator(Arc::clone(&engine));
        second.set_prepared_elsewhere(Arc::new(OtherNode {
            node: Arc::clone(&first),
            lying,
        }));
        // A session in no keyspace: the statement runs in the one it was prepared in.
        let mut elsewhere = Session::default();
        let executed = runtime.block_on(second.execute(&mut elsewhere, &insert.id, &parameters));
        if lying {
            // A text that does not hash to the id is not taken for the statement.
            let error = executed.unwrap_err();
            assert!(
                matches!(error.code, ErrorCode::Unprepared { .. }),
                "{error}"
            );
            assert!(ints(&ok(&second, &mut elsewhere, "SELECT k FROM ks.t"))
                .0
                .is_empty());
        } else {
            executed.unwrap();
            let (values, _) = ints(&ok(
                &second,
                &mut elsewhere,
                "SELECT v FROM ks.t WHERE k = 5",
            ));
            assert_eq!(values, vec![6]);
        }
    }
}

/// Answers lookups as `node` would once `open` turns true, counting them.
struct GatedNode {
    node: Arc<Coordinator>,
    open: tokio::sync::watch::Receiver<bool>,
    lookups: std::sync::atomic::AtomicUsize,
}

impl crate::prepared::PreparedElsewhere for GatedNode {
    fn find<'a>(
        &'a self,
        id: &'a [u8],
    ) -> futures::future::BoxFuture<'a, Option<crate::prepared::StatementText>> {
        Box::pin(async move {
            self.lookups
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = self.open.clone().wait_for(|open| *open).await;
            self.node.prepared_statement_text(id)
        })
    }
}

#[test]
fn requests_missing_the_same_statement_at_once_share_one_lookup_on_other_nodes() {
    let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::new());
    let (first, mut session) = with_table_t(&engine);
    ok(&first, &mut session, "INSERT INTO t (k, v) VALUES (1, 10)");
    let ResultBody::Prepared(select) = first
        .prepare(&session, "SELECT v FROM t WHERE k = ?")
        .unwrap()
    else {
        panic!("not prepared")
    };
    let second = coordinator(Arc::clone(&engine));
    let (open, opened) = tokio::sync::watch::channel(false);
    let other = Arc::new(GatedNode {
        node: Arc::clone(&first),
        open: opened,
        lookups: std::sync::atomic::AtomicUsize::new(0),
    });
    second
        .set_prepared_elsewhere(Arc::clone(&other) as Arc<dyn crate::prepared::PreparedElsewhere>);
    let parameters = QueryParameters {
        values: vec![BoundValue::Bytes(1i32.to_be_bytes().to_vec())],
        ..QueryParameters::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Five connections execute it at once; the peer answers once all of them have had the
    // chance to ask (the runtime has one thread: each yield lets every request go on).
    let executions = (0..5).map(|_| {
        let (second, parameters, id) = (&second, &parameters, select.id.clone());
        async move {
            let mut elsewhere = Session::default();
            second.execute(&mut elsewhere, &id, parameters).await
        }
    });
    let (results, ()) = runtime.block_on(async {
        futures::join!(futures::future::join_all(executions), async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            let _ = open.send(true);
        })
    });
    for result in results {
        assert_eq!(ints(&result.unwrap()).0, vec![10]);
    }
    assert_eq!(other.lookups.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn a_dropped_and_re_added_column_does_not_resurrect_old_values() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int, w int)",
    );
    ok(
        &c,
        &mut session,
        "INSERT INTO t (k, v, w) VALUES (1, 10, 20)",
    );
    ok(&c, &mut session, "ALTER TABLE t DROP v");
    ok(&c, &mut session, "ALTER TABLE t ADD v int");
    let (values, _) = ints(&ok(&c, &mut session, "SELECT v FROM t WHERE k = 1"));
    assert!(
        values.is_empty(),
        "the old value of v must stay dropped, got {values:?}"
    );
}

fn execute(
    coordinator: &Arc<Coordinator>,
    session: &mut Session,
    id: &[u8],
    values: Vec<BoundValue>,
) -> ResultBody {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let parameters = QueryParameters {
        values,
        ..QueryParameters::default()
    };
    runtime
        .block_on(coordinator.execute(session, id, &parameters))
        .unwrap()
}

#[test]
fn a_prepared_statement_reuses_its_plan_until_the_schema_changes() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int)",
    );
    ok(&c, &mut session, "INSERT INTO t (k, v) VALUES (1, 10)");
    let ResultBody::Prepared(prepared) =
        c.prepare(&session, "SELECT * FROM t WHERE k = ?").unwrap()
    else {
        panic!("not prepared")
    };
    let key = || vec![BoundValue::Bytes(1i32.to_be_bytes().to_vec())];
    let planned = || c.prepared.get(&prepared.id).unwrap().cached_plan_identity();
    let at_prepare = planned().expect("planned at PREPARE");
    for _ in 0..3 {
        assert_eq!(
            ints(&execute(&c, &mut session, &prepared.id, key())).0,
            vec![1]
        );
        assert_eq!(planned(), Some(at_prepare), "EXECUTE reuses the plan");
    }
    // A schema change makes the next EXECUTE plan again, against the new table.
    ok(&c, &mut session, "ALTER TABLE t ADD w int");
    let ResultBody::Rows(rows) = execute(&c, &mut session, &prepared.id, key()) else {
        panic!("not rows")
    };
    assert_eq!(rows.columns.len(), 3, "the new column is selected");
    assert_ne!(planned(), Some(at_prepare));
}

#[test]
fn a_statement_that_cannot_run_is_refused_at_prepare() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int)",
    );
    let error = c
        .prepare(&session, "SELECT * FROM t WHERE v = ?")
        .unwrap_err();
    assert!(
        error.message.contains("ALLOW FILTERING"),
        "{}",
        error.message
    );
    let error = c
        .prepare(&session, "INSERT INTO t (k, v) VALUES (?, 'text')")
        .unwrap_err();
    assert_eq!(error.code, ErrorCode::Invalid);
}

/// The first column of every row, as text.
fn texts(result: &ResultBody) -> Vec<String> {
    let ResultBody::Rows(rows) = result else {
        panic!("not rows: {result:?}")
    };
    let mut values = Vec::new();
    let mut position = 0;
    let content = &rows.rows.content;
    for _ in 0..rows.rows.row_count {
        for column in 0..rows.columns.len() {
            let length = i32::from_be_bytes(content[position..position + 4].try_into().unwrap());
            position += 4;
            if length >= 0 {
                if column == 0 {
                    let bytes = &content[position..position + length as usize];
                    values.push(String::from_utf8(bytes.to_vec()).unwrap());
                }
                position += length as usize;
            }
        }
    }
    values
}

#[test]
fn a_traced_statement_records_its_steps_in_system_traces() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v text)",
    );
    ok(&c, &mut session, "INSERT INTO t (k, v) VALUES (1, 'one')");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let trace = shoal_trace::Trace::start();
    let parameters = QueryParameters::default();
    let select = "SELECT v FROM t WHERE k = 1";
    runtime
        .block_on(
            trace
                .clone()
                .scope(c.query(&mut session, select, &parameters)),
        )
        .unwrap();
    let request = crate::traces::TracedRequest::new("127.0.0.9".parse().unwrap(), "QUERY");
    runtime
        .block_on(c.write_trace(&trace, trace.elapsed_micros(), &request))
        .unwrap();
    let id = uuid::Uuid::from_bytes(trace.id());
    let events = ok(
        &c,
        &mut session,
        &format!("SELECT activity FROM system_traces.events WHERE session_id = {id}"),
    );
    assert_eq!(
        texts(&events),
        [
            format!("Parsing {select}"),
            "Preparing statement".into(),
            "Executing point_read on ks.t at consistency ONE".into(),
            "Read 1 live rows".into(),
        ]
    );
    let sessions = ok(
        &c,
        &mut session,
        &format!("SELECT command, request FROM system_traces.sessions WHERE session_id = {id}"),
    );
    assert_eq!(texts(&sessions), ["QUERY"]);
    // Untraced, the same statement records nothing anywhere.
    ok(&c, &mut session, select);
    assert!(shoal_trace::current().is_none());
}

/// Every byte of a result's rows, as text (for DESCRIBE's statements).
fn all_text(result: &ResultBody) -> String {
    let ResultBody::Rows(rows) = result else {
        panic!("not rows: {result:?}")
    };
    String::from_utf8_lossy(&rows.rows.content).into_owned()
}

#[test]
fn an_ordered_table_keeps_partitions_in_key_order_through_scans_pages_and_token_ranges() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int) WITH partitioner = 'ordered'",
    );
    // Inserted out of order, negative keys included (they sort before positive ones).
    let keys: Vec<i32> = (-6..7).map(|i| (i * 7919) % 13 * 100_003).collect();
    for k in &keys {
        ok(
            &c,
            &mut session,
            &format!("INSERT INTO t (k, v) VALUES ({k}, 0)"),
        );
    }
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ints(&ok(&c, &mut session, "SELECT k FROM t")).0, sorted);

    let mut parameters = QueryParameters {
        page_size: Some(3),
        ..QueryParameters::default()
    };
    let mut paged = Vec::new();
    loop {
        let (page, state) = ints(&run(&c, &mut session, "SELECT k FROM t", &parameters).unwrap());
        paged.extend(page);
        match state {
            Some(state) => parameters.paging_state = Some(state),
            None => break,
        }
    }
    assert_eq!(paged, sorted, "pages follow key order");

    let from_zero: Vec<i32> = sorted.iter().copied().filter(|&k| k >= 0).take(3).collect();
    assert_eq!(
        ints(&ok(
            &c,
            &mut session,
            "SELECT k FROM t WHERE token(k) >= token(0) LIMIT 3"
        ))
        .0,
        from_zero,
        "a token range of an ordered table is a key range"
    );
    let described = all_text(&ok(&c, &mut session, "DESCRIBE TABLE t"));
    assert!(
        described.contains("partitioner = 'ordered'"),
        "DESCRIBE shows the partitioner: {described}"
    );
}

#[test]
fn a_partitioner_is_chosen_at_creation_and_never_changed() {
    let c = coordinator(Arc::new(MemoryEngine::new()));
    let mut session = setup(&c);
    let unknown = run(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY) WITH partitioner = 'random'",
        &QueryParameters::default(),
    )
    .unwrap_err();
    assert_eq!(unknown.code, ErrorCode::Config);
    assert!(unknown.message.contains("'ordered'"), "{}", unknown.message);
    ok(
        &c,
        &mut session,
        "CREATE TABLE t (k int PRIMARY KEY, v int)",
    );
    let altered = run(
        &c,
        &mut session,
        "ALTER TABLE t WITH partitioner = 'ordered'",
        &QueryParameters::default(),
    )
    .unwrap_err();
    assert_eq!(altered.code, ErrorCode::Invalid);
    assert!(
        altered.message.contains("partitioner"),
        "{}",
        altered.message
    );
    let described = all_text(&ok(&c, &mut session, "DESCRIBE TABLE t"));
    assert!(described.contains("CREATE TABLE"), "{described}");
    assert!(
        !described.contains("partitioner"),
        "a hashed table's DESCRIBE is Cassandra's: {described}"
    );
}
