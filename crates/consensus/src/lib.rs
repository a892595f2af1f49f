//! Per-tablet Raft groups that share one epoch log per node — the consensus core of
//! strongly consistent tables (issue 12, seed 001).
//!
//! # The problem
//!
//! A strongly consistent table replicates every write of a tablet through that tablet's
//! Raft group: the group's leader orders the writes in its log, a write is *committed*
//! once a majority of the tablet's replicas hold it durably, and every replica applies
//! committed entries in log order. A node is a member of many groups (one per tablet
//! replica it holds). Run naively, each group would make its own durable write and send
//! its own request/response AppendEntries per entry: a fsync and a round trip per group
//! and per write, which is far from what the disk and the network can carry.
//!
//! # How seed 001 (RaftSilo) does it, and how this crate does
//!
//! RaftSilo groups transactions into *epochs*, writes each epoch to the log in one
//! durable write, and ships the log to followers as a stream rather than as one
//! request/response per entry. Here:
//!
//! - **An epoch is one write for every group of the node.** [`MultiRaft::seal`] closes
//!   the current epoch: every entry appended since the last seal, by any group this node
//!   leads or follows, every term/vote change and every log truncation goes into one
//!   [`PersistBatch`] — one durable write (one WAL sync) for the whole node. The driver
//!   seals whenever the previous write has finished and something is waiting, so under
//!   load epochs grow and the cost of a sync is shared by more writes (group commit).
//! - **Each follower node gets one [`EpochBatch`] per epoch** holding the new entries of
//!   every group it shares with this leader, sent before the leader's own write is durable
//!   and without waiting for earlier epochs to be acknowledged: many epochs are in flight
//!   at once, bounded by [`Config::max_epochs_in_flight`]. Groups share the node's
//!   connection; there is no socket and no sync per group.
//! - **Followers acknowledge by epoch.** After its own write holding a batch's entries is
//!   durable, a follower answers [`EpochAck`] naming the epoch and only the groups it
//!   *refused* (stale term, or a gap in its log). The leader remembers what each epoch
//!   carried to each peer, so an acknowledgement of epoch `e` means "every append of `e`
//!   not refused is durable here": that advances each group's match index, and an entry is
//!   committed when a majority of its group's members (the leader counts itself once its
//!   own epoch is durable) match it and it is from the leader's current term (Raft §5.4.2).
//! - **Everything else is Raft, per group** ([`group`]): terms, votes persisted before
//!   they are sent, pre-vote so a node coming back from a partition does not depose a
//!   healthy leader, the log matching check on every append, a no-op entry when a leader
//!   takes office, leader leases for reads.
//! - **Members change one at a time** ([`MultiRaft::change_members`]): a membership entry
//!   ([`EntryKind::Members`]) is in force on a member once it is in its log, and the next
//!   change waits until it commits (the single-server change of Ongaro's thesis, §4.1). A
//!   new member that lacks entries every old member has dropped from memory starts from a
//!   snapshot of the state machine ([`MultiRaft::install_snapshot`]; the data itself is the
//!   caller's to move), recorded durably as the point its log restarts after.
//!
//! # Types
//!
//! [`MultiRaft`] is one node's state: its groups, its epoch counter, and per peer node the
//! epochs in flight ([`node`]). Each group is a [`group::Group`] with a role —
//! `Role::Follower`, `Role::Candidate` or `Role::Leader` — and a [`log::Log`].
//! Inputs are [`MultiRaft::propose`], [`MultiRaft::receive`], [`MultiRaft::tick`],
//! [`MultiRaft::seal`] and [`MultiRaft::persisted`]; what the node must do in response
//! comes back as [`Output`]s: write this batch, send this message, apply these committed
//! entries, the leader changed. The core does no I/O and reads no clock: time is the
//! `now` its caller passes in, so the simulation tests (`tests/`) replay any schedule of
//! messages, losses, crashes and restarts deterministically from a seed.
//!
//! [`runtime`] performs the outputs for real: a task per node owning the `MultiRaft`, a
//! thread writing the epoch log file (one `fdatasync` per write of every epoch waiting),
//! and one TCP stream per peer node ([`runtime::tcp`]).
//!
//! # Durability rules
//!
//! - A vote and a term change are durable before any message that depends on them leaves
//!   the node (the vote reply, the vote request): such messages wait for the
//!   [`PersistBatch`] that carries the change.
//! - A follower acknowledges an epoch only after the write holding its entries is durable.
//! - A leader counts its own copy towards a majority only once durable, but it sends
//!   entries to followers before that: followers' writes and its own run in parallel.
//! - Applying committed entries is idempotent for Shoal's payloads (cells carry their own
//!   timestamps), so after a restart a node simply applies its committed log again.

pub mod codec;
pub mod group;
pub mod log;
pub mod message;
pub mod node;
pub mod runtime;

pub use group::Role;
pub use log::{Entry, EntryKind, Log};
pub use message::{
    Append, EpochAck, EpochBatch, Message, Refusal, RefusalReason, VoteReply, VoteRequest,
};
pub use node::{
    Config, LogWrite, MembershipRefused, MultiRaft, NotLeader, Output, PersistBatch, Proposal,
};

/// Which host a message comes from or goes to: cluster metadata's host id.
pub type NodeId = shoal_model::HostId;

/// A Raft group: one per tablet of a strongly consistent table (the tablet's id).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct GroupId(pub u64);

/// A Raft term: at most one leader is elected per term of a group.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Term(pub u64);

/// The position of an entry in a group's log; the first entry is 1, 0 means "none".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct LogIndex(pub u64);

impl LogIndex {
    pub fn next(self) -> LogIndex {
        LogIndex(self.0 + 1)
    }

    /// The index before this one (0 stays 0).
    pub fn previous(self) -> LogIndex {
        LogIndex(self.0.saturating_sub(1))
    }
}

/// One node's epoch number: it numbers the node's durable writes and the batches it ships
/// to each peer; it only grows, also across restarts (the caller restores it).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Epoch(pub u64);

/// A point on the caller's monotonic clock, in milliseconds. The core never reads a clock.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Millis(pub u64);

impl Millis {
    pub fn plus(self, millis: u64) -> Millis {
        Millis(self.0.saturating_add(millis))
    }
}

/// A group's term and vote: what must be durable before the node acts on them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct HardState {
    pub term: Term,
    pub voted_for: Option<NodeId>,
}

#[cfg(test)]
mod tests;
