//! [`Replication`]: the one entrance statement code uses to reach a table's data, whatever
//! replicates it. Two strategies implement it today:
//!
//! - [`StorageProxy`] — leaderless replication by tablet at the request's consistency
//!   level (every real node, including a cluster of one);
//! - [`LocalReplication`] — this node's engine alone, replication factor 1 (embedded use
//!   and the coordinator's unit tests).
//!
//! Per-tablet Raft for strongly consistent tables will be a third, chosen per keyspace
//! without touching statement code.

use crate::barrier::TopologyGuard;
use crate::consistency::{unavailable, WriteType};
use crate::counter::CounterLeader;
use crate::index::{IndexLookup, VectorAnswer, VectorSearch};
use crate::messages::{Cells, CounterUpdate, PartitionRef, ReplicaRequest, ReplicaResponse};
use crate::paxos::{self, Ballot, PaxosKey, PreparedRound, ProposalOutcome};
use crate::paxos_lead::PaxosTurn;
use crate::proxy::StorageProxy;
use crate::range::ReplicatedView;
use crate::read::PartitionSource;
use crate::replica::LocalReplica;
use crate::topology::{Replica, TabletReplicas};
use futures::future::BoxFuture;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, Token};
use shoal_schema::SchemaStore;
use shoal_storage::{Engine, WriteBatch};
use std::sync::Arc;

/// Where a scan reads.
pub enum ScanSource {
    /// This node's engine.
    Local,
    /// A view across the table's replicas.
    Replicated(Box<ReplicatedView>),
}

impl ScanSource {
    /// The source with its chunks served in the turn of `scan` on every replica.
    pub fn in_turn_of(self, scan: crate::messages::ScanTicket, cells_per_row: u32) -> ScanSource {
        match self {
            ScanSource::Replicated(view) => {
                ScanSource::Replicated(Box::new((*view).in_turn_of(scan, cells_per_row)))
            }
            ScanSource::Local => ScanSource::Local,
        }
    }
}

