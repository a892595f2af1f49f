//! Replication: how the coordinator spreads writes over a tablet's replicas and gathers
//! reads from them at the request's consistency level (seed 000's tunable consistency).
//!
//! - A write is split by tablet (each key carries its table id and token); each part goes
//!   to every replica of its tablet — applied locally through the [`crate::WriteLog`],
//!   sent to live peers through the [`ReplicaTransport`], and kept as a hint
//!   ([`crate::hints`]) for replicas the [`Liveness`] view calls down. The client is answered
//!   once the [`Requirement`] of its consistency level is met; the rest complete in the
//!   background (and become hints if they fail).
//! - A partition read at ONE on a replica reads locally. Otherwise the coordinator fetches
//!   the partition's raw cells from as many replicas as the level requires, reconciles
//!   them cell by cell by last-write-wins, sends every replica that answered the cells it
//!   was missing (blocking read repair), and runs the SELECT over the reconciled cells.
//! - A scan walks the table's tablets in token order through [`ReplicatedView`], an
//!   [`Engine`] whose cursors fetch chunks from the replicas of each tablet and reconcile
//!   them the same way, so the reader, paging and LIMIT work unchanged across nodes.
//!
//! Too few live replicas answers `Unavailable` before anything is sent; replicas that do
//! not answer in time give `WriteTimeout` / `ReadTimeout` with the counts received.

use crate::{Coordinator, CqlError, ErrorCode};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use shoal_cluster::{ClusterMetadata, ClusterState, Member};
use shoal_cql::request::Consistency;
use shoal_model::{keys, Cell, Token};
use shoal_placement::ReplicationStrategy;
use shoal_storage::{Cursor, Engine, MemoryEngine, WriteBatch};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How long a write waits for the replicas its consistency level needs.
pub const WRITE_TIMEOUT: Duration = Duration::from_millis(2000);
/// How long a read waits for the replicas its consistency level needs.
pub const READ_TIMEOUT: Duration = Duration::from_millis(5000);
/// Cells of one partition a point read gathers whole; larger partitions are read in
/// chunks through [`ReplicatedView`].
pub const GATHER_LIMIT_CELLS: u32 = 4096;

/// Where a partition read finds its data.
pub(crate) enum Gathered {
    /// On this node (no cluster, or ONE on a local replica).
    Local,
    /// Reconciled from the replicas.
    Merged(MemoryEngine),
    /// A partition too large to gather whole: read it through [`ReplicatedView`].
    TooLarge,
}

/// One in this many reads answered locally checks the other replicas in the background.
pub const BACKGROUND_CHECK_EVERY: u64 = 10;
/// Cells per chunk when a scan fetches from a replica.
const SCAN_CHUNK_CELLS: u32 = 4096;

/// A partition by token and serialized partition key.
pub type PartitionRef = (Token, Vec<u8>);

/// One replica's answer to a read: its cells and whether they are complete.
type ReplicaRead = BoxFuture<'static, (Replica, Result<(Cells, bool), String>)>;

/// Cells as stored: `(key, encoded cell)`.
pub type Cells = Vec<(Vec<u8>, Vec<u8>)>;

/// What a coordinator asks of a replica.
#[derive(Debug, Serialize, Deserialize)]
pub enum ReplicaRequest {
    /// Apply these cells (a write, a read repair or a replayed hint).
    Apply(Cells),
    /// The cells stored in `[lower, upper)`, at most `limit` of them.
    Read {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
    },
    /// Remove every cell of a table (TRUNCATE).
    Truncate([u8; 16]),
    /// A digest of the cells `Read` would return (reads at CL > ONE ask one replica for
    /// data and the others for digests).
    Digest {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
    },
    /// A hash of the cells in each of the consecutive key ranges `[bounds[i],
    /// bounds[i+1])` (anti-entropy repair compares them between replicas).
    RangeHashes { bounds: Vec<Vec<u8>> },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ReplicaResponse {
    Applied,
    /// The cells read; `complete` is false when `limit` cut the range short.
    Cells {
        cells: Cells,
        complete: bool,
    },
    /// One hash per range asked for.
    Hashes(Vec<u64>),
    /// The digest of the cells read; `complete` as for `Cells`.
    Digest {
        hash: u64,
        complete: bool,
    },
    Error(String),
}

/// How replica requests reach peers (the server implements it over internode messaging).
pub trait ReplicaTransport: Send + Sync + 'static {
    fn send(
        &self,
        to: SocketAddr,
        request: ReplicaRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>>;
}

/// Which peers the failure detector believes are up.
pub trait Liveness: Send + Sync + 'static {
    fn is_alive(&self, host_id: &[u8; 16]) -> bool;
    /// How long the peer has been down (`None` while it is up).
    fn down_for(&self, host_id: &[u8; 16]) -> Option<Duration>;
    /// The schema version the peer reported last (for `system.peers`).
    fn schema_version(&self, host_id: &[u8; 16]) -> Option<[u8; 16]>;
}

/// What the coordinator needs to act as part of a cluster.
pub struct ClusterContext {
    pub metadata: Arc<ClusterMetadata>,
    pub transport: Arc<dyn ReplicaTransport>,
    pub liveness: Arc<dyn Liveness>,
    /// Writes kept for replicas that are down.
    pub hints: Arc<crate::hints::Hints>,
}

/// A replica as one request sees it.
#[derive(Debug, Clone)]
pub(crate) struct Replica {
    pub host_id: [u8; 16],
    pub address: SocketAddr,
    pub datacenter: String,
    pub local: bool,
    pub alive: bool,
}

/// A tablet's replicas for one request, with the keyspace's replication.
#[derive(Debug, Clone)]
pub(crate) struct TabletReplicas {
    replicas: Vec<Replica>,
    strategy: Option<ReplicationStrategy>,
}

