//! The node's Prometheus endpoint: `GET http://LISTEN_ADDRESS:METRICS_PORT/metrics`.
//!
//! Two kinds of figures:
//! - **Kept as requests run** ([`Metrics`] is the coordinator's
//!   [`StatementObserver`]): a latency histogram per statement class and consistency
//!   level (its count is the request rate), errors by CQL error code (every error answer,
//!   parse errors included), reads and writes per table, and connections. Each handle is
//!   resolved on its first use (a class × level, a table, an error code), so a request
//!   costs a few atomic additions and no allocation.
//! - **Read when scraped** ([`NodeCollector`]): storage (RocksDB's live bytes, memtables,
//!   running and pending compactions, level-0 files), each table's size, hints kept and
//!   dropped, the cluster metadata's Raft state, scans in progress, roles.
//!
//! Every name starts with `shoal_`; `docs/grafana/shoal.json` is a dashboard over them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use shoal_coordinator::class::StatementClass;
use shoal_coordinator::observe::{Observed, StatementObserver};
use shoal_coordinator::Coordinator;
use shoal_model::TableId;
use shoal_replication::Hints;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

/// Consistency levels by their protocol code (0 ANY … 10 LOCAL_ONE).
const CONSISTENCY_LEVELS: usize = 11;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    class: &'static str,
    consistency: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    keyspace: String,
    table: String,
}

/// A table's request counters, shared with the registry's families.
#[derive(Clone)]
struct TableCounters {
    reads: Counter,
    writes: Counter,
}

/// Latency buckets: 50 µs to ~13 s, doubling.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 2.0, 19)
}

/// The request metrics and the registry they are exported from.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Histogram>,
    /// `[class][consistency code]`, each made on its first request (so only the series
    /// in use are exported) and then used without a lock.
    latency: Vec<Vec<std::sync::OnceLock<Histogram>>>,
    errors: Family<ErrorLabels, Counter>,
    error_by_code: parking_lot::RwLock<HashMap<i32, Counter>>,
    table_reads: Family<TableLabels, Counter>,
    table_writes: Family<TableLabels, Counter>,
    tables: parking_lot::RwLock<HashMap<TableId, TableCounters>>,
    pub connections: Gauge,
    pub connections_total: Counter,
}

fn consistency_name(code: usize) -> &'static str {
    shoal_cql::request::Consistency::from_code(code as u16)
        .map(|c| c.name())
        .unwrap_or("UNKNOWN")
}

impl Metrics {
    /// The metrics of a node whose coordinator is `coordinator` (read when scraped; a
    /// weak reference, so the metrics do not keep the node alive).
    pub fn new(coordinator: &Arc<Coordinator>, hints: Option<Arc<Hints>>) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("shoal");
        let requests = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(latency_buckets())
        });
        registry.register(
            "request_latency_seconds",
            "CQL statements run by this node as coordinator, by class and consistency level: latency (the count is the request rate)",
            requests.clone(),
        );
        let latency = StatementClass::ALL
            .iter()
            .map(|_| {
                (0..CONSISTENCY_LEVELS)
                    .map(|_| std::sync::OnceLock::new())
                    .collect()
            })
            .collect();
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "request_errors",
            "Statements answered with an error, by CQL error code (hex)",
            errors.clone(),
        );
        let table_reads = Family::<TableLabels, Counter>::default();
        registry.register(
            "table_reads",
            "Reads of each table coordinated here",
            table_reads.clone(),
        );
        let table_writes = Family::<TableLabels, Counter>::default();
        registry.register(
            "table_writes",
            "Writes (statements, each of a batch) to each table coordinated here",
            table_writes.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "client_connections",
            "Client connections open now",
            connections.clone(),
        );
        let connections_total = Counter::default();
        registry.register(
            "client_connections_accepted",
            "Client connections accepted since start",
            connections_total.clone(),
        );
        registry.register_collector(Box::new(NodeCollector {
            coordinator: Arc::downgrade(coordinator),
            hints,
        }));
        Arc::new(Metrics {
            registry,
            requests,
            latency,
            errors,
            error_by_code: Default::default(),
            table_reads,
            table_writes,
            tables: Default::default(),
            connections,
            connections_total,
        })
    }

    /// The text exposition format Prometheus scrapes.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        out
    }

    fn table(&self, table: &shoal_schema::TableMetadata) -> TableCounters {
        if let Some(counters) = self.tables.read().get(&table.id) {
            return counters.clone();
        }
        let labels = TableLabels {
            keyspace: table.keyspace.clone(),
            table: table.name.clone(),
        };
        let counters = TableCounters {
            reads: self.table_reads.get_or_create(&labels).clone(),
            writes: self.table_writes.get_or_create(&labels).clone(),
        };
        self.tables.write().insert(table.id, counters.clone());
        counters
    }

    /// Reads and writes of `table` coordinated here since start.
    pub fn table_requests(&self, table: &TableId) -> (u64, u64) {
        self.tables.read().get(table).map_or((0, 0), |counters| {
            (counters.reads.get(), counters.writes.get())
        })
    }

    fn latency(&self, class: usize, level: usize) -> Option<&Histogram> {
        let cell = self.latency.get(class)?.get(level)?;
        Some(cell.get_or_init(|| {
            self.requests
                .get_or_create(&RequestLabels {
                    class: StatementClass::ALL[class].name(),
                    consistency: consistency_name(level),
                })
                .clone()
        }))
    }

    fn count_error(&self, code: i32) {
        if let Some(counter) = self.error_by_code.read().get(&code) {
            counter.inc();
            return;
        }
        let counter = self
            .errors
            .get_or_create(&ErrorLabels {
                code: format!("{code:#06x}"),
            })
            .clone();
        counter.inc();
        self.error_by_code.write().insert(code, counter);
    }
}

