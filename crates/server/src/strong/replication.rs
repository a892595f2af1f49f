//! The node's [`Replication`]: the tables of strongly consistent keyspaces through their
//! tablets' Raft groups ([`StrongTables`]), every other table through the leaderless
//! [`StorageProxy`]. Statement code sees one entrance and does not know which it got.

use super::conditional::StrongTurn;
use super::StrongTables;
use futures::future::BoxFuture;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, Token};
use shoal_replication::consistency::WriteType;
use shoal_replication::counter::CounterLeader;
use shoal_replication::index::{IndexLookup, LocalIndexes, VectorAnswer, VectorSearch};
use shoal_replication::paxos::{Ballot, PaxosKey, PreparedRound, ProposalOutcome};
use shoal_replication::paxos_lead::PaxosTurn;
use shoal_replication::range::{ChunkReader, ReplicatedView};
use shoal_replication::{
    Cells, CounterUpdate, PartitionRef, PartitionSource, Replica, Replication, ScanSource,
    StorageProxy,
};
use shoal_storage::{Engine, MemoryEngine, WriteBatch};
use std::sync::Arc;

pub struct NodeReplication {
    pub proxy: Arc<StorageProxy>,
    pub strong: Arc<StrongTables>,
}

/// What a statement that a strongly consistent keyspace does not take yet is told.
fn not_on_strong(what: &str) -> CqlError {
    CqlError::invalid(format!(
        "{what} on a table of a strongly consistent keyspace is not supported yet"
    ))
}

/// The strongly consistent table's turn in `turn` (made by [`Replication::paxos_turn`]).
fn strong_turn(turn: &mut PaxosTurn) -> Result<&mut StrongTurn, CqlError> {
    turn.held_mut::<StrongTurn>()
        .ok_or_else(|| CqlError::server("a conditional statement's turn was not taken"))
}

impl NodeReplication {
    fn strong_batch(&self, batch: &WriteBatch) -> bool {
        batch
            .entries()
            .first()
            .and_then(|(key, _)| TableId::of_key(key))
            .is_some_and(|table| self.strong.is_strong(&table))
    }
}

