//! Three real nodes in one process: epoch logs in files, messages over loopback TCP.

use bytes::Bytes;
use shoal_consensus::runtime::{self, tcp, GroupSpec, NodeOptions, StateMachine};
use shoal_consensus::{Config, GroupId, LogIndex, NodeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Applied = Arc<Mutex<HashMap<GroupId, Vec<(LogIndex, Bytes)>>>>;

struct Recorder(Applied);

impl StateMachine for Recorder {
    fn apply(&mut self, group: GroupId, index: LogIndex, payload: &Bytes) {
        let mut applied = self.0.lock().expect("not poisoned");
        applied
            .entry(group)
            .or_default()
            .push((index, payload.clone()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_commit_every_proposal_and_apply_the_same_log() {
    let directory = tempfile::tempdir().expect("a temporary directory");
    let ids: Vec<NodeId> = (1..=3).map(|n| shoal_model::HostId([n; 16])).collect();
    let mut listeners = Vec::new();
    let mut addresses = HashMap::new();
    for id in &ids {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        addresses.insert(*id, listener.local_addr().expect("an address"));
        listeners.push(listener);
    }
    let groups: Vec<GroupId> = (0..6).map(GroupId).collect();
    let options = NodeOptions {
        raft: Config {
            election_timeout_ms: 300,
            heartbeat_interval_ms: 50,
            ..Config::default()
        },
        ..NodeOptions::default()
    };
    let mut handles = Vec::new();
    let mut applied = Vec::new();
    for (n, (id, listener)) in ids.iter().zip(listeners).enumerate() {
        let transport = tcp::TcpTransport::start(
            *id,
            "127.0.0.1".parse().expect("an address"),
            addresses.clone(),
        );
        let record: Applied = Arc::default();
        let handle = runtime::start(
            *id,
            NodeOptions {
                seed: n as u64,
                ..options.clone()
            },
            directory.path().join(format!("node{n}")),
            groups
                .iter()
                .map(|group| GroupSpec {
                    group: *group,
                    members: ids.clone(),
                })
                .collect(),
            Arc::new(transport),
            Box::new(Recorder(Arc::clone(&record))),
        )
        .expect("starts");
        tokio::spawn(tcp::serve(listener, handle.clone()));
        handles.push(handle);
        applied.push(record);
    }

    // Every proposal goes to its group's leader (found by asking), 100 per group.
    let mut committed = 0;
    for round in 0..100u32 {
        for group in &groups {
            let payload = Bytes::from(format!("{}-{round}", group.0));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                assert!(tokio::time::Instant::now() < deadline, "no leader took it");
                let mut leader = None;
                for handle in &handles {
                    if let Some(known) = handle.leader(*group).await {
                        leader = handles.iter().find(|h| h.id() == known).cloned();
                        break;
                    }
                }
                let Some(leader) = leader else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if leader.propose(*group, payload.clone()).await.is_ok() {
                    committed += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_eq!(committed, 600);

    // Every node applies the same entries in the same order (followers learn the last
    // commits with the next heartbeat).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let logs: Vec<HashMap<GroupId, Vec<(LogIndex, Bytes)>>> = applied
            .iter()
            .map(|record| record.lock().expect("not poisoned").clone())
            .collect();
        let complete = logs.iter().all(|log| {
            groups
                .iter()
                .all(|group| log.get(group).map_or(0, Vec::len) == 100)
        });
        if complete {
            assert!(logs.iter().all(|log| *log == logs[0]));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "followers did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
