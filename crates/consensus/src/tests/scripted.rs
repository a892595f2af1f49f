//! Hand-driven scenarios for the rules random schedules rarely reach: each message is
//! delivered, dropped or held by the test, each durable write completes when the test
//! says, so the exact interleaving that would break a rule is played out step by step.

use super::sim::{apply_durably, node_id, Durable};
use crate::{
    Config, Entry, Epoch, GroupId, Log, LogIndex, Message, Millis, MultiRaft, NodeId, Output,
    PersistBatch, Role, Term,
};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

const GROUP: GroupId = GroupId(7);
const ELECTION_TIMEOUT_MS: u64 = 100;

struct Node {
    raft: Option<MultiRaft>,
    durable: Durable,
    writes: VecDeque<PersistBatch>,
    incarnation: u64,
    now: u64,
}

/// Three nodes in one group, every message waiting in an outbox until the test moves it.
struct Scripted {
    config: Config,
    nodes: BTreeMap<NodeId, Node>,
    outbox: Vec<(NodeId, NodeId, Message)>,
    /// What each node applied at each index.
    applied: BTreeMap<NodeId, BTreeMap<LogIndex, Entry>>,
}

impl Scripted {
    fn new(max_entries_per_append: usize) -> Scripted {
        let config = Config {
            election_timeout_ms: ELECTION_TIMEOUT_MS,
            heartbeat_interval_ms: 10_000,
            max_epochs_in_flight: 16,
            max_entries_per_append,
            lease_margin_ms: 10,
            resend_after_ms: 100_000,
        };
        let mut scripted = Scripted {
            config,
            nodes: BTreeMap::new(),
            outbox: Vec::new(),
            applied: BTreeMap::new(),
        };
        for index in 0..3 {
            scripted.nodes.insert(
                node_id(index),
                Node {
                    raft: None,
                    durable: Durable::default(),
                    writes: VecDeque::new(),
                    incarnation: 0,
                    now: 0,
                },
            );
            scripted.start(node_id(index));
        }
        scripted
    }

    fn members() -> Vec<NodeId> {
        (0..3).map(node_id).collect()
    }

    fn start(&mut self, id: NodeId) {
        let config = self.config.clone();
        let node = self.nodes.get_mut(&id).expect("a node");
        node.incarnation += 1;
        let mut raft = MultiRaft::new(
            id,
            config,
            Epoch(node.incarnation << 32),
            node.incarnation,
            Millis(node.now),
        );
        let hard_state = node
            .durable
            .hard_states
            .get(&GROUP)
            .copied()
            .unwrap_or_default();
        let entries = node
            .durable
            .logs
            .get(&GROUP)
            .map(|log| log.values().cloned().collect())
            .unwrap_or_default();
        raft.add_group(
            GROUP,
            Self::members(),
            hard_state,
            Log::restore(LogIndex(1), Term(0), entries),
        );
        node.raft = Some(raft);
        node.writes.clear();
        self.applied.remove(&id);
    }