impl StatementObserver for Metrics {
    fn error(&self, error: &shoal_cql::CqlError) {
        self.count_error(error.code.code());
    }

    fn observe(&self, statement: &Observed<'_>) {
        let class = StatementClass::ALL
            .iter()
            .position(|c| *c == statement.class)
            .unwrap_or(0);
        let level = statement.consistency.code() as usize;
        if let Some(histogram) = self.latency(class, level) {
            histogram.observe(statement.elapsed.as_secs_f64());
        }
        let is_write = matches!(
            statement.class,
            StatementClass::Write | StatementClass::ConditionalWrite
        );
        for table in statement.tables {
            let counters = self.table(table);
            if is_write {
                counters.writes.inc();
            } else {
                counters.reads.inc();
            }
        }
    }
}

/// Figures read when Prometheus scrapes.
struct NodeCollector {
    coordinator: Weak<Coordinator>,
    hints: Option<Arc<Hints>>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric =
        encoder.encode_descriptor(name, help, None, ConstGauge::new(value).metric_type())?;
    ConstGauge::new(value).encode(metric)
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric =
        encoder.encode_descriptor(name, help, None, ConstCounter::new(value).metric_type())?;
    ConstCounter::new(value).encode(metric)
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(coordinator) = self.coordinator.upgrade() else {
            return Ok(());
        };
        let engine = coordinator.engine();
        for statistic in engine.statistics() {
            gauge(
                &mut encoder,
                statistic.name,
                statistic.help,
                statistic.value as i64,
            )?;
        }
        let schema = coordinator.schema();
        let sizes = Family::<TableLabels, Gauge>::default();
        for table in schema.user_keyspaces().flat_map(|k| k.tables.values()) {
            let lower = shoal_model::keys::table_prefix(&table.id);
            let upper = shoal_model::keys::table_end(&table.id);
            if let Some(bytes) = engine.approximate_range_bytes(&lower, &upper) {
                sizes
                    .get_or_create(&TableLabels {
                        keyspace: table.keyspace.clone(),
                        table: table.name.clone(),
                    })
                    .set(bytes as i64);
            }
        }
        let metric = encoder.encode_descriptor(
            "table_disk_bytes",
            "Bytes each table holds on disk on this node (estimate; memtables not included)",
            None,
            sizes.metric_type(),
        )?;
        sizes.encode(metric)?;
        gauge(
            &mut encoder,
            "scans_in_progress",
            "Scans running or waiting for one of the scan slots",
            coordinator.scans_in_progress() as i64,
        )?;
        gauge(
            &mut encoder,
            "roles",
            "Roles known to this node",
            coordinator.roles().current().roles.len() as i64,
        )?;
        if let Some(cluster) = coordinator.cluster() {
            let raft = cluster.metadata.raft_status();
            gauge(
                &mut encoder,
                "raft_term",
                "The cluster metadata's Raft term",
                raft.term as i64,
            )?;
            gauge(
                &mut encoder,
                "raft_is_leader",
                "1 if this node leads the cluster metadata's Raft group",
                i64::from(raft.is_leader),
            )?;
            gauge(
                &mut encoder,
                "raft_applied_index",
                "Index of the last Raft entry applied here",
                raft.last_applied as i64,
            )?;
            gauge(
                &mut encoder,
                "cluster_members",
                "Members of the cluster",
                cluster.metadata.state().members.len() as i64,
            )?;
        }
        if let Some(hints) = &self.hints {
            let (stored_bytes, dropped) = hints.stats();
            gauge(
                &mut encoder,
                "hints_stored_bytes",
                "Bytes of hints kept for replicas that were down",
                stored_bytes as i64,
            )?;
            counter(
                &mut encoder,
                "hints_dropped",
                "Hints not kept (window passed or the hints full)",
                dropped,
            )?;
        }
        Ok(())
    }
}

/// Serves `GET /metrics` on `address` until `shutdown`. A port already taken is logged,
/// not fatal: the node serves clients without its metrics.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::bind(address).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%address, %error, "cannot serve metrics");
            return;
        }
    };
    tracing::info!(%address, "serving Prometheus metrics on /metrics");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.render(),
                )
            }
        }),
    );
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        })
        .await;
}

/// Counts a client connection while it is open.
pub struct ConnectionCount(Arc<Metrics>);

impl ConnectionCount {
    pub fn open(metrics: &Arc<Metrics>) -> ConnectionCount {
        metrics.connections.inc();
        metrics.connections_total.inc();
        ConnectionCount(Arc::clone(metrics))
    }
}

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        self.0.connections.dec();
    }
}
