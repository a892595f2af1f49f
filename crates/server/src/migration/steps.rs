//! The steps of one migration, driven by its own task ([`MigrationDriver::drive`]): each
//! re-reads the metadata, acts only if the migration is still at the stage it expected,
//! and commits the next stage (the stages and what they mean to requests are
//! `shoal_placement::tablet`'s; the order and the reasons, decision 0009).

use crate::internode::{Message, Reply};
use crate::streaming::{StreamReply, StreamRequest, TabletKeys};
use crate::strong::{StrongReply, StrongRequest, StrongTables, WireStatus};
use shoal_cluster::{ClusterState, Command, CommandOutcome, Member, MemberState};
use shoal_model::{HostId, TableId, TabletId};
use shoal_placement::{MigrationId, MigrationStage, Transition};
use shoal_replication::barrier::{missed_nothing, BarrierAnswers};
use std::net::SocketAddr;
use std::time::Duration;

use super::{
    address_of, MigrationDriver, Step, BARRIER_BOUND, CATCH_UP_BOUND, CAUGHT_UP_SLACK,
    RECEIVE_CALL, RETRY_FIRST, RETRY_MAX, STALLED_STREAM_REPORT,
};

impl MigrationDriver {
    /// Drives one migration until it ends (or another leader takes over).
    pub(super) async fn drive(&self, table: TableId, tablet: TabletId, migration: MigrationId) {
        let mut retry = RETRY_FIRST;
        loop {
            if !self.metadata.is_leader() {
                return;
            }
            match self.step(table, tablet, migration).await {
                Ok(true) => retry = RETRY_FIRST,
                Ok(false) | Err(Step::Gone) => return,
                Err(Step::Retry(reason)) => {
                    tracing::info!(%table, tablet = tablet.0, %migration, %reason, ?retry, "migration step will be retried");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Takes the migration's next step: `Ok(true)` when it moved on, `Ok(false)` when it
    /// has ended.
    async fn step(
        &self,
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
    ) -> Result<bool, Step> {
        let state = self.metadata.state();
        let Some(placement) = state.tables.get(&table) else {
            return Ok(false);
        };
        let Some(current) = placement.tablets.get(tablet) else {
            return Ok(false);
        };
        let Some(transition) = current.transition.clone().filter(|t| t.id == migration) else {
            return Ok(false);
        };
        let (after, last) = placement.tablets.bounds_of(tablet).ok_or(Step::Gone)?;
        let tablet_keys = TabletKeys { table, after, last };
        let pending_member = transition
            .pending
            .and_then(|h| state.member_by_host(&h).cloned());
        let strong = self.strong.is_strong(&table);
        // A pending replica that died takes the migration back, as long as the replica set
        // has not switched.
        if transition.stage != MigrationStage::Cleanup {
            if let Some(pending) = &pending_member {
                if !self.alive(&pending.host_id) {
                    tracing::info!(%table, tablet = tablet.0, %migration, node = %pending.internode_address, "the node receiving the tablet is down: aborting the migration");
                    if strong {
                        self.leave_group(table, current, pending.host_id).await?;
                    }
                    self.end(table, tablet, migration, true).await?;
                    return Ok(false);
                }
            }
        }
        match transition.stage {
            MigrationStage::WriteBoth if strong => {
                if let Some(pending) = &pending_member {
                    self.join_group(&state, current, pending, migration, tablet_keys)
                        .await?;
                }
                self.advance(table, tablet, migration, MigrationStage::Streamed)
                    .await
            }
            // Its writes go through the tablet's Raft group, which the new replica has
            // joined: nothing was acknowledged without it.
            MigrationStage::Streamed if strong => {
                self.advance(table, tablet, migration, MigrationStage::ReadNew)
                    .await
            }
            MigrationStage::ReadNew if strong => {
                if let Some(leaving) = transition.leaving {
                    self.leave_group(table, current, leaving).await?;
                }
                self.advance(table, tablet, migration, MigrationStage::Cleanup)
                    .await
            }
            MigrationStage::Allocated => {
                let pending = pending_member.ok_or(Step::Gone)?;
                self.stream_call(
                    &pending,
                    StreamRequest::Prepare {
                        tablet: tablet_keys,
                        // A strongly consistent tablet arrives by its Raft group, whose
                        // log goes on applying writes after the snapshot: nothing waits
                        // for a stream's end to release them.
                        stage_writes: !strong,
                    },
                    BARRIER_BOUND,
                )
                .await?;
                // What every node has missed so far: `Streamed` compares against it.
                if !strong {
                    let answers = self.barrier(&state).await?;
                    self.before_write_both.lock().insert(migration, answers);
                }
                self.advance(table, tablet, migration, MigrationStage::WriteBoth)
                    .await
            }
            MigrationStage::WriteBoth => {
                self.barrier(&state).await?;
                if let Some(pending) = &pending_member {
                    let sources = self.sources(&state, current.replicas.as_slice(), &transition)?;
                    self.receive(pending, tablet, migration, tablet_keys, sources)
                        .await?;
                }
                self.advance(table, tablet, migration, MigrationStage::Streamed)
                    .await
            }
            MigrationStage::Streamed => {
                // Drains every write that did not wait for the pending replica.
                let answers = self.barrier(&state).await?;
                if let Some(pending) = &pending_member {
                    if let Err(reason) = self.nothing_missed(&state, migration, &answers, pending) {
                        // Every write from the barrier on waited for it: a stream from a
                        // snapshot taken now brings whatever it missed before.
                        tracing::info!(%table, tablet = tablet.0, %migration, %reason, "the new replica may have missed writes: streaming the tablet to it again");
                        let sources =
                            self.sources(&state, current.replicas.as_slice(), &transition)?;
                        self.receive(pending, tablet, migration, tablet_keys, sources)
                            .await?;
                    }
                }
                self.advance(table, tablet, migration, MigrationStage::ReadNew)
                    .await
            }
            MigrationStage::ReadNew => {
                self.barrier(&state).await?;
                self.advance(table, tablet, migration, MigrationStage::Cleanup)
                    .await
            }
            MigrationStage::Cleanup => {
                self.barrier(&state).await?;
                let leaving = transition
                    .leaving
                    .and_then(|h| state.member_by_host(&h).cloned());
                if let Some(leaving) = leaving.filter(|m| self.alive(&m.host_id)) {
                    self.stream_call(
                        &leaving,
                        StreamRequest::Drop {
                            tablet: tablet_keys,
                        },
                        BARRIER_BOUND,
                    )
                    .await?;
                }
                self.end(table, tablet, migration, false).await?;
                Ok(false)
            }
        }
    }

    /// A strongly consistent tablet's pending replica joins its Raft group: the leader
    /// adds it as a member (a single-server change), it installs a snapshot — the tablet's
    /// data streamed from the leader after the leader named the index that data covers —
    /// and catches up from the log after it. Each part is skipped when already done.
    async fn join_group(
        &self,
        state: &ClusterState,
        tablet: &shoal_placement::Tablet,
        pending: &Member,
        migration: MigrationId,
        keys: TabletKeys,
    ) -> Result<(), Step> {
        let target = StrongTables::tablet_group(&keys.table, tablet);
        let newcomer = pending.host_id;
        let status = self
            .strong
            .leader_status(&target)
            .await
            .map_err(Step::Retry)?;
        if !status.members.contains(&newcomer.0) {
            if !status.members_settled {
                return Err(Step::Retry(
                    "an earlier membership change of the group is still committing".into(),
                ));
            }
            self.strong
                .change_members(&target, Some(newcomer), None)
                .await
                .map_err(Step::Retry)?;
        }
        let here = self.replica_status(newcomer, &target).await?;
        if here.applied == 0 {
            let leader = HostId(status.replica);
            let point = match self
                .strong
                .on_node(
                    leader,
                    StrongRequest::SnapshotPoint {
                        group: target.group.0,
                    },
                )
                .await
            {
                Some(StrongReply::Snapshot(point)) => point,
                other => return Err(Step::Retry(format!("no snapshot point: {other:?}"))),
            };
            let source = address_of(state, &leader)
                .ok_or_else(|| Step::Retry("the leader is not a member".into()))?;
            self.receive(pending, tablet.id, migration, keys, vec![source])
                .await?;
            match self
                .strong
                .on_node(
                    newcomer,
                    StrongRequest::Install {
                        group: target.group.0,
                        point,
                    },
                )
                .await
            {
                Some(StrongReply::Applied) => {}
                other => return Err(Step::Retry(format!("snapshot not installed: {other:?}"))),
            }
        }
        // Caught up: it has applied what the leader had when it was added (or later).
        let started = tokio::time::Instant::now();
        loop {
            let status = self
                .strong
                .leader_status(&target)
                .await
                .map_err(Step::Retry)?;
            let here = self.replica_status(newcomer, &target).await?;
            if status.members.contains(&newcomer.0)
                && status.members_settled
                && here.applied >= status.applied.saturating_sub(CAUGHT_UP_SLACK)
            {
                return Ok(());
            }
            if started.elapsed() > CATCH_UP_BOUND {
                return Err(Step::Retry(format!(
                    "the new replica has applied {} of the leader's {}",
                    here.applied, status.applied
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `member` leaves the Raft group of a strongly consistent tablet (once no other
    /// membership change is committing); done when the leader has committed that.
    async fn leave_group(
        &self,
        table: TableId,
        tablet: &shoal_placement::Tablet,
        member: HostId,
    ) -> Result<(), Step> {
        let target = StrongTables::tablet_group(&table, tablet);
        let started = tokio::time::Instant::now();
        while started.elapsed() < CATCH_UP_BOUND {
            let status = self
                .strong
                .leader_status(&target)
                .await
                .map_err(Step::Retry)?;
            if status.members_settled {
                if !status.members.contains(&member.0) {
                    return Ok(());
                }
                self.strong
                    .change_members(&target, None, Some(member))
                    .await
                    .map_err(Step::Retry)?;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Step::Retry(
            "the group has not committed the member's removal yet".into(),
        ))
    }

    async fn replica_status(
        &self,
        node: HostId,
        target: &crate::strong::TabletGroup,
    ) -> Result<WireStatus, Step> {
        let request = StrongRequest::Status {
            group: target.group.0,
            leader_only: false,
        };
        match self.strong.on_node(node, request).await {
            Some(StrongReply::Status(status)) => Ok(status),
            other => Err(Step::Retry(format!(
                "the new replica's group is not ready: {other:?}"
            ))),
        }
    }

    /// Where the pending replica streams from: the leaving replica while it is up (it
    /// holds exactly what the new one replaces), otherwise every live old replica (their
    /// union holds every acknowledged write).
    fn sources(
        &self,
        state: &ClusterState,
        replicas: &[HostId],
        transition: &Transition,
    ) -> Result<Vec<SocketAddr>, Step> {
        let address = |host: &HostId| state.member_by_host(host).map(|m| m.internode_address);
        if let Some(leaving) = transition.leaving.filter(|h| self.alive(h)) {
            return Ok(address(&leaving).into_iter().collect());
        }
        let others: Vec<SocketAddr> = replicas
            .iter()
            .filter(|h| Some(**h) != transition.leaving && self.alive(h))
            .filter_map(address)
            .collect();
        if !others.is_empty() {
            return Ok(others);
        }
        // Nobody alive holds the tablet. A node being removed took its only copy with it
        // (replication factor 1): the new replica starts empty, as in Cassandra. A node
        // that is merely down may come back: wait for it.
        let leaving_removed = transition
            .leaving
            .and_then(|h| state.member_by_host(&h))
            .is_some_and(|m| m.state == MemberState::Removing);
        if leaving_removed || replicas.is_empty() {
            tracing::warn!(
                "no live replica holds the tablet: its data is lost with the removed node"
            );
            return Ok(Vec::new());
        }
        Err(Step::Retry("no live replica holds the tablet yet".into()))
    }

    async fn receive(
        &self,
        pending: &Member,
        tablet: TabletId,
        migration: MigrationId,
        keys: TabletKeys,
        sources: Vec<SocketAddr>,
    ) -> Result<(), Step> {
        let table = keys.table;
        let started = tokio::time::Instant::now();
        let mut reported = started;
        loop {
            if reported.elapsed() >= STALLED_STREAM_REPORT {
                reported = tokio::time::Instant::now();
                tracing::warn!(%table, tablet = tablet.0, %migration, node = %pending.internode_address, seconds = started.elapsed().as_secs(), "a tablet stream is still not done (see `shoal admin streams` on that node)");
            }
            let request = StreamRequest::Receive {
                migration,
                tablet,
                keys: keys.clone(),
                sources: sources.clone(),
            };
            match self.stream_call(pending, request, RECEIVE_CALL).await? {
                StreamReply::Received { done: true, bytes } => {
                    tracing::info!(%table, tablet = tablet.0, %migration, bytes, node = %pending.internode_address, "tablet streamed");
                    return Ok(());
                }
                StreamReply::Received { done: false, .. } => {
                    if !self.alive(&pending.host_id) || !self.metadata.is_leader() {
                        return Err(Step::Retry(
                            "the stream's destination or leader changed".into(),
                        ));
                    }
                }
                other => return Err(Step::Retry(format!("unexpected answer {other:?}"))),
            }
        }
    }

    async fn stream_call(
        &self,
        member: &Member,
        request: StreamRequest,
        timeout: Duration,
    ) -> Result<StreamReply, Step> {
        if member.host_id == self.metadata.me().host_id {
            return self.streaming.handle(request).await.map_err(Step::Retry);
        }
        match self
            .peers
            .call(member.internode_address, &Message::Stream(request), timeout)
            .await
        {
            Ok(Reply::Stream(reply)) => Ok(reply),
            Ok(Reply::Error(error)) => Err(Step::Retry(format!(
                "{}: {error}",
                member.internode_address
            ))),
            Ok(other) => Err(Step::Retry(format!("unexpected answer {other:?}"))),
            Err(error) => Err(Step::Retry(error.into())),
        }
    }

    /// `Ok` when `pending` cannot have missed a write acknowledged while `migration` did
    /// not wait for it: `answers`, those of `Streamed`'s barrier, against those of the
    /// barrier taken before writes reached it (forgotten now). `Err` says why not.
    fn nothing_missed(
        &self,
        state: &ClusterState,
        migration: MigrationId,
        answers: &BarrierAnswers,
        pending: &Member,
    ) -> Result<(), String> {
        let before = self.before_write_both.lock().remove(&migration).ok_or(
            "the barrier before writes reached it was taken by an earlier metadata leader",
        )?;
        // A member being removed (removenode, or replaced) was declared dead by the
        // operator, as in Cassandra: it coordinates nothing, and waiting for it to answer
        // would stream every tablet it held twice.
        let members: Vec<HostId> = state
            .members
            .values()
            .filter(|m| m.state != MemberState::Removing)
            .map(|m| m.host_id)
            .collect();
        missed_nothing(&before, answers, &members, &pending.host_id)
    }

    /// The topology barrier for the current version on every member the failure detector
    /// sees up (the ones it does not are fenced out by those that pass it): every one
    /// settles first, then every one raises its fence. Answers what each settled one
    /// answered.
    async fn barrier(&self, state: &ClusterState) -> Result<BarrierAnswers, Step> {
        let version = state.topology_version;
        let me = self.metadata.me().host_id;
        let members: Vec<&Member> = state
            .members
            .values()
            .filter(|m| m.host_id == me || self.alive(&m.host_id))
            .collect();
        let mut answers = BarrierAnswers::new();
        for fence in [false, true] {
            let rounds = members.iter().map(|member| async move {
                if member.host_id == me {
                    if fence {
                        self.proxy.fence(version);
                        return Ok(None);
                    }
                    return self.proxy.settle(version, BARRIER_BOUND).await.map(Some);
                }
                match self
                    .peers
                    .call(
                        member.internode_address,
                        &Message::Barrier { version, fence },
                        BARRIER_BOUND + Duration::from_secs(5),
                    )
                    .await
                {
                    Ok(Reply::Done) if fence => Ok(None),
                    Ok(Reply::Settled(settled)) if !fence => Ok(Some(settled)),
                    Ok(Reply::Error(error)) => Err(error),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                    Err(error) => Err(error.into()),
                }
                .map_err(|e| format!("barrier on {}: {e}", member.internode_address))
            });
            let outcomes = futures::future::join_all(rounds).await;
            for (member, outcome) in members.iter().zip(outcomes) {
                if let Some(settled) = outcome.map_err(Step::Retry)? {
                    answers.insert(member.host_id, settled);
                }
            }
        }
        Ok(answers)
    }

    async fn advance(
        &self,
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        to: MigrationStage,
    ) -> Result<bool, Step> {
        match self
            .propose(Command::AdvanceMigration {
                table,
                tablet,
                migration,
                to,
            })
            .await
            .map_err(Step::Retry)?
        {
            CommandOutcome::Applied => Ok(true),
            _ => Err(Step::Gone),
        }
    }

    async fn end(
        &self,
        table: TableId,
        tablet: TabletId,
        migration: MigrationId,
        aborted: bool,
    ) -> Result<(), Step> {
        self.before_write_both.lock().remove(&migration);
        match self
            .propose(Command::EndMigration {
                table,
                tablet,
                migration,
                aborted,
            })
            .await
            .map_err(Step::Retry)?
        {
            CommandOutcome::Applied => Ok(()),
            _ => Err(Step::Gone),
        }
    }
}
