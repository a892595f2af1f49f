//! One Raft group as one of its members holds it: the durable term and vote, the log,
//! the commit and apply positions, and the role with its per-role state.
//!
//! The rules that need the node (sending, epochs, persisting) live in [`crate::node`];
//! what is here is the group's own arithmetic: the majority, the commit rule, the role
//! changes and the election timer.

use crate::log::Log;
use crate::{Epoch, GroupId, HardState, LogIndex, Millis, NodeId};
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
    /// Refusals of epochs before this one are stale: the leader already went back for
    /// this follower after an earlier refusal.
    pub resent_from_epoch: Epoch,
    /// The commit index last sent: an unchanged one needs no heartbeat before the next
    /// heartbeat interval.
    pub commit_sent: LogIndex,
    pub last_sent_at: Millis,
}

pub struct Group {
    pub id: GroupId,
    /// Every voting member, this node included.
    pub members: Vec<NodeId>,
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
