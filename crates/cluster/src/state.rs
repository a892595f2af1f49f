//! The replicated state: who is in the cluster, the schema, and where each table's
//! tablets live.
//!
//! [`ClusterState`] changes only by [`ClusterState::apply`]ing a [`Command`] that Raft has
//! committed, so every node computes the same state from the same log. Apply is pure and
//! deterministic (no clocks, no randomness): a new table's tablets are placed by a function
//! of the members and the keyspace's replication, and every later change to a tablet's
//! replicas is a command of its own with a precondition checked here.
//!
//! **Members** go through [`MemberState`]s: a node joins as `Joining`, becomes `Normal`
//! once the balancer has given it its share of tablets, and leaves as `Leaving`
//! (decommission, streaming its replicas away) or `Removing` (removenode or replaced: its
//! replicas are rebuilt from the others); [`Command::RemoveMember`] takes it out once it
//! holds nothing.
//!
//! **Tablet migrations** ([`shoal_placement::Transition`]) start with
//! [`Command::StartMigration`], move one stage at a time with [`Command::AdvanceMigration`]
//! and end with [`Command::EndMigration`] (done, or aborted before the replica set
//! switched). Each of them bumps [`ClusterState::topology_version`], the number replicas
//! fence stale coordinators with.
//!
//! The commands that change a table's tablets are applied in `tablet_changes`, and
//! strongly consistent tablets' splits and merges in [`crate::strong_split`].
//!
//! The schema is opaque here (bytes plus a version UUID): the coordinator owns what a
//! keyspace or table is. Schema changes are compare-and-set on the version, so two nodes
//! changing the schema at once cannot lose either change — the second one is told that the
//! schema moved on, and retries against the newer one.

use serde::{Deserialize, Serialize};
use shoal_model::{HostId, TableId, TabletId, Token};
use shoal_placement::{
    MigrationId, MigrationStage, NodeDescriptor, ReplicationStrategy, TabletMap, Transition,
};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

/// A node's Raft id: the first eight bytes of its host id.
pub type NodeId = u64;

/// Tablets per table for each member: a table created on N nodes has
/// `TABLETS_PER_NODE * N` tablets, so each node is first replica for about this many of
/// them.
pub const TABLETS_PER_NODE: usize = 8;

pub fn node_id_of(host_id: &HostId) -> NodeId {
    let mut first = [0u8; 8];
    first.copy_from_slice(&host_id.0[..8]);
    u64::from_be_bytes(first)
}

/// Where a member is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Admitted; receiving its share of tablets.
    Joining,
    /// Owns tablets and serves requests.
    Normal,
    /// Decommissioning: streaming its replicas to other nodes before it leaves.
    Leaving,
    /// Dead and being removed (removenode, or replaced by a new node): its replicas are
    /// rebuilt on other nodes from the surviving ones.
    Removing,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Joining => "joining",
            MemberState::Normal => "normal",
            MemberState::Leaving => "leaving",
            MemberState::Removing => "removing",
        }
    }

    /// The letter `nodetool status` shows: N, J or L.
    pub fn letter(self) -> char {
        match self {
            MemberState::Joining => 'J',
            MemberState::Normal => 'N',
            MemberState::Leaving | MemberState::Removing => 'L',
        }
    }

    /// May be given new replicas.
    pub fn accepts_replicas(self) -> bool {
        matches!(self, MemberState::Joining | MemberState::Normal)
    }
}

/// A cluster member as every node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub host_id: HostId,
    /// Where peers reach it (internode messaging and Raft).
    pub internode_address: SocketAddr,
    /// Where clients reach it (CQL).
    pub cql_address: SocketAddr,
    pub datacenter: String,
    pub rack: String,
    pub state: MemberState,
    /// The dead member this one replaces (its replicas are rebuilt here first).
    pub replaces: Option<HostId>,
}

impl Member {
    pub fn node_id(&self) -> NodeId {
        node_id_of(&self.host_id)
    }
}

/// A replicated document kept opaque here, with its version: the schema as the coordinator
/// serialized it, or the roles and permissions as `shoal-auth` did. Changed only by
/// compare-and-set on the version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedRecord {
    pub version: [u8; 16],
    pub bytes: Vec<u8>,
}

/// A table's replication and its tablets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TablePlacement {
    pub strategy: ReplicationStrategy,
    pub tablets: TabletMap,
    /// A tablet of the table was split (an ordered table growing): its tablets no longer
    /// follow the even layout that token-aware drivers can route hashed keys by.
    #[serde(default)]
    pub split: bool,
    /// The tablets the table was created with: merging never takes it below them. 0 for
    /// tables placed before this was recorded (their floor is today's layout's count).
    #[serde(default)]
    pub created_with: usize,
    /// Tablets of a strongly consistent table being split ([`Command::PlanStrongSplit`]):
    /// their Raft groups are fenced until the split ends.
    #[serde(default)]
    pub strong_splits: BTreeMap<TabletId, crate::strong_split::StrongSplit>,
    /// Pairs of tablets of a strongly consistent table being merged, by the first tablet,
    /// and the plan's number ([`Command::PlanStrongMerge`]): both groups are fenced.
    #[serde(default)]
    pub strong_merges: BTreeMap<TabletId, u64>,
    /// The clock each tablet made by a strong split starts its Raft group's at: the newest
    /// timestamp the group it came from applied ([`Command::FinishStrongSplit`]).
    #[serde(default)]
    pub clock_floors: BTreeMap<TabletId, i64>,
}

