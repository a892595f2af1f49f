//! Where a node started with `join_ring = false` waits before it enters the cluster, as
//! Cassandra's `-Dcassandra.join_ring=false`: its store is open and its peer handler
//! answers, but it neither takes part in the cluster nor serves clients until `shoal admin
//! join` ([`Operation::Join`]) opens the gate. Until the node has started, the gate also
//! answers every other operation, saying why there is nothing to operate on yet.

use crate::internode::Reply;
use crate::operations::Operation;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// The gate's answer to an operation asked after the gate opened but before the node has
/// started: an operator's tool waiting for the join (`shoal admin join --wait`) asks again.
pub const STILL_STARTING: &str = "this node is still starting";

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
                // From now on the node is starting: what is asked next hears so.
                self.waiting.store(false, Ordering::Release);
                self.requested.notify_one();
                Reply::Operated(serde_json::json!({ "joining": true }).to_string())
            }
            Operation::Join => Reply::Error("this node is entering the cluster already".into()),
            _ if waiting => Reply::Error(
                "this node waits for `shoal admin join` before it enters the cluster \
                 (join_ring = false)"
                    .into(),
            ),
            _ => Reply::Error(STILL_STARTING.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(reply: Reply) -> String {
        match reply {
            Reply::Error(error) => error,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn once_told_to_join_the_gate_opens_and_what_is_asked_next_hears_it_is_starting() {
        let gate = std::sync::Arc::new(JoinGate::default());
        let waiting = tokio::spawn({
            let gate = std::sync::Arc::clone(&gate);
            async move { gate.wait().await }
        });
        while !gate.waiting.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        assert!(error_of(gate.answer(&Operation::Info)).contains("waits for `shoal admin join`"));
        assert!(matches!(gate.answer(&Operation::Join), Reply::Operated(_)));
        // Asked right after, before the waiting task has even run again: the node is
        // starting (an operator's `join --wait` asks again), and a second join is refused.
        assert_eq!(
            error_of(gate.answer(&Operation::AwaitJoined)),
            STILL_STARTING
        );
        assert!(error_of(gate.answer(&Operation::Join)).contains("entering the cluster already"));
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("the gate opened")
            .expect("the waiting task");
    }
}
