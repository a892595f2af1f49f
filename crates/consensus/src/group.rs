//! One Raft group as one of its members holds it: the durable term and vote, the log,
//! the commit and apply positions, and the role with its per-role state.
//!
//! The rules that need the node (sending, epochs, persisting) live in [`crate::node`];
//! what is here is the group's own arithmetic: the majority, the commit rule, the role
//! changes and the election timer.

use crate::log::{Entry, Log};
use crate::{Epoch, GroupId, HardState, LogIndex, Millis, NodeId, Term};
use std::collections::{BTreeMap, BTreeSet};

/// What one member is to its group right now.
#[derive(Clone, Debug)]
pub enum Role {
    /// Follows `leader` (once it has heard from one in this term).
    Follower {
        leader: Option<NodeId>,
    },
    /// Asks for votes; `pre_vote` while it only asks whether it could win.
    Candidate {
        votes: BTreeSet<NodeId>,
        pre_vote: bool,
    },
    Leader(Leadership),
}

/// A leader's view of its followers.
#[derive(Clone, Debug, Default)]
pub struct Leadership {
    pub progress: BTreeMap<NodeId, Progress>,
    /// When this member took office (the last sign of a majority until one answers).
    pub since: Millis,
    /// The first index of this term (the leader's no-op): reads are served only once it
    /// is committed, when the leader knows every earlier committed entry.
    pub term_start: LogIndex,
}

/// Where a follower's log stands as its leader knows it.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// The next entry to send.
    pub next: LogIndex,
    /// The last entry known durable on the follower and equal to the leader's.
    pub matched: LogIndex,
    /// When the follower last acknowledged an epoch, as the send time of that epoch
    /// (what the lease is computed from).
    pub acknowledged_sent_at: Option<Millis>,
    /// The follower lacks entries this leader no longer holds (a member just added, or
    /// one far behind): until the state machine installs a snapshot there, it only gets
    /// heartbeats.
    pub awaiting_snapshot: bool,
    /// Refusals of epochs before this one are stale: the leader already went back for
    /// this follower after an earlier refusal.
    pub resent_from_epoch: Epoch,
    /// The commit index last sent: an unchanged one needs no heartbeat before the next
    /// heartbeat interval.
    pub commit_sent: LogIndex,
    pub last_sent_at: Millis,
}

impl Progress {
    /// A follower the leader knows nothing of yet: entries are sent from `next` on.
    pub fn new(next: LogIndex) -> Progress {
        Progress {
            next,
            matched: LogIndex(0),
            acknowledged_sent_at: None,
            awaiting_snapshot: false,
            resent_from_epoch: Epoch(0),
            commit_sent: LogIndex(0),
            last_sent_at: Millis(0),
        }
    }
}

pub struct Group {
    pub id: GroupId,
    /// Every voting member (this node included while it is one): the members the last
    /// membership entry in the log names, else [`Group::base_members`].
    pub members: Vec<NodeId>,
    /// The members before the first membership entry the log holds (the tablet's
    /// replicas when the group was created, or the members at a snapshot's index).
    pub base_members: Vec<NodeId>,
    /// Each membership entry of the log: its index and the members it names.
    pub member_changes: Vec<(LogIndex, Vec<NodeId>)>,
    pub hard_state: HardState,
    pub log: Log,
    pub commit: LogIndex,
    pub applied: LogIndex,
    /// The last index of this node's log that is durable here.
    pub durable: LogIndex,
    pub role: Role,
    /// When this member next starts an election if it hears from no leader.
    pub election_deadline: Millis,
    /// When it last heard from a leader of its current term: while that is recent it
    /// refuses votes to others (leader stickiness, which the lease relies on).
    pub heard_from_leader_at: Option<Millis>,
}

impl Group {
    /// A member's replica of group `id`, restored from its durable log: the members are
    /// `base_members` as changed by the membership entries the log holds.
    pub fn restore(
        id: GroupId,
        base_members: Vec<NodeId>,
        hard_state: HardState,
        log: Log,
        now: Millis,
        election_deadline: Millis,
    ) -> Group {
        let durable = log.last_index();
        let mut member_changes = Vec::new();
        let mut index = log.first_index();
        while let Some(entry) = log.get(index) {
            if let Some(members) = entry.member_list() {
                member_changes.push((index, members));
            }
            index = index.next();
        }
        let mut group = Group {
            id,
            members: Vec::new(),
            base_members,
            member_changes,
            hard_state,
            log,
            commit: LogIndex(0),
            applied: LogIndex(0),
            durable,
            role: Role::Follower { leader: None },
            election_deadline,
            heard_from_leader_at: Some(now),
        };
        group.refresh_members();
        group
    }