/// How a table's data reaches its replicas.
pub trait Replication: Send + Sync + 'static {
    /// Applies `batch` and waits until `consistency` is met.
    fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: WriteType,
    ) -> BoxFuture<'_, Result<(), CqlError>>;

    /// Applies a BATCH's cells and waits until `consistency` is met; a `logged` batch is
    /// applied everywhere or nowhere (see [`crate::batchlog`]).
    fn write_batch(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        logged: bool,
    ) -> BoxFuture<'_, Result<(), CqlError>>;

    /// Where the named partitions of `table` are read at `consistency`.
    fn read_partitions<'a>(
        &'a self,
        table: TableId,
        partitions: &'a [PartitionRef],
        consistency: Consistency,
    ) -> BoxFuture<'a, Result<PartitionSource, CqlError>>;

    /// Tells the strategy a read of these partitions was answered from this node's
    /// engine (it may compare the replicas in the background).
    fn after_local_read(self: Arc<Self>, table: TableId, partitions: Vec<PartitionRef>);

    /// Where a scan of `table` at `consistency` reads (called on the scan stage).
    fn scan_source(
        self: Arc<Self>,
        table: TableId,
        consistency: Consistency,
        runtime: tokio::runtime::Handle,
    ) -> ScanSource;

    /// Removes every cell of `table` wherever it is stored.
    fn truncate(&self, table: TableId) -> BoxFuture<'_, Result<(), CqlError>>;

    /// This node's own engine (what [`PartitionSource::Local`] and [`ScanSource::Local`]
    /// read).
    fn local_engine(&self) -> &Arc<dyn Engine>;

    /// Applies `batch` to this node's storage alone, through its commit log (a counter
    /// leader's own shards, before they are replicated).
    fn apply_locally(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>>;

    /// This node's host id: the cell path of the counter shards it leads.
    fn local_host_id(&self) -> HostId;

    /// Which replica leads increments of `token` in `table` at `consistency`.
    fn counter_leader(
        &self,
        table: TableId,
        token: Token,
        consistency: Consistency,
    ) -> Result<CounterLeader, CqlError>;

    /// Sends increments to their leader on another node and waits for its answer.
    fn forward_increment(
        &self,
        leader: Replica,
        block_for: usize,
        update: CounterUpdate,
    ) -> BoxFuture<'_, Result<(), CqlError>>;

    /// Keeps this node's secondary indexes in step with every write it applies as a
    /// replica ([`crate::index`]).
    fn set_local_indexes(&self, indexes: Arc<dyn crate::index::LocalIndexes>);

    /// Serves the chunks of scans this node is asked for in their turn on `stage` (the
    /// read scheduler's read threads).
    fn set_scan_stage(&self, stage: Arc<dyn crate::replica::ScanStage>);

    /// Base partitions with an entry for a value in a secondary index, in token order
    /// from `lookup.from`, as seen by enough replicas for `consistency`.
    fn index_candidates(
        &self,
        lookup: IndexLookup,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<Vec<PartitionRef>, CqlError>>;

    /// The partitions nearest to a vector across the table, best first: each run of
    /// tablets searched on as many replicas as `consistency` needs, merged by score.
    fn vector_candidates(
        &self,
        search: VectorSearch,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<VectorAnswer, CqlError>>;

    /// The turn a conditional statement on `key`'s partition waits for before its rounds
    /// (until `deadline`; one that has not come by then is passed, and the prepare then
    /// times out): the transactions on one partition take turns — on its leader when that
    /// is another node ([`crate::paxos_lead`]), here otherwise.
    fn paxos_turn<'a>(
        &'a self,
        key: &'a PaxosKey,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, PaxosTurn>;

    /// Begins a lightweight transaction's round on one partition ([`crate::paxos`]): a
    /// ballot a quorum of its replicas promised (`serial` picks the quorum), with every
    /// earlier decision settled. Retries under contention until `deadline`. Runs under
    /// the transaction's `turn` ([`Replication::paxos_turn`]).
    fn paxos_prepare<'a>(
        &'a self,
        key: &'a PaxosKey,
        serial: Consistency,
        deadline: tokio::time::Instant,
        turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<PreparedRound, CqlError>>;

    /// Proposes `update` (written with the prepared round's ballot as timestamp) and
    /// commits it, waiting for `consistency`.
    fn paxos_propose<'a>(
        &'a self,
        key: &'a PaxosKey,
        ballot: Ballot,
        update: Cells,
        serial: Consistency,
        consistency: Consistency,
        turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<ProposalOutcome, CqlError>>;
}

impl Replication for StorageProxy {
    fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: WriteType,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(StorageProxy::write(self, batch, consistency, write_type))
    }

    fn write_batch(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        logged: bool,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(StorageProxy::write_batch(self, batch, consistency, logged))
    }

    fn read_partitions<'a>(
        &'a self,
        table: TableId,
        partitions: &'a [PartitionRef],
        consistency: Consistency,
    ) -> BoxFuture<'a, Result<PartitionSource, CqlError>> {
        Box::pin(StorageProxy::read_partitions(
            self,
            table,
            partitions,
            consistency,
        ))
    }

    fn after_local_read(self: Arc<Self>, table: TableId, partitions: Vec<PartitionRef>) {
        StorageProxy::after_local_read(&self, table, partitions)
    }

    fn scan_source(
        self: Arc<Self>,
        table: TableId,
        consistency: Consistency,
        runtime: tokio::runtime::Handle,
    ) -> ScanSource {
        if self.member_count() < 2 {
            return ScanSource::Local;
        }
        ScanSource::Replicated(Box::new(ReplicatedView::new(
            self,
            table,
            consistency,
            runtime,
        )))
    }

    fn truncate(&self, table: TableId) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(StorageProxy::truncate(self, table))
    }

    fn local_engine(&self) -> &Arc<dyn Engine> {
        &self.local.engine
    }

    fn apply_locally(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        self.local.log.append(batch)
    }

    fn local_host_id(&self) -> HostId {
        self.topology.me().host_id
    }

    fn counter_leader(
        &self,
        table: TableId,
        token: Token,
        consistency: Consistency,
    ) -> Result<CounterLeader, CqlError> {
        StorageProxy::counter_leader(self, table, token, consistency)
    }

    fn forward_increment(
        &self,
        leader: Replica,
        block_for: usize,
        update: CounterUpdate,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(
            async move { StorageProxy::forward_increment(self, &leader, block_for, update).await },
        )
    }

    fn set_local_indexes(&self, indexes: Arc<dyn crate::index::LocalIndexes>) {
        self.local.set_indexes(indexes);
    }

    fn set_scan_stage(&self, stage: Arc<dyn crate::replica::ScanStage>) {
        self.local.set_scan_stage(stage);
    }

    fn index_candidates(
        &self,
        lookup: IndexLookup,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<Vec<PartitionRef>, CqlError>> {
        Box::pin(StorageProxy::index_candidates(self, lookup, consistency))
    }

    fn vector_candidates(
        &self,
        search: VectorSearch,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<VectorAnswer, CqlError>> {
        Box::pin(StorageProxy::vector_candidates(self, search, consistency))
    }

    fn paxos_turn<'a>(
        &'a self,
        key: &'a PaxosKey,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, PaxosTurn> {
        Box::pin(StorageProxy::paxos_turn(self, key, deadline))
    }

    fn paxos_prepare<'a>(
        &'a self,
        key: &'a PaxosKey,
        serial: Consistency,
        deadline: tokio::time::Instant,
        turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<PreparedRound, CqlError>> {
        Box::pin(async move {
            let _in_flight = self.enter();
            self.prepare_under(key, serial, deadline, turn).await
        })
    }

    fn paxos_propose<'a>(
        &'a self,
        key: &'a PaxosKey,
        ballot: Ballot,
        update: Cells,
        serial: Consistency,
        consistency: Consistency,
        turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<ProposalOutcome, CqlError>> {
        Box::pin(async move {
            let _in_flight = self.enter();
            self.propose_under(key, ballot, update, serial, consistency, turn)
                .await
        })
    }
}