    fn crash(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).expect("a node");
        node.raft = None;
        node.writes.clear();
        self.outbox.retain(|(from, to, _)| *from != id && *to != id);
    }

    fn raft(&mut self, id: NodeId) -> &mut MultiRaft {
        self.nodes
            .get_mut(&id)
            .and_then(|node| node.raft.as_mut())
            .expect("a running node")
    }

    fn collect(&mut self, id: NodeId) {
        let outputs = self.raft(id).take_outputs();
        for output in outputs {
            match output {
                Output::Persist(batch) => {
                    self.nodes
                        .get_mut(&id)
                        .expect("a node")
                        .writes
                        .push_back(batch);
                }
                Output::Send { to, message } => self.outbox.push((id, to, message)),
                Output::Apply { index, entry, .. } => {
                    self.applied.entry(id).or_default().insert(index, entry);
                }
                Output::LeaderChanged { .. } => {}
            }
        }
    }

    /// Moves `id`'s clock forward to `at`.
    fn tick(&mut self, id: NodeId, at: u64) {
        let node = self.nodes.get_mut(&id).expect("a node");
        node.now = node.now.max(at);
        let now = Millis(node.now);
        self.raft(id).tick(now);
        self.collect(id);
    }

    fn seal(&mut self, id: NodeId) {
        self.raft(id).seal();
        self.collect(id);
    }

    /// Completes every write `id` has queued.
    fn persist(&mut self, id: NodeId) {
        loop {
            let node = self.nodes.get_mut(&id).expect("a node");
            let Some(batch) = node.writes.pop_front() else {
                return;
            };
            apply_durably(&mut node.durable, &batch);
            self.raft(id).persisted(batch.epoch);
            self.collect(id);
        }
    }

    /// Seals and completes the write.
    fn seal_and_persist(&mut self, id: NodeId) {
        self.seal(id);
        self.persist(id);
    }

    /// Delivers every message waiting from `from` to `to`.
    fn deliver(&mut self, from: NodeId, to: NodeId) {
        let (now, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.outbox)
            .into_iter()
            .partition(|(sender, receiver, _)| *sender == from && *receiver == to);
        self.outbox = rest;
        for (_, _, message) in now {
            self.raft(to).receive(from, message);
            self.collect(to);
        }
    }

    /// Throws away every message waiting from `from` to `to`.
    fn drop_messages(&mut self, from: NodeId, to: NodeId) {
        self.outbox
            .retain(|(sender, receiver, _)| !(*sender == from && *receiver == to));
    }

    /// `candidate` wins an election with `voter`'s vote (the third member hears nothing).
    /// A candidate behind the voter's term learns it from the refusal and asks again.
    fn elect(&mut self, candidate: NodeId, voter: NodeId) {
        for _ in 0..3 {
            // Both are past the stickiness of their start or of the last leader they heard.
            let at = self.nodes[&candidate].now.max(self.nodes[&voter].now) + ELECTION_TIMEOUT_MS;
            self.tick(voter, at);
            self.nodes.get_mut(&candidate).expect("a node").now = at;
            self.raft(candidate).tick(Millis(at));
            self.raft(candidate).campaign(GROUP);
            self.collect(candidate);
            self.deliver(candidate, voter); // pre-vote
            self.deliver(voter, candidate); // granted: the real election starts
            self.seal_and_persist(candidate); // term and self-vote durable, requests leave
            self.deliver(candidate, voter);
            self.seal_and_persist(voter); // the vote is durable before it is told
            self.deliver(voter, candidate);
            if self.is_leader(candidate) {
                let third = Self::members()
                    .into_iter()
                    .find(|member| *member != candidate && *member != voter)
                    .expect("three members");
                self.drop_messages(candidate, third);
                self.drop_messages(voter, third);
                return;
            }
        }
        panic!("{candidate:?} was not elected with {voter:?}'s vote");
    }

    fn is_leader(&self, id: NodeId) -> bool {
        self.nodes[&id]
            .raft
            .as_ref()
            .and_then(|raft| raft.group(GROUP))
            .is_some_and(|group| matches!(group.role, Role::Leader(_)))
    }

    /// `leader` seals; `follower` gets the batch, makes it durable and acknowledges.
    fn replicate(&mut self, leader: NodeId, follower: NodeId) {
        self.seal(leader);
        self.deliver(leader, follower);
        self.seal_and_persist(follower);
        self.deliver(follower, leader);
    }

    /// `leader` is elected with `voter`'s vote, commits its no-op with it, and takes a
    /// proposal `x` at index 2 (not sealed yet).
    fn lead_and_propose_x(&mut self, leader: NodeId, voter: NodeId) {
        self.elect(leader, voter);
        self.replicate(leader, voter);
        self.persist(leader);
        assert!(self.applied_at(leader, 1).is_some(), "the no-op commits");
        self.raft(leader)
            .propose(GROUP, Bytes::from_static(b"x"))
            .expect("the leader takes a proposal");
    }

    fn applied_at(&self, id: NodeId, index: u64) -> Option<&Entry> {
        self.applied.get(&id)?.get(&LogIndex(index))
    }
}

#[test]
fn a_leader_counts_its_own_copy_only_once_it_is_durable() {
    let (a, b, c) = (node_id(0), node_id(1), node_id(2));
    let mut s = Scripted::new(64);
    s.lead_and_propose_x(a, b);
    s.seal(a); // a's own write of x is still in flight
    s.drop_messages(a, c);
    s.deliver(a, b);
    s.seal_and_persist(b);
    s.deliver(b, a);
    // b holds x durably, a does not yet: one durable copy of three is no majority. Were it
    // counted, a crash of a now would leave x on b alone, and a and c could elect c and
    // overwrite an entry already applied.
    assert!(
        s.applied_at(a, 2).is_none(),
        "x was applied before a majority held it durably"
    );
    s.persist(a);
    assert_eq!(
        s.applied_at(a, 2).map(|entry| entry.payload.clone()),
        Some(Bytes::from_static(b"x"))
    );
}

