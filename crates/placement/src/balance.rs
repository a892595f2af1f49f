//! The tablet balancer: which replica moves to start now, as a pure function of one table's
//! tablets, its replication and the nodes (no I/O, no clock: the cluster's migration driver
//! calls it and commits what it returns).
//!
//! It works from the current map, never from a fresh layout, and moves as few replicas as
//! it can, in this order:
//!
//! 1. **Replicas that must go**: a replica on a node that is leaving or being removed moves
//!    to another node — the node replacing it, if there is one, otherwise the least loaded
//!    node on a rack the tablet does not use yet.
//! 2. **Replica counts**: a tablet with fewer replicas than its factor (in a datacenter,
//!    for NetworkTopologyStrategy) gets one more; one with more loses one.
//! 3. **Neighbours to merge** ([`TabletMap::plan_merge`]): the second of the pair moves,
//!    one replica at a time, onto the nodes of the first, so that the two can be merged
//!    without data moving at the merge.
//! 4. **Even load**: while the most loaded node holds more than one replica more than the
//!    least loaded one, a tablet moves from the first to the second — the one that brings
//!    their bytes closest, the smallest of those (least to stream), the newest of those
//!    (split halves get the newest ids, so a growing ordered table's data moves first
//!    even before its sizes are measured).
//!    Tablets to be merged stay where they are, or they would be moved apart again.
//! 5. **Even bytes**: with counts even, a node holding more bytes than another by enough
//!    ([`Bytes::worth_moving`]) gives it the tablet that brings their bytes closest: the
//!    two trade the odd replica when the first holds one more, and otherwise the second
//!    gives back its smallest tablet, so counts stay even.
//!
//! Among nodes holding as many replicas, the one holding fewer bytes (over every table,
//! [`bytes`]) receives first and gives last. Load counts a move under way as done. Each node takes part in at most
//! [`Budget::per_node`] moves at once (as the one giving a replica up or receiving it), so
//! streaming stays within what a node's disk and network can carry; the rest waits for a
//! later round. Nodes that are down neither give nor receive.
//!
//! [`plan_primaries`] evens out which replica is first (the primary, whose tokens drivers
//! route by): a metadata-only change, no data moves.

pub mod bytes;

use crate::tablet::{apply_move, TabletMap};
use crate::ReplicationStrategy;
use bytes::{distance_after, gain, Bytes};
use shoal_model::{HostId, TableId, TabletId};
use std::collections::{BTreeMap, BTreeSet};

/// A node as the balancer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancerNode {
    pub id: HostId,
    pub datacenter: String,
    pub rack: String,
    /// Joining or normal: may be given replicas.
    pub accepts: bool,
    /// Leaving or being removed: must give up every replica.
    pub draining: bool,
    /// Up, as the failure detector sees it.
    pub alive: bool,
    /// The dead node this one replaces: that node's replicas come here first.
    pub replaces: Option<HostId>,
}

/// A replica move to start: `leaving` gives the tablet up, `pending` receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub tablet: TabletId,
    pub leaving: Option<HostId>,
    pub pending: Option<HostId>,
}

/// How many moves each node may take part in at once, and how many it does now.
#[derive(Debug, Clone)]
pub struct Budget {
    pub per_node: usize,
    pub busy: BTreeMap<HostId, usize>,
}

impl Budget {
    pub fn new(per_node: usize) -> Budget {
        Budget {
            per_node,
            busy: BTreeMap::new(),
        }
    }

    /// Counts a move under way (or just planned) against the nodes it involves.
    pub fn charge(&mut self, leaving: Option<HostId>, pending: Option<HostId>) {
        for host in leaving.into_iter().chain(pending) {
            *self.busy.entry(host).or_default() += 1;
        }
    }

    fn has_room(&self, host: &HostId) -> bool {
        self.has_room_for(host, 1)
    }

    fn has_room_for(&self, host: &HostId, moves: usize) -> bool {
        self.busy.get(host).copied().unwrap_or(0) + moves <= self.per_node
    }
}

