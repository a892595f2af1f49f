//! Conditional statements (`IF …`) and SERIAL reads on the tables of strongly consistent
//! keyspaces: decided by the tablet's Raft leader, one consensus round per applied
//! transaction, instead of Paxos's three quorum round trips.
//!
//! The statement's CQL semantics stay on the node that parsed it (the coordinator); the
//! leader only guarantees that nothing reaches the partition between the read the
//! conditions are checked against and the update:
//!
//! 1. **Lock** ([`StrongRequest::Lock`]): the leader takes the partition's lock
//!    exclusively, waits until every entry its log holds is applied
//!    ([`shoal_consensus::runtime::RaftHandle::settled_read`]: it leads under a valid
//!    lease, and entries still in flight are applied first), reads the partition and
//!    answers with its cells and a lease on the lock.
//! 2. The coordinator checks the conditions. If they hold, it sends the update with the
//!    lease ([`StrongRequest::ProposeLocked`]): the leader appends it — only if it still
//!    leads in the term it read in — and answers once it is applied, then lets the lock
//!    go. A transaction that writes nothing (its conditions failed, a SERIAL read) ends
//!    the lease ([`StrongRequest::Unlock`]); a coordinator that vanished leaves one that
//!    ends after [`LEASE_TIME`].
//!
//! Every plain write the leader proposes to the partition holds the same lock shared
//! until it is applied ([`PartitionLocks::shared`]), so between the read and the append
//! nothing else can be appended to the partition: entries from before are applied
//! (the settled read), entries proposed since wait for the lock, and a leader that lost
//! office since the read — whose log may have taken other leaders' entries — has its
//! proposal refused by the term check. So an applied transaction's read saw every entry
//! before its own, and a not-applied answer is a read at the leader like any strong read:
//! linearizable.
//!
//! Locks are striped by table and token ([`LOCK_STRIPES`]): partitions that share a
//! stripe take turns, which costs only when conditional statements are frequent.

use super::{StrongReply, StrongRequest, StrongTables};
use shoal_consensus::runtime::ProposeError;
use shoal_consensus::{GroupId, Proposal};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, Token};
use shoal_replication::consistency::{write_timeout, WriteType};
use shoal_replication::paxos::{Ballot, PaxosKey, PreparedRound, ProposalOutcome};
use shoal_replication::Cells;
use shoal_storage::WriteBatch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Partition locks per node (a power of two).
pub const LOCK_STRIPES: usize = 4096;
/// How long a lease holds its lock when its coordinator never proposes nor ends it.
pub const LEASE_TIME: Duration = Duration::from_secs(2);
/// How long the leader waits for a partition's lock before it answers that the partition
/// is busy.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The leader's partition locks: exclusive for a conditional statement from its read to
/// its update's apply, shared for every other write from its proposal to its apply.
pub struct PartitionLocks {
    stripes: Vec<Arc<RwLock<()>>>,
}

impl Default for PartitionLocks {
    fn default() -> Self {
        PartitionLocks {
            stripes: (0..LOCK_STRIPES).map(|_| Arc::default()).collect(),
        }
    }
}

impl PartitionLocks {
    fn stripe(&self, table: &TableId, token: Token) -> Arc<RwLock<()>> {
        let table_bits = u64::from_le_bytes(table.0[..8].try_into().unwrap_or_default());
        let mixed = (token.0 as u64 ^ table_bits).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let index = (mixed >> (64 - LOCK_STRIPES.trailing_zeros())) as usize;
        Arc::clone(&self.stripes[index])
    }

    /// The lock a plain write of a partition holds until it is applied (`None`: not in
    /// time).
    pub async fn shared(
        &self,
        (table, token): (TableId, Token),
        deadline: tokio::time::Instant,
    ) -> Option<OwnedRwLockReadGuard<()>> {
        let stripe = self.stripe(&table, token);
        tokio::time::timeout_at(deadline, stripe.read_owned())
            .await
            .ok()
    }

    async fn exclusive(&self, table: &TableId, token: Token) -> Option<OwnedRwLockWriteGuard<()>> {
        let stripe = self.stripe(table, token);
        tokio::time::timeout(LOCK_WAIT, stripe.write_owned())
            .await
            .ok()
    }
}

/// One conditional statement's hold on its partition, between its read and its update.
struct Lease {
    table: TableId,
    token: Token,
    /// The term the read was made in: the update is appended only in it.
    term: shoal_consensus::Term,
    _lock: OwnedRwLockWriteGuard<()>,
}

