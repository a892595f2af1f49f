//! Driving the splits (and merges) of strongly consistent tablets: this node's half of
//! the protocol `shoal_cluster::strong_split` describes.
//!
//! [`SplitDriver::split`] plans the split in the tablet map; the group's leader then
//! fences the group ([`super::StrongTables::follow`]), and the driver asks every member,
//! every [`FENCE_POLL`], whether it has applied that fence. Once all have, it finishes the
//! split with the clock they all stopped at (the halves' clock floor); if one has not
//! within [`FENCE_WAIT`] (down, cut off, far behind), it abandons the split, the leader
//! lifts the fence and the tablet takes writes again. Writes wait while the group is
//! fenced, so that window is kept short: the driver polls from the moment the plan is
//! applied, not at its next periodic check.
//!
//! A split whose driver stopped half-way (its node went down) stays planned, its group
//! fenced: the tablet's primary ends it at its next check, and any other replica once it
//! has seen it planned for twice [`FENCE_WAIT`] (the primary may be the node that went
//! down). Finishing and abandoning need the plan still there under its number, so
//! drivers racing each other end it exactly once.
//!
//! A merge ([`SplitDriver::merge`]) is driven the same way over the pair's two groups: it
//! finishes once every member of both applied its fence, with the newer of their clocks.
//!
//! Each abandoned plan held the tablet's writes for [`FENCE_WAIT`]: a tablet whose plans
//! this node abandoned is not planned again for a while, twice as long after each
//! abandonment in a row ([`RETRY_BACKOFF`]), so a member that keeps failing to catch up
//! costs the tablet's writers a short pause now and then, not most of their time.

