//! The pieces [`crate::Node::start`] assembles, each from the configuration: the
//! outgoing connections, the streaming policy, this node as a member and as the
//! coordinator describes it, the storage proxy, the schema and roles, and the background
//! tasks.

use crate::config::Config;
use crate::durability::CommitLog;
use crate::events::EventBus;
use crate::metrics::Metrics;
use crate::operations::NodeOperations;
use crate::streaming::policy::{self, StreamPolicy};
use crate::streaming::Streaming;
use crate::strong::StrongTables;
use crate::tls::InternodeTls;
use crate::{internode, maintenance, membership, migration, splitting};
use anyhow::Context;
use shoal_cluster::ClusterMetadata;
use shoal_coordinator::{AccessControl, Coordinator, NodeInfo};
use shoal_model::HostId;
use shoal_replication::{Hints, Liveness, LocalReplica, ReplicaTransport, StorageProxy};
use shoal_schema::SchemaStore;
use shoal_storage::Engine;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// This node's outgoing internode connections: the small-message ones, opened on the
/// node's runtime, and the streaming lane — connections of its own, so that chunks of
/// tablets never queue in front of client requests' messages.
pub(crate) fn peers_and_lane(
    config: &Config,
    tls: Option<&Arc<InternodeTls>>,
) -> (Arc<internode::Peers>, Arc<internode::Peers>) {
    let mut peers = internode::Peers::from_address(config.listen_address)
        .opened_on(tokio::runtime::Handle::current());
    let mut lane = internode::Peers::from_address(config.listen_address).for_streaming_lane();
    if let Some(tls) = tls {
        peers = peers.with_tls(Arc::clone(tls));
        lane = lane.with_tls(Arc::clone(tls));
    }
    (Arc::new(peers), Arc::new(lane))
}

/// The streaming policy the configuration asks for.
pub(crate) fn stream_policy(config: &Config) -> StreamPolicy {
    StreamPolicy {
        target_p99: Duration::from_millis(config.stream_target_p99_ms),
        p99_growth: (config.stream_p99_growth > 0.0).then_some(config.stream_p99_growth),
        cap_bytes_per_s: policy::limit_from_mib(config.stream_throughput_mib_per_s),
        under_load_bytes_per_s: policy::limit_from_mib(
            config.stream_throughput_under_load_mib_per_s,
        ),
    }
}

/// This node as a cluster member, as it registers (joining, until the balancer has given
/// it its share of tablets).
pub(crate) fn member(config: &Config, host_id: HostId) -> shoal_cluster::Member {
    shoal_cluster::Member {
        host_id,
        internode_address: SocketAddr::new(config.listen_address, config.internode_port),
        cql_address: SocketAddr::new(config.listen_address, config.cql_port),
        datacenter: config.datacenter.clone(),
        rack: config.rack.clone(),
        state: shoal_cluster::MemberState::Joining,
        replaces: None,
    }
}

/// The seeds' internode addresses.
pub(crate) fn seeds(config: &Config) -> Vec<SocketAddr> {
    config
        .seeds
        .iter()
        .map(|ip| SocketAddr::new(*ip, config.internode_port))
        .collect()
}

/// What the coordinator tells clients about this node, and how it schedules reads.
pub(crate) fn node_info(config: &Config, host_id: HostId) -> NodeInfo {
    NodeInfo {
        cluster_name: config.cluster_name.clone(),
        address: config.listen_address,
        cql_port: config.cql_port,
        datacenter: config.datacenter.clone(),
        rack: config.rack.clone(),
        host_id,
        tokens: Vec::new(),
        gossip_generation: shoal_model::timestamp::now_seconds() as i32,
        read_scheduling: config.read_scheduling.ordering(),
        read_threads: config.read_threads,
        scan_nice: config.scan_nice,
        range_request_timeout: Duration::from_millis(config.range_request_timeout_ms),
    }
}

/// Creates the default superuser, waiting up to ten seconds for it so that clients can
/// log in as soon as the node listens; a cluster that cannot take the change yet has it
/// retried by the task returned.
pub(crate) async fn create_default_superuser(
    coordinator: &Arc<Coordinator>,
) -> tokio::task::JoinHandle<()> {
    let create = tokio::spawn(maintenance::create_default_superuser(Arc::clone(
        coordinator,
    )));
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while !create.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    create
}