/// The replicas one group must hold: every datacenter together (SimpleStrategy), or one
/// datacenter (NetworkTopologyStrategy).
struct Group<'n> {
    factor: usize,
    /// The group's nodes, by id.
    nodes: BTreeMap<HostId, &'n BalancerNode>,
}

fn groups<'n>(strategy: &ReplicationStrategy, nodes: &'n [BalancerNode]) -> Vec<Group<'n>> {
    match strategy {
        ReplicationStrategy::Simple { factor } => vec![Group {
            factor: *factor,
            nodes: nodes.iter().map(|n| (n.id, n)).collect(),
        }],
        ReplicationStrategy::NetworkTopology { factors } => factors
            .iter()
            .map(|(datacenter, factor)| Group {
                factor: *factor,
                nodes: nodes
                    .iter()
                    .filter(|n| &n.datacenter == datacenter)
                    .map(|n| (n.id, n))
                    .collect(),
            })
            .collect(),
    }
}

impl Group<'_> {
    /// Nodes that may receive replicas now.
    fn receivers(&self) -> impl Iterator<Item = &BalancerNode> {
        self.nodes
            .values()
            .copied()
            .filter(|n| n.accepts && n.alive && !n.draining)
    }

    /// Replicas of this group among `replicas`.
    fn members_of(&self, replicas: &[HostId]) -> Vec<HostId> {
        replicas
            .iter()
            .filter(|host| self.nodes.contains_key(host))
            .copied()
            .collect()
    }

    fn draining(&self, host: &HostId) -> bool {
        self.nodes.get(host).is_none_or(|n| n.draining)
    }

    fn rack_of(&self, host: &HostId) -> Option<&str> {
        self.nodes.get(host).map(|n| n.rack.as_str())
    }

    /// The tally of one table's replicas on this group's nodes, counting moves under way
    /// as done.
    fn tally<'b>(&self, table: TableId, map: &TabletMap, bytes: &'b mut Bytes) -> Tally<'b> {
        let mut counts: BTreeMap<HostId, usize> = self.receivers().map(|n| (n.id, 0)).collect();
        for tablet in map.tablets() {
            for host in tablet.new_replicas() {
                if let Some(count) = counts.get_mut(&host) {
                    *count += 1;
                }
            }
        }
        Tally {
            table,
            counts,
            bytes,
        }
    }

    /// The best node to receive a replica of a tablet now held by `others` (and given up
    /// by `leaving`): the node replacing `leaving`, then a rack the tablet does not use,
    /// then the least loaded, then the one holding fewest bytes, then the lowest id.
    fn destination(
        &self,
        others: &[HostId],
        leaving: Option<HostId>,
        tally: &Tally<'_>,
        budget: &Budget,
    ) -> Option<HostId> {
        let racks_used: BTreeSet<&str> = others.iter().filter_map(|h| self.rack_of(h)).collect();
        self.receivers()
            .filter(|n| !others.contains(&n.id) && Some(n.id) != leaving && budget.has_room(&n.id))
            .min_by_key(|n| {
                (
                    !(leaving.is_some() && n.replaces == leaving),
                    racks_used.contains(n.rack.as_str()),
                    tally.count(&n.id),
                    tally.bytes.of_node(&n.id),
                    n.id,
                )
            })
            .map(|n| n.id)
    }
}

/// What the nodes of one group hold while a table's moves are planned: the table's
/// replicas per node that may receive them, and bytes over every table; both count moves
/// under way, and moves planned so far, as done.
struct Tally<'b> {
    table: TableId,
    counts: BTreeMap<HostId, usize>,
    bytes: &'b mut Bytes,
}

