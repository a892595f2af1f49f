use super::*;
use crate::tablet::{MigrationId, MigrationStage, Tablet, Transition};
use crate::{place, NodeDescriptor};
use shoal_model::Token;

/// The table the tests plan for.
const TABLE: TableId = TableId([7; 16]);

fn host(id: u8) -> HostId {
    HostId([id; 16])
}

fn node(id: u8, rack: &str) -> BalancerNode {
    BalancerNode {
        id: host(id),
        datacenter: "dc1".into(),
        rack: rack.into(),
        accepts: true,
        draining: false,
        alive: true,
        replaces: None,
    }
}

fn nodes(count: u8) -> Vec<BalancerNode> {
    (1..=count).map(|id| node(id, "r1")).collect()
}

fn initial(count: u8, tablets: usize, factor: usize) -> TabletMap {
    let descriptors: Vec<NodeDescriptor> = (1..=count)
        .map(|id| NodeDescriptor {
            id: host(id),
            datacenter: "dc1".into(),
            rack: "r1".into(),
        })
        .collect();
    place(
        tablets,
        &ReplicationStrategy::Simple { factor },
        &descriptors,
    )
    .unwrap()
}

/// Plans and completes moves (each at once) until the balancer has nothing left to do;
/// returns the map, the moves made, and the largest number of moves one round started
/// on one node.
fn settle(
    map: TabletMap,
    strategy: &ReplicationStrategy,
    nodes: &[BalancerNode],
    per_node: usize,
) -> (TabletMap, Vec<Move>, usize) {
    settle_sized(map, strategy, nodes, per_node, &BTreeMap::new())
}

/// As [`settle`], with tablets of these sizes (the rest weigh nothing).
fn settle_sized(
    mut map: TabletMap,
    strategy: &ReplicationStrategy,
    nodes: &[BalancerNode],
    per_node: usize,
    sizes: &BTreeMap<TabletId, u64>,
) -> (TabletMap, Vec<Move>, usize) {
    let sizes: BTreeMap<(TableId, TabletId), u64> = sizes
        .iter()
        .map(|(id, size)| ((TABLE, *id), *size))
        .collect();
    let mut made = Vec::new();
    let mut busiest = 0;
    for _ in 0..1000 {
        let mut budget = Budget::new(per_node);
        let mut bytes = Bytes::new(sizes.clone(), [(TABLE, &map)]);
        let moves = plan_moves(TABLE, &map, strategy, nodes, &mut bytes, &mut budget);
        if moves.is_empty() {
            return (map, made, busiest);
        }
        busiest = busiest.max(budget.busy.values().copied().max().unwrap_or(0));
        for planned in moves {
            let tablet = map.get_mut(planned.tablet).unwrap();
            tablet.replicas = after_move(&tablet.replicas, &planned);
            made.push(planned);
        }
    }
    panic!("the balancer never settled");
}

/// The moves for the test table with no tablet sizes known (counts alone decide).
fn plan_unsized(
    map: &TabletMap,
    strategy: &ReplicationStrategy,
    nodes: &[BalancerNode],
    budget: &mut Budget,
) -> Vec<Move> {
    plan_moves(TABLE, map, strategy, nodes, &mut Bytes::default(), budget)
}

/// The sum of `weight` over the tablets each of `nodes` holds a replica of.
fn per_node(map: &TabletMap, nodes: &[BalancerNode], weight: impl Fn(&Tablet) -> u64) -> Vec<u64> {
    nodes
        .iter()
        .map(|n| {
            map.tablets()
                .iter()
                .filter(|t| t.replicas.contains(&n.id))
                .map(&weight)
                .sum()
        })
        .collect()
}

fn replica_counts(map: &TabletMap, nodes: &[BalancerNode]) -> Vec<usize> {
    per_node(map, nodes, |_| 1)
        .into_iter()
        .map(|count| count as usize)
        .collect()
}

fn assert_even(counts: &[usize]) {
    let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(max - min <= 1, "uneven: {counts:?}");
}