impl Replication for NodeReplication {
    fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: WriteType,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        if self.strong_batch(&batch) {
            return Box::pin(self.strong.write(batch, consistency, write_type));
        }
        Replication::write(self.proxy.as_ref(), batch, consistency, write_type)
    }

    fn write_batch(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        logged: bool,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        if self.strong_batch(&batch) {
            // One partition's tablet, one log entry: atomic whether logged or not.
            let write_type = if logged {
                WriteType::Batch
            } else {
                WriteType::UnloggedBatch
            };
            return Box::pin(self.strong.write(batch, consistency, write_type));
        }
        Replication::write_batch(self.proxy.as_ref(), batch, consistency, logged)
    }

    fn read_partitions<'a>(
        &'a self,
        table: TableId,
        partitions: &'a [PartitionRef],
        consistency: Consistency,
    ) -> BoxFuture<'a, Result<PartitionSource, CqlError>> {
        if !self.strong.is_strong(&table) {
            return Replication::read_partitions(
                self.proxy.as_ref(),
                table,
                partitions,
                consistency,
            );
        }
        Box::pin(async move {
            let merged = MemoryEngine::new();
            for (token, partition_key) in partitions {
                let lower = shoal_model::keys::partition_prefix(&table, *token, partition_key);
                let upper =
                    shoal_model::keys::increment_prefix(&lower).unwrap_or_else(|| vec![0xff; 64]);
                let (cells, complete) = self
                    .strong
                    .read(&table, *token, &lower, &upper, u32::MAX, consistency)
                    .await?;
                if !complete {
                    return Err(CqlError::server(
                        "a partition of a strongly consistent table too large to read whole",
                    ));
                }
                merged
                    .write(&WriteBatch::from(cells))
                    .map_err(|e| CqlError::server(e.to_string()))?;
            }
            Ok(PartitionSource::Merged(merged))
        })
    }

    fn after_local_read(self: Arc<Self>, table: TableId, partitions: Vec<PartitionRef>) {
        if !self.strong.is_strong(&table) {
            Replication::after_local_read(Arc::clone(&self.proxy), table, partitions);
        }
    }

    fn scan_source(
        self: Arc<Self>,
        table: TableId,
        consistency: Consistency,
        runtime: tokio::runtime::Handle,
    ) -> ScanSource {
        if self.strong.is_strong(&table) {
            let view = ReplicatedView::new(Arc::clone(&self.proxy), table, consistency, runtime)
                .reading_with(Arc::clone(&self.strong) as Arc<dyn ChunkReader>);
            return ScanSource::Replicated(Box::new(view));
        }
        Replication::scan_source(Arc::clone(&self.proxy), table, consistency, runtime)
    }

    fn truncate(&self, table: TableId) -> BoxFuture<'_, Result<(), CqlError>> {
        Replication::truncate(self.proxy.as_ref(), table)
    }

    fn local_engine(&self) -> &Arc<dyn Engine> {
        Replication::local_engine(self.proxy.as_ref())
    }

    fn apply_locally(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        Replication::apply_locally(self.proxy.as_ref(), batch)
    }

    fn local_host_id(&self) -> HostId {
        Replication::local_host_id(self.proxy.as_ref())
    }

    fn counter_leader(
        &self,
        table: TableId,
        token: Token,
        consistency: Consistency,
    ) -> Result<CounterLeader, CqlError> {
        if self.strong.is_strong(&table) {
            return Err(not_on_strong("A counter update"));
        }
        Replication::counter_leader(self.proxy.as_ref(), table, token, consistency)
    }

    fn forward_increment(
        &self,
        leader: Replica,
        block_for: usize,
        update: CounterUpdate,
    ) -> BoxFuture<'_, Result<(), CqlError>> {
        Replication::forward_increment(self.proxy.as_ref(), leader, block_for, update)
    }

    fn set_local_indexes(&self, indexes: Arc<dyn LocalIndexes>) {
        Replication::set_local_indexes(self.proxy.as_ref(), indexes)
    }

    fn set_scan_stage(&self, stage: Arc<dyn shoal_replication::ScanStage>) {
        Replication::set_scan_stage(self.proxy.as_ref(), stage)
    }

    fn index_candidates(
        &self,
        lookup: IndexLookup,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<Vec<PartitionRef>, CqlError>> {
        if self.strong.is_strong(&lookup.table) {
            return Box::pin(async { Err(not_on_strong("A secondary index query")) });
        }
        Replication::index_candidates(self.proxy.as_ref(), lookup, consistency)
    }

    fn vector_candidates(
        &self,
        search: VectorSearch,
        consistency: Consistency,
    ) -> BoxFuture<'_, Result<VectorAnswer, CqlError>> {
        if self.strong.is_strong(&search.table) {
            return Box::pin(async { Err(not_on_strong("A vector search")) });
        }
        Replication::vector_candidates(self.proxy.as_ref(), search, consistency)
    }

    fn paxos_turn<'a>(
        &'a self,
        key: &'a PaxosKey,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'a, PaxosTurn> {
        if self.strong.is_strong(&key.table) {
            // The turn is the partition's lock on the group's leader, taken by the prepare.
            let turn = PaxosTurn::held(StrongTurn::new(Arc::clone(&self.strong)));
            return Box::pin(async move { turn });
        }
        Replication::paxos_turn(self.proxy.as_ref(), key, deadline)
    }

    fn paxos_prepare<'a>(
        &'a self,
        key: &'a PaxosKey,
        serial: Consistency,
        deadline: tokio::time::Instant,
        turn: &'a mut PaxosTurn,
    ) -> BoxFuture<'a, Result<PreparedRound, CqlError>> {
        if self.strong.is_strong(&key.table) {
            return Box::pin(async move {
                let turn = strong_turn(turn)?;
                self.strong
                    .lock_partition(key, serial, deadline, turn)
                    .await
            });
        }
        Replication::paxos_prepare(self.proxy.as_ref(), key, serial, deadline, turn)
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
        if self.strong.is_strong(&key.table) {
            return Box::pin(async move {
                let turn = strong_turn(turn)?;
                self.strong.propose_locked(update, serial, turn).await
            });
        }
        Replication::paxos_propose(
            self.proxy.as_ref(),
            key,
            ballot,
            update,
            serial,
            consistency,
            turn,
        )
    }
}