/// The node's regular maintenance: garbage collection and compaction tuning in the
/// engine, index builds, replays of batches left behind, and expired hints swept.
pub(crate) fn spawn_maintenance(
    engine: &Arc<dyn Engine>,
    coordinator: &Coordinator,
    proxy: &Arc<StorageProxy>,
) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        tokio::spawn(maintenance::collect_garbage_regularly(Arc::clone(engine))),
        tokio::spawn(maintenance::adapt_compaction_regularly(Arc::clone(engine))),
        tokio::spawn(maintenance::build_indexes_regularly(Arc::clone(
            coordinator.index_catalog(),
        ))),
        tokio::spawn(maintenance::replay_batches_regularly(Arc::clone(proxy))),
        tokio::spawn(maintenance::sweep_hints_regularly(Arc::clone(proxy))),
    ]
}

/// Closes client connections once the node shuts down (a drain closes them earlier).
pub(crate) fn close_clients_on_shutdown(
    mut shutdown: watch::Receiver<bool>,
    close_clients: watch::Sender<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = shutdown.changed().await;
        close_clients.send_replace(true);
    })
}

/// The storage proxy: replication of ordinary keyspaces through this node's replica and
/// its peers', with the hints it keeps for replicas that are down.
pub(crate) fn storage_proxy(
    config: &Config,
    engine: &Arc<dyn Engine>,
    commit_log: &Arc<CommitLog>,
    metadata: &Arc<ClusterMetadata>,
    transport: &Arc<membership::Transport>,
    liveness: &Arc<dyn Liveness>,
    replica: Arc<LocalReplica>,
) -> Arc<StorageProxy> {
    let hints = Arc::new(Hints::new(
        Arc::clone(engine),
        commit_log.clone(),
        Arc::clone(liveness),
        Duration::from_millis(config.max_hint_window_ms),
        config.max_hints_mib * 1024 * 1024,
    ));
    Arc::new(
        StorageProxy::new(
            Arc::clone(metadata) as Arc<dyn shoal_replication::Topology>,
            Arc::clone(transport) as Arc<dyn ReplicaTransport>,
            Arc::clone(liveness),
            replica,
            hints,
        )
        .fetching_tablets_at_once(config.scan_parallel_tablets)
        .chunking_scans_by(config.scan_chunk_cells)
        .with_range_timeout(Duration::from_millis(config.range_request_timeout_ms)),
    )
}

/// The schema and the roles as this node last stored them.
pub(crate) fn schema_and_roles(
    config: &Config,
    engine: &Arc<dyn Engine>,
) -> anyhow::Result<(Arc<SchemaStore>, AccessControl)> {
    let schema = Arc::new(
        SchemaStore::open(Arc::clone(engine))
            .map_err(|e| anyhow::anyhow!("cannot load the schema: {}", e.message))?,
    );
    let auth = AccessControl {
        roles: Arc::new(
            shoal_auth::RoleStore::open(Arc::clone(engine))
                .map_err(|e| anyhow::anyhow!("cannot load the roles: {}", e.message))?,
        ),
        settings: config.auth_settings(),
    };
    Ok((schema, auth))
}

/// The node's services, once they all exist: what the operator's commands and the
/// cluster's background tasks work with.
pub(crate) struct Services {
    pub metadata: Arc<ClusterMetadata>,
    pub coordinator: Arc<Coordinator>,
    pub proxy: Arc<StorageProxy>,
    pub peers: Arc<internode::Peers>,
    pub streaming: Arc<Streaming>,
    pub detector: Arc<membership::FailureDetector>,
    pub strong: Arc<StrongTables>,
    pub metrics: Arc<Metrics>,
    pub events: Arc<EventBus>,
}

impl Services {
    /// The operator's commands on this node (`shoal admin`).
    pub(crate) fn operations(
        &self,
        config: &Config,
        close_clients: watch::Sender<bool>,
    ) -> NodeOperations {
        NodeOperations {
            coordinator: Arc::clone(&self.coordinator),
            metrics: Arc::clone(&self.metrics),
            peers: Arc::clone(&self.peers),
            hints: Arc::clone(self.proxy.hints()),
            data_dir: config.data_dir.clone(),
            started: std::time::Instant::now(),
            close_clients,
            streaming: Arc::clone(&self.streaming),
            detector: Arc::clone(&self.detector),
        }
    }

