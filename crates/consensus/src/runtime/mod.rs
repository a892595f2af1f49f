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

pub mod log_file;
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

impl RaftHandle {
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// Proposes `payload` to `group` and waits until it is committed and applied here.
    pub async fn propose(&self, group: GroupId, payload: Bytes) -> Result<(), ProposeError> {
        self.propose_in_term(group, payload, None).await
    }

    /// [`RaftHandle::propose`], refused ([`ProposeError::NotLeader`]) unless the node still
    /// leads `group` in `term` (a read made under [`RaftHandle::settled_read`] holds).
    pub async fn propose_in_term(
        &self,
        group: GroupId,
        payload: Bytes,
        term: Option<Term>,
    ) -> Result<(), ProposeError> {
        let (done, result) = oneshot::channel();
        self.commands
            .send(Command::Propose {
                group,
                payload,
                term,
                done,
            })
            .await
            .map_err(|_| ProposeError::Stopped)?;
        result.await.unwrap_or(Err(ProposeError::Stopped))
    }

    /// Hands in a message from `from` (the transport calls this, in arrival order);
    /// `false` once the node has stopped (the transport then closes the connection).
    pub async fn receive(&self, from: NodeId, message: Message) -> bool {
        self.commands
            .send(Command::Receive { from, message })
            .await
            .is_ok()
    }

    /// Which node leads `group`, as this node knows.
    pub async fn leader(&self, group: GroupId) -> Option<NodeId> {
        let (answer, result) = oneshot::channel();
        self.commands
            .send(Command::Leader { group, answer })
            .await
            .ok()?;
        result.await.ok().flatten()
    }

    /// Stops the node: its task ends and its log thread finishes the write under way and
    /// closes the file; proposals still waiting fail with [`ProposeError::Stopped`].
    pub async fn stop(&self) {
        let (done, stopped) = oneshot::channel();
        if self.commands.send(Command::Stop { done }).await.is_ok() {
            let _ = stopped.await;
        }
    }

    /// Adds this node's replica of a group (a no-op for one it holds already), with what
    /// the log file kept of it from before a restart.
    pub async fn add_group(&self, spec: GroupSpec) -> bool {
        self.commands.send(Command::AddGroup { spec }).await.is_ok()
    }

    /// Drops this node's replica of `group`; proposals waiting on it fail with
    /// [`ProposeError::Stopped`].
    pub async fn remove_group(&self, group: GroupId) -> bool {
        self.commands
            .send(Command::RemoveGroup { group })
            .await
            .is_ok()
    }

    /// Proposes that `members` become `group`'s members (this node must lead it; see
    /// [`MultiRaft::change_members`]) and waits until the change is committed and applied
    /// here.
    pub async fn change_members(
        &self,
        group: GroupId,
        members: Vec<NodeId>,
    ) -> Result<(), ProposeError> {
        let (done, result) = oneshot::channel();
        self.commands
            .send(Command::ChangeMembers {
                group,
                members,
                done,
            })
            .await
            .map_err(|_| ProposeError::Stopped)?;
        result.await.unwrap_or(Err(ProposeError::Stopped))
    }

    /// Where `group`'s state machine stands here (`None`: no replica here). Data read
    /// from the state machine after this answers holds everything up to its index.
    pub async fn snapshot_point(&self, group: GroupId) -> Option<SnapshotPoint> {
        let (answer, result) = oneshot::channel();
        self.commands
            .send(Command::SnapshotPoint { group, answer })
            .await
            .ok()?;
        result.await.ok().flatten()
    }

    /// Installs a snapshot taken at `point` on this node's replica of `group`, whose
    /// data the caller has made durable in the state machine already; `false` when the
    /// group is not here or had applied that far already.
    pub async fn install_snapshot(&self, group: GroupId, point: SnapshotPoint) -> bool {
        let (done, result) = oneshot::channel();
        if self
            .commands
            .send(Command::InstallSnapshot { group, point, done })
            .await
            .is_err()
        {
            return false;
        }
        result.await.unwrap_or(false)
    }

    /// This node's view of `group` (`None`: no replica here).
    pub async fn status(&self, group: GroupId) -> Option<GroupStatus> {
        let (answer, result) = oneshot::channel();
        self.commands
            .send(Command::Status { group, answer })
            .await
            .ok()?;
        result.await.ok().flatten()
    }