impl Tally<'_> {
    fn count(&self, host: &HostId) -> usize {
        self.counts.get(host).copied().unwrap_or(0)
    }

    fn size(&self, tablet: TabletId) -> u64 {
        self.bytes.of_tablet(self.table, tablet)
    }

    /// Nodes by (replicas, bytes, id), fewest first.
    fn by_load(&self) -> Vec<(usize, u64, HostId)> {
        let mut by_load: Vec<(usize, u64, HostId)> = self
            .counts
            .iter()
            .map(|(host, count)| (*count, self.bytes.of_node(host), *host))
            .collect();
        by_load.sort_unstable();
        by_load
    }

    /// Counts a planned move as done.
    fn account(&mut self, planned: &Move) {
        if let Some(count) = planned.leaving.and_then(|h| self.counts.get_mut(&h)) {
            *count = count.saturating_sub(1);
        }
        if let Some(count) = planned.pending.and_then(|h| self.counts.get_mut(&h)) {
            *count += 1;
        }
        self.bytes.charge(self.table, planned);
    }
}

/// Moves to start now for one table (at most one per tablet, none for a tablet already
/// moving), charged to `budget` and counted in `bytes`.
pub fn plan_moves(
    table: TableId,
    map: &TabletMap,
    strategy: &ReplicationStrategy,
    nodes: &[BalancerNode],
    bytes: &mut Bytes,
    budget: &mut Budget,
) -> Vec<Move> {
    let mut planned = Planned {
        moves: Vec::new(),
        moving: map.transitions().map(|(t, _)| t.id).collect(),
    };
    let groups = groups(strategy, nodes);
    let alive = |host: &HostId| nodes.iter().any(|n| n.id == *host && n.alive);
    let merging: BTreeSet<TabletId> = map
        .merges()
        .flat_map(|(first, second)| [first.id, second.id])
        .collect();
    for group in &groups {
        let mut tally = group.tally(table, map, bytes);
        // 1 and 2: replicas that must go, and replica counts.
        for tablet in map.tablets() {
            if planned.moving.contains(&tablet.id) {
                continue;
            }
            if let Some(next) = replica_count_move(tablet, group, &tally, budget, &alive) {
                planned.add(next, &mut tally, budget, &alive);
            }
        }
        // 3: neighbours to merge come together.
        for next in colocate_merges(map, group, budget, &planned.moving) {
            planned.add(next, &mut tally, budget, &alive);
        }
        // 4 and 5: even counts, then even bytes; tablets to be merged stay where they
        // are, or they would be moved apart again. Each round moves one replica (or
        // trades two); a bound keeps a bug from looping forever.
        let worth_moving = tally.bytes.worth_moving(table, map);
        for _ in 0..map.tablets().len() * 4 + 8 {
            let busy = |id: TabletId| merging.contains(&id) || planned.moving.contains(&id);
            let next = match even_counts_move(map, group, &tally, budget, &busy) {
                Some(next) => vec![next],
                None => even_bytes_moves(map, group, &tally, budget, &busy, worth_moving),
            };
            if next.is_empty() {
                break;
            }
            for next in next {
                planned.add(next, &mut tally, budget, &alive);
            }
        }
    }
    planned.moves
}

/// The moves planned so far for one table, and the tablets they (or migrations under way)
/// move.
struct Planned {
    moves: Vec<Move>,
    moving: BTreeSet<TabletId>,
}

impl Planned {
    fn add(
        &mut self,
        next: Move,
        tally: &mut Tally<'_>,
        budget: &mut Budget,
        alive: &dyn Fn(&HostId) -> bool,
    ) {
        tally.account(&next);
        budget.charge(next.leaving.filter(|h| alive(h)), next.pending);
        self.moving.insert(next.tablet);
        self.moves.push(next);
    }
}

