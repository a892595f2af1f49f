//! Writes: a batch of cells split by tablet, each part sent to every replica of its
//! tablet, acknowledged once the consistency level is met. While a tablet moves, its part
//! goes to the old and the new replica set. The level must be met in the old set; in the
//! new one too from the move's `Streamed` stage on, so a write acknowledged then is on
//! enough replicas whichever set reads use. While the data streams (`WriteBoth`) the
//! pending replica is not waited for: every delivery that does not reach a replica is
//! counted ([`crate::barrier::MissedDeliveries`]), and the barrier of `Streamed` tells the
//! migration whether the pending replica missed any (`shoal_placement::tablet`).
//!
//! Before anything is sent, every part's live replicas must be able to meet the level
//! (`Unavailable` otherwise). A replica the failure detector calls down gets the part as a
//! hint; a replica that fails or does not answer gets it as a hint too. At `ANY` a hint
//! counts as an acknowledgement only once it is stored: a hint refused (the replica is
//! down past the hint window, the hints are full, the write failed) counts for nothing,
//! and with no replica and no hint the write times out with nothing received. The client is
//! answered as soon as the level is met; deliveries still on their way finish in the
//! background. Without enough acknowledgements within [`WRITE_TIMEOUT`] the answer is
//! `WriteTimeout` with the count received.
//!
//! A counter write ([`WriteType::Counter`]) comes from the increment's leader, which wrote
//! the new shards through its own log first: that replica counts as acknowledged without
//! applying them twice.

use crate::barrier::TopologyGuard;
use crate::consistency::{write_timeout, WriteType, WRITE_TIMEOUT};
use crate::messages::Cells;
use crate::proxy::StorageProxy;
use crate::topology::{check_writable, requirement, Replica, TabletReplicas};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use shoal_cluster::ClusterState;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, HostId};
use shoal_storage::WriteBatch;
use smallvec::SmallVec;
use std::sync::Arc;

/// A write slower than this to meet its consistency level is logged (at debug level).
const SLOW_WRITE: std::time::Duration = std::time::Duration::from_millis(1);

/// The datacenters of the replicas of `set` that acknowledged.
fn acknowledged_in<'s>(acknowledged: &[HostId], set: &'s [Replica]) -> SmallVec<[&'s str; 8]> {
    acknowledged
        .iter()
        .filter_map(|host| set.iter().find(|r| r.host_id == *host))
        .map(|replica| replica.datacenter.as_str())
        .collect()
}

/// Whether two storage keys are of the same partition (the same table and token).
fn same_partition(one: &[u8], other: &[u8]) -> bool {
    one.get(..keys::TOKEN_PREFIX_LENGTH) == other.get(..keys::TOKEN_PREFIX_LENGTH)
}

/// The outcome of sending one part of a write to one replica.
enum Delivery {
    Acknowledged(HostId),
    Hinted(HostId),
    NotHinted(HostId),
    Failed(HostId, Cells),
}

impl Delivery {
    /// The replica this delivery did not reach, if it did not: hinted or not, every
    /// delivery short of an acknowledgement is one a barrier counts as missed
    /// ([`crate::barrier::MissedDeliveries`]).
    fn missed(&self) -> Option<HostId> {
        match self {
            Delivery::Acknowledged(_) => None,
            Delivery::Hinted(host) | Delivery::NotHinted(host) | Delivery::Failed(host, _) => {
                Some(*host)
            }
        }
    }
}

