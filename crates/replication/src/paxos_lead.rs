//! One coordinator per partition for lightweight transactions: rounds are led by the
//! partition's first replica, whichever node the client sent them to.
//!
//! The rounds one node runs on a partition take turns ([`PartitionTurns`]); rounds from
//! different nodes duel with ballots, each retrying after a random pause. Drivers that
//! know ScyllaDB's LWT mark send all of a partition's transactions to its first replica,
//! so they take turns there; drivers that don't spread them over the replicas (or every
//! node), and a hot partition's transactions then mostly preempt each other. So a
//! coordinator that is not the partition's **leader** — its first live replica, the node
//! those drivers pick — has the leader run the rounds:
//!
//! 1. [`LeadRequest::Prepare`]: the leader waits for the partition's turn, holds it for
//!    the transaction (a *lease*), prepares the round ([`crate::paxos::prepare`]) and
//!    answers with it — the ballot, and the partition as the promising quorum read it.
//! 2. The coordinator checks the statement's conditions against that partition (the CQL
//!    semantics stay on the node that parsed the statement) and builds the update.
//! 3. [`LeadRequest::Propose`]: the leader proposes and commits it and ends the lease (a
//!    preempted proposal keeps it: the coordinator prepares again under the same lease).
//!    A transaction whose conditions fail ends it with [`LeadRequest::Release`], sent when
//!    the coordinator drops its [`PaxosTurn`].
//!
//! That costs one hop to the leader and back per phase — on an uncontended partition more
//! than the duels it saves — so a coordinator hands a partition to its leader only while
//! the partition is **busy** ([`HotPartitions`]): for [`HOT_FOR`] after one of its own
//! rounds there met another coordinator's ballot, or after the leader answered that the
//! transaction had to wait for the partition's turn. A partition that calms down goes
//! back to being run by whichever node the client picked. A lease not
//! ended by its coordinator (it died) ends by itself [`LEASE_GRACE`] after the
//! transaction's deadline. If the leader cannot be reached for the prepare, the round runs
//! on the coordinator as before — Paxos is safe whoever runs it; a proposal sent to a
//! leader that does not answer has an unknown outcome (`WriteTimeout`, `CAS`).

use crate::consistency::WRITE_TIMEOUT;
use crate::messages::{Cells, ReplicaRequest, ReplicaResponse};
use crate::paxos::{self, Ballot, PaxosKey, PreparedRound, ProposalOutcome, Turn};
use crate::proxy::StorageProxy;
use crate::topology::Replica;
use crate::transport::ReplicaTransport;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long after its transaction's deadline a lease nobody ended ends by itself.
pub const LEASE_GRACE: Duration = Duration::from_secs(1);

/// How long a partition counts as busy after contention was last seen on it.
pub const HOT_FOR: Duration = Duration::from_secs(2);

/// Busy partitions tracked at most before the calm ones are swept.
const HOT_SWEEP_AT: usize = 4096;

/// The partitions whose transactions this node hands to their leader: the busy ones,
/// each until when.
#[derive(Default)]
pub struct HotPartitions {
    until: Mutex<HashMap<PaxosKey, Instant>>,
}

impl HotPartitions {
    /// Contention was seen on `key`'s partition just now.
    pub fn mark(&self, key: &PaxosKey) {
        let now = Instant::now();
        let mut until = self.until.lock();
        if until.len() >= HOT_SWEEP_AT {
            until.retain(|_, hot_until| *hot_until > now);
        }
        until.insert(key.clone(), now + HOT_FOR);
    }

    /// True while `key`'s partition is busy.
    pub fn is_hot(&self, key: &PaxosKey) -> bool {
        self.until
            .lock()
            .get(key)
            .is_some_and(|hot_until| *hot_until > Instant::now())
    }
}

