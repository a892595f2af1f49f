//! Running workloads against a cluster through the `scylla` driver.
//!
//! The table is YCSB's Cassandra binding's: `usertable (y_id varchar PRIMARY KEY,
//! field0..fieldN varchar)`. A *load* phase inserts records `0..records`; a *run* phase
//! issues the workload's operations from `--concurrency` workers, for `--operations`
//! operations or `--duration-seconds`, optionally at a `--target-ops-per-second`. At a
//! target rate an operation the server's slowness made late is measured from when it was
//! due, so a stalled server is not hidden by a stalled client, and any other from when it
//! was sent, so the client's timer is not counted (`latency_origin`); the workers'
//! schedules are staggered, so the operations arrive evenly spread, not in bursts of
//! `--concurrency`. The first `--warmup-seconds` are not recorded.

use crate::generators::key_name;
use crate::login::Login;
use crate::point::consistency;
use crate::routing::PointRoutes;
use crate::stats::{Recorder, Summary};
use crate::workload::{
    KeyPicker, OperationChooser, OperationKind, RequestDistribution, ScanLength, Workload,
};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::client::PoolSize;
use scylla::statement::prepared::PreparedStatement;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options shared by every workload.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: Login,
    /// Keyspace holding `usertable`.
    #[arg(long, default_value = "ycsb")]
    pub keyspace: String,
    /// Replication factor when the keyspace is created.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u32,
    /// Records in the table (YCSB `recordcount`).
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Stop the run phase after this many operations (YCSB `operationcount`).
    #[arg(long)]
    pub operations: Option<u64>,
    /// Stop the run phase after this long, when `--operations` is not given.
    #[arg(long, default_value_t = 60)]
    pub duration_seconds: u64,
    /// Seconds of the run phase that are not recorded.
    #[arg(long, default_value_t = 0)]
    pub warmup_seconds: u64,
    /// Requests kept in flight (YCSB `threadcount`).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Connections per node.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Limit the run phase to this many operations per second.
    #[arg(long)]
    pub target_ops_per_second: Option<f64>,
    /// Threads the client runs on (default: one per core). A fixed-rate load sharing its
    /// machine's cores with the nodes is best run on one: at 1000 reads/s on 2 cores, one
    /// thread cost the machine 153 µs of CPU per read against 262 µs on two
    /// (`bench/client-cpu`, `bench/results/2026-12-08-client-cpu`).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Consistency level of every request.
    #[arg(long, default_value = "one")]
    pub consistency: String,
    /// `load`, `run` or `both`.
    #[arg(long, default_value = "both")]
    pub phase: String,
    /// Write the summaries (with the per-second timeline) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG plot of the run phase.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print throughput and latency every second.
    #[arg(long)]
    pub timeline: bool,
    /// End the run phase as soon as this file exists (looked for every 200 ms): a run
    /// that lasts as long as something else does (a node joining, say).
    #[arg(long)]
    pub until_file: Option<PathBuf>,
    /// Fields per record (YCSB `fieldcount`).
    #[arg(long, default_value_t = 10)]
    pub field_count: usize,
    /// Bytes per field (YCSB `fieldlength`).
    #[arg(long, default_value_t = 100)]
    pub field_length: usize,
    /// How long the client waits for one request before giving up on it (the driver's
    /// request timeout).
    #[arg(long, default_value_t = 30)]
    pub request_timeout_seconds: u64,
    /// Create `usertable` as an ordered table (`WITH partitioner = 'ordered'`): range
    /// reads then return the next keys in key order, as in seed 002's experiment.
    #[arg(long)]
    pub ordered: bool,
    /// Send every point read to the node holding its key, by the tablet map in this file
    /// (`shoal admin ring KEYSPACE usertable --json`), as a token-aware driver does; for an
    /// ordered table, whose tokens drivers cannot compute. Nodes are reached on the
    /// contact point's port.
    #[arg(long, requires = "ordered")]
    pub route_point_reads: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct YcsbArgs {
    /// Core workload: a, b, c, d, e or f; or w (updates only, keys uniform).
    #[arg(long, default_value = "a")]
    pub workload: char,
    /// Override the workload's request distribution.
    #[arg(long, value_enum)]
    pub request_distribution: Option<RequestDistribution>,
    /// Override the workload's maximum scan length.
    #[arg(long)]
    pub max_scan_length: Option<u64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

#[derive(clap::Args, Debug)]
pub struct MixArgs {
    /// Share of point reads (0.9 for seed 002's 9:1, 0.5 for 5:5).
    #[arg(long, default_value_t = 0.9)]
    pub point_share: f64,
    /// Range reads return 1..=this many rows (uniform).
    #[arg(long, default_value_t = 10_000)]
    pub max_range_rows: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

struct Statements {
    read: PreparedStatement,
    updates: Vec<PreparedStatement>,
    insert: PreparedStatement,
    scan: PreparedStatement,
    range: PreparedStatement,
    range_from_key: PreparedStatement,
}

async fn connect(common: &CommonArgs) -> anyhow::Result<Session> {
    let connections = NonZeroUsize::new(common.connections.max(1)).unwrap_or(NonZeroUsize::MIN);
    let profile = scylla::client::execution_profile::ExecutionProfile::builder()
        .request_timeout(Some(Duration::from_secs(
            common.request_timeout_seconds.max(1),
        )))
        .build();
    common
        .login
        .apply(SessionBuilder::new())?
        .known_node(&common.contact)
        .pool_size(PoolSize::PerHost(connections))
        .default_execution_profile_handle(profile.into_handle())
        .build()
        .await
        .with_context(|| format!("cannot connect to {}", common.contact))
}

/// The port of a `host:port` contact point.
fn contact_port(contact: &str) -> anyhow::Result<u16> {
    contact
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .with_context(|| format!("contact point {contact:?} has no port (host:port)"))
}

async fn prepare(session: &Session, common: &CommonArgs) -> anyhow::Result<Statements> {
    let keyspace = &common.keyspace;
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {}}}",
                common.replication_factor
            ),
            &[],
        )
        .await?;
    let fields: Vec<String> = (0..common.field_count)
        .map(|i| format!("field{i} varchar"))
        .collect();
    session
        .query_unpaged(
            format!(
                "CREATE TABLE IF NOT EXISTS {keyspace}.usertable (y_id varchar PRIMARY KEY, {}){}",
                fields.join(", "),
                if common.ordered {
                    " WITH partitioner = 'ordered'"
                } else {
                    ""
                }
            ),
            &[],
        )
        .await?;
    session.await_schema_agreement().await?;
    let level = consistency(&common.consistency)?;
    let with_level = |mut statement: PreparedStatement| {
        statement.set_consistency(level);
        statement
    };
    let names: Vec<String> = (0..common.field_count)
        .map(|i| format!("field{i}"))
        .collect();
    let markers = vec!["?"; common.field_count + 1].join(", ");
    let mut updates = Vec::new();
    for name in &names {
        updates.push(with_level(
            session
                .prepare(format!(
                    "UPDATE {keyspace}.usertable SET {name} = ? WHERE y_id = ?"
                ))
                .await?,
        ));
    }
    Ok(Statements {
        read: with_level(
            session
                .prepare(format!("SELECT * FROM {keyspace}.usertable WHERE y_id = ?"))
                .await?,
        ),
        updates,
        insert: with_level(
            session
                .prepare(format!(
                    "INSERT INTO {keyspace}.usertable (y_id, {}) VALUES ({markers})",
                    names.join(", ")
                ))
                .await?,
        ),
        scan: with_level(
            session
                .prepare(format!(
                    "SELECT * FROM {keyspace}.usertable WHERE token(y_id) >= token(?) LIMIT ?"
                ))
                .await?,
        ),
        range: with_level(
            session
                .prepare(format!(
                    "SELECT y_id, field0 FROM {keyspace}.usertable WHERE token(y_id) >= ? LIMIT ?"
                ))
                .await?,
        ),
        range_from_key: with_level(
            session
                .prepare(format!(
                    "SELECT y_id, field0 FROM {keyspace}.usertable WHERE token(y_id) >= token(?) LIMIT ?"
                ))
                .await?,
        ),
    })
}

