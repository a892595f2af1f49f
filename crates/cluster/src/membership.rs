//! Who is in the cluster and who votes: joining through the seeds, the leader admitting a
//! node (new, rejoining or replacing a dead one), changing the Raft membership, keeping
//! [`MAX_VOTERS`] voters as voters leave, and retiring a member.

use super::*;

impl ClusterMetadata {
    pub(super) async fn join(
        &self,
        seeds: &[SocketAddr],
        replacing: Option<std::net::IpAddr>,
    ) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
        let mut last_problem = String::from("no seed answered");
        loop {
            for seed in seeds {
                let answer = self
                    .transport
                    .call(
                        *seed,
                        ClusterRequest::Join {
                            member: self.me.clone(),
                            replacing,
                        },
                        Duration::from_secs(30),
                    )
                    .await;
                match answer {
                    Ok(ClusterResponse::Joined) => {
                        tracing::info!(%seed, "joined the cluster");
                        self.wait_until(|s| s.members.contains_key(&self.me.node_id()))
                            .await;
                        return Ok(());
                    }
                    Ok(ClusterResponse::Error(message)) if message.starts_with("refused") => {
                        return Err(ClusterError::Refused(message));
                    }
                    Ok(other) => last_problem = format!("{seed} answered {other:?}"),
                    Err(error) => last_problem = format!("{seed}: {error}"),
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ClusterError::Raft(format!(
                    "could not join a cluster through the seeds {seeds:?}: {last_problem}"
                )));
            }
            tracing::info!(problem = %last_problem, "waiting for a seed to let this node join");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// After a restart on a new address, tell the cluster where this node is now.
    pub(super) async fn reregister_if_moved(&self) {
        let known = self.state().members.get(&self.me.node_id()).cloned();
        let moved = known.as_ref().is_none_or(|known| {
            known.internode_address != self.me.internode_address
                || known.cql_address != self.me.cql_address
        });
        if moved {
            if let Err(error) = self.propose(Command::AddMember(self.me.clone())).await {
                tracing::warn!(%error, "could not update this node's address in the cluster");
            }
        }
    }

    /// Leader side of a join: add the node to Raft (as a voter while there are fewer than
    /// [`MAX_VOTERS`]) and to the members, as `Joining`. A node replacing a dead one first
    /// takes that one out of Raft (it would otherwise answer for it at the same address).
    pub(super) async fn admit(
        &self,
        mut member: Member,
        replacing: Option<std::net::IpAddr>,
    ) -> Result<(), ClusterError> {
        if !self.is_leader() {
            let leader = self.leader_address().ok_or(ClusterError::NoLeader)?;
            if leader == self.me.internode_address {
                return Err(ClusterError::NoLeader);
            }
            return match self
                .transport
                .call(
                    leader,
                    ClusterRequest::Join { member, replacing },
                    Duration::from_secs(30),
                )
                .await
            {
                Ok(ClusterResponse::Joined) => Ok(()),
                Ok(ClusterResponse::Error(message)) => Err(ClusterError::Refused(message)),
                Ok(other) => Err(ClusterError::Raft(format!("unexpected answer {other:?}"))),
                Err(error) => Err(ClusterError::Raft(error)),
            };
        }
        let _admission = self.admissions.lock().await;
        let state = self.state();
        if let Some(address) = replacing {
            let old = state
                .members
                .values()
                .find(|m| m.internode_address.ip() == address && m.node_id() != member.node_id());
            match old {
                Some(old) => member.replaces = Some(old.host_id),
                None if state.members.contains_key(&member.node_id()) => {}
                None => {
                    return Err(ClusterError::Refused(format!(
                        "refused: there is no member at {address} to replace"
                    )))
                }
            }
        }
        if let Some(replaced) = member
            .replaces
            .filter(|_| !state.members.contains_key(&member.node_id()))
        {
            let Some(old) = state.member_by_host(&replaced) else {
                return Err(ClusterError::Refused(format!(
                    "refused: {} replaces {replaced}, which is not a member",
                    member.internode_address
                )));
            };
            if old.node_id() == member.node_id() {
                return Err(ClusterError::Refused(
                    "refused: a node cannot replace itself".into(),
                ));
            }
            self.remove_from_raft(old.node_id()).await?;
        }
        let id = member.node_id();
        let node = BasicNode::new(member.internode_address.to_string());
        bounded("adding a learner", self.raft.add_learner(id, node, true))
            .await?
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        let voters = self.voters();
        if voters.len() < MAX_VOTERS && !voters.contains(&id) {
            self.change_members(
                "adding a voter",
                ChangeMembers::AddVoterIds(BTreeSet::from([id])),
                true,
            )
            .await?;
        }
        let mut joining = member;
        if !state.members.contains_key(&id) {
            joining.state = MemberState::Joining;
        }
        match self.propose(Command::AddMember(joining)).await? {
            CommandOutcome::Applied => Ok(()),
            CommandOutcome::Rejected(reason) => {
                Err(ClusterError::Refused(format!("refused: {reason}")))
            }
            other => Err(ClusterError::Raft(format!("{other:?}"))),
        }
    }

    /// Changes the Raft group's members (`what` names it in a timeout's message);
    /// `retain`: a removed voter stays as a learner.
    pub(super) async fn change_members(
        &self,
        what: &str,
        change: ChangeMembers<NodeId, BasicNode>,
        retain: bool,
    ) -> Result<(), ClusterError> {
        bounded(what, self.raft.change_membership(change, retain))
            .await?
            .map_err(|e| ClusterError::Raft(e.to_string()))?;
        Ok(())
    }

    /// Takes `node` out of the Raft group (as a voter and as a learner). Leader only.
    pub(super) async fn remove_from_raft(&self, node: NodeId) -> Result<(), ClusterError> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        if membership.voter_ids().any(|v| v == node) {
            self.change_members(
                "removing a voter",
                ChangeMembers::RemoveVoters(BTreeSet::from([node])),
                false,
            )
            .await?;
        } else if membership.get_node(&node).is_some() {
            self.change_members(
                "removing a learner",
                ChangeMembers::RemoveNodes(BTreeSet::from([node])),
                false,
            )
            .await?;
        }
        Ok(())
    }

