//! Seed 001's experiment on Shoal's consensus log: 100% writes, each a transaction of
//! `--updates` updates proposed to a uniformly chosen tablet group, on a local cluster of
//! `--nodes` nodes (each group on three of them), against the bound that the log bytes
//! shipped to the followers put on this machine's loopback bandwidth.
//!
//! The nodes run in this process, each with its own epoch log file (synced per epoch) and
//! its own loopback address; they talk over real TCP connections. What it reports:
//!
//! - the loopback bandwidth, measured first in the same run (one TCP stream, large writes);
//! - committed transactions per second and their latency;
//! - the bound: bandwidth ÷ (bytes each transaction puts in the log × followers per group),
//!   and the ratio of the two;
//! - where the time goes: CPU per transaction (this process: the client tasks, three
//!   nodes' protocol, TCP on both sides, the log writes), syncs per second and
//!   transactions per sync.

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal_consensus::runtime::{self, tcp, GroupSpec, NodeOptions, RaftHandle, StateMachine};
use shoal_consensus::{Config, GroupId, LogIndex, NodeId};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Debug, Clone)]
pub struct EpochLogArgs {
    /// Nodes in the local cluster (each group is replicated on three).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Raft groups (tablets), spread over the nodes.
    #[arg(long, default_value_t = 24)]
    pub groups: u64,
    /// Updates per transaction.
    #[arg(long, default_value_t = 10)]
    pub updates: usize,
    /// Bytes of each update's value (its key is 16 bytes).
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Transactions in flight.
    #[arg(long, default_value_t = 512)]
    pub clients: usize,
    #[arg(long, default_value_t = 10)]
    pub duration_seconds: u64,
    #[arg(long, default_value_t = 3)]
    pub warmup_seconds: u64,
    /// MiB pushed through loopback to measure its bandwidth.
    #[arg(long, default_value_t = 4096)]
    pub bandwidth_mib: u64,
    /// Where the nodes' epoch logs go (a temporary directory if not given).
    #[arg(long)]
    pub directory: Option<std::path::PathBuf>,
}

/// The benchmark's state machine applies nothing: the log is what is measured.
struct Discard;

impl StateMachine for Discard {
    fn apply(&mut self, _: GroupId, _: LogIndex, _: &Bytes) -> runtime::Applied {
        runtime::Applied::Done
    }
}