fn random_field(rng: &mut impl Rng, length: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..length)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Everything a worker shares with the others.
struct Shared {
    session: Session,
    statements: Statements,
    /// Where point reads go when `--route-point-reads` is given.
    point_routes: Option<PointRoutes>,
    workload: Workload,
    common: CommonArgs,
    /// Keys `0..inserted` exist.
    inserted: AtomicU64,
    /// Operations claimed so far (for `--operations`).
    claimed: AtomicU64,
    completed: AtomicU64,
    /// Set once `--until-file` exists.
    stopped: std::sync::atomic::AtomicBool,
}

async fn execute(
    shared: &Shared,
    kind: OperationKind,
    picker: &mut KeyPicker,
    scan_length: &mut ScanLength,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let session = &shared.session;
    let statements = &shared.statements;
    let existing = shared.inserted.load(Ordering::Relaxed);
    let error = |e: &dyn std::fmt::Display| e.to_string();
    match kind {
        OperationKind::Read | OperationKind::Point => {
            let key = key_name(picker.next(existing, rng));
            let read = match &shared.point_routes {
                Some(routes) => routes.statement_for(&key),
                None => &statements.read,
            };
            session
                .execute_unpaged(read, (key,))
                .await
                .map_err(|e| error(&e))?;
        }
        OperationKind::Update => {
            let key = key_name(picker.next(existing, rng));
            update_one_field(shared, key, rng).await?;
        }
        OperationKind::Insert => {
            let number = shared.inserted.fetch_add(1, Ordering::Relaxed);
            insert_record(shared, number, rng).await?;
        }
        OperationKind::Scan => {
            let key = key_name(picker.next(existing, rng));
            let length = scan_length.next(rng) as i32;
            let result = session
                .execute_unpaged(&statements.scan, (key, length))
                .await
                .map_err(|e| error(&e))?;
            result.into_rows_result().map_err(|e| error(&e))?;
        }
        OperationKind::Range => {
            let limit = scan_length.next(rng) as i32;
            // An ordered table's keys sit in a narrow band of tokens: its ranges start at a
            // random key (uniform over the keys), a hashed table's at a random token.
            let result = if shared.common.ordered {
                let start = key_name(rng.random_range(0..existing.max(1)));
                session
                    .execute_unpaged(&statements.range_from_key, (start, limit))
                    .await
            } else {
                let start: i64 = rng.random();
                session
                    .execute_unpaged(&statements.range, (start, limit))
                    .await
            }
            .map_err(|e| error(&e))?;
            result.into_rows_result().map_err(|e| error(&e))?;
        }
        OperationKind::ReadModifyWrite => {
            let key = key_name(picker.next(existing, rng));
            session
                .execute_unpaged(&statements.read, (key.clone(),))
                .await
                .map_err(|e| error(&e))?;
            update_one_field(shared, key, rng).await?;
        }
    }
    Ok(())
}

