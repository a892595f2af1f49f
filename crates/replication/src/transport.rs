//! How the replication layer reaches other nodes and learns which are up. The server
//! implements both over its internode connections and failure detector; tests implement
//! them in memory (`tests::sim`).

use crate::messages::{ReplicaRequest, ReplicaResponse};
use futures::future::BoxFuture;
use shoal_model::HostId;
use std::net::SocketAddr;
use std::time::Duration;

/// Sends replica requests to peers.
pub trait ReplicaTransport: Send + Sync + 'static {
    /// Sends `request`, routed by the tablet map of `topology_version`, to the node at
    /// `to` and waits for its answer, at most `timeout`. The node answers it with
    /// [`crate::LocalReplica::serve_routed`].
    fn send(
        &self,
        to: SocketAddr,
        request: ReplicaRequest,
        topology_version: u64,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>>;
}

/// Which peers the failure detector believes are up.
pub trait Liveness: Send + Sync + 'static {
    fn is_alive(&self, host_id: &HostId) -> bool;
    /// How long the peer has been down (`None` while it is up).
    fn down_for(&self, host_id: &HostId) -> Option<Duration>;
    /// The schema version the peer reported last (for `system.peers`).
    fn schema_version(&self, host_id: &HostId) -> Option<[u8; 16]>;
}
