//! Lightweight transactions: Paxos over a partition's replicas (design:
//! `docs/decisions/0013-lightweight-transactions.md`).
//!
//! Every conditional statement (`IF …`) and every read at `SERIAL`/`LOCAL_SERIAL` runs one
//! Paxos round on the replicas of its partition, as Cassandra's `StorageProxy.cas` does:
//!
//! 1. **Prepare** ([`prepare`]): a new [`Ballot`], higher than any this
//!    node has seen, is sent to every replica; a replica *promises* it when it is higher
//!    than every ballot it promised before and answers with the proposal it accepted last
//!    and the update it committed last. A quorum of promises is needed. Before the round
//!    goes on, what earlier rounds left behind is finished: an accepted proposal newer
//!    than every commit is proposed again under the new ballot and committed (then the
//!    round starts over), and replicas that missed the latest commit are sent it — so
//!    every commit is on a quorum before anything newer is decided.
//! 2. The caller checks its conditions against the partition and builds the update with
//!    the ballot's time as its timestamp (nothing is proposed when a condition fails or
//!    for a read). The partition comes with the promises, as in Cassandra's Paxos v2: each
//!    replica reads it as it promises, under the partition's lock, and the coordinator
//!    reconciles what the promising quorum sent ([`PreparedRound::partition`]) — no read
//!    round trip. When the prepare had to settle earlier rounds, or every replica is this
//!    node, the caller reads the partition at `QUORUM` instead.
//! 3. **Propose** ([`propose`]): replicas *accept* the update unless
//!    they promised a higher ballot since; a quorum of acceptances decides it.
//! 4. **Commit**: every replica applies the update (through its write log, with its index
//!    entries) and records it as its latest commit; the client is answered once the
//!    statement's own consistency level is met.
//!
//! A replica keeps its state per partition — the promise, the accepted proposal, the
//! latest commit — in one cell under [`PAXOS_TABLE_ID`], written through the write log
//! before it answers, and serializes the steps of one partition with a striped lock.
//! Contention (a higher ballot seen) retries after a random pause until
//! [`CAS_CONTENTION_TIMEOUT`]. Rounds one coordinator runs on one partition do not
//! contend with each other: they take turns ([`PartitionTurns`], first come first
//! served), so a hot partition's transactions queue on their coordinator instead of
//! preempting each other's ballots (ScyllaDB serializes them per key the same way); rounds
//! from different coordinators would duel, so a busy partition's transactions are run by
//! its first replica ([`crate::paxos_lead`]). An outcome that cannot be known (a proposal accepted by
//! some replicas but not a quorum, or no quorum answering) is `WriteTimeout` with write
//! type `CAS`, as in Cassandra.

use crate::consistency::{write_timeout, Requirement, WriteType, WRITE_TIMEOUT};
use crate::messages::{Cells, ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use crate::reconcile::{reconcile, Answer};
use crate::topology::{requirement, write_requirements, Replica, TabletReplicas};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, HostId, TableId, Token, WriteTimestamp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

mod acceptor;

#[cfg(test)]
pub(crate) use acceptor::stored_ballots;
pub use acceptor::{forget_state, PaxosReplica, Promise, Proposal};

/// The internal table id Paxos state is stored under (before the batchlog and hints).
pub const PAXOS_TABLE_ID: TableId = TableId([0xfd; 16]);

/// How long a round may retry under contention before it gives up (Cassandra's
/// `cas_contention_timeout`).
pub const CAS_CONTENTION_TIMEOUT: Duration = Duration::from_millis(1000);

/// The longest random pause before a round retries after losing to a higher ballot.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// How long a replica keeps a partition's Paxos state after its last change (ten days,
/// Cassandra's default `gc_grace_seconds`). Ballots are times, so a ballot newer than a
/// forgotten state is always higher than what it promised.
const STATE_TTL_SECONDS: i32 = 864_000;

/// Lock stripes a replica serializes the Paxos steps of one partition on.
const STATE_LOCK_STRIPES: usize = 1024;

/// A Paxos ballot: a time in microseconds and the node that made it (ties between
/// nodes). Ballots order by time first, so an update written with its ballot's time
/// as timestamp is newer than every update decided before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Ballot {
    pub micros: i64,
    pub node: u64,
}

impl Ballot {
    /// Lower than every ballot a node makes.
    pub const ZERO: Ballot = Ballot { micros: 0, node: 0 };