/// What the replicated log carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A node joins (or re-registers with a new address, keeping its state). A member
    /// that replaces another marks that one `Removing`.
    AddMember(Member),
    /// Replaces the schema if it is still at `base_version` (`None`: no schema yet).
    /// `tables` lists every table that exists afterwards with its replication.
    ChangeSchema {
        base_version: Option<[u8; 16]>,
        schema: VersionedRecord,
        tables: BTreeMap<TableId, ReplicationStrategy>,
    },
    /// Replaces the roles and permissions if they are still at `base_version` (`None`: no
    /// roles yet — so of two nodes creating the first superuser, one wins).
    ChangeRoles {
        base_version: Option<[u8; 16]>,
        roles: VersionedRecord,
    },
    /// Moves a member to state `to` if it is in one of `from`.
    SetMemberState {
        host_id: HostId,
        from: Vec<MemberState>,
        to: MemberState,
    },
    /// Takes a member that holds no replica out of the cluster.
    RemoveMember(HostId),
    /// Starts moving a replica of a tablet: `leaving` gives it up, `pending` receives it.
    StartMigration {
        table: TableId,
        tablet: TabletId,
        leaving: Option<HostId>,
        pending: Option<HostId>,
    },
    /// Moves a migration to its next stage, `to`.
    AdvanceMigration {
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        to: MigrationStage,
    },
    /// Ends a migration: done (after `Cleanup`) or `aborted` (before it, leaving the old
    /// replica set in place).
    EndMigration {
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        aborted: bool,
    },
    /// Makes each listed replica its tablet's primary (first replica). No data moves.
    SetPrimaries {
        table: TableId,
        primaries: Vec<(TabletId, HostId)>,
    },
    /// Splits a tablet that is not moving in two at `at` (`TabletMap::split`): same
    /// replicas, new ids. No data moves; the balancer may then move either half.
    SplitTablet {
        table: TableId,
        tablet: TabletId,
        at: Token,
    },
    /// Marks a small tablet and the one after it to be merged (`TabletMap::plan_merge`):
    /// the balancer moves the second onto the first's nodes.
    PlanTabletMerge { table: TableId, first: TabletId },
    /// Merges two neighbouring tablets held by the same nodes into one
    /// (`TabletMap::merge`). No data moves.
    MergeTablets {
        table: TableId,
        first: TabletId,
        second: TabletId,
    },
    /// Starts splitting a tablet of a strongly consistent table at `at`: its Raft group's
    /// leader fences the group (no write after the fence takes effect), and once every
    /// member has applied the fence the split is finished or abandoned. The tablet may not
    /// move meanwhile. See `strong_split`.
    PlanStrongSplit {
        table: TableId,
        tablet: TabletId,
        at: Token,
    },
    /// Splits a tablet whose strong split `plan` is planned, as [`Command::SplitTablet`]
    /// does; the halves' groups start their clocks at `clock`, where every member's
    /// fenced group stopped.
    FinishStrongSplit {
        table: TableId,
        tablet: TabletId,
        plan: u64,
        clock: i64,
    },
    /// Gives up the planned strong split `plan` (a member did not apply the fence in
    /// time): the group's leader lifts the fence.
    AbandonStrongSplit {
        table: TableId,
        tablet: TabletId,
        plan: u64,
    },
    /// Starts merging `first`, a tablet of a strongly consistent table marked to merge
    /// ([`Command::PlanTabletMerge`]) and held by the same nodes as the one after it:
    /// both groups are fenced, and the merge is then finished or abandoned.
    PlanStrongMerge { table: TableId, first: TabletId },
    /// Merges the pair whose strong merge `plan` is planned, as [`Command::MergeTablets`]
    /// does; the merged tablet's group starts its clock at `clock` (the newer of the
    /// two groups').
    FinishStrongMerge {
        table: TableId,
        first: TabletId,
        plan: u64,
        clock: i64,
    },
    /// Gives up the planned strong merge `plan`: both fences are lifted.
    AbandonStrongMerge {
        table: TableId,
        first: TabletId,
        plan: u64,
    },
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CommandOutcome {
    #[default]
    Applied,
    /// The schema (or the roles) moved past the base version the change was computed from.
    Moved,
    /// The command could not be applied; the message says why.
    Rejected(String),
}

/// Cluster metadata: members, schema, tablets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    pub members: BTreeMap<NodeId, Member>,
    pub schema: Option<VersionedRecord>,
    pub tables: BTreeMap<TableId, TablePlacement>,
    /// Roles and permissions (`shoal-auth`); `None` until authentication is first used.
    pub roles: Option<VersionedRecord>,
    /// Bumped by every change to members or tablets: a replica that has been told (by a
    /// barrier) that the topology reached version `v` refuses requests from coordinators
    /// still routing by an older one.
    pub topology_version: u64,
    /// The number the next planned strong split or merge gets (its groups' fences name
    /// it).
    #[serde(default)]
    pub next_strong_plan: u64,
    /// The id the next migration gets.
    pub next_migration: u64,
}

pub(crate) fn rejected(reason: impl Into<String>) -> CommandOutcome {
    CommandOutcome::Rejected(reason.into())
}

