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
mod tests;