/// This node alone: every table has replication factor 1 here, so a level needing more
/// than one replica is `Unavailable` for keyspaces that ask for more.
pub struct LocalReplication {
    local: Arc<LocalReplica>,
    schema: Arc<SchemaStore>,
    ballots: paxos::BallotClock,
    /// Turns of the lightweight transactions on each partition.
    paxos_turns: paxos::PartitionTurns,
}

impl LocalReplication {
    pub fn new(local: LocalReplica, schema: Arc<SchemaStore>) -> LocalReplication {
        LocalReplication {
            local: Arc::new(local),
            schema,
            ballots: paxos::BallotClock::default(),
            paxos_turns: paxos::PartitionTurns::default(),
        }
    }

    /// `Unavailable` when `consistency` needs more replicas than this one node.
    fn check(&self, table: Option<TableId>, consistency: Consistency) -> Result<(), CqlError> {
        if consistency == Consistency::Any {
            return Ok(());
        }
        let schema = self.schema.current();
        let factor = table
            .and_then(|table| schema.keyspace_of_table(&table))
            .map_or(1, |keyspace| keyspace.replication_factor());
        let required = consistency.required_replicas(factor);
        if required > 1 {
            return Err(unavailable(consistency, required, 1));
        }
        Ok(())
    }
}