/// The leases this node granted as a leader, by number.
pub struct Leases {
    held: parking_lot::Mutex<HashMap<u64, Lease>>,
    /// Numbers start at random: a coordinator holding a number from before a restart does
    /// not name a lease granted since.
    next: AtomicU64,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            held: parking_lot::Mutex::default(),
            next: AtomicU64::new(rand::random::<u64>() >> 1),
        }
    }
}

impl Leases {
    fn grant(self: &Arc<Self>, lease: Lease) -> u64 {
        let number = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.held.lock().insert(number, lease);
        let leases = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(LEASE_TIME).await;
            if let Some(leases) = leases.upgrade() {
                if leases.held.lock().remove(&number).is_some() {
                    tracing::debug!(number, "a conditional statement's lease expired");
                }
            }
        });
        number
    }

    fn take(&self, number: u64) -> Option<Lease> {
        self.held.lock().remove(&number)
    }

    /// Ends lease `number` (its coordinator proposes nothing).
    pub fn end(&self, number: u64) {
        self.take(number);
    }

    /// Leases held now.
    pub fn count(&self) -> usize {
        self.held.lock().len()
    }
}

/// A conditional statement's turn, as the coordinator keeps it: the lease it holds on
/// the leader, ended when the turn is dropped without proposing.
pub struct StrongTurn {
    tables: Arc<StrongTables>,
    lease: Option<(HostId, u64)>,
}

impl StrongTurn {
    pub fn new(tables: Arc<StrongTables>) -> StrongTurn {
        StrongTurn {
            tables,
            lease: None,
        }
    }

    /// Ends the lease held, if any (without waiting for the leader).
    fn end_lease(&mut self) {
        if let Some((leader, number)) = self.lease.take() {
            let tables = Arc::clone(&self.tables);
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + LEASE_TIME;
                if leader == tables.me {
                    tables.leases.end(number);
                } else {
                    // Unanswered, the lease ends by itself when its time is up.
                    let _ = tables
                        .ask(leader, StrongRequest::Unlock { lease: number }, deadline)
                        .await;
                }
            });
        }
    }
}

impl Drop for StrongTurn {
    fn drop(&mut self) {
        self.end_lease();
    }
}

/// The update's write timestamp: after every cell the read saw and not before now (the
/// apply order moves it later still if an entry before it was newer).
fn decision_time(cells: &Cells) -> i64 {
    let newest = cells
        .iter()
        .filter_map(|(_, value)| shoal_model::cell::Cell::decode(value).ok())
        .map(|cell| cell.timestamp.0)
        .max()
        .unwrap_or(i64::MIN);
    shoal_model::timestamp::now_micros().max(newest.saturating_add(1))
}

impl StrongTables {
    /// The coordinator's side of step 1: a lease on `key`'s partition at its group's
    /// leader and the partition as it is then. Asked again while no leader answers, until
    /// `deadline` or for as long as a plain write waits for an election
    /// ([`super::STRONG_WRITE_TIMEOUT`]), whichever is later (a new table's groups are
    /// still electing their first leaders): then `WriteTimeout` of type `CAS`, as a
    /// contended Paxos round.
    pub async fn lock_partition(
        &self,
        key: &PaxosKey,
        serial: Consistency,
        deadline: tokio::time::Instant,
        turn: &mut StrongTurn,
    ) -> Result<PreparedRound, CqlError> {
        turn.end_lease();
        let lower = shoal_model::keys::partition_prefix(&key.table, key.token, &key.partition_key);
        let upper = shoal_model::keys::increment_prefix(&lower).unwrap_or_else(|| vec![0xff; 64]);
        let request = |group: GroupId| StrongRequest::Lock {
            group: group.0,
            table: key.table.0,
            token: key.token.0,
            lower: lower.clone(),
            upper: upper.clone(),
        };
        let deadline = deadline.max(tokio::time::Instant::now() + super::STRONG_WRITE_TIMEOUT);
        let (target, answer) = self
            .at_tablet_leader((&key.table, key.token), request, deadline)
            .await?;
        match answer {
            Some(StrongReply::Locked {
                lease,
                leader,
                micros,
                cells,
            }) => {
                turn.lease = Some((HostId(leader), lease));
                Ok(PreparedRound {
                    ballot: Ballot { micros, node: 0 },
                    partition: Some(cells),
                    contended: false,
                })
            }
            Some(StrongReply::Refused(message)) => Err(CqlError::invalid(message)),
            _ => Err(write_timeout(serial, 0, target.majority(), WriteType::Cas)),
        }
    }

