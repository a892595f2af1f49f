//! Splitting a tablet of a strongly consistent table: the metadata's half of the protocol.
//!
//! Such a tablet is a Raft group of its replicas, and its data lives in each member's
//! engine, keyed like any table's: splitting it moves no data, but the two halves need
//! groups of their own, and each half's group may only start from a state that every
//! member holds in full. So the split is a small state machine here, with the group's own
//! log doing the rest:
//!
//! 1. [`Command::PlanStrongSplit`] records the split point. From then on the tablet may
//!    not move, and its group's leader appends a *fence*: every write entry after it is
//!    refused on every member (its writer is told and tries again), so the state at the
//!    fence is final.
//! 2. Once every member has applied the fence — all of them reached the same state and the
//!    same clock — [`Command::FinishStrongSplit`] splits the tablet and records that clock
//!    as both halves' *clock floor*. Each node then drops the old group and starts the
//!    halves' groups, whose logs order writes after everything the old one applied.
//! 3. If a member does not apply the fence in time (it is down, or cut off),
//!    [`Command::AbandonStrongSplit`] forgets the plan and the leader lifts the fence: the
//!    tablet takes writes again, and the split is tried another time.
//!
//! Finishing and abandoning both need the plan, so exactly one of them ends a split,
//! whichever node proposes them and however often.

use crate::state::{rejected, ClusterState, CommandOutcome};
use serde::{Deserialize, Serialize};
use shoal_model::{TableId, TabletId, Token};

/// A planned split of a strongly consistent tablet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrongSplit {
    /// The last token of the lower half.
    pub at: Token,
    /// The plan's number, unique in the cluster: the fence that serves it names it, so a
    /// fence (or an unfence) left from an earlier plan of the same tablet is told apart.
    pub plan: u64,
}

impl ClusterState {
    pub(crate) fn plan_strong_split(
        &mut self,
        table: TableId,
        tablet: TabletId,
        at: Token,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        if placement.strong_splits.contains_key(&tablet) {
            return rejected(format!("{tablet} is already being split"));
        }
        // Checked on a copy: the tablet itself splits only when the split finishes.
        if let Err(reason) = placement.tablets.clone().split(tablet, at) {
            return rejected(reason);
        }
        let plan = self.next_split_plan;
        self.next_split_plan += 1;
        if let Some(placement) = self.tables.get_mut(&table) {
            placement
                .strong_splits
                .insert(tablet, StrongSplit { at, plan });
        }
        CommandOutcome::Applied
    }

    pub(crate) fn finish_strong_split(
        &mut self,
        table: TableId,
        tablet: TabletId,
        plan: u64,
        clock: i64,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        let Some(planned) = placement.strong_splits.get(&tablet).copied() else {
            return rejected(format!("no split of {tablet} is planned"));
        };
        if planned.plan != plan {
            return rejected(format!("split plan {plan} of {tablet} ended already"));
        }
        placement.strong_splits.remove(&tablet);
        match placement.tablets.split(tablet, planned.at) {
            Ok(halves) => {
                placement.clock_floors.remove(&tablet);
                for half in halves {
                    placement.clock_floors.insert(half, clock);
                }
                placement.split = true;
                CommandOutcome::Applied
            }
            Err(reason) => {
                // Cannot happen while the plan keeps the tablet from moving; the plan is
                // gone, so the leader lifts the fence.
                rejected(reason)
            }
        }
    }

    pub(crate) fn abandon_strong_split(
        &mut self,
        table: TableId,
        tablet: TabletId,
        plan: u64,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        match placement.strong_splits.get(&tablet) {
            Some(planned) if planned.plan == plan => {
                placement.strong_splits.remove(&tablet);
                CommandOutcome::Applied
            }
            _ => rejected(format!("split plan {plan} of {tablet} is not under way")),
        }
    }
}
