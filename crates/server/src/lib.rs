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
//! - [`peer_statements`] — prepared statements a client executes here but prepared only on
//!   other nodes, found there instead of answered UNPREPARED.
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
pub mod large_buffers;
pub mod maintenance;
pub mod membership;
pub mod metrics;
pub mod migration;
pub mod operations;
pub mod peer_statements;
pub mod splitting;
mod starting;
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
use shoal_coordinator::{ClusterView, Coordinator};
use shoal_model::HostId;
use shoal_replication::{Liveness, LocalReplica};
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
        let (peers, lane) = starting::peers_and_lane(&config, internode_tls.as_ref());
        let replica = Arc::new(LocalReplica::new(Arc::clone(&engine), commit_log.clone()));
        let streaming = Arc::new(
            streaming::Streaming::new(
                Arc::clone(&replica),
                Arc::clone(&lane),
                starting::stream_policy(&config),
                config.stream_nice,
            )
            .context("cannot start the streaming lane")?,
        );
        let transport = Arc::new(membership::Transport {
            peers: Arc::clone(&peers),
        });
        let handler = Arc::new(membership::NodeHandler::new(host_id, Arc::clone(&detector)));
        let _ = handler.streaming.set(Arc::clone(&streaming));
        let mut background = vec![
            starting::serve_peers(
                &config,
                &handler,
                shutdown_rx.clone(),
                internode_tls.clone(),
            )
            .await?,
        ];

        let metadata =
            starting::enter_cluster(&config, &engine, host_id, &transport, &handler).await?;

        let info = starting::node_info(&config, host_id);
        let liveness = Arc::clone(&detector) as Arc<dyn Liveness>;
        let proxy = starting::storage_proxy(
            &config,
            &engine,
            &commit_log,
            &metadata,
            &transport,
            &liveness,
            replica,
        );
        let (schema, auth) = starting::schema_and_roles(&config, &engine)?;
        let strong =
            starting::strong_tables(&config, &metadata, &schema, &peers, &engine, internode_tls)?;
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
        coordinator.set_prepared_elsewhere(Arc::new(peer_statements::PeerStatements {
            me: host_id,
            metadata: Arc::clone(&metadata),
            peers: Arc::clone(&peers),
            liveness: Arc::clone(&detector) as Arc<dyn Liveness>,
            next_asked: Default::default(),
        }));
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
            background.push(starting::create_default_superuser(&coordinator).await);
        }
        background.push(tokio::spawn(maintenance::place_system_tables(Arc::clone(
            &coordinator,
        ))));
        let metrics = starting::metrics(&coordinator, &proxy, &streaming, &strong);
        let _ = handler.metrics.set(Arc::clone(&metrics));
        if config.metrics_port != 0 {
            background.push(tokio::spawn(metrics::serve(
                SocketAddr::new(config.listen_address, config.metrics_port),
                Arc::clone(&metrics),
                shutdown_rx.clone(),
            )));
        }
        // Clients are served until shutdown or a drain, whichever comes first.
        let (close_clients, clients_closed) = watch::channel(false);
        background.push(starting::close_clients_on_shutdown(
            shutdown_rx.clone(),
            close_clients.clone(),
        ));
        let services = starting::Services {
            metadata: Arc::clone(&metadata),
            coordinator: Arc::clone(&coordinator),
            proxy: Arc::clone(&proxy),
            peers: Arc::clone(&peers),
            streaming: Arc::clone(&streaming),
            detector,
            strong,
            metrics: Arc::clone(&metrics),
            events: Arc::clone(&events),
        };
        let _ = handler
            .operations
            .set(Arc::new(services.operations(&config, close_clients)));
        let _ = handler.coordinator.set(Arc::clone(&coordinator));
        let _ = handler.proxy.set(Arc::clone(&proxy));
        background.extend(services.spawn_cluster_tasks(&config, transport));
        background.extend(starting::spawn_maintenance(&engine, &coordinator, &proxy));
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