/// YCSB's update (`writeallfields=false`): one random field gets a new random value.
async fn update_one_field(
    shared: &Shared,
    key: String,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let statements = &shared.statements;
    let field = rng.random_range(0..statements.updates.len());
    let value = random_field(rng, shared.common.field_length);
    shared
        .session
        .execute_unpaged(&statements.updates[field], (value, key))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn insert_record(
    shared: &Shared,
    number: u64,
    rng: &mut rand::rngs::StdRng,
) -> Result<(), String> {
    let mut values: Vec<String> = Vec::with_capacity(shared.common.field_count + 1);
    values.push(key_name(number));
    for _ in 0..shared.common.field_count {
        values.push(random_field(rng, shared.common.field_length));
    }
    shared
        .session
        .execute_unpaged(&shared.statements.insert, values)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn progress_bar(label: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Where an operation's latency is measured from at a target rate.
///
/// A worker still waiting for its previous answer when this operation was `due` sends it
/// late because the server was slow: it is measured from when it was due, so a stalled
/// server is not hidden by the client waiting for it (coordinated omission). A worker that
/// was free sleeps until the operation is due, and the timer wakes it up to a millisecond
/// or so after that (Tokio's timer ticks in milliseconds): that lateness is the client's,
/// not the server's, so the operation is measured from when it is `sent`.
fn latency_origin(due: Instant, free_since: Instant, sent: Instant) -> Instant {
    if free_since > due {
        due
    } else {
        sent
    }
}

/// Runs one phase. `load` inserts records `0..records`; otherwise the workload runs.
async fn run_phase(shared: Arc<Shared>, load: bool) -> anyhow::Result<Summary> {
    let common = shared.common.clone();
    let workload = shared.workload.clone();
    let started = Instant::now();
    let started_wall = std::time::SystemTime::now();
    let measure_from = if load {
        started
    } else {
        started + Duration::from_secs(common.warmup_seconds)
    };
    let deadline = if load || common.operations.is_some() {
        None
    } else {
        Some(measure_from + Duration::from_secs(common.duration_seconds))
    };
    let interval = match (load, common.target_ops_per_second) {
        (false, Some(rate)) if rate > 0.0 => {
            Some(Duration::from_secs_f64(common.concurrency as f64 / rate))
        }
        _ => None,
    };
    let label = if load { "load" } else { "run" };
    let bar = progress_bar(&format!("{} {label}", workload.name));
    let reporter = {
        let shared = Arc::clone(&shared);
        let bar = bar.clone();
        tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64);
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let done = shared.completed.load(Ordering::Relaxed);
                let now = Instant::now();
                let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64();
                bar.set_message(format!("{done} operations, {rate:.0} ops/s now"));
                last = (now, done);
            }
        })
    };
    shared.completed.store(0, Ordering::Relaxed);
    shared.claimed.store(0, Ordering::Relaxed);
    let watcher = common.until_file.clone().filter(|_| !load).map(|path| {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            while !path.exists() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            shared.stopped.store(true, Ordering::Relaxed);
        })
    });
    // One recorder for every worker, its histograms made before any operation is timed. (A
    // recorder of its own per worker costs each worker ~180 KB of histograms on its first
    // answer: a burst of 1,000 clients then spent ~90 ms of the client's time in page
    // faults inside the measurement, delaying every answer behind them.) Its lock is held
    // only to add one sample.
    //
    // Every worker is a task of its own, as every YCSB client is a thread of its own: on
    // one task, an answer waited until that task had polled every other worker woken
    // before it (the first poll of a 1,000-client burst alone sends 1,000 requests), so
    // the client's own turn-taking was counted in every latency.
    let kinds: Vec<OperationKind> = if load {
        vec![OperationKind::Insert]
    } else {
        OperationChooser::new(&workload.proportions)
            .kinds()
            .collect()
    };
    let recorder = Arc::new(std::sync::Mutex::new(Recorder::expecting(kinds)));
    let workers = (0..common.concurrency).map(|worker| {
        let shared = Arc::clone(&shared);
        let workload = workload.clone();
        let common = common.clone();
        let recorder = Arc::clone(&recorder);
        tokio::spawn(async move {
            let mut rng: rand::rngs::StdRng =
                rand::SeedableRng::seed_from_u64(rand::random::<u64>() ^ worker as u64);
            let chooser = OperationChooser::new(&workload.proportions);
            let mut picker = KeyPicker::new(workload.request_distribution, common.records);
            let mut scan_length =
                ScanLength::new(workload.scan_length_distribution, workload.max_scan_length);
            // At a target rate every worker issues one operation per `interval`; their
            // schedules are spread evenly over it (as YCSB staggers its threads), so the
            // cluster sees a steady stream, not all the workers' requests at once.
            let mut intended = Instant::now()
                + interval.map_or(Duration::ZERO, |interval| {
                    interval.mul_f64(worker as f64 / common.concurrency as f64)
                });
            // When this worker's previous answer came (so whether it was free when its next
            // operation was due).
            let mut free_since = Instant::now();
            loop {
                if let Some(interval) = interval {
                    intended += interval;
                    tokio::time::sleep_until(intended.into()).await;
                }
                let (kind, outcome, began) = if load {
                    let number = shared.claimed.fetch_add(1, Ordering::Relaxed);
                    if number >= common.records {
                        break;
                    }
                    let began = Instant::now();
                    (
                        OperationKind::Insert,
                        insert_record(&shared, number, &mut rng).await,
                        began,
                    )
                } else {
                    if let Some(limit) = common.operations {
                        if shared.claimed.fetch_add(1, Ordering::Relaxed) >= limit {
                            break;
                        }
                    }
                    let began = if interval.is_some() {
                        latency_origin(intended, free_since, Instant::now())
                    } else {
                        Instant::now()
                    };
                    let kind = chooser.next(&mut rng);
                    (
                        kind,
                        execute(&shared, kind, &mut picker, &mut scan_length, &mut rng).await,
                        began,
                    )
                };
                let finished = Instant::now();
                free_since = finished;
                if deadline.is_some_and(|d| finished >= d)
                    || (!load && shared.stopped.load(Ordering::Relaxed))
                {
                    break;
                }
                shared.completed.fetch_add(1, Ordering::Relaxed);
                if began >= measure_from {
                    let began_micros = (began - measure_from).as_micros() as u64;
                    let mut recorder = recorder.lock().unwrap_or_else(|e| e.into_inner());
                    match outcome {
                        Ok(()) => recorder.success(
                            kind,
                            (finished - began).as_micros() as u64,
                            began_micros,
                        ),
                        Err(message) => recorder.failure(kind, &message),
                    }
                }
            }
        })
    });
    let finished = futures::future::join_all(workers).await;
    reporter.abort();
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    bar.finish_and_clear();
    for worker in finished {
        worker.context("a client worker failed")?;
    }
    let elapsed = match deadline.filter(|_| !shared.stopped.load(Ordering::Relaxed)) {
        Some(deadline) => deadline
            .min(Instant::now())
            .saturating_duration_since(measure_from),
        None => Instant::now().saturating_duration_since(measure_from),
    };
    let recorded = recorder.lock().unwrap_or_else(|e| e.into_inner());
    if load {
        shared.inserted.store(common.records, Ordering::Relaxed);
    }
    let mut summary = recorded.summary(&workload.name, label, elapsed.as_secs_f64());
    summary.measured_from_unix_ms = (started_wall + (measure_from - started))
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    Ok(summary)
}

