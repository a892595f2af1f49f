//! One node's share of every Raft group it belongs to, and the epoch log they share.
//!
//! [`MultiRaft`] is driven by its caller:
//!
//! - [`MultiRaft::propose`] appends a write to a group this node leads;
//! - [`MultiRaft::receive`] takes a message from another node;
//! - [`MultiRaft::tick`] moves the clock and runs the timers (elections, lost epochs,
//!   stepping down when cut off); [`MultiRaft::advance_clock`] only moves the clock (cheap
//!   enough for every message);
//! - [`MultiRaft::seal`] closes an epoch when [`MultiRaft::wants_seal`]: one
//!   [`PersistBatch`] for everything that must become durable and one [`EpochBatch`](crate::message::EpochBatch) per
//!   follower node;
//! - [`MultiRaft::persisted`] reports that an epoch's batch is durable.
//!
//! After each call, [`MultiRaft::take_outputs`] returns what to do. Persist batches must be
//! made durable in epoch order (one after another, or pipelined but completing in order);
//! messages may be lost, delayed or reordered between connections, but the batches to one
//! peer should be delivered in order — a lost or reordered epoch costs a resend, never
//! safety.
//!
//! # Leases
//!
//! A follower that heard from its leader less than an election timeout ago refuses every
//! vote (leader stickiness). So once a majority has acknowledged an epoch the leader sent
//! at time `t`, no other leader can be elected before `t + election_timeout` on their
//! clocks; the leader serves reads without a round trip until
//! `t + election_timeout − lease_margin` on its own ([`MultiRaft::read_index`]), the
//! margin covering clock-rate drift between nodes.
//!
//! This file holds the driver's entrances, proposals, membership, snapshots and timers;
//! `replicate` ships and receives epochs, commits and applies, and `elections` runs votes and
//! changes of role.

use crate::group::{Group, Progress, Role};
use crate::log::{Entry, Log};
use crate::message::Message;
use crate::{Epoch, GroupId, HardState, LogIndex, Millis, NodeId, Term};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The protocol's timing and bounds.
#[derive(Clone, Debug)]
pub struct Config {
    /// The shortest election timeout: a member waits a random time in
    /// `[election_timeout_ms, 2 × election_timeout_ms)` without a leader before it runs.
    pub election_timeout_ms: u64,
    /// A leader sends each follower node a batch at least this often.
    pub heartbeat_interval_ms: u64,
    /// Epochs sent to one peer and not yet acknowledged, at most; past it new entries
    /// wait (and then travel together).
    pub max_epochs_in_flight: usize,
    /// Entries of one group in one append, at most.
    pub max_entries_per_append: usize,
    /// How much of the election timeout a lease gives up to cover clock drift.
    pub lease_margin_ms: u64,
    /// An epoch unacknowledged this long is taken as lost and its entries resent.
    pub resend_after_ms: u64,
}

impl Config {
    /// How long a majority's acknowledgement lets a leader serve reads alone.
    pub fn lease_length_ms(&self) -> u64 {
        self.election_timeout_ms
            .saturating_sub(self.lease_margin_ms)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            election_timeout_ms: 1000,
            heartbeat_interval_ms: 100,
            max_epochs_in_flight: 64,
            max_entries_per_append: 4096,
            lease_margin_ms: 100,
            resend_after_ms: 1000,
        }
    }
}

/// Where a proposal went in the log: it is committed if the entry applied at `index` has
/// `term`, and lost if another term's entry is applied there.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Proposal {
    pub term: Term,
    pub index: LogIndex,
}

/// The request needs the group's leader, and this node is not it (`leader`: who is, as
/// far as this node knows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NotLeader {
    pub leader: Option<NodeId>,
}

