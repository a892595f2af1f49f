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
//!   [`PersistBatch`] for everything that must become durable and one [`EpochBatch`] per
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

use crate::group::{Group, Leadership, Progress, Role};
use crate::log::{Entry, Log};
use crate::message::{
    Append, EpochAck, EpochBatch, Message, Refusal, RefusalReason, VoteReply, VoteRequest,
};
use crate::{Epoch, GroupId, HardState, LogIndex, Millis, NodeId, Term};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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

    /// Whether [`MultiRaft::seal`] has something to do: a write to make durable, a message
    /// waiting for one, or a batch a follower node should get (new entries, a commit index
    /// it has not seen, or a heartbeat that is due).
    pub fn wants_seal(&self) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        self.groups.values().any(|group| {
            let Role::Leader(leadership) = &group.role else {
                return false;
            };
            leadership.progress.iter().any(|(peer, progress)| {
                self.window_open(*peer)
                    && append_due(
                        group.log.last_index(),
                        group.commit,
                        progress,
                        self.now,
                        self.config.heartbeat_interval_ms,
                    )
            })
        })
    }

    fn window_open(&self, peer: NodeId) -> bool {
        self.peers
            .get(&peer)
            .is_none_or(|peer| peer.in_flight.len() < self.config.max_epochs_in_flight)
    }

    /// Closes the current epoch: its [`PersistBatch`] and a batch to every follower node
    /// that should get one. Returns the epoch.
    pub fn seal(&mut self) -> Epoch {
        let epoch = self.next_epoch;
        self.next_epoch = Epoch(epoch.0 + 1);
        let pending = std::mem::take(&mut self.pending);
        let last_indexes = pending
            .touched
            .iter()
            .filter_map(|id| Some((*id, self.groups.get(id)?.log.last_index())))
            .collect();
        self.outputs.push(Output::Persist(PersistBatch {
            epoch,
            hard_states: pending.hard_states.into_iter().collect(),
            writes: pending.writes,
        }));
        self.sealed.push_back(Sealed {
            epoch,
            last_indexes,
            held: pending.held,
        });
        self.ship(epoch);
        epoch
    }

    /// Sends `epoch`'s batch to every follower node with something due.
    fn ship(&mut self, epoch: Epoch) {
        let now = self.now;
        let max_entries = self.config.max_entries_per_append;
        let mut batches: BTreeMap<NodeId, (Vec<Append>, Vec<SentAppend>)> = BTreeMap::new();
        let open: BTreeSet<NodeId> = self
            .groups
            .values()
            .flat_map(|group| group.members.iter().copied())
            .filter(|peer| *peer != self.me && self.window_open(*peer))
            .collect();
        let heartbeat = self.config.heartbeat_interval_ms;
        let me = self.me;
        for group in self.groups.values_mut() {
            let (last_index, commit) = (group.log.last_index(), group.commit);
            let compact_through = group.everyone_holds(me).unwrap_or_default().min(commit);
            let Role::Leader(leadership) = &mut group.role else {
                continue;
            };
            for (peer, progress) in leadership.progress.iter_mut() {
                if !open.contains(peer) || !append_due(last_index, commit, progress, now, heartbeat)
                {
                    continue;
                }
                let previous_index = progress.next.previous();
                let Some(previous_term) = group.log.term_at(previous_index) else {
                    // Compacted away: this follower needs the state machine's snapshot,
                    // not the log; nothing to send from here.
                    continue;
                };
                // A follower waiting for a snapshot gets heartbeats only: once it has
                // installed one, it accepts the first and asks for what follows.
                let entries = if progress.awaiting_snapshot {
                    Vec::new()
                } else {
                    group.log.slice(progress.next, max_entries)
                };
                let last = LogIndex(previous_index.0 + entries.len() as u64);
                progress.next = last.next();
                progress.commit_sent = group.commit;
                progress.last_sent_at = now;
                let (appends, record) = batches.entry(*peer).or_default();
                record.push((group.id, group.hard_state.term, last));
                appends.push(Append {
                    group: group.id,
                    term: group.hard_state.term,
                    previous_index,
                    previous_term,
                    entries,
                    commit: group.commit,
                    compact_through,
                });
            }
        }
        for (peer, (appends, record)) in batches {
            self.peers.entry(peer).or_default().in_flight.insert(
                epoch,
                SentEpoch {
                    sent_at: now,
                    appends: record,
                },
            );
            self.outputs.push(Output::Send {
                to: peer,
                message: Message::Epoch(EpochBatch { epoch, appends }),
            });
        }
    }

    /// Reports that every epoch up to `epoch` is durable.
    pub fn persisted(&mut self, epoch: Epoch) {
        let mut advanced = BTreeSet::new();
        while self
            .sealed
            .front()
            .is_some_and(|sealed| sealed.epoch <= epoch)
        {
            let Some(sealed) = self.sealed.pop_front() else {
                break;
            };
            for (id, last) in sealed.last_indexes {
                if let Some(group) = self.groups.get_mut(&id) {
                    group.durable = group.durable.max(last).min(group.log.last_index());
                    advanced.insert(id);
                }
            }
            for (to, message) in sealed.held {
                self.outputs.push(Output::Send { to, message });
            }
        }
        for id in advanced {
            self.advance_commit(id);
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

    fn receive_epoch(&mut self, from: NodeId, batch: EpochBatch) {
        let mut refusals = Vec::new();
        for append in batch.appends {
            let group = append.group;
            if let Err(reason) = self.receive_append(from, append) {
                refusals.push(Refusal { group, reason });
            }
        }
        // The acknowledgement says the accepted entries are durable: it leaves with the
        // next epoch's write.
        self.pending.held.push((
            from,
            Message::EpochAck(EpochAck {
                epoch: batch.epoch,
                refusals,
            }),
        ));
    }

    fn receive_append(&mut self, from: NodeId, append: Append) -> Result<(), RefusalReason> {
        let id = append.group;
        let now = self.now;
        let deadline = self.election_deadline();
        let term = {
            let group = self.groups.get(&id).ok_or(RefusalReason::UnknownGroup)?;
            // A node outside the group (one it was moved off, which may not know yet)
            // never leads it, whatever term it claims.
            if !group.members.contains(&from) {
                return Err(RefusalReason::UnknownGroup);
            }
            group.hard_state.term
        };
        if append.term < term {
            return Err(RefusalReason::StaleTerm(term));
        }
        if append.term > term || !matches!(self.groups[&id].role, Role::Follower { .. }) {
            self.become_follower(id, append.term, Some(from));
        }
        let group = self
            .groups
            .get_mut(&id)
            .ok_or(RefusalReason::UnknownGroup)?;
        if group.leader() != Some(from) {
            group.role = Role::Follower { leader: Some(from) };
            self.outputs.push(Output::LeaderChanged {
                group: id,
                term: append.term,
                leader: Some(from),
            });
        }
        group.heard_from_leader_at = Some(now);
        group.election_deadline = deadline;

        if append.previous_index > group.log.last_index() {
            return Err(RefusalReason::Gap {
                from: group.log.last_index().next(),
            });
        }
        if let Some(term_here) = group.log.term_at(append.previous_index) {
            if term_here != append.previous_term {
                // Resend from the first entry of the disagreeing term.
                let log = &group.log;
                let mut first = append.previous_index;
                while first.previous() >= log.first_index()
                    && log.term_at(first.previous()) == Some(term_here)
                {
                    first = first.previous();
                }
                return Err(RefusalReason::Gap { from: first });
            }
        }
        // Entries before the compaction point are committed, hence equal to the leader's.
        let mut index = append.previous_index;
        for entry in append.entries {
            index = index.next();
            match group.log.term_at(index) {
                Some(term_here) if term_here == entry.term => continue,
                _ if index < group.log.first_index() => continue,
                Some(_) => {
                    group.truncate_from(index);
                    group.durable = group.durable.min(index.previous());
                    self.pending.record_truncate(id, index);
                    for sealed in self.sealed.iter_mut() {
                        for (sealed_group, last) in sealed.last_indexes.iter_mut() {
                            if *sealed_group == id {
                                *last = (*last).min(index.previous());
                            }
                        }
                    }
                }
                None => {}
            }
            group.push(entry.clone());
            self.pending.record_append(id, index, entry);
        }
        let commit = append.commit.min(index);
        let compact_through = append.compact_through;
        if commit > group.commit {
            group.commit = commit;
            self.apply_committed(id);
        }
        self.forget_applied(id, compact_through);
        Ok(())
    }

    fn receive_ack(&mut self, from: NodeId, ack: EpochAck) {
        // Acknowledgements may come back in any order; an epoch never acknowledged is
        // resent after `resend_after_ms`, or at once when the transport reports it lost.
        let Some(sent) = self
            .peers
            .get_mut(&from)
            .and_then(|peer| peer.in_flight.remove(&ack.epoch))
        else {
            return;
        };
        let mut touched = BTreeSet::new();
        for (id, term, last) in sent.appends {
            let refusal = ack.refusals.iter().find(|refusal| refusal.group == id);
            match refusal.map(|refusal| &refusal.reason) {
                Some(RefusalReason::StaleTerm(newer)) => {
                    let newer = *newer;
                    if self
                        .groups
                        .get(&id)
                        .is_some_and(|g| newer > g.hard_state.term)
                    {
                        self.become_follower(id, newer, None);
                    }
                }
                Some(RefusalReason::Gap { from: resend_from }) => {
                    let resend_from = *resend_from;
                    let next_epoch = self.next_epoch;
                    let first_held = self
                        .groups
                        .get(&id)
                        .map_or(LogIndex(1), |group| group.log.first_index());
                    if let Some(progress) = self.progress_mut(id, term, from) {
                        if ack.epoch >= progress.resent_from_epoch {
                            progress.next = progress
                                .matched
                                .next()
                                .max(resend_from.min(progress.next))
                                .max(first_held);
                            // It lacks entries this leader no longer holds.
                            progress.awaiting_snapshot = resend_from < first_held;
                            progress.resent_from_epoch = next_epoch;
                        }
                    }
                }
                Some(RefusalReason::UnknownGroup) => {}
                None => {
                    let sent_at = sent.sent_at;
                    if let Some(progress) = self.progress_mut(id, term, from) {
                        progress.matched = progress.matched.max(last);
                        progress.next = progress.next.max(last.next());
                        progress.awaiting_snapshot = false;
                        progress.acknowledged_sent_at =
                            progress.acknowledged_sent_at.max(Some(sent_at));
                        touched.insert(id);
                    }
                }
            }
        }
        for id in touched {
            self.advance_commit(id);
            let held = self
                .groups
                .get(&id)
                .and_then(|group| group.everyone_holds(self.me));
            if let Some(held) = held {
                self.forget_applied(id, held);
            }
        }
    }

    /// Drops from memory the entries up to `through` that this node has applied (every
    /// member holds them: `through` comes from the leader's view).
    fn forget_applied(&mut self, id: GroupId, through: LogIndex) {
        if let Some(group) = self.groups.get_mut(&id) {
            let through = through.min(group.applied);
            if through >= group.log.first_index() {
                group.log.compact_through(through);
            }
        }
    }

    /// Reports that the batch of `epoch` to `peer` was not delivered (the connection
    /// failed): its entries are sent again from each group's last acknowledged one.
    pub fn lost(&mut self, peer: NodeId, epoch: Epoch) {
        let Some(sent) = self
            .peers
            .get_mut(&peer)
            .and_then(|state| state.in_flight.remove(&epoch))
        else {
            return;
        };
        for (group, _, _) in sent.appends {
            self.resend_from_matched(group, peer);
        }
    }

    /// The leader's progress record of `peer` in `group`, if this node still leads the
    /// group in `term`.
    fn progress_mut(&mut self, id: GroupId, term: Term, peer: NodeId) -> Option<&mut Progress> {
        let group = self.groups.get_mut(&id)?;
        if group.hard_state.term != term {
            return None;
        }
        let Role::Leader(leadership) = &mut group.role else {
            return None;
        };
        leadership.progress.get_mut(&peer)
    }

    fn resend_from_matched(&mut self, id: GroupId, peer: NodeId) {
        let next_epoch = self.next_epoch;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        let Role::Leader(leadership) = &mut group.role else {
            return;
        };
        if let Some(progress) = leadership.progress.get_mut(&peer) {
            // Entries before the log's first were held by every member when forgotten
            // (the leader knew them matched then; a new leader's counts start at zero).
            progress.next = progress.matched.next().max(group.log.first_index());
            progress.resent_from_epoch = next_epoch;
        }
    }

    /// Every epoch to `peer` still unacknowledged is taken as lost.
    fn resend_all_to(&mut self, peer: NodeId) {
        let Some(state) = self.peers.get_mut(&peer) else {
            return;
        };
        let lost: BTreeSet<GroupId> = std::mem::take(&mut state.in_flight)
            .into_values()
            .flat_map(|sent| sent.appends.into_iter().map(|(group, _, _)| group))
            .collect();
        for group in lost {
            self.resend_from_matched(group, peer);
        }
    }

    /// Commits what a majority holds (if of the current term) and applies it.
    fn advance_commit(&mut self, id: GroupId) {
        let me = self.me;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        let Some(matched) = group.majority_matched(me) else {
            return;
        };
        if matched > group.commit && group.log.term_at(matched) == Some(group.hard_state.term) {
            group.commit = matched;
            let removed = !group.members.contains(&me)
                && group.last_member_change().is_some_and(|at| at <= matched);
            self.apply_committed(id);
            if removed {
                // The change that removed this leader is committed: the others go on.
                self.step_down(id, None);
            }
        }
    }

    fn apply_committed(&mut self, id: GroupId) {
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        while group.applied < group.commit {
            let index = group.applied.next();
            let Some(entry) = group.log.get(index) else {
                break;
            };
            self.outputs.push(Output::Apply {
                group: id,
                index,
                entry: entry.clone(),
            });
            group.applied = index;
        }
    }

    fn receive_vote_request(&mut self, from: NodeId, request: VoteRequest) {
        let id = request.group;
        let now = self.now;
        let election_timeout = self.config.election_timeout_ms;
        let Some(group) = self.groups.get(&id) else {
            return;
        };
        // Only members elect (a node moved off the group may still campaign in it).
        if !group.members.contains(&from) {
            return;
        }
        let term = group.hard_state.term;
        // Leader stickiness: while a leader is known to be alive, nobody else is elected
        // (this is what makes leases safe, and it keeps a returning node from disrupting).
        // A member that has just started counts as having heard from one.
        let leader_alive = group.is_leader()
            || group
                .heard_from_leader_at
                .is_some_and(|at| at.plus(election_timeout) > now);
        let up_to_date = group
            .log
            .is_no_newer_than(request.last_index, request.last_term);
        // A refusal carries the voter's term: a candidate behind it catches up and can
        // ask again in a term the voter would accept.
        let refuse = VoteReply {
            group: id,
            term,
            granted: false,
            pre_vote: request.pre_vote,
        };
        if request.pre_vote {
            let granted = !leader_alive && request.term > term && up_to_date;
            let reply = if granted {
                VoteReply {
                    term: request.term,
                    granted,
                    ..refuse
                }
            } else {
                refuse
            };
            self.outputs.push(Output::Send {
                to: from,
                message: Message::VoteReply(reply),
            });
            return;
        }
        if request.term < term || leader_alive {
            self.outputs.push(Output::Send {
                to: from,
                message: Message::VoteReply(refuse),
            });
            return;
        }
        if request.term > term {
            self.become_follower(id, request.term, None);
        }
        let deadline = self.election_deadline();
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        let granted = up_to_date && group.hard_state.voted_for.is_none_or(|voted| voted == from);
        if granted {
            group.hard_state.voted_for = Some(from);
            group.election_deadline = deadline;
            self.pending.hard_states.insert(id, group.hard_state);
        }
        let reply = VoteReply {
            group: id,
            term: request.term,
            granted,
            pre_vote: false,
        };
        // The vote is durable before it is told.
        self.pending.held.push((from, Message::VoteReply(reply)));
    }

    fn receive_vote_reply(&mut self, from: NodeId, reply: VoteReply) {
        let id = reply.group;
        let Some(group) = self
            .groups
            .get_mut(&id)
            .filter(|g| g.members.contains(&from))
        else {
            return;
        };
        let term = group.hard_state.term;
        if !reply.granted {
            if reply.term > term {
                self.become_follower(id, reply.term, None);
            }
            return;
        }
        let quorum = group.quorum();
        let Role::Candidate { votes, pre_vote } = &mut group.role else {
            return;
        };
        let expected_term = if *pre_vote { Term(term.0 + 1) } else { term };
        if *pre_vote != reply.pre_vote || reply.term != expected_term {
            return;
        }
        votes.insert(from);
        if votes.len() >= quorum {
            if *pre_vote {
                self.start_election(id);
            } else {
                self.become_leader(id);
            }
        }
    }

    /// Asks whether this node could win an election, without raising its term.
    fn start_pre_vote(&mut self, id: GroupId) {
        let me = self.me;
        let deadline = self.election_deadline();
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        group.role = Role::Candidate {
            votes: BTreeSet::from([me]),
            pre_vote: true,
        };
        group.election_deadline = deadline;
        if group.quorum() == 1 {
            self.start_election(id);
            return;
        }
        let request = VoteRequest {
            group: id,
            term: Term(group.hard_state.term.0 + 1),
            last_index: group.log.last_index(),
            last_term: group.log.last_term(),
            pre_vote: true,
        };
        for peer in group.others(me) {
            self.outputs.push(Output::Send {
                to: peer,
                message: Message::Vote(request.clone()),
            });
        }
    }

    /// Raises the term, votes for itself, and asks for votes once that is durable.
    fn start_election(&mut self, id: GroupId) {
        let me = self.me;
        let deadline = self.election_deadline();
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        group.hard_state = HardState {
            term: Term(group.hard_state.term.0 + 1),
            voted_for: Some(me),
        };
        group.role = Role::Candidate {
            votes: BTreeSet::from([me]),
            pre_vote: false,
        };
        group.election_deadline = deadline;
        self.pending.hard_states.insert(id, group.hard_state);
        let request = VoteRequest {
            group: id,
            term: group.hard_state.term,
            last_index: group.log.last_index(),
            last_term: group.log.last_term(),
            pre_vote: false,
        };
        if group.quorum() == 1 {
            // Alone: no other member can vote in this term, so the vote needs no wait.
            self.become_leader(id);
            return;
        }
        for peer in group.others(me) {
            self.pending
                .held
                .push((peer, Message::Vote(request.clone())));
        }
    }

    fn become_leader(&mut self, id: GroupId) {
        let me = self.me;
        let now = self.now;
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        let term = group.hard_state.term;
        let noop = Entry::new(term, Bytes::new());
        let next = group.log.last_index().next();
        let progress = group
            .others(me)
            .map(|peer| (peer, Progress::new(next)))
            .collect();
        group.role = Role::Leader(Leadership {
            progress,
            since: now,
            term_start: next,
        });
        let index = group.push(noop.clone());
        self.pending.record_append(id, index, noop);
        self.outputs.push(Output::LeaderChanged {
            group: id,
            term,
            leader: Some(me),
        });
        self.advance_commit(id);
    }

    /// Becomes a follower in `term` (a later term clears the vote).
    fn become_follower(&mut self, id: GroupId, term: Term, leader: Option<NodeId>) {
        let deadline = self.election_deadline();
        let Some(group) = self.groups.get_mut(&id) else {
            return;
        };
        if term > group.hard_state.term {
            group.hard_state = HardState {
                term,
                voted_for: None,
            };
            self.pending.hard_states.insert(id, group.hard_state);
        }
        let was_leader = group.is_leader();
        group.role = Role::Follower { leader };
        group.election_deadline = deadline;
        if was_leader || leader.is_some() {
            self.outputs.push(Output::LeaderChanged {
                group: id,
                term: group.hard_state.term,
                leader,
            });
        }
    }

    /// A leader that lost its majority steps down in its own term.
    fn step_down(&mut self, id: GroupId, leader: Option<NodeId>) {
        let term = match self.groups.get(&id) {
            Some(group) => group.hard_state.term,
            None => return,
        };
        self.become_follower(id, term, leader);
    }

    fn election_deadline(&mut self) -> Millis {
        let timeout = self.config.election_timeout_ms;
        self.now
            .plus(timeout + self.rng.random_range(0..timeout.max(1)))
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
