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
