//! Replication through epochs: sealing an epoch (one persist batch, one batch per
//! follower), shipping it within each peer's window, receiving appends and
//! acknowledgements, advancing the commit index, applying, and resending what a peer lost.

use super::{append_due, MultiRaft, Output, PersistBatch, Sealed, SentAppend, SentEpoch};
use crate::group::{Progress, Role};
use crate::message::{Append, EpochAck, EpochBatch, Message, Refusal, RefusalReason};
use crate::{Epoch, GroupId, LogIndex, NodeId, Term};
use std::collections::{BTreeMap, BTreeSet};

impl MultiRaft {
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

    pub(super) fn window_open(&self, peer: NodeId) -> bool {
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
    pub(super) fn ship(&mut self, epoch: Epoch) {
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

    pub(super) fn receive_epoch(&mut self, from: NodeId, batch: EpochBatch) {
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

    pub(super) fn receive_append(
        &mut self,
        from: NodeId,
        append: Append,
    ) -> Result<(), RefusalReason> {
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

    pub(super) fn receive_ack(&mut self, from: NodeId, ack: EpochAck) {
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
    pub(super) fn forget_applied(&mut self, id: GroupId, through: LogIndex) {
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
    pub(super) fn progress_mut(
        &mut self,
        id: GroupId,
        term: Term,
        peer: NodeId,
    ) -> Option<&mut Progress> {
        let group = self.groups.get_mut(&id)?;
        if group.hard_state.term != term {
            return None;
        }
        let Role::Leader(leadership) = &mut group.role else {
            return None;
        };
        leadership.progress.get_mut(&peer)
    }

    pub(super) fn resend_from_matched(&mut self, id: GroupId, peer: NodeId) {
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
    pub(super) fn resend_all_to(&mut self, peer: NodeId) {
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
    pub(super) fn advance_commit(&mut self, id: GroupId) {
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

    pub(super) fn apply_committed(&mut self, id: GroupId) {
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
}
