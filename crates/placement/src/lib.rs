//! Placement: which nodes hold which token ranges. Pure functions of cluster metadata,
//! no I/O — the cluster layer stores the result in its replicated log and the coordinator
//! reads it.
//!
//! - A table's token space is cut into *tablets*: contiguous ranges
//!   `(previous tablet's last token, last token]`, together covering the whole ring
//!   ([`TabletMap`], [`Tablet`]).
//! - Each tablet has its own replica set, first chosen by the keyspace's
//!   [`ReplicationStrategy`] over the cluster's [`NodeDescriptor`]s ([`place`]): replicas
//!   are distinct nodes, NetworkTopologyStrategy places the given count in each datacenter
//!   and prefers distinct racks, and the first (primary) replica and the replica load are
//!   spread evenly over the nodes.
//! - From then on replicas *move*: a tablet's [`Transition`] walks through the
//!   [`MigrationStage`]s that decide where its reads and writes go while a replica is
//!   streamed to a new node ([`tablet`]); the [`balance`]r decides which moves to start,
//!   from the current map — when nodes join, leave or are removed, when the replication
//!   factor changes, and to keep replicas and primaries even.
//! - Drivers still see a classic ring: each node reports as its tokens the last tokens of
//!   the tablets it is the primary replica of ([`TabletMap::tokens_of`]), so token-aware
//!   routing sends a request to a replica of its tablet.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod balance;
pub mod tablet;

pub use balance::{bytes::Bytes, plan_moves, plan_primaries, BalancerNode, Budget, Move};
pub use tablet::{
    apply_move, MigrationId, MigrationStage, Tablet, TabletMap, Transition, WriteReplicas,
};

use serde::{Deserialize, Serialize};
use shoal_model::{HostId, TabletId, Token};
use std::collections::BTreeMap;

/// A node of the cluster, as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDescriptor {
    /// The node's host id.
    pub id: HostId,
    pub datacenter: String,
    pub rack: String,
}

/// How many replicas a keyspace keeps, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicationStrategy {
    /// `factor` replicas anywhere in the cluster.
    Simple { factor: usize },
    /// A replica count per datacenter.
    NetworkTopology { factors: BTreeMap<String, usize> },
}

/// Why a placement cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementError {
    NoNodes,
    NoTablets,
}

impl std::fmt::Display for PlacementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlacementError::NoNodes => f.write_str("no nodes to place replicas on"),
            PlacementError::NoTablets => f.write_str("a table needs at least one tablet"),
        }
    }
}

impl std::error::Error for PlacementError {}

/// The last tokens of `count` evenly sized tablets; the last one is always `Token::MAX`.
pub fn even_boundaries(count: usize) -> Vec<Token> {
    let count = count.max(1) as i128;
    let span = i64::MAX as i128 - i64::MIN as i128;
    (1..=count)
        .map(|i| Token((i64::MIN as i128 + span * i / count) as i64))
        .collect()
}

/// Chooses replicas for `replicas_wanted` more nodes out of `candidates` (already in
/// preference order), skipping nodes already chosen and, while possible, racks already
/// used.
fn choose(candidates: &[&NodeDescriptor], start: usize, wanted: usize, chosen: &mut Vec<HostId>) {
    let mut racks_used: Vec<&str> = Vec::new();
    let mut picked = 0;
    // First pass: distinct racks; second pass: any node.
    for distinct_racks in [true, false] {
        for offset in 0..candidates.len() {
            if picked == wanted {
                return;
            }
            let node = candidates[(start + offset) % candidates.len()];
            if chosen.contains(&node.id)
                || (distinct_racks && racks_used.contains(&node.rack.as_str()))
            {
                continue;
            }
            racks_used.push(&node.rack);
            chosen.push(node.id);
            picked += 1;
        }
    }
}