    /// The index a linearizable read must see applied, if this node may serve one now.
    /// When it answers, the state machine has applied every entry up to that index: a read
    /// of it from here on is linearizable.
    /// Answers once every entry this leader's log held when asked is applied here, with
    /// that index and the term a proposal depending on the read must be made in
    /// ([`RaftHandle::propose_in_term`]): what a conditional write reads before it decides
    /// what to propose (see [`MultiRaft::settled_read`]).
    pub async fn settled_read(&self, group: GroupId) -> Result<Proposal, NotLeader> {
        let (answer, result) = oneshot::channel();
        let stopped = NotLeader { leader: None };
        self.commands
            .send(Command::SettledRead { group, answer })
            .await
            .map_err(|_| stopped)?;
        result.await.unwrap_or(Err(stopped))
    }

    pub async fn read_index(&self, group: GroupId) -> Result<LogIndex, NotLeader> {
        let (answer, result) = oneshot::channel();
        let stopped = NotLeader { leader: None };
        self.commands
            .send(Command::ReadIndex { group, answer })
            .await
            .map_err(|_| stopped)?;
        result.await.unwrap_or(Err(stopped))
    }
}

/// One group this node holds a replica of, and its members.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    pub group: GroupId,
    pub members: Vec<NodeId>,
}

/// Opens the node's epoch log in `directory`, restores its groups and starts its task
/// (and its log thread) on the current Tokio runtime.
pub fn start(
    me: NodeId,
    options: NodeOptions,
    directory: PathBuf,
    groups: Vec<GroupSpec>,
    transport: Arc<dyn Transport>,
    state_machine: Box<dyn StateMachine>,
) -> std::io::Result<RaftHandle> {
    let (log_file, recovered) = EpochLogFile::open(&directory)?;
    let started = Instant::now();
    // Epochs never repeat across restarts: start above anything the file holds, with room
    // for epochs sealed before a crash but never written.
    let first_epoch = Epoch((recovered.last_epoch.0 >> 32).saturating_add(1) << 32);
    let mut raft = MultiRaft::new(
        me,
        options.raft.clone(),
        first_epoch,
        options.seed,
        Millis(0),
    );
    let mut recovered = recovered;
    let mut state_machine = state_machine;
    for spec in groups {
        restore_group(&mut raft, &mut recovered, state_machine.as_mut(), spec);
    }
    let counters = Arc::new(Counters::default());
    let (commands_tx, commands) = mpsc::channel(COMMAND_QUEUE);
    let (batches_tx, batches) = mpsc::channel::<ToLog>(options.max_persists_in_flight);
    let (persisted_tx, persisted) =
        mpsc::channel::<Result<Epoch, String>>(options.max_persists_in_flight + 1);
    let log_counters = Arc::clone(&counters);
    let log_thread = std::thread::Builder::new()
        .name("consensus-log".into())
        .spawn(move || write_log(log_file, batches, persisted_tx, log_counters))?;
    let node = NodeTask {
        checkpoint_epoch: None,
        log_bytes_at_checkpoint: 0,
        recovered_bytes: recovered.segment_bytes,
        recovered,
        read_answers: Vec::new(),
        settling: Vec::new(),
        raft,
        started,
        options,
        transport,
        state_machine,
        batches: batches_tx,
        persists_in_flight: 0,
        waiting: HashMap::new(),
        counters: Arc::clone(&counters),
        failed: false,
        log_thread,
    };
    tokio::spawn(node.run(commands, persisted));
    Ok(RaftHandle {
        me,
        commands: commands_tx,
        counters,
    })
}

/// Adds `spec`'s group to `raft` with what the log file kept of it (taken from
/// `recovered`): its term and vote, its log, and the snapshot the log starts after — its
/// members then, and the state machine's record of it, handed back to `state_machine`.
fn restore_group(
    raft: &mut MultiRaft,
    recovered: &mut Recovered,
    state_machine: &mut dyn StateMachine,
    spec: GroupSpec,
) {
    if raft.group(spec.group).is_some() {
        return;
    }
    let hard_state = recovered
        .hard_states
        .remove(&spec.group)
        .unwrap_or_default();
    let log = recovered.take_log(spec.group);
    let members = match recovered.snapshots.remove(&spec.group) {
        Some(snapshot) => {
            state_machine.restore_state(spec.group, &snapshot.state);
            snapshot.members
        }
        None => spec.members,
    };
    raft.add_group(spec.group, members, hard_state, log);
}

/// A batch for the log thread, and whether it holds a checkpoint.
type ToLog = (PersistBatch, bool);

