//! `shoal bench strong`: seed 001's workload through CQL — 100% write transactions, each a
//! batch of `--updates` updates of one partition of a strongly consistent keyspace (one
//! entry in its tablet's Raft log), uniformly random partitions — against the bound that
//! loopback bandwidth sets on shipping the log to the followers.
//!
//! The bound is measured in the same run: the loopback bandwidth first (one TCP stream),
//! then the log bytes every transaction costs, from the nodes' own counters
//! (`shoal_consensus_log_bytes_total` ÷ `shoal_consensus_entries_committed_total`, summed
//! over the nodes given with `--metrics`: bytes written per entry and replica, padding
//! included). Bound = bandwidth ÷ (bytes per entry × followers per group). Benchmarks are
//! never tests: the figures are printed (and written as JSON), not asserted.

use crate::point::{consistency, PhaseResult};
use rand::Rng;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct StrongArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: crate::login::Login,
    /// Keyspace to create (strongly consistent) and use.
    #[arg(long, default_value = "strong_bench")]
    pub keyspace: String,
    #[arg(long, default_value_t = 3)]
    pub replication_factor: u32,
    /// Partitions (accounts) the transactions choose from, uniformly.
    #[arg(long, default_value_t = 100_000)]
    pub partitions: u64,
    /// Updates per transaction (rows of one partition, one batch).
    #[arg(long, default_value_t = 10)]
    pub updates: u32,
    /// Bytes of each update's value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Transactions kept in flight.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 20)]
    pub duration_seconds: u64,
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// Consistency level named by the requests (a strong keyspace ignores it).
    #[arg(long, default_value = "one")]
    pub consistency: String,
    /// A node's metrics endpoint, host:port (repeat for every node).
    #[arg(long = "metrics")]
    pub metrics: Vec<String>,
    /// MiB pushed through loopback to measure its bandwidth.
    #[arg(long, default_value_t = 2048)]
    pub bandwidth_mib: u64,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Create the keyspace eventually consistent instead (Cassandra's replication), to
    /// compare the same transactions without the Raft log.
    #[arg(long)]
    pub eventual: bool,
}

async fn setup(session: &Session, args: &StrongArgs) -> anyhow::Result<()> {
    let keyspace = &args.keyspace;
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {}}} AND consistency = '{}'",
                args.replication_factor,
                if args.eventual { "eventual" } else { "strong" }
            ),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!("CREATE TABLE IF NOT EXISTS {keyspace}.accounts (id bigint, slot int, payload blob, PRIMARY KEY (id, slot))"),
            &[],
        )
        .await?;
    session.await_schema_agreement().await?;
    Ok(())
}

/// The consensus counters summed over the nodes: `(log bytes, entries committed)`.
async fn consensus_counters(endpoints: &[String]) -> anyhow::Result<(f64, f64)> {
    let (mut bytes, mut entries) = (0.0, 0.0);
    for endpoint in endpoints {
        let text = tokio::time::timeout(Duration::from_secs(10), scrape(endpoint)).await??;
        let value = |name: &str| {
            text.lines()
                .find_map(|line| {
                    line.strip_prefix(name)?
                        .strip_prefix(' ')?
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or(0.0)
        };
        bytes += value("shoal_consensus_log_bytes_total");
        entries += value("shoal_consensus_entries_committed_total");
    }
    Ok((bytes, entries))
}

/// `GET /metrics` from `endpoint` (host:port), as plain HTTP/1.0: the body.
async fn scrape(endpoint: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(endpoint).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .ok_or_else(|| anyhow::anyhow!("{endpoint} answered no HTTP response"))?;
    Ok(body)
}

async fn transactions(session: &Session, args: &StrongArgs) -> anyhow::Result<PhaseResult> {
    let mut update = session
        .prepare(format!(
            "UPDATE {}.accounts SET payload = ? WHERE id = ? AND slot = ?",
            args.keyspace
        ))
        .await?;
    update.set_consistency(consistency(&args.consistency)?);
    let mut batch = Batch::new(BatchType::Unlogged);
    for _ in 0..args.updates {
        batch.append_statement(update.clone());
    }
    batch.set_consistency(consistency(&args.consistency)?);
    let batch = session.prepare_batch(&batch).await?;
    let (batch, partitions, updates) = (&batch, args.partitions, args.updates);
    let payload = &vec![0x5au8; args.value_bytes];
    PhaseResult::timed(
        args.concurrency,
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.duration_seconds),
        || async move {
            let id = rand::rng().random_range(0..partitions) as i64;
            let values: Vec<(&Vec<u8>, i64, i32)> = (0..updates)
                .map(|slot| (payload, id, slot as i32))
                .collect();
            session.batch(batch, values).await.is_ok()
        },
    )
    .await
}

pub fn run(args: StrongArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.partitions >= 1, "--partitions must be at least 1");
    anyhow::ensure!(args.updates >= 1, "--updates must be at least 1");
    args.login.run_with_session(&args.contact, async |session| {
        let bandwidth = crate::epoch_log::loopback_bandwidth(args.bandwidth_mib << 20).await?;
        println!(
            "shoal bench strong: loopback {:.0} MiB/s; {} updates of {} bytes per transaction, {} partitions, RF {}, {} in flight, against {}",
            bandwidth / (1 << 20) as f64,
            args.updates,
            args.value_bytes,
            args.partitions,
            args.replication_factor,
            args.concurrency,
            args.contact
        );
        setup(session, &args).await?;
        let before = consensus_counters(&args.metrics).await?;
        let result = transactions(session, &args).await?;
        let after = consensus_counters(&args.metrics).await?;
        let mut extra = serde_json::Map::new();
        extra.insert("loopback_bytes_per_second".into(), bandwidth.into());
        let (bytes, entries) = (after.0 - before.0, after.1 - before.1);
        if entries > 0.0 {
            let per_entry = bytes / entries;
            let followers = f64::from(args.replication_factor.saturating_sub(1).max(1));
            let bound = bandwidth / (per_entry * followers);
            let achieved = result.json("strong")["ops_per_second"]
                .as_f64()
                .unwrap_or_default();
            println!(
                "log bytes per entry and replica {per_entry:.0}; bound {bound:.0} tx/s; achieved {achieved:.0} tx/s = {:.4} of the bound",
                achieved / bound
            );
            extra.insert("log_bytes_per_entry".into(), per_entry.into());
            extra.insert("bound_tx_per_second".into(), bound.into());
            extra.insert("ratio_to_bound".into(), (achieved / bound).into());
        } else {
            println!("no consensus counters (give every node's metrics endpoint with --metrics)");
        }
        result.report("strong", args.json.as_deref(), extra)
    })
}