/// What a coordinator asks of a partition's leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum LeadRequest {
    /// Prepare a round (under `lease`, or a new one once the partition's turn comes),
    /// within `within_micros`.
    Prepare {
        key: PaxosKey,
        serial: u16,
        lease: Option<u64>,
        within_micros: u64,
    },
    /// Propose and commit `update` under the prepared `ballot`.
    Propose {
        key: PaxosKey,
        lease: u64,
        ballot: Ballot,
        #[serde(with = "crate::messages::cells_serde")]
        update: Cells,
        serial: u16,
        consistency: u16,
    },
    /// The transaction is over (its conditions failed, or it gave up).
    Release { key: PaxosKey, lease: u64 },
}

/// The leader's answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum LeadResponse {
    Prepared {
        lease: u64,
        round: Result<PreparedRound, CqlError>,
        /// The partition is busy on the leader: the transaction waited for its turn, or
        /// the round met contention.
        busy: bool,
    },
    Proposed(Result<ProposalOutcome, CqlError>),
    Released,
}

/// A transaction's turn on its partition: held on this node, or a lease on the leader's.
/// Dropping it ends the turn (for a lease, by telling the leader).
pub struct PaxosTurn {
    kind: TurnKind,
}

enum TurnKind {
    /// No turn: rounds run here and may duel (the leader could not be reached).
    Untaken,
    /// This node's turn on the partition (`None`: it did not come by the deadline),
    /// held until the turn is dropped.
    Local { _held: Option<Turn> },
    /// The leader runs the rounds.
    Led {
        key: PaxosKey,
        leader: Replica,
        lease: Option<u64>,
        /// Sends the release when the turn is dropped with a lease still open.
        transport: Arc<dyn ReplicaTransport>,
    },
    /// A turn another replication strategy keeps in its own way (a strongly consistent
    /// table's lock on its group's leader); dropping the state ends it.
    Held(Box<dyn std::any::Any + Send + Sync>),
}

impl PaxosTurn {
    /// This node's turn (`None`: it did not come in time).
    pub fn local(turn: Option<Turn>) -> PaxosTurn {
        PaxosTurn {
            kind: TurnKind::Local { _held: turn },
        }
    }

    /// A turn whose `state` belongs to another replication strategy: it reads and changes
    /// it through [`PaxosTurn::held_mut`], and ends the turn when the state is dropped.
    pub fn held<T: Send + Sync + 'static>(state: T) -> PaxosTurn {
        PaxosTurn {
            kind: TurnKind::Held(Box::new(state)),
        }
    }

    /// The state of a turn made by [`PaxosTurn::held`] with a `T`.
    pub fn held_mut<T: 'static>(&mut self) -> Option<&mut T> {
        match &mut self.kind {
            TurnKind::Held(state) => state.downcast_mut(),
            _ => None,
        }
    }

    /// True when another node leads the transaction's rounds.
    pub fn is_led_elsewhere(&self) -> bool {
        matches!(self.kind, TurnKind::Led { .. })
    }
}

impl Drop for PaxosTurn {
    fn drop(&mut self) {
        if let TurnKind::Led {
            key,
            leader,
            lease: Some(lease),
            transport,
        } = &self.kind
        {
            let release = ReplicaRequest::PaxosLead(LeadRequest::Release {
                key: key.clone(),
                lease: *lease,
            });
            let sent = transport.send(
                leader.address,
                release,
                leader.topology_version,
                WRITE_TIMEOUT,
            );
            tokio::spawn(sent);
        }
    }
}

/// The leases this node holds as a leader, each the turn of one transaction another node
/// coordinates on one partition.
pub struct Leases {
    held: Mutex<HashMap<u64, (PaxosKey, Turn)>>,
    /// Lease numbers start at random, so a coordinator that still holds a number this node
    /// gave out before it restarted does not name a lease granted since.
    next: AtomicU64,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            held: Mutex::default(),
            next: AtomicU64::new(rand::random::<u64>() >> 1),
        }
    }
}