/// The log thread: every batch waiting is written with one sync (a group holding a
/// checkpoint starts a new segment and deletes the earlier ones once durable).
fn write_log(
    mut file: EpochLogFile,
    mut batches: mpsc::Receiver<ToLog>,
    persisted: mpsc::Sender<Result<Epoch, String>>,
    counters: Arc<Counters>,
) {
    while let Some(first) = batches.blocking_recv() {
        let mut checkpoint = first.1;
        let mut group = vec![first.0];
        while let Ok((next, is_checkpoint)) = batches.try_recv() {
            checkpoint |= is_checkpoint;
            group.push(next);
        }
        let last = group.last().map_or(Epoch(0), |batch| batch.epoch);
        let result = if group.iter().all(PersistBatch::is_empty) {
            Ok(())
        } else {
            let before = file.bytes_written;
            let result = if checkpoint {
                file.append_checkpoint(&group)
            } else {
                file.append(&group)
            };
            counters.log_syncs.fetch_add(1, Ordering::Relaxed);
            counters
                .log_bytes
                .fetch_add(file.bytes_written - before, Ordering::Relaxed);
            result
        };
        let report = result.map(|()| last).map_err(|error| error.to_string());
        let failed = report.is_err();
        if persisted.blocking_send(report).is_err() || failed {
            // A failed sync may have lost writes it cannot name: nothing after it is
            // reported durable (the node stops acknowledging).
            return;
        }
    }
}

/// A proposal's term and whom to tell once its index is applied.
type Waiting = (Term, ProposalAnswer);
/// Where a proposer hears whether its entry was committed.
type ProposalAnswer = oneshot::Sender<Result<(), ProposeError>>;
/// A settled read's group, the index it waits for and where its answer goes.
type SettledRead = (
    GroupId,
    Proposal,
    oneshot::Sender<Result<Proposal, NotLeader>>,
);

/// A read-index request answered once the outputs of the commands handled with it are
/// performed (so the state machine has applied what the index covers).
type ReadAnswer = (
    oneshot::Sender<Result<LogIndex, NotLeader>>,
    Result<LogIndex, NotLeader>,
);

struct NodeTask {
    raft: MultiRaft,
    /// What the log file held of groups not added yet.
    recovered: Recovered,
    read_answers: Vec<ReadAnswer>,
    /// Settled reads ([`RaftHandle::settled_read`]) waiting for their index to be applied.
    settling: Vec<SettledRead>,
    started: Instant,
    options: NodeOptions,
    transport: Arc<dyn Transport>,
    state_machine: Box<dyn StateMachine>,
    batches: mpsc::Sender<ToLog>,
    persists_in_flight: usize,
    /// The epoch that carries the checkpoint recorded last, until it is sealed.
    checkpoint_epoch: Option<Epoch>,
    /// The log bytes written when the last checkpoint was recorded.
    log_bytes_at_checkpoint: u64,
    /// The size of the log file's segments when the node started.
    recovered_bytes: u64,
    /// Proposals waiting for their index to be applied.
    waiting: HashMap<(GroupId, LogIndex), Waiting>,
    counters: Arc<Counters>,
    /// The log failed: the node no longer seals (nothing more becomes durable).
    failed: bool,
    log_thread: std::thread::JoinHandle<()>,
}