#[test]
fn an_earlier_terms_entry_is_not_committed_by_counting_replicas() {
    // Raft's figure 8 with three members: an entry of an earlier term held by a majority
    // can still be overwritten, so it only commits under an entry of the leader's term.
    let (a, b, c) = (node_id(0), node_id(1), node_id(2));
    let mut s = Scripted::new(1);
    s.elect(a, b);
    s.replicate(a, b);
    s.replicate(a, c);
    s.persist(a);
    assert!(s.applied_at(a, 1).is_some());

    // a takes x at index 2 (in its term, call it t), makes it durable, and crashes before
    // sending it.
    s.raft(a)
        .propose(GROUP, Bytes::from_static(b"x"))
        .expect("the leader takes a proposal");
    s.seal_and_persist(a);
    s.crash(a);

    // b is elected in a later term with c's vote; its no-op at index 2 stays on b alone.
    s.elect(b, c);
    s.seal_and_persist(b);
    s.crash(b);

    // a comes back and is elected in a third term with c's vote (both logs end in term t,
    // a's is longer). It sends c its term-t entry x at index 2, one entry per append,
    // before its new no-op.
    s.start(a);
    s.elect(a, c);
    s.replicate(a, c); // c lacks index 2: refused, a goes back
    s.replicate(a, c); // x reaches c: index 2 is now on a majority (a and c)
    s.persist(a);
    assert!(
        s.applied_at(a, 2).is_none(),
        "an entry of an earlier term was committed by counting replicas"
    );

    // a crashes before its no-op reaches c; b comes back and wins with c's vote (b's log
    // ends in a later term than c's) and overwrites index 2 with its own no-op.
    s.crash(a);
    s.start(b);
    s.elect(b, c);
    for _ in 0..6 {
        // One entry per append, after going back to where c's log agrees.
        s.replicate(b, c);
        s.persist(b);
    }
    let at_two = s.applied_at(b, 2).expect("b commits index 2");
    assert!(
        at_two.term > Term(1) && at_two.payload.is_empty(),
        "b's own no-op is at index 2, not x: {at_two:?}"
    );
    assert_eq!(s.applied_at(a, 2), None, "a never applied its x");
}

#[test]
fn a_node_outside_the_group_can_neither_lead_it_nor_be_elected() {
    // A node moved off a group may not know yet and keep acting as its member: its
    // appends and its campaigns, whatever term they claim, change nothing here.
    let config = Config::default();
    let members: Vec<NodeId> = (0..3).map(node_id).collect();
    let outsider = node_id(9);
    let mut raft = MultiRaft::new(members[0], config, Epoch(1 << 32), 1, Millis(0));
    raft.add_group(
        GROUP,
        members.clone(),
        crate::HardState::default(),
        Log::restore(LogIndex(1), Term(0), Vec::new()),
    );
    let term_before = raft.group(GROUP).expect("the group").hard_state.term;
    raft.receive(
        outsider,
        Message::Epoch(crate::message::EpochBatch {
            epoch: Epoch(5),
            appends: vec![crate::message::Append {
                group: GROUP,
                term: Term(50),
                previous_index: LogIndex(0),
                previous_term: Term(0),
                entries: vec![Entry::new(Term(50), Bytes::from("from outside"))],
                commit: LogIndex(1),
                compact_through: LogIndex(0),
            }],
        }),
    );
    // Long after any lease, the outsider asks for a vote in a later term.
    raft.advance_clock(Millis(60_000));
    raft.receive(
        outsider,
        Message::Vote(crate::message::VoteRequest {
            group: GROUP,
            term: Term(60),
            last_index: LogIndex(10),
            last_term: Term(59),
            pre_vote: false,
        }),
    );
    let group = raft.group(GROUP).expect("the group");
    assert_eq!(group.hard_state.term, term_before);
    assert_eq!(group.hard_state.voted_for, None);
    assert_eq!(group.log.last_index(), LogIndex(0));
    assert_eq!(group.leader(), None);
    // The append is refused as for a group this node does not hold (no vote is granted).
    raft.seal();
    let outputs = raft.take_outputs();
    assert!(!outputs.iter().any(|output| matches!(
        output,
        Output::Apply { .. }
            | Output::Send {
                message: Message::VoteReply(_),
                ..
            }
    )));
}

