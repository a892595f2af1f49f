//! The server layer: the only place that owns sockets, threads, timers and files.
//!
//! - [`config`] — the node's typed configuration.
//! - [`durability`] — the commit log policy (periodic sync or epoch group commit) behind
//!   the coordinator's `WriteLog`.
//! - [`connection`] — one CQL client connection: frames in, requests run concurrently,
//!   coalesced frames out; [`connection_threads`] — the threads connections live on, each
//!   connection on one for its whole life.
//! - [`events`] — pushing SCHEMA_CHANGE, TOPOLOGY_CHANGE and STATUS_CHANGE events.
//! - [`internode`] — messaging between nodes; [`membership`] — the failure detector and
//!   the loops that follow the cluster metadata.
//! - [`metrics`] — the Prometheus endpoint: request latencies and errors, per-table
//!   figures, storage, hints, Raft.
//! - [`operations`] — the operator's commands (`shoal admin flush|snapshot|…`).
//! - [`tls`] — TLS for client connections, certificates reloaded when their files change.
//! - [`maintenance`] — storage garbage collection, hint sweeps and batchlog replay in the
//!   background.
//! - [`streaming`] — tablets moving between nodes as files, at a rate that yields to
//!   clients; [`migration`] — the leader's driver that moves them stage by stage.
//! - [`Node`] — opens storage, builds the coordinator, listens for clients, and shuts
//!   everything down cleanly.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod connection;
pub mod connection_threads;
pub mod durability;
pub mod events;
pub mod internode;
pub mod maintenance;
pub mod membership;
pub mod metrics;
pub mod migration;
pub mod operations;
pub mod splitting;
pub mod streaming;
pub mod strong;
pub mod tablet_sizes;
pub mod tls;

/// A spawned task whose owner awaits it through `.0`, aborted when the owner is dropped:
/// a task whose answer nobody is left to take (its connection closed, its node stopping)
/// does not run on.
pub(crate) struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