    /// Promotes learners among `candidates` (in order) until the group has
    /// [`MAX_VOTERS`] voters or none is left. Leader only; the caller names live members.
    pub async fn fill_voters(&self, candidates: &[NodeId]) -> Result<(), ClusterError> {
        let _admission = self.admissions.lock().await;
        for candidate in candidates {
            let voters = self.voters();
            if voters.len() >= MAX_VOTERS {
                break;
            }
            let is_learner = self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(candidate)
                .is_some();
            if voters.contains(candidate) || !is_learner {
                continue;
            }
            tracing::info!(
                node = format!("{candidate:016x}"),
                "promoting a learner to metadata voter"
            );
            self.change_members(
                "promoting a learner",
                ChangeMembers::AddVoterIds(BTreeSet::from([*candidate])),
                true,
            )
            .await?;
        }
        Ok(())
    }

    /// Makes the learner `node` a voter even when the group is full: a voter about to
    /// leave is replaced this way before it goes. Leader only.
    pub async fn promote(&self, node: NodeId) -> Result<(), ClusterError> {
        let _admission = self.admissions.lock().await;
        if self.voters().contains(&node) {
            return Ok(());
        }
        self.change_members(
            "promoting a learner",
            ChangeMembers::AddVoterIds(BTreeSet::from([node])),
            true,
        )
        .await?;
        Ok(())
    }

    /// Takes a member that holds nothing any more out of the cluster: out of the members
    /// (so it learns it has left, if it is still listening), then out of Raft once it has
    /// had a chance to apply that (bounded wait). Leader only; voters are replaced with
    /// [`ClusterMetadata::fill_voters`] first.
    pub async fn retire(&self, host: HostId) -> Result<CommandOutcome, ClusterError> {
        let node = node_id_of(&host);
        let outcome = self.propose(Command::RemoveMember(host)).await?;
        if outcome != CommandOutcome::Applied {
            return Ok(outcome);
        }
        let removed_at = self.raft.metrics().borrow().last_applied.map(|l| l.index);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            let caught_up = self
                .raft
                .metrics()
                .borrow()
                .replication
                .as_ref()
                .and_then(|r| r.get(&node).cloned())
                .flatten()
                .map(|l| l.index)
                >= removed_at;
            if caught_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _admission = self.admissions.lock().await;
        self.remove_from_raft(node).await?;
        Ok(outcome)
    }

    /// Metadata voters (Raft ids).
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }
}