#[test]
fn a_member_added_by_a_membership_change_catches_up_from_a_snapshot_and_the_leader_can_remove_itself(
) {
    let mut scripted = Scripted::new(64);
    let [a, b, c] = [node_id(0), node_id(1), node_id(2)];
    let newcomer = node_id(3);
    scripted.elect(a, b);
    for payload in ["one", "two", "three"] {
        scripted
            .raft(a)
            .propose(GROUP, Bytes::from(payload))
            .expect("the leader takes it");
    }
    scripted.replicate(a, b);
    scripted.replicate(a, c);
    scripted.persist(a);
    // A second round tells every member that all of them hold the entries: they are
    // dropped from memory, so a new member can only start from a snapshot.
    scripted.replicate(a, b);
    scripted.replicate(a, c);
    assert!(
        scripted
            .raft(a)
            .group(GROUP)
            .expect("the group")
            .log
            .first_index()
            > LogIndex(1)
    );

    // The newcomer holds the group, with the members it will have.
    let mut all = Scripted::members();
    all.push(newcomer);
    scripted.nodes.insert(
        newcomer,
        Node {
            raft: None,
            durable: Durable::default(),
            writes: VecDeque::new(),
            incarnation: 1,
            now: scripted.nodes[&a].now,
        },
    );
    let mut raft = MultiRaft::new(
        newcomer,
        scripted.config.clone(),
        Epoch(1 << 32),
        9,
        Millis(0),
    );
    raft.add_group(
        GROUP,
        all.clone(),
        crate::HardState::default(),
        Log::default(),
    );
    scripted.nodes.get_mut(&newcomer).expect("a node").raft = Some(raft);

    // Two members at once, or a change while another is uncommitted: refused.
    let mut two_more = all.clone();
    two_more.push(node_id(4));
    assert_eq!(
        scripted.raft(a).change_members(GROUP, two_more),
        Err(crate::MembershipRefused::NotOneMember)
    );
    scripted
        .raft(a)
        .change_members(GROUP, all.clone())
        .expect("one member added");
    assert_eq!(
        scripted.raft(a).change_members(GROUP, Scripted::members()),
        Err(crate::MembershipRefused::ChangeUnderWay)
    );
    scripted.collect(a);
    // Three of four commit the change without the newcomer.
    scripted.replicate(a, b);
    scripted.persist(a);
    let change = scripted
        .raft(a)
        .group(GROUP)
        .expect("the group")
        .log
        .last_index();
    assert!(scripted.raft(a).group(GROUP).expect("the group").commit < change);
    scripted.replicate(a, c);
    assert_eq!(
        scripted.raft(a).group(GROUP).expect("the group").commit,
        change
    );

    // The newcomer lacks entries the leader dropped: it refuses, and from then on gets
    // heartbeats only.
    scripted.replicate(a, newcomer);
    let awaiting =
        |scripted: &mut Scripted| match &scripted.raft(a).group(GROUP).expect("the group").role {
            Role::Leader(leadership) => leadership.progress[&newcomer].awaiting_snapshot,
            _ => panic!("a leads"),
        };
    assert!(awaiting(&mut scripted));
    scripted.seal(a);
    let to_newcomer: Vec<&Message> = scripted
        .outbox
        .iter()
        .filter(|(from, to, _)| *from == a && *to == newcomer)
        .map(|(_, _, message)| message)
        .collect();
    assert!(to_newcomer.iter().all(|message| match message {
        Message::Epoch(batch) => batch.appends.iter().all(|append| append.entries.is_empty()),
        _ => true,
    }));
    scripted.drop_messages(a, newcomer);

    // The newcomer installs the leader's state as of an index before the change.
    let (index, term, members) = {
        let group = scripted.raft(a).group(GROUP).expect("the group");
        let index = group.log.first_index().previous();
        (
            index,
            group.log.term_at(index).expect("a term"),
            group.members_at(index),
        )
    };
    assert!(scripted
        .raft(newcomer)
        .install_snapshot(GROUP, index, term, members, Bytes::new()));
    scripted.seal_and_persist(newcomer);
    assert!(scripted.nodes[&newcomer]
        .durable
        .snapshots
        .contains_key(&GROUP));
    // Meanwhile the others commit one more write; the heartbeat that carries the new
    // commit index the newcomer now accepts, then gets the entries after its snapshot,
    // the change included.
    let between = scripted
        .raft(a)
        .propose(GROUP, Bytes::from("between"))
        .expect("the leader takes it");
    scripted.replicate(a, b);
    scripted.replicate(a, c);
    scripted.persist(a);
    scripted.replicate(a, newcomer);
    assert!(!awaiting(&mut scripted));
    scripted.replicate(a, newcomer);
    scripted.replicate(a, newcomer);
    let joined = scripted.raft(newcomer).group(GROUP).expect("the group");
    assert_eq!(joined.members, all);
    assert_eq!(joined.applied, between.index);
    assert_eq!(
        scripted.applied_at(newcomer, change.0).map(|e| e.kind),
        Some(crate::EntryKind::Members)
    );

    // With four members, a write commits on the leader, b and the newcomer, without c.
    let write = scripted
        .raft(a)
        .propose(GROUP, Bytes::from("four"))
        .expect("the leader takes it");
    scripted.replicate(a, b);
    scripted.persist(a);
    assert!(scripted.raft(a).group(GROUP).expect("the group").commit < write.index);
    scripted.replicate(a, newcomer);
    assert_eq!(
        scripted.raft(a).group(GROUP).expect("the group").commit,
        write.index
    );

    // The leader removes itself: the others commit the change and the leader steps down,
    // never to campaign in the group again.
    let without_leader = vec![b, c, newcomer];
    scripted
        .raft(a)
        .change_members(GROUP, without_leader.clone())
        .expect("one member removed");
    scripted.collect(a);
    scripted.persist(a);
    scripted.replicate(a, b);
    assert!(scripted.is_leader(a), "one of three is not a majority");
    scripted.replicate(a, newcomer);
    assert!(!scripted.is_leader(a));
    assert_eq!(
        scripted.raft(b).group(GROUP).expect("the group").members,
        without_leader
    );
    let later = scripted.nodes[&a].now + 100 * ELECTION_TIMEOUT_MS;
    scripted.tick(a, later);
    assert!(!scripted
        .outbox
        .iter()
        .any(|(from, _, message)| *from == a && matches!(message, Message::Vote(_))));
    assert!(scripted
        .raft(a)
        .propose(GROUP, Bytes::from("five"))
        .is_err());
}

