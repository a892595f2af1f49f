//! Runs a [`MultiRaft`] for real: one task owns it and performs its outputs.
//!
//! - **Durable writes** go to a thread that owns the [`log_file::EpochLogFile`]: it takes
//!   every batch waiting, writes them, syncs once, and reports the last epoch persisted.
//!   At most [`NodeOptions::max_persists_in_flight`] batches are queued, so under load an
//!   epoch collects everything proposed while the previous write synced.
//! - **Messages** go through a [`Transport`] (one ordered stream per peer node:
//!   [`tcp::TcpTransport`]); what arrives is handed in with [`RaftHandle::receive`].
//! - **Committed entries** are applied by the caller's [`StateMachine`], in log order, and
//!   each proposal's waiter hears whether its entry was the one committed at its index.
//!
//! The task is the only owner of the protocol state, so nothing in it is locked; callers
//! talk to it through a bounded command channel.
//!
//! The code: `handle` ([`RaftHandle`], the callers' side), `task` (the node's task and
//! its log thread, and [`start`]); the traits the caller provides and the commands are here.

mod handle;
pub mod log_file;
mod task;
pub mod tcp;

use crate::log::EntryKind;
use crate::message::Message;
use crate::node::{
    Config, MembershipRefused, MultiRaft, NotLeader, Output, PersistBatch, Proposal,
};
use crate::{Epoch, GroupId, LogIndex, Millis, NodeId, Term};
use bytes::Bytes;
use log_file::{EpochLogFile, Recovered};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use task::start;
use tokio::sync::{mpsc, oneshot};

/// Commands waiting for the node's task before callers wait.
const COMMAND_QUEUE: usize = 8192;
/// Commands the task takes in one go before it looks at its outputs.
const COMMANDS_PER_TURN: usize = 1024;

/// Applies committed entries (for a table: writes their cells to the engine).
///
/// The node's task hands over every entry committed since its last turn, one
/// [`StateMachine::apply`] each, then calls [`StateMachine::finish_applying`] once before
/// anybody waiting for those entries hears of them: a machine may collect a turn's
/// entries and write them together there.
pub trait StateMachine: Send + 'static {
    /// Applies one committed entry. Every member must come to the same [`Applied`] for the
    /// same entry: the outcome is the log's, not the node's.
    fn apply(&mut self, group: GroupId, index: LogIndex, payload: &Bytes) -> Applied;

    /// Every entry handed to [`StateMachine::apply`] so far must be visible when this
    /// returns (not yet durable: that is [`StateMachine::make_durable`]).
    fn finish_applying(&mut self) {}

    /// What the state machine keeps of `group` besides its data, as of the last entry
    /// applied (for a table: the clock that orders timestamps): carried with a snapshot.
    fn snapshot_state(&self, _group: GroupId) -> Bytes {
        Bytes::new()
    }

    /// Takes back [`StateMachine::snapshot_state`]'s record when a snapshot is installed
    /// (and when a node restarts from one).
    fn restore_state(&mut self, _group: GroupId, _state: &Bytes) {}

    /// Makes everything applied so far durable (before a checkpoint lets the log forget
    /// it). A state machine that keeps nothing, or writes durably, has nothing to do.
    fn make_durable(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// What applying a committed entry did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The entry took effect.
    Done,
    /// The state machine refused the entry: it committed and changed nothing (for a
    /// table: its group is fenced for a split or merge). Its proposer hears
    /// [`ProposeError::Refused`], and may propose it again elsewhere.
    Refused,
}

/// Delivers messages to peer nodes, in order per peer, without waiting.
pub trait Transport: Send + Sync + 'static {
    /// Queues `message` for `to`; `false` when it could not be queued (the peer's queue is
    /// full): the message is dropped and the protocol sends again.
    fn send(&self, to: NodeId, message: &Message) -> bool;
}

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub raft: Config,
    /// How often the protocol's clock moves when nothing else happens.
    pub tick_interval: Duration,
    /// Durable writes queued at once (the next epoch is sealed while one syncs).
    pub max_persists_in_flight: usize,
    pub seed: u64,
    /// Log bytes written between two checkpoints (see [`log_file`]).
    pub checkpoint_after_bytes: u64,
}

