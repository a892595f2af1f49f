//! `shoal`: the server, local clusters, administration and benchmarks in one binary.
//!
//! The main function stays thin: it parses the command line and hands over to
//! [`shoal_server::Node`] (`shoal server`), [`cluster`] (`shoal cluster`, local
//! multi-node clusters), [`admin`] (`shoal admin`) or [`shoal_bench`] (`shoal bench`).

/// jemalloc for the whole process: with unprefixed symbols it also serves RocksDB's C++
/// allocations, which glibc malloc made a quarter of a point read's CPU time.
#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL_ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod admin;
mod cluster;

use clap::{Parser, Subcommand};
use shoal_server::config::{CommitLogSync, Config};
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal: an elastic wide-column store that speaks CQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node.
    Server(ServerArgs),
    /// Local clusters of several nodes on 127.0.0.x (like ccm).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Operate a running cluster (like nodetool).
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Drive a CQL cluster (Shoal or Cassandra) with a benchmark workload.
    #[command(subcommand)]
    Bench(Box<shoal_bench::BenchCommand>),
}

#[derive(clap::Args)]
struct ServerArgs {
    /// A TOML configuration file (see conf/shoal.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (overrides the file).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on (overrides the file).
    #[arg(long)]
    listen_address: Option<IpAddr>,
    /// CQL port (overrides the file; default 9042).
    #[arg(long)]
    cql_port: Option<u16>,
    /// Internode port (overrides the file; default 7000).
    #[arg(long)]
    internode_port: Option<u16>,
    /// Threads running requests; 0 means one per core (overrides the file).
    #[arg(long)]
    worker_threads: Option<usize>,
    /// Seed nodes' addresses, comma-separated (overrides the file). The first seed
    /// bootstraps a new cluster when it finds none; the other nodes join through them.
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<IpAddr>>,
    /// Commit log sync mode: periodic or group (overrides the file).
    #[arg(long, value_parser = parse_sync_mode)]
    commitlog_sync: Option<CommitLogSync>,
    /// Clients log in with a role's password and are held to its permissions
    /// (PasswordAuthenticator and CassandraAuthorizer; overrides the file). A new cluster
    /// gets the superuser cassandra/cassandra: change its password first.
    #[arg(long)]
    auth: bool,
    /// Start as the replacement of the dead node at this address (its replicas are
    /// rebuilt here from the surviving ones; overrides the file).
    #[arg(long)]
    replace_address: Option<IpAddr>,
    /// `false`: start without entering the cluster, until `shoal admin join` (Cassandra's
    /// join_ring; overrides the file).
    #[arg(long)]
    join_ring: Option<bool>,
}

fn parse_sync_mode(text: &str) -> Result<CommitLogSync, String> {
    match text {
        "periodic" => Ok(CommitLogSync::Periodic),
        "group" => Ok(CommitLogSync::Group),
        other => Err(format!(
            "unknown commit log sync mode '{other}' (expected periodic or group)"
        )),
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

pub(crate) async fn wait_for_shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn run_server(args: ServerArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(data_dir) = args.data_dir {
        config.data_dir = data_dir;
    }
    if let Some(address) = args.listen_address {
        config.listen_address = address;
    }
    if let Some(port) = args.cql_port {
        config.cql_port = port;
    }
    if let Some(port) = args.internode_port {
        config.internode_port = port;
    }
    if let Some(threads) = args.worker_threads {
        config.worker_threads = threads;
    }
    if let Some(seeds) = args.seeds {
        config.seeds = seeds;
    }
    if args.auth {
        config.authenticator = shoal_server::config::Authenticator::PasswordAuthenticator;
        config.authorizer = shoal_server::config::Authorizer::CassandraAuthorizer;
    }
    if let Some(mode) = args.commitlog_sync {
        config.commitlog_sync = mode;
    }
    if let Some(address) = args.replace_address {
        config.replace_address = Some(address);
    }
    if let Some(join_ring) = args.join_ring {
        config.join_ring = join_ring;
    }
    config.validate()?;
    init_logging(&config.log_level);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.worker_threads > 0 {
        builder.worker_threads(config.worker_threads);
    }
    let runtime = builder.enable_all().thread_name("shoal-worker").build()?;
    runtime.block_on(async move {
        let node = shoal_server::Node::start(config).await?;
        wait_for_shutdown_signal().await;
        tracing::info!("shutting down");
        node.stop().await;
        anyhow::Ok(())
    })
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => run_server(args),
        Command::Cluster(command) => cluster::run(command),
        Command::Admin(command) => admin::run(command),
        Command::Bench(command) => shoal_bench::run(*command),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}