impl StorageProxy {
    /// Applies `batch` on the replicas of its tablets and waits for `consistency`.
    pub async fn write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: WriteType,
    ) -> Result<(), CqlError> {
        // Taken before the tablet map is read, held until every replica has answered.
        let in_flight = self.enter();
        let state = self.topology.state();
        let mut groups = self.group_by_replicas(&state, batch.into_entries())?;
        // Check every group (both sets of a moving tablet) before sending anything.
        for (replicas, _) in &groups {
            check_writable(self.local_datacenter(), consistency, replicas)?;
        }
        shoal_trace::event(|| {
            let replicas: Vec<String> = groups
                .iter()
                .map(|(replicas, cells)| {
                    let hosts: Vec<String> = replicas
                        .targets()
                        .iter()
                        .map(|r| format!("/{}", r.address.ip()))
                        .collect();
                    format!("{} cells to [{}]", cells.len(), hosts.join(", "))
                })
                .collect();
            format!("Writing at {}: {}", consistency.name(), replicas.join("; "))
        });
        let only_local = matches!(groups.as_slice(), [(replicas, _)]
            if replicas.new.is_none()
                && matches!(replicas.replicas.as_slice(), [only] if only.local));
        if only_local && write_type == WriteType::Counter {
            // A counter leader's shards: already in this node's log (see write_group).
            return Ok(());
        }
        if only_local {
            if let Some((_, cells)) = groups.pop() {
                // This node is the only replica: nothing to wait for but its own log,
                // whose error (a poisoned log, say) is the client's.
                return self.local.apply(cells).await;
            }
        }
        let waits = groups.into_iter().map(|(replicas, cells)| {
            self.write_group(replicas, cells, consistency, write_type, in_flight.clone())
        });
        for result in futures::future::join_all(waits).await {
            result?;
        }
        Ok(())
    }

    /// The cells of a batch grouped by the replica set of their tablet. Cells of one
    /// partition come together (a statement writes one partition at a time), so replicas
    /// are looked up once per run of cells with the same table and token; a batch of one
    /// partition, what most statements write, is one group with its cells as they came.
    fn group_by_replicas(
        &self,
        state: &ClusterState,
        entries: Cells,
    ) -> Result<Vec<(TabletReplicas, Cells)>, CqlError> {
        let Some((first, _)) = entries.first() else {
            return Ok(Vec::new());
        };
        if entries.iter().all(|(key, _)| same_partition(key, first)) {
            let replicas = self.replicas_of_key(state, first)?;
            return Ok(vec![(replicas, entries)]);
        }
        let mut groups: Vec<(TabletReplicas, Cells)> = Vec::new();
        let mut current: Option<usize> = None;
        for (key, value) in entries {
            let same_partition = current.is_some_and(|index| {
                groups[index]
                    .1
                    .last()
                    .is_some_and(|(previous, _)| same_partition(previous, &key))
            });
            if !same_partition {
                let replicas = self.replicas_of_key(state, &key)?;
                let same_replicas =
                    |(other, _): &(TabletReplicas, Cells)| other.same_hosts(&replicas);
                current = Some(match groups.iter().position(same_replicas) {
                    Some(index) => index,
                    None => {
                        groups.push((replicas, Vec::new()));
                        groups.len() - 1
                    }
                });
            }
            if let Some(index) = current {
                groups[index].1.push((key, value));
            }
        }
        Ok(groups)
    }

    /// The replicas a write of the cell stored under `key` goes to.
    fn replicas_of_key(
        &self,
        state: &ClusterState,
        key: &[u8],
    ) -> Result<TabletReplicas, CqlError> {
        let replicas = match keys::table_and_token(key) {
            Some((table, token)) => self.write_replicas_of(state, &table, token),
            None => TabletReplicas {
                replicas: Vec::new(),
                strategy: None,
                new: None,
                wait_for_new: false,
            },
        };
        if replicas.replicas.is_empty() {
            return Err(CqlError::server(
                "no replicas are placed for this table yet; retry once the schema has settled",
            ));
        }
        Ok(replicas)
    }

    async fn write_group(
        &self,
        replicas: TabletReplicas,
        cells: Cells,
        consistency: Consistency,
        write_type: WriteType,
        in_flight: TopologyGuard,
    ) -> Result<(), CqlError> {
        let local_datacenter = self.local_datacenter();
        let new_set = replicas.new_set();
        let new_requirement = new_set
            .as_ref()
            .filter(|_| replicas.wait_for_new)
            .map(|set| requirement(local_datacenter, consistency, set));
        let requirement = requirement(local_datacenter, consistency, &replicas);
        let mut deliveries = FuturesUnordered::new();
        for replica in replicas.targets() {
            let host_id = replica.host_id;
            if replica.local && write_type == WriteType::Counter {
                // The leader of a counter increment (this node) wrote these shards through
                // its log before sending them (`shoal_coordinator::counter`): its own
                // acknowledgement is already in.
                deliveries.push(Box::pin(async move { Delivery::Acknowledged(host_id) })
                    as BoxFuture<'static, Delivery>);
            } else if replica.alive {
                // A remote replica that fails gets these cells as a hint; a local write
                // that fails has nothing to hint.
                let hint = if replica.local {
                    Vec::new()
                } else {
                    cells.clone()
                };
                let applied = self.apply_on(replica, cells.clone());
                deliveries.push(Box::pin(async move {
                    if applied.await {
                        Delivery::Acknowledged(host_id)
                    } else {
                        Delivery::Failed(host_id, hint)
                    }
                }) as BoxFuture<'static, Delivery>);
            } else {
                let stored = self.hints.store(host_id, &cells);
                deliveries.push(Box::pin(async move {
                    match stored.await {
                        Ok(()) => Delivery::Hinted(host_id),
                        Err(_) => Delivery::NotHinted(host_id),
                    }
                }));
            }
        }
        let mut acknowledged: Vec<HostId> = Vec::new();
        // When each acknowledgement came, for the log of a slow write (diagnosis).
        let started = std::time::Instant::now();
        let mut acknowledged_after: SmallVec<[(HostId, std::time::Duration); 4]> = SmallVec::new();
        let mut hinted = 0usize;
        let timeout = tokio::time::sleep(WRITE_TIMEOUT);
        tokio::pin!(timeout);
        let met = |acknowledged: &[HostId], hinted: usize| {
            let old_met =
                requirement.met_by(acknowledged_in(acknowledged, &replicas).iter().copied());
            let new_met = match (&new_requirement, &new_set) {
                (Some(needed), Some(set)) => {
                    needed.met_by(acknowledged_in(acknowledged, set).iter().copied())
                }
                _ => true,
            };
            (old_met && new_met)
                || (consistency == Consistency::Any && acknowledged.len() + hinted > 0)
        };
        while !met(&acknowledged, hinted) {
            tokio::select! {
                delivery = deliveries.next() => {
                    if let Some(host) = delivery.as_ref().and_then(Delivery::missed) {
                        self.missed.record(host);
                    }
                    match delivery {
                        Some(Delivery::Acknowledged(host)) => {
                            acknowledged_after.push((host, started.elapsed()));
                            acknowledged.push(host)
                        }
                        Some(Delivery::Hinted(_)) => hinted += 1,
                        Some(Delivery::NotHinted(_)) => {}
                        Some(Delivery::Failed(host, cells)) => {
                            if !cells.is_empty() {
                                // Not counted even at ANY: the replica may have applied it.
                                let stored = self.hints.store(host, &cells);
                                let in_flight = in_flight.clone();
                                tokio::spawn(async move {
                                    let _in_flight = in_flight;
                                    stored.await
                                });
                            }
                        }
                        None => break,
                    }
                },
                _ = &mut timeout => break,
            }
        }
        let success = met(&acknowledged, hinted);
        if started.elapsed() > SLOW_WRITE && tracing::enabled!(tracing::Level::DEBUG) {
            let replies: Vec<String> = acknowledged_after
                .iter()
                .map(|(host, after)| {
                    let address = replicas
                        .targets()
                        .into_iter()
                        .find(|replica| replica.host_id == *host)
                        .map(|replica| replica.address.to_string())
                        .unwrap_or_default();
                    format!("{address} after {} us", after.as_micros())
                })
                .collect();
            tracing::debug!(
                micros = started.elapsed().as_micros() as u64,
                moving = new_set.is_some(),
                replies = %replies.join(", "),
                "a write was slow to reach its consistency level"
            );
        }
        // Replicas still on their way finish in the background; failures become hints.
        // The guard goes along: a barrier waits for these deliveries too.
        if !deliveries.is_empty() {
            let hints = Arc::clone(&self.hints);
            let missed = Arc::clone(&self.missed);
            tokio::spawn(async move {
                let _in_flight = in_flight;
                while let Some(delivery) = deliveries.next().await {
                    if let Some(host) = delivery.missed() {
                        missed.record(host);
                    }
                    if let Delivery::Failed(host, cells) = delivery {
                        if !cells.is_empty() {
                            let _ = hints.store(host, &cells).await;
                        }
                    }
                }
            });
        }
        if success {
            return Ok(());
        }
        Err(write_timeout(
            consistency,
            acknowledged.len(),
            requirement.block_for(),
            write_type,
        ))
    }
}
