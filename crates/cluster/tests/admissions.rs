//! Admissions on the metadata leader, with every node in this process: nodes joining at
//! the same moment must never make the Raft group grow past [`MAX_VOTERS`] voters.
//!
//! The nodes talk through an in-process router instead of sockets, so joins reach the
//! leader within microseconds of each other. The leader admits them one at a time: each
//! decides whether there is room for one more voter knowing every earlier admission, and
//! none is turned away because another membership change is under way (openraft refuses
//! overlapping changes; a refused join would wait and ask again).

mod common;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_cluster::{
    ClusterMetadata, ClusterRequest, ClusterResponse, ClusterTransport, MAX_VOTERS,
};
use shoal_model::HostId;
use shoal_storage::MemoryEngine;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Delivers each request straight to the addressed node's [`ClusterMetadata::handle`].
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<SocketAddr, Arc<ClusterMetadata>>>,
    /// Join requests delivered, counting every retry.
    join_requests: AtomicUsize,
}

impl ClusterTransport for Router {
    fn call(
        &self,
        to: SocketAddr,
        request: ClusterRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ClusterResponse, String>> {
        if matches!(request, ClusterRequest::Join { .. }) {
            self.join_requests.fetch_add(1, Ordering::Relaxed);
        }
        let node = self.nodes.lock().get(&to).cloned();
        Box::pin(async move {
            let node = node.ok_or_else(|| format!("{to} is not listening"))?;
            tokio::time::timeout(timeout, node.handle(request))
                .await
                .map_err(|_| format!("{to} timed out"))
        })
    }
}

async fn start_node(router: &Arc<Router>, n: u8) -> Arc<ClusterMetadata> {
    let transport: Arc<dyn ClusterTransport> = Arc::clone(router) as _;
    let node = ClusterMetadata::open(
        Arc::new(MemoryEngine::new()),
        common::member(n, HostId::random()),
        transport,
    )
    .await
    .expect("open metadata");
    router
        .nodes
        .lock()
        .insert(node.me().internode_address, Arc::clone(&node));
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_at_the_same_moment_never_make_more_than_three_voters() {
    let router = Arc::new(Router::default());
    let seed = start_node(&router, 1).await;
    let seeds = [seed.me().internode_address];
    seed.enter(&seeds, None).await.expect("bootstrap");

    let mut newcomers = Vec::new();
    for n in 2..=6 {
        newcomers.push(start_node(&router, n).await);
    }
    let joins: Vec<_> = newcomers
        .iter()
        .map(|node| {
            let node = Arc::clone(node);
            tokio::spawn(async move { node.enter(&seeds, None).await })
        })
        .collect();
    for join in joins {
        tokio::time::timeout(Duration::from_secs(60), join)
            .await
            .expect("a join finishes within a minute")
            .expect("join task")
            .expect("every node is admitted");
    }

    assert_eq!(
        router.join_requests.load(Ordering::Relaxed),
        newcomers.len(),
        "every node is admitted at its first request, none refused and retried"
    );
    let voters = seed.voters();
    assert_eq!(voters.len(), MAX_VOTERS, "voters: {voters:?}");
    assert!(voters.contains(&seed.me().node_id()));
    let state = seed.state();
    assert_eq!(state.members.len(), 6, "every node is a member");

    for node in newcomers.iter().chain([&seed]) {
        node.shutdown().await;
    }
}