    /// The write timestamp of the update decided under this ballot.
    pub fn timestamp(self) -> WriteTimestamp {
        WriteTimestamp(self.micros)
    }
}

/// The partition a round is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PaxosKey {
    pub table: TableId,
    pub token: Token,
    pub partition_key: Vec<u8>,
}

impl PaxosKey {
    /// Where a replica keeps the partition's state: `PAXOS_TABLE_ID | token | table id ++
    /// partition key`.
    fn storage_key(&self) -> Vec<u8> {
        let mut inner = Vec::with_capacity(16 + self.partition_key.len());
        inner.extend_from_slice(&self.table.0);
        inner.extend_from_slice(&self.partition_key);
        keys::partition_prefix(&PAXOS_TABLE_ID, self.token, &inner)
    }

    /// The partition whose state is stored under `storage_key` (as
    /// [`PaxosKey::storage_key`] builds it); `None` for any other key.
    fn from_storage_key(storage_key: &[u8]) -> Option<PaxosKey> {
        let (token, inner, rest) = state_key_parts(storage_key)?;
        Some(PaxosKey {
            table: TableId(inner.get(..16)?.try_into().ok()?),
            token,
            partition_key: inner.get(16..)?.to_vec(),
        })
        .filter(|_| rest.is_empty())
    }
}

/// `(token, table id ++ partition key, rest)` of a key under [`PAXOS_TABLE_ID`].
fn state_key_parts(storage_key: &[u8]) -> Option<keys::PartitionParts<'_>> {
    if !storage_key.starts_with(&PAXOS_TABLE_ID.0) {
        return None;
    }
    keys::split_partition(storage_key)
}

/// Where the Paxos state of a tablet's partitions is stored: the keys of the token range
/// `(after, last]` under [`PAXOS_TABLE_ID`]. Every table's partitions of those tokens
/// are there; [`is_state_of`] tells which belong to one table.
///
/// A replica's Paxos state moves with its tablet (streaming): a proposal a quorum of the
/// old replicas accepted but nobody committed must still be found by a quorum of the new
/// ones, and a promise must keep holding on the replica that takes the place of the one
/// that made it.
pub fn state_range(after: Option<Token>, last: Token) -> (Vec<u8>, Vec<u8>) {
    keys::token_range(&PAXOS_TABLE_ID, after, last)
}

/// True when `storage_key` holds the Paxos state of a partition of `table`.
pub fn is_state_of(storage_key: &[u8], table: &TableId) -> bool {
    state_key_parts(storage_key).is_some_and(|(_, inner, _)| inner.starts_with(&table.0))
}

/// The replicas a round on one partition talks to, and the quorums it needs: a quorum
/// of the current replica set and, while the tablet moves, of the new one too.
pub(crate) struct Participants {
    /// The partition's replicas as writes see them (a commit's level is counted on them).
    current: TabletReplicas,
    /// Every replica of both sets, each once.
    replicas: Vec<Replica>,
    /// One per replica set: what it needs and which hosts are in it.
    quorums: Vec<(Requirement, Vec<HostId>)>,
}

impl Participants {
    /// The participants of `key`'s partition and the quorums `serial` needs of them:
    /// `Unavailable` when too few are alive.
    fn of(
        network: &dyn PaxosNetwork,
        key: &PaxosKey,
        serial: Consistency,
    ) -> Result<Participants, CqlError> {
        let current = network.replicas(key, serial)?;
        if current.replicas.is_empty() {
            return Err(CqlError::server(
                "no replicas are placed for this table yet; retry once the schema has settled",
            ));
        }
        let quorums = write_requirements(network.local_datacenter(), serial, &current)?
            .into_iter()
            .map(|(needed, set)| (needed, set.iter().map(|r| r.host_id).collect()))
            .collect();
        Ok(Participants {
            replicas: current.targets().into_iter().cloned().collect(),
            current,
            quorums,
        })
    }

    /// The participants the failure detector thinks are up.
    fn live(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.alive)
    }

    /// True when replies from `hosts` meet the quorum of every set.
    fn met_by(&self, hosts: &[HostId]) -> bool {
        self.quorums.iter().all(|(requirement, members)| {
            requirement.met_by(
                self.replicas
                    .iter()
                    .filter(|r| members.contains(&r.host_id) && hosts.contains(&r.host_id))
                    .map(|r| r.datacenter.as_str()),
            )
        })
    }

    /// Acknowledgements needed in all (for errors).
    fn block_for(&self) -> usize {
        self.quorums
            .iter()
            .map(|(requirement, _)| requirement.block_for())
            .sum()
    }
}

