//! A deterministic cluster of [`MultiRaft`] nodes on a simulated clock and network.
//!
//! Each millisecond: due messages are delivered (each link keeps its order; a dropped
//! message is a connection reset), due durable writes complete (in order per node), every
//! node ticks, and a node with something to seal seals (at most two writes queued per
//! node, like a driver that pipelines its log writes). A crash throws away the node's
//! memory and its queued writes; a restart rebuilds it from what was durable.

use crate::{
    Config, Entry, Epoch, GroupId, HardState, Log, LogIndex, LogWrite, Message, Millis, MultiRaft,
    NodeId, Output, PersistBatch, Role, Term,
};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub enum Fault {
    /// Cut the node off from every other (both directions).
    Isolate(NodeId),
    /// Cut the link between two nodes (both directions); each still reaches the others.
    Cut(NodeId, NodeId),
    /// Reconnect everyone.
    Heal,
    Crash(NodeId),
    Restart(NodeId),
}

/// What a node has made durable.
#[derive(Default)]
pub(super) struct Durable {
    pub(super) hard_states: BTreeMap<GroupId, HardState>,
    pub(super) logs: BTreeMap<GroupId, BTreeMap<LogIndex, Entry>>,
    /// The snapshot each group's log starts after: index, term and members.
    pub(super) snapshots: BTreeMap<GroupId, (LogIndex, Term, Vec<NodeId>)>,
}

struct SimNode {
    id: NodeId,
    raft: Option<MultiRaft>,
    durable: Durable,
    writes: VecDeque<(u64, PersistBatch)>,
    incarnation: u64,
    /// The last index applied per group since this incarnation started.
    applied: BTreeMap<GroupId, LogIndex>,
}

struct Link {
    queue: VecDeque<(u64, Message)>,
}

/// A proposal a client is waiting for.
struct Waiting {
    group: GroupId,
    term: Term,
    index: LogIndex,
    payload: Bytes,
}

pub struct Simulation {
    rng: StdRng,
    now: u64,
    config: Config,
    nodes: Vec<SimNode>,
    groups: Vec<(GroupId, Vec<NodeId>)>,
    links: BTreeMap<(usize, usize), Link>,
    isolated: BTreeSet<NodeId>,
    cut: BTreeSet<(NodeId, NodeId)>,
    loss_per_mille: u32,
    /// The entry applied at each index of each group, by whichever node applied it first.
    applied: BTreeMap<GroupId, BTreeMap<LogIndex, Entry>>,
    leaders: BTreeMap<(GroupId, Term), NodeId>,
    next_payload: u64,
    persist_writes: usize,
    batches_sent: usize,
    check_leases: bool,
}

pub(super) fn node_id(index: usize) -> NodeId {
    shoal_model::HostId([index as u8 + 1; 16])
}

impl Simulation {
    /// `nodes` nodes and `groups` groups of three members each (placed round-robin).
    pub fn new(nodes: usize, groups: u64, seed: u64) -> Simulation {
        let config = Config {
            election_timeout_ms: 150,
            heartbeat_interval_ms: 30,
            max_epochs_in_flight: 16,
            max_entries_per_append: 64,
            lease_margin_ms: 10,
            resend_after_ms: 200,
        };
        let mut sim = Simulation {
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            config,
            nodes: (0..nodes)
                .map(|index| SimNode {
                    id: node_id(index),
                    raft: None,
                    durable: Durable::default(),
                    writes: VecDeque::new(),
                    incarnation: 0,
                    applied: BTreeMap::new(),
                })
                .collect(),
            groups: (0..groups)
                .map(|group| {
                    let members = (0..3.min(nodes))
                        .map(|offset| node_id((group as usize + offset) % nodes))
                        .collect();
                    (GroupId(group), members)
                })
                .collect(),
            links: BTreeMap::new(),
            isolated: BTreeSet::new(),
            cut: BTreeSet::new(),
            loss_per_mille: 0,
            applied: BTreeMap::new(),
            leaders: BTreeMap::new(),
            next_payload: 0,
            persist_writes: 0,
            batches_sent: 0,
            check_leases: false,
        };
        for index in 0..nodes {
            sim.start(index);
        }
        sim
    }

