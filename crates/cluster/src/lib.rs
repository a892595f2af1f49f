//! Cluster metadata: membership, schema and tablet placement as one Raft-replicated
//! state machine (openraft; see `docs/decisions/0005-raft-for-cluster-metadata.md`).
//!
//! - [`state`] — the [`ClusterState`] and the [`Command`]s that change it (pure).
//! - [`store`] — Raft's log and state machine, kept in the engine's metadata.
//! - [`ClusterMetadata`] — this node's handle: it starts Raft, bootstraps a new cluster or
//!   joins an existing one through the seeds, proposes commands (forwarding them to the
//!   leader when it is not the leader), and answers the Raft messages peers send it.
//!
//! The Raft group has at most [`MAX_VOTERS`] voters (the first nodes to join); later nodes
//! are learners that receive every change but do not vote, so metadata changes stay cheap
//! as the cluster grows. A voter that leaves is replaced by a learner
//! ([`ClusterMetadata::retire`], [`ClusterMetadata::fill_voters`]). Data in ordinary
//! keyspaces does not go through Raft: it is replicated leaderlessly by the coordinator,
//! which reads the tablet map from here.
//!
//! A node joins a cluster whatever it holds: it is admitted as `Joining` and the migration
//! driver (the server's) moves tablets to it; a node started to replace a dead one names
//! it, and takes over its Raft membership and, first, its replicas.
//!
//! `membership` holds joining, admitting and the voters; `network` carries openraft's
//! calls.
//!
//! The crate owns no sockets: messages travel through a [`ClusterTransport`] the server
//! implements over its internode connections.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod membership;
mod network;
pub mod state;
pub mod store;
pub mod strong_split;
mod tablet_changes;

pub use state::{
    node_id_of, ClusterState, Command, CommandOutcome, Member, MemberState, NodeId, TablePlacement,
    VersionedRecord, TABLETS_PER_NODE,
};

use futures::future::BoxFuture;
use network::Network;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers, Raft};
use serde::{Deserialize, Serialize};
use shoal_model::HostId;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

openraft::declare_raft_types!(
    /// Raft's types for cluster metadata.
    pub TypeConfig:
        D = Command,
        R = CommandOutcome,
);

/// Voters of the metadata Raft group; later members follow as learners.
pub const MAX_VOTERS: usize = 3;

/// Metadata key marking a node that has left its cluster.
const LEFT_KEY: &[u8] = b"cluster/left";

/// How long a node keeps trying to join through its seeds before giving up.
const JOIN_DEADLINE: Duration = Duration::from_secs(120);

