//! The batchlog: what makes a logged BATCH atomic across replica sets (Cassandra's
//! `db/batchlog`).
//!
//! A logged batch touching more than one partition is first written, whole, to the
//! batchlog of up to two other live nodes of this datacenter ([`StorageProxy::log_batch`]):
//! only then are its parts sent to their replicas, like any write. Once the consistency
//! level is met the batchlog entries are removed. If the coordinator dies in between, or a
//! part times out, the entries stay: every node replays the entries in its batchlog that
//! are older than [`REPLAY_AFTER`] ([`StorageProxy::replay_batches`]) — the batch is
//! applied everywhere in the end, or (if the batchlog write itself failed, `BATCH_LOG`
//! write timeout) nowhere.
//!
//! Entries live in the node's own engine under an internal table id
//! ([`BATCHLOG_TABLE_ID`]) as `BATCHLOG_TABLE_ID | written (µs) | batch id`, written
//! through the [`crate::WriteLog`] (as durable as any acknowledged write). Removal is a
//! tombstone one microsecond newer than the entry, never a synced range deletion; the
//! table's grace period is zero, so compaction drops both.
//!
//! Timeouts report Cassandra's write types: `BATCH_LOG` when the batchlog could not be
//! written, `BATCH` when it was (the driver may then rely on the batch being replayed),
//! `UNLOGGED_BATCH` for unlogged batches over several partitions, `SIMPLE` for one
//! partition (logged or not, which needs no batchlog).

use crate::consistency::{unavailable, WriteType, WRITE_TIMEOUT};
use crate::messages::{BatchId, Cells, ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use crate::topology::Replica;
use shoal_cql::request::Consistency;
use shoal_cql::{CqlError, ErrorCode};
use shoal_model::{keys, Cell, TableId, WriteTimestamp};
use shoal_storage::{Engine, WriteBatch};
use std::time::Duration;

/// The internal table id batchlog entries are stored under (after every user table,
/// before the hints).
pub const BATCHLOG_TABLE_ID: TableId = TableId([0xfe; 16]);

/// How old an entry must be before a node replays it: by then its coordinator has either
/// removed it or given up (Cassandra: twice the write timeout).
pub const REPLAY_AFTER: Duration = Duration::from_secs(2 * WRITE_TIMEOUT.as_secs());

/// Nodes that keep a copy of each logged batch.
const BATCHLOG_COPIES: usize = 2;

fn new_batch_id() -> BatchId {
    BatchId {
        written: shoal_model::timestamp::now_micros(),
        id: *uuid::Uuid::new_v4().as_bytes(),
    }
}

/// `BATCHLOG_TABLE_ID | written | id`: entries sort by age.
fn key_of(batch: &BatchId) -> Vec<u8> {
    let mut key = BATCHLOG_TABLE_ID.0.to_vec();
    key.extend_from_slice(&(batch.written as u64).to_be_bytes());
    key.extend_from_slice(&batch.id);
    key
}

fn batch_of_key(key: &[u8]) -> Option<BatchId> {
    let rest = key.strip_prefix(&BATCHLOG_TABLE_ID.0[..])?;
    let written = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?) as i64;
    let id = rest.get(8..24)?.try_into().ok()?;
    Some(BatchId { written, id })
}

/// The entry a replica stores for a logged batch (`payload`: its cells, serialized).
pub(crate) fn entry(batch: BatchId, payload: Vec<u8>) -> WriteBatch {
    let mut entry = WriteBatch::new();
    entry.merge(
        key_of(&batch),
        Cell::live(WriteTimestamp(batch.written), payload).encode(),
    );
    entry
}

/// The tombstone that removes a batch's entry.
pub(crate) fn removal(batch: BatchId) -> WriteBatch {
    let mut removal = WriteBatch::new();
    let now = shoal_model::timestamp::now_seconds();
    removal.merge(
        key_of(&batch),
        Cell::tombstone(WriteTimestamp(batch.written + 1), now).encode(),
    );
    removal
}

/// Every live entry of the batchlog in `engine` written at or before `written_before`
/// (µs), oldest first.
pub fn pending(engine: &dyn Engine, written_before: i64) -> Result<Vec<(BatchId, Cells)>, String> {
    let lower = BATCHLOG_TABLE_ID.0.to_vec();
    let upper = keys::increment_prefix(&lower).unwrap_or_default();
    let mut cursor = engine
        .scan(&lower, &upper, false)
        .map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    while let Some((key, value)) = cursor.current() {
        let batch = batch_of_key(key).ok_or("a malformed batchlog key")?;
        if batch.written > written_before {
            break;
        }
        let cell = Cell::decode(value).map_err(|e| e.to_string())?;
        if !cell.is_tombstone() {
            let cells: Cells = bincode::deserialize(&cell.value).map_err(|e| e.to_string())?;
            found.push((batch, cells));
        }
        cursor.advance();
    }
    Ok(found)
}