fn assert_distinct_replicas(map: &TabletMap, factor: usize) {
    for tablet in map.tablets() {
        let mut replicas = tablet.replicas.clone();
        replicas.sort();
        replicas.dedup();
        assert_eq!(replicas.len(), factor, "{tablet:?}");
    }
}

#[test]
fn a_balanced_table_plans_nothing() {
    let map = initial(3, 24, 3);
    let mut budget = Budget::new(4);
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    assert!(plan_unsized(&map, &strategy, &nodes(3), &mut budget).is_empty());
    assert!(plan_primaries(&map, &nodes(3)).is_empty());
}

#[test]
fn a_joining_node_receives_just_enough_replicas_and_nothing_else_moves() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let before = initial(3, 24, 3);
    let (after, made, _) = settle(before, &strategy, &nodes(4), 8);
    assert_even(&replica_counts(&after, &nodes(4)));
    assert_distinct_replicas(&after, 3);
    // 72 replicas over 4 nodes is 18 each: the new node takes 18, and every move goes to it.
    assert_eq!(made.len(), 18);
    assert!(made.iter().all(|m| m.pending == Some(host(4))));
}

#[test]
fn two_nodes_joining_at_once_share_the_load() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let (after, made, _) = settle(initial(3, 24, 3), &strategy, &nodes(5), 8);
    let counts = replica_counts(&after, &nodes(5));
    assert_even(&counts);
    assert_distinct_replicas(&after, 3);
    // 72 / 5: the new nodes take 14 or 15 each, and nothing moves between old nodes.
    assert!(made
        .iter()
        .all(|m| m.pending == Some(host(4)) || m.pending == Some(host(5))));
    assert_eq!(made.len(), counts[3] + counts[4]);
}

#[test]
fn each_node_takes_part_in_at_most_its_budget_of_moves_at_once() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let map = initial(3, 24, 3);
    let mut budget = Budget::new(2);
    let moves = plan_unsized(&map, &strategy, &nodes(4), &mut budget);
    assert_eq!(moves.len(), 2, "the new node receives two at a time");
    let (_, _, busiest) = settle(initial(3, 24, 3), &strategy, &nodes(5), 2);
    assert!(busiest <= 2);
}

#[test]
fn moves_under_way_count_as_done_and_their_tablets_wait() {
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut map = initial(1, 4, 1);
    map.get_mut(TabletId(0)).unwrap().transition = Some(Transition {
        id: MigrationId(1),
        leaving: Some(host(1)),
        pending: Some(host(2)),
        stage: MigrationStage::WriteBoth,
    });
    let mut budget = Budget::new(8);
    let moves = plan_unsized(&map, &strategy, &nodes(2), &mut budget);
    // 4 tablets on 2 nodes: one more moves, never the one already moving.
    assert_eq!(moves.len(), 1);
    assert_ne!(moves[0].tablet, TabletId(0));
}

#[test]
fn a_leaving_node_gives_up_every_replica_and_the_rest_stay_even() {
    let strategy = ReplicationStrategy::Simple { factor: 2 };
    let mut view = nodes(4);
    view[3].draining = true;
    view[3].accepts = false;
    let (after, _, _) = settle(initial(4, 32, 2), &strategy, &view, 4);
    assert!(after
        .tablets()
        .iter()
        .all(|t| !t.replicas.contains(&host(4))));
    assert_even(&replica_counts(&after, &view[..3]));
    assert_distinct_replicas(&after, 2);
}

#[test]
fn a_dead_node_being_removed_is_rebuilt_elsewhere_and_never_onto_dead_nodes() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let mut view = nodes(5);
    // Node 5 is removed (dead); node 4 is down for now.
    view[4].draining = true;
    view[4].accepts = false;
    view[4].alive = false;
    view[3].alive = false;
    let (after, made, _) = settle(initial(5, 40, 3), &strategy, &view, 4);
    assert!(after
        .tablets()
        .iter()
        .all(|t| !t.replicas.contains(&host(5))));
    assert!(made.iter().all(|m| m.pending != Some(host(4))));
    assert_distinct_replicas(&after, 3);
}

