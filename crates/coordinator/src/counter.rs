//! Counter increments (design: `docs/decisions/0010-counters.md`).
//!
//! A counter column holds one cell per *shard*: the cell path is the host id of the
//! replica owning the shard, the value its running total (big-endian `i64`) and the cell's
//! timestamp the shard's clock; the counter's value is the sum of its live shards
//! ([`counter_value`]). Shards reconcile by last-write-wins like every other cell, so hints,
//! read repair and repair carry them without special cases and never double-count.
//!
//! Statement code builds an UPDATE of a counter table like any other write, except that a
//! counter assignment writes a *delta cell* (the column's key with an empty path and the
//! delta as its value) into the batch. [`Coordinator::increment`] takes those deltas, groups
//! them by partition and has each partition's leader apply them
//! ([`Coordinator::lead_increment`]): under a lock per shard it reads its own shard from its
//! local storage, adds the delta, writes the new total with a later clock through its
//! commit log, and then sends the new shard to every replica at the request's level.

use crate::{Coordinator, CqlError};
use shoal_cql::request::Consistency;
use shoal_model::{keys, Cell, HostId, TableId, Token, WriteTimestamp};
use shoal_replication::counter::CounterLeader;
use shoal_replication::{CounterUpdate, WriteType};
use shoal_storage::WriteBatch;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Locks held while a leader reads and advances a shard, striped by shard key: two
/// increments of one counter on one leader are applied one after the other, each building
/// on the other's total.
pub(crate) struct CounterLocks {
    stripes: Vec<Arc<tokio::sync::Mutex<()>>>,
}

const COUNTER_LOCK_STRIPES: usize = 1024;

impl Default for CounterLocks {
    fn default() -> CounterLocks {
        CounterLocks {
            stripes: (0..COUNTER_LOCK_STRIPES)
                .map(|_| Arc::new(tokio::sync::Mutex::new(())))
                .collect(),
        }
    }
}

impl CounterLocks {
    /// Locks the stripes of `keys`, in stripe order (so two leaders' sets never deadlock).
    async fn lock<'a>(
        &self,
        keys: impl Iterator<Item = &'a [u8]>,
    ) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let mut stripes: Vec<usize> = keys
            .map(|key| {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                key.hash(&mut hasher);
                (hasher.finish() % COUNTER_LOCK_STRIPES as u64) as usize
            })
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for stripe in stripes {
            guards.push(Arc::clone(&self.stripes[stripe]).lock_owned().await);
        }
        guards
    }
}

/// A counter's value: the sum of its shards' totals (wrapping, as Cassandra's `long`).
pub(crate) fn counter_value<'a>(shards: impl Iterator<Item = &'a Cell>) -> i64 {
    shards
        .filter_map(|cell| <[u8; 8]>::try_from(cell.value.as_slice()).ok())
        .map(i64::from_be_bytes)
        .fold(0i64, i64::wrapping_add)
}

/// A counter delta cell's value: the delta, big-endian.
pub(crate) fn delta_bytes(delta: i64) -> Vec<u8> {
    delta.to_be_bytes().to_vec()
}

/// A partition: its table, token and serialized key.
type PartitionAddress = (TableId, Token, Vec<u8>);

/// One counter column of one row, as a delta cell's key names it.
struct ShardAddress<'a> {
    token: Token,
    partition_key: std::borrow::Cow<'a, [u8]>,
    /// `None` for the static row.
    clustering: Option<&'a [u8]>,
    /// The key up to the column part.
    row: &'a [u8],
    column: String,
}

fn shard_address(key: &[u8]) -> Result<ShardAddress<'_>, CqlError> {
    let malformed = || CqlError::server("malformed counter delta key");
    let (token, partition_key, rest) = keys::split_partition(key).ok_or_else(malformed)?;
    let (section, clustering, column_part) = keys::split_row_key(rest).ok_or_else(malformed)?;
    let keys::ColumnPart::Cell { column, .. } =
        keys::parse_column_part(column_part).ok_or_else(malformed)?
    else {
        return Err(malformed());
    };
    let row_length = key.len() - column_part.len() - 2;
    Ok(ShardAddress {
        token,
        partition_key,
        clustering: (section == keys::SECTION_ROW).then_some(clustering),
        row: &key[..row_length],
        column: String::from_utf8_lossy(column).into_owned(),
    })
}