    /// Appends `entry` to the log; a membership entry takes effect at once.
    pub fn push(&mut self, entry: Entry) -> LogIndex {
        let members = entry.member_list();
        let index = self.log.push(entry);
        if let Some(members) = members {
            self.member_changes.push((index, members));
            self.refresh_members();
        }
        index
    }

    /// Removes the log's entries from `index` on, and the membership changes they made.
    pub fn truncate_from(&mut self, index: LogIndex) {
        self.log.truncate_from(index);
        self.member_changes.retain(|(at, _)| *at < index);
        self.refresh_members();
    }

    /// Restarts the log after `index` (see [`Log::restart_after`]), whose members were
    /// `members`.
    pub fn restart_after(&mut self, index: LogIndex, term: Term, members: Vec<NodeId>) {
        self.log.restart_after(index, term);
        self.base_members = members;
        let last = self.log.last_index();
        self.member_changes
            .retain(|(at, _)| *at > index && *at <= last);
        self.refresh_members();
    }

    /// The members in force once the log holds entry `index`.
    pub fn members_at(&self, index: LogIndex) -> Vec<NodeId> {
        self.member_changes
            .iter()
            .rev()
            .find(|(at, _)| *at <= index)
            .map_or_else(|| self.base_members.clone(), |(_, members)| members.clone())
    }

    /// The index of the last membership entry, if the log holds one.
    pub fn last_member_change(&self) -> Option<LogIndex> {
        self.member_changes.last().map(|(at, _)| *at)
    }

    fn refresh_members(&mut self) {
        self.members = self.members_at(self.log.last_index());
        let me_and_members = &self.members;
        if let Role::Leader(leadership) = &mut self.role {
            leadership
                .progress
                .retain(|peer, _| me_and_members.contains(peer));
        }
    }

    /// A leader's progress records, one per other member: a member just added is sent
    /// entries from the log's end (a gap it reports takes the leader back).
    pub fn track_members(&mut self, me: NodeId) {
        let next = self.log.last_index().next();
        let members = self.members.clone();
        if let Role::Leader(leadership) = &mut self.role {
            for member in members.into_iter().filter(|m| *m != me) {
                leadership
                    .progress
                    .entry(member)
                    .or_insert_with(|| Progress::new(next));
            }
        }
    }

    pub fn leader(&self) -> Option<NodeId> {
        match &self.role {
            Role::Follower { leader } => *leader,
            Role::Leader(_) => None,
            Role::Candidate { .. } => None,
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    /// How many members make a majority.
    pub fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }

    pub fn others<'a>(&'a self, me: NodeId) -> impl Iterator<Item = NodeId> + 'a {
        self.members
            .iter()
            .copied()
            .filter(move |member| *member != me)
    }

    /// The highest index a majority holds durably, counting this leader's durable log:
    /// committed if it is from the current term (Raft §5.4.2; an earlier term's entries
    /// commit with it).
    pub fn majority_matched(&self, me: NodeId) -> Option<LogIndex> {
        let mut matched = self.matched_by_member(me)?;
        matched.sort_unstable_by(|a, b| b.cmp(a));
        matched.get(self.quorum() - 1).copied()
    }

    /// What each member holds durably as this leader knows it (itself: its own durable
    /// log); `None` unless this member leads.
    fn matched_by_member(&self, me: NodeId) -> Option<Vec<LogIndex>> {
        let Role::Leader(leadership) = &self.role else {
            return None;
        };
        let matched = self
            .members
            .iter()
            .map(|member| {
                if *member == me {
                    self.durable
                } else {
                    leadership
                        .progress
                        .get(member)
                        .map_or(LogIndex(0), |progress| progress.matched)
                }
            })
            .collect();
        Some(matched)
    }

    /// The last index every member holds durably (as this leader knows): nobody needs the
    /// entries up to it sent again.
    pub fn everyone_holds(&self, me: NodeId) -> Option<LogIndex> {
        self.matched_by_member(me)?.into_iter().min()
    }

    /// Until when no other member can have been elected, if this member leads and a
    /// majority has acknowledged one of its epochs (see [`crate::node`]'s lease).
    pub fn lease_until(&self, me: NodeId, now: Millis, lease_length_ms: u64) -> Option<Millis> {
        Some(
            self.majority_acknowledged_at(me, now)?
                .plus(lease_length_ms),
        )
    }

    /// The latest send time a majority (this leader counting as now) has acknowledged:
    /// no member of that majority votes for anyone else within an election timeout of
    /// hearing it.
    pub fn majority_acknowledged_at(&self, me: NodeId, now: Millis) -> Option<Millis> {
        let Role::Leader(leadership) = &self.role else {
            return None;
        };
        let mut times: Vec<Millis> = self
            .members
            .iter()
            .filter_map(|member| {
                if *member == me {
                    Some(now)
                } else {
                    leadership.progress.get(member)?.acknowledged_sent_at
                }
            })
            .collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        times.get(self.quorum() - 1).copied()
    }
}
