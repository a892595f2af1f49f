//! Strongly consistent keyspaces (`CREATE KEYSPACE … AND consistency = 'strong'`): every
//! tablet of their tables is a Raft group of the tablet's replicas ([`shoal_consensus`]),
//! and every group on this node shares its epoch log and one stream per peer node.
//!
//! - **Writes** are proposed to the tablet's group at its leader — on this node, or
//!   forwarded to the leader over the internode connection — and answered once committed
//!   and applied there. A write that could not be sent to the leader (it is down) waits
//!   for the next one; a write whose outcome is unknown when its time is up (no leader
//!   elected in time, the leader lost with the write sent) is a `WriteTimeout`, as
//!   Cassandra's CAS writes are.
//! - **Reads** are served by the leader once the log up to its read index is applied
//!   there (the leader's lease makes that a local decision: no round trip).
//! - **Applying** ([`machine`]): members write committed entries to their engine in log
//!   order; the log is the durable record, replayed from its last checkpoint after a
//!   restart (the engine's log is synced before each checkpoint).
//! - **Groups follow the schema and the tablet map** ([`StrongTables::follow`]): each tablet
//!   of a strong table with a replica here (or moving here) is a group here, created with
//!   the tablet's replicas as its members; a tablet that leaves (moved away, its table
//!   dropped) leaves the node's groups.
//! - **Splits and merges fence the groups** ([`splits`], `shoal_cluster::strong_split`):
//!   once the tablet map plans one, the leader of each group concerned appends a fence
//!   ([`machine::fence_entry`]) after which no write takes effect; writers are told
//!   ([`StrongReply::Fenced`]) and try again until the tablet map routes them to the new
//!   tablets, whose groups start once every member applied the fence.
//! - **Moves change members**: the migration driver asks the leader to add the new
//!   replica ([`StrongRequest::ChangeMembers`]), has it install a snapshot of the tablet
//!   streamed from the leader ([`StrongRequest::SnapshotPoint`], [`StrongRequest::Install`])
//!   and, once it caught up, asks the leader to remove the old one (decision 0016).
//! - Consensus streams arrive on the internode port, told apart by their first bytes
//!   ([`shoal_consensus::runtime::tcp::STREAM_PREFACE`]).
//!
//! - **Scans** walk the tablets as an eventual table's do
//!   ([`shoal_replication::range::ReplicatedView`]), each chunk read at its tablet's
//!   leader like a point read ([`shoal_replication::range::ChunkReader`]): every chunk is
//!   linearizable (a scan across tablets is not one snapshot, as in Cassandra).
//!
//! The consistency level a request names is accepted and does not change anything: every
//! write and read is linearizable. Conditional statements and SERIAL reads are decided
//! by the tablet's leader ([`conditional`]). Not yet: counters and secondary indexes are
//! refused on them. With internode TLS, the consensus streams are
//! mutual TLS too: each connection makes the same handshake as the internode messages'
//! ([`crate::tls::InternodeTls`]) before its preface.
//!
//! The requests and replies between nodes are in `wire`; the leader's side of them in
//! `serving`.

pub mod conditional;
mod groups;
pub mod machine;
pub mod replication;
mod serving;
pub mod splits;
mod wire;

use crate::internode::{CallError, Message, Peers, Reply};
use crate::tls::InternodeTls;
use shoal_cluster::{ClusterMetadata, ClusterState};
use shoal_consensus::runtime::{self, tcp, NodeOptions, ProposeError, RaftHandle};
use shoal_consensus::GroupId;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, TabletId, Token};
use shoal_replication::consistency::{read_timeout, write_timeout, WriteType};
use shoal_replication::{Cells, READ_TIMEOUT};
use shoal_schema::{KeyspaceConsistency, Schema, SchemaStore};
use shoal_storage::{Engine, WriteBatch};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use wire::{StrongReply, StrongRequest, WireSnapshot, WireStatus};

/// How long a strong write waits for its entry to commit (an election included).
pub const STRONG_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before asking again who leads a group that has no leader yet.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(20);
/// Pause before asking a fenced group again (a split usually ends within milliseconds).
const FENCED_PAUSE: Duration = Duration::from_millis(5);
/// How long the leader waits for a membership change to commit before it answers
/// `Unknown` (a member being added may have to install a snapshot before it can count).
const MEMBERSHIP_CHANGE_WAIT: Duration = Duration::from_secs(2);
/// How often the groups are checked against the schema even when nothing signals a change
/// (the schema is installed by another task, shortly after the metadata changes).
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// Why a request sent to another node has no answer.
enum Unanswered {
    /// It never left this node (see [`CallError::NotSent`]): the other node cannot have
    /// acted on it, so even a proposal may be sent again.
    NotSent,
    /// It may have been acted on, and the answer was lost or late.
    NoReply,
}