use anyhow::Context;
use config::Config;
use durability::CommitLog;
use shoal_coordinator::{ClusterView, Coordinator, NodeInfo};
use shoal_model::HostId;
use shoal_replication::{Hints, Liveness, LocalReplica, ReplicaTransport, StorageProxy};
use shoal_schema::SchemaStore;
use shoal_storage::{Engine, RocksEngine, RocksOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// This node's identity, created on first start and kept in the engine's metadata.
fn load_host_id(engine: &dyn Engine) -> anyhow::Result<HostId> {
    const KEY: &[u8] = b"local/host_id";
    if let Some((_, value)) = engine
        .metadata_with_prefix(KEY)?
        .into_iter()
        .find(|(k, _)| k == KEY)
    {
        if let Ok(id) = <[u8; 16]>::try_from(value.as_slice()) {
            return Ok(HostId(id));
        }
    }
    let id = HostId::random();
    engine.put_metadata(KEY, &id.0)?;
    Ok(id)
}

/// A running node.
pub struct Node {
    pub coordinator: Arc<Coordinator>,
    metadata: Arc<shoal_cluster::ClusterMetadata>,
    peers: Arc<internode::Peers>,
    background: Vec<tokio::task::JoinHandle<()>>,
    commit_log: Arc<CommitLog>,
    lane: Arc<internode::Peers>,
    streaming: Arc<streaming::Streaming>,
    cql_address: SocketAddr,
    shutdown: watch::Sender<bool>,
    listener_task: tokio::task::JoinHandle<()>,
    connection_threads: Arc<connection_threads::ConnectionThreads>,
}

impl Node {
    /// Opens storage and starts serving CQL. Must be called inside a Tokio runtime.
    pub async fn start(config: Config) -> anyhow::Result<Node> {
        config.validate()?;
        let engine = open_storage(&config)?;
        let commit_log = CommitLog::start(
            Arc::clone(&engine),
            config.commitlog_sync,
            config.commitlog_sync_period_ms,
        )?;
        let host_id = load_host_id(engine.as_ref())?;
        let events = Arc::new(events::EventBus::default());
        let (shutdown, shutdown_rx) = watch::channel(false);

        // Internode messaging first: joining a cluster needs it.
        let detector = Arc::new(membership::FailureDetector::new(host_id));
        let internode_tls = config.internode_tls()?.map(Arc::new);
        let mut peers = internode::Peers::from_address(config.listen_address)
            .opened_on(tokio::runtime::Handle::current());
        if let Some(tls) = &internode_tls {
            peers = peers.with_tls(Arc::clone(tls));
        }
        let peers = Arc::new(peers);
        // The streaming lane: connections of its own, so that chunks of tablets never
        // queue in front of client requests' messages.
        let mut lane = internode::Peers::from_address(config.listen_address).for_streaming_lane();
        if let Some(tls) = &internode_tls {
            lane = lane.with_tls(Arc::clone(tls));
        }
        let lane = Arc::new(lane);
        let replica = Arc::new(LocalReplica::new(Arc::clone(&engine), commit_log.clone()));
        let streaming = Arc::new(
            streaming::Streaming::new(
                Arc::clone(&replica),
                Arc::clone(&lane),
                streaming::policy::StreamPolicy {
                    target_p99: std::time::Duration::from_millis(config.stream_target_p99_ms),
                    p99_growth: (config.stream_p99_growth > 0.0)
                        .then_some(config.stream_p99_growth),
                    cap_bytes_per_s: streaming::policy::limit_from_mib(
                        config.stream_throughput_mib_per_s,
                    ),
                    under_load_bytes_per_s: streaming::policy::limit_from_mib(
                        config.stream_throughput_under_load_mib_per_s,
                    ),
                },
                config.stream_nice,
            )
            .context("cannot start the streaming lane")?,
        );
        let transport = Arc::new(membership::Transport {
            peers: Arc::clone(&peers),
        });
        let handler = Arc::new(membership::NodeHandler {
            host_id,
            detector: Arc::clone(&detector),
            cluster: Default::default(),
            coordinator: Default::default(),
            proxy: Default::default(),
            operations: Default::default(),
            streaming: Default::default(),
            strong: Default::default(),
            metrics: Default::default(),
        });
        let _ = handler.streaming.set(Arc::clone(&streaming));
        let internode_address = SocketAddr::new(config.listen_address, config.internode_port);
        let internode_listener = TcpListener::bind(internode_address)
            .await
            .with_context(|| format!("cannot listen for peers on {internode_address}"))?;
        let mut background = vec![tokio::spawn(internode::serve(
            internode_listener,
            Arc::clone(&handler) as Arc<dyn internode::Handler>,
            shutdown_rx.clone(),
            internode_tls.clone(),
        ))];

        let me = shoal_cluster::Member {
            host_id,
            internode_address,
            cql_address: SocketAddr::new(config.listen_address, config.cql_port),
            datacenter: config.datacenter.clone(),
            rack: config.rack.clone(),
            state: shoal_cluster::MemberState::Joining,
            replaces: None,
        };
        let seeds: Vec<SocketAddr> = config
            .seeds
            .iter()
            .map(|ip| SocketAddr::new(*ip, config.internode_port))
            .collect();
        let metadata = shoal_cluster::ClusterMetadata::open(
            Arc::clone(&engine),
            me,
            Arc::clone(&transport) as Arc<dyn shoal_cluster::ClusterTransport>,
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the cluster metadata: {e}"))?;
        let _ = handler.cluster.set(Arc::clone(&metadata));
        metadata
            .enter(&seeds, config.replace_address)
            .await
            .map_err(|e| anyhow::anyhow!("cannot take part in the cluster: {e}"))?;

        let info = NodeInfo {
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
            range_request_timeout: std::time::Duration::from_millis(
                config.range_request_timeout_ms,
            ),
        };
        let liveness = Arc::clone(&detector) as Arc<dyn Liveness>;
        let hints = Arc::new(Hints::new(
            Arc::clone(&engine),
            commit_log.clone(),
            Arc::clone(&liveness),
            std::time::Duration::from_millis(config.max_hint_window_ms),
            config.max_hints_mib * 1024 * 1024,
        ));
        let proxy = Arc::new(
            StorageProxy::new(
                Arc::clone(&metadata) as Arc<dyn shoal_replication::Topology>,
                Arc::clone(&transport) as Arc<dyn ReplicaTransport>,
                Arc::clone(&liveness),
                replica,
                hints,
            )
            .fetching_tablets_at_once(config.scan_parallel_tablets)
            .chunking_scans_by(config.scan_chunk_cells)
            .with_range_timeout(info.range_request_timeout),
        );
        let schema = Arc::new(
            SchemaStore::open(Arc::clone(&engine))
                .map_err(|e| anyhow::anyhow!("cannot load the schema: {}", e.message))?,
        );
        let auth = shoal_coordinator::AccessControl {
            roles: Arc::new(
                shoal_auth::RoleStore::open(Arc::clone(&engine))
                    .map_err(|e| anyhow::anyhow!("cannot load the roles: {}", e.message))?,
            ),
            settings: config.auth_settings(),
        };
        let strong = strong::StrongTables::start(
            &config.data_dir.join("consensus"),
            config.listen_address,
            Arc::clone(&metadata),
            Arc::clone(&schema),
            Arc::clone(&peers),
            Arc::clone(&engine),
            internode_tls.clone(),
        )
        .context("cannot start the consensus log of strongly consistent keyspaces")?;
        let _ = handler.strong.set(Arc::clone(&strong));
        background.push(tokio::spawn(Arc::clone(&strong).follow()));
        let replication = Arc::new(strong::replication::NodeReplication {
            proxy: Arc::clone(&proxy),
            strong: Arc::clone(&strong),
        });
        let coordinator = Arc::new(Coordinator::new(
            schema,
            auth,
            replication as Arc<dyn shoal_replication::Replication>,
            info,
            Some(ClusterView {
                metadata: Arc::clone(&metadata),
                liveness,
            }),
        ));
        coordinator
            .sync_schema()
            .map_err(|e| anyhow::anyhow!("cannot install the cluster's schema: {}", e.message))?;
        streaming.set_indexes(Arc::clone(coordinator.index_catalog())
            as Arc<dyn shoal_replication::index::LocalIndexes>);
        coordinator
            .sync_roles()
            .map_err(|e| anyhow::anyhow!("cannot install the cluster's roles: {}", e.message))?;
        if config.auth_settings().authentication {
            // Clients can log in as soon as the node listens, unless the cluster cannot
            // take the change yet: then it is retried in the background.
            let create = tokio::spawn(maintenance::create_default_superuser(Arc::clone(
                &coordinator,
            )));
            if !create.is_finished() {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    while !create.is_finished() {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                })
                .await;
            }
            background.push(create);
        }
        background.push(tokio::spawn(maintenance::place_system_tables(Arc::clone(
            &coordinator,
        ))));
        let metrics = metrics::Metrics::new(&coordinator, Some(Arc::clone(&proxy)));
        let _ = handler.metrics.set(Arc::clone(&metrics));
        metrics.set_streaming(Arc::clone(&streaming));
        metrics.set_consensus(Arc::clone(&strong.raft().counters));
        coordinator.set_observer(
            Arc::clone(&metrics) as Arc<dyn shoal_coordinator::observe::StatementObserver>
        );
        if config.metrics_port != 0 {
            background.push(tokio::spawn(metrics::serve(
                SocketAddr::new(config.listen_address, config.metrics_port),
                Arc::clone(&metrics),
                shutdown_rx.clone(),
            )));
        }
        // Clients are served until shutdown or a drain, whichever comes first.
        let (close_clients, clients_closed) = watch::channel(false);
        background.push(tokio::spawn({
            let mut shutdown = shutdown_rx.clone();
            let close_clients = close_clients.clone();
            async move {
                let _ = shutdown.changed().await;
                close_clients.send_replace(true);
            }
        }));
        let _ = handler.operations.set(Arc::new(operations::NodeOperations {
            coordinator: Arc::clone(&coordinator),
            metrics: Arc::clone(&metrics),
            peers: Arc::clone(&peers),
            hints: Arc::clone(proxy.hints()),
            data_dir: config.data_dir.clone(),
            started: std::time::Instant::now(),
            close_clients,
            streaming: Arc::clone(&streaming),
            detector: Arc::clone(&detector),
        }));
        let _ = handler.coordinator.set(Arc::clone(&coordinator));
        let _ = handler.proxy.set(Arc::clone(&proxy));
        background.push(tokio::spawn(Arc::clone(&streaming).run_policy({
            let metrics = Arc::clone(&metrics);
            move || metrics.foreground_buckets()
        })));
        background.push(tokio::spawn(
            migration::MigrationDriver::new(
                Arc::clone(&metadata),
                Arc::clone(&proxy),
                Arc::clone(&peers),
                Arc::clone(&streaming),
                Arc::clone(&detector),
                config.migrations_per_node,
                Arc::clone(&strong),
            )
            .run(),
        ));
        if config.tablet_split_mib > 0 {
            background.push(tokio::spawn(splitting::run(
                Arc::clone(&metadata),
                Arc::clone(&coordinator),
                Arc::clone(&peers),
                Arc::clone(&strong),
                config.tablet_split_mib << 20,
            )));
        }
        background.push(tokio::spawn(membership::run_failure_detection(
            Arc::clone(&metadata),
            Arc::clone(&coordinator),
            Arc::clone(&proxy),
            detector,
            Arc::clone(&peers),
            transport,
            Arc::clone(&events),
        )));
        background.push(tokio::spawn(maintenance::collect_garbage_regularly(
            Arc::clone(&engine),
        )));
        background.push(tokio::spawn(maintenance::adapt_compaction_regularly(
            Arc::clone(&engine),
        )));
        background.push(tokio::spawn(maintenance::build_indexes_regularly(
            Arc::clone(coordinator.index_catalog()),
        )));
        background.push(tokio::spawn(maintenance::replay_batches_regularly(
            Arc::clone(&proxy),
        )));
        background.push(tokio::spawn(maintenance::sweep_hints_regularly(
            Arc::clone(&proxy),
        )));
        background.push(tokio::spawn(membership::follow_metadata(
            Arc::clone(&metadata),
            Arc::clone(&coordinator),
            Arc::clone(&events),
        )));
        let connection_threads = Arc::new(
            connection_threads::ConnectionThreads::start(config.connection_threads())
                .context("cannot start the connection threads")?,
        );
        let (cql_address, listener_task) = serve_clients(
            &config,
            Arc::clone(&coordinator),
            events,
            metrics,
            clients_closed,
            Arc::clone(&connection_threads),
        )
        .await?;
        tracing::info!(%cql_address, data_dir = %config.data_dir.display(), commitlog_sync = ?config.commitlog_sync, "Shoal node listening for CQL clients");
        Ok(Node {
            coordinator,
            metadata,
            peers,
            background,
            commit_log,
            lane,
            streaming,
            cql_address,
            shutdown,
            listener_task,
            connection_threads,
        })
    }

    pub fn cql_address(&self) -> SocketAddr {
        self.cql_address
    }

    /// Stops accepting clients, closes connections and makes every acknowledged write
    /// durable.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.listener_task.await;
        let connection_threads = Arc::clone(&self.connection_threads);
        let _ = tokio::task::spawn_blocking(move || connection_threads.stop()).await;
        for task in &self.background {
            task.abort();
        }
        self.metadata.shutdown().await;
        self.peers.stop();
        self.lane.stop();
        self.streaming.stop();
        let commit_log = Arc::clone(&self.commit_log);
        let _ = tokio::task::spawn_blocking(move || commit_log.stop()).await;
        tracing::info!("Shoal node stopped");
    }
}

