#![allow(clippy::unwrap_used)]
//! A real three-node cluster (`shoal server` processes on 127.0.0.1-3) through the Rust
//! `scylla` driver: every node discovered with its tokens, token-aware prepared
//! statements, writes at ALL read at ONE through each node, and after `kill -9` of one
//! node QUORUM keeps working while ALL is `Unavailable`.

// The server's integration-test helpers (free ports among them), shared rather than copied.
#[path = "../../server/tests/common/mod.rs"]
mod common;

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
use scylla::statement::Consistency;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster's processes; dropping it kills them (also when a test fails).
struct Processes {
    children: Vec<Child>,
    _directory: tempfile::TempDir,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn address(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// A port free on 127.0.0.1-3 (see [`common::free_port_on`]).
fn free_port() -> u16 {
    common::free_port_on(&[address(1), address(2), address(3)])
}

fn wait_for(address: SocketAddr, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the node for {address} exited"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the node for {address} did not start");
}

fn start_cluster() -> (Processes, u16) {
    let directory = tempfile::tempdir().unwrap();
    let (cql_port, internode_port) = (free_port(), free_port());
    let mut processes = Processes {
        children: Vec::new(),
        _directory: directory,
    };
    for index in 1..=3u8 {
        let data = processes._directory.path().join(format!("node{index}"));
        let log =
            std::fs::File::create(processes._directory.path().join(format!("node{index}.log")))
                .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["server", "--data-dir"])
            .arg(&data)
            .args(["--listen-address", &address(index).to_string()])
            .args(["--cql-port", &cql_port.to_string()])
            .args(["--internode-port", &internode_port.to_string()])
            .args(["--seeds", "127.0.0.1"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(SocketAddr::new(address(index), cql_port), &mut child);
        processes.children.push(child);
    }
    wait_until_every_node_sees_three_up(internode_port);
    (processes, cql_port)
}

/// Waits until each node's own view (`shoal admin status` asked of it) has all three
/// nodes up: a node listening for CQL may not have heard from its peers yet, and a write
/// at ALL it coordinated then would be refused as Unavailable.
fn wait_until_every_node_sees_three_up(internode_port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for index in 1..=3u8 {
        loop {
            let status = Command::new(env!("CARGO_BIN_EXE_shoal"))
                .args(["admin", "status", "--host", &address(index).to_string()])
                .args(["--port", &internode_port.to_string()])
                .output()
                .unwrap();
            let up = String::from_utf8_lossy(&status.stdout)
                .lines()
                .filter(|line| line.starts_with("UN "))
                .count();
            if status.status.success() && up == 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {index} does not see three nodes up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

async fn count_on(
    session: &Session,
    node: SocketAddr,
    query: &str,
    consistency: Consistency,
) -> usize {
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(SingleTargetLoadBalancingPolicy::new(
            NodeIdentifier::NodeAddress(node),
            None,
        ))
        .consistency(consistency)
        .build();
    let mut statement = scylla::statement::unprepared::Statement::new(query);
    statement.set_execution_profile_handle(Some(profile.into_handle()));
    session
        .query_unpaged(statement, &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_at_every_consistency_level_through_the_rust_driver() {
    let (mut processes, port) = start_cluster();
    let session = SessionBuilder::new()
        .known_node_addr(SocketAddr::new(address(1), port))
        .build()
        .await
        .unwrap();
    let nodes = session.get_cluster_state().get_nodes_info().to_vec();
    assert_eq!(nodes.len(), 3, "every node is discovered");

    session
        .query_unpaged("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}", &[])
        .await
        .unwrap();
    session
        .query_unpaged("CREATE TABLE ks.t (k int PRIMARY KEY, v text)", &[])
        .await
        .unwrap();
    session.await_schema_agreement().await.unwrap();
    session.refresh_metadata().await.unwrap();
    let mut insert = session
        .prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    assert!(insert.is_token_aware());
    insert.set_consistency(Consistency::All);
    for k in 0..50 {
        session
            .execute_unpaged(&insert, (k, format!("v{k}")))
            .await
            .unwrap();
    }
    for index in 1..=3 {
        let node = SocketAddr::new(address(index), port);
        assert_eq!(
            count_on(
                &session,
                node,
                "SELECT * FROM ks.t WHERE k = 7",
                Consistency::One
            )
            .await,
            1
        );
        assert_eq!(
            count_on(&session, node, "SELECT * FROM ks.t", Consistency::One).await,
            50
        );
    }

    // kill -9 the third node: QUORUM works, ALL is refused as Unavailable.
    let victim = &mut processes.children[2];
    victim.kill().unwrap();
    victim.wait().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut quorum = insert.clone();
    quorum.set_consistency(Consistency::Quorum);
    for k in 50..80 {
        session
            .execute_unpaged(&quorum, (k, format!("v{k}")))
            .await
            .unwrap();
    }
    let survivor = SocketAddr::new(address(1), port);
    assert_eq!(
        count_on(
            &session,
            survivor,
            "SELECT * FROM ks.t",
            Consistency::Quorum
        )
        .await,
        80
    );
    let error = session
        .execute_unpaged(&insert, (1000, "x"))
        .await
        .unwrap_err();
    assert!(format!("{error:?}").contains("Unavailable"), "{error:?}");
}
