//! Topology barriers: how a tablet migration knows that every request routed by an older
//! tablet map is over, and that none will arrive late.
//!
//! A migration stage changes where requests go (the pending replica starts receiving
//! writes, reads switch to the new replicas, the leaving replica stops being used). Before
//! the next step may rely on it — streaming from a snapshot that must be followed by every
//! later write, dropping the leaving replica's copy — the migration driver runs a barrier
//! for the new [`shoal_cluster::ClusterState::topology_version`] on every live node, in two
//! rounds. First, on each node (`StorageProxy::settle`):
//!
//! 1. it waits until the node has applied that version;
//! 2. starts a new [`Epoch`]: requests that begin from now on hold it;
//! 3. waits until no request holds an older epoch (a request takes its epoch *before* it
//!    reads the tablet map, so one holding an older epoch may have routed by an older map;
//!    one holding the new epoch has not).
//!
//! Once every live node has settled, none of them routes by an older map any more, and the
//! second round raises each node's *fence* to that version (`StorageProxy::fence`): as a
//! replica it now refuses requests a coordinator routed by an older map — a node that
//! missed the barrier (partitioned, paused) cannot slip a stale write past it. (Raising the
//! fence in the first round would refuse the requests of live nodes that simply had not
//! applied the version yet.)
//!
//! Taking an epoch costs one atomic reference count (`arc-swap`); nothing on the request
//! path locks.
//!
//! **What the first round answers.** Each node answers [`Settled`]: its incarnation (a
//! number drawn when the process started) and how many deliveries of writes it
//! coordinated failed to reach each replica ([`MissedDeliveries`]: a replica that did not
//! answer, or was down and got a hint). A migration compares two barriers' answers: a
//! write does not wait for a pending replica while the data streams, so before reads move
//! to it the migration checks that, between the barrier that started sending it writes and
//! the one after, no node missed a delivery to it, none restarted (a coordinator that
//! crashed took its deliveries still on their way with it) and none was out of reach.
//! Counting costs nothing until a delivery fails.

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shoal_model::HostId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Requests that began between two barriers.
#[derive(Debug)]
pub struct Epoch {
    /// The topology version of the barrier that started the epoch (0: since start-up).
    version: u64,
}

/// Held by a request from before it reads the tablet map until its last message to a
/// replica is answered: a barrier waits for it.
#[derive(Debug, Clone)]
pub struct TopologyGuard(#[allow(dead_code)] Arc<Epoch>);

impl TopologyGuard {
    /// A guard no barrier waits for (replication without a cluster).
    pub fn detached() -> TopologyGuard {
        TopologyGuard(Arc::new(Epoch { version: 0 }))
    }
}

/// The epochs of one node's requests.
pub struct InFlight {
    current: ArcSwap<Epoch>,
    /// Epochs a barrier retired that requests may still hold.
    retired: Mutex<Vec<Weak<Epoch>>>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            current: ArcSwap::from_pointee(Epoch { version: 0 }),
            retired: Mutex::new(Vec::new()),
        }
    }
}

/// How often a draining barrier looks again.
const DRAIN_POLL: Duration = Duration::from_millis(1);

impl InFlight {
    /// Enters the current epoch (before reading the tablet map).
    pub fn enter(&self) -> TopologyGuard {
        TopologyGuard(self.current.load_full())
    }

    /// Starts the epoch of `version` (unless one at least as new is current) and waits, at
    /// most `bound`, until no request holds an earlier one. Errs when requests are still
    /// running at the bound.
    pub async fn drain_before(&self, version: u64, bound: Duration) -> Result<(), String> {
        {
            let mut retired = self.retired.lock();
            let current = self.current.load();
            if current.version < version {
                let previous = self.current.swap(Arc::new(Epoch { version }));
                retired.push(Arc::downgrade(&previous));
            }
        }
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let waiting = {
                let mut retired = self.retired.lock();
                retired.retain(|epoch| epoch.strong_count() > 0);
                retired
                    .iter()
                    .filter_map(Weak::upgrade)
                    .filter(|epoch| epoch.version < version)
                    .count()
            };
            if waiting == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "requests routed by a topology older than version {version} are still running after {bound:?}"
                ));
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }
}

/// A node's answer to the first round of a barrier (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// Drawn when the node's process started: a different one means it restarted.
    pub incarnation: u64,
    /// Deliveries that failed to reach each replica since the process started.
    pub missed: BTreeMap<HostId, u64>,
}

impl Settled {
    /// Deliveries to `host` this node missed since it started.
    pub fn missed_to(&self, host: &HostId) -> u64 {
        self.missed.get(host).copied().unwrap_or(0)
    }
}

/// What every node a barrier reached answered its first round.
pub type BarrierAnswers = BTreeMap<HostId, Settled>;

/// `Ok` when no write acknowledged between barrier `before` and barrier `after` can have
/// missed `pending`: every one of `members` answered both, had not restarted in between,
/// and counted no failed delivery to `pending` in between. `Err` says why not.
pub fn missed_nothing(
    before: &BarrierAnswers,
    after: &BarrierAnswers,
    members: &[HostId],
    pending: &HostId,
) -> Result<(), String> {
    for member in members {
        let (Some(first), Some(second)) = (before.get(member), after.get(member)) else {
            return Err(format!("{member} was out of reach of a barrier"));
        };
        if first.incarnation != second.incarnation {
            return Err(format!("{member} restarted"));
        }
        let missed = second
            .missed_to(pending)
            .saturating_sub(first.missed_to(pending));
        if missed > 0 {
            return Err(format!("{member} missed {missed} deliveries to {pending}"));
        }
    }
    Ok(())
}

