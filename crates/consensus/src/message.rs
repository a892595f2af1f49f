//! What nodes send each other. Log shipping is per node pair and per epoch
//! ([`EpochBatch`] → [`EpochAck`]); elections are per group ([`VoteRequest`] →
//! [`VoteReply`]).

use crate::log::Entry;
use crate::{Epoch, GroupId, LogIndex, NodeId, Term};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Epoch(EpochBatch),
    EpochAck(EpochAck),
    Vote(VoteRequest),
    VoteReply(VoteReply),
}

/// One epoch of a leader node's log for one follower node: for every group both belong
/// to and this node leads, the entries new since the last batch (or none: then the append
/// is a heartbeat that carries the leader's commit index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochBatch {
    pub epoch: Epoch,
    pub appends: Vec<Append>,
}

/// Raft's AppendEntries for one group, without its own reply: the epoch's
/// acknowledgement answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Append {
    pub group: GroupId,
    pub term: Term,
    /// The entry just before `entries` and its term: the follower accepts only if its log
    /// holds that entry with that term (the log matching check).
    pub previous_index: LogIndex,
    pub previous_term: Term,
    pub entries: Vec<Entry>,
    /// The leader's commit index.
    pub commit: LogIndex,
    /// Every member holds the entries up to here durably and they are committed: no one
    /// will ever need them sent again, so members may drop them from memory once applied
    /// (they stay in the durable log).
    pub compact_through: LogIndex,
}

/// A follower's answer to one epoch, sent once the entries it accepted are durable. Every
/// append of the epoch not named in `refusals` was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochAck {
    pub epoch: Epoch,
    pub refusals: Vec<Refusal>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub group: GroupId,
    pub reason: RefusalReason,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The follower is in a later term: the sender is no longer leader.
    StaleTerm(Term),
    /// The follower's log does not hold the previous entry; resend from `from` on.
    Gap { from: LogIndex },
    /// The follower holds no replica of this group.
    UnknownGroup,
}

/// A candidate (or, with `pre_vote`, a would-be candidate) asks for a vote in `term`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoteRequest {
    pub group: GroupId,
    pub term: Term,
    pub last_index: LogIndex,
    pub last_term: Term,
    /// A pre-vote asks "would you vote for me in `term`?" and changes nothing on the
    /// voter: a node cut off from the leader learns it could not win before it raises its
    /// term and deposes a healthy leader.
    pub pre_vote: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoteReply {
    pub group: GroupId,
    /// The term asked about (for a refusal from a later term: the voter's term).
    pub term: Term,
    pub granted: bool,
    pub pre_vote: bool,
}

/// A message with its sender, as the transport delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub from: NodeId,
    pub to: NodeId,
    pub message: Message,
}