impl std::ops::Deref for TabletReplicas {
    type Target = [Replica];
    fn deref(&self) -> &[Replica] {
        &self.replicas
    }
}

/// How many acknowledgements a consistency level needs, overall or per datacenter.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    /// `(datacenter, count)`; `None` counts replicas anywhere.
    needs: Vec<(Option<String>, usize)>,
}

impl Requirement {
    pub fn of(consistency: Consistency, datacenters: &[&str], local_datacenter: &str) -> Self {
        let total = datacenters.len();
        let in_dc = |dc: &str| datacenters.iter().filter(|d| **d == dc).count();
        let needs = match consistency {
            Consistency::Any | Consistency::One => vec![(None, 1)],
            Consistency::Two => vec![(None, 2)],
            Consistency::Three => vec![(None, 3)],
            Consistency::Quorum | Consistency::Serial => vec![(None, total / 2 + 1)],
            Consistency::All => vec![(None, total)],
            Consistency::LocalOne => vec![(Some(local_datacenter.to_string()), 1)],
            Consistency::LocalQuorum | Consistency::LocalSerial => vec![(
                Some(local_datacenter.to_string()),
                in_dc(local_datacenter) / 2 + 1,
            )],
            Consistency::EachQuorum => {
                let mut dcs: Vec<&str> = datacenters.to_vec();
                dcs.sort_unstable();
                dcs.dedup();
                dcs.into_iter()
                    .map(|dc| (Some(dc.to_string()), in_dc(dc) / 2 + 1))
                    .collect()
            }
        };
        Requirement { needs }
    }

    /// Acknowledgements needed in all.
    pub fn block_for(&self) -> usize {
        self.needs.iter().map(|(_, n)| n).sum()
    }

    /// True when acknowledgements from replicas in `datacenters` meet it.
    pub fn met_by<'a>(&self, datacenters: impl Iterator<Item = &'a str> + Clone) -> bool {
        self.needs.iter().all(|(dc, needed)| {
            let count = match dc {
                Some(dc) => datacenters.clone().filter(|d| d == dc).count(),
                None => datacenters.clone().count(),
            };
            count >= *needed
        })
    }
}

/// `Unavailable`: fewer live replicas than `consistency` needs.
pub(crate) fn unavailable(consistency: Consistency, required: usize, alive: usize) -> CqlError {
    CqlError::new(
        ErrorCode::Unavailable {
            consistency: consistency.code(),
            required: required as i32,
            alive: alive as i32,
        },
        format!(
            "Cannot achieve consistency level {}: {required} replicas required but only {alive} alive",
            consistency.name()
        ),
    )
}

fn table_and_token(key: &[u8]) -> Option<([u8; 16], Token)> {
    let table: [u8; 16] = key.get(..keys::TABLE_ID_LENGTH)?.try_into().ok()?;
    let (token, _, _) = keys::split_partition(key)?;
    Some((table, token))
}

impl ClusterContext {
    pub(crate) fn replicas_of(
        &self,
        state: &ClusterState,
        table: &[u8; 16],
        token: Token,
    ) -> TabletReplicas {
        let me = self.metadata.me().host_id;
        let replicas = state
            .replicas(table, token)
            .unwrap_or(&[])
            .iter()
            .filter_map(|host| state.member_by_host(host))
            .map(|member: &Member| Replica {
                host_id: member.host_id,
                address: member.internode_address,
                datacenter: member.datacenter.clone(),
                local: member.host_id == me,
                alive: member.host_id == me || self.liveness.is_alive(&member.host_id),
            })
            .collect();
        TabletReplicas {
            replicas,
            strategy: state.tables.get(table).map(|p| p.strategy.clone()),
        }
    }

    /// What `consistency` needs for a tablet with `replicas`, counted against the
    /// keyspace's replication factor: a factor beyond the nodes available (RF 3 on two
    /// nodes) still needs its quorum, as in Cassandra.
    fn requirement(&self, consistency: Consistency, replicas: &TabletReplicas) -> Requirement {
        let local = self.metadata.me().datacenter.as_str();
        let mut dcs: Vec<&str> = replicas.iter().map(|r| r.datacenter.as_str()).collect();
        match &replicas.strategy {
            Some(ReplicationStrategy::Simple { factor }) => {
                while dcs.len() < *factor {
                    dcs.push(local);
                }
            }
            Some(ReplicationStrategy::NetworkTopology { factors }) => {
                for (dc, factor) in factors {
                    let placed = replicas.iter().filter(|r| &r.datacenter == dc).count();
                    for _ in placed..*factor {
                        dcs.push(dc.as_str());
                    }
                }
            }
            None => {}
        }
        Requirement::of(consistency, &dcs, local)
    }
}

/// The outcome of sending one part of a write to one replica.
enum Delivery {
    Acknowledged(String),
    Hinted,
    Failed([u8; 16], Cells),
}