/// How a proposal fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposalOutcome {
    /// A quorum accepted it and it was committed at the level asked for.
    Committed,
    /// No replica accepted it: a higher ballot came first; the round may start over.
    Preempted,
}

/// Turns of the lightweight transactions one coordinator runs, per partition: a
/// transaction waits for the ones before it on its partition (in arrival order) instead
/// of competing with their ballots. Only partitions with a transaction queued or running
/// have an entry; finished ones are swept as the table grows.
#[derive(Default)]
pub struct PartitionTurns {
    turns: parking_lot::Mutex<TurnTable>,
}

#[derive(Default)]
struct TurnTable {
    by_partition: HashMap<PaxosKey, Weak<tokio::sync::Mutex<()>>>,
    /// The table is swept of finished partitions when it grows past this.
    sweep_at: usize,
}

/// Entries of the turn table below which it is never swept.
const TURN_TABLE_SWEEP_MINIMUM: usize = 1024;

/// A transaction's turn on its partition: the next one's starts when it is dropped.
pub struct Turn {
    _held: tokio::sync::OwnedMutexGuard<()>,
    /// Another transaction had the partition's turn when this one asked.
    waited: bool,
}

impl Turn {
    /// True when another transaction had the partition's turn when this one asked (the
    /// partition is busy).
    pub fn waited(&self) -> bool {
        self.waited
    }
}

impl PartitionTurns {
    /// Waits for `key`'s turn until `deadline`; `None` if it has not come by then.
    pub async fn wait(&self, key: &PaxosKey, deadline: Instant) -> Option<Turn> {
        let queue = {
            let mut table = self.turns.lock();
            if table.by_partition.len() >= table.sweep_at.max(TURN_TABLE_SWEEP_MINIMUM) {
                table
                    .by_partition
                    .retain(|_, queue| queue.strong_count() > 0);
                table.sweep_at = table.by_partition.len() * 2;
            }
            match table.by_partition.get(key).and_then(Weak::upgrade) {
                Some(queue) => queue,
                None => {
                    let queue = Arc::new(tokio::sync::Mutex::new(()));
                    table
                        .by_partition
                        .insert(key.clone(), Arc::downgrade(&queue));
                    queue
                }
            }
        };
        if let Ok(held) = Arc::clone(&queue).try_lock_owned() {
            return Some(Turn {
                _held: held,
                waited: false,
            });
        }
        // tokio's mutex is fair: waiters get it in the order they asked.
        let held = tokio::time::timeout_at(deadline, queue.lock_owned()).await;
        held.ok().map(|held| Turn {
            _held: held,
            waited: true,
        })
    }

    /// Partitions with an entry in the table (some may have finished since the last
    /// sweep).
    pub fn tracked(&self) -> usize {
        self.turns.lock().by_partition.len()
    }
}

/// The answer a round hands back after a successful prepare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedRound {
    pub ballot: Ballot,
    /// The partition as the promising quorum holds it, reconciled (read in the prepare,
    /// Cassandra's Paxos v2): the round then needs no read of its own. `None` when the
    /// replicas are all on this node (it reads its own engine), when the prepare had to
    /// settle earlier rounds first, or when the partition is too large to gather whole.
    pub partition: Option<Cells>,
    /// Another coordinator's ballot got in the way before this round was prepared (a
    /// higher promise, or an earlier round to finish): the partition is contended.
    pub contended: bool,
}

/// A random pause before retrying a contended round.
async fn pause_before_retry() {
    let millis = rand::random_range(0..MAX_RETRY_PAUSE.as_millis() as u64);
    tokio::time::sleep(Duration::from_millis(millis)).await;
}

pub(crate) fn cas_timeout(serial: Consistency, received: usize, block_for: usize) -> CqlError {
    write_timeout(serial, received, block_for, WriteType::Cas)
}

/// The acknowledgements a round on `key`'s partition needs at `serial`, for the errors of
/// a round that never got as far as asking (1 if the replicas cannot be named).
pub(crate) fn serial_block_for(
    network: &dyn PaxosNetwork,
    key: &PaxosKey,
    serial: Consistency,
) -> usize {
    Participants::of(network, key, serial).map_or(1, |participants| participants.block_for())
}