/// The move a tablet needs for its replicas in `group`, if any: one off a draining node,
/// one more when it has too few, one fewer when it has too many.
fn replica_count_move(
    tablet: &crate::tablet::Tablet,
    group: &Group<'_>,
    tally: &Tally<'_>,
    budget: &Budget,
    alive: &dyn Fn(&HostId) -> bool,
) -> Option<Move> {
    let held = group.members_of(&tablet.replicas);
    let (draining, staying): (Vec<HostId>, Vec<HostId>) =
        held.iter().partition(|host| group.draining(host));
    if let Some(leaving) = draining.first().copied() {
        let source_ok = !alive(&leaving) || budget.has_room(&leaving);
        let others: Vec<HostId> = tablet
            .replicas
            .iter()
            .filter(|h| **h != leaving)
            .copied()
            .collect();
        match group.destination(&others, Some(leaving), tally, budget) {
            Some(pending) if source_ok => Some(Move {
                tablet: tablet.id,
                leaving: Some(leaving),
                pending: Some(pending),
            }),
            // Nowhere to go: with more than enough replicas left it may simply be dropped.
            _ if staying.len() >= group.factor => Some(Move {
                tablet: tablet.id,
                leaving: Some(leaving),
                pending: None,
            }),
            _ => None,
        }
    } else if staying.len() < group.factor {
        group
            .destination(&tablet.replicas, None, tally, budget)
            .map(|pending| Move {
                tablet: tablet.id,
                leaving: None,
                pending: Some(pending),
            })
    } else if staying.len() > group.factor {
        staying
            .iter()
            .max_by_key(|h| (tally.count(h), tally.bytes.of_node(h), **h))
            .filter(|h| budget.has_room(h))
            .map(|leaving| Move {
                tablet: tablet.id,
                leaving: Some(*leaving),
                pending: None,
            })
    } else {
        None
    }
}

/// For each pair of neighbours to merge (neither moving) whose replicas in `group`
/// differ: one replica of the second moves from a node the first does not use to one it
/// does (a node that may receive replicas, with room in the budget).
fn colocate_merges(
    map: &TabletMap,
    group: &Group<'_>,
    budget: &Budget,
    moving: &BTreeSet<TabletId>,
) -> Vec<Move> {
    let mut budget = budget.clone();
    let mut moves = Vec::new();
    for (first, second) in map.merges() {
        if moving.contains(&first.id) || moving.contains(&second.id) {
            continue;
        }
        let (wanted, held) = (
            group.members_of(&first.replicas),
            group.members_of(&second.replicas),
        );
        let leaving = held
            .iter()
            .find(|host| !wanted.contains(host) && budget.has_room(host));
        let pending = wanted.iter().find(|host| {
            !held.contains(host)
                && budget.has_room(host)
                && group.receivers().any(|n| n.id == **host)
        });
        if let (Some(leaving), Some(pending)) = (leaving, pending) {
            budget.charge(Some(*leaving), Some(*pending));
            moves.push(Move {
                tablet: second.id,
                leaving: Some(*leaving),
                pending: Some(*pending),
            });
        }
    }
    moves
}

/// Whether `tablet` may move from `heavy` to `light` to even out load: it is not moving
/// or about to merge, `heavy` holds it and `light` does not, and the move puts no two of
/// its replicas on one rack where they were apart.
fn may_move(
    tablet: &crate::tablet::Tablet,
    group: &Group<'_>,
    (heavy, light): (HostId, HostId),
    busy: &dyn Fn(TabletId) -> bool,
) -> bool {
    if busy(tablet.id) || !tablet.replicas.contains(&heavy) || tablet.replicas.contains(&light) {
        return false;
    }
    let others: Vec<&str> = tablet
        .replicas
        .iter()
        .filter(|h| **h != heavy)
        .filter_map(|h| group.rack_of(h))
        .collect();
    let light_rack = group.rack_of(&light);
    let heavy_rack = group.rack_of(&heavy);
    let collisions_after = others.iter().filter(|r| Some(**r) == light_rack).count();
    let collisions_before = others.iter().filter(|r| Some(**r) == heavy_rack).count();
    collisions_after <= collisions_before
}

