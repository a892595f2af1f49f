//! The node's Prometheus endpoint: `GET http://LISTEN_ADDRESS:METRICS_PORT/metrics`.
//!
//! Two kinds of figures:
//! - **Kept as requests run** ([`Metrics`] is the coordinator's
//!   [`StatementObserver`]): a latency histogram per statement class and consistency
//!   level (its count is the request rate), errors by CQL error code (every error answer,
//!   parse errors included), reads, writes, their latencies and the tombstones reads went
//!   over per table, and connections. Each handle is resolved on its first use (a class × level, a table, an
//!   error code), and histograms are [`Latency`] (atomic buckets), so a request costs a
//!   few atomic additions: no lock taken for writing, no allocation.
//! - **Read when scraped** (`scrape::NodeCollector`): storage (RocksDB's live bytes, memtables,
//!   running and pending compactions, level-0 files), each table's size, hints kept and
//!   dropped, read repairs and anti-entropy repairs, data streams, the cluster metadata's Raft state, scans in progress, roles.
//!
//! Every name starts with `shoal_`; `docs/grafana/shoal.json` is a dashboard over them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use shoal_cluster::MemberState;
use shoal_coordinator::class::StatementClass;
use shoal_coordinator::observe::{Observed, StatementObserver};
use shoal_coordinator::Coordinator;
use shoal_model::TableId;
use shoal_replication::StorageProxy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

mod scrape;

use scrape::NodeCollector;

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

/// A table's request counters and latencies, shared with the registry's families.
#[derive(Clone)]
struct TableCounters {
    reads: Counter,
    writes: Counter,
    tombstones: Counter,
    read_latency: Latency,
    write_latency: Latency,
}

/// Latency buckets' upper bounds: 50 µs, doubling, to ~13 s (then +Inf).
const LATENCY_BUCKETS: usize = 19;

fn bucket_bound_seconds(index: usize) -> f64 {
    0.000_05 * f64::from(1u32 << index)
}