/// How many partitions the cells touch (cells of a partition come together).
fn partition_count(batch: &WriteBatch) -> usize {
    let mut count = 0;
    let mut previous: Option<&[u8]> = None;
    for (key, _) in batch.entries() {
        let partition = keys::split_at_partition_end(key).map(|(partition, _)| partition);
        if partition != previous {
            count += 1;
            previous = partition;
        }
    }
    count
}

impl StorageProxy {
    /// Applies a BATCH: a logged one over several partitions through the batchlog, others
    /// as one write with the write type Cassandra reports for them.
    pub async fn write_batch(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        logged: bool,
    ) -> Result<(), CqlError> {
        if partition_count(&batch) <= 1 {
            return self.write(batch, consistency, WriteType::Simple).await;
        }
        if !logged {
            return self
                .write(batch, consistency, WriteType::UnloggedBatch)
                .await;
        }
        let cells = batch.into_entries();
        let (logged_at, endpoints) = self.log_batch(&cells).await?;
        self.write(WriteBatch::from(cells), consistency, WriteType::Batch)
            .await?;
        // Applied at the level asked for (and the rest delivered or hinted): the entries
        // have done their job. Removing them is not worth the client's wait.
        for endpoint in endpoints {
            let removal = self.call(
                &endpoint,
                ReplicaRequest::RemoveBatch(logged_at),
                WRITE_TIMEOUT,
            );
            tokio::spawn(removal);
        }
        Ok(())
    }

    /// Writes `cells` to the batchlog of up to [`BATCHLOG_COPIES`] live nodes of this
    /// datacenter — the ones following this node in host id order, or this node alone in
    /// a cluster of one — and waits for every copy. A copy that fails is a `WriteTimeout`
    /// of write type `BATCH_LOG`: nothing of the batch has been applied.
    pub(crate) async fn log_batch(
        &self,
        cells: &Cells,
    ) -> Result<(BatchId, Vec<Replica>), CqlError> {
        let endpoints = self.batchlog_endpoints();
        if endpoints.is_empty() {
            return Err(unavailable(Consistency::One, 1, 0));
        }
        let batch = new_batch_id();
        let payload = bincode::serialize(cells).map_err(|e| CqlError::server(e.to_string()))?;
        let copies = endpoints.iter().map(|endpoint| {
            self.call(
                endpoint,
                ReplicaRequest::StoreBatch {
                    batch,
                    cells: payload.clone(),
                },
                WRITE_TIMEOUT,
            )
        });
        let results = futures::future::join_all(copies).await;
        let stored = results
            .iter()
            .filter(|r| matches!(r, Ok(ReplicaResponse::Applied)))
            .count();
        if stored < endpoints.len() {
            return Err(CqlError::new(
                ErrorCode::WriteTimeout {
                    consistency: if endpoints.len() == 1 {
                        Consistency::One.code()
                    } else {
                        Consistency::Two.code()
                    },
                    received: stored as i32,
                    block_for: endpoints.len() as i32,
                    write_type: WriteType::BatchLog.name().to_string(),
                },
                "Operation timed out - the batch could not be written to the batchlog",
            ));
        }
        Ok((batch, endpoints))
    }

    /// The nodes that keep this coordinator's batchlog copies.
    fn batchlog_endpoints(&self) -> Vec<Replica> {
        let state = self.topology.state();
        let me = self.topology.me();
        let mut others: Vec<Replica> = state
            .members
            .values()
            .filter(|m| m.host_id != me.host_id && m.datacenter == me.datacenter)
            .filter(|m| self.liveness.is_alive(&m.host_id))
            .map(|m| Replica::of(m, false, &state))
            .collect();
        others.sort_by_key(|r| r.host_id);
        // Start after this node, so coordinators spread their copies around the ring.
        let start = others
            .iter()
            .position(|r| r.host_id > me.host_id)
            .unwrap_or(0);
        others.rotate_left(start);
        others.truncate(BATCHLOG_COPIES);
        if others.is_empty() {
            return vec![Replica::of(me, true, &state)];
        }
        others
    }

    /// Replays every batch in this node's batchlog logged at least `older_than` ago: each
    /// is written again (at `ANY`: replicas that are down get hints) and its entry removed.
    /// Returns how many batches were replayed; a batch that cannot be written stays for
    /// the next round.
    pub async fn replay_batches(&self, older_than: Duration) -> Result<usize, String> {
        let before = shoal_model::timestamp::now_micros() - older_than.as_micros() as i64;
        let pending = pending(self.local.engine.as_ref(), before)?;
        let mut replayed = 0;
        for (batch, cells) in pending {
            if let Err(error) = self
                .write(WriteBatch::from(cells), Consistency::Any, WriteType::Batch)
                .await
            {
                tracing::debug!(%error.message, "batch replay failed; it stays in the batchlog");
                continue;
            }
            self.local
                .log
                .append(removal(batch))
                .await
                .map_err(|e| e.message)?;
            replayed += 1;
        }
        Ok(replayed)
    }
}
