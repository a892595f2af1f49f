//! Driving the split of a strongly consistent tablet: this node's half of the protocol
//! `shoal_cluster::strong_split` describes.
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

use super::{StrongTables, TabletGroup};
use shoal_cluster::strong_split::StrongSplit;
use shoal_cluster::{ClusterMetadata, Command, CommandOutcome};
use shoal_model::{TableId, TabletId, Token};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a planned split waits for every member's fence before it is abandoned.
pub const FENCE_WAIT: Duration = Duration::from_secs(2);
/// How often the members are asked about the fence meanwhile.
const FENCE_POLL: Duration = Duration::from_millis(5);
/// How long one round of asking the members may take (a member that is down never
/// answers).
const ASK_MEMBERS_TIMEOUT: Duration = Duration::from_millis(500);

/// Plans and ends the splits of strongly consistent tablets this node holds.
pub struct SplitDriver {
    strong: Arc<StrongTables>,
    metadata: Arc<ClusterMetadata>,
    /// Planned splits this node has seen, by tablet and plan, and since when.
    seen: HashMap<(TableId, TabletId, u64), Instant>,
}

/// What each member answered about its group's fence for a split plan.
enum Fences {
    /// Every member applied the plan's fence; the newest clock among them.
    All { clock: i64 },
    /// Every member answered and none is fenced.
    None,
    /// Anything else: some members fenced, some not, or not answering.
    Partly,
}

impl SplitDriver {
    pub fn new(strong: Arc<StrongTables>, metadata: Arc<ClusterMetadata>) -> SplitDriver {
        SplitDriver {
            strong,
            metadata,
            seen: HashMap::new(),
        }
    }

    /// Plans the split of `tablet` of `table` at `at` and sees it through. Nothing is
    /// planned unless every member answers and none holds a fence (an abandoned split's
    /// not lifted yet).
    pub async fn split(&mut self, table: TableId, tablet: &shoal_placement::Tablet, at: Token) {
        let target = StrongTables::tablet_group(&table, tablet);
        if !matches!(self.fences(&target, None).await, Fences::None) {
            return;
        }
        let plan = Command::PlanStrongSplit {
            table,
            tablet: tablet.id,
            at,
        };
        match self.metadata.propose(plan).await {
            Ok(CommandOutcome::Applied) => {}
            other => {
                tracing::debug!(
                    ?other,
                    "a strongly consistent tablet's split was not planned"
                );
                return;
            }
        }
        let planned = self
            .metadata
            .state()
            .tables
            .get(&table)
            .and_then(|placement| placement.strong_splits.get(&tablet.id).copied());
        if let Some(planned) = planned {
            self.end(target, planned).await;
        }
    }

    /// Ends the planned splits this node should: those of tablets it is the primary of,
    /// and any other of its tablets' seen planned for twice [`FENCE_WAIT`].
    pub async fn end_planned(&mut self) {
        let me = self.metadata.me().host_id;
        let planned: Vec<(TabletGroup, StrongSplit)> = {
            let state = self.metadata.state();
            state
                .tables
                .iter()
                .flat_map(|(table, placement)| {
                    placement.strong_splits.iter().filter_map(|(id, split)| {
                        let tablet = placement.tablets.get(*id)?;
                        tablet
                            .replicas
                            .contains(&me)
                            .then(|| (StrongTables::tablet_group(table, tablet), *split))
                    })
                })
                .collect()
        };
        let now = Instant::now();
        self.seen.retain(|(table, tablet, plan), _| {
            planned.iter().any(|(target, split)| {
                target.table == *table && target.tablet == *tablet && split.plan == *plan
            })
        });
        for (target, split) in planned {
            let first_seen = *self
                .seen
                .entry((target.table, target.tablet, split.plan))
                .or_insert(now);
            let primary = target.members.first() == Some(&me);
            if primary || first_seen.elapsed() >= 2 * FENCE_WAIT {
                self.end(target, split).await;
            }
        }
    }

    /// Waits up to [`FENCE_WAIT`] for every member of `target`'s group to apply the fence
    /// of `split`, then finishes the split at their clock, or abandons it.
    async fn end(&self, target: TabletGroup, split: StrongSplit) {
        let deadline = Instant::now() + FENCE_WAIT;
        let command = loop {
            if let Fences::All { clock } = self.fences(&target, Some(split.plan)).await {
                break Command::FinishStrongSplit {
                    table: target.table,
                    tablet: target.tablet,
                    plan: split.plan,
                    clock,
                };
            }
            if Instant::now() >= deadline {
                break Command::AbandonStrongSplit {
                    table: target.table,
                    tablet: target.tablet,
                    plan: split.plan,
                };
            }
            tokio::time::sleep(FENCE_POLL).await;
        };
        match self.metadata.propose(command.clone()).await {
            Ok(CommandOutcome::Applied) => {
                tracing::info!(?command, "ended a strongly consistent tablet's split")
            }
            other => tracing::debug!(?command, ?other, "a split's end was not applied"),
        }
    }

    /// What the members of `target`'s group answer about fences (of `plan`, or any).
    async fn fences(&self, target: &TabletGroup, plan: Option<u64>) -> Fences {
        let Ok(answers) =
            tokio::time::timeout(ASK_MEMBERS_TIMEOUT, self.strong.member_fences(target)).await
        else {
            return Fences::Partly;
        };
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
            _ => Fences::Partly,
        }
    }
}