/// The ballots this node makes: each higher than the last and than every ballot seen.
#[derive(Default)]
pub struct BallotClock {
    last_micros: AtomicI64,
}

impl BallotClock {
    /// A new ballot of node `node`, later than `at_least` and every ballot made before.
    pub fn next(&self, node: u64, at_least: Ballot) -> Ballot {
        let now = shoal_model::timestamp::now_micros();
        let mut last = self.last_micros.load(Ordering::Relaxed);
        loop {
            let micros = now.max(last + 1).max(at_least.micros + 1);
            match self.last_micros.compare_exchange_weak(
                last,
                micros,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ballot { micros, node },
                Err(seen) => last = seen,
            }
        }
    }
}

/// The node part of this node's ballots.
pub(crate) fn ballot_node(host: HostId) -> u64 {
    u64::from_be_bytes(host.0[..8].try_into().unwrap_or([0; 8]))
}

/// What a round needs of the replication strategy that runs it: the replicas of a
/// partition, a way to reach each of them, and this node's ballots.
pub(crate) trait PaxosNetwork: Send + Sync {
    /// The replicas of `key`'s partition as writes see them (an error when `serial`
    /// cannot be met whatever is alive).
    fn replicas(&self, key: &PaxosKey, serial: Consistency) -> Result<TabletReplicas, CqlError>;
    /// The datacenter consistency levels are counted from.
    fn local_datacenter(&self) -> &str;
    /// Sends a request to one participant.
    fn call(
        &self,
        replica: &Replica,
        request: ReplicaRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>>;
    /// This node's ballots and the node part of them.
    fn ballots(&self) -> (&BallotClock, u64);
}

impl PaxosNetwork for StorageProxy {
    fn replicas(&self, key: &PaxosKey, _serial: Consistency) -> Result<TabletReplicas, CqlError> {
        let state = self.topology.state();
        Ok(self.write_replicas_of(&state, &key.table, key.token))
    }

    fn local_datacenter(&self) -> &str {
        StorageProxy::local_datacenter(self)
    }

    fn call(
        &self,
        replica: &Replica,
        request: ReplicaRequest,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>> {
        StorageProxy::call(self, replica, request, timeout)
    }

    fn ballots(&self) -> (&BallotClock, u64) {
        (&self.ballots, ballot_node(self.topology.me().host_id))
    }
}

/// Sends the request `request` builds to each of `replicas`: their answers as they come,
/// each with its replica.
fn send_to<'r>(
    network: &dyn PaxosNetwork,
    replicas: impl IntoIterator<Item = &'r Replica>,
    request: impl Fn() -> ReplicaRequest,
) -> FuturesUnordered<BoxFuture<'static, (Replica, Result<ReplicaResponse, String>)>> {
    replicas
        .into_iter()
        .map(|replica| {
            let call = network.call(replica, request(), WRITE_TIMEOUT);
            let replica = replica.clone();
            Box::pin(async move { (replica, call.await) }) as BoxFuture<'static, _>
        })
        .collect()
}