pub fn run(args: EpochLogArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: EpochLogArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes >= 3, "--nodes must be at least 3");
    let bandwidth = loopback_bandwidth(args.bandwidth_mib << 20).await?;
    println!(
        "loopback: {:.0} MiB/s (one TCP stream, {} MiB)",
        bandwidth / (1 << 20) as f64,
        args.bandwidth_mib
    );

    let temporary = tempfile::tempdir()?;
    let directory = args
        .directory
        .clone()
        .unwrap_or_else(|| temporary.path().to_path_buf());
    let handles = start_cluster(&args, &directory).await?;
    let leaders = wait_for_leaders(&handles, args.groups).await?;

    let payload_bytes = args.updates * (2 + 16 + 4 + args.value_bytes);
    let committed = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let leaders = Arc::new(Mutex::new(leaders));
    let mut clients = Vec::new();
    for _ in 0..args.clients {
        let handles = handles.clone();
        let leaders = Arc::clone(&leaders);
        let committed = Arc::clone(&committed);
        let measuring = Arc::clone(&measuring);
        let stop = Arc::clone(&stop);
        let histogram = Arc::clone(&histogram);
        let args = args.clone();
        clients.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new(3).expect("a histogram");
            // A fast generator per client: the client's CPU is part of what is measured.
            let mut rng = SmallRng::from_rng(&mut rand::rng());
            let mut transaction = Transaction::new(args.updates, args.value_bytes);
            while !stop.load(Ordering::Relaxed) {
                let group = GroupId(rng.random_range(0..args.groups));
                let payload = transaction.next(&mut rng);
                let leader = leaders.lock().expect("not poisoned")[&group];
                let started = Instant::now();
                match handles[leader].propose(group, payload).await {
                    Ok(()) => {
                        if measuring.load(Ordering::Relaxed) {
                            committed.fetch_add(1, Ordering::Relaxed);
                            let _ = local.record(started.elapsed().as_micros() as u64);
                        }
                    }
                    Err(_) => {
                        if let Some(known) = handles[leader].leader(group).await {
                            if let Some(index) = handles.iter().position(|h| h.id() == known) {
                                leaders.lock().expect("not poisoned").insert(group, index);
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            histogram
                .lock()
                .expect("not poisoned")
                .add(local)
                .expect("same bounds");
        }));
    }

    tokio::time::sleep(Duration::from_secs(args.warmup_seconds)).await;
    let counters_before = totals(&handles);
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.duration_seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_before;
    let counters = totals(&handles).minus(&counters_before);
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }

    let transactions = committed.load(Ordering::Relaxed) as f64;
    let per_second = transactions / elapsed;
    // What one transaction puts in the log and ships to each follower: its payload and
    // the entry's term and length.
    let entry_bytes = (payload_bytes + 12) as f64;
    let followers = 2.0;
    let bound = bandwidth / (entry_bytes * followers);
    let histogram = histogram.lock().expect("not poisoned");
    println!();
    println!(
        "| nodes | groups | clients | updates/tx | tx/s | p50 ms | p99 ms | bound tx/s | tx/s ÷ bound | CPU µs/tx | log syncs/s | tx per sync |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.3} | {:.1} | {:.0} | {:.1} |",
        args.nodes,
        args.groups,
        args.clients,
        args.updates,
        per_second,
        histogram.value_at_quantile(0.5) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
        bound,
        per_second / bound,
        cpu * 1e6 / transactions.max(1.0),
        counters.syncs as f64 / elapsed,
        // Each transaction is written by three nodes.
        transactions * 3.0 / (counters.syncs as f64).max(1.0),
    );
    println!();
    println!(
        "log bytes written by all nodes: {:.1} MiB/s ({:.0} bytes per transaction and replica); \
         epochs sealed: {:.0}/s; entry bytes per transaction: {entry_bytes:.0}; \
         process CPU: {:.2} cores of {}",
        counters.log_bytes as f64 / elapsed / (1 << 20) as f64,
        counters.log_bytes as f64 / (transactions * 3.0).max(1.0),
        counters.epochs as f64 / elapsed,
        cpu / elapsed,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    Ok(())
}

/// Transactions of `updates` updates, each a random 16-byte key and a `value_bytes`
/// value: a template whose keys are redrawn for each one.
struct Transaction {
    template: Vec<u8>,
    key_offsets: Vec<usize>,
}

impl Transaction {
    fn new(updates: usize, value_bytes: usize) -> Transaction {
        let mut template = Vec::with_capacity(updates * (22 + value_bytes));
        let mut key_offsets = Vec::with_capacity(updates);
        for _ in 0..updates {
            template.extend_from_slice(&16u16.to_le_bytes());
            key_offsets.push(template.len());
            template.extend_from_slice(&[0; 16]);
            template.extend_from_slice(&(value_bytes as u32).to_le_bytes());
            template.extend(std::iter::repeat_n(b'v', value_bytes));
        }
        Transaction {
            template,
            key_offsets,
        }
    }

    fn next(&mut self, rng: &mut impl Rng) -> Bytes {
        for offset in &self.key_offsets {
            rng.fill(&mut self.template[*offset..*offset + 16]);
        }
        Bytes::copy_from_slice(&self.template)
    }
}

/// Bytes per second through one loopback TCP stream.
pub(crate) async fn loopback_bandwidth(total: u64) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buffer = vec![0u8; 1 << 20];
        let mut received = 0u64;
        while received < total {
            let read = stream.read(&mut buffer).await?;
            anyhow::ensure!(read > 0, "the stream closed early");
            received += read as u64;
        }
        anyhow::Ok(())
    });
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let chunk = vec![7u8; 256 << 10];
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        stream.write_all(&chunk).await?;
        sent += chunk.len() as u64;
    }
    reader.await??;
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn start_cluster(
    args: &EpochLogArgs,
    directory: &std::path::Path,
) -> anyhow::Result<Vec<RaftHandle>> {
    let ids: Vec<NodeId> = (0..args.nodes)
        .map(|n| shoal_model::HostId([n as u8 + 1; 16]))
        .collect();
    let mut listeners = Vec::new();
    let mut addresses: HashMap<NodeId, SocketAddr> = HashMap::new();
    for (n, id) in ids.iter().enumerate() {
        let ip: IpAddr = format!("127.0.0.{}", n + 1).parse()?;
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .with_context(|| format!("binding {ip}"))?;
        addresses.insert(*id, listener.local_addr()?);
        listeners.push((ip, listener));
    }
    let options = NodeOptions {
        raft: Config {
            election_timeout_ms: 1000,
            heartbeat_interval_ms: 100,
            ..Config::default()
        },
        ..NodeOptions::default()
    };
    let mut handles = Vec::new();
    for (n, (id, (ip, listener))) in ids.iter().zip(listeners).enumerate() {
        let groups = (0..args.groups)
            .filter_map(|group| {
                let members: Vec<NodeId> = (0..3)
                    .map(|offset| ids[(group as usize + offset) % args.nodes])
                    .collect();
                members.contains(id).then_some(GroupSpec {
                    group: GroupId(group),
                    members,
                })
            })
            .collect();
        let transport = tcp::TcpTransport::start(*id, ip, addresses.clone());
        let handle = runtime::start(
            *id,
            NodeOptions {
                seed: n as u64,
                ..options.clone()
            },
            directory.join(format!("node{n}")),
            groups,
            Arc::new(transport),
            Box::new(Discard),
        )?;
        tokio::spawn(tcp::serve(listener, handle.clone()));
        handles.push(handle);
    }
    Ok(handles)
}

/// Waits until every group has a leader; returns the index of each group's leader node.
async fn wait_for_leaders(
    handles: &[RaftHandle],
    groups: u64,
) -> anyhow::Result<HashMap<GroupId, usize>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut leaders = HashMap::new();
        for group in (0..groups).map(GroupId) {
            for handle in handles {
                if let Some(leader) = handle.leader(group).await {
                    if let Some(index) = handles.iter().position(|h| h.id() == leader) {
                        leaders.insert(group, index);
                        break;
                    }
                }
            }
        }
        if leaders.len() as u64 == groups {
            return Ok(leaders);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "groups without a leader after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[derive(Default, Clone, Copy)]
struct Totals {
    syncs: u64,
    log_bytes: u64,
    epochs: u64,
}

impl Totals {
    fn minus(&self, earlier: &Totals) -> Totals {
        Totals {
            syncs: self.syncs - earlier.syncs,
            log_bytes: self.log_bytes - earlier.log_bytes,
            epochs: self.epochs - earlier.epochs,
        }
    }
}

fn totals(handles: &[RaftHandle]) -> Totals {
    let mut totals = Totals::default();
    for handle in handles {
        totals.syncs += handle.counters.log_syncs.load(Ordering::Relaxed);
        totals.log_bytes += handle.counters.log_bytes.load(Ordering::Relaxed);
        totals.epochs += handle.counters.epochs_sealed.load(Ordering::Relaxed);
    }
    totals
}

/// This process's user + system CPU seconds (Linux).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}