/// A latency histogram whose observation is three relaxed atomic additions — no lock
/// (prometheus-client's own histogram takes a write lock per observation).
#[derive(Debug, Clone, Default)]
pub struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Per bucket (not cumulative); the last one is +Inf.
    buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Latency {
    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // Bucket i holds (bound(i-1), bound(i)] with bound(i) = 50 µs · 2^i.
        let units = nanos.div_ceil(50_000).max(1);
        let index = (u64::BITS - (units - 1).leading_zeros()) as usize;
        let counts = &self.0;
        counts.buckets[index.min(LATENCY_BUCKETS)].fetch_add(1, Ordering::Relaxed);
        counts.count.fetch_add(1, Ordering::Relaxed);
        counts.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// `(upper bound in seconds, observations in that bucket)`, +Inf last.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.0
            .buckets
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let bound = if i < LATENCY_BUCKETS {
                    bucket_bound_seconds(i)
                } else {
                    f64::MAX
                };
                (bound, count.load(Ordering::Relaxed))
            })
            .collect()
    }

    /// The bucket bound at or under which `quantile` of the observations fall (seconds);
    /// `None` before any observation.
    pub fn quantile(&self, quantile: f64) -> Option<f64> {
        let buckets = self.buckets();
        let total: u64 = buckets.iter().map(|(_, c)| c).sum();
        if total == 0 {
            return None;
        }
        let wanted = (quantile * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        buckets.into_iter().find_map(|(bound, count)| {
            seen += count;
            (seen >= wanted).then_some(bound)
        })
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let count = self.0.count.load(Ordering::Relaxed);
        encoder.encode_histogram::<NoLabelSet>(sum, count, &self.buckets(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The request metrics and the registry they are exported from.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Latency>,
    /// `[class][consistency code]`, each made on its first request (so only the series
    /// in use are exported) and then used without a lock.
    latency: Vec<Vec<std::sync::OnceLock<Latency>>>,
    errors: Family<ErrorLabels, Counter>,
    error_by_code: parking_lot::RwLock<HashMap<i32, Counter>>,
    table_reads: Family<TableLabels, Counter>,
    table_writes: Family<TableLabels, Counter>,
    table_tombstones: Family<TableLabels, Counter>,
    table_read_latency: Family<TableLabels, Latency>,
    table_write_latency: Family<TableLabels, Latency>,
    tables: parking_lot::RwLock<HashMap<TableId, TableCounters>>,
    pub connections: Gauge,
    pub connections_total: Counter,
    /// Replica requests served for clients other nodes coordinate.
    replica_requests: Latency,
    /// Every client request that touches a table (reads, scans, writes), whatever its
    /// class or level, and every replica request served for another node's client: what
    /// streaming yields to (`crate::streaming::policy`).
    foreground: Latency,
    /// Streaming, for its figures (set once the node has it).
    streaming: Arc<std::sync::OnceLock<Arc<crate::streaming::Streaming>>>,
    /// The consensus runtime of strongly consistent keyspaces, for its counters.
    consensus: Arc<std::sync::OnceLock<Arc<shoal_consensus::runtime::Counters>>>,
}

fn consistency_name(code: usize) -> &'static str {
    shoal_cql::request::Consistency::from_code(code as u16)
        .map(|c| c.name())
        .unwrap_or("UNKNOWN")
}

impl Metrics {
    /// The metrics of a node whose coordinator is `coordinator` (read when scraped; a
    /// weak reference, so the metrics do not keep the node alive).
    pub fn new(coordinator: &Arc<Coordinator>, proxy: Option<Arc<StorageProxy>>) -> Arc<Metrics> {
        let mut registry = Registry::with_prefix("shoal");
        let requests = Family::<RequestLabels, Latency>::default();
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
        let table_tombstones = Family::<TableLabels, Counter>::default();
        registry.register(
            "table_tombstones_read",
            "Tombstones (deletions, expired cells) the reads of each table coordinated here went over",
            table_tombstones.clone(),
        );
        let table_read_latency = Family::<TableLabels, Latency>::default();
        registry.register(
            "table_read_latency_seconds",
            "Latency of the reads of each table coordinated here",
            table_read_latency.clone(),
        );
        let table_write_latency = Family::<TableLabels, Latency>::default();
        registry.register(
            "table_write_latency_seconds",
            "Latency of the writes to each table coordinated here (a batch counts for each of its tables)",
            table_write_latency.clone(),
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
        let replica_requests = Latency::default();
        registry.register(
            "replica_request_latency_seconds",
            "Replica requests this node served for other nodes' clients (reads, writes, scan chunks, Paxos steps): latency, from the request read to its answer (the count is the rate)",
            replica_requests.clone(),
        );
        let streaming: Arc<std::sync::OnceLock<Arc<crate::streaming::Streaming>>> = Arc::default();
        let consensus: Arc<std::sync::OnceLock<Arc<shoal_consensus::runtime::Counters>>> =
            Arc::default();
        registry.register_collector(Box::new(NodeCollector {
            coordinator: Arc::downgrade(coordinator),
            proxy,
            streaming: Arc::clone(&streaming),
            consensus: Arc::clone(&consensus),
        }));
        Arc::new(Metrics {
            registry,
            requests,
            latency,
            errors,
            error_by_code: Default::default(),
            table_reads,
            table_writes,
            table_tombstones,
            table_read_latency,
            table_write_latency,
            tables: Default::default(),
            connections,
            connections_total,
            replica_requests,
            foreground: Latency::default(),
            streaming,
            consensus,
        })
    }

    /// Exports the counters of the node's consensus runtime from now on.
    pub fn set_consensus(&self, counters: Arc<shoal_consensus::runtime::Counters>) {
        let _ = self.consensus.set(counters);
    }

    /// Exports the node's streaming figures from now on.
    pub fn set_streaming(&self, streaming: Arc<crate::streaming::Streaming>) {
        let _ = self.streaming.set(streaming);
    }

    /// The text exposition format Prometheus scrapes.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        out
    }

    /// Runs `record` on the table's counters, made on the table's first request.
    fn with_table(&self, table: &shoal_schema::TableMetadata, record: impl Fn(&TableCounters)) {
        if let Some(counters) = self.tables.read().get(&table.id) {
            return record(counters);
        }
        let labels = TableLabels {
            keyspace: table.keyspace.clone(),
            table: table.name.clone(),
        };
        let counters = TableCounters {
            reads: self.table_reads.get_or_create(&labels).clone(),
            writes: self.table_writes.get_or_create(&labels).clone(),
            tombstones: self.table_tombstones.get_or_create(&labels).clone(),
            read_latency: self.table_read_latency.get_or_create(&labels).clone(),
            write_latency: self.table_write_latency.get_or_create(&labels).clone(),
        };
        record(&counters);
        self.tables.write().insert(table.id, counters);
    }

    /// Reads and writes of `table` coordinated here since start.
    pub fn table_requests(&self, table: &TableId) -> (u64, u64) {
        self.tables.read().get(table).map_or((0, 0), |counters| {
            (counters.reads.get(), counters.writes.get())
        })
    }

    /// The read and write latencies of `table` coordinated here since start.
    pub fn table_latencies(&self, table: &TableId) -> Option<(Latency, Latency)> {
        self.tables
            .read()
            .get(table)
            .map(|c| (c.read_latency.clone(), c.write_latency.clone()))
    }

    /// A replica request served for a client another node coordinates took `elapsed`.
    pub fn observe_replica_request(&self, elapsed: Duration) {
        self.replica_requests.observe(elapsed);
        self.foreground.observe(elapsed);
    }

    /// Client requests on tables and replica requests served for other nodes' clients, by
    /// latency bucket (cumulative counts since start).
    pub fn foreground_buckets(&self) -> Vec<(f64, u64)> {
        self.foreground.buckets()
    }

    fn latency(&self, class: usize, level: usize) -> Option<&Latency> {
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

    fn tombstones(&self, table: &shoal_schema::TableMetadata, count: u64) {
        self.with_table(table, |counters| {
            counters.tombstones.inc_by(count);
        });
    }

    fn observe(&self, statement: &Observed<'_>) {
        let class = StatementClass::ALL
            .iter()
            .position(|c| *c == statement.class)
            .unwrap_or(0);
        let level = statement.consistency.code() as usize;
        if let Some(histogram) = self.latency(class, level) {
            histogram.observe(statement.elapsed);
        }
        if !statement.tables.is_empty() {
            self.foreground.observe(statement.elapsed);
        }
        let is_write = matches!(
            statement.class,
            StatementClass::Write | StatementClass::ConditionalWrite
        );
        for table in statement.tables {
            self.with_table(table, |counters| {
                if is_write {
                    counters.writes.inc();
                    counters.write_latency.observe(statement.elapsed);
                } else {
                    counters.reads.inc();
                    counters.read_latency.observe(statement.elapsed);
                }
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_holds_it() {
        let latency = Latency::default();
        for micros in [1, 50, 51, 100, 101, 200, 13_107_200, 13_107_201] {
            latency.observe(Duration::from_micros(micros));
        }
        let counts: Vec<u64> = latency.buckets().iter().map(|(_, c)| *c).collect();
        assert_eq!(&counts[..3], &[2, 2, 2]);
        assert_eq!(counts[LATENCY_BUCKETS - 1], 1); // 13.1072 s, the last finite bound
        assert_eq!(counts[LATENCY_BUCKETS], 1); // beyond it: +Inf
        assert_eq!(latency.quantile(0.5), Some(bucket_bound_seconds(1)));
        assert_eq!(Latency::default().quantile(0.5), None);
    }
}
