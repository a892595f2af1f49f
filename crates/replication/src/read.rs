//! Reads: a partition (or a chunk of a range) from as many replicas as the consistency
//! level needs.
//!
//! 1. Data from one replica (this node when it is one), digests from the others
//!    ([`StorageProxy::read_with_digests`]). Equal digests settle it.
//! 2. Otherwise — a digest differs, a replica failed, the range was cut short — every
//!    chosen replica is read in full ([`StorageProxy::read_replicas`]), a replica that fails
//!    is replaced by a live standby, the answers are reconciled
//!    ([`crate::reconcile`]) and every replica that answered stale data is sent what it
//!    lacked before the client is answered (blocking read repair).
//!
//! A read at ONE on a replica is answered from this node's engine directly; one in
//! [`BACKGROUND_CHECK_EVERY`] such reads also compares the replicas in the background.

use crate::barrier::TopologyGuard;
use crate::consistency::Requirement;
use crate::consistency::{read_timeout, READ_TIMEOUT};
use crate::messages::{Cells, PartitionRef, ScanTicket};
use crate::proxy::StorageProxy;
use crate::reconcile::{reconcile, reconcile_before, repairs_for, Answer, Reconciled};
use crate::replica::cells_digest;
use crate::topology::{plan_read, Replica, TabletReplicas};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId};
use shoal_storage::{Engine, MemoryEngine, WriteBatch};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Cells of one partition a point read gathers whole; larger partitions are read in
/// chunks through [`crate::range::ReplicatedView`].
pub const GATHER_LIMIT_CELLS: u32 = 4096;
/// One in this many reads answered locally checks the other replicas in the background.
pub const BACKGROUND_CHECK_EVERY: u64 = 10;

/// Where a partition read finds its data.
pub enum PartitionSource {
    /// On this node: read its engine (ONE on a local replica, or no replication). Hold
    /// the guard until the engine has been read: a topology barrier waits for it.
    Local(TopologyGuard),
    /// Reconciled from the replicas.
    Merged(MemoryEngine),
    /// A partition too large to gather whole: read it as a scan, in chunks.
    TooLarge,
}

impl StorageProxy {
    /// Reads the partitions of `table` from their replicas at `consistency`, repairing
    /// replicas that answered with stale cells. Small partitions (the common case) come
    /// back whole; a partition beyond [`GATHER_LIMIT_CELLS`] is left to a scan, which
    /// fetches only as many chunks as the SELECT consumes.
    pub async fn read_partitions(
        &self,
        table: TableId,
        partitions: &[PartitionRef],
        consistency: Consistency,
    ) -> Result<PartitionSource, CqlError> {
        let guard = self.enter();
        let state = self.topology.state();
        let single = matches!(consistency, Consistency::One | Consistency::LocalOne);
        let all_local = partitions.iter().all(|(token, _)| {
            self.replicas_of(&state, &table, *token)
                .iter()
                .any(|r| r.local)
        });
        if single && all_local {
            shoal_trace::event(|| {
                format!(
                    "Reading {} partition(s) from this node, a replica (consistency {})",
                    partitions.len(),
                    consistency.name()
                )
            });
            return Ok(PartitionSource::Local(guard));
        }
        shoal_trace::event(|| {
            format!(
                "Reading {} partition(s) from their replicas at {}",
                partitions.len(),
                consistency.name()
            )
        });
        let merged = MemoryEngine::new();
        for (token, partition_key) in partitions {
            let replicas = self.replicas_of(&state, &table, *token);
            let lower = keys::partition_prefix(&table, *token, partition_key);
            let upper = keys::increment_prefix(&lower).unwrap_or_else(|| vec![0xff; 64]);
            let agreed = self
                .read_with_digests(&replicas, consistency, &lower, &upper, GATHER_LIMIT_CELLS)
                .await?;
            let reconciled = match agreed {
                Some(agreed) => agreed,
                None => {
                    tracing::debug!("digests disagree: reading every replica in full");
                    self.read_replicas(&replicas, consistency, &lower, &upper, GATHER_LIMIT_CELLS)
                        .await?
                }
            };
            if reconciled.covered_until.is_some() {
                return Ok(PartitionSource::TooLarge);
            }
            merged
                .write(&WriteBatch::from(reconciled.cells))
                .map_err(|e| CqlError::server(e.to_string()))?;
        }
        Ok(PartitionSource::Merged(merged))
    }