/// Opens (or creates) the node's RocksDB store in its data directory.
fn open_storage(config: &Config) -> anyhow::Result<Arc<dyn Engine>> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data directory {}", config.data_dir.display()))?;
    let rocks_options = RocksOptions {
        block_cache_mib: config.block_cache_mib,
        memtable_mib: config.memtable_mib,
        ..RocksOptions::default()
    };
    Ok(Arc::new(
        RocksEngine::open(&config.data_dir.join("rocksdb"), &rocks_options)
            .with_context(|| format!("cannot open storage in {}", config.data_dir.display()))?,
    ))
}

/// How long a client has to finish its TLS handshake (or, with optional TLS, to send its
/// first byte).
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves one client connection: plain, TLS, or (optional TLS) whichever the client's
/// first byte says.
async fn serve_client(
    socket: tokio::net::TcpStream,
    tls: Option<(config::ClientTls, tokio_rustls::TlsAcceptor)>,
    services: connection::ConnectionServices,
) {
    let Some((mode, acceptor)) = tls else {
        return connection::serve(socket, services).await;
    };
    if mode == config::ClientTls::Optional {
        let mut first = [0u8; 1];
        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, socket.peek(&mut first)).await {
            Ok(Ok(1)) if first[0] != tls::TLS_HANDSHAKE_RECORD => {
                return connection::serve(socket, services).await;
            }
            Ok(Ok(1)) => {}
            _ => return,
        }
    }
    let peer = socket.peer_addr().ok();
    match tokio::time::timeout(
        TLS_HANDSHAKE_TIMEOUT,
        acceptor.accept(tls::buffered(socket)),
    )
    .await
    {
        Ok(Ok(stream)) => connection::serve_tls(stream, services).await,
        Ok(Err(error)) => tracing::info!(?peer, %error, "TLS handshake failed"),
        Err(_) => tracing::info!(?peer, "TLS handshake timed out"),
    }
}