impl Leases {
    /// Holds `turn` on `key`'s partition for a transaction until it is ended, or until
    /// `expires`.
    fn grant(self: &Arc<Self>, key: &PaxosKey, turn: Turn, expires: Instant) -> u64 {
        let lease = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.held.lock().insert(lease, (key.clone(), turn));
        let leases = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(expires).await;
            if let Some(leases) = leases.upgrade() {
                if leases.held.lock().remove(&lease).is_some() {
                    tracing::debug!(
                        lease,
                        "a Paxos lease expired: its coordinator never ended it"
                    );
                }
            }
        });
        lease
    }

    /// True while `lease` holds `key`'s partition.
    fn holds(&self, lease: u64, key: &PaxosKey) -> bool {
        self.held
            .lock()
            .get(&lease)
            .is_some_and(|(held, _)| held == key)
    }

    /// Ends `lease` if it holds `key`'s partition.
    fn end(&self, lease: u64, key: &PaxosKey) {
        let mut held = self.held.lock();
        if held.get(&lease).is_some_and(|(held, _)| held == key) {
            held.remove(&lease);
        }
    }

    /// Leases held now.
    pub fn count(&self) -> usize {
        self.held.lock().len()
    }
}

/// True when a prepare shows the partition is contended: it met another coordinator's
/// ballot, or failed.
fn shows_contention(round: &Result<PreparedRound, CqlError>) -> bool {
    round.as_ref().map_or(true, |round| round.contended)
}

impl StorageProxy {
    /// The contention timeout a transaction gets when its turn or lease is gone: nothing
    /// was received of the quorum its round needs.
    fn contention_timeout(&self, key: &PaxosKey, serial: Consistency) -> CqlError {
        paxos::cas_timeout(serial, 0, paxos::serial_block_for(self, key, serial))
    }

    /// The turn a conditional statement on `key`'s partition runs under: a lease on the
    /// partition's leader when that is another live node and the partition is busy, else
    /// this node's turn.
    pub(crate) async fn paxos_turn(&self, key: &PaxosKey, deadline: Instant) -> PaxosTurn {
        let leader_elsewhere = self
            .hot_partitions
            .is_hot(key)
            .then(|| {
                let state = self.topology.state();
                self.replicas_of(&state, &key.table, key.token)
                    .replicas
                    .into_iter()
                    .find(|replica| replica.alive)
            })
            .flatten()
            .filter(|leader| !leader.local);
        match leader_elsewhere {
            Some(leader) => PaxosTurn {
                kind: TurnKind::Led {
                    key: key.clone(),
                    leader,
                    lease: None,
                    transport: Arc::clone(&self.transport),
                },
            },
            None => PaxosTurn::local(self.paxos_turns.wait(key, deadline).await),
        }
    }

    /// Prepares a round under `turn`: on the leader when it leads (falling back to this
    /// node when the leader cannot be reached), here otherwise.
    pub(crate) async fn prepare_under(
        &self,
        key: &PaxosKey,
        serial: Consistency,
        deadline: Instant,
        turn: &mut PaxosTurn,
    ) -> Result<PreparedRound, CqlError> {
        if let TurnKind::Led { leader, lease, .. } = &mut turn.kind {
            let within = deadline.saturating_duration_since(Instant::now());
            let request = ReplicaRequest::PaxosLead(LeadRequest::Prepare {
                key: key.clone(),
                serial: serial.code(),
                lease: *lease,
                within_micros: within.as_micros() as u64,
            });
            let answer = self.call(leader, request, within + WRITE_TIMEOUT).await;
            match answer {
                Ok(ReplicaResponse::PaxosLed(LeadResponse::Prepared {
                    lease: held,
                    round,
                    busy,
                })) => {
                    if busy {
                        self.hot_partitions.mark(key);
                    }
                    *lease = round.is_ok().then_some(held);
                    return round;
                }
                Ok(other) => {
                    tracing::debug!(?other, leader = %leader.address, "unexpected answer from a Paxos leader");
                }
                Err(error) => {
                    tracing::debug!(%error, leader = %leader.address, "a Paxos leader could not be reached");
                }
            }
            // The round runs here instead (a lease the leader may hold expires by itself).
            turn.kind = TurnKind::Untaken;
        }
        let round = paxos::prepare(self, key, serial, deadline).await;
        if shows_contention(&round) {
            self.hot_partitions.mark(key);
        }
        round
    }