    /// Called after a read was answered locally: every [`BACKGROUND_CHECK_EVERY`]th time it
    /// compares the partitions' replicas in the background and repairs the stale ones, so
    /// that mismatches seen at ONE heal without the client waiting.
    pub fn after_local_read(self: &Arc<Self>, table: TableId, partitions: Vec<PartitionRef>) {
        if self.member_count() < 2 {
            return;
        }
        let reads = self.local_reads.fetch_add(1, Ordering::Relaxed);
        if !reads.is_multiple_of(BACKGROUND_CHECK_EVERY) {
            return;
        }
        // A bounded number at once: under a read storm, checks are skipped, not queued.
        let Ok(permit) = Arc::clone(&self.background_checks).try_acquire_owned() else {
            return;
        };
        let proxy = Arc::clone(self);
        tokio::spawn(async move {
            let _permit = permit;
            let _in_flight = proxy.enter();
            let state = proxy.topology.state();
            for (token, partition_key) in partitions {
                let replicas = proxy.replicas_of(&state, &table, token);
                if replicas.iter().filter(|r| r.alive).count() < 2 {
                    continue;
                }
                let lower = keys::partition_prefix(&table, token, &partition_key);
                let Some(upper) = keys::increment_prefix(&lower) else {
                    continue;
                };
                // ALL: compare every replica; a replica down makes it skip quietly.
                let _ = proxy
                    .read_replicas(&replicas, Consistency::All, &lower, &upper, u32::MAX)
                    .await;
            }
        });
    }