impl Default for NodeOptions {
    fn default() -> NodeOptions {
        NodeOptions {
            raft: Config::default(),
            tick_interval: Duration::from_millis(10),
            max_persists_in_flight: 2,
            seed: 0,
            checkpoint_after_bytes: 4 * log_file::SEGMENT_BYTES,
        }
    }
}

/// Why a proposal did not commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposeError {
    /// This node does not lead the group (`leader`: who does, if known).
    NotLeader(Option<NodeId>),
    /// Another leader's entry was committed at the proposal's index.
    Superseded,
    /// The node is shutting down or its log failed.
    Stopped,
    /// A membership change was not proposed (see [`MembershipRefused`]).
    Membership(MembershipRefused),
    /// The entry committed and the state machine refused it ([`Applied::Refused`]):
    /// nothing changed.
    Refused,
}

/// Where a group's state machine stands on one replica: what a snapshot taken from it
/// now holds, and what a joining member installs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPoint {
    /// The last entry applied, and its term.
    pub index: LogIndex,
    pub term: Term,
    /// The members once the log holds `index`.
    pub members: Vec<NodeId>,
    /// The state machine's [`StateMachine::snapshot_state`] at `index`.
    pub state: Bytes,
}

/// One replica's view of its group (for the operations that change its members).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The members now (the last membership entry's, committed or not).
    pub members: Vec<NodeId>,
    pub is_leader: bool,
    pub applied: LogIndex,
    /// The last membership entry is committed (or the log holds none).
    pub members_settled: bool,
    /// On a leader: each other member and the last index it is known to hold.
    pub matched: Vec<(NodeId, LogIndex)>,
}

/// What the node counts (for the benchmark and the metrics).
#[derive(Default, Debug)]
pub struct Counters {
    pub epochs_sealed: AtomicU64,
    pub log_syncs: AtomicU64,
    pub log_bytes: AtomicU64,
    pub entries_committed: AtomicU64,
}

enum Command {
    Propose {
        group: GroupId,
        payload: Bytes,
        /// Only while the node leads in this term ([`MultiRaft::propose_in_term`]).
        term: Option<Term>,
        done: oneshot::Sender<Result<(), ProposeError>>,
    },
    SettledRead {
        group: GroupId,
        answer: oneshot::Sender<Result<Proposal, NotLeader>>,
    },
    Receive {
        from: NodeId,
        message: Message,
    },
    Leader {
        group: GroupId,
        answer: oneshot::Sender<Option<NodeId>>,
    },
    ReadIndex {
        group: GroupId,
        answer: oneshot::Sender<Result<LogIndex, NotLeader>>,
    },
    AddGroup {
        spec: GroupSpec,
    },
    ChangeMembers {
        group: GroupId,
        members: Vec<NodeId>,
        done: oneshot::Sender<Result<(), ProposeError>>,
    },
    SnapshotPoint {
        group: GroupId,
        answer: oneshot::Sender<Option<SnapshotPoint>>,
    },
    InstallSnapshot {
        group: GroupId,
        point: SnapshotPoint,
        done: oneshot::Sender<bool>,
    },
    Status {
        group: GroupId,
        answer: oneshot::Sender<Option<GroupStatus>>,
    },
    RemoveGroup {
        group: GroupId,
    },
    Stop {
        done: oneshot::Sender<()>,
    },
}

/// Talks to a running node's task.
#[derive(Clone)]
pub struct RaftHandle {
    me: NodeId,
    commands: mpsc::Sender<Command>,
    pub counters: Arc<Counters>,
}

/// One group this node holds a replica of, and its members.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    pub group: GroupId,
    pub members: Vec<NodeId>,
}