use super::{StrongTables, TabletGroup, WireStatus};
use shoal_cluster::{ClusterMetadata, Command, CommandOutcome};
use shoal_model::{HostId, TableId, TabletId, Token};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a planned split waits for every member's fence before it is abandoned.
pub const FENCE_WAIT: Duration = Duration::from_secs(2);
/// How often the members are asked about the fence meanwhile.
const FENCE_POLL: Duration = Duration::from_millis(5);
/// How long a tablet waits to be planned again after its first abandoned plan (doubling
/// with each abandonment in a row, up to [`RETRY_BACKOFF_MAX`]).
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait before planning a tablet whose plans keep being abandoned.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long one round of asking the members may take (a member that is down never
/// answers).
const ASK_MEMBERS_TIMEOUT: Duration = Duration::from_millis(500);

/// Plans and ends the splits and merges of strongly consistent tablets this node holds.
pub struct SplitDriver {
    strong: Arc<StrongTables>,
    metadata: Arc<ClusterMetadata>,
    /// Planned changes this node has seen, by (first) tablet and plan, and since when.
    seen: HashMap<(TableId, TabletId, u64), Instant>,
    /// Tablets whose plans this node abandoned: how many in a row, and when the tablet
    /// may be planned again.
    backoff: HashMap<(TableId, TabletId), (u32, Instant)>,
}

/// What each member answered about its group's fence for a plan.
enum Fences {
    /// Every member applied the plan's fence; the newest clock among them.
    All { clock: i64 },
    /// Every member answered and none is fenced.
    None,
    /// Anything else: some members fenced, some not, or not answering — which, in words.
    Partly { waiting_for: String },
}

/// A planned change of a strongly consistent table's tablets.
struct Planned {
    /// The groups fenced for it: the tablet split, or the pair merged (first, then second).
    groups: Vec<TabletGroup>,
    plan: u64,
    merge: bool,
}

impl Planned {
    fn table(&self) -> TableId {
        self.groups[0].table
    }

    fn tablet(&self) -> TabletId {
        self.groups[0].tablet
    }

    fn finish(&self, clock: i64) -> Command {
        let (table, tablet, plan) = (self.table(), self.tablet(), self.plan);
        if self.merge {
            Command::FinishStrongMerge {
                table,
                first: tablet,
                plan,
                clock,
            }
        } else {
            Command::FinishStrongSplit {
                table,
                tablet,
                plan,
                clock,
            }
        }
    }

    fn abandon(&self) -> Command {
        let (table, tablet, plan) = (self.table(), self.tablet(), self.plan);
        if self.merge {
            Command::AbandonStrongMerge {
                table,
                first: tablet,
                plan,
            }
        } else {
            Command::AbandonStrongSplit {
                table,
                tablet,
                plan,
            }
        }
    }
}

impl SplitDriver {
    pub fn new(strong: Arc<StrongTables>, metadata: Arc<ClusterMetadata>) -> SplitDriver {
        SplitDriver {
            strong,
            metadata,
            seen: HashMap::new(),
            backoff: HashMap::new(),
        }
    }

    /// Plans the split of `tablet` of `table` at `at` and sees it through. Nothing is
    /// planned unless every member answers and none holds a fence (an abandoned plan's
    /// not lifted yet).
    pub async fn split(&mut self, table: TableId, tablet: &shoal_placement::Tablet, at: Token) {
        let command = Command::PlanStrongSplit {
            table,
            tablet: tablet.id,
            at,
        };
        self.plan_and_end(vec![StrongTables::tablet_group(&table, tablet)], command)
            .await;
    }

    /// Plans the merge of `first` with `second`, the tablet after it (marked to merge and
    /// held by the same nodes), and sees it through, as [`SplitDriver::split`] does.
    pub async fn merge(
        &mut self,
        table: TableId,
        first: &shoal_placement::Tablet,
        second: &shoal_placement::Tablet,
    ) {
        let groups = vec![
            StrongTables::tablet_group(&table, first),
            StrongTables::tablet_group(&table, second),
        ];
        let command = Command::PlanStrongMerge {
            table,
            first: first.id,
        };
        self.plan_and_end(groups, command).await;
    }

    /// Proposes `command`, a plan fencing `groups` (the first names the planned tablet),
    /// once every member of them answers with no fence, and ends the plan.
    async fn plan_and_end(&mut self, groups: Vec<TabletGroup>, command: Command) {
        let tablet = (groups[0].table, groups[0].tablet);
        // A wait over long ago (or of a tablet split or merged since) is forgotten.
        self.backoff
            .retain(|_, (_, until)| until.elapsed() < RETRY_BACKOFF_MAX);
        if self
            .backoff
            .get(&tablet)
            .is_some_and(|(_, until)| Instant::now() < *until)
        {
            return;
        }
        for group in &groups {
            if !matches!(self.fences(group, None).await, Fences::None) {
                return;
            }
        }
        let merge = matches!(command, Command::PlanStrongMerge { .. });
        match self.metadata.propose(command).await {
            Ok(CommandOutcome::Applied) => {}
            other => {
                tracing::debug!(
                    ?other,
                    "a strongly consistent tablet's change was not planned"
                );
                return;
            }
        }
        let (table, tablet) = (groups[0].table, groups[0].tablet);
        let plan = self
            .metadata
            .state()
            .tables
            .get(&table)
            .and_then(|placement| {
                if merge {
                    placement.strong_merges.get(&tablet).copied()
                } else {
                    placement.strong_splits.get(&tablet).map(|split| split.plan)
                }
            });
        if let Some(plan) = plan {
            self.end(Planned {
                groups,
                plan,
                merge,
            })
            .await;
        }
    }

    /// Ends the planned splits and merges this node should: those of tablets it is the
    /// primary of, and any other of its tablets' seen planned for twice [`FENCE_WAIT`].
    pub async fn end_planned(&mut self) {
        let me = self.metadata.me().host_id;
        let planned = self.planned_here(me);
        let now = Instant::now();
        self.seen.retain(|(table, tablet, plan), _| {
            planned.iter().any(|planned| {
                (planned.table(), planned.tablet(), planned.plan) == (*table, *tablet, *plan)
            })
        });
        for planned in planned {
            let first_seen = *self
                .seen
                .entry((planned.table(), planned.tablet(), planned.plan))
                .or_insert(now);
            let primary = planned.groups[0].members.first() == Some(&me);
            if primary || first_seen.elapsed() >= 2 * FENCE_WAIT {
                self.end(planned).await;
            }
        }
    }

    /// The splits and merges planned of tablets with a replica on `me`.
    fn planned_here(&self, me: HostId) -> Vec<Planned> {
        let state = self.metadata.state();
        let mut planned = Vec::new();
        for (table, placement) in &state.tables {
            let group = |tablet| StrongTables::tablet_group(table, tablet);
            for (id, split) in &placement.strong_splits {
                if let Some(tablet) = placement.tablets.get(*id) {
                    planned.push(Planned {
                        groups: vec![group(tablet)],
                        plan: split.plan,
                        merge: false,
                    });
                }
            }
            for (id, plan) in &placement.strong_merges {
                if let (Some(first), Some(second)) =
                    (placement.tablets.get(*id), placement.next_tablet(*id))
                {
                    planned.push(Planned {
                        groups: vec![group(first), group(second)],
                        plan: *plan,
                        merge: true,
                    });
                }
            }
        }
        planned.retain(|planned| planned.groups[0].members.contains(&me));
        planned
    }

    /// Waits up to [`FENCE_WAIT`] for every member of the planned change's groups to apply
    /// its fence, then finishes the change at the newest of their clocks, or abandons it.
    async fn end(&mut self, planned: Planned) {
        let deadline = Instant::now() + FENCE_WAIT;
        let tablet = (planned.table(), planned.tablet());
        let command = loop {
            let waiting_for = match self.fenced_clock(&planned).await {
                Ok(clock) => {
                    self.backoff.remove(&tablet);
                    break planned.finish(clock);
                }
                Err(waiting_for) => waiting_for,
            };
            if Instant::now() >= deadline {
                tracing::info!(
                    plan = planned.plan,
                    %waiting_for,
                    "a strongly consistent tablet's split or merge is abandoned: not every \
                     member applied its fence in time"
                );
                let abandoned = self.backoff.get(&tablet).map_or(0, |(count, _)| *count);
                let wait = RETRY_BACKOFF
                    .saturating_mul(1 << abandoned.min(16))
                    .min(RETRY_BACKOFF_MAX);
                self.backoff
                    .insert(tablet, (abandoned + 1, Instant::now() + wait));
                break planned.abandon();
            }
            tokio::time::sleep(FENCE_POLL).await;
        };
        match self.metadata.propose(command.clone()).await {
            Ok(CommandOutcome::Applied) => {
                tracing::info!(
                    ?command,
                    "ended a strongly consistent tablet's split or merge"
                )
            }
            other => tracing::debug!(?command, ?other, "a split's or merge's end was not applied"),
        }
    }

    /// The newest clock of the planned change's groups once every member of each applied
    /// its fence; before, which members it waits for.
    async fn fenced_clock(&self, planned: &Planned) -> Result<i64, String> {
        let mut newest = i64::MIN;
        for group in &planned.groups {
            match self.fences(group, Some(planned.plan)).await {
                Fences::All { clock } => newest = newest.max(clock),
                Fences::None => return Err(format!("no member of {:?} is fenced", group.group)),
                Fences::Partly { waiting_for } => return Err(waiting_for),
            }
        }
        Ok(newest)
    }

    /// What the members of `target`'s group answer about fences (of `plan`, or any).
    async fn fences(&self, target: &TabletGroup, plan: Option<u64>) -> Fences {
        let Ok(statuses) =
            tokio::time::timeout(ASK_MEMBERS_TIMEOUT, self.strong.member_statuses(target)).await
        else {
            return Fences::Partly {
                waiting_for: format!("members of {:?} slow to answer", target.group),
            };
        };
        let answers: Vec<Option<Option<(u64, i64)>>> = statuses
            .iter()
            .map(|status| status.as_ref().map(|status| status.fenced))
            .collect();
        if answers.iter().all(|answer| matches!(answer, Some(None))) {
            return Fences::None;
        }
        let clocks: Option<Vec<i64>> = answers
            .iter()
            .map(|answer| match answer {
                Some(Some((fenced, clock))) if Some(*fenced) == plan => Some(*clock),
                _ => None,
            })
            .collect();
        match clocks {
            Some(clocks) if !clocks.is_empty() => {
                let clock = clocks.iter().copied().max().unwrap_or(i64::MIN);
                if clocks.iter().any(|other| *other != clock) {
                    // Every member applied the same entries before the same fence: this
                    // would be a defect. The newest keeps the halves' order safe.
                    tracing::error!(
                        ?clocks,
                        "members of a fenced group stopped at different clocks"
                    );
                }
                Fences::All { clock }
            }
            _ => Fences::Partly {
                waiting_for: describe_members(target, &statuses, plan),
            },
        }
    }
}

/// Where the members of `target`'s group that have not applied `plan`'s fence stand, for
/// a person reading the log: `<host>: <where it stands>`, comma separated.
fn describe_members(
    target: &TabletGroup,
    statuses: &[Option<WireStatus>],
    plan: Option<u64>,
) -> String {
    let leader = statuses.iter().flatten().find(|status| status.is_leader);
    let matched_by_leader = |member: &HostId| {
        let matched = leader?.matched.iter().find(|(m, _)| *m == member.0)?;
        Some(matched.1)
    };
    let mut lagging = Vec::new();
    for (member, status) in target.members.iter().zip(statuses) {
        let stands = match status {
            None => "did not answer".to_string(),
            Some(status) if status.fenced.map(|(fenced, _)| fenced) == plan => continue,
            Some(status) => {
                let fence = match status.fenced {
                    Some((fenced, _)) => format!("fenced for plan {fenced}"),
                    None => "not fenced".to_string(),
                };
                let matched = matched_by_leader(member)
                    .map(|index| format!(", matched through {index} as its leader knows"))
                    .unwrap_or_default();
                format!("{fence}, applied through {}{matched}", status.applied)
            }
        };
        lagging.push(format!("{member} in {:?}: {stands}", target.group));
    }
    lagging.join(", ")
}