/// Messages between the cluster metadata of two nodes. Raft's messages name the node they
/// are for: a node started at the address of another (replacing it) must not answer for
/// it.
#[derive(Debug, Serialize, Deserialize)]
pub enum ClusterRequest {
    AppendEntries {
        to: NodeId,
        rpc: AppendEntriesRequest<TypeConfig>,
    },
    Vote {
        to: NodeId,
        rpc: VoteRequest<NodeId>,
    },
    InstallSnapshot {
        to: NodeId,
        rpc: InstallSnapshotRequest<TypeConfig>,
    },
    /// A new node asks to join; `replacing` names the address of the dead member it
    /// replaces.
    Join {
        member: Member,
        replacing: Option<std::net::IpAddr>,
    },
    /// A command for the leader to propose.
    Propose(Command),
    /// Is the receiving node a member of a cluster (bootstrapped or joined)?
    Membership,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ClusterResponse {
    AppendEntries(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    InstallSnapshot(InstallSnapshotResponse<NodeId>),
    Joined,
    /// The outcome, and the log index at which the command was applied.
    Proposed(CommandOutcome, u64),
    /// Whether the node belongs to a cluster yet (a seed waiting to join does not).
    Membership(bool),
    /// The request failed; the message says why (for people).
    Error(String),
}

/// How cluster messages reach a peer (the server implements it over internode messaging).
pub trait ClusterTransport: Send + Sync + 'static {
    fn call(
        &self,
        to: SocketAddr,
        request: ClusterRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ClusterResponse, String>>;
}

/// What can go wrong with cluster metadata.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster metadata storage: {0}")]
    Store(#[from] store::anyhow_like::OpenError),
    #[error("{0}")]
    Raft(String),
    #[error("{0}")]
    Refused(String),
    #[error("no leader is reachable for cluster metadata; is a majority of the first {MAX_VOTERS} nodes up?")]
    NoLeader,
}

/// This node's view of the cluster metadata's Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftStatus {
    pub term: u64,
    pub is_leader: bool,
    /// Index of the last entry applied to the state machine here.
    pub last_applied: u64,
}

/// This node's cluster metadata.
pub struct ClusterMetadata {
    raft: Raft<TypeConfig>,
    engine: Arc<dyn shoal_storage::Engine>,
    me: Member,
    transport: Arc<dyn ClusterTransport>,
    state: watch::Receiver<Arc<ClusterState>>,
    /// This node had Raft state when it started.
    resuming: bool,
    /// Serializes admissions on the leader, so each decides whether there is room for one
    /// more voter knowing every earlier one, and none is refused because another's
    /// membership change is under way (openraft refuses overlapping changes).
    admissions: tokio::sync::Mutex<()>,
}

fn raft_config() -> Result<Arc<openraft::Config>, ClusterError> {
    let config = openraft::Config {
        cluster_name: "shoal".to_string(),
        heartbeat_interval: 200,
        election_timeout_min: 800,
        election_timeout_max: 1600,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(500),
        max_in_snapshot_log_to_keep: 100,
        ..Default::default()
    };
    Ok(Arc::new(
        config
            .validate()
            .map_err(|e| ClusterError::Raft(e.to_string()))?,
    ))
}

impl ClusterMetadata {
    /// Opens this node's metadata and starts Raft. The node must route peers' messages
    /// to [`ClusterMetadata::handle`] before calling [`ClusterMetadata::enter`].
    pub async fn open(
        engine: Arc<dyn shoal_storage::Engine>,
        me: Member,
        transport: Arc<dyn ClusterTransport>,
    ) -> Result<Arc<ClusterMetadata>, ClusterError> {
        let log = store::LogStore::open(std::sync::Arc::clone(&engine))?;
        let (machine, state) = store::StateMachine::open(Arc::clone(&engine))?;
        let resuming = log.has_state().await;
        let network = Network {
            transport: Arc::clone(&transport),
        };
        let mut me = me;
        me.state = MemberState::Joining;
        let raft = Raft::new(me.node_id(), raft_config()?, network, log, machine)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        Ok(Arc::new(ClusterMetadata {
            raft,
            engine,
            me,
            transport,
            state,
            resuming,
            admissions: tokio::sync::Mutex::new(()),
        }))
    }

    /// Takes this node into its cluster: resumes the one it already belongs to,
    /// bootstraps a new one (when it is the first seed and no other seed knows a
    /// cluster), or joins one through `seeds` (internode addresses).
    pub async fn enter(
        &self,
        seeds: &[SocketAddr],
        replacing: Option<std::net::IpAddr>,
    ) -> Result<(), ClusterError> {
        if self.resuming {
            if self.has_left() {
                return Err(ClusterError::Refused(format!(
                    "this node ({}) has left the cluster (decommissioned or removed); to join again, start it with an empty data directory",
                    self.me.internode_address
                )));
            }
            tracing::info!("resuming cluster membership from local metadata");
            self.reregister_if_moved().await;
            return Ok(());
        }
        let others: Vec<SocketAddr> = seeds
            .iter()
            .copied()
            .filter(|s| *s != self.me.internode_address)
            .collect();
        let first_seed = seeds
            .first()
            .is_none_or(|s| *s == self.me.internode_address);
        if replacing.is_none() && first_seed && !self.any_seed_has_cluster(&others).await {
            self.bootstrap().await
        } else {
            self.join(&others, replacing).await
        }
    }

