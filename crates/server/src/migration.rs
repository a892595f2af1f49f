//! The migration driver: on the metadata leader, it moves tablets between nodes — when
//! nodes join, leave or are removed, when a keyspace's replication changes, and to keep
//! load even — one committed stage at a time (see `shoal_placement::tablet` for what each
//! stage means to requests).
//!
//! Each round ([`ROUND`], or sooner when the metadata changes or a peer comes up) it:
//!
//! 1. drives every migration under way, each in a task of its own
//!    ([`MigrationDriver::drive`]):
//!    - `Allocated`: the pending replica clears any leftover of the range → `WriteBoth`;
//!    - `WriteBoth`: a topology barrier (every node routes writes to the pending replica
//!      and stale coordinators are fenced out), then the pending replica streams the
//!      range → `ReadNew`;
//!    - `ReadNew`: a barrier (nobody reads the old set any more) → `Cleanup`;
//!    - `Cleanup`: a barrier (nobody writes the leaving replica any more), the leaving
//!      replica drops the range → done.
//!
//!    Every step re-reads the metadata first and only acts if the migration is still
//!    where it was, so a driver on a new leader picks up where the old one stopped (a
//!    repeated step is harmless). A pending replica that dies aborts the migration before
//!    `Cleanup` (the old replicas still hold everything: writes went to both); a dead
//!    source is replaced by the tablet's other replicas.
//! 2. moves members along: `Joining` → `Normal` once nothing more is coming to them;
//!    `Leaving`/`Removing` → gone once they hold nothing (a voter's place in the metadata
//!    Raft group goes to another node first).
//! 3. starts the moves the balancer (`shoal_placement::balance`) plans, within each node's
//!    budget of migrations at once, and evens out primaries when a table is settled. The
//!    balancer weighs tablets by the sizes `crate::tablet_sizes` last measured; a round
//!    starts a new measure in the background when they are stale.
//!
//! The decisions are the pure functions' (balancer, stage order); this module performs
//! them: messages, barriers, streaming requests, proposals.

use crate::internode::{Message, Peers, Reply};
use crate::membership::FailureDetector;
use crate::streaming::{StreamReply, StreamRequest, Streaming, TabletKeys};
use crate::strong::{StrongReply, StrongRequest, StrongTables, WireStatus};
use crate::tablet_sizes::{Sources, TabletSizes};
use parking_lot::Mutex;
use shoal_cluster::{
    ClusterMetadata, ClusterState, Command, CommandOutcome, Member, MemberState, TablePlacement,
};
use shoal_model::{keys, HostId, TableId, TabletId};
use shoal_placement::{
    plan_moves, plan_primaries, BalancerNode, Budget, Bytes, MigrationId, MigrationStage,
    Transition,
};
use shoal_replication::{Liveness, StorageProxy};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// How often the driver looks at the cluster when neither the metadata changes nor a
/// peer comes up (both start a round at once).
const ROUND: Duration = Duration::from_millis(100);
/// How long one round may take (each of its steps is bounded well below this; a round
/// that still overruns is abandoned, logged, and the next one starts afresh).
const ROUND_BOUND: Duration = Duration::from_secs(60);
/// How often a tablet stream that has not finished is reported.
const STALLED_STREAM_REPORT: Duration = Duration::from_secs(20);
/// How long a barrier may take on one node.
const BARRIER_BOUND: Duration = Duration::from_secs(15);
/// Pause before a failed step is tried again the first time; it doubles with every
/// further failure of the same migration, up to [`RETRY_MAX`]. Most failures are brief —
/// a node that joined the metadata a moment ago is still opening its storage and answers
/// "still starting" for some tens of milliseconds — and a join waits for every one of
/// them; a step that keeps failing backs off to the longer pause.
const RETRY_FIRST: Duration = Duration::from_millis(25);
/// The longest pause between two tries of a failing step.
const RETRY_MAX: Duration = Duration::from_millis(500);
/// How long a new member of a strongly consistent tablet's group may take to catch up
/// (and a member's removal to commit) before the step is retried.
const CATCH_UP_BOUND: Duration = Duration::from_secs(30);
/// Entries a new member may still lack when it counts as caught up (it keeps receiving
/// them; the bound only keeps a busy group from holding the move forever).
const CAUGHT_UP_SLACK: u64 = 64;
/// A `Receive` call's timeout (the destination answers within about 10 s).
const RECEIVE_CALL: Duration = Duration::from_secs(40);