/// The Raft group of `tablet` of `table`: the same number on every node.
pub fn group_of(table: &TableId, tablet: TabletId) -> GroupId {
    let high = u64::from_le_bytes(table.0[..8].try_into().unwrap_or_default());
    let low = u64::from_le_bytes(table.0[8..].try_into().unwrap_or_default());
    GroupId(high ^ low.rotate_left(29) ^ tablet.0.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A strongly consistent tablet's group and its members (the tablet's replicas).
#[derive(Clone)]
pub struct TabletGroup {
    pub table: TableId,
    pub tablet: TabletId,
    pub group: GroupId,
    pub members: Vec<HostId>,
}

impl TabletGroup {
    /// How many members make a majority.
    fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }
}

/// This node's share of the strongly consistent tablets.
pub struct StrongTables {
    me: HostId,
    raft: RaftHandle,
    metadata: Arc<ClusterMetadata>,
    schema: Arc<SchemaStore>,
    peers: Arc<Peers>,
    engine: Arc<dyn Engine>,
    /// Fences and clock floors, shared with the state machine.
    records: Arc<machine::GroupRecords>,
    /// The leader's partition locks and the leases of conditional statements on them.
    locks: conditional::PartitionLocks,
    leases: Arc<conditional::Leases>,
    /// The strong tables of the schema last looked at.
    strong: parking_lot::RwLock<StrongCache>,
}

/// A schema and the tables of its strong keyspaces.
struct StrongCache {
    schema: Option<Arc<Schema>>,
    tables: HashSet<TableId>,
}

/// The tables of strong keyspaces in `schema`.
fn strong_tables(schema: &Schema) -> HashSet<TableId> {
    schema
        .keyspaces
        .values()
        .filter(|keyspace| keyspace.consistency == KeyspaceConsistency::Strong)
        .flat_map(|keyspace| keyspace.tables.values().map(|table| table.id))
        .collect()
}

