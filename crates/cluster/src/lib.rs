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
//! as the cluster grows. Data in ordinary keyspaces does not go through Raft: it is
//! replicated leaderlessly by the coordinator, which reads the tablet map from here.
//!
//! The crate owns no sockets: messages travel through a [`ClusterTransport`] the server
//! implements over its internode connections.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod state;
pub mod store;

pub use state::{
    node_id_of, ClusterState, Command, CommandOutcome, Member, MemberState, NodeId, TablePlacement,
    VersionedRecord,
};

use futures::future::BoxFuture;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers, Raft};
use serde::{Deserialize, Serialize};
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

/// How long a node keeps trying to join through its seeds before giving up.
const JOIN_DEADLINE: Duration = Duration::from_secs(120);

/// Messages between the cluster metadata of two nodes.
#[derive(Debug, Serialize, Deserialize)]
pub enum ClusterRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A new node asks to join.
    Join(Member),
    /// A command for the leader to propose.
    Propose(Command),
    /// Does the receiving node hold any user data?
    HoldsData,
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
    HoldsData(bool),
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

/// Tells the metadata layer about the node's data (used to refuse unsafe joins).
pub trait LocalData: Send + Sync + 'static {
    fn holds_user_data(&self) -> bool;
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
    me: Member,
    transport: Arc<dyn ClusterTransport>,
    state: watch::Receiver<Arc<ClusterState>>,
    local_data: Arc<dyn LocalData>,
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
        local_data: Arc<dyn LocalData>,
    ) -> Result<Arc<ClusterMetadata>, ClusterError> {
        let log = store::LogStore::open(std::sync::Arc::clone(&engine))?;
        let (machine, state) = store::StateMachine::open(engine)?;
        let resuming = log.has_state().await;
        let network = Network {
            transport: Arc::clone(&transport),
        };
        let raft = Raft::new(me.node_id(), raft_config()?, network, log, machine)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        Ok(Arc::new(ClusterMetadata {
            raft,
            me,
            transport,
            state,
            local_data,
            resuming,
            admissions: tokio::sync::Mutex::new(()),
        }))
    }

    /// Takes this node into its cluster: resumes the one it already belongs to,
    /// bootstraps a new one (when it is the first seed and no other seed knows a
    /// cluster), or joins one through `seeds` (internode addresses).
    pub async fn enter(&self, seeds: &[SocketAddr]) -> Result<(), ClusterError> {
        if self.resuming {
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
        if first_seed && !self.any_seed_has_cluster(&others).await {
            self.bootstrap().await
        } else {
            self.join(&others).await
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
        self.propose(Command::AddMember(self.me.clone())).await?;
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

    /// True once this node belongs to a cluster.
    pub fn is_member(&self) -> bool {
        self.state().members.contains_key(&self.me.node_id())
    }

    async fn join(&self, seeds: &[SocketAddr]) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
        let mut last_problem = String::from("no seed answered");
        loop {
            for seed in seeds {
                let answer = self
                    .transport
                    .call(
                        *seed,
                        ClusterRequest::Join(self.me.clone()),
                        Duration::from_secs(30),
                    )
                    .await;
                match answer {
                    Ok(ClusterResponse::Joined) => {
                        tracing::info!(%seed, "joined the cluster");
                        self.wait_until(|s| s.members.contains_key(&self.me.node_id()))
                            .await;
                        return Ok(());
                    }
                    Ok(ClusterResponse::Error(message)) if message.starts_with("refused") => {
                        return Err(ClusterError::Refused(message));
                    }
                    Ok(other) => last_problem = format!("{seed} answered {other:?}"),
                    Err(error) => last_problem = format!("{seed}: {error}"),
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ClusterError::Raft(format!(
                    "could not join a cluster through the seeds {seeds:?}: {last_problem}"
                )));
            }
            tracing::info!(problem = %last_problem, "waiting for a seed to let this node join");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// After a restart on a new address, tell the cluster where this node is now.
    async fn reregister_if_moved(&self) {
        let known = self.state().members.get(&self.me.node_id()).cloned();
        if known.as_ref() != Some(&self.me) {
            if let Err(error) = self.propose(Command::AddMember(self.me.clone())).await {
                tracing::warn!(%error, "could not update this node's address in the cluster");
            }
        }
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
            let (outcome, index) = match self.raft.client_write(command.clone()).await {
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
            ClusterRequest::AppendEntries(rpc) => match self.raft.append_entries(rpc).await {
                Ok(response) => ClusterResponse::AppendEntries(response),
                Err(e) => error(&e),
            },
            ClusterRequest::Vote(rpc) => match self.raft.vote(rpc).await {
                Ok(response) => ClusterResponse::Vote(response),
                Err(e) => error(&e),
            },
            ClusterRequest::InstallSnapshot(rpc) => match self.raft.install_snapshot(rpc).await {
                Ok(response) => ClusterResponse::InstallSnapshot(response),
                Err(e) => error(&e),
            },
            ClusterRequest::HoldsData => {
                ClusterResponse::HoldsData(self.local_data.holds_user_data())
            }
            ClusterRequest::Membership => ClusterResponse::Membership(self.is_member()),
            ClusterRequest::Propose(command) => match self.raft.client_write(command).await {
                Ok(response) => ClusterResponse::Proposed(response.data, response.log_id.index),
                Err(e) => error(&e),
            },
            ClusterRequest::Join(member) => match self.admit(member).await {
                Ok(()) => ClusterResponse::Joined,
                Err(e) => error(&e),
            },
        }
    }

    /// Leader side of a join: refuse when the cluster holds data, else add the node to
    /// Raft (as a voter while there are fewer than [`MAX_VOTERS`]) and to the members.
    async fn admit(&self, member: Member) -> Result<(), ClusterError> {
        if self.raft.current_leader().await != Some(self.me.node_id()) {
            let leader = self.leader_address().await.ok_or(ClusterError::NoLeader)?;
            if leader == self.me.internode_address {
                return Err(ClusterError::NoLeader);
            }
            return match self
                .transport
                .call(
                    leader,
                    ClusterRequest::Join(member),
                    Duration::from_secs(30),
                )
                .await
            {
                Ok(ClusterResponse::Joined) => Ok(()),
                Ok(ClusterResponse::Error(message)) => Err(ClusterError::Refused(message)),
                Ok(other) => Err(ClusterError::Raft(format!("unexpected answer {other:?}"))),
                Err(error) => Err(ClusterError::Raft(error)),
            };
        }
        let _admission = self.admissions.lock().await;
        let state = self.state();
        let rejoining = state.members.contains_key(&member.node_id());
        if !rejoining && self.cluster_holds_data(&state).await {
            return Err(ClusterError::Refused(format!(
                "refused: {} cannot join because the cluster already holds data, and moving data to a new node is not supported yet",
                member.internode_address
            )));
        }
        let id = member.node_id();
        let node = BasicNode::new(member.internode_address.to_string());
        self.raft
            .add_learner(id, node, true)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        let voters: BTreeSet<NodeId> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        if voters.len() < MAX_VOTERS && !voters.contains(&id) {
            self.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
                .await
                .map_err(|e| ClusterError::Raft(e.to_string()))?;
        }
        match self.propose(Command::AddMember(member)).await? {
            CommandOutcome::Applied => Ok(()),
            other => Err(ClusterError::Raft(format!("{other:?}"))),
        }
    }

    async fn cluster_holds_data(&self, state: &ClusterState) -> bool {
        if self.local_data.holds_user_data() {
            return true;
        }
        for member in state.members.values() {
            if member.host_id == self.me.host_id {
                continue;
            }
            let answer = self
                .transport
                .call(
                    member.internode_address,
                    ClusterRequest::HoldsData,
                    Duration::from_secs(2),
                )
                .await;
            // A member that does not answer may hold data: refuse rather than guess.
            if !matches!(answer, Ok(ClusterResponse::HoldsData(false))) {
                return true;
            }
        }
        false
    }

    async fn leader_address(&self) -> Option<SocketAddr> {
        let leader = self.raft.current_leader().await?;
        let metrics = self.raft.metrics().borrow().clone();
        let node = metrics.membership_config.membership().get_node(&leader)?;
        node.addr.parse().ok()
    }

    /// Metadata voters (Raft ids).
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// openraft's view of the network: each call is one request/response over the transport.
struct Network {
    transport: Arc<dyn ClusterTransport>,
}

struct PeerChannel {
    address: Result<SocketAddr, String>,
    transport: Arc<dyn ClusterTransport>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerChannel;

    async fn new_client(&mut self, _target: NodeId, node: &BasicNode) -> PeerChannel {
        PeerChannel {
            address: node
                .addr
                .parse()
                .map_err(|e| format!("bad peer address {}: {e}", node.addr)),
            transport: Arc::clone(&self.transport),
        }
    }
}

#[derive(Debug)]
struct PeerProblem(String);

impl std::fmt::Display for PeerProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerProblem {}

impl PeerChannel {
    async fn call<E: std::error::Error>(
        &self,
        request: ClusterRequest,
        option: &RPCOption,
    ) -> Result<ClusterResponse, RPCError<NodeId, BasicNode, E>> {
        let address = self
            .address
            .clone()
            .map_err(|e| RPCError::Network(NetworkError::new(&PeerProblem(e))))?;
        match self
            .transport
            .call(address, request, option.hard_ttl())
            .await
        {
            Ok(ClusterResponse::Error(message)) => {
                Err(RPCError::Network(NetworkError::new(&PeerProblem(message))))
            }
            Ok(response) => Ok(response),
            Err(message) => Err(RPCError::Unreachable(Unreachable::new(&PeerProblem(
                message,
            )))),
        }
    }
}

fn unexpected<E: std::error::Error>(response: ClusterResponse) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&PeerProblem(format!(
        "unexpected answer {response:?}"
    ))))
}

impl RaftNetwork<TypeConfig> for PeerChannel {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .call(ClusterRequest::AppendEntries(rpc), &option)
            .await?
        {
            ClusterResponse::AppendEntries(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(ClusterRequest::InstallSnapshot(rpc), &option)
            .await?
        {
            ClusterResponse::InstallSnapshot(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(ClusterRequest::Vote(rpc), &option).await? {
            ClusterResponse::Vote(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }
}