    pub fn node(&self, index: usize) -> NodeId {
        self.nodes[index].id
    }

    fn index_of(&self, id: NodeId) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .expect("a simulated node")
    }

    pub fn check_leases(&mut self, on: bool) {
        self.check_leases = on;
    }

    pub fn reset_counters(&mut self) {
        self.persist_writes = 0;
        self.batches_sent = 0;
    }

    pub fn persist_writes(&self) -> usize {
        self.persist_writes
    }

    pub fn batches_sent(&self) -> usize {
        self.batches_sent
    }

    /// Starts (or restarts) a node from its durable state.
    fn start(&mut self, index: usize) {
        let seed = self.rng.random();
        let now = Millis(self.now);
        let node = &mut self.nodes[index];
        node.incarnation += 1;
        // Epoch numbers never repeat across incarnations: an acknowledgement of an epoch
        // sent before a crash must not be taken for one sent after.
        let first_epoch = Epoch(node.incarnation << 32);
        let mut raft = MultiRaft::new(node.id, self.config.clone(), first_epoch, seed, now);
        for (group, members) in &self.groups {
            if !members.contains(&node.id) {
                continue;
            }
            let hard_state = node
                .durable
                .hard_states
                .get(group)
                .copied()
                .unwrap_or_default();
            let entries: Vec<Entry> = match node.durable.logs.get(group) {
                Some(log) => {
                    for (position, index) in log.keys().enumerate() {
                        assert_eq!(index.0, position as u64 + 1, "a durable log has a gap");
                    }
                    log.values().cloned().collect()
                }
                None => Vec::new(),
            };
            raft.add_group(
                *group,
                members.clone(),
                hard_state,
                Log::restore(LogIndex(1), Term(0), entries),
            );
        }
        node.raft = Some(raft);
        node.writes.clear();
        node.applied.clear();
    }

    pub fn fault(&mut self, fault: Fault) {
        match fault {
            Fault::Isolate(id) => {
                self.isolated.insert(id);
            }
            Fault::Cut(a, b) => {
                self.cut.insert((a, b));
                self.cut.insert((b, a));
            }
            Fault::Heal => {
                self.isolated.clear();
                self.cut.clear();
                self.loss_per_mille = 0;
            }
            Fault::Crash(id) => {
                let index = self.index_of(id);
                let node = &mut self.nodes[index];
                node.raft = None;
                node.writes.clear();
            }
            Fault::Restart(id) => {
                let index = self.index_of(id);
                if self.nodes[index].raft.is_none() {
                    self.start(index);
                }
            }
        }
    }

    pub fn restart_all_crashed(&mut self) {
        for index in 0..self.nodes.len() {
            if self.nodes[index].raft.is_none() {
                self.start(index);
            }
        }
    }

    pub fn run(&mut self, millis: u64) {
        for _ in 0..millis {
            self.step();
        }
    }

    pub fn settle(&mut self, millis: u64) {
        self.run(millis);
    }

    /// One simulated millisecond.
    fn step(&mut self) {
        self.now += 1;
        self.deliver();
        self.complete_writes();
        for index in 0..self.nodes.len() {
            let now = Millis(self.now);
            let Some(raft) = self.nodes[index].raft.as_mut() else {
                continue;
            };
            raft.tick(now);
            let outputs = raft.take_outputs();
            self.handle(index, outputs);
        }
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            let Some(raft) = node.raft.as_mut() else {
                continue;
            };
            if node.writes.len() < 2 && raft.wants_seal() {
                raft.seal();
                let outputs = raft.take_outputs();
                self.handle(index, outputs);
            }
        }
        self.check_step();
    }

    fn deliver(&mut self) {
        let now = self.now;
        let due: Vec<(usize, usize, Message)> = {
            let mut due = Vec::new();
            for ((from, to), link) in self.links.iter_mut() {
                while link.queue.front().is_some_and(|(at, _)| *at <= now) {
                    let Some((_, message)) = link.queue.pop_front() else {
                        break;
                    };
                    due.push((*from, *to, message));
                }
            }
            due
        };
        for (from, to, message) in due {
            let from_id = self.nodes[from].id;
            let to_id = self.nodes[to].id;
            if self.isolated.contains(&from_id)
                || self.isolated.contains(&to_id)
                || self.cut.contains(&(from_id, to_id))
            {
                continue;
            }
            let Some(raft) = self.nodes[to].raft.as_mut() else {
                continue;
            };
            raft.receive(from_id, message);
            let outputs = raft.take_outputs();
            self.handle(to, outputs);
        }
    }

    fn complete_writes(&mut self) {
        let now = self.now;
        for index in 0..self.nodes.len() {
            loop {
                let node = &mut self.nodes[index];
                if node.writes.front().is_none_or(|(at, _)| *at > now) {
                    break;
                }
                let Some((_, batch)) = node.writes.pop_front() else {
                    break;
                };
                apply_durably(&mut node.durable, &batch);
                let Some(raft) = node.raft.as_mut() else {
                    break;
                };
                raft.persisted(batch.epoch);
                let outputs = raft.take_outputs();
                self.handle(index, outputs);
            }
        }
    }

    fn handle(&mut self, index: usize, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Persist(batch) => {
                    if !batch.is_empty() {
                        self.persist_writes += 1;
                    }
                    let done_at = self.now + self.rng.random_range(1..=3);
                    let node = &mut self.nodes[index];
                    let done_at = node
                        .writes
                        .back()
                        .map_or(done_at, |(at, _)| done_at.max(*at));
                    node.writes.push_back((done_at, batch));
                }
                Output::Send { to, message } => {
                    if matches!(message, Message::Epoch(_)) {
                        self.batches_sent += 1;
                    }
                    if self.rng.random_range(0..1000) < self.loss_per_mille {
                        continue;
                    }
                    let to = self.index_of(to);
                    let at = self.now + self.rng.random_range(1..=4);
                    let link = self.links.entry((index, to)).or_insert(Link {
                        queue: VecDeque::new(),
                    });
                    let at = link.queue.back().map_or(at, |(last, _)| at.max(*last));
                    link.queue.push_back((at, message));
                }
                Output::Apply {
                    group,
                    index: entry_index,
                    entry,
                } => {
                    let node = &mut self.nodes[index];
                    let previous = node.applied.get(&group).copied().unwrap_or_default();
                    assert_eq!(
                        entry_index,
                        previous.next(),
                        "{:?} applied out of order in {group:?}",
                        node.id
                    );
                    node.applied.insert(group, entry_index);
                    let canonical = self.applied.entry(group).or_default();
                    match canonical.get(&entry_index) {
                        Some(existing) => assert_eq!(
                            existing, &entry,
                            "two different entries applied at {entry_index:?} of {group:?}"
                        ),
                        None => {
                            canonical.insert(entry_index, entry);
                        }
                    }
                }
                Output::LeaderChanged { .. } => {}
            }
        }
    }

    /// At most one leader per group and term, ever; with leases checked, at most one node
    /// serving linearizable reads of a group at any moment.
    fn check_step(&mut self) {
        for node in &self.nodes {
            let Some(raft) = &node.raft else {
                continue;
            };
            for group in raft.groups() {
                if matches!(group.role, Role::Leader(_)) {
                    let leader = self
                        .leaders
                        .entry((group.id, group.hard_state.term))
                        .or_insert(node.id);
                    assert_eq!(
                        *leader, node.id,
                        "two leaders of {:?} in {:?}",
                        group.id, group.hard_state.term
                    );
                }
            }
        }
        if self.check_leases {
            for (group, _) in &self.groups {
                let holders: Vec<NodeId> = self
                    .nodes
                    .iter()
                    .filter_map(|node| {
                        let raft = node.raft.as_ref()?;
                        raft.read_index(*group).ok().map(|_| node.id)
                    })
                    .collect();
                assert!(
                    holders.len() <= 1,
                    "{group:?}: leases held at once by {holders:?} at {}",
                    self.now
                );
            }
        }
    }

    /// The node that leads `group` in the latest term, if it is up and reachable.
    fn leader_of(&self, group: GroupId) -> Option<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| !self.isolated.contains(&node.id))
            .filter_map(|(index, node)| {
                let state = node.raft.as_ref()?.group(group)?;
                matches!(state.role, Role::Leader(_)).then_some((state.hard_state.term, index))
            })
            .max()
            .map(|(_, index)| index)
    }

    pub fn leader_of_most_groups(&self) -> NodeId {
        let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
        for (group, _) in &self.groups {
            if let Some(index) = self.leader_of(*group) {
                *counts.entry(index).or_default() += 1;
            }
        }
        let (index, _) = counts
            .into_iter()
            .max_by_key(|(_, count)| *count)
            .expect("some group has a leader");
        self.nodes[index].id
    }

    pub fn run_until_leaders(&mut self, timeout_ms: u64) {
        self.run_until_leaders_where(timeout_ms, |_| true);
    }

    pub fn run_until_leaders_without(&mut self, excluded: NodeId, timeout_ms: u64) {
        self.run_until_leaders_where(timeout_ms, move |leader| leader != excluded);
    }

    fn run_until_leaders_where(&mut self, timeout_ms: u64, allowed: impl Fn(NodeId) -> bool) {
        let deadline = self.now + timeout_ms;
        loop {
            let groups: Vec<GroupId> = self.groups.iter().map(|(group, _)| *group).collect();
            let all = groups.iter().all(|group| {
                self.leader_of(*group)
                    .is_some_and(|index| allowed(self.nodes[index].id))
            });
            if all {
                return;
            }
            assert!(
                self.now < deadline,
                "no leader for every group by {deadline}"
            );
            self.step();
        }
    }

    fn payload(&mut self) -> Bytes {
        self.next_payload += 1;
        Bytes::from(self.next_payload.to_be_bytes().to_vec())
    }

    /// Proposes `count` entries on groups `node` leads (nothing if it leads none).
    pub fn propose_on(&mut self, node: NodeId, count: usize) {
        let index = self.index_of(node);
        let groups: Vec<GroupId> = self.groups.iter().map(|(group, _)| *group).collect();
        for n in 0..count {
            let group = groups[n % groups.len()];
            let payload = self.payload();
            if let Some(raft) = self.nodes[index].raft.as_mut() {
                let _ = raft.propose(group, payload);
            }
        }
    }

    /// Proposes `count` entries (20 per millisecond, round-robin over the groups, each on
    /// its group's current leader) and runs until each is committed or lost, or until the
    /// timeout; returns how many committed.
    pub fn propose_and_wait(&mut self, count: usize, timeout_ms: u64) -> usize {
        let deadline = self.now + timeout_ms;
        let groups: Vec<GroupId> = self.groups.iter().map(|(group, _)| *group).collect();
        let mut waiting: Vec<Waiting> = Vec::new();
        let mut issued = 0;
        let mut committed = 0;
        let mut attempt = 0;
        while self.now < deadline && (issued < count || !waiting.is_empty()) {
            for _ in 0..20 {
                if issued >= count {
                    break;
                }
                let group = groups[attempt % groups.len()];
                attempt += 1;
                let Some(leader) = self.leader_of(group) else {
                    continue;
                };
                let payload = self.payload();
                let raft = self.nodes[leader].raft.as_mut().expect("a live leader");
                if let Ok(proposal) = raft.propose(group, payload.clone()) {
                    issued += 1;
                    waiting.push(Waiting {
                        group,
                        term: proposal.term,
                        index: proposal.index,
                        payload,
                    });
                }
            }
            self.step();
            waiting.retain(|wait| {
                let Some(entry) = self
                    .applied
                    .get(&wait.group)
                    .and_then(|applied| applied.get(&wait.index))
                else {
                    return true;
                };
                if entry.term == wait.term {
                    assert_eq!(entry.payload, wait.payload, "a proposal's entry changed");
                    committed += 1;
                } else {
                    // Lost to a newer leader: the client would retry.
                    issued -= 1;
                }
                false
            });
        }
        committed
    }

    /// Random proposals (one per `proposal_every_ms` on average), losses, partitions,
    /// crashes and restarts for `millis`.
    pub fn chaos(&mut self, millis: u64, proposal_every_ms: u32) {
        let ids: Vec<NodeId> = self.nodes.iter().map(|node| node.id).collect();
        for _ in 0..millis {
            let roll = self.rng.random_range(0..10_000);
            let node = ids[self.rng.random_range(0..ids.len())];
            match roll {
                0..=9 => self.fault(Fault::Crash(node)),
                10..=29 => self.fault(Fault::Restart(node)),
                30..=39 => self.fault(Fault::Isolate(node)),
                40..=49 => {
                    let other = ids[self.rng.random_range(0..ids.len())];
                    if other != node {
                        self.fault(Fault::Cut(node, other));
                    }
                }
                50..=59 => self.fault(Fault::Heal),
                60..=64 => self.loss_per_mille = self.rng.random_range(0..100),
                _ => {}
            }
            if self.rng.random_range(0..proposal_every_ms) == 0 {
                let groups: Vec<GroupId> = self.groups.iter().map(|(group, _)| *group).collect();
                let group = groups[self.rng.random_range(0..groups.len())];
                if let Some(leader) = self.leader_of(group) {
                    let payload = self.payload();
                    if let Some(raft) = self.nodes[leader].raft.as_mut() {
                        let _ = raft.propose(group, payload);
                    }
                }
            }
            self.step();
        }
    }

    /// On a settled, healthy cluster every member has dropped every applied entry from
    /// memory (each is durable on all members).
    pub fn check_applied_entries_forgotten(&self) {
        for node in &self.nodes {
            let Some(raft) = &node.raft else {
                continue;
            };
            for group in raft.groups() {
                assert!(
                    group.log.first_index() > group.applied,
                    "{:?} still holds {:?} from {:?} in memory, applied {:?}",
                    node.id,
                    group.id,
                    group.log.first_index(),
                    group.applied
                );
            }
        }
    }

    /// Every live member of every group has applied every entry any node applied.
    pub fn check_all_applied_everywhere(&self) {
        for (group, members) in &self.groups {
            let last = self
                .applied
                .get(group)
                .and_then(|applied| applied.keys().next_back().copied())
                .unwrap_or_default();
            assert!(last > LogIndex(0), "{group:?} applied nothing");
            for member in members {
                let node = &self.nodes[self.index_of(*member)];
                let Some(raft) = &node.raft else {
                    continue;
                };
                let state = raft.group(*group).expect("a member holds its group");
                assert!(
                    state.applied >= last,
                    "{member:?} applied {:?} of {group:?}, others {last:?} (commit {:?}, log {:?}..={:?}, {:?})",
                    state.applied,
                    state.commit,
                    state.log.first_index(),
                    state.log.last_index(),
                    state.role,
                );
            }
        }
    }
}

/// Writes a batch into a node's durable state, in order.
pub(super) fn apply_durably(durable: &mut Durable, batch: &PersistBatch) {
    for (group, hard_state) in &batch.hard_states {
        durable.hard_states.insert(*group, *hard_state);
    }
    for write in &batch.writes {
        match write {
            LogWrite::Truncate { group, from } => {
                if let Some(log) = durable.logs.get_mut(group) {
                    log.split_off(from);
                }
                if *from == LogIndex(0) {
                    durable.snapshots.remove(group);
                }
            }
            LogWrite::Snapshot {
                group,
                index,
                term,
                members,
                ..
            } => {
                let log = durable.logs.entry(*group).or_default();
                if log.get(index).is_some_and(|entry| entry.term == *term) {
                    *log = log.split_off(&index.next());
                } else {
                    log.clear();
                }
                durable
                    .snapshots
                    .insert(*group, (*index, *term, members.clone()));
            }
            LogWrite::Append {
                group,
                first,
                entries,
            } => {
                let log = durable.logs.entry(*group).or_default();
                for (offset, entry) in entries.iter().enumerate() {
                    log.insert(LogIndex(first.0 + offset as u64), entry.clone());
                }
            }
        }
    }
}
