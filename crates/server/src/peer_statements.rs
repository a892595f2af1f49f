//! Prepared statements found on the other nodes: a client executes here a statement it
//! prepared only on other nodes — this node joined after the client prepared it, or
//! restarted and so forgot it. Rather than answer UNPREPARED (and have every connection
//! prepare it again and resend, two more round trips just as the node starts taking
//! requests), the coordinator asks [`PeerStatements`] for its text and keyspace; they
//! hash to the statement's id, so the answer is checked before the statement is prepared
//! here (`shoal_coordinator::prepared`).
//!
//! A few live peers are asked at once and the first that knows the statement answers; a
//! client whose statement no peer knows is told UNPREPARED, as before, within
//! [`LOOKUP_TIMEOUT`]. Each lookup starts one peer further along the members than the
//! last, so that a burst of them (a new node's first requests) is spread over the
//! cluster; the requests that miss the same statement at once share one lookup
//! (`shoal_coordinator::prepared`).

use crate::internode::{Message, Peers, Reply};
use futures::stream::{FuturesUnordered, StreamExt};
use shoal_cluster::ClusterMetadata;
use shoal_coordinator::prepared::{PreparedElsewhere, StatementText};
use shoal_model::HostId;
use shoal_replication::Liveness;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Peers asked at once for a statement this node does not know.
pub const PEERS_ASKED: usize = 2;
/// How long a lookup waits for its answers before the client is told UNPREPARED.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(200);

/// Looks prepared statements up on the cluster's other live members.
pub struct PeerStatements {
    pub me: HostId,
    pub metadata: Arc<ClusterMetadata>,
    pub peers: Arc<Peers>,
    pub liveness: Arc<dyn Liveness>,
    /// Where the next lookup starts among the live peers.
    pub next_asked: AtomicUsize,
}

impl PreparedElsewhere for PeerStatements {
    fn find<'a>(&'a self, id: &'a [u8]) -> futures::future::BoxFuture<'a, Option<StatementText>> {
        Box::pin(async move {
            let state = self.metadata.state();
            let live: Vec<_> = state
                .members
                .values()
                .filter(|member| {
                    member.host_id != self.me && self.liveness.is_alive(&member.host_id)
                })
                .map(|member| member.internode_address)
                .collect();
            let first = self.next_asked.fetch_add(1, Ordering::Relaxed);
            let asked: Vec<_> = live
                .iter()
                .cycle()
                .skip(first % live.len().max(1))
                .take(PEERS_ASKED.min(live.len()))
                .copied()
                .collect();
            let message = Message::PreparedStatement { id: id.to_vec() };
            let mut answers: FuturesUnordered<_> = asked
                .into_iter()
                .map(|peer| self.peers.call(peer, &message, LOOKUP_TIMEOUT))
                .collect();
            while let Some(answer) = answers.next().await {
                if let Ok(Reply::PreparedStatement(Some(found))) = answer {
                    return Some(found);
                }
            }
            None
        })
    }
}