    async fn bootstrap(&self) -> Result<(), ClusterError> {
        tracing::info!(address = %self.me.internode_address, "bootstrapping a new cluster");
        let members = BTreeMap::from([(
            self.me.node_id(),
            BasicNode::new(self.me.internode_address.to_string()),
        )]);
        self.raft
            .initialize(members)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        // The first node owns everything there is: it is normal from the start.
        let mut me = self.me.clone();
        me.state = MemberState::Normal;
        self.propose(Command::AddMember(me)).await?;
        Ok(())
    }

    /// True when one of `seeds` already belongs to a cluster. A seed that answers but is
    /// itself still waiting to join (it was started first) does not count: the first seed
    /// must bootstrap, whatever order the seeds start in.
    async fn any_seed_has_cluster(&self, seeds: &[SocketAddr]) -> bool {
        for seed in seeds {
            let answer = self
                .transport
                .call(*seed, ClusterRequest::Membership, Duration::from_secs(1))
                .await;
            tracing::debug!(%seed, ?answer, "asked a seed whether it belongs to a cluster");
            if matches!(answer, Ok(ClusterResponse::Membership(true))) {
                tracing::info!(%seed, "another seed already belongs to a cluster: joining it");
                return true;
            }
        }
        false
    }

    /// Records that this node has left its cluster (decommission), so that it refuses to
    /// start again with this data directory instead of campaigning in a group it is no
    /// longer part of.
    pub fn mark_left(&self) {
        if let Err(error) = self.engine.put_metadata(LEFT_KEY, b"1") {
            tracing::warn!(%error, "could not record that this node has left the cluster");
        }
    }

    fn has_left(&self) -> bool {
        self.engine
            .metadata_with_prefix(LEFT_KEY)
            .is_ok_and(|entries| entries.iter().any(|(key, _)| key == LEFT_KEY))
    }

    /// True once this node belongs to a cluster.
    pub fn is_member(&self) -> bool {
        self.state().members.contains_key(&self.me.node_id())
    }

    /// Waits (without bound: callers run it where the node cannot proceed otherwise) until
    /// the applied state satisfies `condition`.
    async fn wait_until(&self, condition: impl Fn(&ClusterState) -> bool) {
        let mut state = self.state.clone();
        let _ = state.wait_for(|s| condition(s)).await;
    }

    /// This node's view of the Raft group, for the metrics.
    pub fn raft_status(&self) -> RaftStatus {
        let metrics = self.raft.metrics().borrow().clone();
        RaftStatus {
            term: metrics.current_term,
            is_leader: metrics.current_leader == Some(metrics.id),
            last_applied: metrics.last_applied.map_or(0, |log| log.index),
        }
    }

    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The state as applied on this node.
    pub fn state(&self) -> Arc<ClusterState> {
        Arc::clone(&self.state.borrow())
    }

    /// A channel that sees every state this node applies.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.state.clone()
    }