    /// Reads `[lower, upper)` with data from one replica and digests from the others the
    /// level needs. `Ok(None)` when that does not settle it — a digest differs, a replica
    /// failed, or the range is beyond `limit` — and a full read must follow.
    pub(crate) async fn read_with_digests(
        &self,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> Result<Option<Reconciled>, CqlError> {
        let (requirement, chosen, _) = plan_read(self.local_datacenter(), replicas, consistency)?;
        let Some((data_replica, digest_replicas)) = chosen.split_first() else {
            return Ok(None);
        };
        if digest_replicas.is_empty() {
            return Ok(None);
        }
        // Answers so far, for a ReadTimeout's counts.
        let answered = AtomicUsize::new(0);
        let data_present = AtomicBool::new(false);
        let count = |ok: bool| {
            if ok {
                answered.fetch_add(1, Ordering::Relaxed);
            }
        };
        let data_read = self.read_cells_on(data_replica, lower, upper, limit, None);
        let data = async {
            let result = data_read.await;
            count(result.is_ok());
            data_present.store(result.is_ok(), Ordering::Relaxed);
            result
        };
        let digests = futures::future::join_all(digest_replicas.iter().map(|replica| {
            let digest = self.digest_on(replica, lower, upper, limit);
            let count = &count;
            async move {
                let result = digest.await;
                count(result.is_ok());
                result
            }
        }));
        let Ok((data, digests)) =
            tokio::time::timeout(READ_TIMEOUT, futures::future::join(data, digests)).await
        else {
            return Err(read_timeout(
                consistency,
                answered.load(Ordering::Relaxed),
                requirement.block_for(),
                data_present.load(Ordering::Relaxed),
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
            covered_from: None,
            repaired: 0,
        }))
    }

    /// Reads `[lower, upper)` from enough replicas for `consistency`, reconciles and
    /// repairs. With a `limit`, the result covers `[lower, covered_until)` only.
    pub(crate) async fn read_replicas(
        &self,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> Result<Reconciled, CqlError> {
        self.read_replicas_for(replicas, consistency, lower, upper, limit, None)
            .await
    }

    /// [`StorageProxy::read_replicas`], for one chunk of `scan` when there is one: each
    /// replica then serves it in the scan's turn, and the chunk may wait for its turn up
    /// to the range timeout (`crate::RANGE_READ_TIMEOUT` unless configured).
    pub(crate) async fn read_replicas_for(
        &self,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
        scan: Option<ScanTicket>,
    ) -> Result<Reconciled, CqlError> {
        let timeout = match scan {
            Some(_) => self.range_timeout,
            None => READ_TIMEOUT,
        };
        let (requirement, answers) = self
            .gather(replicas, consistency, timeout, |replica| {
                self.read_cells_on(replica, lower, upper, limit, scan)
            })
            .await?;
        let answers: Vec<Answer> = answers
            .into_iter()
            .map(|(replica, (cells, complete))| (replica, cells, complete))
            .collect();
        let (mut reconciled, answers) = reconcile(answers);
        self.read_repair(&requirement, consistency, &answers, &mut reconciled)
            .await?;
        Ok(reconciled)
    }

    /// Reads the last cells of `[lower, upper)` — at most about `limit` — from enough
    /// replicas, reconciles and repairs: the result covers `[covered_from, upper)`. What
    /// reverse scans fetch, chunk by chunk, from the end.
    pub(crate) async fn read_replicas_before(
        &self,
        replicas: &TabletReplicas,
        consistency: Consistency,
        lower: &[u8],
        upper: &[u8],
        limit: u32,
    ) -> Result<Reconciled, CqlError> {
        let (requirement, answers) = self
            .gather(replicas, consistency, READ_TIMEOUT, |replica| {
                self.read_cells_before_on(replica, lower, upper, limit)
            })
            .await?;
        let answers = answers
            .into_iter()
            .map(|(replica, (cells, from))| (replica, cells, from))
            .collect();
        let (mut reconciled, answers) = reconcile_before(answers);
        self.read_repair(&requirement, consistency, &answers, &mut reconciled)
            .await?;
        Ok(reconciled)
    }

    /// Asks the replicas `consistency` needs with `read`, replacing one that fails by a
    /// live standby, until enough answered (`ReadTimeout` otherwise).
    async fn gather<T: Send + 'static>(
        &self,
        replicas: &TabletReplicas,
        consistency: Consistency,
        timeout: Duration,
        read: impl Fn(&Replica) -> BoxFuture<'static, Result<T, String>>,
    ) -> Result<(Requirement, Vec<(Replica, T)>), CqlError> {
        let (requirement, chosen, candidates) =
            plan_read(self.local_datacenter(), replicas, consistency)?;
        let start_read = |replica: Replica| -> BoxFuture<'static, (Replica, Result<T, String>)> {
            let answer = read(&replica);
            Box::pin(async move { (replica, answer.await) })
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
        let mut answers: Vec<(Replica, T)> = Vec::new();
        let timeout = tokio::time::sleep(timeout);
        tokio::pin!(timeout);
        while !requirement.met_by(answers.iter().map(|(r, _)| r.datacenter.as_str())) {
            tokio::select! {
                read = reads.next() => match read {
                    Some((replica, Ok(answer))) => answers.push((replica, answer)),
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
        if !requirement.met_by(answers.iter().map(|(r, _)| r.datacenter.as_str())) {
            return Err(read_timeout(
                consistency,
                answers.len(),
                requirement.block_for(),
                !answers.is_empty(),
            ));
        }
        Ok((requirement, answers))
    }

    /// Blocking read repair: sends every replica that answered stale data what it lacked,
    /// and fails unless enough replicas hold the reconciled answer afterwards — those that
    /// had it all and those that acknowledged their repair. Otherwise a later read of
    /// another quorum could go back in time.
    async fn read_repair(
        &self,
        requirement: &Requirement,
        consistency: Consistency,
        answers: &[Answer],
        reconciled: &mut Reconciled,
    ) -> Result<(), CqlError> {
        let repairs = repairs_for(answers, reconciled);
        if repairs.is_empty() {
            return Ok(());
        }
        reconciled.repaired = repairs.iter().map(|(_, cells)| cells.len()).sum();
        let mut holding: Vec<String> = answers
            .iter()
            .filter(|(replica, _, _)| !repairs.iter().any(|(r, _)| r.host_id == replica.host_id))
            .map(|(replica, _, _)| replica.datacenter.clone())
            .collect();
        holding.extend(self.send_repairs(repairs).await);
        if !requirement.met_by(holding.iter().map(String::as_str)) {
            return Err(read_timeout(
                consistency,
                holding.len(),
                requirement.block_for(),
                true,
            ));
        }
        Ok(())
    }

    /// Sends each replica the cells it lacked; the datacenters of those that
    /// acknowledged.
    async fn send_repairs(&self, repairs: Vec<(Replica, Cells)>) -> Vec<String> {
        let mut sends = FuturesUnordered::new();
        for (replica, cells) in repairs {
            tracing::debug!(replica = %replica.address, cells = cells.len(), "read repair");
            self.repairs.read_repairs.fetch_add(1, Ordering::Relaxed);
            self.repairs
                .read_repair_cells
                .fetch_add(cells.len() as u64, Ordering::Relaxed);
            let applied = self.apply_on(&replica, cells);
            sends.push(async move { (replica.datacenter, applied.await) });
        }
        let mut acknowledged = Vec::new();
        while let Some((datacenter, applied)) = sends.next().await {
            if applied {
                acknowledged.push(datacenter);
            }
        }
        acknowledged
    }
}