impl Coordinator {
    /// Applies `batch` on the replicas of its tablets and waits for `consistency`.
    pub(crate) async fn replicate_write(
        &self,
        batch: WriteBatch,
        consistency: Consistency,
        write_type: &str,
    ) -> Result<(), CqlError> {
        let Some(cluster) = &self.cluster else {
            return self.log.append(batch).await;
        };
        let state = cluster.metadata.state();
        // Group the cells by the replica set of their tablet.
        let mut groups: BTreeMap<Vec<[u8; 16]>, (TabletReplicas, Cells)> = BTreeMap::new();
        for (key, value) in batch.into_entries() {
            let replicas = match table_and_token(&key) {
                Some((table, token)) => cluster.replicas_of(&state, &table, token),
                None => TabletReplicas {
                    replicas: Vec::new(),
                    strategy: None,
                },
            };
            if replicas.replicas.is_empty() {
                return Err(CqlError::server(
                    "no replicas are placed for this table yet; retry once the schema has settled",
                ));
            }
            let ids = replicas.iter().map(|r| r.host_id).collect();
            groups
                .entry(ids)
                .or_insert_with(|| (replicas, Vec::new()))
                .1
                .push((key, value));
        }
        // Check every group before sending anything.
        for (replicas, _) in groups.values() {
            let requirement = cluster.requirement(consistency, replicas);
            let alive = replicas.iter().filter(|r| r.alive);
            let enough = consistency == Consistency::Any
                || requirement.met_by(alive.clone().map(|r| r.datacenter.as_str()));
            if !enough {
                return Err(unavailable(
                    consistency,
                    requirement.block_for(),
                    alive.count(),
                ));
            }
        }
        let mut waits = Vec::with_capacity(groups.len());
        for (_, (replicas, cells)) in groups {
            waits.push(self.write_group(cluster, replicas, cells, consistency, write_type));
        }
        for result in futures::future::join_all(waits).await {
            result?;
        }
        Ok(())
    }