/// Drives tablet migrations while this node leads the metadata.
pub struct MigrationDriver {
    pub metadata: Arc<ClusterMetadata>,
    pub proxy: Arc<StorageProxy>,
    pub peers: Arc<Peers>,
    pub streaming: Arc<Streaming>,
    pub detector: Arc<FailureDetector>,
    /// Migrations one node takes part in at once.
    pub migrations_per_node: usize,
    /// A tablet of a strongly consistent table moves with its Raft group: the pending
    /// replica joins the group, the leaving one leaves it.
    pub strong: Arc<crate::strong::StrongTables>,
    /// Migrations with a task driving them.
    running: Mutex<HashSet<MigrationId>>,
    /// What each tablet holds, for the balancer to even out bytes too.
    sizes: Arc<TabletSizes>,
}

/// Why a step could not be taken (it is retried, or the migration aborted).
#[derive(Debug)]
enum Step {
    /// Try again later.
    Retry(String),
    /// The migration is no longer where this task thought: stop driving it.
    Gone,
}

impl MigrationDriver {
    pub fn new(
        metadata: Arc<ClusterMetadata>,
        proxy: Arc<StorageProxy>,
        peers: Arc<Peers>,
        streaming: Arc<Streaming>,
        detector: Arc<FailureDetector>,
        migrations_per_node: usize,
        strong: Arc<crate::strong::StrongTables>,
    ) -> Arc<MigrationDriver> {
        Arc::new(MigrationDriver {
            metadata,
            proxy,
            peers,
            streaming,
            detector,
            migrations_per_node,
            strong,
            running: Mutex::new(HashSet::new()),
            sizes: Arc::new(TabletSizes::default()),
        })
    }

    /// Runs rounds for as long as the node runs; only the leader acts.
    pub async fn run(self: Arc<Self>) {
        let mut states = self.metadata.subscribe();
        // A joining node is given tablets only once it is seen up, which is usually a
        // moment after it entered the metadata: that moment starts a round too.
        let mut came_up = self.detector.subscribe_came_up();
        loop {
            let _ = tokio::time::timeout(ROUND, async {
                tokio::select! {
                    _ = states.changed() => {}
                    _ = came_up.changed() => {}
                }
            })
            .await;
            if !self.metadata.is_leader() {
                continue;
            }
            match tokio::time::timeout(ROUND_BOUND, self.round()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::info!(%error, "tablet balancing round stopped early"),
                Err(_) => tracing::warn!(
                    bound = ?ROUND_BOUND,
                    "a tablet balancing round did not finish in time: starting the next"
                ),
            }
        }
    }

    fn alive(&self, host: &HostId) -> bool {
        self.detector.is_alive(host)
    }

    async fn propose(&self, command: Command) -> Result<CommandOutcome, String> {
        self.metadata
            .propose(command)
            .await
            .map_err(|e| e.to_string())
    }

    async fn round(self: &Arc<Self>) -> Result<(), String> {
        let state = self.metadata.state();
        if self.sizes.claim_refresh() {
            let (driver, state) = (Arc::clone(self), Arc::clone(&state));
            tokio::spawn(async move {
                let engine = Arc::clone(&driver.proxy.local().engine);
                let alive = |host: &HostId| driver.alive(host);
                let sources = Sources {
                    me: driver.metadata.me().host_id,
                    engine: engine.as_ref(),
                    peers: &driver.peers,
                    alive: &alive,
                };
                driver.sizes.refresh(&state, sources).await;
            });
        }
        // 1. Migrations under way.
        for (table, tablet, transition) in state.migrations() {
            if self.running.lock().insert(transition.id) {
                let driver = Arc::clone(self);
                tokio::spawn(async move {
                    driver.drive(table, tablet, transition.id).await;
                    driver.running.lock().remove(&transition.id);
                });
            }
        }
        // 2. Members.
        self.settle_members(&state).await?;
        // 3. New moves.
        self.start_moves(&state).await
    }