impl ClusterState {
    pub fn apply(&mut self, command: Command) -> CommandOutcome {
        // Marking tablets to merge changes no routing: only what the balancer plans.
        let changes_topology = !matches!(
            command,
            Command::ChangeRoles { .. }
                | Command::PlanTabletMerge { .. }
                | Command::PlanStrongSplit { .. }
                | Command::AbandonStrongSplit { .. }
                | Command::PlanStrongMerge { .. }
                | Command::AbandonStrongMerge { .. }
        );
        let outcome = match command {
            Command::AddMember(member) => self.add_member(member),
            Command::ChangeSchema {
                base_version,
                schema,
                tables,
            } => self.change_schema(base_version, schema, tables),
            Command::ChangeRoles {
                base_version,
                roles,
            } => self.change_roles(base_version, roles),
            Command::SetMemberState { host_id, from, to } => {
                self.set_member_state(host_id, from, to)
            }
            Command::RemoveMember(host_id) => self.remove_member(host_id),
            Command::StartMigration {
                table,
                tablet,
                leaving,
                pending,
            } => self.start_migration(table, tablet, leaving, pending),
            Command::AdvanceMigration {
                table,
                tablet,
                migration,
                to,
            } => self.advance_migration(table, tablet, migration, to),
            Command::EndMigration {
                table,
                tablet,
                migration,
                aborted,
            } => self.end_migration(table, tablet, migration, aborted),
            Command::SplitTablet { table, tablet, at } => self.split_tablet(table, tablet, at),
            Command::PlanTabletMerge { table, first } => self.plan_tablet_merge(table, first),
            Command::MergeTablets {
                table,
                first,
                second,
            } => self.merge_tablets(table, first, second),
            Command::PlanStrongSplit { table, tablet, at } => {
                self.plan_strong_split(table, tablet, at)
            }
            Command::FinishStrongSplit {
                table,
                tablet,
                plan,
                clock,
            } => self.finish_strong_split(table, tablet, plan, clock),
            Command::AbandonStrongSplit {
                table,
                tablet,
                plan,
            } => self.abandon_strong_split(table, tablet, plan),
            Command::PlanStrongMerge { table, first } => self.plan_strong_merge(table, first),
            Command::FinishStrongMerge {
                table,
                first,
                plan,
                clock,
            } => self.finish_strong_merge(table, first, plan, clock),
            Command::AbandonStrongMerge { table, first, plan } => {
                self.abandon_strong_merge(table, first, plan)
            }
            Command::SetPrimaries { table, primaries } => self.set_primaries(table, primaries),
        };
        if changes_topology && outcome == CommandOutcome::Applied {
            self.topology_version += 1;
        }
        outcome
    }

    fn change_roles(
        &mut self,
        base_version: Option<[u8; 16]>,
        roles: VersionedRecord,
    ) -> CommandOutcome {
        if base_version != self.roles.as_ref().map(|r| r.version) {
            return CommandOutcome::Moved;
        }
        self.roles = Some(roles);
        CommandOutcome::Applied
    }

    fn set_member_state(
        &mut self,
        host_id: HostId,
        from: Vec<MemberState>,
        to: MemberState,
    ) -> CommandOutcome {
        match self.members.get_mut(&node_id_of(&host_id)) {
            Some(member) if member.host_id == host_id && from.contains(&member.state) => {
                member.state = to;
                CommandOutcome::Applied
            }
            Some(member) => rejected(format!(
                "the node is {}, not {}",
                member.state.name(),
                from.iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )),
            None => rejected(format!("no member has host id {host_id}")),
        }
    }

    fn add_member(&mut self, mut member: Member) -> CommandOutcome {
        if let Some(known) = self.members.get(&member.node_id()) {
            // Re-registering (a new address after a restart): the state stays.
            member.state = known.state;
            member.replaces = known.replaces;
        } else if let Some(replaced) = member.replaces {
            match self.members.get_mut(&node_id_of(&replaced)) {
                Some(old) if old.host_id == replaced => old.state = MemberState::Removing,
                _ => return rejected(format!("no member {replaced} to replace")),
            }
        }
        self.members.insert(member.node_id(), member);
        CommandOutcome::Applied
    }

    fn change_schema(
        &mut self,
        base_version: Option<[u8; 16]>,
        schema: VersionedRecord,
        tables: BTreeMap<TableId, ReplicationStrategy>,
    ) -> CommandOutcome {
        if base_version != self.schema.as_ref().map(|s| s.version) {
            return CommandOutcome::Moved;
        }
        let mut placed = BTreeMap::new();
        for (id, strategy) in tables {
            let placement = match self.tables.get(&id) {
                // An existing table keeps its tablets; a new replication is reached by
                // migrations the balancer plans (adding or dropping replicas).
                Some(existing) => TablePlacement {
                    strategy,
                    ..existing.clone()
                },
                None => match self.place(&strategy) {
                    Ok(tablets) => TablePlacement {
                        strategy,
                        created_with: tablets.tablets().len(),
                        tablets,
                        split: false,
                        strong_splits: BTreeMap::new(),
                        strong_merges: BTreeMap::new(),
                        clock_floors: BTreeMap::new(),
                    },
                    Err(error) => return rejected(error.to_string()),
                },
            };
            placed.insert(id, placement);
        }
        self.tables = placed;
        self.schema = Some(schema);
        CommandOutcome::Applied
    }

    fn remove_member(&mut self, host_id: HostId) -> CommandOutcome {
        let Some(member) = self.members.get(&node_id_of(&host_id)) else {
            return rejected(format!("no member has host id {host_id}"));
        };
        if member.state == MemberState::Normal {
            return rejected("a normal member must leave (decommission) or be removed first");
        }
        let involved = self
            .tables
            .values()
            .flat_map(|p| p.tablets.tablets())
            .any(|t| t.involves(&host_id));
        if involved {
            return rejected("the member still holds or receives replicas");
        }
        self.members.remove(&node_id_of(&host_id));
        CommandOutcome::Applied
    }

    /// Members that new tables are placed on: joining and normal ones.
    fn descriptors(&self) -> Vec<NodeDescriptor> {
        self.descriptors_where(MemberState::accepts_replicas)
    }

    fn descriptors_where(&self, keep: impl Fn(MemberState) -> bool) -> Vec<NodeDescriptor> {
        self.members
            .values()
            .filter(|m| keep(m.state))
            .map(|m| NodeDescriptor {
                id: m.host_id,
                datacenter: m.datacenter.clone(),
                rack: m.rack.clone(),
            })
            .collect()
    }