/// Listens for CQL clients and serves each connection as one task on one of the
/// connection threads, until `shutdown`; returns the address it listens on and the
/// accepting task.
async fn serve_clients(
    config: &Config,
    coordinator: Arc<Coordinator>,
    events: Arc<events::EventBus>,
    metrics: Arc<metrics::Metrics>,
    shutdown_rx: watch::Receiver<bool>,
    connection_threads: Arc<connection_threads::ConnectionThreads>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let address = SocketAddr::new(config.listen_address, config.cql_port);
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen for CQL clients on {address}"))?;
    let cql_address = listener.local_addr()?;
    let mut shutdown_rx = shutdown_rx;
    let limits = connection::ConnectionLimits {
        max_frame_bytes: config.max_frame_bytes,
        max_in_flight: config.max_requests_in_flight_per_connection,
    };
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let tls = match (
        config.client_tls,
        &config.tls_certificate,
        &config.tls_private_key,
    ) {
        (config::ClientTls::Off, _, _) => None,
        (mode, Some(certificate), Some(key)) => Some((
            mode,
            Arc::new(tls::ServerCertificates::load(
                certificate,
                key,
                config.client_tls_ca_certificate.as_deref(),
            )?),
        )),
        _ => anyhow::bail!("client_tls needs tls_certificate and tls_private_key"),
    };
    let services = connection::ConnectionServices {
        coordinator,
        events,
        limits,
        apart_runtime: tokio::runtime::Handle::current(),
    };
    let listener_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown_rx.changed() => break,
                accepted = listener.accept() => {
                    let Ok((socket, peer)) = accepted else { continue };
                    let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
                        tracing::warn!(%peer, "refusing connection: max_connections reached");
                        continue;
                    };
                    let services = services.clone();
                    let tls = tls.as_ref().map(|(mode, certificates)| (*mode, certificates.acceptor()));
                    let mut connection_shutdown = shutdown_rx.clone();
                    let counted = metrics::ConnectionCount::open(&metrics);
                    // The socket moves to its connection's thread, and registers there.
                    let Ok(socket) = socket.into_std() else { continue };
                    connection_threads.place(async move {
                        if let Ok(socket) = tokio::net::TcpStream::from_std(socket) {
                            let serving = serve_client(socket, tls, services);
                            tokio::select! {
                                _ = serving => {}
                                _ = connection_shutdown.changed() => {}
                            }
                        }
                        drop((permit, counted));
                    });
                }
            }
        }
    });
    Ok((cql_address, listener_task))
}