impl Replication for LocalReplication {
    fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        _write_type: WriteType,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        let table = batch
            .entries()
            .first()
            .and_then(|(key, _)| TableId::of_key(key));
        Box::pin(async move {
            self.check(table, consistency)?;
            self.local.log.append(batch).await
        })
    }

    /// One node, one engine write: a batch is atomic without a batchlog.
    fn write_batch(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        _logged: bool,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        self.write(batch, consistency, WriteType::Batch)
    }

    fn read_partitions<'a>(
        &'a self,
        table: TableId,
        _partitions: &'a [PartitionRef],
        consistency: Consistency,
    ) -> BoxFuture<'a, Result<PartitionSource, CqlError>> {
        let checked = self.check(Some(table), consistency);
        Box::pin(async move { checked.map(|()| PartitionSource::Local(TopologyGuard::detached())) })
    }

    fn after_local_read(self: Arc<Self>, _table: TableId, _partitions: Vec<PartitionRef>) {}

    fn scan_source(
        self: Arc<Self>,
        _table: TableId,
        _consistency: Consistency,
        _runtime: tokio::runtime::Handle,
    ) -> ScanSource {
        ScanSource::Local
    }

    fn truncate(&self, table: TableId) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(async move {
            self.local
                .truncate(table)
                .await
                .map_err(|e| CqlError::server(format!("could not remove the table's data: {e}")))
        })
    }

    fn local_engine(&self) -> &Arc<dyn Engine> {
        &self.local.engine
    }

    fn apply_locally(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        self.local.log.append(batch)
    }

    /// One node without a cluster: its shards need only be told apart from nothing.
    fn local_host_id(&self) -> HostId {
        HostId([0; 16])
    }

    fn counter_leader(
        &self,
        table: TableId,
        _token: Token,
        consistency: Consistency,
    ) -> Result<CounterLeader, CqlError> {
        self.check(Some(table), consistency)?;
        Ok(CounterLeader::Here)
    }

    fn forward_increment(
        &self,
        _leader: Replica,
        _block_for: usize,
        _update: CounterUpdate,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(async { Err(CqlError::server("one node has no other counter leader")) })
    }

    fn set_local_indexes(&self, indexes: Arc<dyn crate::index::LocalIndexes>) {
        self.local.set_indexes(indexes);
    }

    fn set_scan_stage(&self, stage: Arc<dyn crate::replica::ScanStage>) {
        self.local.set_scan_stage(stage);
    }

    fn index_candidates(
        &self,
        lookup: IndexLookup,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<Vec<PartitionRef>, CqlError>> {
        let found = self.check(Some(lookup.table), consistency).and_then(|()| {
            self.local
                .lookup(&lookup, Token::MAX)
                .map_err(CqlError::invalid)
        });
        Box::pin(async move { found })
    }

    fn vector_candidates(
        &self,
        search: VectorSearch,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<VectorAnswer, CqlError>> {
        let found = self
            .check(Some(search.table), consistency)
            .and_then(|()| self.local.vector_search(&search).map_err(CqlError::invalid));
        Box::pin(async move { found })
    }

    fn paxos_turn<'a>(
        &'a self,
        key: &'a PaxosKey,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, PaxosTurn> {
        Box::pin(async move { PaxosTurn::local(self.paxos_turns.wait(key, deadline).await) })
    }

    fn paxos_prepare<'a>(
        &'a self,
        key: &'a PaxosKey,
        serial: Consistency,
        deadline: tokio::time::Instant,
        _turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<PreparedRound, CqlError>> {
        Box::pin(paxos::prepare(self, key, serial, deadline))
    }

    fn paxos_propose<'a>(
        &'a self,
        key: &'a PaxosKey,
        ballot: Ballot,
        update: Cells,
        serial: Consistency,
        consistency: Consistency,
        _turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<ProposalOutcome, CqlError>> {
        Box::pin(paxos::propose(
            self,
            key,
            ballot,
            update,
            serial,
            consistency,
        ))
    }
}

/// One node is every partition's only participant.
impl paxos::PaxosNetwork for LocalReplication {
    fn replicas(&self, key: &PaxosKey, serial: Consistency) -> Result<TabletReplicas, CqlError> {
        self.check(Some(key.table), serial)?;
        Ok(TabletReplicas {
            replicas: vec![Replica {
                host_id: HostId([0; 16]),
                address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
                datacenter: String::new(),
                local: true,
                alive: true,
                topology_version: 0,
            }],
            strategy: None,
            new: None,
            wait_for_new: false,
        })
    }

    /// The one replica's datacenter (it has no name here).
    fn local_datacenter(&self) -> &str {
        ""
    }

    fn call(
        &self,
        _replica: &Replica,
        request: ReplicaRequest,
        _timeout: std::time::Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>> {
        let local = Arc::clone(&self.local);
        Box::pin(async move {
            match local.serve(request).await {
                ReplicaResponse::Error(error) => Err(error),
                response => Ok(response),
            }
        })
    }

    fn ballots(&self) -> (&paxos::BallotClock, u64) {
        (&self.ballots, 1)
    }
}
