//! The replicated state: who is in the cluster, the schema, and where each table's
//! tablets live.
//!
//! [`ClusterState`] changes only by [`ClusterState::apply`]ing a [`Command`] that Raft has
//! committed, so every node computes the same state from the same log. Apply is pure and
//! deterministic (no clocks, no randomness): tablet placement is a function of the members
//! and the keyspace's replication.
//!
//! The schema is opaque here (bytes plus a version UUID): the coordinator owns what a
//! keyspace or table is. Schema changes are compare-and-set on the version, so two nodes
//! changing the schema at once cannot lose either change — the second one is told that the
//! schema moved on, and retries against the newer one.

use serde::{Deserialize, Serialize};
use shoal_model::{HostId, TableId, Token};
use shoal_placement::{NodeDescriptor, ReplicationStrategy, TabletMap};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// A node's Raft id: the first eight bytes of its host id.
pub type NodeId = u64;

/// Tablets per table for each member: a table on N nodes has `TABLETS_PER_NODE * N`
/// tablets, so each node is first replica for about this many of them.
pub const TABLETS_PER_NODE: usize = 8;

pub fn node_id_of(host_id: &HostId) -> NodeId {
    let mut first = [0u8; 8];
    first.copy_from_slice(&host_id.0[..8]);
    u64::from_be_bytes(first)
}

/// Where a member is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Owns tablets and serves requests.
    Normal,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Normal => "normal",
        }
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
}

/// What the replicated log carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A node joins (or re-registers with a new address).
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
}

impl ClusterState {
    pub fn apply(&mut self, command: Command) -> CommandOutcome {
        match command {
            Command::AddMember(member) => {
                self.members.insert(member.node_id(), member);
                let tables = std::mem::take(&mut self.tables);
                for (id, placement) in tables {
                    match self.place(&placement.strategy) {
                        Ok(tablets) => {
                            self.tables.insert(
                                id,
                                TablePlacement {
                                    strategy: placement.strategy,
                                    tablets,
                                },
                            );
                        }
                        Err(error) => return CommandOutcome::Rejected(error.to_string()),
                    }
                }
                CommandOutcome::Applied
            }
            Command::ChangeSchema {
                base_version,
                schema,
                tables,
            } => {
                if base_version != self.schema.as_ref().map(|s| s.version) {
                    return CommandOutcome::Moved;
                }
                let mut placed = BTreeMap::new();
                for (id, strategy) in tables {
                    let unchanged = self
                        .tables
                        .get(&id)
                        .filter(|existing| existing.strategy == strategy);
                    let placement = match unchanged {
                        Some(existing) => existing.clone(),
                        None => match self.place(&strategy) {
                            Ok(tablets) => TablePlacement { strategy, tablets },
                            Err(error) => return CommandOutcome::Rejected(error.to_string()),
                        },
                    };
                    placed.insert(id, placement);
                }
                self.tables = placed;
                self.schema = Some(schema);
                CommandOutcome::Applied
            }
            Command::ChangeRoles {
                base_version,
                roles,
            } => {
                if base_version != self.roles.as_ref().map(|r| r.version) {
                    return CommandOutcome::Moved;
                }
                self.roles = Some(roles);
                CommandOutcome::Applied
            }
        }
    }

    fn descriptors(&self) -> Vec<NodeDescriptor> {
        self.members
            .values()
            .map(|m| NodeDescriptor {
                id: m.host_id,
                datacenter: m.datacenter.clone(),
                rack: m.rack.clone(),
            })
            .collect()
    }

    fn tablet_count(&self) -> usize {
        TABLETS_PER_NODE * self.members.len().max(1)
    }

    fn place(
        &self,
        strategy: &ReplicationStrategy,
    ) -> Result<TabletMap, shoal_placement::PlacementError> {
        shoal_placement::place(self.tablet_count(), strategy, &self.descriptors())
    }

    /// The tokens `host_id` reports to drivers: the last tokens of the tablets it is first
    /// replica for. Every table places its first replicas the same way (tablet `i` starts
    /// at member `i`), so one ring describes them all.
    pub fn tokens_of(&self, host_id: &HostId) -> Vec<Token> {
        match self.place(&ReplicationStrategy::Simple { factor: 1 }) {
            Ok(ring) => ring.tokens_of(host_id),
            Err(_) => Vec::new(),
        }
    }

    /// The replicas of `token` in table `table_id`, first replica first.
    pub fn replicas(&self, table_id: &TableId, token: Token) -> Option<&[HostId]> {
        self.tables
            .get(table_id)
            .map(|placement| placement.tablets.tablet_for(token).replicas.as_slice())
    }

    pub fn member_by_host(&self, host_id: &HostId) -> Option<&Member> {
        self.members.get(&node_id_of(host_id))
    }

    /// How many tablets of any table `host_id` holds a replica of.
    pub fn tablet_replicas_on(&self, host_id: &HostId) -> usize {
        self.tables
            .values()
            .flat_map(|p| p.tablets.tablets())
            .filter(|t| t.replicas.contains(host_id))
            .count()
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

    #[test]
    fn tables_are_replaced_when_members_join_and_the_ring_follows() {
        let mut state = ClusterState::default();
        state.apply(Command::AddMember(member(1)));
        state.apply(Command::ChangeSchema {
            base_version: None,
            schema: schema(1),
            tables: BTreeMap::from([(TableId([9; 16]), ReplicationStrategy::Simple { factor: 2 })]),
        });
        assert_eq!(
            state.replicas(&TableId([9; 16]), Token(0)).unwrap().len(),
            1
        );
        state.apply(Command::AddMember(member(2)));
        state.apply(Command::AddMember(member(3)));
        let placement = &state.tables[&TableId([9; 16])];
        assert_eq!(placement.tablets.tablets().len(), 3 * TABLETS_PER_NODE);
        for tablet in placement.tablets.tablets() {
            assert_eq!(tablet.replicas.len(), 2);
        }
        // Each node reports the tokens of the tablets it is first replica for, and those
        // are exactly the tablets whose first replica the table placed on it.
        for id in 1..=3u8 {
            let tokens = state.tokens_of(&HostId([id; 16]));
            assert_eq!(tokens.len(), TABLETS_PER_NODE);
            for token in tokens {
                assert_eq!(
                    state.replicas(&TableId([9; 16]), token).unwrap()[0],
                    HostId([id; 16])
                );
            }
        }
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