    /// The fewest tablets merging may leave `table` with: the tablets it was created with
    /// (`None`: no such table).
    pub fn merge_floor(&self, table: &TableId) -> Option<usize> {
        let placement = self.tables.get(table)?;
        Some(match placement.created_with {
            0 => self.tablet_count(),
            created_with => created_with,
        })
    }

    /// The tablets a table is placed with when it is created: [`TABLETS_PER_NODE`] per
    /// node.
    fn tablet_count(&self) -> usize {
        TABLETS_PER_NODE * self.descriptors().len().max(1)
    }

    fn place(
        &self,
        strategy: &ReplicationStrategy,
    ) -> Result<TabletMap, shoal_placement::PlacementError> {
        shoal_placement::place(self.tablet_count(), strategy, &self.descriptors())
    }

    /// The tokens `host_id` reports to drivers: the last tokens of the tablets it is first
    /// replica of in the [`Self::routing_ring`].
    pub fn tokens_of(&self, host_id: &HostId, routed: impl Fn(&TableId) -> bool) -> Vec<Token> {
        self.routing_ring(routed)
            .map(|ring| ring.tokens_of(host_id))
            .unwrap_or_default()
    }

    /// The tokens every member reports to drivers (see [`Self::tokens_of`]), the ring
    /// chosen once for all of them.
    pub fn ring_tokens(&self, routed: impl Fn(&TableId) -> bool) -> HashMap<HostId, Vec<Token>> {
        let ring = self.routing_ring(routed);
        self.members
            .values()
            .map(|m| {
                let tokens = ring
                    .as_ref()
                    .map(|ring| ring.tokens_of(&m.host_id))
                    .unwrap_or_default();
                (m.host_id, tokens)
            })
            .collect()
    }

