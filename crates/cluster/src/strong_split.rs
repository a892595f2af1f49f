//! Splitting and merging the tablets of a strongly consistent table: the metadata's half
//! of the protocol.
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
//!
//! A merge is the same with two groups: a pair marked to merge and held by the same nodes
//! is planned ([`Command::PlanStrongMerge`]), both groups are fenced under the plan's
//! number, and once every member of both has applied its fence the pair is merged
//! ([`Command::FinishStrongMerge`]) with the newer of the two clocks as the merged
//! tablet's floor — or the plan is abandoned ([`Command::AbandonStrongMerge`]).

use crate::state::{rejected, ClusterState, CommandOutcome, TablePlacement};
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

impl TablePlacement {
    /// The number of the strong split or merge plan `tablet`'s group is to be fenced for:
    /// a split of it, or a merge of it with its neighbour (either side).
    pub fn strong_plan_of(&self, tablet: TabletId) -> Option<u64> {
        if let Some(split) = self.strong_splits.get(&tablet) {
            return Some(split.plan);
        }
        if let Some(plan) = self.strong_merges.get(&tablet) {
            return Some(*plan);
        }
        let tablets = self.tablets.tablets();
        let index = tablets.iter().position(|t| t.id == tablet)?;
        let previous = tablets.get(index.checked_sub(1)?)?;
        self.strong_merges.get(&previous.id).copied()
    }

    /// The tablet after `first`, if any.
    pub fn next_tablet(&self, first: TabletId) -> Option<&shoal_placement::Tablet> {
        let tablets = self.tablets.tablets();
        let index = tablets.iter().position(|t| t.id == first)?;
        tablets.get(index + 1)
    }
}

impl ClusterState {
    /// Takes the next plan number.
    fn next_plan(&mut self) -> u64 {
        let plan = self.next_strong_plan;
        self.next_strong_plan += 1;
        plan
    }

    pub(crate) fn plan_strong_split(
        &mut self,
        table: TableId,
        tablet: TabletId,
        at: Token,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get(&table) else {
            return rejected("no such table");
        };
        if placement.strong_plan_of(tablet).is_some() {
            return rejected(format!("{tablet} is already being split or merged"));
        }
        // Checked on a copy: the tablet itself splits only when the split finishes.
        if let Err(reason) = placement.tablets.clone().split(tablet, at) {
            return rejected(reason);
        }
        let plan = self.next_plan();
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
        let (placement, planned) = match self.end_split_plan(table, tablet, plan) {
            Ok(ended) => ended,
            Err(refused) => return refused,
        };
        match placement.tablets.split(tablet, planned.at) {
            Ok(halves) => {
                placement.clock_floors.remove(&tablet);
                for half in halves {
                    placement.clock_floors.insert(half, clock);
                }
                placement.split = true;
                CommandOutcome::Applied
            }
            // Cannot happen while the plan keeps the tablet from moving; the plan is gone,
            // so the leader lifts the fence.
            Err(reason) => rejected(reason),
        }
    }

    pub(crate) fn abandon_strong_split(
        &mut self,
        table: TableId,
        tablet: TabletId,
        plan: u64,
    ) -> CommandOutcome {
        match self.end_split_plan(table, tablet, plan) {
            Ok(_) => CommandOutcome::Applied,
            Err(refused) => refused,
        }
    }

    /// Takes split `plan` of `tablet` out of `table`'s plans: the table's placement and
    /// the plan, or why not (no such table, or the plan ended already).
    fn end_split_plan(
        &mut self,
        table: TableId,
        tablet: TabletId,
        plan: u64,
    ) -> Result<(&mut TablePlacement, StrongSplit), CommandOutcome> {
        let placement = self
            .tables
            .get_mut(&table)
            .ok_or_else(|| rejected("no such table"))?;
        match placement.strong_splits.get(&tablet).copied() {
            Some(planned) if planned.plan == plan => {
                placement.strong_splits.remove(&tablet);
                Ok((placement, planned))
            }
            _ => Err(rejected(format!(
                "split plan {plan} of {tablet} is not under way"
            ))),
        }
    }
}

impl ClusterState {
    pub(crate) fn plan_strong_merge(&mut self, table: TableId, first: TabletId) -> CommandOutcome {
        let Some(placement) = self.tables.get(&table) else {
            return rejected("no such table");
        };
        let Some((lower, upper)) = placement
            .tablets
            .merges()
            .find(|(lower, _)| lower.id == first)
        else {
            return rejected(format!("{first} is not marked to merge"));
        };
        if !lower.held_by_same_nodes(upper)
            || lower.transition.is_some()
            || upper.transition.is_some()
        {
            return rejected(format!(
                "{first} and {} are not held by the same nodes at rest",
                upper.id
            ));
        }
        if placement.strong_plan_of(lower.id).is_some()
            || placement.strong_plan_of(upper.id).is_some()
        {
            return rejected(format!(
                "{first} or {} is already being split or merged",
                upper.id
            ));
        }
        let plan = self.next_plan();
        if let Some(placement) = self.tables.get_mut(&table) {
            placement.strong_merges.insert(first, plan);
        }
        CommandOutcome::Applied
    }

    pub(crate) fn finish_strong_merge(
        &mut self,
        table: TableId,
        first: TabletId,
        plan: u64,
        clock: i64,
    ) -> CommandOutcome {
        let placement = match self.end_merge_plan(table, first, plan) {
            Ok(placement) => placement,
            Err(refused) => return refused,
        };
        let Some(second) = placement.next_tablet(first).map(|t| t.id) else {
            return rejected(format!("{first} is the last tablet"));
        };
        match placement.tablets.merge(first, second) {
            Ok(merged) => {
                placement.clock_floors.remove(&first);
                placement.clock_floors.remove(&second);
                placement.clock_floors.insert(merged, clock);
                CommandOutcome::Applied
            }
            // Cannot happen while the plan keeps the pair still; the plan is gone, so the
            // fences are lifted.
            Err(reason) => rejected(reason),
        }
    }

    pub(crate) fn abandon_strong_merge(
        &mut self,
        table: TableId,
        first: TabletId,
        plan: u64,
    ) -> CommandOutcome {
        match self.end_merge_plan(table, first, plan) {
            Ok(_) => CommandOutcome::Applied,
            Err(refused) => refused,
        }
    }

    /// Takes merge `plan` of `first` out of `table`'s plans: the table's placement, or why
    /// not.
    fn end_merge_plan(
        &mut self,
        table: TableId,
        first: TabletId,
        plan: u64,
    ) -> Result<&mut TablePlacement, CommandOutcome> {
        let placement = self
            .tables
            .get_mut(&table)
            .ok_or_else(|| rejected("no such table"))?;
        if placement.strong_merges.get(&first) != Some(&plan) {
            return Err(rejected(format!(
                "merge plan {plan} of {first} is not under way"
            )));
        }
        placement.strong_merges.remove(&first);
        Ok(placement)
    }
}