/// Prepares a round on `key`'s partition and finishes what earlier rounds left behind:
/// returns a ballot a quorum promised, with every earlier commit on a quorum. Retries
/// under contention until `deadline` (then `WriteTimeout`, type `CAS`).
pub(crate) async fn prepare(
    network: &dyn PaxosNetwork,
    key: &PaxosKey,
    serial: Consistency,
    deadline: Instant,
) -> Result<PreparedRound, CqlError> {
    let (clock, node) = network.ballots();
    let mut at_least = Ballot::ZERO;
    let mut contended = false;
    loop {
        let participants = Participants::of(network, key, serial)?;
        if Instant::now() >= deadline {
            return Err(cas_timeout(serial, 0, participants.block_for()));
        }
        let ballot = clock.next(node, at_least);
        // Replicas elsewhere read the partition as they promise; when they are all on
        // this node, it reads its own engine afterwards (no copy).
        let read = participants.replicas.iter().any(|r| !r.local);
        let promises = collect_promises(network, &participants, key, ballot, read).await;
        let granted: Vec<&(Replica, Promise)> =
            promises.iter().filter(|(_, p)| p.promised).collect();
        let hosts: Vec<HostId> = granted.iter().map(|(r, _)| r.host_id).collect();
        if !participants.met_by(&hosts) {
            let refused = promises.iter().filter(|(_, p)| !p.promised);
            match refused.map(|(_, p)| p.highest).max() {
                Some(highest) => {
                    // Contention: a higher ballot is under way. Try again above it.
                    at_least = at_least.max(highest);
                    contended = true;
                    pause_before_retry().await;
                    continue;
                }
                None => return Err(cas_timeout(serial, granted.len(), participants.block_for())),
            }
        }
        let latest_commit = granted
            .iter()
            .filter_map(|(_, p)| p.committed.as_ref())
            .max_by_key(|c| c.ballot);
        let in_progress = granted
            .iter()
            .filter_map(|(_, p)| p.accepted.as_ref())
            .max_by_key(|a| a.ballot)
            .filter(|a| latest_commit.is_none_or(|c| a.ballot > c.ballot));
        if let Some(in_progress) = in_progress {
            // An accepted proposal may have been decided: finish it under this ballot,
            // then start over.
            let again = Proposal {
                ballot,
                update: in_progress.update.clone(),
            };
            tracing::debug!(?ballot, "finishing an in-progress Paxos proposal");
            contended = true;
            let quorum = serial.serial_quorum();
            match propose_and_commit(network, &participants, key, again, quorum, serial).await? {
                ProposalOutcome::Committed => at_least = ballot,
                ProposalOutcome::Preempted => pause_before_retry().await,
            }
            continue;
        }
        // What the replicas read as they promised stands only if none had to be sent the
        // latest commit after (their read predates it): then the round reads afresh.
        let mut read_stands = true;
        if let Some(latest) = latest_commit {
            // Replicas that missed the latest commit get it before anything newer.
            let behind: Vec<&Replica> = granted
                .iter()
                .filter(|(_, p)| {
                    p.committed
                        .as_ref()
                        .is_none_or(|c| c.ballot < latest.ballot)
                })
                .map(|(r, _)| r)
                .collect();
            if !behind.is_empty() {
                if !commit_on(network, &behind, key, latest).await {
                    at_least = ballot;
                    pause_before_retry().await;
                    continue;
                }
                read_stands = false;
            }
            if latest.ballot.micros >= ballot.micros {
                // The same microsecond as the latest commit (another node's clock): its
                // update must stay older than ours, so take a later ballot.
                at_least = latest.ballot.max(ballot);
                continue;
            }
        }
        let partition = read_stands.then(|| read_in_prepare(promises)).flatten();
        return Ok(PreparedRound {
            ballot,
            partition,
            contended,
        });
    }
}

/// The partition as the promising replicas read it, reconciled: `None` when one of them
/// sent no cells (it was not asked to read) or the partition is too large to gather.
fn read_in_prepare(promises: Vec<(Replica, Promise)>) -> Option<Cells> {
    let answers: Vec<Answer> = promises
        .into_iter()
        .filter(|(_, promise)| promise.promised)
        .map(|(replica, promise)| {
            let (cells, complete) = promise.partition?;
            Some((replica, cells, complete))
        })
        .collect::<Option<_>>()?;
    let (reconciled, _) = reconcile(answers);
    reconciled
        .covered_until
        .is_none()
        .then_some(reconciled.cells)
}

/// Proposes `update` under the prepared round's ballot and commits it at `consistency`.
/// `Preempted` when no replica accepted (the round may start over); `WriteTimeout`
/// (`CAS`) when some but not a quorum did, so the outcome is unknown.
pub(crate) async fn propose(
    network: &dyn PaxosNetwork,
    key: &PaxosKey,
    ballot: Ballot,
    update: Cells,
    serial: Consistency,
    consistency: Consistency,
) -> Result<ProposalOutcome, CqlError> {
    let participants = Participants::of(network, key, serial)?;
    let proposal = Proposal { ballot, update };
    propose_and_commit(network, &participants, key, proposal, consistency, serial).await
}