impl NodeTask {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut persisted: mpsc::Receiver<Result<Epoch, String>>,
    ) {
        let mut ticker = tokio::time::interval(self.options.tick_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopped_by = None;
        while stopped_by.is_none() {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    stopped_by = self.handle(command);
                    for _ in 1..COMMANDS_PER_TURN {
                        if stopped_by.is_some() {
                            break;
                        }
                        match commands.try_recv() {
                            Ok(command) => stopped_by = self.handle(command),
                            Err(_) => break,
                        }
                    }
                }
                report = persisted.recv() => {
                    let Some(report) = report else { break };
                    self.persists_in_flight = self.persists_in_flight.saturating_sub(1);
                    while let Ok(more) = persisted.try_recv() {
                        self.persists_in_flight = self.persists_in_flight.saturating_sub(1);
                        self.persisted(more);
                    }
                    self.persisted(report);
                }
                _ = ticker.tick() => {
                    let now = self.now();
                    self.raft.tick(now);
                }
            }
            if stopped_by.is_some() {
                break;
            }
            self.perform();
            self.checkpoint_when_due();
            while !self.failed
                && self.persists_in_flight < self.options.max_persists_in_flight
                && self.raft.wants_seal()
            {
                let now = self.now();
                self.raft.advance_clock(now);
                self.raft.seal();
                self.counters.epochs_sealed.fetch_add(1, Ordering::Relaxed);
                self.perform();
            }
        }
        let NodeTask {
            waiting,
            batches,
            log_thread,
            ..
        } = self;
        for (_, (_, done)) in waiting {
            let _ = done.send(Err(ProposeError::Stopped));
        }
        // The log thread ends once its queue is closed and drained.
        drop(batches);
        drop(persisted);
        let _ = tokio::task::spawn_blocking(move || log_thread.join()).await;
        if let Some(done) = stopped_by {
            let _ = done.send(());
        }
    }

    fn now(&self) -> Millis {
        Millis(self.started.elapsed().as_millis() as u64)
    }

    /// Records a checkpoint in the next epoch once enough log was written since the last
    /// one: the state machine makes what it applied durable (everything the protocol
    /// applied is performed by now), then the protocol records every group's state.
    fn checkpoint_when_due(&mut self) {
        // Segments from before a restart count as written.
        let written = self.counters.log_bytes.load(Ordering::Relaxed) + self.recovered_bytes;
        if self.failed
            || self.checkpoint_epoch.is_some()
            || written.saturating_sub(self.log_bytes_at_checkpoint)
                < self.options.checkpoint_after_bytes
        {
            return;
        }
        self.log_bytes_at_checkpoint = written;
        if let Err(error) = self.state_machine.make_durable() {
            tracing::warn!(%error, "the state machine could not make its data durable: no checkpoint this time");
            return;
        }
        let machine = &self.state_machine;
        self.raft.record_checkpoint(
            &mut |group| machine.snapshot_state(group),
            self.recovered.checkpoint_writes(),
        );
        self.checkpoint_epoch = Some(self.raft.next_epoch());
    }

    fn persisted(&mut self, report: Result<Epoch, String>) {
        match report {
            Ok(epoch) => self.raft.persisted(epoch),
            Err(error) => {
                tracing::error!(%error, "the consensus log failed; this node stops acknowledging");
                self.failed = true;
            }
        }
    }

    /// Appends an entry with `propose` (unless the log failed) and has `done` told once
    /// its index is applied: whether that entry is the one committed there.
    fn propose_and_wait(
        &mut self,
        group: GroupId,
        done: oneshot::Sender<Result<(), ProposeError>>,
        propose: impl FnOnce(&mut MultiRaft) -> Result<Proposal, ProposeError>,
    ) {
        if self.failed {
            let _ = done.send(Err(ProposeError::Stopped));
            return;
        }
        match propose(&mut self.raft) {
            Ok(proposal) => {
                self.waiting
                    .insert((group, proposal.index), (proposal.term, done));
            }
            Err(error) => {
                let _ = done.send(Err(error));
            }
        }
    }

    /// Handles one command; a stop request is handed back to end the task.
    fn handle(&mut self, command: Command) -> Option<oneshot::Sender<()>> {
        match command {
            Command::Propose {
                group,
                payload,
                term,
                done,
            } => self.propose_and_wait(group, done, |raft| {
                raft.propose_in_term(group, payload, term)
                    .map_err(|not_leader| ProposeError::NotLeader(not_leader.leader))
            }),
            Command::SettledRead { group, answer } => match self.raft.settled_read(group) {
                Ok(point) => self.settling.push((group, point, answer)),
                Err(not_leader) => {
                    let _ = answer.send(Err(not_leader));
                }
            },
            Command::Receive { from, message } => {
                let now = self.now();
                self.raft.advance_clock(now);
                self.raft.receive(from, message);
            }
            Command::Leader { group, answer } => {
                let leader = self.raft.group(group).and_then(|state| {
                    if state.is_leader() {
                        Some(self.raft.id())
                    } else {
                        state.leader()
                    }
                });
                let _ = answer.send(leader);
            }
            Command::ReadIndex { group, answer } => {
                let index = self.raft.read_index(group);
                self.read_answers.push((answer, index));
            }
            Command::AddGroup { spec } => {
                restore_group(
                    &mut self.raft,
                    &mut self.recovered,
                    self.state_machine.as_mut(),
                    spec,
                );
            }
            Command::ChangeMembers {
                group,
                members,
                done,
            } => self.propose_and_wait(group, done, |raft| {
                raft.change_members(group, members)
                    .map_err(|refused| match refused {
                        MembershipRefused::NotLeader(not_leader) => {
                            ProposeError::NotLeader(not_leader.leader)
                        }
                        refused => ProposeError::Membership(refused),
                    })
            }),
            Command::SnapshotPoint { group, answer } => {
                let point = self.raft.group(group).and_then(|state| {
                    Some(SnapshotPoint {
                        index: state.applied,
                        term: state.log.term_at(state.applied)?,
                        members: state.members_at(state.applied),
                        state: self.state_machine.snapshot_state(group),
                    })
                });
                let _ = answer.send(point);
            }
            Command::InstallSnapshot { group, point, done } => {
                let state = point.state.clone();
                let installed = self.raft.install_snapshot(
                    group,
                    point.index,
                    point.term,
                    point.members,
                    point.state,
                );
                if installed {
                    self.state_machine.restore_state(group, &state);
                }
                let _ = done.send(installed);
            }
            Command::Status { group, answer } => {
                let me = self.raft.id();
                let status = self.raft.group(group).map(|state| GroupStatus {
                    members: state.members.clone(),
                    is_leader: state.is_leader(),
                    applied: state.applied,
                    members_settled: state
                        .last_member_change()
                        .is_none_or(|at| at <= state.commit),
                    matched: match &state.role {
                        crate::Role::Leader(leadership) => leadership
                            .progress
                            .iter()
                            .filter(|(peer, _)| **peer != me)
                            .map(|(peer, progress)| (*peer, progress.matched))
                            .collect(),
                        _ => Vec::new(),
                    },
                });
                let _ = answer.send(status);
            }
            Command::RemoveGroup { group } => {
                if let Some(removed) = self.raft.remove_group(group) {
                    // Its term and vote stay (a vote is never cast twice in a term, should
                    // the group come back here); its log and snapshot were forgotten.
                    self.recovered.hard_states.insert(group, removed.hard_state);
                }
                let doomed: Vec<(GroupId, LogIndex)> = self
                    .waiting
                    .keys()
                    .filter(|(waiting_group, _)| *waiting_group == group)
                    .copied()
                    .collect();
                for key in doomed {
                    if let Some((_, done)) = self.waiting.remove(&key) {
                        let _ = done.send(Err(ProposeError::Stopped));
                    }
                }
            }
            Command::Stop { done } => return Some(done),
        }
        None
    }

    /// Performs every output the protocol produced.
    fn perform(&mut self) {
        // Proposers hear of their entries once the turn's entries are applied together.
        let mut decided: Vec<(ProposalAnswer, Result<(), ProposeError>)> = Vec::new();
        let mut applied_any = false;
        for output in self.raft.take_outputs() {
            match output {
                Output::Persist(batch) => {
                    self.persists_in_flight += 1;
                    let checkpoint = self.checkpoint_epoch == Some(batch.epoch);
                    if checkpoint {
                        self.checkpoint_epoch = None;
                    }
                    if self.batches.try_send((batch, checkpoint)).is_err() {
                        // Cannot happen while persists_in_flight is respected; treat it as
                        // a failed log rather than lose a write silently.
                        tracing::error!("the consensus log queue overflowed");
                        self.failed = true;
                    }
                }
                Output::Send { to, message } => {
                    if !self.transport.send(to, &message) {
                        if let Message::Epoch(batch) = &message {
                            self.raft.lost(to, batch.epoch);
                        }
                    }
                }
                Output::Apply {
                    group,
                    index,
                    entry,
                } => {
                    let mut applied = Applied::Done;
                    if entry.kind == EntryKind::Data && !entry.payload.is_empty() {
                        applied = self.state_machine.apply(group, index, &entry.payload);
                        applied_any = true;
                    }
                    self.counters
                        .entries_committed
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some((term, done)) = self.waiting.remove(&(group, index)) {
                        let result = if term != entry.term {
                            Err(ProposeError::Superseded)
                        } else if applied == Applied::Refused {
                            Err(ProposeError::Refused)
                        } else {
                            Ok(())
                        };
                        decided.push((done, result));
                    }
                }
                Output::LeaderChanged { .. } => {}
            }
        }
        if applied_any {
            self.state_machine.finish_applying();
        }
        for (done, result) in decided {
            let _ = done.send(result);
        }
        for (answer, index) in self.read_answers.drain(..) {
            let _ = answer.send(index);
        }
        if !self.settling.is_empty() {
            for (group, point, answer) in std::mem::take(&mut self.settling) {
                match self.raft.group(group) {
                    // Nobody waits for it any more (the reader gave up).
                    _ if answer.is_closed() => {}
                    Some(state) if state.applied < point.index => {
                        self.settling.push((group, point, answer))
                    }
                    Some(_) => {
                        let _ = answer.send(Ok(point));
                    }
                    None => {
                        let _ = answer.send(Err(NotLeader { leader: None }));
                    }
                }
            }
        }
    }
}
