//! Elections: pre-votes, votes and the leader stickiness that makes leases safe (a
//! follower that heard from its leader within an election timeout refuses every vote),
//! becoming leader or follower, and stepping down.

use super::{MultiRaft, Output};
use crate::group::{Leadership, Progress, Role};
use crate::log::Entry;
use crate::message::{Message, VoteReply, VoteRequest};
use crate::{GroupId, HardState, Millis, NodeId, Term};
use bytes::Bytes;
use rand::Rng;
use std::collections::BTreeSet;

impl MultiRaft {
    pub(super) fn receive_vote_request(&mut self, from: NodeId, request: VoteRequest) {
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

    pub(super) fn receive_vote_reply(&mut self, from: NodeId, reply: VoteReply) {
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
    pub(super) fn start_pre_vote(&mut self, id: GroupId) {
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
    pub(super) fn start_election(&mut self, id: GroupId) {
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

    pub(super) fn become_leader(&mut self, id: GroupId) {
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
    pub(super) fn become_follower(&mut self, id: GroupId, term: Term, leader: Option<NodeId>) {
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
    pub(super) fn step_down(&mut self, id: GroupId, leader: Option<NodeId>) {
        let term = match self.groups.get(&id) {
            Some(group) => group.hard_state.term,
            None => return,
        };
        self.become_follower(id, term, leader);
    }

    pub(super) fn election_deadline(&mut self) -> Millis {
        let timeout = self.config.election_timeout_ms;
        self.now
            .plus(timeout + self.rng.random_range(0..timeout.max(1)))
    }
}