/// Sends a prepare to every live participant and gathers the answers until the quorums
/// are met, a replica refuses, or every one has answered or timed out.
async fn collect_promises(
    network: &dyn PaxosNetwork,
    participants: &Participants,
    key: &PaxosKey,
    ballot: Ballot,
    read: bool,
) -> Vec<(Replica, Promise)> {
    let mut pending = send_to(network, participants.live(), || {
        ReplicaRequest::PaxosPrepare {
            key: key.clone(),
            ballot,
            read,
        }
    });
    let mut answers: Vec<(Replica, Promise)> = Vec::new();
    let mut promised: Vec<HostId> = Vec::new();
    while let Some((replica, answer)) = pending.next().await {
        match answer {
            Ok(ReplicaResponse::PaxosPromise(promise)) => {
                let refused = !promise.promised;
                if !refused {
                    promised.push(replica.host_id);
                }
                answers.push((replica, *promise));
                if refused || participants.met_by(&promised) {
                    break;
                }
            }
            Ok(other) => tracing::debug!(?other, "unexpected answer to a Paxos prepare"),
            Err(error) => tracing::debug!(%error, "a Paxos prepare failed"),
        }
    }
    answers
}

/// The propose and commit phases of one proposal.
async fn propose_and_commit(
    network: &dyn PaxosNetwork,
    participants: &Participants,
    key: &PaxosKey,
    proposal: Proposal,
    consistency: Consistency,
    serial: Consistency,
) -> Result<ProposalOutcome, CqlError> {
    let mut pending = send_to(network, participants.live(), || {
        ReplicaRequest::PaxosPropose {
            key: key.clone(),
            proposal: proposal.clone(),
        }
    });
    let (mut accepted, mut refused) = (Vec::new(), 0usize);
    while let Some((replica, answer)) = pending.next().await {
        match answer {
            Ok(ReplicaResponse::PaxosAccepted { accepted: true, .. }) => {
                accepted.push(replica.host_id);
                if participants.met_by(&accepted) {
                    break;
                }
            }
            Ok(ReplicaResponse::PaxosAccepted {
                accepted: false, ..
            }) => refused += 1,
            Ok(other) => tracing::debug!(?other, "unexpected answer to a Paxos proposal"),
            Err(error) => tracing::debug!(%error, "a Paxos proposal failed"),
        }
    }
    drop(pending);
    if !participants.met_by(&accepted) {
        if accepted.is_empty() && refused > 0 {
            return Ok(ProposalOutcome::Preempted);
        }
        // Accepted somewhere, or nobody answered: it may yet be decided.
        return Err(cas_timeout(
            serial,
            accepted.len(),
            participants.block_for(),
        ));
    }
    commit_everywhere(network, participants, key, proposal, consistency).await?;
    Ok(ProposalOutcome::Committed)
}

/// Sends the commit to every live participant; waits for `consistency` (not at `ANY`).
/// Deliveries still on their way finish in the background.
async fn commit_everywhere(
    network: &dyn PaxosNetwork,
    participants: &Participants,
    key: &PaxosKey,
    proposal: Proposal,
    consistency: Consistency,
) -> Result<(), CqlError> {
    let mut pending = send_to(network, participants.live(), || {
        ReplicaRequest::PaxosCommit {
            key: key.clone(),
            proposal: proposal.clone(),
        }
    });
    if consistency == Consistency::Any {
        tokio::spawn(async move { while pending.next().await.is_some() {} });
        return Ok(());
    }
    let needed = requirement(
        network.local_datacenter(),
        consistency,
        &participants.current,
    );
    let mut committed: Vec<Replica> = Vec::new();
    while let Some((replica, answer)) = pending.next().await {
        if matches!(answer, Ok(ReplicaResponse::Applied)) {
            committed.push(replica);
            if needed.met_by(committed.iter().map(|r| r.datacenter.as_str())) {
                tokio::spawn(async move { while pending.next().await.is_some() {} });
                return Ok(());
            }
        }
    }
    Err(write_timeout(
        consistency,
        committed.len(),
        needed.block_for(),
        WriteType::Simple,
    ))
}

/// Sends `latest` to replicas that missed it; true when every one applied it.
async fn commit_on(
    network: &dyn PaxosNetwork,
    replicas: &[&Replica],
    key: &PaxosKey,
    latest: &Proposal,
) -> bool {
    let answers: Vec<_> = send_to(network, replicas.iter().copied(), || {
        ReplicaRequest::PaxosCommit {
            key: key.clone(),
            proposal: latest.clone(),
        }
    })
    .collect()
    .await;
    answers
        .iter()
        .all(|(_, answer)| matches!(answer, Ok(ReplicaResponse::Applied)))
}
