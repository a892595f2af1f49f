//! The commands that change one table's tablets, each checking its precondition:
//! migrations ([`crate::Command::StartMigration`], `AdvanceMigration`, `EndMigration`),
//! splits and merges of eventually consistent tablets, and the balancer's choice of
//! primaries.

use crate::state::{rejected, ClusterState, CommandOutcome};
use shoal_model::{HostId, TableId, TabletId, Token};
use shoal_placement::{MigrationId, MigrationStage, Tablet, TabletMap, Transition};

impl ClusterState {
    pub(super) fn start_migration(
        &mut self,
        table: TableId,
        tablet: TabletId,
        leaving: Option<HostId>,
        pending: Option<HostId>,
    ) -> CommandOutcome {
        if let Some(pending) = pending {
            match self.member_by_host(&pending) {
                Some(member) if member.state.accepts_replicas() => {}
                Some(member) => {
                    return rejected(format!(
                        "{} cannot receive replicas while {}",
                        member.internode_address,
                        member.state.name()
                    ))
                }
                None => return rejected(format!("no member has host id {pending}")),
            }
        }
        if leaving.is_none() && pending.is_none() {
            return rejected("a migration moves a replica somewhere");
        }
        if self
            .tables
            .get(&table)
            .is_some_and(|p| p.strong_plan_of(tablet).is_some())
        {
            return rejected("the tablet is being split or merged");
        }
        let id = MigrationId(self.next_migration);
        let Some(target) = self.tablet_mut(table, tablet) else {
            return rejected("no such tablet");
        };
        if target.transition.is_some() {
            return rejected("the tablet is already moving");
        }
        if leaving.is_some_and(|h| !target.replicas.contains(&h)) {
            return rejected("the leaving node is not a replica of the tablet");
        }
        if pending.is_some_and(|h| target.replicas.contains(&h)) {
            return rejected("the pending node already is a replica of the tablet");
        }
        target.transition = Some(Transition {
            id,
            leaving,
            pending,
            // Dropping a replica streams nothing: reads leave it at once.
            stage: if pending.is_some() {
                MigrationStage::Allocated
            } else {
                MigrationStage::ReadNew
            },
        });
        self.next_migration += 1;
        CommandOutcome::Applied
    }

    pub(super) fn advance_migration(
        &mut self,
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        to: MigrationStage,
    ) -> CommandOutcome {
        let Some(target) = self.tablet_mut(table, tablet) else {
            return rejected("no such tablet");
        };
        let new_replicas = target.new_replicas();
        let Some(transition) = target.transition.as_mut().filter(|t| t.id == migration) else {
            return rejected(format!("{migration} is not under way"));
        };
        if transition.stage.next() != Some(to) {
            return rejected(format!(
                "{migration} is at {}, not before {}",
                transition.stage.name(),
                to.name()
            ));
        }
        transition.stage = to;
        if to == MigrationStage::Cleanup {
            target.replicas = new_replicas;
        }
        CommandOutcome::Applied
    }

    pub(super) fn end_migration(
        &mut self,
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        aborted: bool,
    ) -> CommandOutcome {
        let Some(target) = self.tablet_mut(table, tablet) else {
            return rejected("no such tablet");
        };
        let Some(transition) = target.transition.as_ref().filter(|t| t.id == migration) else {
            return rejected(format!("{migration} is not under way"));
        };
        let at_cleanup = transition.stage == MigrationStage::Cleanup;
        if aborted == at_cleanup {
            return rejected(if aborted {
                "the replica set has already switched: the migration can only finish"
            } else {
                "the migration has not reached cleanup"
            });
        }
        target.transition = None;
        CommandOutcome::Applied
    }

    pub(super) fn split_tablet(
        &mut self,
        table: TableId,
        tablet: TabletId,
        at: Token,
    ) -> CommandOutcome {
        self.redraw_boundaries(table, |tablets| tablets.split(tablet, at))
    }

    pub(super) fn plan_tablet_merge(&mut self, table: TableId, first: TabletId) -> CommandOutcome {
        let Some(created_with) = self.merge_floor(&table) else {
            return rejected("no such table");
        };
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        let after_merges = placement.tablets.tablets().len() - placement.tablets.merges().count();
        if after_merges <= created_with {
            return rejected(format!(
                "the table would have fewer than the {created_with} tablets it is \
                 created with"
            ));
        }
        let second = placement.next_tablet(first).map(|t| t.id);
        if placement.strong_plan_of(first).is_some()
            || second.is_some_and(|second| placement.strong_plan_of(second).is_some())
        {
            return rejected(format!("{first} or the tablet after it is being split"));
        }
        match placement.tablets.plan_merge(first) {
            Ok(_) => CommandOutcome::Applied,
            Err(reason) => rejected(reason),
        }
    }

    pub(super) fn merge_tablets(
        &mut self,
        table: TableId,
        first: TabletId,
        second: TabletId,
    ) -> CommandOutcome {
        self.redraw_boundaries(table, |tablets| tablets.merge(first, second))
    }

    /// Tablet `tablet` of `table`, to change.
    fn tablet_mut(&mut self, table: TableId, tablet: TabletId) -> Option<&mut Tablet> {
        self.tables.get_mut(&table)?.tablets.get_mut(tablet)
    }

    /// Redraws `table`'s tablet boundaries with `change` (a split or a merge). The table
    /// then no longer has the even layout it was created with (`TablePlacement::split`).
    fn redraw_boundaries<T>(
        &mut self,
        table: TableId,
        change: impl FnOnce(&mut TabletMap) -> Result<T, String>,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        match change(&mut placement.tablets) {
            Ok(_) => {
                placement.split = true;
                CommandOutcome::Applied
            }
            Err(reason) => rejected(reason),
        }
    }

    pub(super) fn set_primaries(
        &mut self,
        table: TableId,
        primaries: Vec<(TabletId, HostId)>,
    ) -> CommandOutcome {
        let Some(placement) = self.tables.get_mut(&table) else {
            return rejected("no such table");
        };
        for (id, primary) in primaries {
            let Some(tablet) = placement.tablets.get_mut(id) else {
                continue;
            };
            if tablet.transition.is_some() {
                continue;
            }
            if let Some(position) = tablet.replicas.iter().position(|h| *h == primary) {
                tablet.replicas.swap(0, position);
            }
        }
        CommandOutcome::Applied
    }
}
