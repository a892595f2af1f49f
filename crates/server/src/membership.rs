//! The node's place in its cluster, at run time: the failure detector, the transports the
//! cluster metadata and the coordinator send through, the internode message handler, and
//! the background loops that keep things moving —
//!
//! - pinging every member ([`PING_INTERVAL`], [`failure_detection`]); a member not heard
//!   from for [`CONVICTION`] is down (STATUS_CHANGE DOWN), heard again is up (STATUS_CHANGE
//!   UP, and its hints are replayed) — except a member still joining, which clients hear
//!   of only once it is normal;
//! - following the cluster metadata: installing schema changes made elsewhere (and
//!   pushing SCHEMA_CHANGE events for them), announcing new members once they are normal
//!   (TOPOLOGY_CHANGE NEW_NODE, then STATUS_CHANGE UP).

use crate::events::EventBus;
use crate::internode::{Handler, MemberStatus, Message, Peers, Reply};
use futures::future::BoxFuture;
use parking_lot::RwLock;
use shoal_cluster::{ClusterMetadata, ClusterRequest, ClusterResponse, ClusterTransport};
use shoal_coordinator::system_tables::routed_table;
use shoal_coordinator::Coordinator;
use shoal_cql::response::Event;
use shoal_model::HostId;
use shoal_replication::{
    Liveness, ReplicaRequest, ReplicaResponse, ReplicaTransport, StorageProxy,
};
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub const PING_INTERVAL: Duration = Duration::from_millis(250);
/// How long a topology barrier may take on this node.
pub const BARRIER_BOUND: Duration = Duration::from_secs(15);
/// Silence after which a member is considered down.
pub const CONVICTION: Duration = Duration::from_millis(2000);

#[derive(Debug, Clone)]
struct PeerHealth {
    last_heard: Option<Instant>,
    /// What we announced last (STATUS_CHANGE is sent on changes only).
    announced_up: bool,
    schema_version: Option<[u8; 16]>,
    load_bytes: Option<u64>,
}

/// Which peers are alive, from pings.
pub struct FailureDetector {
    me: HostId,
    started: Instant,
    peers: RwLock<HashMap<HostId, PeerHealth>>,
    /// Counts the times a peer not up was heard from: whoever waits for a node to come
    /// up (the migration driver, for a joining node) wakes at once instead of at its next
    /// round.
    came_up: tokio::sync::watch::Sender<u64>,
}

