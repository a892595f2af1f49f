//! [`StorageProxy`]: leaderless replication (seed 000's tunable consistency), the
//! coordinator's side. Its parts live beside it: [`crate::write`] (fan-out of writes),
//! [`crate::read`] (digest and full reads, read repair), [`crate::range`] (scans across
//! tablets), [`crate::truncate`].
//!
//! Every request to a replica goes through [`StorageProxy::call`], whether the replica is
//! this node (served in place by [`LocalReplica`], no serialization) or another one (sent
//! through the [`ReplicaTransport`]).

use crate::barrier::{InFlight, MissedDeliveries, Settled, TopologyGuard};
use crate::consistency::{RANGE_READ_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT};
use crate::hints::Hints;
use crate::messages::{packed, Cells, CellsFrom, ReplicaRequest, ReplicaResponse, ScanTicket};
use crate::replica::LocalReplica;
use crate::topology::{replicas_of, write_replicas_of, Replica, TabletReplicas, Topology};
use crate::transport::{Liveness, ReplicaTransport};
use futures::future::BoxFuture;
use shoal_cluster::ClusterState;
use shoal_model::{TableId, Token};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// The coordinator side of leaderless replication for one node.
pub struct StorageProxy {
    pub(crate) topology: Arc<dyn Topology>,
    pub(crate) transport: Arc<dyn ReplicaTransport>,
    pub(crate) liveness: Arc<dyn Liveness>,
    pub(crate) local: Arc<LocalReplica>,
    pub(crate) hints: Arc<Hints>,
    /// Reads answered locally so far, for sampling background replica checks.
    pub(crate) local_reads: AtomicU64,
    /// Background replica checks allowed to run at once.
    pub(crate) background_checks: Arc<tokio::sync::Semaphore>,
    /// What repairs did on this node as coordinator (the metrics).
    pub(crate) repairs: RepairCounters,
    /// Requests under way, by the epoch they began in (topology barriers wait for them).
    pub(crate) in_flight: InFlight,
    /// Deliveries of the writes it coordinated that failed, per replica (barriers answer
    /// them).
    pub(crate) missed: Arc<MissedDeliveries>,
    /// The Paxos ballots this node makes ([`crate::paxos`]).
    pub(crate) ballots: crate::paxos::BallotClock,
    /// Turns of the lightweight transactions this node runs rounds for, per partition.
    pub(crate) paxos_turns: crate::paxos::PartitionTurns,
    /// Turns it holds for transactions other nodes coordinate ([`crate::paxos_lead`]).
    pub(crate) paxos_leases: Arc<crate::paxos_lead::Leases>,
    /// Partitions whose transactions it hands to their leader while they are busy.
    pub(crate) hot_partitions: crate::paxos_lead::HotPartitions,
    /// Cells per tablet of each table, as replicas told it with their scan replies (and
    /// as the whole tablets its scans read).
    pub(crate) scan_estimates: Arc<crate::estimates::ScanEstimates>,
    /// Tablets a scan fetches at once at most.
    pub(crate) parallel_tablets: usize,
    /// Cells a scan asks of a replica in one chunk at most (`scan_chunk_cells`;
    /// [`crate::range::SCAN_CHUNK_CELLS`] by default).
    pub(crate) chunk_cells: u32,
    /// How long a scan chunk may take, its wait for its turn on the replica included
    /// (`range_request_timeout_ms`; [`RANGE_READ_TIMEOUT`] by default).
    pub(crate) range_timeout: std::time::Duration,
}

/// Counts of repairs coordinated by this node since it started.
#[derive(Debug, Default)]
pub struct RepairCounters {
    /// Replicas sent the cells they lacked by a read (blocking or background).
    pub read_repairs: AtomicU64,
    /// Cells those read repairs sent.
    pub read_repair_cells: AtomicU64,
    /// Anti-entropy repairs (`shoal admin repair`) finished.
    pub repairs_finished: AtomicU64,
    /// Cells anti-entropy repairs sent to replicas that lacked them.
    pub repair_cells: AtomicU64,
}

/// Background replica checks (after reads answered locally) running at most at once.
pub const MAX_BACKGROUND_CHECKS: usize = 16;

impl StorageProxy {
    pub fn new(
        topology: Arc<dyn Topology>,
        transport: Arc<dyn ReplicaTransport>,
        liveness: Arc<dyn Liveness>,
        local: Arc<LocalReplica>,
        hints: Arc<Hints>,
    ) -> StorageProxy {
        local.tablet_cells.follow(Arc::clone(&topology));
        StorageProxy {
            topology,
            transport,
            liveness,
            local,
            hints,
            local_reads: AtomicU64::new(0),
            background_checks: Arc::new(tokio::sync::Semaphore::new(MAX_BACKGROUND_CHECKS)),
            repairs: RepairCounters::default(),
            in_flight: InFlight::default(),
            missed: Arc::default(),
            ballots: crate::paxos::BallotClock::default(),
            paxos_turns: crate::paxos::PartitionTurns::default(),
            paxos_leases: Arc::default(),
            hot_partitions: Default::default(),
            scan_estimates: Default::default(),
            parallel_tablets: crate::estimates::MAX_PARALLEL_TABLETS,
            chunk_cells: crate::range::SCAN_CHUNK_CELLS,
            range_timeout: RANGE_READ_TIMEOUT,
        }
    }