    async fn write_group(
        &self,
        cluster: &ClusterContext,
        replicas: TabletReplicas,
        cells: Cells,
        consistency: Consistency,
        write_type: &str,
    ) -> Result<(), CqlError> {
        let requirement = cluster.requirement(consistency, &replicas);
        let mut deliveries = FuturesUnordered::new();
        for replica in replicas.iter() {
            let datacenter = replica.datacenter.clone();
            let host_id = replica.host_id;
            if replica.alive {
                // A remote replica that fails gets these cells as a hint; a local write
                // that fails has nothing to hint.
                let hint = if replica.local {
                    Vec::new()
                } else {
                    cells.clone()
                };
                let applied = self.apply_on(cluster, replica, cells.clone());
                deliveries.push(Box::pin(async move {
                    if applied.await {
                        Delivery::Acknowledged(datacenter)
                    } else {
                        Delivery::Failed(host_id, hint)
                    }
                }) as BoxFuture<'static, Delivery>);
            } else {
                cluster.hints.store(host_id, &cells);
                deliveries.push(Box::pin(async { Delivery::Hinted }));
            }
        }
        let mut acknowledged: Vec<String> = Vec::new();
        let mut hinted = 0usize;
        let timeout = tokio::time::sleep(WRITE_TIMEOUT);
        tokio::pin!(timeout);
        let met = |acknowledged: &Vec<String>, hinted: usize| {
            requirement.met_by(acknowledged.iter().map(String::as_str))
                || (consistency == Consistency::Any && acknowledged.len() + hinted > 0)
        };
        while !met(&acknowledged, hinted) {
            tokio::select! {
                delivery = deliveries.next() => match delivery {
                    Some(Delivery::Acknowledged(dc)) => acknowledged.push(dc),
                    Some(Delivery::Hinted) => hinted += 1,
                    Some(Delivery::Failed(host, cells)) => {
                        if !cells.is_empty() {
                            cluster.hints.store(host, &cells);
                        }
                    }
                    None => break,
                },
                _ = &mut timeout => break,
            }
        }
        let success = met(&acknowledged, hinted);
        // Replicas still on their way finish in the background; failures become hints.
        if !deliveries.is_empty() {
            let hints = Arc::clone(&cluster.hints);
            tokio::spawn(async move {
                while let Some(delivery) = deliveries.next().await {
                    if let Delivery::Failed(host, cells) = delivery {
                        if !cells.is_empty() {
                            hints.store(host, &cells);
                        }
                    }
                }
            });
        }
        if success {
            return Ok(());
        }
        let block_for = requirement.block_for();
        Err(CqlError::new(
            ErrorCode::WriteTimeout {
                consistency: consistency.code(),
                received: acknowledged.len() as i32,
                block_for: block_for as i32,
                write_type: write_type.to_string(),
            },
            format!(
                "Operation timed out - received only {} responses.",
                acknowledged.len()
            ),
        ))
    }

    /// Reads the partitions `(token, partition key)` of `table_id` from their replicas at
    /// `consistency`, repairing replicas that answered with stale cells. Small partitions
    /// (the common case) come back whole in an engine the reader can walk; a partition
    /// beyond [`GATHER_LIMIT_CELLS`] is left to [`ReplicatedView`], which fetches only as
    /// many chunks as the SELECT consumes.
    pub(crate) async fn gather_partitions(
        &self,
        table_id: &[u8; 16],
        partitions: &[PartitionRef],
        consistency: Consistency,
    ) -> Result<Gathered, CqlError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Gathered::Local);
        };
        let state = cluster.metadata.state();
        let single = matches!(consistency, Consistency::One | Consistency::LocalOne);
        let all_local = partitions.iter().all(|(token, _)| {
            cluster
                .replicas_of(&state, table_id, *token)
                .iter()
                .any(|r| r.local)
        });
        if single && all_local {
            return Ok(Gathered::Local);
        }
        let merged = MemoryEngine::new();
        for (token, partition_key) in partitions {
            let replicas = cluster.replicas_of(&state, table_id, *token);
            let lower = keys::partition_prefix(table_id, *token, partition_key);
            let upper = keys::increment_prefix(&lower).unwrap_or_else(|| vec![0xff; 64]);
            let agreed = self
                .read_with_digests(
                    cluster,
                    &replicas,
                    consistency,
                    &lower,
                    &upper,
                    GATHER_LIMIT_CELLS,
                )
                .await?;
            let reconciled = match agreed {
                Some(agreed) => agreed,
                None => {
                    tracing::debug!("digests disagree: reading every replica in full");
                    self.read_replicas(
                        cluster,
                        &replicas,
                        consistency,
                        &lower,
                        &upper,
                        GATHER_LIMIT_CELLS,
                    )
                    .await?
                }
            };
            if reconciled.covered_until.is_some() {
                return Ok(Gathered::TooLarge);
            }
            merged
                .write(&WriteBatch::from(reconciled.cells))
                .map_err(|e| CqlError::server(e.to_string()))?;
        }
        Ok(Gathered::Merged(merged))
    }

    /// Every [`BACKGROUND_CHECK_EVERY`]th read answered locally (ONE on a replica) also
    /// compares the partitions' replicas in the background and repairs the stale ones,
    /// so that mismatches seen at ONE heal without the client waiting.
    pub(crate) fn maybe_check_replicas_in_background(
        self: &Arc<Self>,
        table_id: [u8; 16],
        partitions: Vec<PartitionRef>,
    ) {
        if self.cluster.is_none() || self.member_count() < 2 {
            return;
        }
        let reads = self
            .local_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !reads.is_multiple_of(BACKGROUND_CHECK_EVERY) {
            return;
        }
        let coordinator = Arc::clone(self);
        tokio::spawn(async move {
            let Some(cluster) = &coordinator.cluster else {
                return;
            };
            let state = cluster.metadata.state();
            for (token, partition_key) in partitions {
                let replicas = cluster.replicas_of(&state, &table_id, token);
                if replicas.iter().filter(|r| r.alive).count() < 2 {
                    continue;
                }
                let lower = keys::partition_prefix(&table_id, token, &partition_key);
                let Some(upper) = keys::increment_prefix(&lower) else {
                    continue;
                };
                // ALL: compare every replica; a replica down makes it skip quietly.
                let _ = coordinator
                    .read_replicas(
                        cluster,
                        &replicas,
                        Consistency::All,
                        &lower,
                        &upper,
                        u32::MAX,
                    )
                    .await;
            }
        });
    }

    /// Reads `[lower, upper)` with data from one replica and digests from the others the
    /// level needs. `Ok(None)` when that does not settle it — a digest differs, a replica
    /// failed, or the range is beyond `limit` — and a full read must follow.
    async fn read_with_digests(
        &self,
        cluster: &ClusterContext,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> Result<Option<Reconciled>, CqlError> {
        let (requirement, chosen, _) = plan_read(cluster, replicas, consistency)?;
        let Some((data_replica, digest_replicas)) = chosen.split_first() else {
            return Ok(None);
        };
        if digest_replicas.is_empty() {
            return Ok(None);
        }
        // Answers so far, for a ReadTimeout's counts.
        let answered = std::sync::atomic::AtomicUsize::new(0);
        let data_present = std::sync::atomic::AtomicBool::new(false);
        let count = |ok: bool| {
            if ok {
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let data_read = self.read_cells_on(cluster, data_replica, lower, upper, limit);
        let data = async {
            let result = data_read.await;
            count(result.is_ok());
            data_present.store(result.is_ok(), std::sync::atomic::Ordering::Relaxed);
            result
        };
        let digests = futures::future::join_all(digest_replicas.iter().map(|replica| {
            let local = replica.local;
            let sent = (!local).then(|| {
                cluster.transport.send(
                    replica.address,
                    ReplicaRequest::Digest {
                        lower: lower.to_vec(),
                        upper: upper.to_vec(),
                        limit,
                    },
                    READ_TIMEOUT,
                )
            });
            let count = &count;
            async move {
                let result = match sent {
                    None => local_digest(self.engine.as_ref(), lower, upper, limit),
                    Some(sent) => match sent.await {
                        Ok(ReplicaResponse::Digest { hash, complete }) => Ok((hash, complete)),
                        Ok(other) => Err(format!("unexpected answer {other:?}")),
                        Err(error) => Err(error),
                    },
                };
                count(result.is_ok());
                result
            }
        }));
        let Ok((data, digests)) =
            tokio::time::timeout(READ_TIMEOUT, futures::future::join(data, digests)).await
        else {
            let received = answered.load(std::sync::atomic::Ordering::Relaxed);
            return Err(CqlError::new(
                ErrorCode::ReadTimeout {
                    consistency: consistency.code(),
                    received: received as i32,
                    block_for: requirement.block_for() as i32,
                    data_present: data_present.load(std::sync::atomic::Ordering::Relaxed),
                },
                format!("Operation timed out - received only {received} responses."),
            ));
        };
        let Ok((cells, true)) = data else {
            return Ok(None);
        };
        let hash = cells_digest(&cells);
        let agree = digests
            .iter()
            .all(|digest| matches!(digest, Ok((other, true)) if *other == hash));
        Ok(agree.then_some(Reconciled {
            cells,
            covered_until: None,
            repaired: 0,
        }))
    }

    /// The cells of `[lower, upper)` on `replica`, at most `limit`: read from this node's
    /// engine at once when it is local, asked for with a `Read` message otherwise.
    fn read_cells_on(
        &self,
        cluster: &ClusterContext,
        replica: &Replica,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> BoxFuture<'static, Result<(Cells, bool), String>> {
        if replica.local {
            let result = local_read(self.engine.as_ref(), lower, upper, limit);
            return Box::pin(async move { result });
        }
        let sent = cluster.transport.send(
            replica.address,
            ReplicaRequest::Read {
                lower: lower.to_vec(),
                upper: upper.to_vec(),
                limit,
            },
            READ_TIMEOUT,
        );
        Box::pin(async move {
            match sent.await {
                Ok(ReplicaResponse::Cells { cells, complete }) => Ok((cells, complete)),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(error) => Err(error),
            }
        })
    }

    /// Reads `[lower, upper)` from enough replicas for `consistency`, reconciles and
    /// repairs. With a `limit`, the result covers `[lower, covered_until)` only.
    pub(crate) async fn read_replicas(
        &self,
        cluster: &ClusterContext,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> Result<Reconciled, CqlError> {
        let (requirement, chosen, candidates) = plan_read(cluster, replicas, consistency)?;
        let start_read = |replica: Replica| -> ReplicaRead {
            let read = self.read_cells_on(cluster, &replica, lower, upper, limit);
            Box::pin(async move { (replica, read.await) })
        };
        let mut reads = FuturesUnordered::new();
        for replica in &chosen {
            reads.push(start_read((*replica).clone()));
        }
        // Replicas not asked yet stand in for ones that fail (e.g. died but not yet
        // convicted by the failure detector).
        let mut standby: Vec<&Replica> = candidates
            .iter()
            .copied()
            .filter(|c| !chosen.iter().any(|r| r.host_id == c.host_id))
            .collect();
        let mut answers: Vec<(Replica, Cells, bool)> = Vec::new();
        let timeout = tokio::time::sleep(READ_TIMEOUT);
        tokio::pin!(timeout);
        while !requirement.met_by(answers.iter().map(|(r, _, _)| r.datacenter.as_str())) {
            tokio::select! {
                read = reads.next() => match read {
                    Some((replica, Ok((cells, complete)))) => answers.push((replica, cells, complete)),
                    Some((failed, Err(error))) => {
                        tracing::debug!(replica = %failed.address, %error, "replica read failed");
                        let substitute = standby
                            .iter()
                            .position(|r| r.datacenter == failed.datacenter)
                            .or(if standby.is_empty() { None } else { Some(0) });
                        if let Some(index) = substitute {
                            reads.push(start_read(standby.remove(index).clone()));
                        }
                    }
                    None => break,
                },
                _ = &mut timeout => break,
            }
        }
        if !requirement.met_by(answers.iter().map(|(r, _, _)| r.datacenter.as_str())) {
            return Err(CqlError::new(
                ErrorCode::ReadTimeout {
                    consistency: consistency.code(),
                    received: answers.len() as i32,
                    block_for: requirement.block_for() as i32,
                    data_present: !answers.is_empty(),
                },
                format!(
                    "Operation timed out - received only {} responses.",
                    answers.len()
                ),
            ));
        }
        let reconciled = reconcile(&answers);
        let mut reconciled = reconciled;
        let repairs = repairs_for(&answers, &reconciled);
        if !repairs.is_empty() {
            reconciled.repaired = repairs.iter().map(|(_, cells)| cells.len()).sum();
            self.send_repairs(cluster, repairs).await;
        }
        Ok(reconciled)
    }

    async fn send_repairs(&self, cluster: &ClusterContext, repairs: Vec<(Replica, Cells)>) {
        let mut sends = FuturesUnordered::new();
        for (replica, cells) in repairs {
            tracing::debug!(replica = %replica.address, cells = cells.len(), "read repair");
            sends.push(self.apply_on(cluster, &replica, cells));
        }
        while sends.next().await.is_some() {}
    }

    /// Applies `cells` on `replica`: through this node's commit log when it is local,
    /// as an `Apply` message otherwise. Resolves to whether the replica acknowledged.
    fn apply_on(
        &self,
        cluster: &ClusterContext,
        replica: &Replica,
        cells: Cells,
    ) -> BoxFuture<'static, bool> {
        if replica.local {
            let log = Arc::clone(&self.log);
            return Box::pin(async move { log.append(WriteBatch::from(cells)).await.is_ok() });
        }
        let sent =
            cluster
                .transport
                .send(replica.address, ReplicaRequest::Apply(cells), WRITE_TIMEOUT);
        Box::pin(async move { matches!(sent.await, Ok(ReplicaResponse::Applied)) })
    }

    /// Answers a request from another node's coordinator.
    pub async fn serve_replica(&self, request: ReplicaRequest) -> ReplicaResponse {
        match request {
            ReplicaRequest::Apply(cells) => match self.log.append(WriteBatch::from(cells)).await {
                Ok(()) => ReplicaResponse::Applied,
                Err(error) => ReplicaResponse::Error(error.message),
            },
            ReplicaRequest::Read {
                lower,
                upper,
                limit,
            } => match local_read(self.engine.as_ref(), &lower, &upper, limit) {
                Ok((cells, complete)) => ReplicaResponse::Cells { cells, complete },
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::Digest {
                lower,
                upper,
                limit,
            } => match local_digest(self.engine.as_ref(), &lower, &upper, limit) {
                Ok((hash, complete)) => ReplicaResponse::Digest { hash, complete },
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::RangeHashes { bounds } => {
                match crate::repair::range_hashes(self.engine.as_ref(), &bounds) {
                    Ok(hashes) => ReplicaResponse::Hashes(hashes),
                    Err(error) => ReplicaResponse::Error(error),
                }
            }
            ReplicaRequest::Truncate(table_id) => {
                match self
                    .engine
                    .delete_range(&keys::table_prefix(&table_id), &keys::table_end(&table_id))
                {
                    Ok(()) => ReplicaResponse::Applied,
                    Err(error) => ReplicaResponse::Error(error.to_string()),
                }
            }
        }
    }

    /// TRUNCATE on every member (all must be up, as in Cassandra).
    pub(crate) async fn truncate_everywhere(&self, table_id: [u8; 16]) -> Result<(), CqlError> {
        let Some(cluster) = &self.cluster else {
            return self
                .engine
                .delete_range(&keys::table_prefix(&table_id), &keys::table_end(&table_id))
                .map_err(|e| CqlError::server(format!("could not remove the table's data: {e}")));
        };
        let state = cluster.metadata.state();
        let me = cluster.metadata.me().host_id;
        let down: Vec<String> = state
            .members
            .values()
            .filter(|m| m.host_id != me && !cluster.liveness.is_alive(&m.host_id))
            .map(|m| m.internode_address.ip().to_string())
            .collect();
        if !down.is_empty() {
            return Err(CqlError::new(
                ErrorCode::Unavailable {
                    consistency: Consistency::All.code(),
                    required: state.members.len() as i32,
                    alive: (state.members.len() - down.len()) as i32,
                },
                format!(
                    "Cannot achieve consistency level ALL: TRUNCATE needs every node up, and {} {} down",
                    down.join(", "),
                    if down.len() == 1 { "is" } else { "are" }
                ),
            ));
        }
        let mut calls = Vec::new();
        for member in state.members.values() {
            if member.host_id == me {
                continue;
            }
            calls.push(cluster.transport.send(
                member.internode_address,
                ReplicaRequest::Truncate(table_id),
                WRITE_TIMEOUT,
            ));
        }
        self.engine
            .delete_range(&keys::table_prefix(&table_id), &keys::table_end(&table_id))
            .map_err(|e| CqlError::server(format!("could not remove the table's data: {e}")))?;
        for result in futures::future::join_all(calls).await {
            match result {
                Ok(ReplicaResponse::Applied) => {}
                Ok(ReplicaResponse::Error(e)) | Err(e) => {
                    return Err(CqlError::new(
                        ErrorCode::Truncate,
                        format!("Error during truncate: {e}"),
                    ))
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }
}

/// Visits the visible cells of `[lower, upper)` in the local engine (neither shadowed by a
/// deletion nor past their grace period: see [`shoal_storage::shadow`]), at most `limit`
/// of them; `true` if that was all of them. Replicas answer reads, digests and repair
/// hashes from this view, so two replicas that purged at different times still agree.
fn walk_local(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
    mut visit: impl FnMut(&[u8], &[u8]),
) -> Result<bool, String> {
    let mut visited = 0u64;
    shoal_storage::shadow::visit_visible(
        engine,
        lower,
        upper,
        shoal_model::timestamp::now_seconds(),
        |key, value| {
            if visited >= limit as u64 {
                return false;
            }
            visit(key, value);
            visited += 1;
            true
        },
    )
    .map_err(|e| e.to_string())
}

/// Cells of `[lower, upper)` from the local engine, at most `limit`; `true` if complete.
fn local_read(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
) -> Result<(Cells, bool), String> {
    let mut cells = Vec::new();
    let complete = walk_local(engine, lower, upper, limit, |key, value| {
        cells.push((key.to_vec(), value.to_vec()))
    })?;
    Ok((cells, complete))
}

/// Adds one cell to a digest; every digest and repair hash is built this way.
pub(crate) fn hash_cell(hasher: &mut std::hash::DefaultHasher, key: &[u8], value: &[u8]) {
    use std::hash::Hash;
    key.hash(hasher);
    value.hash(hasher);
}

/// The digest of `cells` (what a replica computes with [`local_digest`]).
fn cells_digest(cells: &Cells) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    for (key, value) in cells {
        hash_cell(&mut hasher, key, value);
    }
    hasher.finish()
}

/// The digest of the cells of `[lower, upper)`, at most `limit`, hashed as they are read
/// (nothing copied); `true` if complete.
fn local_digest(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
) -> Result<(u64, bool), String> {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    let complete = walk_local(engine, lower, upper, limit, |key, value| {
        hash_cell(&mut hasher, key, value)
    })?;
    Ok((hasher.finish(), complete))
}

/// Replicas' answers merged by last-write-wins, covering `[lower, covered_until)`.
pub(crate) struct Reconciled {
    pub cells: Cells,
    /// `None`: the whole requested range.
    pub covered_until: Option<Vec<u8>>,
    /// Cells sent to replicas that lacked them (read repair).
    pub repaired: usize,
}

fn reconcile(answers: &[(Replica, Cells, bool)]) -> Reconciled {
    // An incomplete answer only speaks for keys up to its last one.
    let covered_until = answers
        .iter()
        .filter(|(_, _, complete)| !complete)
        .filter_map(|(_, cells, _)| cells.last().map(|(k, _)| k.clone()))
        .min();
    let mut merged: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
    for (_, cells, _) in answers {
        for (key, value) in cells {
            if covered_until.as_ref().is_some_and(|c| key > c) {
                break;
            }
            merged
                .entry(key.as_slice())
                .and_modify(|current| *current = Cell::reconcile_encoded(current, value))
                .or_insert(value.as_slice());
        }
    }
    Reconciled {
        // A deletion one replica holds hides what another still sends: reconcile to the
        // visible cells, so that repair never sends a replica cells that are dead anyway.
        cells: shoal_storage::shadow::without_shadowed(
            merged
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        ),
        // Everything up to and including the last key: continue just after it.
        covered_until: covered_until.map(|mut key| {
            key.push(0);
            key
        }),
        repaired: 0,
    }
}

/// For each replica, the reconciled cells it does not hold exactly.
fn repairs_for(
    answers: &[(Replica, Cells, bool)],
    reconciled: &Reconciled,
) -> Vec<(Replica, Cells)> {
    if answers.len() < 2 {
        return Vec::new();
    }
    let mut repairs = Vec::new();
    for (replica, cells, _) in answers {
        let held: BTreeMap<&[u8], &[u8]> = cells
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let missing: Cells = reconciled
            .cells
            .iter()
            .filter(|(key, value)| held.get(key.as_slice()) != Some(&value.as_slice()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            repairs.push((replica.clone(), missing));
        }
    }
    repairs
}

/// The replicas a read at `consistency` asks, local first: the requirement, the replicas
/// chosen (just enough to meet it) and every live candidate (the rest stand by).
fn plan_read<'r>(
    cluster: &ClusterContext,
    replicas: &'r TabletReplicas,
    consistency: Consistency,
) -> Result<(Requirement, Vec<&'r Replica>, Vec<&'r Replica>), CqlError> {
    let requirement = cluster.requirement(consistency, replicas);
    let mut candidates: Vec<&Replica> = replicas.iter().filter(|r| r.alive).collect();
    candidates.sort_by_key(|r| !r.local);
    if !requirement.met_by(candidates.iter().map(|r| r.datacenter.as_str())) {
        return Err(unavailable(
            consistency,
            requirement.block_for(),
            candidates.len(),
        ));
    }
    let mut chosen: Vec<&Replica> = Vec::new();
    for candidate in &candidates {
        if requirement.met_by(chosen.iter().map(|r| r.datacenter.as_str())) {
            break;
        }
        let useful = requirement.needs.iter().any(|(dc, _)| {
            dc.as_deref()
                .is_none_or(|dc| dc == candidate.datacenter.as_str())
        });
        if useful {
            chosen.push(candidate);
        }
    }
    Ok((requirement, chosen, candidates))
}

/// An [`Engine`] view of a table across the cluster, for scans (which run on blocking
/// threads): each cursor walks the tablets of its range in token order, fetching chunks
/// of cells from the replicas the consistency level needs and reconciling them.
pub(crate) struct ReplicatedView {
    pub coordinator: Arc<Coordinator>,
    pub table_id: [u8; 16],
    pub consistency: Consistency,
    pub runtime: tokio::runtime::Handle,
    /// The first error a cursor met (Unavailable, ReadTimeout...), for the client: the
    /// reader only sees a storage error.
    pub error: parking_lot::Mutex<Option<CqlError>>,
}

struct ReplicatedCursor<'v> {
    view: &'v ReplicatedView,
    /// Next key to fetch from; `None` when the range is exhausted.
    next: Option<Vec<u8>>,
    upper: Vec<u8>,
    buffer: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    error: Option<String>,
}

impl ReplicatedCursor<'_> {
    fn fill(&mut self) {
        while self.buffer.is_empty() && self.error.is_none() {
            let Some(start) = self.next.take() else {
                return;
            };
            if start >= self.upper {
                return;
            }
            match self.fetch(&start) {
                Ok((cells, next)) => {
                    self.buffer.extend(cells);
                    self.next = next;
                }
                Err(error) => {
                    self.error = Some(error.message.clone());
                    self.view.error.lock().get_or_insert(error);
                }
            }
        }
    }

    /// One chunk from `start`: the cells, and where the next chunk starts.
    fn fetch(&self, start: &[u8]) -> Result<(Cells, Option<Vec<u8>>), CqlError> {
        let coordinator = &self.view.coordinator;
        let Some(cluster) = &coordinator.cluster else {
            return Err(CqlError::server("not part of a cluster"));
        };
        let state = cluster.metadata.state();
        let token = keys::split_partition(start)
            .map(|(t, _, _)| t)
            .or_else(|| {
                start
                    .get(keys::TABLE_ID_LENGTH..keys::TOKEN_PREFIX_LENGTH)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(Token::from_sortable_bytes)
            })
            .unwrap_or(Token::MIN);
        let placement = state
            .tables
            .get(&self.view.table_id)
            .ok_or_else(|| CqlError::invalid("the table was dropped during the scan"))?;
        let tablet = placement.tablets.tablet_for(token);
        // The tablet ends after its last token: the next tablet starts at last + 1.
        let tablet_end = if tablet.last_token == Token::MAX {
            keys::table_end(&self.view.table_id)
        } else {
            keys::token_prefix(&self.view.table_id, Token(tablet.last_token.0 + 1))
        };
        let chunk_upper = std::cmp::min(tablet_end.clone(), self.upper.clone());
        let replicas = cluster.replicas_of(&state, &self.view.table_id, token);
        let reconciled = self.view.runtime.block_on(coordinator.read_replicas(
            cluster,
            &replicas,
            self.view.consistency,
            start,
            &chunk_upper,
            SCAN_CHUNK_CELLS,
        ))?;
        let next = match reconciled.covered_until {
            Some(covered) => Some(covered),
            None => Some(chunk_upper),
        };
        Ok((reconciled.cells, next))
    }
}

impl Cursor for ReplicatedCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.buffer
            .front()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
    }

    fn advance(&mut self) {
        self.buffer.pop_front();
        self.fill();
    }

    fn skip_to(&mut self, key: &[u8]) {
        while self.buffer.front().is_some_and(|(k, _)| k.as_slice() < key) {
            self.buffer.pop_front();
        }
        if self.buffer.is_empty() {
            if self.next.as_ref().is_some_and(|n| n.as_slice() < key) {
                self.next = Some(key.to_vec());
            }
            self.fill();
        }
    }

    fn status(&self) -> shoal_storage::Result<()> {
        match &self.error {
            Some(error) => Err(shoal_storage::StorageError::Io(error.clone())),
            None => Ok(()),
        }
    }
}

impl Engine for ReplicatedView {
    fn write(&self, _batch: &WriteBatch) -> shoal_storage::Result<()> {
        Err(read_only())
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> shoal_storage::Result<Box<dyn Cursor + 'a>> {
        let mut cursor = ReplicatedCursor {
            view: self,
            next: Some(lower.to_vec()),
            upper: upper.to_vec(),
            buffer: Default::default(),
            error: None,
        };
        cursor.fill();
        if !reverse {
            return Ok(Box::new(cursor));
        }
        let mut cells = Vec::new();
        while let Some((k, v)) = cursor.current() {
            cells.push((k.to_vec(), v.to_vec()));
            cursor.advance();
        }
        cursor.status()?;
        // Reverse scans only happen within one partition: read it forward, then reverse.
        cells.reverse();
        Ok(Box::new(shoal_storage::SnapshotCursor::new(cells, true)))
    }

    fn delete_range(&self, _lower: &[u8], _upper: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn sync(&self) -> shoal_storage::Result<()> {
        Ok(())
    }
    fn put_metadata(&self, _key: &[u8], _value: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn delete_metadata(&self, _key: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn metadata_with_prefix(&self, _prefix: &[u8]) -> shoal_storage::Result<Cells> {
        Ok(Vec::new())
    }
    fn set_gc_grace_seconds(&self, _table_id: [u8; 16], _seconds: i32) {}
    fn gc_grace_seconds(&self, _table_id: &[u8; 16]) -> Option<i32> {
        None
    }
    fn collect_garbage(&self) -> shoal_storage::Result<shoal_storage::GarbageReport> {
        Err(read_only())
    }
    fn flush(&self) -> shoal_storage::Result<()> {
        Ok(())
    }
    fn compact_all(&self) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn approximate_size_bytes(&self) -> u64 {
        0
    }
}

fn read_only() -> shoal_storage::StorageError {
    shoal_storage::StorageError::Io("a replicated view is read-only".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_follow_the_consistency_level() {
        let three = ["dc1", "dc1", "dc1"];
        assert_eq!(
            Requirement::of(Consistency::Quorum, &three, "dc1").block_for(),
            2
        );
        assert_eq!(
            Requirement::of(Consistency::All, &three, "dc1").block_for(),
            3
        );
        assert_eq!(
            Requirement::of(Consistency::One, &three, "dc1").block_for(),
            1
        );
        let two_dcs = ["dc1", "dc1", "dc1", "dc2", "dc2"];
        let local = Requirement::of(Consistency::LocalQuorum, &two_dcs, "dc2");
        assert_eq!(local.block_for(), 2);
        assert!(!local.met_by(["dc1", "dc1", "dc1"].into_iter()));
        assert!(local.met_by(["dc2", "dc2"].into_iter()));
        let each = Requirement::of(Consistency::EachQuorum, &two_dcs, "dc1");
        assert_eq!(each.block_for(), 4);
        assert!(!each.met_by(["dc1", "dc1", "dc2"].into_iter()));
        assert!(each.met_by(["dc1", "dc1", "dc2", "dc2"].into_iter()));
    }

    fn replica(id: u8) -> Replica {
        Replica {
            host_id: [id; 16],
            address: SocketAddr::from(([127, 0, 0, id], 7000)),
            datacenter: "dc1".into(),
            local: id == 1,
            alive: true,
        }
    }

    fn cell(timestamp: i64, value: &[u8]) -> Vec<u8> {
        Cell::live(
            shoal_model::timestamp::WriteTimestamp(timestamp),
            value.to_vec(),
        )
        .encode()
    }

    #[test]
    fn reconcile_keeps_the_newest_cell_and_repairs_stale_replicas() {
        let answers = vec![
            (
                replica(1),
                vec![
                    (b"a".to_vec(), cell(1, b"old")),
                    (b"b".to_vec(), cell(5, b"b")),
                ],
                true,
            ),
            (replica(2), vec![(b"a".to_vec(), cell(2, b"new"))], true),
        ];
        let reconciled = reconcile(&answers);
        assert_eq!(
            reconciled.cells,
            vec![
                (b"a".to_vec(), cell(2, b"new")),
                (b"b".to_vec(), cell(5, b"b"))
            ]
        );
        let repairs = repairs_for(&answers, &reconciled);
        assert_eq!(repairs.len(), 2);
        assert_eq!(repairs[0].1, vec![(b"a".to_vec(), cell(2, b"new"))]);
        assert_eq!(repairs[1].1, vec![(b"b".to_vec(), cell(5, b"b"))]);
    }

    #[test]
    fn a_replica_digest_matches_the_digest_of_the_same_cells_read_as_data() {
        let engine = MemoryEngine::new();
        let mut batch = WriteBatch::new();
        for (key, value) in [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")] {
            batch.merge(key.to_vec(), cell(1, value));
        }
        engine.write(&batch).unwrap();
        let (cells, complete) = local_read(&engine, b"a", b"z", u32::MAX).unwrap();
        assert!(complete);
        assert_eq!(
            local_digest(&engine, b"a", b"z", u32::MAX).unwrap(),
            (cells_digest(&cells), true)
        );
        // A newer cell on one replica changes its digest.
        let mut newer = WriteBatch::new();
        newer.merge(b"b".to_vec(), cell(2, b"2"));
        engine.write(&newer).unwrap();
        assert_ne!(
            local_digest(&engine, b"a", b"z", u32::MAX).unwrap().0,
            cells_digest(&cells)
        );
        // A limit cuts the digest short and says so.
        assert!(!local_digest(&engine, b"a", b"z", 2).unwrap().1);
    }

    #[test]
    fn an_incomplete_answer_limits_what_the_chunk_covers() {
        let answers = vec![
            (replica(1), vec![(b"a".to_vec(), cell(1, b"1"))], false),
            (
                replica(2),
                vec![
                    (b"a".to_vec(), cell(1, b"1")),
                    (b"c".to_vec(), cell(1, b"3")),
                ],
                true,
            ),
        ];
        let reconciled = reconcile(&answers);
        assert_eq!(
            reconciled.cells.len(),
            1,
            "c is beyond what replica 1 covered"
        );
        assert_eq!(reconciled.covered_until, Some(b"a\0".to_vec()));
    }
}