#[test]
fn a_replacing_node_takes_over_the_dead_nodes_replicas() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let mut view = nodes(4);
    view[2].draining = true;
    view[2].accepts = false;
    view[2].alive = false;
    let mut replacement = node(9, "r1");
    replacement.replaces = Some(host(3));
    view.push(replacement);
    let before = initial(4, 32, 3);
    let dead_held: Vec<TabletId> = before
        .tablets()
        .iter()
        .filter(|t| t.replicas.contains(&host(3)))
        .map(|t| t.id)
        .collect();
    let (after, made, _) = settle(before, &strategy, &view, 64);
    for id in dead_held {
        assert!(after.get(id).unwrap().replicas.contains(&host(9)));
    }
    assert!(made.iter().all(|m| m.pending == Some(host(9))));
}

#[test]
fn the_factor_growing_adds_replicas_and_shrinking_drops_them() {
    let (grown, _, _) = settle(
        initial(3, 12, 1),
        &ReplicationStrategy::Simple { factor: 3 },
        &nodes(3),
        64,
    );
    assert_distinct_replicas(&grown, 3);
    let (shrunk, _, _) = settle(
        grown,
        &ReplicationStrategy::Simple { factor: 2 },
        &nodes(3),
        64,
    );
    assert_distinct_replicas(&shrunk, 2);
    assert_even(&replica_counts(&shrunk, &nodes(3)));
}

#[test]
fn network_topology_keeps_replicas_on_distinct_racks_and_in_their_datacenter() {
    let mut view = vec![node(1, "a"), node(2, "b"), node(3, "c"), node(4, "a")];
    let mut other = node(5, "x");
    other.datacenter = "dc2".into();
    view.push(other);
    let strategy = ReplicationStrategy::NetworkTopology {
        factors: BTreeMap::from([("dc1".to_string(), 3), ("dc2".to_string(), 1)]),
    };
    let descriptors: Vec<NodeDescriptor> = view
        .iter()
        .filter(|n| n.id != host(4))
        .map(|n| NodeDescriptor {
            id: n.id,
            datacenter: n.datacenter.clone(),
            rack: n.rack.clone(),
        })
        .collect();
    let before = place(16, &strategy, &descriptors).unwrap();
    // Node 4 joins on rack a: it may only relieve node 1, the other node on rack a.
    let (after, _, _) = settle(before, &strategy, &view, 8);
    let rack = |h: &HostId| view.iter().find(|n| n.id == *h).unwrap().rack.clone();
    for tablet in after.tablets() {
        let dc1: Vec<String> = tablet
            .replicas
            .iter()
            .filter(|h| **h != host(5))
            .map(rack)
            .collect();
        assert_eq!(dc1.len(), 3);
        let mut racks = dc1.clone();
        racks.sort();
        racks.dedup();
        assert_eq!(racks.len(), 3, "replicas of a tablet share a rack: {dc1:?}");
        assert!(tablet.replicas.contains(&host(5)));
    }
}

#[test]
fn primaries_even_out_without_moving_data() {
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let (mut map, _, _) = settle(initial(3, 24, 3), &strategy, &nodes(4), 8);
    for (tablet, primary) in plan_primaries(&map, &nodes(4)) {
        let tablet = map.get_mut(tablet).unwrap();
        let position = tablet.replicas.iter().position(|h| *h == primary).unwrap();
        tablet.replicas.swap(0, position);
    }
    let primaries: Vec<usize> = nodes(4)
        .iter()
        .map(|n| map.tokens_of(&n.id).len())
        .collect();
    assert_even(&primaries);
    assert_eq!(primaries.iter().sum::<usize>(), 24);
}