/// Step 4: a replica from the node holding most replicas to one holding at least two
/// fewer — the tablet that brings their bytes closest, the smallest of those (least to
/// stream), the newest of those.
fn even_counts_move(
    map: &TabletMap,
    group: &Group<'_>,
    tally: &Tally<'_>,
    budget: &Budget,
    busy: &dyn Fn(TabletId) -> bool,
) -> Option<Move> {
    let by_load = tally.by_load();
    for &(heavy_count, heavy_bytes, heavy) in by_load.iter().rev() {
        if !budget.has_room(&heavy) {
            continue;
        }
        for &(light_count, light_bytes, light) in &by_load {
            if heavy_count <= light_count + 1 {
                return None;
            }
            if !budget.has_room(&light) {
                continue;
            }
            let chosen = map
                .tablets()
                .iter()
                .filter(|tablet| may_move(tablet, group, (heavy, light), busy))
                .min_by_key(|tablet| {
                    let size = tally.size(tablet.id);
                    (
                        distance_after(heavy_bytes, light_bytes, size),
                        size,
                        std::cmp::Reverse(tablet.id),
                    )
                });
            if let Some(tablet) = chosen {
                return Some(Move {
                    tablet: tablet.id,
                    leaving: Some(heavy),
                    pending: Some(light),
                });
            }
        }
    }
    None
}

/// Step 5: with counts even, what brings two nodes' bytes closest, if it brings them
/// closer by at least `worth_moving`: a replica from a node to one holding fewer of the
/// table's replicas (the two trade the odd one), or, between nodes holding as many, a
/// trade of a tablet for the other node's smallest (two moves; counts stay as they are).
fn even_bytes_moves(
    map: &TabletMap,
    group: &Group<'_>,
    tally: &Tally<'_>,
    budget: &Budget,
    busy: &dyn Fn(TabletId) -> bool,
    worth_moving: u64,
) -> Vec<Move> {
    let by_load = tally.by_load();
    let mut best: Option<(u64, Vec<Move>)> = None;
    for &(heavy_count, heavy_bytes, heavy) in &by_load {
        for &(light_count, light_bytes, light) in &by_load {
            if heavy_count < light_count || heavy_bytes < light_bytes.saturating_add(worth_moving) {
                continue;
            }
            // A trade takes part in two moves on each node.
            let trade = heavy_count == light_count;
            let moves_each = if trade { 2 } else { 1 };
            if !budget.has_room_for(&heavy, moves_each) || !budget.has_room_for(&light, moves_each)
            {
                continue;
            }
            let back = if trade {
                let smallest = map
                    .tablets()
                    .iter()
                    .filter(|tablet| may_move(tablet, group, (light, heavy), busy))
                    .min_by_key(|tablet| (tally.size(tablet.id), std::cmp::Reverse(tablet.id)));
                match smallest {
                    Some(tablet) => Some(tablet),
                    None => continue,
                }
            } else {
                None
            };
            let back_size = back.map_or(0, |tablet| tally.size(tablet.id));
            for tablet in map.tablets() {
                if !may_move(tablet, group, (heavy, light), busy) {
                    continue;
                }
                let net = tally.size(tablet.id).saturating_sub(back_size);
                let gained = gain(heavy_bytes, light_bytes, net);
                if gained < worth_moving || best.as_ref().is_some_and(|(b, _)| gained <= *b) {
                    continue;
                }
                let mut moves = vec![Move {
                    tablet: tablet.id,
                    leaving: Some(heavy),
                    pending: Some(light),
                }];
                moves.extend(back.map(|back| Move {
                    tablet: back.id,
                    leaving: Some(light),
                    pending: Some(heavy),
                }));
                best = Some((gained, moves));
            }
        }
    }
    best.map(|(_, moves)| moves).unwrap_or_default()
}