    fn balancer_nodes(&self, state: &ClusterState) -> Vec<BalancerNode> {
        state
            .members
            .values()
            .map(|member| BalancerNode {
                id: member.host_id,
                datacenter: member.datacenter.clone(),
                rack: member.rack.clone(),
                accepts: member.state.accepts_replicas(),
                draining: matches!(member.state, MemberState::Leaving | MemberState::Removing),
                alive: self.alive(&member.host_id),
                replaces: member.replaces,
            })
            .collect()
    }

    /// The budget with the migrations under way already charged.
    fn budget(&self, state: &ClusterState) -> Budget {
        let mut budget = Budget::new(self.migrations_per_node);
        for (_, _, transition) in state.migrations() {
            budget.charge(
                transition.leaving.filter(|h| self.alive(h)),
                transition.pending,
            );
        }
        budget
    }

    /// Tablet and node bytes, as last measured.
    fn bytes(&self, state: &ClusterState) -> Bytes {
        let maps = state.tables.iter().map(|(table, p)| (*table, &p.tablets));
        Bytes::new(self.sizes.current(), maps)
    }

    async fn start_moves(&self, state: &ClusterState) -> Result<(), String> {
        let nodes = self.balancer_nodes(state);
        let mut budget = self.budget(state);
        let mut bytes = self.bytes(state);
        for (table, placement) in self.largest_first(state) {
            let moves = plan_moves(
                *table,
                &placement.tablets,
                &placement.strategy,
                &nodes,
                &mut bytes,
                &mut budget,
            );
            let settled = moves.is_empty() && placement.tablets.transitions().next().is_none();
            for planned in moves {
                tracing::info!(
                    %table,
                    tablet = planned.tablet.0,
                    from = ?planned.leaving.and_then(|h| address_of(state, &h)),
                    to = ?planned.pending.and_then(|h| address_of(state, &h)),
                    "starting a tablet migration"
                );
                let outcome = self
                    .propose(Command::StartMigration {
                        table: *table,
                        tablet: planned.tablet,
                        leaving: planned.leaving,
                        pending: planned.pending,
                    })
                    .await?;
                if let CommandOutcome::Rejected(reason) = outcome {
                    tracing::info!(%reason, "a planned migration was refused");
                }
            }
            if settled {
                let primaries = plan_primaries(&placement.tablets, &nodes);
                if !primaries.is_empty() {
                    self.propose(Command::SetPrimaries {
                        table: *table,
                        primaries,
                    })
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// The tables, those holding the most data here first: the budget of moves at once
    /// goes to the tablets that take longest to stream, and the empty tablets of small
    /// tables (system tables, a keyspace not used yet) take the slots left over instead of
    /// holding the big ones back for a round. This node's share of a table (RocksDB's
    /// estimate of its files) stands for the whole, as tablets are spread evenly.
    ///
    /// Small tables are not let past the budget: on the 2-core benchmark machine, starting
    /// all of a join's moves at once (fourteen instead of eight) made it slower and client
    /// p99 during it higher — every move's stages are Raft commits and topology barriers.
    fn largest_first<'s>(&self, state: &'s ClusterState) -> Vec<(&'s TableId, &'s TablePlacement)> {
        let engine = &self.proxy.local().engine;
        // Stable: tables of equal size stay in id order.
        let mut tables: Vec<_> = state.tables.iter().collect();
        tables.sort_by_cached_key(|(table, _)| {
            let bytes = engine
                .approximate_range_bytes(&keys::table_prefix(table), &keys::table_end(table))
                .unwrap_or(0);
            std::cmp::Reverse(bytes)
        });
        tables
    }

    async fn settle_members(&self, state: &ClusterState) -> Result<(), String> {
        let nodes = self.balancer_nodes(state);
        // What the balancer would still move, ignoring budgets: a joining node with
        // nothing more coming is normal.
        let mut unlimited = Budget::new(usize::MAX);
        let mut bytes = self.bytes(state);
        let mut incoming: HashSet<HostId> = HashSet::new();
        for (table, placement) in &state.tables {
            for planned in plan_moves(
                *table,
                &placement.tablets,
                &placement.strategy,
                &nodes,
                &mut bytes,
                &mut unlimited,
            ) {
                incoming.extend(planned.pending);
            }
            for (_, transition) in placement.tablets.transitions() {
                incoming.extend(transition.pending);
            }
        }
        for member in state.members.values() {
            let host = member.host_id;
            match member.state {
                MemberState::Joining if self.alive(&host) && !incoming.contains(&host) => {
                    tracing::info!(node = %member.internode_address, "node has its share of tablets: normal");
                    self.propose(Command::SetMemberState {
                        host_id: host,
                        from: vec![MemberState::Joining],
                        to: MemberState::Normal,
                    })
                    .await?;
                }
                MemberState::Leaving | MemberState::Removing => {
                    let involved = state
                        .tables
                        .values()
                        .flat_map(|p| p.tablets.tablets())
                        .any(|t| t.involves(&host));
                    if !involved {
                        self.retire(state, member).await?;
                    }
                }
                _ => {}
            }
        }
        // Keep the metadata group at its full count of voters.
        let mut candidates: Vec<&Member> = state
            .members
            .values()
            .filter(|m| m.state == MemberState::Normal && self.alive(&m.host_id))
            .collect();
        candidates.sort_by_key(|m| m.host_id);
        let ids: Vec<u64> = candidates.iter().map(|m| m.node_id()).collect();
        self.metadata
            .fill_voters(&ids)
            .await
            .map_err(|e| e.to_string())
    }

    async fn retire(&self, state: &ClusterState, member: &Member) -> Result<(), String> {
        tracing::info!(node = %member.internode_address, state = member.state.name(), "node holds no tablets any more: removing it from the cluster");
        // A voter's place goes to another node before it leaves.
        if self.metadata.voters().contains(&member.node_id()) {
            let mut candidates: Vec<&Member> = state
                .members
                .values()
                .filter(|m| m.state == MemberState::Normal && self.alive(&m.host_id))
                .filter(|m| !self.metadata.voters().contains(&m.node_id()))
                .collect();
            candidates.sort_by_key(|m| m.host_id);
            if let Some(next) = candidates.first() {
                self.metadata
                    .promote(next.node_id())
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        match self
            .metadata
            .retire(member.host_id)
            .await
            .map_err(|e| e.to_string())?
        {
            CommandOutcome::Applied => Ok(()),
            other => Err(format!("removing {}: {other:?}", member.internode_address)),
        }
    }

    /// Drives one migration until it ends (or another leader takes over).
    async fn drive(&self, table: TableId, tablet: TabletId, migration: MigrationId) {
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
        if transition.stage < MigrationStage::Cleanup {
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
            Err(error) => Err(Step::Retry(error)),
        }
    }

    /// The topology barrier for the current version on every member the failure detector
    /// sees up (the ones it does not are fenced out by those that pass it): every one
    /// settles first, then every one raises its fence.
    async fn barrier(&self, state: &ClusterState) -> Result<(), Step> {
        let version = state.topology_version;
        let me = self.metadata.me().host_id;
        let members: Vec<&Member> = state
            .members
            .values()
            .filter(|m| m.host_id == me || self.alive(&m.host_id))
            .collect();
        for fence in [false, true] {
            let rounds = members.iter().map(|member| async move {
                if member.host_id == me {
                    if fence {
                        self.proxy.fence(version);
                        return Ok(());
                    }
                    return self.proxy.settle(version, BARRIER_BOUND).await;
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
                    Ok(Reply::Done) => Ok(()),
                    Ok(Reply::Error(error)) => Err(error),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                    Err(error) => Err(error),
                }
                .map_err(|e| format!("barrier on {}: {e}", member.internode_address))
            });
            for outcome in futures::future::join_all(rounds).await {
                outcome.map_err(Step::Retry)?;
            }
        }
        Ok(())
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

fn address_of(state: &ClusterState, host: &HostId) -> Option<SocketAddr> {
    state.member_by_host(host).map(|m| m.internode_address)
}
