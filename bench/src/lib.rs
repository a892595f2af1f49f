//! Load generation for CQL clusters — Shoal or Apache Cassandra alike — so that every
//! performance claim is a ratio measured side by side.
//!
//! - [`generators`] — YCSB's key generators (uniform, zipfian, scrambled zipfian, latest,
//!   hotspot) and key naming.
//! - [`workload`] — YCSB core workloads A–F and seed 002's point/range mix.
//! - [`runner`] — load and run phases through the Rust `scylla` driver: prepared
//!   statements, token-aware routing, concurrency, target rate, warm-up, progress bar.
//! - [`stats`] — HDR latency histograms per operation, errors by kind, per-second
//!   timeline; [`report`] — an SVG plot of a phase.
//! - [`point`] — the simple point read/write benchmark of a single node.
//! - [`index`] — secondary indexes: write cost of an index, lookups by indexed value.
//! - [`vector`] — vector search: recall@k against an exact search, queries/s.
//! - [`lwt`] — lightweight transactions: conditional inserts and updates per second.
//! - [`epoch_log`] — seed 001: transactions through the consensus epoch log of a local
//!   cluster, against the bound loopback bandwidth sets.
//! - [`strong`] — seed 001 through CQL: one-partition batches on a strongly consistent
//!   keyspace of a running cluster, against the same bound.
//!
//! Benchmarks are never tests: these modules' unit tests check the generators and the
//! statistics, not performance.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod epoch_log;
pub mod generators;
pub mod index;
pub mod login;
pub mod lwt;
pub mod point;
pub mod report;
pub mod routing;
pub mod runner;
pub mod stats;
pub mod strong;
pub mod vector;
pub mod workload;

/// The client's runtime, on `threads` threads (`None`: one per core). On one thread it is
/// a current-thread runtime: the driver's connection tasks and the requests share the
/// thread, so no request wakes another one.
pub fn client_runtime(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(0) => anyhow::bail!("--client-threads must be at least 1"),
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(threads) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    Ok(builder.enable_all().build()?)
}

/// `shoal bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Point reads/writes of 100-byte values (the single-node benchmark).
    Point(point::PointArgs),
    /// A YCSB core workload (A–F): load and/or run phase.
    Ycsb(runner::YcsbArgs),
    /// Seed 002's point/range mix: point reads and token-range scans.
    Mix(runner::MixArgs),
    /// Secondary indexes: inserts with and without an index, lookups by indexed value.
    Index(index::IndexArgs),
    /// Vector search: load embeddings-like vectors, then recall@k and ANN queries/s.
    Vector(vector::VectorArgs),
    /// Lightweight transactions: `INSERT … IF NOT EXISTS`, then `UPDATE … IF EXISTS`.
    Lwt(lwt::LwtArgs),
    /// Seed 001: 100% write transactions through per-tablet Raft groups sharing each
    /// node's epoch log, against the loopback-bandwidth bound.
    EpochLog(epoch_log::EpochLogArgs),
    /// Seed 001 through CQL: batches of updates of one partition of a strongly
    /// consistent keyspace, against the loopback-bandwidth bound.
    Strong(strong::StrongArgs),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Point(args) => point::run(args),
        BenchCommand::Ycsb(args) => runner::run_ycsb(args),
        BenchCommand::Mix(args) => runner::run_mix(args),
        BenchCommand::Index(args) => index::run(args),
        BenchCommand::Vector(args) => vector::run(args),
        BenchCommand::Lwt(args) => lwt::run(args),
        BenchCommand::EpochLog(args) => epoch_log::run(args),
        BenchCommand::Strong(args) => strong::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_on_no_thread_is_refused_with_the_option_named() {
        let refused = client_runtime(Some(0)).expect_err("no thread to run on");
        assert!(refused.to_string().contains("--client-threads"));
    }

    #[test]
    fn a_client_on_one_thread_runs_its_spawned_tasks() {
        let runtime = client_runtime(Some(1)).unwrap();
        let answer = runtime.block_on(async { tokio::spawn(async { 7 }).await.unwrap() });
        assert_eq!(answer, 7);
    }
}