    /// The proxy with scan chunks given `timeout` instead of [`RANGE_READ_TIMEOUT`].
    pub fn with_range_timeout(mut self, timeout: std::time::Duration) -> StorageProxy {
        self.range_timeout = timeout;
        self
    }

    /// The proxy with scans fetching at most `tablets` tablets at once (at least one).
    pub fn fetching_tablets_at_once(mut self, tablets: usize) -> StorageProxy {
        self.parallel_tablets = tablets.max(1);
        self
    }

    /// The proxy with scans asking replicas for at most `cells` cells per chunk (at least
    /// one).
    pub fn chunking_scans_by(mut self, cells: u32) -> StorageProxy {
        self.chunk_cells = cells.max(1);
        self
    }

    /// Enters the current epoch; call it before reading the tablet map and hold it until
    /// the last replica of the request has answered.
    pub fn enter(&self) -> TopologyGuard {
        self.in_flight.enter()
    }

    /// The first half of the topology barrier for `version` on this node (see
    /// [`crate::barrier`]): waits until the node has applied it and every request it
    /// routed by an older tablet map is over, deliveries finishing in the background
    /// included; then answers the deliveries that failed so far. Errs when that takes
    /// longer than `bound`.
    pub async fn settle(&self, version: u64, bound: Duration) -> Result<Settled, String> {
        let start = tokio::time::Instant::now();
        if !self.topology.reached(version, bound).await {
            return Err(format!(
                "this node has not applied topology version {version} within {bound:?}"
            ));
        }
        let left = bound.saturating_sub(start.elapsed());
        self.in_flight.drain_before(version, left).await?;
        Ok(self.missed.settled())
    }

    /// The second half, once every live node has settled: from now on this node, as a
    /// replica, refuses requests routed by a tablet map older than `version`.
    pub fn fence(&self, version: u64) {
        self.local.fence.raise(version);
    }

    /// The topology as this node has applied it.
    pub fn topology(&self) -> &Arc<dyn Topology> {
        &self.topology
    }

    /// What repairs coordinated here did since the node started.
    pub fn repair_counters(&self) -> &RepairCounters {
        &self.repairs
    }

    /// Writes kept for replicas that are down.
    pub fn hints(&self) -> &Arc<Hints> {
        &self.hints
    }

    /// The failure detector's view.
    pub fn liveness(&self) -> &Arc<dyn Liveness> {
        &self.liveness
    }

    /// This node as a replica.
    pub fn local(&self) -> &Arc<LocalReplica> {
        &self.local
    }

    pub(crate) fn local_datacenter(&self) -> &str {
        &self.topology.me().datacenter
    }

    /// The replicas a write of `token` in `table` goes to, as this request sees them.
    pub(crate) fn write_replicas_of(
        &self,
        state: &ClusterState,
        table: &TableId,
        token: Token,
    ) -> TabletReplicas {
        write_replicas_of(
            self.topology.me(),
            self.liveness.as_ref(),
            state,
            table,
            token,
        )
    }

    /// The replicas reads of `token` in `table` ask, as this request sees them.
    pub(crate) fn replicas_of(
        &self,
        state: &ClusterState,
        table: &TableId,
        token: Token,
    ) -> TabletReplicas {
        replicas_of(
            self.topology.me(),
            self.liveness.as_ref(),
            state,
            table,
            token,
        )
    }