fn run_workload(workload: Workload, common: CommonArgs) -> anyhow::Result<()> {
    anyhow::ensure!(common.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(common.records >= 1, "--records must be at least 1");
    anyhow::ensure!(common.field_count >= 1, "--field-count must be at least 1");
    anyhow::ensure!(
        matches!(common.phase.as_str(), "load" | "run" | "both"),
        "--phase must be load, run or both"
    );
    let runtime = crate::client_runtime(common.client_threads)?;
    runtime.block_on(async move {
        let session = connect(&common).await?;
        let statements = prepare(&session, &common).await?;
        let point_routes = match &common.route_point_reads {
            Some(ring) => Some(PointRoutes::load(
                ring,
                &statements.read,
                contact_port(&common.contact)?,
                Duration::from_secs(common.request_timeout_seconds.max(1)),
            )?),
            None => None,
        };
        let shared = Arc::new(Shared {
            session,
            statements,
            point_routes,
            workload: workload.clone(),
            common: common.clone(),
            inserted: AtomicU64::new(common.records),
            claimed: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        println!(
            "shoal bench {}: {} records, {} in flight, consistency {}, against {}",
            workload.name, common.records, common.concurrency, common.consistency, common.contact
        );
        let mut summaries = Vec::new();
        if matches!(common.phase.as_str(), "load" | "both") {
            let summary = run_phase(Arc::clone(&shared), true).await?;
            summary.print();
            summaries.push(summary);
        }
        if matches!(common.phase.as_str(), "run" | "both") {
            let summary = run_phase(Arc::clone(&shared), false).await?;
            summary.print();
            if common.timeline {
                for point in &summary.timeline {
                    println!("  second {:>4}: {:>8} ops  p50 {:.3} ms  p99 {:.3} ms", point.second, point.operations, point.p50_ms, point.p99_ms);
                }
            }
            if let Some(path) = &common.plot {
                crate::report::plot(&summary, path)?;
                println!("plot written to {}", path.display());
            }
            summaries.push(summary);
        }
        if let Some(path) = &common.json {
            let document = serde_json::json!({ "workload": workload, "contact": common.contact, "summaries": summaries });
            std::fs::write(path, serde_json::to_string_pretty(&document)?)?;
            println!("results written to {}", path.display());
        }
        anyhow::Ok(())
    })
}

pub fn run_ycsb(args: YcsbArgs) -> anyhow::Result<()> {
    let mut workload = Workload::ycsb(args.workload).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown YCSB workload '{}' (expected a to f)",
            args.workload
        )
    })?;
    if let Some(distribution) = args.request_distribution {
        workload.request_distribution = distribution;
    }
    if let Some(max) = args.max_scan_length {
        workload.max_scan_length = max;
    }
    workload.field_count = args.common.field_count;
    workload.field_length = args.common.field_length;
    run_workload(workload, args.common)
}

pub fn run_mix(args: MixArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.point_share),
        "--point-share must be between 0 and 1"
    );
    let workload = Workload::point_range_mix(args.point_share, args.max_range_rows);
    run_workload(workload, args.common)
}

#[cfg(test)]
mod tests {
    use super::latency_origin;
    use std::time::{Duration, Instant};

    #[test]
    fn an_operation_sent_late_because_of_the_server_counts_from_when_it_was_due() {
        let due = Instant::now();
        let answered_after_due = due + Duration::from_millis(40);
        let sent = answered_after_due + Duration::from_micros(5);
        assert_eq!(latency_origin(due, answered_after_due, sent), due);
    }

    #[test]
    fn a_free_worker_woken_late_by_its_timer_counts_from_when_it_sent() {
        let answered = Instant::now();
        let due = answered + Duration::from_millis(10);
        let woken_late = due + Duration::from_micros(900);
        assert_eq!(latency_origin(due, answered, woken_late), woken_late);
    }
}
