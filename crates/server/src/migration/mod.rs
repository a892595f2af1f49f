//! The migration driver: on the metadata leader, it moves tablets between nodes — when
//! nodes join, leave or are removed, when a keyspace's replication changes, and to keep
//! load even — one committed stage at a time (see `shoal_placement::tablet` for what each
//! stage means to requests).
//!
//! Each round ([`ROUND`], or sooner when the metadata changes or a peer comes up) it:
//!
//! 1. drives every migration under way, each in a task of its own
//!    ([`MigrationDriver::drive`]):
//!    - `Allocated`: the pending replica clears any leftover of the range, and a barrier
//!      records what every node answers (its failed deliveries so far, and since when it
//!      runs), which `Streamed` compares against → `WriteBoth`;
//!    - `WriteBoth`: a topology barrier (every node routes writes to the pending replica
//!      and stale coordinators are fenced out), then the pending replica streams the
//!      range → `Streamed`;
//!    - `Streamed`: a barrier (every write that did not wait for the pending replica is
//!      over); if a node missed a delivery to it since `Allocated`'s barrier, restarted,
//!      or was out of reach, the range is streamed to it again → `ReadNew`;
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

use crate::internode::Peers;
use crate::membership::FailureDetector;
use crate::streaming::Streaming;
use crate::tablet_sizes::{Sources, TabletSizes};
use parking_lot::Mutex;
use shoal_cluster::{
    ClusterMetadata, ClusterState, Command, CommandOutcome, Member, MemberState, TablePlacement,
};
use shoal_model::{keys, HostId, TableId};
use shoal_placement::{plan_moves, plan_primaries, BalancerNode, Budget, Bytes, MigrationId};
use shoal_replication::barrier::BarrierAnswers;
use shoal_replication::{Liveness, StorageProxy};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

mod steps;

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
    /// What each node answered the barrier taken before writes reached a migration's
    /// pending replica (`Streamed` compares against it; kept in memory only: a new
    /// leader streams such a tablet a second time instead).
    before_write_both: Mutex<HashMap<MigrationId, BarrierAnswers>>,
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
            before_write_both: Mutex::new(HashMap::new()),
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
        // Both plan from the same measured bytes, each charging its own copy.
        let bytes = self.bytes(&state);
        self.settle_members(&state, &bytes).await?;
        // 3. New moves.
        self.start_moves(&state, &bytes).await
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

    async fn start_moves(&self, state: &ClusterState, bytes: &Bytes) -> Result<(), String> {
        let nodes = self.balancer_nodes(state);
        let mut budget = self.budget(state);
        let mut bytes = bytes.clone();
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

    async fn settle_members(&self, state: &ClusterState, bytes: &Bytes) -> Result<(), String> {
        let nodes = self.balancer_nodes(state);
        // What the balancer would still move, ignoring budgets: a joining node with
        // nothing more coming is normal.
        let mut unlimited = Budget::new(usize::MAX);
        let mut bytes = bytes.clone();
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
}

fn address_of(state: &ClusterState, host: &HostId) -> Option<SocketAddr> {
    state.member_by_host(host).map(|m| m.internode_address)
}
