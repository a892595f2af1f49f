//! Which Raft groups this node holds, and their fences: the groups follow the schema and
//! the tablet map ([`StrongTables::follow`]); a group's leader fences it while a split or
//! merge of its tablet is planned, and lifts the fence of a plan abandoned; the split
//! driver asks the members where their fences stand ([`StrongTables::member_statuses`]).

use super::WireStatus;
use super::{machine, strong_tables, StrongReply, StrongRequest, StrongTables, TabletGroup};
use super::{FOLLOW_INTERVAL, STRONG_WRITE_TIMEOUT};
use shoal_cluster::ClusterState;
use shoal_consensus::runtime::GroupSpec;
use shoal_consensus::GroupId;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// A group this node should hold, as the tablet map has it.
struct WantedGroup {
    target: TabletGroup,
    /// Where its clock starts (a half of a split tablet).
    floor: Option<i64>,
    /// The split or merge of the tablet planned, by number: the group is to be fenced
    /// for it.
    fence_plan: Option<u64>,
}

impl StrongTables {
    /// The groups this node should hold now: every tablet of a strong table placed here,
    /// with its clock floor and the split or merge of it planned, if any.
    fn wanted_groups(&self, state: &ClusterState) -> BTreeMap<GroupId, WantedGroup> {
        let schema = self.schema.current();
        let mut wanted = BTreeMap::new();
        for table in strong_tables(&schema) {
            let Some(placement) = state.tables.get(&table) else {
                continue;
            };
            for tablet in placement.tablets.tablets() {
                let target = Self::tablet_group(&table, tablet);
                if target.members.contains(&self.me) {
                    wanted.insert(
                        target.group,
                        WantedGroup {
                            floor: placement.clock_floors.get(&tablet.id).copied(),
                            fence_plan: placement.strong_plan_of(tablet.id),
                            target,
                        },
                    );
                }
            }
        }
        wanted
    }

    /// Keeps this node's groups in step with the schema and the tablet map, for as long as
    /// the node runs: a tablet placed here (or moving here) has its group here, a tablet
    /// that left (moved away, split, its table dropped) has its group removed. Members
    /// change through the group's own log ([`StrongTables::change_members`]), never here.
    /// As a group's leader, this node fences the group while the tablet map plans its
    /// split or merge, and lifts a fence the map no longer plans.
    pub async fn follow(self: Arc<Self>) {
        let mut states = self.metadata.subscribe();
        let mut held: HashSet<GroupId> = HashSet::new();
        loop {
            let wanted = self.wanted_groups(&self.metadata.state());
            for (group, want) in &wanted {
                if held.contains(group) {
                    continue;
                }
                if let Some(floor) = want.floor {
                    self.records.set_floor(*group, floor);
                }
                let spec = GroupSpec {
                    group: *group,
                    members: want.target.members.clone(),
                };
                if !self.raft.add_group(spec).await {
                    return;
                }
            }
            for group in held.iter().filter(|group| !wanted.contains_key(group)) {
                self.raft.remove_group(*group).await;
                self.records.forget(*group);
            }
            for (group, want) in &wanted {
                self.keep_fence(*group, want.fence_plan).await;
            }
            held = wanted.into_keys().collect();
            let _ = tokio::time::timeout(FOLLOW_INTERVAL, states.changed()).await;
        }
    }

    /// At `group`'s leader: fences the group for `fence_plan`, the split or merge planned
    /// of its tablet, and lifts a fence whose plan was abandoned. The entry is proposed
    /// without waiting for it (the next pass looks again).
    async fn keep_fence(self: &Arc<Self>, group: GroupId, fence_plan: Option<u64>) {
        let fenced = self.records.fence(group).map(|fence| fence.plan);
        if fenced == fence_plan || self.raft.leader(group).await != Some(self.me) {
            return;
        }
        let entry = match (fenced, fence_plan) {
            // The fence of a plan that was abandoned (or of an earlier plan) goes first.
            (Some(earlier), _) => machine::unfence_entry(earlier),
            (None, Some(plan)) => machine::fence_entry(plan),
            (None, None) => return,
        };
        tracing::info!(
            ?group,
            ?fenced,
            ?fence_plan,
            "fencing or unfencing a strongly consistent tablet's group"
        );
        let tables = Arc::clone(self);
        tokio::spawn(async move {
            let proposed =
                tokio::time::timeout(STRONG_WRITE_TIMEOUT, tables.raft.propose(group, entry)).await;
            if !matches!(proposed, Ok(Ok(()))) {
                tracing::debug!(
                    ?group,
                    ?proposed,
                    "a fence entry did not commit; tried again later"
                );
            }
        });
    }

    /// Where each member of `target`'s group stands, in the order of its members: `None`
    /// for a member that did not answer, else its status (the fence it applied, if any).
    pub async fn member_statuses(&self, target: &TabletGroup) -> Vec<Option<WireStatus>> {
        let asks = target.members.iter().map(|member| {
            self.on_node(
                *member,
                StrongRequest::Status {
                    group: target.group.0,
                    leader_only: false,
                },
            )
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .map(|answer| match answer {
                Some(StrongReply::Status(status)) => Some(status),
                _ => None,
            })
            .collect()
    }
}