impl Coordinator {
    /// Applies the counter delta cells of `batch` at `consistency`: each partition's deltas
    /// go to its leader (this node or another replica), all partitions at once.
    pub(crate) async fn increment(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
    ) -> Result<(), CqlError> {
        // Deltas by partition, each counter's deltas summed.
        let mut partitions: BTreeMap<PartitionAddress, BTreeMap<Vec<u8>, i64>> = BTreeMap::new();
        for (key, value) in batch.into_entries() {
            let cell = Cell::decode(&value).map_err(|e| CqlError::server(e.0))?;
            let delta = <[u8; 8]>::try_from(cell.value.as_slice())
                .map(i64::from_be_bytes)
                .map_err(|_| CqlError::server("malformed counter delta"))?;
            let table = TableId::of_key(&key).ok_or_else(|| CqlError::server("bad key"))?;
            let address = shard_address(&key)?;
            let partition = (table, address.token, address.partition_key.to_vec());
            let sum = partitions
                .entry(partition)
                .or_default()
                .entry(key)
                .or_default();
            *sum = sum.wrapping_add(delta);
        }
        let updates = partitions.into_iter().map(|((table, token, _), deltas)| {
            let update = CounterUpdate {
                deltas: deltas.into_iter().collect(),
                consistency: consistency.code(),
            };
            async move {
                match self.replication.counter_leader(table, token, consistency)? {
                    CounterLeader::Here => self.lead_increment(update).await,
                    CounterLeader::Elsewhere { replica, block_for } => {
                        self.replication
                            .forward_increment(replica, block_for, update)
                            .await
                    }
                }
            }
        });
        for result in futures::future::join_all(updates).await {
            result?;
        }
        Ok(())
    }

    /// As the leader of a partition: adds each delta to this node's shard of its counter
    /// and writes the new shards to the replicas at the update's consistency level.
    pub async fn lead_increment(&self, update: CounterUpdate) -> Result<(), CqlError> {
        let consistency = Consistency::from_code(update.consistency)?;
        // A forwarded update was routed by the sender's view: this node must still hold
        // the partition (its shard builds on what it stores).
        if let Some((key, _)) = update.deltas.first() {
            let table = TableId::of_key(key).ok_or_else(|| CqlError::server("bad key"))?;
            let address = shard_address(key)?;
            if let CounterLeader::Elsewhere { .. } =
                self.replication
                    .counter_leader(table, address.token, consistency)?
            {
                return Err(CqlError::server(
                    "this node is not a replica of the counter's partition",
                ));
            }
        }
        let host = self.replication.local_host_id();
        let schema = self.schema();
        let mut shards = WriteBatch::new();
        {
            let _locked = self
                .counter_locks
                .lock(update.deltas.iter().map(|(key, _)| key.as_slice()))
                .await;
            let engine = self.replication.local_engine();
            for (key, delta) in &update.deltas {
                let address = shard_address(key)?;
                let table_id = TableId::of_key(key).ok_or_else(|| CqlError::server("bad key"))?;
                let keyspace = schema
                    .keyspace_of_table(&table_id)
                    .ok_or_else(|| CqlError::invalid("the counter's table no longer exists"))?;
                let table = keyspace
                    .tables
                    .values()
                    .find(|t| t.id == table_id)
                    .ok_or_else(|| CqlError::invalid("the counter's table no longer exists"))?;
                let row = crate::select::read_single_row(
                    engine.as_ref(),
                    table,
                    address.token,
                    &address.partition_key,
                    address.clustering,
                )?;
                let own_shard = row
                    .and_then(|row| row.columns.into_iter().find(|c| c.name == address.column))
                    .and_then(|column| {
                        column
                            .cells
                            .into_iter()
                            .find(|(path, _)| path.as_slice() == host.as_bytes())
                    })
                    .map(|(_, cell)| cell);
                let (total, clock) = match &own_shard {
                    Some(cell) => (counter_value(std::iter::once(cell)), cell.timestamp.0),
                    None => (0, i64::MIN),
                };
                let clock = WriteTimestamp::now().0.max(clock.saturating_add(1));
                let mut shard_key = address.row.to_vec();
                keys::push_column_part(&mut shard_key, |k| {
                    keys::push_cell_column(k, &address.column, shard_path(&host))
                });
                let cell = Cell::live(
                    WriteTimestamp(clock),
                    total.wrapping_add(*delta).to_be_bytes().to_vec(),
                );
                shards.merge(shard_key, cell.encode());
            }
            // Durable here before the lock is released: the next increment builds on it.
            self.replication.apply_locally(shards.clone()).await?;
        }
        self.replication
            .write(shards, consistency, WriteType::Counter)
            .await
    }
}

/// The cell path of `host`'s shard.
fn shard_path(host: &HostId) -> &[u8] {
    host.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_the_sum_of_its_shards() {
        let shard = |total: i64| Cell::live(WriteTimestamp(1), total.to_be_bytes().to_vec());
        let shards = [shard(5), shard(-2), shard(10)];
        assert_eq!(counter_value(shards.iter()), 13);
        assert_eq!(counter_value(std::iter::empty()), 0);
        let wrapping = [shard(i64::MAX), shard(1)];
        assert_eq!(counter_value(wrapping.iter()), i64::MIN);
    }

    #[test]
    fn a_delta_key_names_its_row_and_column() {
        let table = TableId::random();
        let mut key = keys::partition_prefix(&table, Token(42), b"pk");
        key.push(keys::SECTION_ROW);
        key.extend_from_slice(b"clustering");
        let row_length = key.len();
        keys::push_column_part(&mut key, |k| keys::push_cell_column(k, "views", b""));
        let address = shard_address(&key).unwrap();
        assert_eq!(address.token, Token(42));
        assert_eq!(&*address.partition_key, b"pk");
        assert_eq!(address.clustering, Some(&b"clustering"[..]));
        assert_eq!(address.row.len(), row_length);
        assert_eq!(address.column, "views");
    }
}
