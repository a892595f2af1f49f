//! `shoal bench point`: a point read/write load generator for any CQL cluster (Shoal or
//! Apache Cassandra), through the Rust `scylla` driver with prepared statements and
//! token-aware routing: 100-byte values in a `kv` table, the single-node benchmark.
//! `--fields 10` writes and reads rows of ten such values instead (a YCSB row), in a table
//! of their own (`kv_10_fields`).
//!
//! It keeps `--concurrency` requests in flight, measures every request's latency into an
//! HDR histogram, and prints throughput and percentiles. Benchmarks are never tests: the
//! figures are printed, not asserted.

use anyhow::Context;
use futures::future::join_all;
use hdrhistogram::Histogram;
use rand::Rng;
use scylla::client::session::Session;
use scylla::client::PoolSize;
use scylla::statement::Consistency;
use scylla::value::CqlValue;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Insert random keys.
    Write,
    /// Read random keys (load them first with `--load`).
    Read,
}

#[derive(clap::Args, Debug)]
pub struct PointArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: crate::login::Login,
    /// Keyspace to create and use.
    #[arg(long, default_value = "shoal_bench")]
    pub keyspace: String,
    /// Replication factor of the keyspace.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u32,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Values per row: 1 is the `kv (k, v)` table; more are the columns `f0..` of
    /// `kv_<n>_fields`, every one written by each INSERT and read by each SELECT.
    #[arg(long, default_value_t = 1)]
    pub fields: usize,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Length of the measured phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_seconds: u64,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// What the measured phase does.
    #[arg(long, value_enum, default_value_t = Operation::Write)]
    pub operation: Operation,
    /// Insert every record (0..records) before the measured phase.
    #[arg(long)]
    pub load: bool,
    /// Consistency level: one, quorum, all, ...
    #[arg(long, default_value = "one")]
    pub consistency: String,
    /// Threads the client runs on. One (the default) keeps the driver's connection tasks
    /// and the requests on the same thread: no cross-thread wake-up per request, so the
    /// client takes as little as it can of the CPU it shares with the server.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Connections the driver opens to the node (the requests are spread over them).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
}

pub(crate) fn consistency(name: &str) -> anyhow::Result<Consistency> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "any" => Consistency::Any,
        "one" => Consistency::One,
        "two" => Consistency::Two,
        "three" => Consistency::Three,
        "quorum" => Consistency::Quorum,
        "all" => Consistency::All,
        "local_quorum" => Consistency::LocalQuorum,
        "local_one" => Consistency::LocalOne,
        other => anyhow::bail!("unknown consistency level {other}"),
    })
}

/// Results of one phase.
pub(crate) struct PhaseResult {
    operations: u64,
    errors: u64,
    elapsed: Duration,
    latency_micros: Histogram<u64>,
}

/// One worker's latencies, operations and errors.
pub(crate) type WorkerResult = (Histogram<u64>, u64, u64);

impl PhaseResult {
    /// The workers' results together, over `elapsed`.
    pub(crate) fn merge(
        workers: Vec<anyhow::Result<WorkerResult>>,
        elapsed: Duration,
    ) -> anyhow::Result<PhaseResult> {
        let mut latency_micros = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        let (mut operations, mut errors) = (0, 0);
        for worker in workers {
            let (histogram, ops, errs) = worker?;
            latency_micros.add(&histogram)?;
            operations += ops;
            errors += errs;
        }
        Ok(PhaseResult {
            operations,
            errors,
            elapsed,
            latency_micros,
        })
    }