    /// Proposes and commits `update` under `turn`: on the leader when it leads.
    pub(crate) async fn propose_under(
        &self,
        key: &PaxosKey,
        ballot: Ballot,
        update: Cells,
        serial: Consistency,
        consistency: Consistency,
        turn: &mut PaxosTurn,
    ) -> Result<ProposalOutcome, CqlError> {
        let TurnKind::Led { leader, lease, .. } = &mut turn.kind else {
            let outcome = paxos::propose(self, key, ballot, update, serial, consistency).await;
            if matches!(outcome, Ok(ProposalOutcome::Preempted)) {
                self.hot_partitions.mark(key);
            }
            return outcome;
        };
        let Some(held) = *lease else {
            return Err(self.contention_timeout(key, serial));
        };
        let request = ReplicaRequest::PaxosLead(LeadRequest::Propose {
            key: key.clone(),
            lease: held,
            ballot,
            update,
            serial: serial.code(),
            consistency: consistency.code(),
        });
        // The leader waits up to WRITE_TIMEOUT for each of the propose and the commit.
        let answer = self.call(leader, request, WRITE_TIMEOUT * 3).await;
        match answer {
            Ok(ReplicaResponse::PaxosLed(LeadResponse::Proposed(outcome))) => {
                if !matches!(outcome, Ok(ProposalOutcome::Preempted)) {
                    // The leader ended the lease.
                    *lease = None;
                }
                outcome
            }
            other => {
                tracing::debug!(?other, leader = %leader.address, "a Paxos leader did not answer a proposal");
                // It may have been decided: the outcome is unknown.
                Err(self.contention_timeout(key, serial))
            }
        }
    }

    /// Leads a round for another coordinator (this node is the partition's first replica).
    pub async fn lead(&self, request: LeadRequest) -> LeadResponse {
        let _in_flight = self.enter();
        match request {
            LeadRequest::Prepare {
                key,
                serial,
                lease,
                within_micros,
            } => {
                let deadline = Instant::now() + Duration::from_micros(within_micros);
                let serial = match Consistency::from_code(serial) {
                    Ok(serial) => serial,
                    Err(error) => {
                        return LeadResponse::Prepared {
                            lease: 0,
                            round: Err(error),
                            busy: false,
                        }
                    }
                };
                let refused = LeadResponse::Prepared {
                    lease: 0,
                    round: Err(self.contention_timeout(&key, serial)),
                    busy: true,
                };
                let (lease, waited) = match lease {
                    Some(lease) if self.paxos_leases.holds(lease, &key) => (lease, false),
                    Some(_) => return refused,
                    None => match self.paxos_turns.wait(&key, deadline).await {
                        Some(turn) => {
                            let waited = turn.waited();
                            (
                                self.paxos_leases.grant(&key, turn, deadline + LEASE_GRACE),
                                waited,
                            )
                        }
                        None => return refused,
                    },
                };
                let round = paxos::prepare(self, &key, serial, deadline).await;
                let busy = waited || shows_contention(&round);
                if round.is_err() {
                    self.paxos_leases.end(lease, &key);
                }
                LeadResponse::Prepared { lease, round, busy }
            }
            LeadRequest::Propose {
                key,
                lease,
                ballot,
                update,
                serial,
                consistency,
            } => {
                let outcome = match (
                    Consistency::from_code(serial),
                    Consistency::from_code(consistency),
                ) {
                    (Ok(serial), Ok(consistency)) if self.paxos_leases.holds(lease, &key) => {
                        paxos::propose(self, &key, ballot, update, serial, consistency).await
                    }
                    (Ok(serial), Ok(_)) => Err(self.contention_timeout(&key, serial)),
                    (Err(error), _) | (_, Err(error)) => Err(error),
                };
                if !matches!(outcome, Ok(ProposalOutcome::Preempted)) {
                    self.paxos_leases.end(lease, &key);
                }
                LeadResponse::Proposed(outcome)
            }
            LeadRequest::Release { key, lease } => {
                self.paxos_leases.end(lease, &key);
                LeadResponse::Released
            }
        }
    }
}