    /// Sends `request` to `replica`: served in place when it is this node, through the
    /// transport otherwise. The one path every replica request takes.
    pub(crate) fn call(
        &self,
        replica: &Replica,
        request: ReplicaRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>> {
        // A traced request records each message and its answer; the trace goes along
        // with the future, which may outlive the request's task (a write answered at ONE).
        let trace = shoal_trace::current();
        if let Some(trace) = &trace {
            trace.record(if replica.local {
                format!("Executing {} on this node", request.describe())
            } else {
                format!(
                    "Sending {} message to /{}",
                    request.describe(),
                    replica.address.ip()
                )
            });
        }
        let (address, local) = (replica.address, replica.local);
        let traced = move |answer: &Result<ReplicaResponse, String>| {
            if let Some(trace) = &trace {
                let from = if local {
                    "This node".to_string()
                } else {
                    format!("/{}", address.ip())
                };
                trace.record(match answer {
                    Ok(response) => format!("{from} answered {}", response.describe()),
                    Err(error) => format!("{from} failed: {error}"),
                });
            }
        };
        if replica.local {
            let local = Arc::clone(&self.local);
            return Box::pin(async move {
                let response = match request {
                    ReplicaRequest::ScanChunk { scan, .. } => {
                        local.serve_scan_chunk(scan, request, None).await
                    }
                    request => local.serve(request).await,
                };
                let answer = match response {
                    ReplicaResponse::Error(error) => Err(error),
                    response => Ok(response),
                };
                traced(&answer);
                answer
            });
        }
        let sent = self
            .transport
            .send(replica.address, request, replica.topology_version, timeout);
        Box::pin(async move {
            let answer = match sent.await {
                Ok(ReplicaResponse::Error(error)) | Err(error) => Err(error),
                Ok(response) => Ok(response),
            };
            traced(&answer);
            answer
        })
    }

    /// Applies `cells` on `replica`; resolves to whether it acknowledged.
    pub(crate) fn apply_on(&self, replica: &Replica, cells: Cells) -> BoxFuture<'static, bool> {
        let applied = self.call(replica, ReplicaRequest::Apply(cells), WRITE_TIMEOUT);
        Box::pin(async move { matches!(applied.await, Ok(ReplicaResponse::Applied)) })
    }

    /// Asks `replica` a read and takes the answer `expected` picks out of its response;
    /// any other answer is an error.
    fn read_on<T: Send + 'static>(
        &self,
        replica: &Replica,
        request: ReplicaRequest,
        expected: impl FnOnce(ReplicaResponse) -> Result<T, ReplicaResponse> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, String>> {
        let timeout = match request {
            ReplicaRequest::ScanChunk { .. } => self.range_timeout,
            _ => READ_TIMEOUT,
        };
        let read = self.call(replica, request, timeout);
        Box::pin(async move {
            expected(read.await?).map_err(|other| format!("unexpected answer {other:?}"))
        })
    }

    /// The visible cells of `[lower, upper)` on `replica`, at most `limit`; in the turn
    /// of `scan` when they are a chunk of one.
    pub(crate) fn read_cells_on(
        &self,
        replica: &Replica,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
        scan: Option<ScanTicket>,
    ) -> BoxFuture<'static, Result<(Cells, bool), String>> {
        let (lower, upper) = (lower.to_vec(), upper.to_vec());
        let request = match scan {
            Some(scan) => ReplicaRequest::ScanChunk {
                lower,
                upper,
                limit,
                scan,
            },
            None => ReplicaRequest::Read {
                lower,
                upper,
                limit,
            },
        };
        let estimates = Arc::clone(&self.scan_estimates);
        self.read_on(replica, request, move |response| match response {
            ReplicaResponse::Cells { cells, complete } => Ok((cells, complete)),
            ReplicaResponse::ScanCells {
                cells,
                complete,
                estimates: tablet_cells,
            } => {
                estimates.record(&tablet_cells);
                Ok((cells, complete))
            }
            // Unpacked here, where the scan waits for it: on its scan thread.
            ReplicaResponse::PackedScanCells {
                cells,
                complete,
                estimates: tablet_cells,
            } => {
                if let Some(tablet_cells) = tablet_cells {
                    estimates.record(&tablet_cells);
                }
                let cells = packed::unpack(&cells).map_err(ReplicaResponse::Error)?;
                Ok((cells, complete))
            }
            other => Err(other),
        })
    }

    /// The last visible cells of `[lower, upper)` on `replica`, at most `limit`, and where
    /// they start (`None`: at `lower`).
    pub(crate) fn read_cells_before_on(
        &self,
        replica: &Replica,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> BoxFuture<'static, Result<CellsFrom, String>> {
        let request = ReplicaRequest::ReadBefore {
            lower: lower.to_vec(),
            upper: upper.to_vec(),
            limit,
        };
        self.read_on(replica, request, |response| match response {
            ReplicaResponse::CellsFrom { cells, from } => Ok((cells, from)),
            other => Err(other),
        })
    }

    /// The digest of what [`StorageProxy::read_cells_on`] would return.
    pub(crate) fn digest_on(
        &self,
        replica: &Replica,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> BoxFuture<'static, Result<(u64, bool), String>> {
        let request = ReplicaRequest::Digest {
            lower: lower.to_vec(),
            upper: upper.to_vec(),
            limit,
        };
        self.read_on(replica, request, |response| match response {
            ReplicaResponse::Digest { hash, complete } => Ok((hash, complete)),
            other => Err(other),
        })
    }

    /// Members of the cluster as this node knows them.
    pub fn member_count(&self) -> usize {
        self.topology.state().members.len().max(1)
    }
}
