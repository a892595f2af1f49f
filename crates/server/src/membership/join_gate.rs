//! Where a node started with `join_ring = false` waits before it enters the cluster, as
//! Cassandra's `-Dcassandra.join_ring=false`: its store is open and its peer handler
//! answers, but it neither takes part in the cluster nor serves clients until `shoal admin
//! join` ([`Operation::Join`]) opens the gate. Until the node has started, the gate also
//! answers every other operation, saying why there is nothing to operate on yet.

use crate::internode::Reply;
use crate::operations::Operation;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// The gate: whether the node waits at it, and the request to join once it came.
#[derive(Default)]
pub struct JoinGate {
    waiting: AtomicBool,
    requested: Notify,
}

impl JoinGate {
    /// Waits until `shoal admin join` asks this node to enter the cluster.
    pub async fn wait(&self) {
        self.waiting.store(true, Ordering::Release);
        tracing::info!(
            "join_ring = false: this node enters the cluster once `shoal admin join` asks it to"
        );
        self.requested.notified().await;
        self.waiting.store(false, Ordering::Release);
        tracing::info!("asked to join: entering the cluster");
    }

    /// The answer to `operation`, asked before the node has started: `shoal admin join`
    /// opens the gate; anything else is refused, saying why.
    pub fn answer(&self, operation: &Operation) -> Reply {
        let waiting = self.waiting.load(Ordering::Acquire);
        match operation {
            Operation::Join if waiting => {
                self.requested.notify_one();
                Reply::Operated(serde_json::json!({ "joining": true }).to_string())
            }
            Operation::Join => Reply::Error("this node is entering the cluster already".into()),
            _ if waiting => Reply::Error(
                "this node waits for `shoal admin join` before it enters the cluster \
                 (join_ring = false)"
                    .into(),
            ),
            _ => Reply::Error("this node is still starting".into()),
        }
    }
}