impl StrongTables {
    /// Starts this node's consensus runtime (its log in `directory`); groups are added by
    /// [`StrongTables::follow`].
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        directory: &Path,
        source: IpAddr,
        metadata: Arc<ClusterMetadata>,
        schema: Arc<SchemaStore>,
        peers: Arc<Peers>,
        engine: Arc<dyn Engine>,
        tls: Option<Arc<InternodeTls>>,
    ) -> std::io::Result<Arc<StrongTables>> {
        let me = metadata.me().host_id;
        let lookup = Arc::clone(&metadata);
        let transport = tcp::TcpTransport::resolving(
            me,
            source,
            Arc::new(move |peer: HostId| {
                lookup
                    .state()
                    .member_by_host(&peer)
                    .map(|member| member.internode_address)
            }),
        );
        let transport = match tls {
            None => transport,
            Some(tls) => transport.securing(crate::tls::securing_consensus_streams(tls)),
        };
        let records = Arc::new(machine::GroupRecords::default());
        let raft = runtime::start(
            me,
            NodeOptions::default(),
            directory.to_path_buf(),
            Vec::new(),
            Arc::new(transport),
            Box::new(machine::EngineMachine::new(
                Arc::clone(&engine),
                Arc::clone(&records),
            )),
        )?;
        Ok(Arc::new(StrongTables {
            me,
            raft,
            metadata,
            schema,
            peers,
            engine,
            records,
            locks: Default::default(),
            leases: Default::default(),
            strong: parking_lot::RwLock::new(StrongCache {
                schema: None,
                tables: HashSet::new(),
            }),
        }))
    }

    /// The node's consensus runtime (streams from peers are handed to it).
    pub fn raft(&self) -> &RaftHandle {
        &self.raft
    }

    /// True when `table` belongs to a strongly consistent keyspace.
    pub fn is_strong(&self, table: &TableId) -> bool {
        let schema = self.schema.current();
        {
            let cached = self.strong.read();
            if cached
                .schema
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &schema))
            {
                return cached.tables.contains(table);
            }
        }
        let tables = strong_tables(&schema);
        let strong = tables.contains(table);
        *self.strong.write() = StrongCache {
            schema: Some(schema),
            tables,
        };
        strong
    }

    /// True while `target`'s tablet is in the tablet map (not split, merged or dropped).
    fn still_placed(&self, target: &TabletGroup) -> bool {
        self.metadata
            .state()
            .tables
            .get(&target.table)
            .is_some_and(|placement| placement.tablets.get(target.tablet).is_some())
    }

    /// The group of the tablet holding `token` of `table` in `state`.
    fn group_for(
        state: &ClusterState,
        table: &TableId,
        token: Token,
    ) -> Result<TabletGroup, CqlError> {
        let placement = state.tables.get(table).ok_or_else(|| {
            CqlError::server("the table has no tablets yet; try again in a moment")
        })?;
        let tablet = placement.tablets.tablet_for(token);
        Ok(Self::tablet_group(table, tablet))
    }

    /// `tablet`'s group, its members as the tablet map has them: the replicas and the
    /// replica a move is adding (the group's own log has the last word on its members).
    pub fn tablet_group(table: &TableId, tablet: &shoal_placement::Tablet) -> TabletGroup {
        let mut members = tablet.replicas.clone();
        if let Some(pending) = tablet.transition.as_ref().and_then(|t| t.pending) {
            if !members.contains(&pending) {
                members.push(pending);
            }
        }
        TabletGroup {
            table: *table,
            tablet: tablet.id,
            group: group_of(table, tablet.id),
            members,
        }
    }

    /// Whom to send the next attempt to: the leader this node knows of (it holds a replica
    /// of the group), else the one the last answer named, else the other members in turn,
    /// who answer or name their leader. `None`: wait for an election.
    async fn whom_to_ask(
        &self,
        target: &TabletGroup,
        named: Option<HostId>,
        attempt: usize,
    ) -> Option<HostId> {
        if let Some(leader) = self.raft.leader(target.group).await {
            return Some(leader);
        }
        if named.is_some() {
            return named;
        }
        // This node may hold a replica that hears from no leader (one being added, or
        // removed from the group): the others answer or name their leader.
        let others: Vec<HostId> = target
            .members
            .iter()
            .copied()
            .filter(|member| *member != self.me)
            .collect();
        if others.is_empty() {
            return None;
        }
        Some(others[attempt % others.len()])
    }

    /// Commits `batch` (one partition's cells) through its tablet's group. Asked again
    /// only while nothing was appended: an entry that may still commit is never proposed
    /// twice (a reader could otherwise see it, a later write, then it again), its writer
    /// gets a WriteTimeout instead, as for a CAS write.
    pub async fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: WriteType,
    ) -> Result<(), CqlError> {
        let mut request = StrongRequest::Propose {
            group: 0,
            entry: machine::encode_entry(&batch).to_vec(),
        };
        let deadline = tokio::time::Instant::now() + STRONG_WRITE_TIMEOUT;
        loop {
            // Looked up again after a split turned the write away: a half takes it.
            let target = self.group_of_batch(&batch)?;
            if let StrongRequest::Propose { group, .. } = &mut request {
                *group = target.group.0;
            }
            match self.at_leader(&target, &request, deadline).await {
                Some(StrongReply::Applied) => return Ok(()),
                Some(StrongReply::Fenced) if tokio::time::Instant::now() < deadline => {}
                _ => return Err(write_timeout(consistency, 0, target.majority(), write_type)),
            }
        }
    }

    /// [`Self::at_leader`] for the tablet holding `token` of `table` as the tablet map has
    /// it at each attempt: a request a split's fence turned away goes to the half holding
    /// `token` once the split is done. Returns the group last asked and its answer.
    pub(crate) async fn at_tablet_leader(
        &self,
        (table, token): (&TableId, Token),
        request: impl Fn(GroupId) -> StrongRequest,
        deadline: tokio::time::Instant,
    ) -> Result<(TabletGroup, Option<StrongReply>), CqlError> {
        loop {
            let target = Self::group_for(&self.metadata.state(), table, token)?;
            let answer = self
                .at_leader(&target, &request(target.group), deadline)
                .await;
            if matches!(answer, Some(StrongReply::Fenced)) && tokio::time::Instant::now() < deadline
            {
                continue;
            }
            return Ok((target, answer));
        }
    }

    /// Runs `request` at the leader of `target`'s group — here, or sent to it — until
    /// `deadline`, and returns its answer (`None`: none in time). An answer of "not the
    /// leader" is followed to the leader it names; a read is asked again whatever kept it
    /// from an answer, a proposal only when nothing was appended.
    async fn at_leader(
        &self,
        target: &TabletGroup,
        request: &StrongRequest,
        deadline: tokio::time::Instant,
    ) -> Option<StrongReply> {
        let may_repeat = !matches!(request, StrongRequest::Propose { .. });
        let mut named = None;
        for attempt in 0.. {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            let answer = match self.whom_to_ask(target, named.take(), attempt).await {
                Some(leader) if leader == self.me => Ok(self.serve_until(request, deadline).await),
                Some(leader) => self.ask(leader, request.clone(), deadline).await,
                None => Ok(StrongReply::NotLeader { leader: None }),
            };
            match answer {
                Ok(StrongReply::NotLeader { leader }) => {
                    named = leader.map(HostId).filter(|l| target.members.contains(l));
                }
                // A split is ending: asked again until the tablet map has the halves (the
                // caller then routes to them), or the fence is lifted.
                Ok(StrongReply::Fenced) => {
                    tokio::time::sleep(FENCED_PAUSE).await;
                    if !self.still_placed(target) {
                        return Some(StrongReply::Fenced);
                    }
                    continue;
                }
                // The leader this node knew of is down or unreachable, and nothing was
                // appended: asked again, of whoever leads once the others elect one.
                Err(Unanswered::NotSent) => {}
                Err(Unanswered::NoReply) if may_repeat => {}
                Err(Unanswered::NoReply) => return None,
                Ok(other) => return Some(other),
            }
            if named.is_none() {
                // A group nobody leads any more (its tablet was split since): re-routed.
                if !self.still_placed(target) {
                    return Some(StrongReply::Fenced);
                }
                tokio::time::sleep(NO_LEADER_PAUSE).await;
            }
        }
        None
    }

    /// Proposes `entry` to `group` on this node and waits until `deadline` for it to be
    /// applied.
    async fn propose_here(
        &self,
        group: GroupId,
        entry: bytes::Bytes,
        deadline: tokio::time::Instant,
    ) -> StrongReply {
        match tokio::time::timeout_at(deadline, self.raft.propose(group, entry)).await {
            Ok(Ok(())) => StrongReply::Applied,
            Ok(Err(ProposeError::NotLeader(leader))) => StrongReply::NotLeader {
                leader: leader.map(|h| h.0),
            },
            // Another leader's entry took its index: this one was not applied.
            Ok(Err(ProposeError::Superseded)) => StrongReply::NotLeader { leader: None },
            // Committed after the group's fence: it changed nothing.
            Ok(Err(ProposeError::Refused)) => StrongReply::Fenced,
            Ok(Err(ProposeError::Stopped | ProposeError::Membership(_))) | Err(_) => {
                StrongReply::Unknown
            }
        }
    }

    /// The one group every cell of `batch` belongs to (looked up once per run of cells of
    /// one partition).
    fn group_of_batch(&self, batch: &WriteBatch) -> Result<TabletGroup, CqlError> {
        let state = self.metadata.state();
        let mut group: Option<TabletGroup> = None;
        let mut last = None;
        for (key, _) in batch.entries() {
            let partition = shoal_model::keys::table_and_token(key)
                .ok_or_else(|| CqlError::server("a write without a table and partition"))?;
            if last == Some(partition) {
                continue;
            }
            last = Some(partition);
            let this = Self::group_for(&state, &partition.0, partition.1)?;
            if group.as_ref().is_some_and(|g| g.group != this.group) {
                return Err(CqlError::invalid(
                    "A batch on a strongly consistent keyspace must stay within one partition's tablet",
                ));
            }
            group = Some(this);
        }
        group.ok_or_else(|| CqlError::server("an empty write"))
    }

    /// Reads `[lower, upper)` of the tablet holding `token` of `table`, linearizably.
    pub async fn read(
        &self,
        table: &TableId,
        token: Token,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
        consistency: Consistency,
    ) -> Result<(Cells, bool), CqlError> {
        match self
            .read_at_leader(table, token, (lower, upper, limit), false, consistency)
            .await?
        {
            StrongReply::Cells { cells, complete } => Ok((cells, complete)),
            other => Err(CqlError::server(format!("unexpected answer {other:?}"))),
        }
    }

    /// The last visible cells of `[lower, upper)` of the tablet holding `token` (at most
    /// `limit`), linearizably, and where they start when cut short.
    pub async fn read_before(
        &self,
        table: &TableId,
        token: Token,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
        consistency: Consistency,
    ) -> Result<(Cells, Option<Vec<u8>>), CqlError> {
        match self
            .read_at_leader(table, token, (lower, upper, limit), true, consistency)
            .await?
        {
            StrongReply::CellsBefore { cells, from } => Ok((cells, from)),
            other => Err(CqlError::server(format!("unexpected answer {other:?}"))),
        }
    }

    /// Reads `[lower, upper)` (at most `limit` cells, the last ones if `reverse`) at the
    /// leader of the group of the tablet holding `token`.
    async fn read_at_leader(
        &self,
        table: &TableId,
        token: Token,
        (lower, upper, limit): (&[u8], &[u8], u32),
        reverse: bool,
        consistency: Consistency,
    ) -> Result<StrongReply, CqlError> {
        let request = |group: GroupId| StrongRequest::Read {
            group: group.0,
            lower: lower.to_vec(),
            upper: upper.to_vec(),
            limit,
            reverse,
        };
        let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
        let (target, answer) = self
            .at_tablet_leader((table, token), request, deadline)
            .await?;
        match answer {
            Some(reply @ (StrongReply::Cells { .. } | StrongReply::CellsBefore { .. })) => {
                Ok(reply)
            }
            _ => Err(read_timeout(consistency, 0, target.majority(), false)),
        }
    }

    /// The leader's side of a read: once its read index is applied, its engine answers.
    async fn read_here(
        &self,
        group: GroupId,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
        reverse: bool,
    ) -> Option<StrongReply> {
        match self.raft.read_index(group).await {
            Ok(_) if reverse => {
                let (cells, from) = shoal_replication::replica::read_visible_before(
                    self.engine.as_ref(),
                    lower,
                    upper,
                    limit,
                )
                .ok()?;
                Some(StrongReply::CellsBefore { cells, from })
            }
            Ok(_) => {
                let (cells, complete) = shoal_replication::replica::read_visible(
                    self.engine.as_ref(),
                    lower,
                    upper,
                    limit,
                )
                .ok()?;
                Some(StrongReply::Cells { cells, complete })
            }
            Err(not_leader) => Some(StrongReply::NotLeader {
                leader: not_leader.leader.map(|h| h.0),
            }),
        }
    }

    /// Sends `request` to `leader` and returns its answer, or why there is none.
    async fn ask(
        &self,
        leader: HostId,
        request: StrongRequest,
        deadline: tokio::time::Instant,
    ) -> Result<StrongReply, Unanswered> {
        let leader_address = self
            .metadata
            .state()
            .member_by_host(&leader)
            .map(|m| m.internode_address);
        let Some(address) = leader_address else {
            return Err(Unanswered::NotSent);
        };
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        match self
            .peers
            .call(address, &Message::Strong(request), timeout)
            .await
        {
            Ok(Reply::Strong(reply)) => Ok(reply),
            Ok(other) => {
                tracing::debug!(%address, ?other, "a strongly consistent request was answered otherwise");
                Err(Unanswered::NoReply)
            }
            Err(CallError::NotSent(error)) => {
                tracing::debug!(%address, %error, "a strongly consistent request could not be sent");
                Err(Unanswered::NotSent)
            }
            Err(CallError::NoReply(error)) => {
                tracing::debug!(%address, %error, "a strongly consistent request got no answer");
                Err(Unanswered::NoReply)
            }
        }
    }

    /// Runs `request` on `node` (here or there), whatever its role in the group.
    pub async fn on_node(&self, node: HostId, request: StrongRequest) -> Option<StrongReply> {
        let deadline = Self::operation_deadline();
        if node == self.me {
            return Some(self.serve_until(&request, deadline).await);
        }
        self.ask(node, request, deadline).await.ok()
    }

    fn operation_deadline() -> tokio::time::Instant {
        tokio::time::Instant::now() + STRONG_WRITE_TIMEOUT
    }

    /// Stops the consensus runtime (its log is closed after the write under way).
    pub async fn stop(&self) {
        self.raft.stop().await;
    }
}

/// Scans of strong tables read each chunk at its tablet's leader, as point reads do.
impl shoal_replication::range::ChunkReader for StrongTables {
    fn read_chunk(
        &self,
        table: TableId,
        token: Token,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
        consistency: Consistency,
    ) -> futures::future::BoxFuture<'_, shoal_replication::range::ChunkAnswer> {
        Box::pin(async move {
            let (cells, complete) = self
                .read(&table, token, &lower, &upper, limit, consistency)
                .await?;
            // Cut short: the next chunk starts just after the last key.
            let resume = (!complete)
                .then(|| cells.last().map(|(key, _)| [key.as_slice(), &[0]].concat()))
                .flatten();
            Ok((cells, resume))
        })
    }

    fn read_chunk_before(
        &self,
        table: TableId,
        token: Token,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
        consistency: Consistency,
    ) -> futures::future::BoxFuture<'_, shoal_replication::range::ChunkAnswer> {
        Box::pin(async move {
            self.read_before(&table, token, &lower, &upper, limit, consistency)
                .await
        })
    }
}