/// Deliveries of writes that failed to reach each replica, counted by the coordinator.
/// Only a failure touches it.
#[derive(Debug)]
pub struct MissedDeliveries {
    incarnation: u64,
    missed: Mutex<BTreeMap<HostId, u64>>,
}

impl Default for MissedDeliveries {
    fn default() -> Self {
        use std::sync::atomic::AtomicU64;
        use std::time::{SystemTime, UNIX_EPOCH};
        // Distinct per process start: the wall clock's nanoseconds, and a count for the
        // proxies one process makes (tests make many).
        static MADE: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        MissedDeliveries {
            incarnation: now
                ^ (u64::from(std::process::id()) << 32)
                ^ MADE.fetch_add(1, Ordering::Relaxed),
            missed: Mutex::new(BTreeMap::new()),
        }
    }
}

impl MissedDeliveries {
    /// A delivery to `host` failed (no answer, or a hint instead).
    pub fn record(&self, host: HostId) {
        *self.missed.lock().entry(host).or_insert(0) += 1;
    }

    /// What the first round of a barrier answers.
    pub fn settled(&self) -> Settled {
        Settled {
            incarnation: self.incarnation,
            missed: self.missed.lock().clone(),
        }
    }
}

/// The oldest topology version this node, as a replica, still serves requests from.
#[derive(Debug, Default)]
pub struct Fence(AtomicU64);

impl Fence {
    /// Refuses requests routed by a topology older than `version` from now on.
    pub fn raise(&self, version: u64) {
        self.0.fetch_max(version, Ordering::AcqRel);
    }

    /// `Err` with the reason when a request routed by `version` must be refused.
    pub fn check(&self, version: u64) -> Result<(), String> {
        let fence = self.0.load(Ordering::Acquire);
        if version < fence {
            return Err(format!(
                "stale topology: the coordinator routed by version {version}, and this replica only serves version {fence} or later"
            ));
        }
        Ok(())
    }

    pub fn version(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(nodes: &[(&MissedDeliveries, u8)]) -> BarrierAnswers {
        nodes
            .iter()
            .map(|(node, id)| (HostId([*id; 16]), node.settled()))
            .collect()
    }

    #[test]
    fn a_pending_replica_that_missed_nothing_between_two_barriers_needs_no_second_stream() {
        let (one, two) = (MissedDeliveries::default(), MissedDeliveries::default());
        let (pending, other) = (HostId([9; 16]), HostId([8; 16]));
        let members = [HostId([1; 16]), HostId([2; 16])];
        // Failures before the first barrier, and to other replicas, do not count.
        one.record(pending);
        let before = answers(&[(&one, 1), (&two, 2)]);
        two.record(other);
        let after = answers(&[(&one, 1), (&two, 2)]);
        assert_eq!(missed_nothing(&before, &after, &members, &pending), Ok(()));
        // A delivery to it that failed in between does.
        two.record(pending);
        let after = answers(&[(&one, 1), (&two, 2)]);
        let verdict = missed_nothing(&before, &after, &members, &pending);
        assert!(verdict.unwrap_err().contains("missed 1 deliveries"));
    }

    #[test]
    fn a_coordinator_that_restarted_or_was_out_of_reach_may_have_lost_deliveries() {
        let (one, two) = (MissedDeliveries::default(), MissedDeliveries::default());
        let pending = HostId([9; 16]);
        let members = [HostId([1; 16]), HostId([2; 16])];
        let before = answers(&[(&one, 1), (&two, 2)]);
        // Node 2 restarted: a new process, a new incarnation, its counts from zero.
        let restarted = MissedDeliveries::default();
        let after = answers(&[(&one, 1), (&restarted, 2)]);
        let verdict = missed_nothing(&before, &after, &members, &pending);
        assert!(verdict.unwrap_err().contains("restarted"));
        // Node 2 did not answer the second barrier (the failure detector saw it down).
        let after = answers(&[(&one, 1)]);
        let verdict = missed_nothing(&before, &after, &members, &pending);
        assert!(verdict.unwrap_err().contains("out of reach"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_barrier_waits_for_requests_of_older_epochs_only() {
        let in_flight = Arc::new(InFlight::default());
        let old = in_flight.enter();
        let drained = {
            let in_flight = Arc::clone(&in_flight);
            tokio::spawn(async move { in_flight.drain_before(5, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A request starting now holds the new epoch: the barrier does not wait for it.
        let new = in_flight.enter();
        assert!(!drained.is_finished(), "the old request still runs");
        drop(old);
        assert_eq!(drained.await.unwrap(), Ok(()));
        drop(new);
    }

    #[tokio::test(start_paused = true)]
    async fn a_barrier_gives_up_at_its_bound_and_a_later_one_succeeds() {
        let in_flight = InFlight::default();
        let stuck = in_flight.enter();
        assert!(in_flight
            .drain_before(3, Duration::from_millis(100))
            .await
            .is_err());
        drop(stuck);
        assert_eq!(
            in_flight.drain_before(3, Duration::from_millis(100)).await,
            Ok(())
        );
        // An older barrier arriving late does not move the epoch back.
        assert_eq!(
            in_flight.drain_before(2, Duration::from_millis(100)).await,
            Ok(())
        );
        assert_eq!(in_flight.current.load().version, 3);
    }

    #[test]
    fn the_fence_refuses_requests_routed_by_an_older_topology() {
        let fence = Fence::default();
        assert!(fence.check(0).is_ok());
        fence.raise(7);
        fence.raise(3);
        assert_eq!(fence.version(), 7);
        assert!(fence.check(6).unwrap_err().contains("stale topology"));
        assert!(fence.check(7).is_ok());
        assert!(fence.check(8).is_ok());
    }
}
