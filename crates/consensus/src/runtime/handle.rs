//! [`RaftHandle`]: how callers talk to a running node's task — each call is a command on
//! the bounded channel and, where it needs one, an answer on a oneshot.

use super::*;

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