    /// The ring token-aware drivers route by: the table with the most tablets (ties: the
    /// lowest id) among those `routed` accepts (clients' tables, not system ones) that give
    /// every normal member at least one tablet to lead — drivers ignore a node without
    /// tokens; without such a table, the ring a table created now over the normal members
    /// would have (drivers do not know joining ones yet). Tables laid out differently are
    /// reached through one more hop, as with any token-unaware client.
    fn routing_ring(&self, routed: impl Fn(&TableId) -> bool) -> Option<Cow<'_, TabletMap>> {
        let normal: Vec<&HostId> = self
            .members
            .values()
            .filter(|m| m.state == MemberState::Normal)
            .map(|m| &m.host_id)
            .collect();
        let table = self
            .tables
            .iter()
            .filter(|(id, placement)| routed(id) && !placement.split)
            .filter(|(_, placement)| {
                let leaders: BTreeSet<&HostId> = placement
                    .tablets
                    .tablets()
                    .iter()
                    .filter_map(|tablet| tablet.replicas.first())
                    .collect();
                normal.iter().all(|host| leaders.contains(host))
            })
            .max_by_key(|(id, placement)| {
                (placement.tablets.tablets().len(), std::cmp::Reverse(**id))
            });
        if let Some((_, placement)) = table {
            return Some(Cow::Borrowed(&placement.tablets));
        }
        let normal = self.descriptors_where(|state| state == MemberState::Normal);
        let strategy = ReplicationStrategy::Simple { factor: 1 };
        shoal_placement::place(TABLETS_PER_NODE * normal.len(), &strategy, &normal)
            .ok()
            .map(Cow::Owned)
    }

    /// The replicas reads of `token` in table `table_id` ask, first replica first.
    pub fn replicas(&self, table_id: &TableId, token: Token) -> Option<Vec<HostId>> {
        self.tables.get(table_id).map(|placement| {
            placement
                .tablets
                .tablet_for(token)
                .read_replicas()
                .into_owned()
        })
    }

    pub fn member_by_host(&self, host_id: &HostId) -> Option<&Member> {
        self.members
            .get(&node_id_of(host_id))
            .filter(|m| m.host_id == *host_id)
    }

    /// How many tablets of any table `host_id` holds a replica of.
    pub fn tablet_replicas_on(&self, host_id: &HostId) -> usize {
        self.tables
            .values()
            .flat_map(|p| p.tablets.tablets())
            .filter(|t| t.replicas.contains(host_id))
            .count()
    }

    /// Every migration under way: `(table, tablet, transition)`.
    pub fn migrations(&self) -> Vec<(TableId, TabletId, Transition)> {
        self.tables
            .iter()
            .flat_map(|(table, placement)| {
                placement
                    .tablets
                    .transitions()
                    .map(move |(tablet, transition)| (*table, tablet.id, transition.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u8) -> Member {
        Member {
            host_id: HostId([id; 16]),
            internode_address: SocketAddr::from(([127, 0, 0, id], 7000)),
            cql_address: SocketAddr::from(([127, 0, 0, id], 9042)),
            datacenter: "datacenter1".into(),
            rack: "rack1".into(),
            state: MemberState::Normal,
            replaces: None,
        }
    }

    /// Member `id`, joining.
    fn joining(id: u8) -> Member {
        Member {
            state: MemberState::Joining,
            ..member(id)
        }
    }

    fn schema(version: u8) -> VersionedRecord {
        VersionedRecord {
            version: [version; 16],
            bytes: vec![version],
        }
    }

    #[test]
    fn schema_changes_are_compare_and_set_on_the_version() {
        let mut state = ClusterState::default();
        state.apply(Command::AddMember(member(1)));
        let first = Command::ChangeSchema {
            base_version: None,
            schema: schema(1),
            tables: BTreeMap::new(),
        };
        assert_eq!(state.apply(first.clone()), CommandOutcome::Applied);
        // The same change again was computed from a schema that is gone.
        assert_eq!(state.apply(first), CommandOutcome::Moved);
        let second = Command::ChangeSchema {
            base_version: Some([1; 16]),
            schema: schema(2),
            tables: BTreeMap::from([(TableId([9; 16]), ReplicationStrategy::Simple { factor: 3 })]),
        };
        assert_eq!(state.apply(second), CommandOutcome::Applied);
        assert_eq!(state.schema, Some(schema(2)));
        assert_eq!(state.tables.len(), 1);
    }

    const TABLE: TableId = TableId([9; 16]);

    /// Three normal members and one table of factor `factor`.
    fn three_nodes_one_table(factor: usize) -> ClusterState {
        let mut state = ClusterState::default();
        for id in 1..=3 {
            state.apply(Command::AddMember(member(id)));
        }
        state.apply(Command::ChangeSchema {
            base_version: None,
            schema: schema(1),
            tables: BTreeMap::from([(TABLE, ReplicationStrategy::Simple { factor })]),
        });
        state
    }

    fn tablet(state: &ClusterState, id: u64) -> &shoal_placement::Tablet {
        state.tables[&TABLE].tablets.get(TabletId(id)).unwrap()
    }

    #[test]
    fn drivers_route_by_a_table_only_while_every_normal_member_leads_some_of_it() {
        let mut state = three_nodes_one_table(1);
        state.apply(Command::AddMember(joining(4)));
        // While the fourth node joins, the table is the ring: it has no tokens yet.
        for id in 1..=3u8 {
            let host = HostId([id; 16]);
            assert_eq!(
                state.tokens_of(&host, |_| true),
                state.tables[&TABLE].tablets.tokens_of(&host)
            );
        }
        assert!(state.tokens_of(&HostId([4; 16]), |_| true).is_empty());
        // A table drivers are not routed by (a system one) never is the ring; the ring a
        // new table would have, over normal members, is.
        assert!(state.tokens_of(&HostId([4; 16]), |_| false).is_empty());
        assert_eq!(
            state.tokens_of(&HostId([1; 16]), |_| false).len(),
            TABLETS_PER_NODE
        );
        // Normal but leading nothing there: every node reports the ring a new table gets.
        state.apply(Command::SetMemberState {
            host_id: HostId([4; 16]),
            from: vec![MemberState::Joining],
            to: MemberState::Normal,
        });
        let all: Vec<Token> = (1..=4u8)
            .flat_map(|id| state.tokens_of(&HostId([id; 16]), |_| true))
            .collect();
        assert_eq!(all.len(), 4 * TABLETS_PER_NODE);
        assert_eq!(
            state.tokens_of(&HostId([4; 16]), |_| true).len(),
            TABLETS_PER_NODE
        );
    }

    #[test]
    fn a_split_tablet_keeps_its_replicas_and_takes_its_table_out_of_the_drivers_ring() {
        let mut state = three_nodes_one_table(2);
        let first = state.tables[&TABLE].tablets.tablets()[0].clone();
        let version = state.topology_version;
        let split = Command::SplitTablet {
            table: TABLE,
            tablet: first.id,
            at: Token(first.last_token.0 - 1000),
        };
        assert_eq!(state.apply(split.clone()), CommandOutcome::Applied);
        assert!(state.topology_version > version, "routing changed");
        let tablets = state.tables[&TABLE].tablets.tablets();
        assert_eq!(tablets.len(), 3 * TABLETS_PER_NODE + 1);
        assert_eq!(tablets[0].last_token, Token(first.last_token.0 - 1000));
        assert_eq!(tablets[1].last_token, first.last_token);
        assert!(tablets[..2].iter().all(|t| t.replicas == first.replicas));
        // The old tablet is gone: the same split again is refused, not applied twice.
        assert!(matches!(state.apply(split), CommandOutcome::Rejected(_)));
        // Drivers keep routing by an even layout, not by the split table's.
        let ring: Vec<Token> = state
            .ring_tokens(|_| true)
            .into_values()
            .flatten()
            .collect();
        assert_eq!(ring.len(), 3 * TABLETS_PER_NODE);
        assert!(!ring.contains(&Token(first.last_token.0 - 1000)));
    }

    #[test]
    fn a_strong_split_is_planned_then_finished_once_or_abandoned_and_holds_its_tablet_still() {
        let mut state = three_nodes_one_table(2);
        let first = state.tables[&TABLE].tablets.tablets()[0].clone();
        let at = Token(first.last_token.0 - 1000);
        let plan = Command::PlanStrongSplit {
            table: TABLE,
            tablet: first.id,
            at,
        };
        let version = state.topology_version;
        assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
        // Planning routes nothing differently; the tablet is whole until the finish.
        assert_eq!(state.topology_version, version);
        assert_eq!(
            state.tables[&TABLE].tablets.tablets().len(),
            3 * TABLETS_PER_NODE
        );
        assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));
        // A planned tablet does not move.
        let elsewhere = (1..=3u8)
            .map(|id| HostId([id; 16]))
            .find(|h| !first.replicas.contains(h));
        let mv = Command::StartMigration {
            table: TABLE,
            tablet: first.id,
            leaving: Some(first.replicas[0]),
            pending: elsewhere,
        };
        assert_eq!(
            state.apply(mv),
            CommandOutcome::Rejected("the tablet is being split or merged".into())
        );

        let plan_number = state.tables[&TABLE].strong_splits[&first.id].plan;
        // Another plan's finish (one abandoned since) is refused.
        let stale = Command::FinishStrongSplit {
            table: TABLE,
            tablet: first.id,
            plan: plan_number + 1,
            clock: 1234,
        };
        assert!(matches!(state.apply(stale), CommandOutcome::Rejected(_)));
        let finish = Command::FinishStrongSplit {
            table: TABLE,
            tablet: first.id,
            plan: plan_number,
            clock: 1234,
        };
        assert_eq!(state.apply(finish.clone()), CommandOutcome::Applied);
        assert!(state.topology_version > version);
        let placement = state.tables[&TABLE].clone();
        let halves = &placement.tablets.tablets()[..2];
        assert_eq!(halves[0].last_token, at);
        assert!(halves.iter().all(|t| t.replicas == first.replicas));
        assert!(halves
            .iter()
            .all(|t| placement.clock_floors.get(&t.id) == Some(&1234)));
        assert!(placement.strong_splits.is_empty());
        // Only one end per plan: finishing again, or abandoning now, is refused.
        assert!(matches!(state.apply(finish), CommandOutcome::Rejected(_)));
        let abandon = |plan| Command::AbandonStrongSplit {
            table: TABLE,
            tablet: halves[0].id,
            plan,
        };
        assert!(matches!(
            state.apply(abandon(plan_number)),
            CommandOutcome::Rejected(_)
        ));

        // Abandoned: the tablet stays whole and may be planned again.
        let half = halves[0].clone();
        let plan = Command::PlanStrongSplit {
            table: TABLE,
            tablet: half.id,
            at: Token(half.last_token.0 - 10),
        };
        assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
        let second_plan = state.tables[&TABLE].strong_splits[&half.id].plan;
        assert_ne!(second_plan, plan_number, "every plan has its own number");
        assert_eq!(state.apply(abandon(second_plan)), CommandOutcome::Applied);
        assert!(state.tables[&TABLE].strong_splits.is_empty());
        assert_eq!(state.apply(plan), CommandOutcome::Applied);
    }

    #[test]
    fn neighbouring_tablets_marked_and_merged_become_one_with_the_same_replicas() {
        let mut state = three_nodes_one_table(3);
        let tablets = state.tables[&TABLE].tablets.tablets().to_vec();
        let (first, second) = (tablets[0].clone(), tablets[1].clone());
        let plan = Command::PlanTabletMerge {
            table: TABLE,
            first: first.id,
        };
        // Never below the tablets a table is created with.
        assert!(matches!(
            state.apply(plan.clone()),
            CommandOutcome::Rejected(_)
        ));
        let last = tablets.last().unwrap();
        let split = Command::SplitTablet {
            table: TABLE,
            tablet: last.id,
            at: Token(last.last_token.0 - 1000),
        };
        assert_eq!(state.apply(split), CommandOutcome::Applied);
        let version = state.topology_version;
        assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
        assert_eq!(state.topology_version, version, "no routing changed");
        assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));
        let merge = Command::MergeTablets {
            table: TABLE,
            first: first.id,
            second: second.id,
        };
        assert_eq!(state.apply(merge.clone()), CommandOutcome::Applied);
        assert!(state.topology_version > version, "routing changed");
        let merged = &state.tables[&TABLE].tablets.tablets()[0];
        assert_eq!(merged.last_token, second.last_token);
        assert_eq!(merged.replicas, first.replicas);
        assert_eq!(state.tables[&TABLE].tablets.tablets().len(), tablets.len());
        // Applied once: the same merge again names tablets that are gone.
        assert!(matches!(state.apply(merge), CommandOutcome::Rejected(_)));
        // Back at the tablets it was created with: no more merges.
        let merged = state.tables[&TABLE].tablets.tablets()[0].id;
        assert!(matches!(
            state.apply(Command::PlanTabletMerge {
                table: TABLE,
                first: merged
            }),
            CommandOutcome::Rejected(_)
        ));
    }

    #[test]
    fn a_strong_merge_fences_both_tablets_and_ends_once_with_the_newer_clock() {
        let mut state = three_nodes_one_table(3);
        let tablets = state.tables[&TABLE].tablets.tablets().to_vec();
        let (first, second) = (tablets[0].clone(), tablets[1].clone());
        let last = tablets.last().unwrap();
        state.apply(Command::SplitTablet {
            table: TABLE,
            tablet: last.id,
            at: Token(last.last_token.0 - 1000),
        });
        let plan = Command::PlanStrongMerge {
            table: TABLE,
            first: first.id,
        };
        // Only a pair marked to merge.
        assert!(matches!(
            state.apply(plan.clone()),
            CommandOutcome::Rejected(_)
        ));
        state.apply(Command::PlanTabletMerge {
            table: TABLE,
            first: first.id,
        });
        assert_eq!(state.apply(plan.clone()), CommandOutcome::Applied);
        let placement = &state.tables[&TABLE];
        let number = placement.strong_merges[&first.id];
        // Both groups are fenced for it; the third tablet is not.
        assert_eq!(placement.strong_plan_of(first.id), Some(number));
        assert_eq!(placement.strong_plan_of(second.id), Some(number));
        assert_eq!(placement.strong_plan_of(tablets[2].id), None);
        assert!(matches!(state.apply(plan), CommandOutcome::Rejected(_)));

        let abandon = Command::AbandonStrongMerge {
            table: TABLE,
            first: first.id,
            plan: number,
        };
        assert_eq!(state.apply(abandon.clone()), CommandOutcome::Applied);
        assert!(matches!(state.apply(abandon), CommandOutcome::Rejected(_)));
        state.apply(Command::PlanStrongMerge {
            table: TABLE,
            first: first.id,
        });
        let number = state.tables[&TABLE].strong_merges[&first.id];
        let finish = Command::FinishStrongMerge {
            table: TABLE,
            first: first.id,
            plan: number,
            clock: 77,
        };
        assert_eq!(state.apply(finish.clone()), CommandOutcome::Applied);
        let placement = &state.tables[&TABLE];
        let merged = &placement.tablets.tablets()[0];
        assert_eq!(merged.last_token, second.last_token);
        assert_eq!(placement.clock_floors.get(&merged.id), Some(&77));
        assert!(placement.strong_merges.is_empty());
        assert!(matches!(state.apply(finish), CommandOutcome::Rejected(_)));
    }

    #[test]
    fn a_table_merges_down_to_the_tablets_it_was_created_with_not_to_todays_layout() {
        let mut state = three_nodes_one_table(1);
        let created_with = state.tables[&TABLE].tablets.tablets().len();
        assert_eq!(state.merge_floor(&TABLE), Some(created_with));
        // A fourth node would give a new table more tablets; this one's floor stays.
        state.apply(Command::AddMember(member(4)));
        assert_eq!(state.merge_floor(&TABLE), Some(created_with));
        let last = state.tables[&TABLE]
            .tablets
            .tablets()
            .last()
            .unwrap()
            .clone();
        let split = Command::SplitTablet {
            table: TABLE,
            tablet: last.id,
            at: Token(last.last_token.0 - 1000),
        };
        assert_eq!(state.apply(split), CommandOutcome::Applied);
        let first = state.tables[&TABLE].tablets.tablets()[0].id;
        let plan = Command::PlanTabletMerge {
            table: TABLE,
            first,
        };
        assert_eq!(state.apply(plan), CommandOutcome::Applied);
        assert_eq!(state.merge_floor(&TableId([0xee; 16])), None);
    }

    #[test]
    fn existing_tables_keep_their_tablets_when_members_join_and_replication_changes() {
        let mut state = three_nodes_one_table(2);
        let before = state.tables[&TABLE].tablets.clone();
        assert_eq!(before.tablets().len(), 3 * TABLETS_PER_NODE);
        assert_eq!(
            state.apply(Command::AddMember(joining(4))),
            CommandOutcome::Applied
        );
        assert_eq!(state.tables[&TABLE].tablets, before);
        state.apply(Command::ChangeSchema {
            base_version: Some([1; 16]),
            schema: schema(2),
            tables: BTreeMap::from([(TABLE, ReplicationStrategy::Simple { factor: 3 })]),
        });
        assert_eq!(state.tables[&TABLE].tablets, before);
        assert_eq!(
            state.tables[&TABLE].strategy,
            ReplicationStrategy::Simple { factor: 3 }
        );
        // A table created now is placed over the four nodes, and each node reports the
        // tokens of the tablets it is first replica of there.
        state.apply(Command::ChangeSchema {
            base_version: Some([2; 16]),
            schema: schema(3),
            tables: BTreeMap::from([
                (TABLE, ReplicationStrategy::Simple { factor: 3 }),
                (TableId([8; 16]), ReplicationStrategy::Simple { factor: 1 }),
            ]),
        });
        let new_table = &state.tables[&TableId([8; 16])].tablets;
        assert_eq!(new_table.tablets().len(), 4 * TABLETS_PER_NODE);
        for id in 1..=4u8 {
            let tokens = state.tokens_of(&HostId([id; 16]), |_| true);
            assert_eq!(tokens.len(), TABLETS_PER_NODE);
            for token in tokens {
                assert_eq!(new_table.tablet_for(token).replicas[0], HostId([id; 16]));
            }
        }
    }

    #[test]
    fn a_migration_walks_its_stages_and_switches_replicas_at_cleanup() {
        let mut state = three_nodes_one_table(2);
        state.apply(Command::AddMember(joining(4)));
        let old = tablet(&state, 0).replicas.clone();
        let leaving = old[1];
        let version = state.topology_version;
        let start = Command::StartMigration {
            table: TABLE,
            tablet: TabletId(0),
            leaving: Some(leaving),
            pending: Some(HostId([4; 16])),
        };
        assert_eq!(state.apply(start.clone()), CommandOutcome::Applied);
        assert_eq!(state.topology_version, version + 1);
        let migration = tablet(&state, 0).transition.as_ref().unwrap().id;
        assert!(matches!(state.apply(start), CommandOutcome::Rejected(_)));
        for to in [
            MigrationStage::WriteBoth,
            MigrationStage::Streamed,
            MigrationStage::ReadNew,
            MigrationStage::Cleanup,
        ] {
            assert_eq!(tablet(&state, 0).replicas, old, "switched before {to:?}");
            assert_eq!(
                state.apply(Command::AdvanceMigration {
                    table: TABLE,
                    tablet: TabletId(0),
                    migration,
                    to,
                }),
                CommandOutcome::Applied
            );
        }
        assert_eq!(tablet(&state, 0).replicas, vec![old[0], HostId([4; 16])]);
        let end = |aborted| Command::EndMigration {
            table: TABLE,
            tablet: TabletId(0),
            migration,
            aborted,
        };
        assert!(matches!(
            state.apply(end(true)),
            CommandOutcome::Rejected(_)
        ));
        assert_eq!(state.apply(end(false)), CommandOutcome::Applied);
        assert!(tablet(&state, 0).transition.is_none());
        assert_eq!(state.next_migration, migration.0 + 1);
    }

    #[test]
    fn migration_steps_check_their_preconditions() {
        let mut state = three_nodes_one_table(2);
        let replicas = tablet(&state, 0).replicas.clone();
        let outsider = [1u8, 2, 3]
            .map(|id| HostId([id; 16]))
            .into_iter()
            .find(|h| !replicas.contains(h))
            .unwrap();
        let start = |leaving, pending| Command::StartMigration {
            table: TABLE,
            tablet: TabletId(0),
            leaving,
            pending,
        };
        let refused = |outcome: CommandOutcome| matches!(outcome, CommandOutcome::Rejected(_));
        assert!(refused(
            state.apply(start(Some(outsider), Some(replicas[0])))
        ));
        assert!(refused(
            state.apply(start(Some(replicas[0]), Some(replicas[1])))
        ));
        assert!(refused(state.apply(start(None, None))));
        assert!(refused(state.apply(start(None, Some(HostId([7; 16]))))));
        // A leaving member cannot receive replicas.
        state.apply(Command::SetMemberState {
            host_id: outsider,
            from: vec![MemberState::Normal],
            to: MemberState::Leaving,
        });
        assert!(refused(
            state.apply(start(Some(replicas[0]), Some(outsider)))
        ));
        // Stages advance one at a time, for the migration under way only.
        state.apply(Command::SetMemberState {
            host_id: outsider,
            from: vec![MemberState::Leaving],
            to: MemberState::Normal,
        });
        assert_eq!(
            state.apply(start(Some(replicas[0]), Some(outsider))),
            CommandOutcome::Applied
        );
        let migration = tablet(&state, 0).transition.as_ref().unwrap().id;
        let advance = |migration, to| Command::AdvanceMigration {
            table: TABLE,
            tablet: TabletId(0),
            migration,
            to,
        };
        assert!(refused(
            state.apply(advance(migration, MigrationStage::ReadNew))
        ));
        assert!(refused(
            state.apply(advance(MigrationId(99), MigrationStage::WriteBoth))
        ));
        // Aborted before the switch, the old replicas stay.
        state.apply(advance(migration, MigrationStage::WriteBoth));
        // Reads cannot move before writes have waited for the new replicas (`Streamed`).
        assert!(refused(
            state.apply(advance(migration, MigrationStage::ReadNew))
        ));
        assert_eq!(
            state.apply(Command::EndMigration {
                table: TABLE,
                tablet: TabletId(0),
                migration,
                aborted: true,
            }),
            CommandOutcome::Applied
        );
        assert_eq!(tablet(&state, 0).replicas, replicas);
        assert!(tablet(&state, 0).transition.is_none());
    }

    #[test]
    fn dropping_a_replica_skips_streaming_and_a_member_leaves_only_when_it_holds_nothing() {
        let mut state = three_nodes_one_table(1);
        let holder = tablet(&state, 0).replicas[0];
        assert!(matches!(
            state.apply(Command::RemoveMember(holder)),
            CommandOutcome::Rejected(_)
        ));
        state.apply(Command::SetMemberState {
            host_id: holder,
            from: vec![MemberState::Normal],
            to: MemberState::Leaving,
        });
        assert!(matches!(
            state.apply(Command::RemoveMember(holder)),
            CommandOutcome::Rejected(_)
        ));
        // Give every tablet of the leaving member away by dropping (factor 1 here is only
        // for the test: the balancer moves rather than drops when the factor needs it).
        let held: Vec<TabletId> = state.tables[&TABLE]
            .tablets
            .tablets()
            .iter()
            .filter(|t| t.replicas.contains(&holder))
            .map(|t| t.id)
            .collect();
        let other = [1u8, 2, 3]
            .map(|id| HostId([id; 16]))
            .into_iter()
            .find(|h| *h != holder)
            .unwrap();
        for id in held {
            state.apply(Command::StartMigration {
                table: TABLE,
                tablet: id,
                leaving: Some(holder),
                pending: Some(other),
            });
            let migration = state.tables[&TABLE]
                .tablets
                .get(id)
                .unwrap()
                .transition
                .as_ref()
                .unwrap()
                .id;
            for to in [
                MigrationStage::WriteBoth,
                MigrationStage::Streamed,
                MigrationStage::ReadNew,
                MigrationStage::Cleanup,
            ] {
                state.apply(Command::AdvanceMigration {
                    table: TABLE,
                    tablet: id,
                    migration,
                    to,
                });
            }
            state.apply(Command::EndMigration {
                table: TABLE,
                tablet: id,
                migration,
                aborted: false,
            });
        }
        assert_eq!(
            state.apply(Command::RemoveMember(holder)),
            CommandOutcome::Applied
        );
        assert!(state.member_by_host(&holder).is_none());
        // A drop (no pending replica) starts at ReadNew.
        let replicas = tablet(&state, 1).replicas.clone();
        state.apply(Command::StartMigration {
            table: TABLE,
            tablet: TabletId(1),
            leaving: Some(replicas[0]),
            pending: None,
        });
        assert_eq!(
            tablet(&state, 1).transition.as_ref().unwrap().stage,
            MigrationStage::ReadNew
        );
        assert!(tablet(&state, 1).read_replicas().is_empty());
    }

    #[test]
    fn a_replacing_member_marks_the_replaced_one_removing() {
        let mut state = three_nodes_one_table(3);
        let mut replacement = member(9);
        replacement.state = MemberState::Joining;
        replacement.replaces = Some(HostId([2; 16]));
        assert_eq!(
            state.apply(Command::AddMember(replacement)),
            CommandOutcome::Applied
        );
        assert_eq!(
            state.member_by_host(&HostId([2; 16])).unwrap().state,
            MemberState::Removing
        );
        let mut bogus = member(10);
        bogus.replaces = Some(HostId([42; 16]));
        assert!(matches!(
            state.apply(Command::AddMember(bogus)),
            CommandOutcome::Rejected(_)
        ));
    }

    #[test]
    fn dropped_tables_leave_the_placement() {
        let mut state = ClusterState::default();
        state.apply(Command::AddMember(member(1)));
        state.apply(Command::ChangeSchema {
            base_version: None,
            schema: schema(1),
            tables: BTreeMap::from([(TableId([9; 16]), ReplicationStrategy::Simple { factor: 1 })]),
        });
        state.apply(Command::ChangeSchema {
            base_version: Some([1; 16]),
            schema: schema(2),
            tables: BTreeMap::new(),
        });
        assert!(state.replicas(&TableId([9; 16]), Token(0)).is_none());
    }
}
