//! Real nodes in one process: epoch logs in files, messages over loopback TCP.

use bytes::Bytes;
use shoal_consensus::runtime::{self, tcp, GroupSpec, NodeOptions, RaftHandle, StateMachine};
use shoal_consensus::{Config, GroupId, LogIndex, NodeId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// What one node applied, per group, in order.
type Applied = Arc<Mutex<HashMap<GroupId, Vec<(LogIndex, Bytes)>>>>;

/// Entries applied again after a restart: `(group, index)`.
type Replayed = Arc<Mutex<Vec<(GroupId, LogIndex)>>>;

struct Recorder {
    applied: Applied,
    /// An entry at or before the last one recorded is applied again (idempotently, as
    /// Shoal's cells are): counted here, not recorded twice.
    replayed: Replayed,
}

impl StateMachine for Recorder {
    fn apply(&mut self, group: GroupId, index: LogIndex, payload: &Bytes) -> runtime::Applied {
        let mut applied = self.applied.lock().expect("not poisoned");
        let log = applied.entry(group).or_default();
        if log.last().is_some_and(|(last, _)| *last >= index) {
            self.replayed
                .lock()
                .expect("not poisoned")
                .push((group, index));
            return runtime::Applied::Done;
        }
        log.push((index, payload.clone()));
        runtime::Applied::Done
    }
}

struct Node {
    handle: RaftHandle,
    serving: JoinHandle<()>,
    applied: Applied,
    replayed: Replayed,
}

/// Three nodes, each a member of every group.
struct Cluster {
    _directory: tempfile::TempDir,
    directories: Vec<PathBuf>,
    ids: Vec<NodeId>,
    addresses: HashMap<NodeId, SocketAddr>,
    groups: Vec<GroupId>,
    nodes: Vec<Node>,
    checkpoint_after_bytes: u64,
}

impl Cluster {
    async fn start(groups: u64) -> Cluster {
        Cluster::start_with(groups, NodeOptions::default().checkpoint_after_bytes).await
    }

    async fn start_with(groups: u64, checkpoint_after_bytes: u64) -> Cluster {
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
        let mut cluster = Cluster {
            directories: (0..3)
                .map(|n| directory.path().join(format!("node{n}")))
                .collect(),
            _directory: directory,
            ids,
            addresses,
            groups: (0..groups).map(GroupId).collect(),
            nodes: Vec::new(),
            checkpoint_after_bytes,
        };
        for (n, listener) in listeners.into_iter().enumerate() {
            let node = cluster.start_node(n, listener, Applied::default());
            cluster.nodes.push(node);
        }
        cluster
    }

    /// Starts node `n` with a state machine holding `applied` (what it applied durably
    /// before, if anything).
    fn start_node(&self, n: usize, listener: tokio::net::TcpListener, applied: Applied) -> Node {
        let id = self.ids[n];
        let transport = tcp::TcpTransport::start(
            id,
            "127.0.0.1".parse().expect("an address"),
            self.addresses.clone(),
        );
        let replayed: Replayed = Arc::default();
        let options = NodeOptions {
            raft: Config {
                election_timeout_ms: 300,
                heartbeat_interval_ms: 50,
                ..Config::default()
            },
            seed: n as u64,
            checkpoint_after_bytes: self.checkpoint_after_bytes,
            ..NodeOptions::default()
        };
        let handle = runtime::start(
            id,
            options,
            self.directories[n].clone(),
            self.groups
                .iter()
                .map(|group| GroupSpec {
                    group: *group,
                    members: self.ids.clone(),
                })
                .collect(),
            Arc::new(transport),
            Box::new(Recorder {
                applied: Arc::clone(&applied),
                replayed: Arc::clone(&replayed),
            }),
        )
        .expect("starts");
        let serving = tokio::spawn(tcp::serve(listener, handle.clone()));
        Node {
            handle,
            serving,
            applied,
            replayed,
        }
    }

    /// Stops node `n` and waits until its listener is closed: `abort` only asks the
    /// serving task to end, and a restart binding the address before the task is dropped
    /// would find it still in use.
    async fn stop(&mut self, n: usize) {
        self.nodes[n].handle.stop().await;
        self.nodes[n].serving.abort();
        let _ = (&mut self.nodes[n].serving).await;
    }

    /// Restarts node `n` with a fresh state machine, or (`keep_state`) with the one it
    /// had, as a state machine that wrote its data durably comes back.
    async fn restart(&mut self, n: usize, keep_state: bool) {
        let listener = tokio::net::TcpListener::bind(self.addresses[&self.ids[n]])
            .await
            .expect("binds the node's address again");
        let applied = if keep_state {
            Arc::clone(&self.nodes[n].applied)
        } else {
            Applied::default()
        };
        self.nodes[n] = self.start_node(n, listener, applied);
    }

    /// Proposes `rounds` entries to every group, each through its current leader.
    async fn propose(&self, label: &str, rounds: u32) {
        for round in 0..rounds {
            for group in &self.groups {
                let payload = Bytes::from(format!("{label}-{}-{round}", group.0));
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    assert!(tokio::time::Instant::now() < deadline, "no leader took it");
                    if let Some(leader) = self.leader(*group).await {
                        if leader.propose(*group, payload.clone()).await.is_ok() {
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn leader(&self, group: GroupId) -> Option<RaftHandle> {
        for node in &self.nodes {
            if let Some(known) = node.handle.leader(group).await {
                return self
                    .nodes
                    .iter()
                    .find(|node| node.handle.id() == known)
                    .map(|node| node.handle.clone());
            }
        }
        None
    }

    /// Waits until every node applied `entries` entries of every group, then checks they
    /// applied the same ones in the same order.
    async fn wait_applied_everywhere(&self, entries: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let logs: Vec<HashMap<GroupId, Vec<(LogIndex, Bytes)>>> = self
                .nodes
                .iter()
                .map(|node| node.applied.lock().expect("not poisoned").clone())
                .collect();
            let complete = logs.iter().all(|log| {
                self.groups
                    .iter()
                    .all(|group| log.get(group).map_or(0, Vec::len) >= entries)
            });
            if complete {
                for log in &logs {
                    assert_eq!(*log, logs[0], "two nodes applied different logs");
                }
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every node applied {entries} entries of every group: {:?}",
                logs.iter()
                    .map(|log| self
                        .groups
                        .iter()
                        .map(|group| log.get(group).map_or(0, Vec::len))
                        .collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_commit_every_proposal_and_apply_the_same_log() {
    let cluster = Cluster::start(6).await;
    cluster.propose("a", 100).await;
    cluster.wait_applied_everywhere(100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_restarts_from_its_log_and_catches_up() {
    let mut cluster = Cluster::start(4).await;
    cluster.propose("before", 30).await;
    cluster.wait_applied_everywhere(30).await;

    // Two of three keep committing while the third is down.
    cluster.stop(2).await;
    cluster.propose("while-down", 30).await;

    // Restarted, it reads its log back (its applies start again from the first entry)
    // and learns the rest from the leaders.
    cluster.restart(2, false).await;
    cluster.propose("after", 10).await;
    cluster.wait_applied_everywhere(70).await;
}

/// The epoch log segments in `directory`.
fn segments(directory: &std::path::Path) -> usize {
    std::fs::read_dir(directory)
        .expect("the log directory")
        .filter(|entry| {
            entry.as_ref().is_ok_and(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                name.starts_with("epochs-") && name.ends_with(".log")
            })
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_delete_old_segments_and_a_restart_starts_from_the_last_one() {
    // A checkpoint every 64 KiB of log: every few dozen epochs.
    let mut cluster = Cluster::start_with(4, 64 << 10).await;
    cluster.propose("before", 150).await;
    cluster.wait_applied_everywhere(150).await;
    // Every node wrote a checkpoint, each into a segment of its own, many times over:
    // what is left is the segment of its last one (and, while a checkpoint is being
    // written, the one before).
    for directory in &cluster.directories {
        let left = segments(directory);
        assert!(left <= 2, "{left} segments in {}", directory.display());
    }
    // Restarted with its state machine's data, a node starts from its last checkpoint:
    // it applies again only the few entries after it (not its whole log), then catches up.
    cluster.stop(2).await;
    cluster.propose("while-down", 20).await;
    cluster.restart(2, true).await;
    cluster.propose("after", 10).await;
    cluster.wait_applied_everywhere(180).await;
    let replayed = cluster.nodes[2]
        .replayed
        .lock()
        .expect("not poisoned")
        .len();
    assert!(
        replayed < 150,
        "{replayed} entries applied again after the restart: the checkpoint was not used"
    );
}

/// A listener that serves another protocol too, as a server's internode port does: a
/// connection opening with the consensus preface is handed to the node, any other is
/// answered and closed.
async fn serve_shared(listener: tokio::net::TcpListener, handle: RaftHandle) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut preface = [0u8; 4];
            if stream.read_exact(&mut preface).await.is_err() {
                return;
            }
            if preface == tcp::STREAM_PREFACE {
                tcp::serve_stream(stream, handle).await;
            } else {
                let _ = stream.write_all(b"other protocol").await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_added_at_run_time_commit_over_a_shared_listener_and_serve_linearizable_reads() {
    let directory = tempfile::tempdir().expect("a temporary directory");
    let ids: Vec<NodeId> = (1..=3).map(|n| shoal_model::HostId([n + 10; 16])).collect();
    // Where each node listens is learned after every node started (as members are).
    let book: Arc<Mutex<HashMap<NodeId, SocketAddr>>> = Arc::default();
    let mut nodes = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let address = listener.local_addr().expect("an address");
        let lookup = Arc::clone(&book);
        let transport = tcp::TcpTransport::resolving(
            *id,
            "127.0.0.1".parse().expect("an address"),
            Arc::new(move |peer| lookup.lock().expect("not poisoned").get(&peer).copied()),
        );
        let applied: Applied = Arc::default();
        let options = NodeOptions {
            raft: Config {
                election_timeout_ms: 300,
                heartbeat_interval_ms: 50,
                ..Config::default()
            },
            seed: n as u64 + 7,
            ..NodeOptions::default()
        };
        let handle = runtime::start(
            *id,
            options,
            directory.path().join(format!("node{n}")),
            Vec::new(),
            Arc::new(transport),
            Box::new(Recorder {
                applied: Arc::clone(&applied),
                replayed: Replayed::default(),
            }),
        )
        .expect("starts");
        tokio::spawn(serve_shared(listener, handle.clone()));
        book.lock().expect("not poisoned").insert(*id, address);
        nodes.push((handle, applied, address));
    }

    // The shared listener still answers its other protocol.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut other = tokio::net::TcpStream::connect(nodes[0].2)
            .await
            .expect("connects");
        other.write_all(&[0, 0, 0, 9]).await.expect("writes");
        let mut answer = Vec::new();
        other.read_to_end(&mut answer).await.expect("reads");
        assert_eq!(answer, b"other protocol");
    }

    let groups = [GroupId(10), GroupId(11)];
    for (handle, _, _) in &nodes {
        for group in groups {
            assert!(
                handle
                    .add_group(GroupSpec {
                        group,
                        members: ids.clone(),
                    })
                    .await
            );
        }
    }
    let leader_of = |group: GroupId| {
        let nodes = &nodes;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                for (handle, _, _) in nodes {
                    if handle.leader(group).await == Some(handle.id()) {
                        return handle.clone();
                    }
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no leader for {group:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    for group in groups {
        let leader = leader_of(group).await;
        for n in 0..20 {
            leader
                .propose(group, Bytes::from(format!("{}-{n}", group.0)))
                .await
                .expect("commits");
        }
        // A read index from the leader covers every committed entry, and the leader has
        // applied them when it answers; a follower refuses and names the leader.
        let index = leader
            .read_index(group)
            .await
            .expect("the leader serves reads");
        let applied_here = nodes
            .iter()
            .find(|(handle, _, _)| handle.id() == leader.id())
            .map(|(_, applied, _)| applied.lock().expect("not poisoned")[&group].len())
            .expect("the leader is a node");
        assert!(
            index.0 >= 20 && applied_here >= 20,
            "{index:?}, {applied_here}"
        );
        for (handle, _, _) in nodes
            .iter()
            .filter(|(handle, _, _)| handle.id() != leader.id())
        {
            let refused = handle
                .read_index(group)
                .await
                .expect_err("a follower refuses");
            assert!(refused.leader.is_none() || refused.leader == Some(leader.id()));
        }
    }

    // A node that drops a group stops applying it; the other two keep committing.
    let (dropping, dropped_applied, _) = &nodes[2];
    assert!(dropping.remove_group(GroupId(11)).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut committed = 0;
    while committed < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "two of three stopped committing"
        );
        let leader = leader_of(GroupId(11)).await;
        if leader
            .propose(GroupId(11), Bytes::from(format!("after-{committed}")))
            .await
            .is_ok()
        {
            committed += 1;
        }
    }
    assert!(dropping
        .propose(GroupId(11), Bytes::from("x"))
        .await
        .is_err());
    // The removal was queued before any of the later entries could reach the node.
    let applied_late: Vec<Bytes> = dropped_applied.lock().expect("not poisoned")[&GroupId(11)]
        .iter()
        .map(|(_, payload)| payload.clone())
        .filter(|payload| payload.starts_with(b"after-"))
        .collect();
    assert!(
        applied_late.is_empty(),
        "a dropped group kept applying: {applied_late:?}"
    );
    for (handle, _, _) in &nodes {
        handle.stop().await;
    }
}