/// Places `tablet_count` evenly sized tablets over `nodes` following `strategy`; the
/// tablets are numbered from 0 in token order.
///
/// Tablet `i` starts its replica walk at node `i` (in host-id order), so each node is the
/// primary of an equal share of tablets (±1) and holds an equal share of replicas (±1).
/// A replication factor beyond the nodes available places every available node.
pub fn place(
    tablet_count: usize,
    strategy: &ReplicationStrategy,
    nodes: &[NodeDescriptor],
) -> Result<TabletMap, PlacementError> {
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    if tablet_count == 0 {
        return Err(PlacementError::NoTablets);
    }
    let mut ordered: Vec<&NodeDescriptor> = nodes.iter().collect();
    ordered.sort_by_key(|node| node.id);
    let tablets = even_boundaries(tablet_count)
        .into_iter()
        .enumerate()
        .map(|(index, last_token)| {
            let mut replicas = Vec::new();
            match strategy {
                ReplicationStrategy::Simple { factor } => {
                    choose(&ordered, index, *factor, &mut replicas)
                }
                ReplicationStrategy::NetworkTopology { factors } => {
                    for (datacenter, factor) in factors {
                        let local: Vec<&NodeDescriptor> = ordered
                            .iter()
                            .copied()
                            .filter(|n| &n.datacenter == datacenter)
                            .collect();
                        if !local.is_empty() {
                            choose(&local, index, *factor, &mut replicas);
                        }
                    }
                }
            }
            Tablet {
                id: TabletId(index as u64),
                last_token,
                replicas,
                transition: None,
            }
        })
        .collect();
    Ok(TabletMap::new(tablets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u8, datacenter: &str, rack: &str) -> NodeDescriptor {
        NodeDescriptor {
            id: HostId([id; 16]),
            datacenter: datacenter.into(),
            rack: rack.into(),
        }
    }

    fn three_nodes() -> Vec<NodeDescriptor> {
        vec![
            node(1, "dc1", "r1"),
            node(2, "dc1", "r1"),
            node(3, "dc1", "r1"),
        ]
    }

    #[test]
    fn tablets_cover_the_ring_exactly_once() {
        let map = place(
            16,
            &ReplicationStrategy::Simple { factor: 1 },
            &three_nodes(),
        )
        .unwrap();
        assert_eq!(map.tablets().len(), 16);
        assert_eq!(map.tablets().last().unwrap().last_token, Token::MAX);
        assert!(map
            .tablets()
            .windows(2)
            .all(|w| w[0].last_token < w[1].last_token));
        for token in [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX] {
            let index = map.tablet_index(Token(token));
            let tablet = &map.tablets()[index];
            assert!(Token(token) <= tablet.last_token);
            if index > 0 {
                assert!(Token(token) > map.tablets()[index - 1].last_token);
            }
        }
    }

    #[test]
    fn simple_strategy_spreads_primaries_and_replicas_evenly() {
        let nodes = three_nodes();
        let map = place(64, &ReplicationStrategy::Simple { factor: 2 }, &nodes).unwrap();
        for tablet in map.tablets() {
            assert_eq!(tablet.replicas.len(), 2);
            assert_ne!(tablet.replicas[0], tablet.replicas[1]);
        }
        let primaries: Vec<usize> = nodes.iter().map(|n| map.tokens_of(&n.id).len()).collect();
        let replicas: Vec<usize> = nodes
            .iter()
            .map(|n| {
                map.tablets()
                    .iter()
                    .filter(|t| t.replicas.contains(&n.id))
                    .count()
            })
            .collect();
        assert_eq!(primaries.iter().sum::<usize>(), 64);
        assert!(
            primaries.iter().max().unwrap() - primaries.iter().min().unwrap() <= 1,
            "{primaries:?}"
        );
        assert!(
            replicas.iter().max().unwrap() - replicas.iter().min().unwrap() <= 1,
            "{replicas:?}"
        );
    }

    #[test]
    fn a_factor_beyond_the_nodes_places_every_node_once() {
        let map = place(
            4,
            &ReplicationStrategy::Simple { factor: 5 },
            &three_nodes(),
        )
        .unwrap();
        for tablet in map.tablets() {
            let mut replicas = tablet.replicas.clone();
            replicas.sort();
            replicas.dedup();
            assert_eq!(replicas.len(), 3);
        }
    }

    #[test]
    fn network_topology_places_per_datacenter_on_distinct_racks() {
        let nodes = vec![
            node(1, "dc1", "a"),
            node(2, "dc1", "a"),
            node(3, "dc1", "b"),
            node(4, "dc2", "a"),
            node(5, "dc2", "b"),
        ];
        let factors = BTreeMap::from([("dc1".to_string(), 2), ("dc2".to_string(), 1)]);
        let map = place(
            12,
            &ReplicationStrategy::NetworkTopology { factors },
            &nodes,
        )
        .unwrap();
        for tablet in map.tablets() {
            let in_dc = |dc: &str| {
                tablet
                    .replicas
                    .iter()
                    .filter(|id| nodes.iter().any(|n| n.id == **id && n.datacenter == dc))
                    .count()
            };
            assert_eq!((in_dc("dc1"), in_dc("dc2")), (2, 1));
            let dc1_racks: Vec<&str> = tablet
                .replicas
                .iter()
                .filter_map(|id| nodes.iter().find(|n| n.id == *id && n.datacenter == "dc1"))
                .map(|n| n.rack.as_str())
                .collect();
            assert_ne!(
                dc1_racks[0], dc1_racks[1],
                "dc1's two replicas are on different racks"
            );
        }
    }

    #[test]
    fn placement_needs_nodes_and_tablets() {
        assert_eq!(
            place(4, &ReplicationStrategy::Simple { factor: 1 }, &[]),
            Err(PlacementError::NoNodes)
        );
        assert_eq!(
            place(
                0,
                &ReplicationStrategy::Simple { factor: 1 },
                &three_nodes()
            ),
            Err(PlacementError::NoTablets)
        );
    }
}
