//! Failure detection: every node pings every member ([`PING_INTERVAL`]) and hears from
//! each whether it is up, which schema it has and how many bytes it holds. A member not
//! heard from for [`CONVICTION`] is down (STATUS_CHANGE DOWN); heard again it is up
//! (STATUS_CHANGE UP, and the hints kept for it are replayed) — except a member still
//! joining, which clients hear of only once it is normal.
//!
//! A round of pings also goes out at once when the members or the schema change, so that
//! a node that just joined is seen up (and given tablets) without waiting for the next
//! tick; other metadata changes (the steps of a tablet migration) wait for the tick.

use super::{status_change, FailureDetector, Transport, CONVICTION, PING_INTERVAL};
use crate::events::EventBus;
use crate::internode::{Message, Peers, Reply};
use shoal_cluster::{ClusterMetadata, ClusterState, MemberState};
use shoal_coordinator::Coordinator;
use shoal_model::HostId;
use shoal_replication::{Liveness, StorageProxy};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Pings members, announces status changes and replays hints to members that came back.
pub async fn run_failure_detection(
    cluster: Arc<ClusterMetadata>,
    coordinator: Arc<Coordinator>,
    proxy: Arc<StorageProxy>,
    detector: Arc<FailureDetector>,
    peers: Arc<Peers>,
    transport: Arc<Transport>,
    events: Arc<EventBus>,
) {
    let me = cluster.me().host_id;
    let mut interval = tokio::time::interval(PING_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let replaying: Arc<parking_lot::Mutex<BTreeSet<HostId>>> = Arc::default();
    let mut states = cluster.subscribe();
    let mut pinged_for = PingedFor::of(&states.borrow());
    let mut announced = Announced::of(&states.borrow());
    loop {
        // Every interval, and at once when the members or the schema change: a node that
        // just joined is seen up (and given tablets) without waiting for the next tick.
        // Not at every other change: a join commits a few changes per tablet it takes,
        // and a round of pings for each kept every node's runtime busy through it.
        tokio::select! {
            _ = interval.tick() => {}
            changed = states.changed() => {
                if changed.is_ok() && !pinged_for.update(&states.borrow_and_update()) {
                    continue;
                }
            }
        }
        let state = cluster.state();
        let schema_version = coordinator.schema().version;
        let load_bytes = coordinator.engine().approximate_size_bytes();
        for member in state.members.values().filter(|m| m.host_id != me) {
            let peers = Arc::clone(&peers);
            let detector = Arc::clone(&detector);
            let address = member.internode_address;
            tokio::spawn(async move {
                let ping = Message::Ping {
                    from: me,
                    schema_version,
                    load_bytes,
                };
                if let Ok(Reply::Pong {
                    host_id,
                    schema_version,
                    load_bytes,
                }) = peers.call(address, &ping, CONVICTION).await
                {
                    detector.heard_from(host_id, schema_version, load_bytes);
                }
            });
        }
        for (host, up) in detector.transitions() {
            if let Some(member) = state.member_by_host(&host) {
                tracing::info!(peer = %member.internode_address, up, "peer status changed");
                announced.status_changed(host, up);
            }
        }
        for (address, up) in announced.due(&state) {
            events.publish(status_change(address, up));
        }
        // Hints for members that are up.
        let hints = proxy.hints();
        for member in state.members.values().filter(|m| m.host_id != me) {
            if !detector.is_alive(&member.host_id)
                || !hints.pending_for(&member.host_id)
                || !replaying.lock().insert(member.host_id)
            {
                continue;
            }
            let hints = Arc::clone(hints);
            let transport = Arc::clone(&transport);
            let replaying = Arc::clone(&replaying);
            let host = member.host_id;
            let address = member.internode_address;
            tokio::spawn(async move {
                match hints.replay(host, address, transport.as_ref()).await {
                    Ok(0) => {}
                    Ok(count) => tracing::info!(peer = %address, count, "replayed hints"),
                    Err(error) => tracing::info!(peer = %address, %error, "hint replay paused"),
                }
                replaying.lock().remove(&host);
            });
        }
    }
}

/// Which members' status changes clients may hear of. A member still joining is not
/// announced: drivers hear of it once it is normal, from `follow_metadata`, which sends
/// NEW_NODE and then, if it is up, UP. A change seen in the round where a member turns
/// normal therefore waits for the next round, so that it never reaches a driver before
/// that member's NEW_NODE.
struct Announced {
    /// Members that were past joining at the last round.
    normal: BTreeSet<HostId>,
    /// Status changes not told yet, oldest first.
    pending: Vec<(HostId, bool)>,
}

impl Announced {
    fn of(state: &ClusterState) -> Announced {
        Announced {
            normal: Announced::past_joining(state),
            pending: Vec::new(),
        }
    }

    fn past_joining(state: &ClusterState) -> BTreeSet<HostId> {
        state
            .members
            .values()
            .filter(|member| member.state != MemberState::Joining)
            .map(|member| member.host_id)
            .collect()
    }

    fn status_changed(&mut self, host: HostId, up: bool) {
        self.pending.push((host, up));
    }

    /// The changes to tell clients now (the member's CQL address, up), given this
    /// round's `state`. A change of a member still joining is dropped; one of a member
    /// that was joining at the last round waits for the next.
    fn due(&mut self, state: &ClusterState) -> Vec<(std::net::SocketAddr, bool)> {
        let mut due = Vec::new();
        let mut waiting = Vec::new();
        for (host, up) in self.pending.drain(..) {
            let Some(member) = state.member_by_host(&host) else {
                continue;
            };
            if member.state == MemberState::Joining {
                continue;
            }
            if self.normal.contains(&host) {
                due.push((member.cql_address, up));
            } else {
                waiting.push((host, up));
            }
        }
        self.pending = waiting;
        self.normal = Announced::past_joining(state);
        due
    }
}

/// What the last round of pings went out for: the members, and the schema's version
/// (peers' answers carry theirs, which schema agreement waits on).
#[derive(PartialEq)]
struct PingedFor {
    members: Vec<shoal_cluster::Member>,
    schema_version: Option<[u8; 16]>,
}

impl PingedFor {
    fn of(state: &ClusterState) -> PingedFor {
        PingedFor {
            members: state.members.values().cloned().collect(),
            schema_version: state.schema.as_ref().map(|schema| schema.version),
        }
    }

    /// Takes in `state`; true when its members or schema differ from the last ones.
    fn update(&mut self, state: &ClusterState) -> bool {
        let now = PingedFor::of(state);
        let changed = now != *self;
        *self = now;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_cluster::{Member, VersionedRecord};

    fn member(byte: u8, state: MemberState) -> Member {
        let address = std::net::SocketAddr::from(([127, 0, 0, byte], 7000));
        Member {
            host_id: HostId([byte; 16]),
            internode_address: address,
            cql_address: address,
            datacenter: "datacenter1".into(),
            rack: "rack1".into(),
            state,
            replaces: None,
        }
    }

    fn with_members(members: &[Member]) -> ClusterState {
        let mut state = ClusterState::default();
        for member in members {
            state.members.insert(member.node_id(), member.clone());
        }
        state
    }

    #[test]
    fn pings_go_out_at_once_for_new_members_and_schemas_but_not_for_tablet_steps() {
        let three = [1, 2, 3].map(|byte| member(byte, MemberState::Normal));
        let mut state = with_members(&three);
        let mut pinged_for = PingedFor::of(&state);

        // A migration step: only the tablets and the topology version move.
        state.topology_version += 1;
        state.next_migration += 1;
        assert!(
            !pinged_for.update(&state),
            "a tablet step waits for the tick"
        );

        let mut four = with_members(&three);
        four.members.insert(
            member(4, MemberState::Joining).node_id(),
            member(4, MemberState::Joining),
        );
        assert!(
            pinged_for.update(&four),
            "a joining member is pinged at once"
        );
        assert!(!pinged_for.update(&four), "and once only");

        four.members.insert(
            member(4, MemberState::Normal).node_id(),
            member(4, MemberState::Normal),
        );
        assert!(
            pinged_for.update(&four),
            "a member changing state is pinged at once"
        );

        four.schema = Some(VersionedRecord {
            version: [9; 16],
            bytes: Vec::new(),
        });
        assert!(pinged_for.update(&four), "a new schema is pinged at once");
    }

    #[test]
    fn a_member_turning_normal_is_told_up_only_from_the_round_after() {
        let one = member(1, MemberState::Normal);
        let joining = member(2, MemberState::Joining);
        let mut state = with_members(&[one.clone(), joining.clone()]);
        let mut announced = Announced::of(&state);

        // A joining member's changes are never told: follow_metadata announces it later.
        announced.status_changed(joining.host_id, true);
        assert!(announced.due(&state).is_empty());
        assert!(announced.due(&state).is_empty(), "and not kept either");

        // The round it turns normal: its NEW_NODE goes first, so its UP waits a round.
        let normal = member(2, MemberState::Normal);
        state.members.insert(normal.node_id(), normal.clone());
        announced.status_changed(normal.host_id, true);
        assert!(announced.due(&state).is_empty());
        assert_eq!(announced.due(&state), vec![(normal.cql_address, true)]);

        // A member normal since before: at once.
        announced.status_changed(one.host_id, false);
        assert_eq!(announced.due(&state), vec![(one.cql_address, false)]);
    }
}