#[test]
fn a_node_sharing_no_tablet_with_the_busiest_still_gets_its_share_of_primaries() {
    // Six nodes, RF 3, 12 tablets (two primaries each when even). Node 1 leads none; the
    // busiest (node 6) leads four, but node 1 is no replica of any tablet node 6 leads:
    // only chains of swaps through other nodes even it out.
    let layout: [[u8; 3]; 12] = [
        [6, 2, 3],
        [6, 2, 3],
        [6, 4, 5],
        [6, 4, 5],
        [2, 1, 4],
        [2, 1, 5],
        [3, 1, 4],
        [3, 1, 5],
        [4, 1, 2],
        [4, 2, 3],
        [5, 3, 4],
        [5, 2, 6],
    ];
    let tablets = layout
        .iter()
        .enumerate()
        .map(|(index, replicas)| Tablet {
            id: TabletId(index as u64),
            last_token: Token(index as i64 * 1_000),
            replicas: replicas.iter().map(|id| host(*id)).collect(),
            transition: None,
        })
        .collect();
    let mut map = TabletMap::new(tablets);
    for (tablet, primary) in plan_primaries(&map, &nodes(6)) {
        let tablet = map.get_mut(tablet).unwrap();
        assert!(
            tablet.replicas.contains(&primary),
            "a primary is one of the replicas"
        );
        let position = tablet.replicas.iter().position(|h| *h == primary).unwrap();
        tablet.replicas.swap(0, position);
    }
    let primaries: Vec<usize> = nodes(6)
        .iter()
        .map(|n| map.tokens_of(&n.id).len())
        .collect();
    assert_even(&primaries);
    assert_eq!(primaries.iter().sum::<usize>(), 12);
}

#[test]
fn the_halves_of_a_split_tablet_move_before_older_tablets() {
    // Three nodes, factor 1: node 1's tablet holding the data splits three times.
    let mut map = initial(3, 6, 1);
    let growing = map
        .tablets()
        .iter()
        .find(|tablet| tablet.replicas == [host(1)])
        .unwrap()
        .clone();
    let mut halves = vec![growing.id];
    for step in 0..3 {
        let tablet = halves.pop().unwrap();
        let (after, last) = map.bounds_of(tablet).unwrap();
        let start = after.map_or(i64::MIN, |after| after.0);
        let at = Token(start + ((last.0 as i128 - start as i128) / 2) as i64);
        halves.extend(map.split(tablet, at).unwrap());
        assert_eq!(halves.len(), step + 2);
    }
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut budget = Budget::new(8);
    let moves = plan_unsized(&map, &strategy, &nodes(3), &mut budget);
    assert_eq!(moves.len(), 2, "node 1 holds 5 of 9 tablets: two go");
    assert!(
        moves.iter().all(|planned| halves.contains(&planned.tablet)),
        "the moved tablets are split halves, not node 1's older empty ones: {moves:?}"
    );
}

#[test]
fn the_second_of_a_pair_to_merge_moves_onto_the_first_ones_nodes_and_stays_there() {
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut map = initial(3, 6, 1);
    let (first, second) = (map.tablets()[1].clone(), map.tablets()[2].clone());
    assert_ne!(first.replicas, second.replicas, "placed round-robin");
    map.plan_merge(first.id).unwrap();
    let (settled, made, _) = settle(map, &strategy, &nodes(3), 4);
    // The first move brought them together; evening the load out moved other tablets.
    assert_eq!(
        made[0],
        Move {
            tablet: second.id,
            leaving: Some(second.replicas[0]),
            pending: Some(first.replicas[0]),
        }
    );
    assert!(made[1..]
        .iter()
        .all(|m| m.tablet != first.id && m.tablet != second.id));
    assert_even(&replica_counts(&settled, &nodes(3)));
    let mut merged = settled.clone();
    let id = merged.merge(first.id, second.id).unwrap();
    assert_eq!(merged.get(id).unwrap().replicas, first.replicas);
    // Once merged, load evens out again.
    let (after, _, _) = settle(merged, &strategy, &nodes(3), 4);
    assert_even(&replica_counts(&after, &nodes(3)));
    // With the factor's replicas on the same nodes already, there is nothing to move.
    let mut together = initial(3, 6, 3);
    let pair = together.tablets()[0].id;
    together.plan_merge(pair).unwrap();
    let mut budget = Budget::new(4);
    let three = ReplicationStrategy::Simple { factor: 3 };
    assert!(plan_unsized(&together, &three, &nodes(3), &mut budget).is_empty());
}