    /// Runs `operation(id)` once for every id in `0..count`, `concurrency` at a time; an
    /// operation answers whether it succeeded. Successes are timed; the phase lasts
    /// until the last one.
    pub(crate) async fn each_once<F, Fut>(
        count: u64,
        concurrency: usize,
        operation: F,
    ) -> anyhow::Result<PhaseResult>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = bool>,
    {
        let next = AtomicU64::new(0);
        let start = Instant::now();
        let workers = (0..concurrency).map(|_| async {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let (mut operations, mut errors) = (0u64, 0u64);
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= count {
                    break;
                }
                let began = Instant::now();
                if operation(id).await {
                    operations += 1;
                    histogram.record(began.elapsed().as_micros().max(1) as u64)?;
                } else {
                    errors += 1;
                }
            }
            anyhow::Ok((histogram, operations, errors))
        });
        PhaseResult::merge(join_all(workers).await, start.elapsed())
    }

    /// Runs `operation` again and again from `concurrency` workers for `warmup` and then
    /// `duration`; only what started after the warm-up and finished within the duration
    /// is counted (an operation answers whether it succeeded).
    pub(crate) async fn timed<F, Fut>(
        concurrency: usize,
        warmup: Duration,
        duration: Duration,
        operation: F,
    ) -> anyhow::Result<PhaseResult>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        let measure_from = Instant::now() + warmup;
        let end = measure_from + duration;
        let workers = (0..concurrency).map(|_| async {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let (mut operations, mut errors) = (0u64, 0u64);
            loop {
                let began = Instant::now();
                let succeeded = operation().await;
                let finished = Instant::now();
                if finished >= end {
                    break;
                }
                if began < measure_from {
                    continue;
                }
                if succeeded {
                    operations += 1;
                    histogram.record((finished - began).as_micros().max(1) as u64)?;
                } else {
                    errors += 1;
                }
            }
            anyhow::Ok((histogram, operations, errors))
        });
        let results = join_all(workers).await;
        PhaseResult::merge(results, Instant::now().min(end) - measure_from)
    }

    /// Prints the phase's figures and, when `path` is given, writes them there as JSON
    /// with `extra` fields added.
    pub(crate) fn report(
        &self,
        name: &str,
        path: Option<&std::path::Path>,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> anyhow::Result<()> {
        self.print(name);
        if let Some(path) = path {
            let mut json = self.json(name);
            if let Some(object) = json.as_object_mut() {
                object.extend(extra);
            }
            std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        }
        Ok(())
    }

    /// The figures as JSON: operations/s and latency percentiles in milliseconds.
    pub(crate) fn json(&self, name: &str) -> serde_json::Value {
        let quantile = |q: f64| self.latency_micros.value_at_quantile(q) as f64 / 1000.0;
        serde_json::json!({
            "phase": name,
            "operations": self.operations,
            "errors": self.errors,
            "seconds": self.elapsed.as_secs_f64(),
            "ops_per_second": self.operations as f64 / self.elapsed.as_secs_f64(),
            "p50_ms": quantile(0.50),
            "p99_ms": quantile(0.99),
            "p999_ms": quantile(0.999),
        })
    }

    pub(crate) fn print(&self, name: &str) {
        let seconds = self.elapsed.as_secs_f64();
        let quantile = |q: f64| self.latency_micros.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "{name:>6}: {:>10.0} ops/s  ({} ops in {:.1}s, {} errors)  latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            self.operations as f64 / seconds,
            self.operations,
            seconds,
            self.errors,
            quantile(0.50),
            quantile(0.90),
            quantile(0.99),
            quantile(0.999),
            self.latency_micros.max() as f64 / 1000.0,
        );
    }
}

/// The table `args` writes and reads, and its value columns.
fn table_and_columns(args: &PointArgs) -> (String, Vec<String>) {
    if args.fields == 1 {
        return ("kv".into(), vec!["v".into()]);
    }
    let columns = (0..args.fields).map(|field| format!("f{field}")).collect();
    (format!("kv_{}_fields", args.fields), columns)
}