#[test]
fn a_settled_read_waits_for_entries_in_flight_and_binds_the_proposal_to_its_term() {
    // A conditional write reads, then proposes what it decided. Its read must see every
    // entry before its proposal — the uncommitted ones too — and its proposal must not be
    // appended after another leader's entries it never read.
    let (a, b, c) = (node_id(0), node_id(1), node_id(2));
    let mut s = Scripted::new(64);
    s.lead_and_propose_x(a, b);
    let read = s
        .raft(a)
        .read_index(GROUP)
        .expect("a leads under its lease");
    let settled = s
        .raft(a)
        .settled_read(GROUP)
        .expect("a leads under its lease");
    assert_eq!(
        read,
        LogIndex(1),
        "a plain read needs only what is committed"
    );
    assert_eq!(
        settled.index,
        LogIndex(2),
        "a settled read must wait for x, appended but not committed"
    );
    let term_of_read = settled.term;

    // a loses office to b, then wins it back in a later term: b's entries may have come
    // in between, so a proposal made under the earlier read is refused.
    s.elect(b, c);
    s.elect(a, c);
    assert!(s.is_leader(a));
    assert!(
        s.raft(a)
            .propose_in_term(GROUP, Bytes::from_static(b"y"), Some(term_of_read))
            .is_err(),
        "a proposal bound to an earlier term was appended"
    );
    let now = s.raft(a).group(GROUP).expect("the group").hard_state.term;
    assert!(now > term_of_read);
    s.raft(a)
        .propose_in_term(GROUP, Bytes::from_static(b"y"), Some(now))
        .expect("a proposal in the leader's own term is taken");
}