const MIB: u64 = 1 << 20;

/// Bytes per node of `map`, in `nodes` order.
fn node_bytes(
    map: &TabletMap,
    nodes: &[BalancerNode],
    sizes: &BTreeMap<TabletId, u64>,
) -> Vec<u64> {
    per_node(map, nodes, |t| sizes.get(&t.id).copied().unwrap_or(0))
}

/// Six tablets on three nodes, two each (factor 1): node 1's hold 1,000 MiB each, the
/// others' 10 MiB.
fn uneven_tablets() -> (TabletMap, BTreeMap<TabletId, u64>) {
    let map = initial(3, 6, 1);
    let sizes = map
        .tablets()
        .iter()
        .map(|t| {
            let size = if t.replicas == [host(1)] { 1000 } else { 10 };
            (t.id, size * MIB)
        })
        .collect();
    (map, sizes)
}

#[test]
fn a_joining_node_takes_the_tablets_that_even_out_bytes() {
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let (map, sizes) = uneven_tablets();
    let (after, made, _) = settle_sized(map, &strategy, &nodes(4), 8, &sizes);
    assert_even(&replica_counts(&after, &nodes(4)));
    // Counts alone ask one move; taking one of node 1's large tablets (not the newest of
    // the small ones) leaves 1,000 MiB on each of nodes 1 and 4.
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].leaving, Some(host(1)));
    assert_eq!(made[0].pending, Some(host(4)));
    assert_eq!(
        node_bytes(&after, &nodes(4), &sizes),
        vec![1000 * MIB, 20 * MIB, 20 * MIB, 1000 * MIB]
    );
}

#[test]
fn a_leaving_nodes_replica_goes_to_the_node_holding_fewest_bytes() {
    // One tablet on each of four nodes (factor 1), node 4 leaving: nodes 1-3 hold one
    // replica each, so bytes choose — node 2, holding least (by count and id alone, node
    // 1 would take it).
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let map = initial(4, 4, 1);
    let held = |n: u8| {
        map.tablets()
            .iter()
            .find(|t| t.replicas == [host(n)])
            .unwrap()
            .id
    };
    let sizes = BTreeMap::from([
        (held(1), 1000 * MIB),
        (held(2), 10 * MIB),
        (held(3), 500 * MIB),
        (held(4), 100 * MIB),
    ]);
    let mut cluster = nodes(4);
    cluster[3].draining = true;
    let (_, made, _) = settle_sized(map.clone(), &strategy, &cluster, 8, &sizes);
    assert_eq!(
        made,
        vec![Move {
            tablet: held(4),
            leaving: Some(host(4)),
            pending: Some(host(2)),
        }]
    );
}

#[test]
fn with_counts_even_a_large_difference_in_bytes_trades_the_odd_replica() {
    // Five tablets, factor 1, over two nodes: node 1 holds two of 10 MiB, node 2 three of
    // 1,000 MiB. Counts are even (within one), but node 2 holds far more bytes: it gives
    // node 1 a large tablet, and the two trade the odd replica.
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut map = initial(2, 5, 1);
    let mut sizes = BTreeMap::new();
    for tablet in map.tablets().to_vec() {
        let on_first = sizes.len() < 2;
        let replicas = if on_first { host(1) } else { host(2) };
        map.get_mut(tablet.id).unwrap().replicas = vec![replicas];
        sizes.insert(tablet.id, if on_first { 10 * MIB } else { 1000 * MIB });
    }
    assert_eq!(replica_counts(&map, &nodes(2)), vec![2, 3]);
    let (settled, made, _) = settle_sized(map, &strategy, &nodes(2), 8, &sizes);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(replica_counts(&settled, &nodes(2)), vec![3, 2]);
    assert_eq!(
        node_bytes(&settled, &nodes(2), &sizes),
        vec![1020 * MIB, 2000 * MIB]
    );
}

