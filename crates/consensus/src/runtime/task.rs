//! The node's task and its log thread: the task owns the [`MultiRaft`], takes commands,
//! ticks, hands durable batches to the log thread and performs what the protocol asks
//! (messages, applies, answers to proposals and reads).

use super::*;

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
pub(super) fn restore_group(
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
pub(super) type ToLog = (PersistBatch, bool);

/// The log thread: every batch waiting is written with one sync (a group holding a
/// checkpoint starts a new segment and deletes the earlier ones once durable).
pub(super) fn write_log(
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
pub(super) type Waiting = (Term, ProposalAnswer);
/// Where a proposer hears whether its entry was committed.
pub(super) type ProposalAnswer = oneshot::Sender<Result<(), ProposeError>>;
/// A settled read's group, the index it waits for and where its answer goes.
pub(super) type SettledRead = (
    GroupId,
    Proposal,
    oneshot::Sender<Result<Proposal, NotLeader>>,
);

/// A read-index request answered once the outputs of the commands handled with it are
/// performed (so the state machine has applied what the index covers).
pub(super) type ReadAnswer = (
    oneshot::Sender<Result<LogIndex, NotLeader>>,
    Result<LogIndex, NotLeader>,
);

pub(super) struct NodeTask {
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
    pub(super) async fn run(
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
