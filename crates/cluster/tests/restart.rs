//! A node's metadata survives a restart: everything the node applied before it stopped is
//! there again when it opens the same storage, whether it was applied before the last
//! snapshot (the log purged behind it) or after it (only in the log).
//!
//! The state machine is persisted with each snapshot, not after every apply
//! (`shoal_cluster::store`); a restart applies the committed entries after that snapshot
//! again from the log. These tests take a single-node cluster through more metadata
//! changes than a snapshot is built after, stop it, and open it again.

mod common;

use futures::future::BoxFuture;
use shoal_cluster::{
    ClusterMetadata, ClusterRequest, ClusterResponse, ClusterState, ClusterTransport, Command,
    CommandOutcome, VersionedRecord,
};
use shoal_model::HostId;
use shoal_storage::{Engine, MemoryEngine};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A single node never calls another.
struct Alone;

impl ClusterTransport for Alone {
    fn call(
        &self,
        to: SocketAddr,
        _request: ClusterRequest,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<ClusterResponse, String>> {
        Box::pin(async move { Err(format!("{to} is not listening")) })
    }
}

async fn open(engine: &Arc<MemoryEngine>, host_id: HostId) -> Arc<ClusterMetadata> {
    let engine: Arc<dyn Engine> = Arc::clone(engine) as _;
    ClusterMetadata::open(engine, common::member(1, host_id), Arc::new(Alone))
        .await
        .expect("open metadata")
}

/// Changes the roles record `changes` times, each change based on the one before; answers
/// the last record.
async fn change_roles(node: &ClusterMetadata, changes: u32) -> VersionedRecord {
    let mut base_version = node.state().roles.as_ref().map(|roles| roles.version);
    let mut last = None;
    for change in 0..changes {
        let mut version = [0u8; 16];
        version[..4].copy_from_slice(&change.to_be_bytes());
        version[4] = 0xaa;
        let roles = VersionedRecord {
            version,
            bytes: format!("roles after change {change}").into_bytes(),
        };
        let outcome = node
            .propose(Command::ChangeRoles {
                base_version,
                roles: roles.clone(),
            })
            .await
            .expect("a proposal to a single-node cluster commits");
        assert_eq!(outcome, CommandOutcome::Applied, "change {change}");
        base_version = Some(version);
        last = Some(roles);
    }
    last.expect("at least one change")
}

/// Opens a node on `engine`, bootstraps it, makes `changes` metadata changes and stops it;
/// answers the state it had applied.
async fn run_and_stop(engine: &Arc<MemoryEngine>, host_id: HostId, changes: u32) -> ClusterState {
    let node = open(engine, host_id).await;
    let me = node.me().internode_address;
    node.enter(&[me], None).await.expect("bootstrap");
    let last = change_roles(&node, changes).await;
    let state = node.state();
    assert_eq!(state.roles.as_ref(), Some(&last));
    node.shutdown().await;
    (*state).clone()
}

/// Runs a node through `changes` metadata changes, stops it and opens it again on the same
/// storage; checks that it comes back with the state it had applied, and answers it.
async fn restarted_after(changes: u32) -> Arc<ClusterMetadata> {
    let engine = Arc::new(MemoryEngine::new());
    let host_id = HostId::random();
    let before = run_and_stop(&engine, host_id, changes).await;

    let restarted = open(&engine, host_id).await;
    assert_eq!(*restarted.state(), before);
    restarted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_finds_every_change_it_applied_since_its_last_snapshot() {
    // Fewer changes than a snapshot is built after: the state machine was never persisted
    // since the bootstrap, and all of it comes back from the log.
    let restarted = restarted_after(20).await;
    restarted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_finds_every_change_across_snapshots_and_purged_log() {
    // More than two snapshots' worth of changes (one every 500 entries): the log behind
    // the last snapshot is purged, and what follows it is only in the log.
    let restarted = restarted_after(1_150).await;
    // And it goes on from there.
    let last = change_roles(&restarted, 3).await;
    assert_eq!(restarted.state().roles.as_ref(), Some(&last));
    restarted.shutdown().await;
}