/// Tablets whose primary should change (tablet, new primary) so that every node taking
/// replicas is first replica of an even share (±1) of the tablets. Tablets under a move
/// keep theirs.
pub fn plan_primaries(map: &TabletMap, nodes: &[BalancerNode]) -> Vec<(TabletId, HostId)> {
    let accepting: BTreeSet<HostId> = nodes
        .iter()
        .filter(|n| n.accepts && !n.draining)
        .map(|n| n.id)
        .collect();
    let mut primaries: BTreeMap<HostId, usize> = accepting.iter().map(|h| (*h, 0)).collect();
    let mut first: BTreeMap<TabletId, HostId> = BTreeMap::new();
    for tablet in map.tablets() {
        if let Some(primary) = tablet.replicas.first() {
            first.insert(tablet.id, *primary);
            if let Some(count) = primaries.get_mut(primary) {
                *count += 1;
            }
        }
    }
    let mut changes: BTreeMap<TabletId, HostId> = BTreeMap::new();
    // Each round hands one primary along a chain: from a node leading at least two more
    // tablets than some node it can reach, each step to another replica of a tablet the
    // previous node leads, so the nodes in between keep their counts. The sum of squares
    // of the counts falls every round, so this ends; with no such chain left, every node
    // that can be reached is within one of every node it can be reached from.
    let bound = map.tablets().len() * (accepting.len() + 1) + 1;
    for _ in 0..bound {
        // Only a node leading two more than the least-leading node can start a chain.
        let fewest = primaries.values().min().copied().unwrap_or(0);
        let mut sources: Vec<(usize, HostId)> = primaries
            .iter()
            .filter(|(_, c)| **c >= fewest + 2)
            .map(|(h, c)| (*c, *h))
            .collect();
        sources.sort_unstable_by(|a, b| b.cmp(a));
        // The tablets each node leads (and that are not moving), as of this round.
        let mut led_by: BTreeMap<HostId, Vec<&crate::tablet::Tablet>> = BTreeMap::new();
        for tablet in map.tablets().iter().filter(|t| t.transition.is_none()) {
            if let Some(primary) = first.get(&tablet.id) {
                led_by.entry(*primary).or_default().push(tablet);
            }
        }
        let chain = sources
            .iter()
            .find_map(|(count, source)| chain_to_fewer(&led_by, &primaries, *source, *count));
        let Some(chain) = chain else {
            break;
        };
        if let (Some((from, _)), Some((_, (_, to)))) = (chain.first(), chain.last()) {
            *primaries.entry(*from).or_default() -= 1;
            *primaries.entry(*to).or_default() += 1;
        }
        for (_, (tablet, host)) in chain {
            first.insert(tablet, host);
            changes.insert(tablet, host);
        }
    }
    changes.into_iter().collect()
}

/// A shortest chain of primary hand-overs from `source` (leading `count` tablets) to a
/// node leading at most `count - 2`: each step `(from, (tablet, to))` gives `tablet`, led
/// by `from`, to its replica `to`. `led_by`: the tablets each node leads, without those
/// under a move (they are left alone).
fn chain_to_fewer(
    led_by: &BTreeMap<HostId, Vec<&crate::tablet::Tablet>>,
    primaries: &BTreeMap<HostId, usize>,
    source: HostId,
    count: usize,
) -> Option<Vec<(HostId, (TabletId, HostId))>> {
    let mut reached: BTreeMap<HostId, Option<(HostId, TabletId)>> =
        BTreeMap::from([(source, None)]);
    let mut frontier = std::collections::VecDeque::from([source]);
    while let Some(node) = frontier.pop_front() {
        for tablet in led_by.get(&node).into_iter().flatten() {
            for replica in &tablet.replicas {
                let Some(led) = primaries.get(replica) else {
                    continue;
                };
                if reached.contains_key(replica) {
                    continue;
                }
                reached.insert(*replica, Some((node, tablet.id)));
                if led + 1 < count {
                    let mut chain = Vec::new();
                    let mut at = *replica;
                    while let Some(Some((from, via))) = reached.get(&at) {
                        chain.push((*from, (*via, at)));
                        at = *from;
                    }
                    chain.reverse();
                    return Some(chain);
                }
                frontier.push_back(*replica);
            }
        }
    }
    None
}

/// The replica set a move leaves behind (for callers checking a plan).
pub fn after_move(replicas: &[HostId], planned: &Move) -> Vec<HostId> {
    apply_move(replicas, planned.leaving, planned.pending)
}

#[cfg(test)]
mod tests;