impl FailureDetector {
    pub fn new(me: HostId) -> FailureDetector {
        FailureDetector {
            me,
            started: Instant::now(),
            peers: RwLock::new(HashMap::new()),
            came_up: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn heard_from(&self, host: HostId, schema_version: [u8; 16], load_bytes: u64) {
        let mut peers = self.peers.write();
        let health = peers.entry(host).or_insert(PeerHealth {
            last_heard: None,
            announced_up: false,
            schema_version: None,
            load_bytes: None,
        });
        let was_up = Self::up(health);
        health.last_heard = Some(Instant::now());
        health.schema_version = Some(schema_version);
        health.load_bytes = Some(load_bytes);
        drop(peers);
        if !was_up {
            self.came_up.send_modify(|times| *times += 1);
        }
    }

    /// Changes whenever a peer that was not up is heard from.
    pub fn subscribe_came_up(&self) -> tokio::sync::watch::Receiver<u64> {
        self.came_up.subscribe()
    }

    /// A peer pinged us: remember what it reported, but only our own pings decide
    /// whether it is up (up means *we* can reach it).
    pub fn noted(&self, host: HostId, schema_version: [u8; 16], load_bytes: u64) {
        let mut peers = self.peers.write();
        let health = peers.entry(host).or_insert(PeerHealth {
            last_heard: None,
            announced_up: false,
            schema_version: None,
            load_bytes: None,
        });
        health.schema_version = Some(schema_version);
        health.load_bytes = Some(load_bytes);
    }

    pub fn load_of(&self, host: &HostId) -> Option<u64> {
        self.peers.read().get(host).and_then(|h| h.load_bytes)
    }

    fn up(health: &PeerHealth) -> bool {
        health
            .last_heard
            .is_some_and(|heard| heard.elapsed() < CONVICTION)
    }

    /// Peers whose state changed since the last call: `(host, now up)`.
    fn transitions(&self) -> Vec<(HostId, bool)> {
        let mut peers = self.peers.write();
        let mut changed = Vec::new();
        for (host, health) in peers.iter_mut() {
            let up = Self::up(health);
            if up != health.announced_up {
                health.announced_up = up;
                changed.push((*host, up));
            }
        }
        changed
    }
}

impl Liveness for FailureDetector {
    fn is_alive(&self, host_id: &HostId) -> bool {
        *host_id == self.me || self.peers.read().get(host_id).is_some_and(Self::up)
    }

    fn down_for(&self, host_id: &HostId) -> Option<Duration> {
        if self.is_alive(host_id) {
            return None;
        }
        let last = self.peers.read().get(host_id).and_then(|h| h.last_heard);
        Some(last.unwrap_or(self.started).elapsed())
    }

    fn schema_version(&self, host_id: &HostId) -> Option<[u8; 16]> {
        self.peers
            .read()
            .get(host_id)
            .and_then(|h| h.schema_version)
    }
}

/// Sends cluster and replica messages over [`Peers`].
pub struct Transport {
    pub peers: Arc<Peers>,
}

/// Sends `message` and takes the reply `extract` accepts; an error reply or any other
/// kind of reply is an error.
async fn expect_reply<T>(
    peers: &Peers,
    to: SocketAddr,
    message: Message,
    timeout: Duration,
    extract: impl FnOnce(Reply) -> Result<T, Reply>,
) -> Result<T, String> {
    match extract(peers.call(to, &message, timeout).await?) {
        Ok(value) => Ok(value),
        Err(Reply::Error(error)) => Err(error),
        Err(other) => Err(format!("unexpected reply {other:?}")),
    }
}

impl ClusterTransport for Transport {
    fn call(
        &self,
        to: SocketAddr,
        request: ClusterRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ClusterResponse, String>> {
        let peers = Arc::clone(&self.peers);
        Box::pin(async move {
            expect_reply(
                &peers,
                to,
                Message::Cluster(request),
                timeout,
                |reply| match reply {
                    Reply::Cluster(response) => Ok(response),
                    other => Err(other),
                },
            )
            .await
        })
    }
}

impl ReplicaTransport for Transport {
    fn send(
        &self,
        to: SocketAddr,
        request: ReplicaRequest,
        topology_version: u64,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>> {
        let peers = Arc::clone(&self.peers);
        Box::pin(async move {
            expect_reply(
                &peers,
                to,
                Message::Replica {
                    request,
                    topology_version,
                },
                timeout,
                |reply| match reply {
                    Reply::Replica(response) => Ok(response),
                    other => Err(other),
                },
            )
            .await
        })
    }
}

/// Answers internode messages; parts are filled in as the node starts.
pub struct NodeHandler {
    pub host_id: HostId,
    pub detector: Arc<FailureDetector>,
    pub cluster: OnceLock<Arc<ClusterMetadata>>,
    pub coordinator: OnceLock<Arc<Coordinator>>,
    pub proxy: OnceLock<Arc<StorageProxy>>,
    /// The operator's commands (`shoal admin`).
    pub operations: OnceLock<Arc<crate::operations::NodeOperations>>,
    /// Streaming and the migration steps peers ask for.
    pub streaming: OnceLock<Arc<crate::streaming::Streaming>>,
    /// Strongly consistent tablets: their Raft streams and their leaders' requests.
    pub strong: OnceLock<Arc<crate::strong::StrongTables>>,
    /// The node's metrics: replica requests served for other coordinators count as
    /// foreground work there, which streaming yields to.
    pub metrics: OnceLock<Arc<crate::metrics::Metrics>>,
    /// Where a node started with `join_ring = false` waits for `shoal admin join`.
    pub join_gate: join_gate::JoinGate,
}

impl NodeHandler {
    /// A handler that knows only this node; the rest is set as the node starts.
    pub fn new(host_id: HostId, detector: Arc<FailureDetector>) -> NodeHandler {
        NodeHandler {
            host_id,
            detector,
            cluster: OnceLock::new(),
            coordinator: OnceLock::new(),
            proxy: OnceLock::new(),
            operations: OnceLock::new(),
            streaming: OnceLock::new(),
            strong: OnceLock::new(),
            metrics: OnceLock::new(),
            join_gate: join_gate::JoinGate::default(),
        }
    }
}

impl NodeHandler {
    fn schema_version(&self) -> [u8; 16] {
        self.coordinator
            .get()
            .map(|c| c.schema().version)
            .unwrap_or([0; 16])
    }
}

impl NodeHandler {
    fn load_bytes(&self) -> u64 {
        self.coordinator
            .get()
            .map(|c| c.engine().approximate_size_bytes())
            .unwrap_or(0)
    }

    fn status(&self, cluster: &ClusterMetadata) -> Vec<MemberStatus> {
        let state = cluster.state();
        let voters = cluster.voters();
        state
            .members
            .values()
            .map(|member| {
                let local = member.host_id == self.host_id;
                MemberStatus {
                    address: member.internode_address.ip(),
                    host_id: member.host_id,
                    datacenter: member.datacenter.clone(),
                    rack: member.rack.clone(),
                    up: self.detector.is_alive(&member.host_id),
                    state: member.state.name().to_string(),
                    load_bytes: if local {
                        Some(self.load_bytes())
                    } else {
                        self.detector.load_of(&member.host_id)
                    },
                    tablets: state.tablet_replicas_on(&member.host_id),
                    voter: voters.contains(&member.node_id()),
                }
            })
            .collect()
    }
}

impl Handler for NodeHandler {
    fn handle(&self, message: Message) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
        Box::pin(async move {
            // A replica request is a client's, coordinated elsewhere: its latency is
            // foreground latency here. A node taking over tablets serves the writes to
            // them this way (and no client at all), and must see that load to pace its
            // streaming (`crate::streaming::policy`).
            let replica_request_started =
                matches!(message, Message::Replica { .. }).then(std::time::Instant::now);
            let reply = self.answer(message).await;
            if let (Some(started), Some(metrics)) = (replica_request_started, self.metrics.get()) {
                metrics.observe_replica_request(started.elapsed());
            }
            reply
        })
    }

    fn consensus(&self) -> Option<shoal_consensus::runtime::RaftHandle> {
        self.strong.get().map(|strong| strong.raft().clone())
    }

    fn streaming_lane(&self) -> Option<tokio::runtime::Handle> {
        self.streaming
            .get()
            .map(|streaming| streaming.lane_runtime().clone())
    }
}

impl NodeHandler {
    /// The reply to `message`.
    async fn answer(&self, message: Message) -> Reply {
        match message {
            Message::Ping {
                from,
                schema_version,
                load_bytes,
            } => {
                self.detector.noted(from, schema_version, load_bytes);
                Reply::Pong {
                    host_id: self.host_id,
                    schema_version: self.schema_version(),
                    load_bytes: self.load_bytes(),
                }
            }
            Message::Repair { keyspace, table } => {
                match (self.coordinator.get(), self.proxy.get()) {
                    (Some(coordinator), Some(proxy)) => {
                        let repaired =
                            match coordinator.table_ids(keyspace.as_deref(), table.as_deref()) {
                                Ok(tables) => proxy.repair(tables).await,
                                Err(error) => Err(error),
                            };
                        match repaired {
                            Ok(report) => Reply::Repaired(report),
                            Err(error) => Reply::Error(error.message),
                        }
                    }
                    _ => Reply::Error("this node is still starting".into()),
                }
            }
            Message::Operate(operation) => match self.operations.get() {
                Some(operations) => match operations.perform(operation).await {
                    Ok(outcome) => Reply::Operated(outcome.to_string()),
                    Err(error) => Reply::Error(error),
                },
                None => self.join_gate.answer(&operation),
            },
            Message::PreparedStatement { id } => Reply::PreparedStatement(
                self.coordinator
                    .get()
                    .and_then(|coordinator| coordinator.prepared_statement_text(&id)),
            ),
            Message::Status => match self.cluster.get() {
                Some(cluster) => Reply::Status(self.status(cluster)),
                None => Reply::Error("this node is still starting".into()),
            },
            Message::Cluster(request) => match self.cluster.get() {
                Some(cluster) => Reply::Cluster(cluster.handle(request).await),
                None => Reply::Error("this node is still starting".into()),
            },
            // A step of a lightweight transaction another node coordinates: this
            // node leads the partition's rounds.
            Message::Replica {
                request: ReplicaRequest::PaxosLead(lead),
                topology_version,
            } => match self.proxy.get() {
                Some(proxy) => Reply::Replica(match proxy.local().fence.check(topology_version) {
                    Err(refusal) => ReplicaResponse::Error(refusal),
                    Ok(()) => ReplicaResponse::PaxosLed(proxy.lead(lead).await),
                }),
                None => Reply::Error("this node is still starting".into()),
            },
            // A counter increment another node forwarded: this node leads it.
            Message::Replica {
                request: ReplicaRequest::Increment(update),
                topology_version,
            } => match (self.proxy.get(), self.coordinator.get()) {
                (Some(proxy), Some(coordinator)) => {
                    Reply::Replica(match proxy.local().fence.check(topology_version) {
                        Err(refusal) => ReplicaResponse::Error(refusal),
                        Ok(()) => match coordinator.lead_increment(update).await {
                            Ok(()) => ReplicaResponse::Applied,
                            Err(error) => ReplicaResponse::Error(error.message),
                        },
                    })
                }
                _ => Reply::Error("this node is still starting".into()),
            },
            Message::Replica {
                request,
                topology_version,
            } => match (self.proxy.get(), self.coordinator.get()) {
                (Some(proxy), Some(coordinator)) => Reply::Replica(
                    serve_replica_request(proxy, coordinator, request, topology_version).await,
                ),
                (Some(proxy), None) => {
                    Reply::Replica(proxy.local().serve_routed(request, topology_version).await)
                }
                _ => Reply::Error("this node is still starting".into()),
            },
            Message::Barrier { version, fence } => match self.proxy.get() {
                Some(proxy) if fence => {
                    proxy.fence(version);
                    Reply::Done
                }
                Some(proxy) => match proxy.settle(version, BARRIER_BOUND).await {
                    Ok(settled) => Reply::Settled(settled),
                    Err(error) => Reply::Error(error),
                },
                None => Reply::Error("this node is still starting".into()),
            },
            Message::Stream(request) => match self.streaming.get() {
                Some(streaming) => match streaming.handle(request).await {
                    Ok(reply) => Reply::Stream(reply),
                    Err(error) => Reply::Error(error),
                },
                None => Reply::Error("this node is still starting".into()),
            },
            Message::Strong(request) => match self.strong.get() {
                Some(strong) => Reply::Strong(strong.serve(request).await),
                None => Reply::Error("this node is still starting".into()),
            },
        }
    }
}

fn status_change(address: SocketAddr, up: bool) -> Event {
    Event::StatusChange {
        change: if up { "UP" } else { "DOWN" },
        address,
    }
}

/// Follows the cluster metadata: installs schema changes made elsewhere and announces
/// them and new members to registered clients.
///
/// A member is announced once it is normal, as Cassandra announces a bootstrapping node
/// only when its bootstrap is over: TOPOLOGY_CHANGE NEW_NODE, then STATUS_CHANGE UP if it
/// is up. While it joins, clients hear nothing of it — not even the failure detector's
/// UP: it is not in `system.peers` yet, and a driver re-reads the topology at every
/// status change, work on the client and on a node for nothing while the join runs.
pub async fn follow_metadata(
    cluster: Arc<ClusterMetadata>,
    coordinator: Arc<Coordinator>,
    detector: Arc<FailureDetector>,
    events: Arc<EventBus>,
) {
    let mut states = cluster.subscribe();
    let mut known: BTreeSet<HostId> = states
        .borrow()
        .members
        .values()
        .map(|m| m.host_id)
        .collect();
    // The tokens each member reports, to announce those that move.
    let mut tokens = states.borrow().ring_tokens(routed_table);
    // Where each member's clients reach it, to announce its removal.
    let mut addresses: HashMap<HostId, SocketAddr> = states
        .borrow()
        .members
        .values()
        .map(|m| (m.host_id, m.cql_address))
        .collect();
    while states.changed().await.is_ok() {
        let state = Arc::clone(&states.borrow_and_update());
        match coordinator.sync_schema() {
            Ok(changes) => {
                for change in changes {
                    events.publish(Event::SchemaChange(change));
                }
            }
            Err(error) => {
                tracing::error!(message = %error.message, "cannot install the cluster's schema")
            }
        }
        if let Err(error) = coordinator.sync_roles() {
            tracing::error!(message = %error.message, "cannot install the cluster's roles");
        }
        // A node is announced once it has joined (normal), as Cassandra announces a node
        // once its bootstrap is over: drivers then refresh their view of the cluster once,
        // not while tablets are still moving to it.
        let mut membership_changed = false;
        for member in state.members.values() {
            if member.state != shoal_cluster::MemberState::Joining && known.insert(member.host_id) {
                tracing::info!(peer = %member.internode_address, "a node joined the cluster");
                membership_changed = true;
                events.publish(Event::TopologyChange {
                    change: "NEW_NODE",
                    address: member.cql_address,
                });
                if detector.is_alive(&member.host_id) {
                    events.publish(status_change(member.cql_address, true));
                }
            }
        }
        let gone: Vec<(HostId, SocketAddr)> = known
            .iter()
            .filter(|host| state.member_by_host(host).is_none())
            .filter_map(|host| addresses.get(host).map(|address| (*host, *address)))
            .collect();
        for (host, address) in gone {
            known.remove(&host);
            membership_changed = true;
            // Drivers know nodes by address: a node replaced by one at the same address
            // has not left for them (Cassandra announces no removal either), and a
            // REMOVED_NODE would make them drop the replacement.
            if state.members.values().any(|m| m.cql_address == address) {
                tracing::info!(peer = %address, "a node was replaced at the same address");
                continue;
            }
            tracing::info!(peer = %address, "a node left the cluster");
            events.publish(Event::TopologyChange {
                change: "REMOVED_NODE",
                address,
            });
        }
        // Tablets that moved change the ring drivers route by: tell them (MOVED_NODE, as
        // Cassandra does when a node's tokens change) once the moves are over, rather than
        // at every step of them — and not when a node was just announced or removed, for
        // which drivers read the whole ring again anyway.
        if state.migrations().is_empty() {
            let now = state.ring_tokens(routed_table);
            if !membership_changed {
                for member in state.members.values() {
                    if tokens
                        .get(&member.host_id)
                        .is_some_and(|before| Some(before) != now.get(&member.host_id))
                    {
                        events.publish(Event::TopologyChange {
                            change: "MOVED_NODE",
                            address: member.cql_address,
                        });
                    }
                }
            }
            tokens = now;
        }
        addresses = state
            .members
            .values()
            .map(|m| (m.host_id, m.cql_address))
            .collect();
    }
}

/// Serves a replica request from another coordinator. A chunk of a scan takes its turn in
/// the read scheduler (`shoal_coordinator::schedule`) by its scan's ticket; a read of one
/// partition as a point read for another coordinator — in the point-first orders on the
/// connection's task from memory, and in its turn (`ReadScheduler::run_point`) when it
/// needs data not in memory. Everything else is served at once.
async fn serve_replica_request(
    proxy: &Arc<StorageProxy>,
    coordinator: &Arc<Coordinator>,
    request: ReplicaRequest,
    topology_version: u64,
) -> ReplicaResponse {
    if let ReplicaRequest::ScanChunk { scan, .. } = request {
        return proxy
            .local()
            .serve_scan_chunk(scan, request, Some(topology_version))
            .await;
    }
    let range = match &request {
        ReplicaRequest::Read { lower, upper, .. }
        | ReplicaRequest::Digest { lower, upper, .. }
        | ReplicaRequest::ReadBefore { lower, upper, .. } => Some((lower, upper)),
        _ => None,
    };
    let Some((lower, upper)) = range else {
        return proxy.local().serve_routed(request, topology_version).await;
    };
    let prefix = shoal_model::keys::TOKEN_PREFIX_LENGTH;
    let one_partition = lower.len() >= prefix && upper.get(..prefix) == lower.get(..prefix);
    if !one_partition {
        return proxy.local().serve_routed(request, topology_version).await;
    }
    if coordinator.reads().point_read_inline() {
        if let Some(response) = proxy
            .local()
            .serve_read_in_memory(&request, topology_version)
        {
            return response;
        }
    }
    let local = Arc::clone(proxy.local());
    let served = coordinator
        .reads()
        .run_point(
            shoal_coordinator::schedule::ReadClass::RemotePoint,
            move || local.serve_read_routed(request, topology_version),
        )
        .await;
    served.unwrap_or_else(|error| ReplicaResponse::Error(error.message))
}

mod failure_detection;
pub mod join_gate;

pub use failure_detection::run_failure_detection;

#[cfg(test)]
mod tests;