/// Why a membership change was not proposed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MembershipRefused {
    NotLeader(NotLeader),
    /// An earlier change has not committed yet, or the leader has not committed an entry
    /// of its own term: ask again shortly.
    ChangeUnderWay,
    /// A change adds or removes exactly one member, and leaves at least one.
    NotOneMember,
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Make this batch durable (in epoch order), then call [`MultiRaft::persisted`].
    Persist(PersistBatch),
    Send {
        to: NodeId,
        message: Message,
    },
    /// Apply this committed entry to the group's state (entries come in index order).
    Apply {
        group: GroupId,
        index: LogIndex,
        entry: Entry,
    },
    /// The group's leader changed as this node sees it (`None`: unknown for now).
    LeaderChanged {
        group: GroupId,
        term: Term,
        leader: Option<NodeId>,
    },
}

/// One epoch's durable write: term and vote changes, and the log writes in order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PersistBatch {
    pub epoch: Epoch,
    pub hard_states: Vec<(GroupId, HardState)>,
    pub writes: Vec<LogWrite>,
}

impl PersistBatch {
    /// Nothing to write (the epoch still has to be reported persisted, in order).
    pub fn is_empty(&self) -> bool {
        self.hard_states.is_empty() && self.writes.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogWrite {
    /// Remove the group's entries from `from` on; from 0: forget its log and the snapshot
    /// it starts after (the replica left this node).
    Truncate { group: GroupId, from: LogIndex },
    /// Store entries `first, first + 1, …`.
    Append {
        group: GroupId,
        first: LogIndex,
        entries: Vec<Entry>,
    },
    /// The group's log restarts after `index` (whose entry had `term`): the state machine
    /// holds a snapshot of everything up to it ([`MultiRaft::install_snapshot`]).
    /// `members` were the group's members at `index`; `state` is the state machine's own
    /// record of the snapshot, handed back to it after a restart.
    Snapshot {
        group: GroupId,
        index: LogIndex,
        term: Term,
        members: Vec<NodeId>,
        state: Bytes,
    },
}

/// What the next seal will write.
#[derive(Default)]
struct Pending {
    hard_states: BTreeMap<GroupId, HardState>,
    writes: Vec<LogWrite>,
    /// Groups whose log changed: their last index becomes durable with this epoch.
    touched: BTreeSet<GroupId>,
    /// Messages that may leave only once this epoch is durable (votes, acknowledgements).
    held: Vec<(NodeId, Message)>,
}

/// A sealed epoch whose batch is not durable yet.
struct Sealed {
    epoch: Epoch,
    last_indexes: Vec<(GroupId, LogIndex)>,
    held: Vec<(NodeId, Message)>,
}

/// `(group, leader term, last index covered)` of one append sent in an epoch.
type SentAppend = (GroupId, Term, LogIndex);

/// An epoch sent to a peer and not acknowledged yet: what it carried.
struct SentEpoch {
    sent_at: Millis,
    appends: Vec<SentAppend>,
}

#[derive(Default)]
struct Peer {
    in_flight: BTreeMap<Epoch, SentEpoch>,
}

pub struct MultiRaft {
    me: NodeId,
    config: Config,
    groups: BTreeMap<GroupId, Group>,
    now: Millis,
    rng: StdRng,
    next_epoch: Epoch,
    pending: Pending,
    sealed: VecDeque<Sealed>,
    peers: BTreeMap<NodeId, Peer>,
    outputs: Vec<Output>,
}

impl MultiRaft {
    /// A node whose next epoch is `next_epoch` (restored: larger than any it used before).
    pub fn new(me: NodeId, config: Config, next_epoch: Epoch, seed: u64, now: Millis) -> Self {
        MultiRaft {
            me,
            config,
            groups: BTreeMap::new(),
            now,
            rng: StdRng::seed_from_u64(seed),
            next_epoch,
            pending: Pending::default(),
            sealed: VecDeque::new(),
            peers: BTreeMap::new(),
            outputs: Vec::new(),
        }
    }

    pub fn id(&self) -> NodeId {
        self.me
    }

    /// Adds this node's replica of a group, with its durable state if it had one. A new
    /// (or restarted) member refuses votes for an election timeout, as if it had just
    /// heard from a leader: a lease granted before it restarted may still run.
    pub fn add_group(
        &mut self,
        group: GroupId,
        members: Vec<NodeId>,
        hard_state: HardState,
        log: Log,
    ) {
        let deadline = self.election_deadline();
        let mut state = Group::restore(group, members, hard_state, log, self.now, deadline);
        // A log that starts after a snapshot: everything up to it is applied already.
        let snapshot = state.log.first_index().previous();
        state.commit = snapshot;
        state.applied = snapshot;
        self.groups.insert(group, state);
    }

    /// Drops this node's replica of `group` (its tablet left this node, or its table was
    /// dropped): messages for it are refused from now on as for a group never added. Its
    /// log (and any snapshot it starts after) is forgotten durably — the state machine's
    /// data goes with the tablet, so a replica added again later starts empty — while
    /// its term and vote stay.
    pub fn remove_group(&mut self, group: GroupId) -> Option<Group> {
        let removed = self.groups.remove(&group)?;
        self.pending.writes.push(LogWrite::Truncate {
            group,
            from: LogIndex(0),
        });
        Some(removed)
    }

    pub fn group(&self, group: GroupId) -> Option<&Group> {
        self.groups.get(&group)
    }

    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.values()
    }

    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Appends `payload` to the log of a group this node leads.
    pub fn propose(&mut self, group: GroupId, payload: Bytes) -> Result<Proposal, NotLeader> {
        self.propose_in_term(group, payload, None)
    }

    /// Proposes `payload` only if this node still leads `group` in `term` (when given):
    /// a proposal that depends on a read made under [`MultiRaft::settled_read`] is refused
    /// once the node has lost office since, even if it leads again in a later term (other
    /// leaders' entries may have come in between).
    pub fn propose_in_term(
        &mut self,
        group: GroupId,
        payload: Bytes,
        term: Option<Term>,
    ) -> Result<Proposal, NotLeader> {
        let Some(state) = self.groups.get_mut(&group) else {
            return Err(NotLeader { leader: None });
        };
        if !state.is_leader() || term.is_some_and(|term| term != state.hard_state.term) {
            return Err(NotLeader {
                leader: state.leader(),
            });
        }
        let term = state.hard_state.term;
        let entry = Entry::new(term, payload);
        let index = state.push(entry.clone());
        self.pending.record_append(group, index, entry);
        Ok(Proposal { term, index })
    }

    /// Proposes that `members` become the members of a group this node leads: one member
    /// added or removed (Raft's single-server change), once the leader has committed an
    /// entry of its term and no earlier change is still uncommitted. The new members are
    /// in force from the entry's append on; a leader that removed itself steps down once
    /// the entry commits.
    pub fn change_members(
        &mut self,
        group: GroupId,
        members: Vec<NodeId>,
    ) -> Result<Proposal, MembershipRefused> {
        let me = self.me;
        let state = self
            .groups
            .get_mut(&group)
            .ok_or(MembershipRefused::NotLeader(NotLeader { leader: None }))?;
        let Role::Leader(leadership) = &state.role else {
            return Err(MembershipRefused::NotLeader(NotLeader {
                leader: state.leader(),
            }));
        };
        if state.commit < leadership.term_start
            || state
                .last_member_change()
                .is_some_and(|at| at > state.commit)
        {
            return Err(MembershipRefused::ChangeUnderWay);
        }
        let added = members
            .iter()
            .filter(|m| !state.members.contains(m))
            .count();
        let removed = state
            .members
            .iter()
            .filter(|m| !members.contains(m))
            .count();
        if added + removed != 1 || members.is_empty() {
            return Err(MembershipRefused::NotOneMember);
        }
        let term = state.hard_state.term;
        let entry = Entry::members(term, &members);
        let index = state.push(entry.clone());
        state.track_members(me);
        self.pending.record_append(group, index, entry);
        // A group that lost a member may have a majority already.
        self.advance_commit(group);
        Ok(Proposal { term, index })
    }

    /// The epoch the next [`MultiRaft::seal`] closes.
    pub fn next_epoch(&self) -> Epoch {
        self.next_epoch
    }

    /// Records a *checkpoint* in the next epoch: for every group, its term and vote, a
    /// snapshot at its applied index (the members then, and `machine_state`, the state
    /// machine's record of it) and every entry after it — everything the log file holds
    /// of the node, so that once the epoch is durable, every earlier record can go. The
    /// caller has made the state machine's data durable up to every group's applied index
    /// first, and adds `carried`: what the file holds of groups not added here.
    pub fn record_checkpoint(
        &mut self,
        machine_state: &mut dyn FnMut(GroupId) -> Bytes,
        carried: (Vec<(GroupId, HardState)>, Vec<LogWrite>),
    ) {
        let (hard_states, writes) = carried;
        self.pending.hard_states.extend(hard_states);
        self.pending.writes.extend(writes);
        for (id, group) in &self.groups {
            self.pending.hard_states.insert(*id, group.hard_state);
            let index = group.applied;
            // The applied index is never before the log's first (compaction stops there).
            let term = group.log.term_at(index).unwrap_or_default();
            self.pending.writes.push(LogWrite::Snapshot {
                group: *id,
                index,
                term,
                members: group.members_at(index),
                state: machine_state(*id),
            });
            let entries = group.log.slice(index.next(), usize::MAX);
            if !entries.is_empty() {
                self.pending.writes.push(LogWrite::Append {
                    group: *id,
                    first: index.next(),
                    entries,
                });
            }
        }
    }

    /// Installs a snapshot of the state machine at `index` (whose entry had `term`, when
    /// the members were `members`): the log restarts after it, everything up to it counts
    /// as committed and applied. The caller has put the state machine's data in place
    /// first and made it durable; `state` is the state machine's own record of it, written
    /// with the log. `false` when the group is not here or already has `index` applied.
    pub fn install_snapshot(
        &mut self,
        group: GroupId,
        index: LogIndex,
        term: Term,
        members: Vec<NodeId>,
        state: Bytes,
    ) -> bool {
        let Some(replica) = self.groups.get_mut(&group) else {
            return false;
        };
        if replica.applied >= index {
            return false;
        }
        replica.restart_after(index, term, members.clone());
        replica.commit = replica.commit.max(index);
        replica.applied = index;
        replica.durable = replica.durable.min(replica.log.last_index());
        self.pending.touched.insert(group);
        self.pending.writes.push(LogWrite::Snapshot {
            group,
            index,
            term,
            members,
            state,
        });
        true
    }

    /// Starts an election for `group` now, as if its timer had run out (to hand leadership
    /// to a chosen replica, and in tests). Voters still refuse while they hear a leader.
    pub fn campaign(&mut self, group: GroupId) {
        if self
            .groups
            .get(&group)
            .is_some_and(|state| !state.is_leader())
        {
            self.start_pre_vote(group);
        }
    }

    /// The index a linearizable read of `group` must see applied (it already is when this
    /// returns), if this node leads the group under a valid lease and has committed an
    /// entry of its term.
    pub fn read_index(&self, group: GroupId) -> Result<LogIndex, NotLeader> {
        let state = self.groups.get(&group).ok_or(NotLeader { leader: None })?;
        let Role::Leader(leadership) = &state.role else {
            return Err(NotLeader {
                leader: state.leader(),
            });
        };
        let lease_until = state.lease_until(self.me, self.now, self.config.lease_length_ms());
        if lease_until.is_none_or(|until| until <= self.now) || state.commit < leadership.term_start
        {
            return Err(NotLeader { leader: None });
        }
        Ok(state.commit)
    }

    /// Where a read that a proposal will depend on stands (a conditional write's check):
    /// refused as [`MultiRaft::read_index`] is, else the last index this leader's log holds
    /// — entries appended and not yet committed included, since the proposal will be
    /// appended after them — and the term the proposal must be made in
    /// ([`MultiRaft::propose_in_term`]). The read must wait until that index is applied.
    pub fn settled_read(&self, group: GroupId) -> Result<Proposal, NotLeader> {
        self.read_index(group)?;
        let state = self.groups.get(&group).ok_or(NotLeader { leader: None })?;
        Ok(Proposal {
            term: state.hard_state.term,
            index: state.log.last_index(),
        })
    }

    /// Moves the clock to `now` without running timers (cheap: for every message; timers
    /// run on [`MultiRaft::tick`]).
    pub fn advance_clock(&mut self, now: Millis) {
        self.now = self.now.max(now);
    }

    /// Moves the clock to `now`: runs elections that are due, steps down leaders cut off
    /// from a majority, and takes epochs unacknowledged for too long as lost.
    pub fn tick(&mut self, now: Millis) {
        self.now = self.now.max(now);
        let ids: Vec<GroupId> = self.groups.keys().copied().collect();
        for id in ids {
            self.tick_group(id);
        }
        let resend_after = self.config.resend_after_ms;
        let lost: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, peer)| {
                peer.in_flight
                    .values()
                    .next()
                    .is_some_and(|sent| sent.sent_at.plus(resend_after) <= self.now)
            })
            .map(|(peer, _)| *peer)
            .collect();
        for peer in lost {
            self.resend_all_to(peer);
        }
    }

    fn tick_group(&mut self, id: GroupId) {
        let now = self.now;
        let me = self.me;
        let cut_off_after = 2 * self.config.election_timeout_ms;
        let lease_length = self.config.lease_length_ms();
        let Some(group) = self.groups.get(&id) else {
            return;
        };
        match &group.role {
            Role::Leader(leadership) => {
                let heard = group
                    .lease_until(me, now, lease_length)
                    .map_or(leadership.since, |until| until.max(leadership.since));
                if heard.plus(cut_off_after) <= now {
                    // No majority has answered for two election timeouts: others have
                    // probably elected a leader; stop taking writes that cannot commit.
                    self.step_down(id, None);
                }
            }
            Role::Follower { .. } | Role::Candidate { .. } => {
                if now >= group.election_deadline && group.members.contains(&me) {
                    self.start_pre_vote(id);
                }
            }
        }
    }

    pub fn receive(&mut self, from: NodeId, message: Message) {
        match message {
            Message::Epoch(batch) => self.receive_epoch(from, batch),
            Message::EpochAck(ack) => self.receive_ack(from, ack),
            Message::Vote(request) => self.receive_vote_request(from, request),
            Message::VoteReply(reply) => self.receive_vote_reply(from, reply),
        }
    }
}

/// Whether a follower should get an append in the next batch: entries it lacks, a commit
/// index it has not seen, or a heartbeat that is due.
fn append_due(
    last_index: LogIndex,
    commit: LogIndex,
    progress: &Progress,
    now: Millis,
    heartbeat_ms: u64,
) -> bool {
    (last_index >= progress.next && !progress.awaiting_snapshot)
        || progress.commit_sent < commit
        || progress.last_sent_at.plus(heartbeat_ms) <= now
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.hard_states.is_empty() && self.writes.is_empty() && self.held.is_empty()
    }

    fn record_append(&mut self, group: GroupId, index: LogIndex, entry: Entry) {
        self.touched.insert(group);
        if let Some(LogWrite::Append {
            group: last_group,
            first,
            entries,
        }) = self.writes.last_mut()
        {
            if *last_group == group && first.0 + entries.len() as u64 == index.0 {
                entries.push(entry);
                return;
            }
        }
        self.writes.push(LogWrite::Append {
            group,
            first: index,
            entries: vec![entry],
        });
    }

    fn record_truncate(&mut self, group: GroupId, from: LogIndex) {
        self.touched.insert(group);
        self.writes.push(LogWrite::Truncate { group, from });
    }
}

mod elections;
mod replicate;