    /// Proposes `command` through the leader and waits until this node has applied it.
    pub async fn propose(&self, command: Command) -> Result<CommandOutcome, ClusterError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let written = bounded(
                "a metadata proposal",
                self.raft.client_write(command.clone()),
            )
            .await?;
            let (outcome, index) = match written {
                Ok(response) => (response.data, response.log_id.index),
                Err(error) => {
                    let leader = error
                        .forward_to_leader()
                        .and_then(|f| f.leader_node.as_ref())
                        .and_then(|node| node.addr.parse::<SocketAddr>().ok());
                    let forwarded = match leader {
                        Some(leader) if leader != self.me.internode_address => Some(
                            self.transport
                                .call(
                                    leader,
                                    ClusterRequest::Propose(command.clone()),
                                    Duration::from_secs(10),
                                )
                                .await,
                        ),
                        _ => None,
                    };
                    match forwarded {
                        Some(Ok(ClusterResponse::Proposed(outcome, index))) => (outcome, index),
                        _ if tokio::time::Instant::now() > deadline => {
                            return Err(ClusterError::NoLeader)
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            };
            self.raft
                .wait(Some(Duration::from_secs(10)))
                .applied_index_at_least(Some(index), "proposal applied locally")
                .await
                .map_err(|e| ClusterError::Raft(e.to_string()))?;
            return Ok(outcome);
        }
    }

    /// Answers a message from a peer.
    pub async fn handle(&self, request: ClusterRequest) -> ClusterResponse {
        let error = |e: &dyn std::fmt::Display| ClusterResponse::Error(e.to_string());
        match request {
            ClusterRequest::AppendEntries { to, .. }
            | ClusterRequest::Vote { to, .. }
            | ClusterRequest::InstallSnapshot { to, .. }
                if to != self.me.node_id() =>
            {
                ClusterResponse::Error(format!(
                    "this is node {:016x}, not {to:016x} (it replaced that node)",
                    self.me.node_id()
                ))
            }
            ClusterRequest::AppendEntries { rpc, .. } => {
                match self.raft.append_entries(rpc).await {
                    Ok(response) => ClusterResponse::AppendEntries(response),
                    Err(e) => error(&e),
                }
            }
            ClusterRequest::Vote { rpc, .. } => {
                // A node removed from the group (decommissioned, replaced) may not know it
                // yet and campaign: its elections must not disturb the members'.
                let candidate = rpc.vote.leader_id().voted_for();
                let known = self.raft.metrics().borrow().membership_config.clone();
                if candidate.is_some_and(|c| known.membership().get_node(&c).is_none()) {
                    return ClusterResponse::Error(
                        "the candidate is not a member of the metadata group".into(),
                    );
                }
                match self.raft.vote(rpc).await {
                    Ok(response) => ClusterResponse::Vote(response),
                    Err(e) => error(&e),
                }
            }
            ClusterRequest::InstallSnapshot { rpc, .. } => {
                match self.raft.install_snapshot(rpc).await {
                    Ok(response) => ClusterResponse::InstallSnapshot(response),
                    Err(e) => error(&e),
                }
            }
            ClusterRequest::Membership => ClusterResponse::Membership(self.is_member()),
            ClusterRequest::Propose(command) => {
                match bounded("a forwarded proposal", self.raft.client_write(command)).await {
                    Ok(Ok(response)) => {
                        ClusterResponse::Proposed(response.data, response.log_id.index)
                    }
                    Ok(Err(e)) => error(&e),
                    Err(e) => error(&e),
                }
            }
            ClusterRequest::Join { member, replacing } => match self.admit(member, replacing).await
            {
                Ok(()) => ClusterResponse::Joined,
                Err(e) => error(&e),
            },
        }
    }

    /// True when this node leads the metadata Raft group, as the Raft core last published
    /// it: no round trip to the core, so a caller polling it never waits behind a busy
    /// core.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.me.node_id())
    }

    fn leader_address(&self) -> Option<SocketAddr> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let node = metrics.membership_config.membership().get_node(&leader)?;
        node.addr.parse().ok()
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// How long a call into the metadata Raft core may take before it counts as failed: a
/// proposal commits within milliseconds while a majority is up, and a membership change
/// waits for a learner to catch up on a log of metadata only. A core that does not answer
/// then is reported (and the caller retries) instead of holding its caller forever.
const RAFT_CALL_BOUND: Duration = Duration::from_secs(20);

/// Runs `call` into the Raft core, at most [`RAFT_CALL_BOUND`]. Giving up on a proposal
/// does not withdraw it: it may still commit, as when a forwarded one's answer is lost;
/// every command states its precondition, so a caller's retry is harmless.
async fn bounded<T>(
    what: &str,
    call: impl std::future::Future<Output = T>,
) -> Result<T, ClusterError> {
    tokio::time::timeout(RAFT_CALL_BOUND, call)
        .await
        .map_err(|_| {
            tracing::warn!(what, bound = ?RAFT_CALL_BOUND, "the metadata Raft core did not answer in time");
            ClusterError::Raft(format!("{what} did not finish within {RAFT_CALL_BOUND:?}"))
        })
}