async fn setup(session: &Session, args: &PointArgs) -> anyhow::Result<()> {
    let (table, columns) = table_and_columns(args);
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE IF NOT EXISTS {} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {}}}",
                args.keyspace, args.replication_factor
            ),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!(
                "CREATE TABLE IF NOT EXISTS {}.{table} (k bigint PRIMARY KEY, {})",
                args.keyspace,
                columns
                    .iter()
                    .map(|column| format!("{column} blob"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            &[],
        )
        .await?;
    session.await_schema_agreement().await?;
    Ok(())
}

/// Runs `concurrency` workers issuing `operation` until `deadline`; the first
/// `warmup` is not measured. With `sequential_keys`, writes walk 0..records once.
async fn run_phase(
    session: Arc<Session>,
    args: &PointArgs,
    operation: Operation,
    warmup: Duration,
    duration: Duration,
    sequential_keys: bool,
) -> anyhow::Result<PhaseResult> {
    let (table, columns) = table_and_columns(args);
    let mut insert = session
        .prepare(format!(
            "INSERT INTO {}.{table} (k, {}) VALUES (?{})",
            args.keyspace,
            columns.join(", "),
            ", ?".repeat(columns.len())
        ))
        .await?;
    let mut select = session
        .prepare(format!(
            "SELECT {} FROM {}.{table} WHERE k = ?",
            columns.join(", "),
            args.keyspace
        ))
        .await?;
    let level = consistency(&args.consistency)?;
    insert.set_consistency(level);
    select.set_consistency(level);
    let next_key = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let workers = (0..args.concurrency).map(|_| {
        let session = Arc::clone(&session);
        let insert = insert.clone();
        let select = select.clone();
        let next_key = Arc::clone(&next_key);
        let done = Arc::clone(&done);
        let records = args.records;
        let value = vec![0x5au8; args.value_bytes];
        let fields = args.fields;
        async move {
            let mut histogram =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
            let mut operations = 0u64;
            let mut errors = 0u64;
            let mut rng = rand::rng();
            loop {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let key = if sequential_keys {
                    let key = next_key.fetch_add(1, Ordering::Relaxed);
                    if key >= records {
                        break;
                    }
                    key as i64
                } else {
                    rng.random_range(0..records) as i64
                };
                let began = Instant::now();
                let outcome = match operation {
                    Operation::Write if fields == 1 => session
                        .execute_unpaged(&insert, (key, &value))
                        .await
                        .map(|_| ()),
                    Operation::Write => {
                        let mut row = Vec::with_capacity(1 + fields);
                        row.push(CqlValue::BigInt(key));
                        row.extend((0..fields).map(|_| CqlValue::Blob(value.clone())));
                        session.execute_unpaged(&insert, row).await.map(|_| ())
                    }
                    Operation::Read => session.execute_unpaged(&select, (key,)).await.map(|_| ()),
                };
                let finished = Instant::now();
                if !sequential_keys && finished >= end {
                    break;
                }
                if began >= measure_from || sequential_keys {
                    match outcome {
                        Ok(()) => {
                            operations += 1;
                            let _ = histogram.record((finished - began).as_micros().max(1) as u64);
                        }
                        Err(_) => errors += 1,
                    }
                }
            }
            (histogram, operations, errors)
        }
    });
    let results = join_all(workers).await;
    done.store(true, Ordering::Relaxed);
    let elapsed = if sequential_keys {
        start.elapsed()
    } else {
        Instant::now().min(end) - measure_from
    };
    PhaseResult::merge(results.into_iter().map(Ok).collect(), elapsed)
}

pub fn run(args: PointArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.records >= 1, "--records must be at least 1");
    anyhow::ensure!(args.fields >= 1, "--fields must be at least 1");
    let runtime = crate::client_runtime(Some(args.client_threads))?;
    runtime.block_on(async {
        let connections =
            NonZeroUsize::new(args.connections).context("--connections must be at least 1")?;
        let session = args
            .login
            .connect(&args.contact, PoolSize::PerHost(connections))
            .await?;
        let session = Arc::new(session);
        setup(&session, &args).await?;
        println!(
            "shoal bench: {} keys, rows of {} {}-byte values, {} in flight, consistency {}, against {}",
            args.records,
            args.fields,
            args.value_bytes,
            args.concurrency,
            args.consistency,
            args.contact
        );
        if args.load {
            let loaded = run_phase(
                Arc::clone(&session),
                &args,
                Operation::Write,
                Duration::ZERO,
                Duration::from_secs(86_400),
                true,
            )
            .await?;
            loaded.print("load");
        }
        let measured = run_phase(
            Arc::clone(&session),
            &args,
            args.operation,
            Duration::from_secs(args.warmup_seconds),
            Duration::from_secs(args.duration_seconds),
            false,
        )
        .await?;
        measured.print(match args.operation {
            Operation::Write => "write",
            Operation::Read => "read",
        });
        anyhow::Ok(())
    })
}