#[test]
fn tablets_of_even_size_never_trade_places() {
    // Every tablet the same size: the odd replica's node holds one tablet more, and
    // moving it would only move the difference to the other node.
    let strategy = ReplicationStrategy::Simple { factor: 3 };
    let map = initial(4, 7, 3);
    let sizes = map.tablets().iter().map(|t| (t.id, 500 * MIB)).collect();
    let (_, made, _) = settle_sized(map, &strategy, &nodes(4), 8, &sizes);
    assert!(made.is_empty(), "{made:?}");
}

#[test]
fn small_differences_in_bytes_move_nothing() {
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut map = initial(2, 3, 1);
    for tablet in map.tablets().to_vec() {
        map.get_mut(tablet.id).unwrap().replicas = vec![host(1)];
    }
    // Node 1 holds all three; counts move one (or two) to node 2, and the few MiB apart
    // they are afterwards are below what a move is worth.
    let sizes = map
        .tablets()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id, (i as u64 + 1) * MIB))
        .collect();
    let (settled, made, _) = settle_sized(map, &strategy, &nodes(2), 8, &sizes);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_even(&replica_counts(&settled, &nodes(2)));
}

#[test]
fn nodes_holding_as_many_tablets_trade_a_large_one_for_a_small_one() {
    // Two tablets on each of three nodes (factor 1); node 1's hold 1,000 MiB each, the
    // others' 10 MiB. Counts are even: node 1 gives one large tablet to node 2 and takes
    // back one of node 2's small ones, after which no trade brings any two nodes closer.
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let (map, sizes) = uneven_tablets();
    let (settled, made, _) = settle_sized(map, &strategy, &nodes(3), 8, &sizes);
    assert_eq!(made.len(), 2, "{made:?}");
    assert_eq!(made[0].leaving, Some(host(1)));
    assert_eq!(made[0].pending, Some(host(2)));
    assert_eq!(sizes[&made[0].tablet], 1000 * MIB);
    assert_eq!(made[1].leaving, Some(host(2)));
    assert_eq!(made[1].pending, Some(host(1)));
    assert_eq!(sizes[&made[1].tablet], 10 * MIB);
    assert_eq!(replica_counts(&settled, &nodes(3)), vec![2, 2, 2]);
    assert_eq!(
        node_bytes(&settled, &nodes(3), &sizes),
        vec![1010 * MIB, 1010 * MIB, 20 * MIB]
    );
}

#[test]
fn a_trade_waits_for_room_for_both_its_moves() {
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let (map, sizes) = uneven_tablets();
    let sizes: BTreeMap<(TableId, TabletId), u64> = sizes
        .iter()
        .map(|(id, size)| ((TABLE, *id), *size))
        .collect();
    let mut bytes = Bytes::new(sizes, [(TABLE, &map)]);
    let mut budget = Budget::new(1);
    assert!(plan_moves(TABLE, &map, &strategy, &nodes(3), &mut bytes, &mut budget).is_empty());
    let mut budget = Budget::new(2);
    assert_eq!(
        plan_moves(TABLE, &map, &strategy, &nodes(3), &mut bytes, &mut budget).len(),
        2
    );
}

#[test]
fn between_moves_that_even_bytes_as_well_the_smaller_tablet_moves() {
    // Node 1 holds three tablets, one of 100 MiB (the newest), node 2 one empty tablet.
    // Moving the large one or an empty one leaves the two 100 MiB apart either way: the
    // empty one goes, as there is less to stream.
    let strategy = ReplicationStrategy::Simple { factor: 1 };
    let mut map = initial(2, 4, 1);
    let ids: Vec<TabletId> = map.tablets().iter().map(|t| t.id).collect();
    for (index, id) in ids.iter().enumerate() {
        let on = if index == 0 { host(2) } else { host(1) };
        map.get_mut(*id).unwrap().replicas = vec![on];
    }
    let newest = *ids.iter().max().unwrap();
    let sizes = BTreeMap::from([(newest, 100 * MIB)]);
    let (_, made, _) = settle_sized(map, &strategy, &nodes(2), 8, &sizes);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_ne!(made[0].tablet, newest);
}