    /// The cluster's background work on this node: the streaming policy following the
    /// foreground latency, the migration driver, tablet splits (when configured), failure
    /// detection, and following the metadata.
    pub(crate) fn spawn_cluster_tasks(
        &self,
        config: &Config,
        transport: Arc<membership::Transport>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = vec![tokio::spawn(Arc::clone(&self.streaming).run_policy({
            let metrics = Arc::clone(&self.metrics);
            move || metrics.foreground_buckets()
        }))];
        tasks.push(tokio::spawn(
            migration::MigrationDriver::new(
                Arc::clone(&self.metadata),
                Arc::clone(&self.proxy),
                Arc::clone(&self.peers),
                Arc::clone(&self.streaming),
                Arc::clone(&self.detector),
                config.migrations_per_node,
                Arc::clone(&self.strong),
            )
            .run(),
        ));
        if config.tablet_split_mib > 0 {
            tasks.push(tokio::spawn(splitting::run(
                Arc::clone(&self.metadata),
                Arc::clone(&self.coordinator),
                Arc::clone(&self.peers),
                Arc::clone(&self.strong),
                config.tablet_split_mib << 20,
            )));
        }
        tasks.push(tokio::spawn(membership::run_failure_detection(
            Arc::clone(&self.metadata),
            Arc::clone(&self.coordinator),
            Arc::clone(&self.proxy),
            Arc::clone(&self.detector),
            Arc::clone(&self.peers),
            transport,
            Arc::clone(&self.events),
        )));
        tasks.push(tokio::spawn(membership::follow_metadata(
            Arc::clone(&self.metadata),
            Arc::clone(&self.coordinator),
            Arc::clone(&self.detector),
            Arc::clone(&self.events),
        )));
        tasks
    }
}

/// Listens for peers on the internode port and answers their messages until shutdown.
pub(crate) async fn serve_peers(
    config: &Config,
    handler: &Arc<membership::NodeHandler>,
    shutdown: watch::Receiver<bool>,
    tls: Option<Arc<InternodeTls>>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let address = SocketAddr::new(config.listen_address, config.internode_port);
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen for peers on {address}"))?;
    Ok(tokio::spawn(internode::serve(
        listener,
        Arc::clone(handler) as Arc<dyn internode::Handler>,
        shutdown,
        tls,
    )))
}

/// Opens the cluster metadata and takes part in the cluster: bootstraps a new one, joins
/// through the seeds, or comes back as the member it was (replacing a dead node when the
/// configuration names one). The handler answers the metadata's Raft messages meanwhile.
/// With `join_ring = false`, all this waits for `shoal admin join`.
pub(crate) async fn enter_cluster(
    config: &Config,
    engine: &Arc<dyn Engine>,
    host_id: HostId,
    transport: &Arc<membership::Transport>,
    handler: &membership::NodeHandler,
) -> anyhow::Result<Arc<ClusterMetadata>> {
    if !config.join_ring {
        handler.join_gate.wait().await;
    }
    let metadata = ClusterMetadata::open(
        Arc::clone(engine),
        member(config, host_id),
        Arc::clone(transport) as Arc<dyn shoal_cluster::ClusterTransport>,
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot open the cluster metadata: {e}"))?;
    let _ = handler.cluster.set(Arc::clone(&metadata));
    metadata
        .enter(&seeds(config), config.replace_address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot take part in the cluster: {e}"))?;
    Ok(metadata)
}

/// The node's metrics, observing every statement the coordinator runs.
pub(crate) fn metrics(
    coordinator: &Arc<Coordinator>,
    proxy: &Arc<StorageProxy>,
    streaming: &Arc<Streaming>,
    strong: &StrongTables,
) -> Arc<Metrics> {
    let metrics = Metrics::new(coordinator, Some(Arc::clone(proxy)));
    metrics.set_streaming(Arc::clone(streaming));
    metrics.set_consensus(Arc::clone(&strong.raft().counters));
    coordinator.set_observer(
        Arc::clone(&metrics) as Arc<dyn shoal_coordinator::observe::StatementObserver>
    );
    metrics
}

/// The strongly consistent keyspaces' tablets: their consensus log in the data directory
/// and their Raft groups, over connections of their own.
pub(crate) fn strong_tables(
    config: &Config,
    metadata: &Arc<ClusterMetadata>,
    schema: &Arc<SchemaStore>,
    peers: &Arc<internode::Peers>,
    engine: &Arc<dyn Engine>,
    tls: Option<Arc<InternodeTls>>,
) -> anyhow::Result<Arc<StrongTables>> {
    StrongTables::start(
        &config.data_dir.join("consensus"),
        config.listen_address,
        Arc::clone(metadata),
        Arc::clone(schema),
        Arc::clone(peers),
        Arc::clone(engine),
        tls,
    )
    .context("cannot start the consensus log of strongly consistent keyspaces")
}