    /// The coordinator's side of step 2: `update` appended under the turn's lease and
    /// applied. `Preempted` when it was certainly not appended (the lease ended, the
    /// leader lost office, the request could not be sent to it): the transaction reads
    /// again. `WriteTimeout` of type `CAS`
    /// when the outcome is unknown.
    pub async fn propose_locked(
        &self,
        update: Cells,
        serial: Consistency,
        turn: &mut StrongTurn,
    ) -> Result<ProposalOutcome, CqlError> {
        let Some((leader, lease)) = turn.lease.take() else {
            return Ok(ProposalOutcome::Preempted);
        };
        let batch = WriteBatch::from(update);
        let target = self.group_of_batch(&batch)?;
        let request = StrongRequest::ProposeLocked {
            group: target.group.0,
            lease,
            entry: super::machine::encode_entry(&batch).to_vec(),
        };
        let deadline = tokio::time::Instant::now() + super::STRONG_WRITE_TIMEOUT;
        let answer = if leader == self.me {
            Ok(self.serve_until(&request, deadline).await)
        } else {
            self.ask(leader, request, deadline).await
        };
        match answer {
            Ok(StrongReply::Applied) => Ok(ProposalOutcome::Committed),
            Ok(StrongReply::LeaseLost | StrongReply::NotLeader { .. } | StrongReply::Fenced)
            | Err(super::Unanswered::NotSent) => Ok(ProposalOutcome::Preempted),
            _ => Err(write_timeout(serial, 0, target.majority(), WriteType::Cas)),
        }
    }

    /// The leader's side of step 1.
    pub(super) async fn lock_here(
        &self,
        group: GroupId,
        (table, token): (TableId, Token),
        lower: &[u8],
        upper: &[u8],
    ) -> StrongReply {
        if self.records.fence(group).is_some() {
            return StrongReply::Fenced;
        }
        let Some(lock) = self.locks.exclusive(&table, token).await else {
            return StrongReply::Busy;
        };
        let settled = tokio::time::timeout(LOCK_WAIT, self.raft.settled_read(group)).await;
        let Proposal { term, .. } = match settled {
            Ok(Ok(point)) => point,
            Ok(Err(not_leader)) => {
                return StrongReply::NotLeader {
                    leader: not_leader.leader.map(|h| h.0),
                }
            }
            // Entries in flight that do not commit: the group has no majority now.
            Err(_) => return StrongReply::Busy,
        };
        let limit = shoal_replication::read::GATHER_LIMIT_CELLS;
        let read =
            shoal_replication::replica::read_visible(self.engine.as_ref(), lower, upper, limit);
        let (cells, complete) = match read {
            Ok(read) => read,
            Err(error) => {
                return StrongReply::Refused(format!("cannot read the partition: {error}"))
            }
        };
        if !complete {
            return StrongReply::Refused(format!(
                "Conditional statements and SERIAL reads on partitions of more than {limit} cells are not supported by Shoal yet"
            ));
        }
        let micros = decision_time(&cells);
        let lease = self.leases.grant(Lease {
            table,
            token,
            term,
            _lock: lock,
        });
        StrongReply::Locked {
            lease,
            leader: self.me.0,
            micros,
            cells,
        }
    }

    /// The leader's side of step 2: the update appended under its lease (in the term of
    /// the read), applied, then the lock let go.
    pub(super) async fn propose_locked_here(
        &self,
        group: GroupId,
        lease: u64,
        entry: bytes::Bytes,
        deadline: tokio::time::Instant,
    ) -> StrongReply {
        let Some(lease) = self.leases.take(lease) else {
            return StrongReply::LeaseLost;
        };
        let outside = super::machine::decode_entry(&entry).is_none_or(|cells| {
            cells.iter().any(|(key, _)| {
                shoal_model::keys::table_and_token(key) != Some((lease.table, lease.token))
            })
        });
        if outside {
            return StrongReply::Refused("an update outside the partition its lease holds".into());
        }
        let proposed = self.raft.propose_in_term(group, entry, Some(lease.term));
        let reply = match tokio::time::timeout_at(deadline, proposed).await {
            Ok(Ok(())) => StrongReply::Applied,
            // Refused before the append, or another leader's entry took its index.
            Ok(Err(ProposeError::NotLeader(_) | ProposeError::Superseded)) => {
                StrongReply::NotLeader { leader: None }
            }
            // Committed after the group's fence (a split or merge): it changed nothing.
            Ok(Err(ProposeError::Refused)) => StrongReply::Fenced,
            Ok(Err(ProposeError::Stopped | ProposeError::Membership(_))) | Err(_) => {
                StrongReply::Unknown
            }
        };
        drop(lease);
        reply
    }
}
