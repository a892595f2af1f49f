//! `shoal admin`: operations on a running cluster, like `nodetool`.

use shoal_server::internode::{MemberStatus, Message, Peers, Reply};
use shoal_server::membership::join_gate;
use shoal_server::operations::Operation;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Each node's state (up/down, normal/joining), address, load and tablet count.
    Status(Target),
    /// Make every replica of every tablet converge (after a node was down longer than
    /// the hint window). Every replica must be up.
    Repair(RepairArgs),
    /// Write the node's memtables out to disk.
    Flush(OperateArgs),
    /// Compact everything the node stores (drops what deletions and TTLs allow).
    Compact(OperateArgs),
    /// Size on disk and requests of each table on the node.
    Tablestats(TablestatsArgs),
    /// Read and write latency percentiles of a table, as coordinated by the node.
    Tablehistograms(RingArgs),
    /// Compactions running on the node and its compaction backlog.
    Compactionstats(OperateArgs),
    /// Take a snapshot (a checkpoint of everything the node stores) under
    /// DATA_DIR/snapshots/TAG. Restore: stop the node, replace DATA_DIR/rocksdb with it.
    Snapshot(SnapshotArgs),
    /// The node's snapshots and their sizes.
    Listsnapshots(OperateArgs),
    /// Remove one snapshot (--tag) or all of them.
    Clearsnapshot(ClearSnapshotArgs),
    /// Flush, sync the commit log and stop serving clients, before stopping the node.
    Drain(OperateArgs),
    /// Remove the data of tablets the node no longer replicates.
    Cleanup(TablestatsArgs),
    /// The node's identity, uptime, load and schema version.
    Info(OperateArgs),
    /// The tablets of a table and the nodes holding each.
    Ring(RingArgs),
    /// Trace this share of the requests the node coordinates (0 to 1; 0 turns it off),
    /// into system_traces.sessions and system_traces.events.
    Settraceprobability(TraceProbabilityArgs),
    /// The share of requests the node traces.
    Gettraceprobability(OperateArgs),
    /// The node's mode, the data it streams to others, and its messages to each peer.
    Netstats(OperateArgs),
    /// Make a node started with `--join-ring false` enter the cluster (Cassandra's
    /// `nodetool join`). Returns at once (`shoal admin status` then shows it UJ, then
    /// UN), or with --wait once it has joined and its tablets have moved.
    Join(JoinArgs),
    /// Make the node leave the cluster: its tablet replicas stream to the other nodes,
    /// then it leaves and stops serving clients. Returns once it has left.
    Decommission(OperateArgs),
    /// Remove a dead node (by host id, from `shoal admin status`): its tablets are
    /// re-replicated from the surviving replicas. Returns once it is gone.
    Removenode(RemovenodeArgs),
    /// Tablet migrations under way (stage, from, to) and the node's streams: bytes
    /// done/total, rate, and the streaming policy's current limit.
    Streams(OperateArgs),
    /// Secondary index builds on the node (for data that existed when an index was
    /// created): each index, its table, keys scanned so far, and whether it is done.
    Indexbuilds(OperateArgs),
    /// The read scheduler (Cassandra's tpstats for reads): its order, and per class of
    /// reads — local point, remote point, scan — the queue length, reads served and their
    /// mean queue wait.
    Tpstats(OperateArgs),
}

#[derive(clap::Args)]
pub struct JoinArgs {
    /// Return only once the node is a normal member (UN) and no tablet migration is
    /// under way, the old replicas' cleanup included.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct RemovenodeArgs {
    /// The dead node's host id.
    pub host_id: String,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct TraceProbabilityArgs {
    /// A number from 0 (trace nothing, the default) to 1 (trace every request).
    pub probability: f64,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct OperateArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print the node's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct TablestatsArgs {
    /// Only the tables of this keyspace (all user tables by default).
    pub keyspace: Option<String>,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The snapshot's name (default: the time now, as seconds since the epoch).
    #[arg(long, short = 't')]
    pub tag: Option<String>,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct ClearSnapshotArgs {
    /// The snapshot to remove.
    #[arg(long, short = 't', required_unless_present = "all")]
    pub tag: Option<String>,
    /// Remove every snapshot.
    #[arg(long, conflicts_with = "tag")]
    pub all: bool,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct RingArgs {
    pub keyspace: String,
    pub table: String,
    #[command(flatten)]
    pub operate: OperateArgs,
}

#[derive(clap::Args)]
pub struct RepairArgs {
    /// Only this keyspace.
    pub keyspace: Option<String>,
    /// Only this table of the keyspace.
    pub table: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

#[derive(clap::Args)]
pub struct Target {
    /// A node of the cluster to ask.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Its internode port.
    #[arg(long, default_value_t = 7000)]
    pub port: u16,
    /// The node's configuration file: with `internode_tls` on, its certificates
    /// authenticate this command to the node.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

pub fn run(command: AdminCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let operation = match command {
        AdminCommand::Flush(args) => (Operation::Flush, args),
        AdminCommand::Compact(args) => (Operation::Compact, args),
        AdminCommand::Tablestats(args) => (
            Operation::TableStats {
                keyspace: args.keyspace,
            },
            args.operate,
        ),
        AdminCommand::Compactionstats(args) => (Operation::CompactionStats, args),
        AdminCommand::Tablehistograms(args) => (
            Operation::TableHistograms {
                keyspace: args.keyspace,
                table: args.table,
            },
            args.operate,
        ),
        AdminCommand::Snapshot(args) => {
            let tag = args.tag.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs().to_string())
                    .unwrap_or_default()
            });
            (Operation::Snapshot { tag }, args.operate)
        }
        AdminCommand::Listsnapshots(args) => (Operation::ListSnapshots, args),
        AdminCommand::Clearsnapshot(args) => {
            (Operation::ClearSnapshot { tag: args.tag }, args.operate)
        }
        AdminCommand::Drain(args) => (Operation::Drain, args),
        AdminCommand::Cleanup(args) => (
            Operation::Cleanup {
                keyspace: args.keyspace,
            },
            args.operate,
        ),
        AdminCommand::Info(args) => (Operation::Info, args),
        AdminCommand::Settraceprobability(args) => (
            Operation::SetTraceProbability {
                probability: args.probability,
            },
            args.operate,
        ),
        AdminCommand::Gettraceprobability(args) => (Operation::TraceProbability, args),
        AdminCommand::Netstats(args) => (Operation::NetStats, args),
        AdminCommand::Join(args) => return runtime.block_on(join(args)),
        AdminCommand::Decommission(args) => (Operation::Decommission, args),
        AdminCommand::Streams(args) => (Operation::Streams, args),
        AdminCommand::Indexbuilds(args) => (Operation::IndexBuilds, args),
        AdminCommand::Tpstats(args) => (Operation::ReadStats, args),
        AdminCommand::Removenode(args) => {
            let host_id = parse_host_id(&args.host_id)?;
            (Operation::RemoveNode { host_id }, args.operate)
        }
        AdminCommand::Ring(args) => (
            Operation::Ring {
                keyspace: args.keyspace,
                table: args.table,
            },
            args.operate,
        ),
        other => return run_cluster_command(&runtime, other),
    };
    let (operation, args) = operation;
    let answer = runtime.block_on(operate(&args.target, operation))?;
    if args.json {
        println!("{answer}");
    } else {
        print!("{}", render(&answer));
    }
    Ok(())
}

fn run_cluster_command(
    runtime: &tokio::runtime::Runtime,
    command: AdminCommand,
) -> anyhow::Result<()> {
    match command {
        AdminCommand::Status(target) => {
            let members = runtime.block_on(fetch_status(&target))?;
            print!("{}", render_status(&members));
            Ok(())
        }
        AdminCommand::Repair(args) => {
            let report = runtime.block_on(repair(args))?;
            println!(
                "repair done: {} table(s), {} tablet(s) ({} skipped: replica down), {} of {} segment(s) differed, {} cell(s) repaired",
                report.tables,
                report.tablets,
                report.tablets_skipped,
                report.segments_differing,
                report.segments_compared,
                report.cells_repaired
            );
            anyhow::ensure!(
                report.tablets_skipped == 0,
                "some tablets were not repaired because a replica was down; rerun once every node is up"
            );
            Ok(())
        }
        _ => unreachable!("node operations are handled by `run`"),
    }
}

/// Asks a node to carry out `operation`; its answer is JSON.
async fn operate(target: &Target, operation: Operation) -> anyhow::Result<serde_json::Value> {
    // Compactions and snapshots of a large node take long.
    match ask(
        target,
        Message::Operate(operation),
        Duration::from_secs(24 * 3600),
    )
    .await?
    {
        (_, Reply::Operated(json)) => Ok(serde_json::from_str(&json)?),
        (address, Reply::Error(error)) => anyhow::bail!("{address}: {error}"),
        (address, other) => anyhow::bail!("{address} answered unexpectedly: {other:?}"),
    }
}

/// `shoal admin join`: opens the node's join gate and, with `--wait`, waits for the end
/// of its join. Until the node has started it answers that it is still starting; each such
/// answer is followed by another ask a moment later.
async fn join(args: JoinArgs) -> anyhow::Result<()> {
    let target = &args.operate.target;
    let mut answer = operate(target, Operation::Join).await?;
    if args.wait {
        answer = loop {
            match operate(target, Operation::AwaitJoined).await {
                Err(error) if error.to_string().ends_with(join_gate::STILL_STARTING) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                outcome => break outcome?,
            }
        };
    }
    if args.operate.json {
        println!("{answer}");
    } else {
        print!("{}", render(&answer));
    }
    Ok(())
}

/// A host id as `shoal admin status` prints it (a UUID).
fn parse_host_id(text: &str) -> anyhow::Result<shoal_model::HostId> {
    let uuid = uuid::Uuid::parse_str(text.trim()).map_err(|_| {
        anyhow::anyhow!("'{text}' is not a host id (a UUID, as `shoal admin status` shows)")
    })?;
    Ok(shoal_model::HostId(*uuid.as_bytes()))
}

fn scalar(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Array(items) if items.is_empty() => "none".into(),
        serde_json::Value::Array(items) => items.iter().map(scalar).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// A node's answer as text: `key: value` lines, lists of records as aligned tables.
pub fn render(answer: &serde_json::Value) -> String {
    let mut out = String::new();
    let Some(fields) = answer.as_object() else {
        return format!("{}\n", scalar(answer));
    };
    for (key, value) in fields {
        let records: Vec<&serde_json::Map<String, serde_json::Value>> = value
            .as_array()
            .map(|items| items.iter().filter_map(|i| i.as_object()).collect())
            .unwrap_or_default();
        if records.is_empty() || value.as_array().is_some_and(|a| a.len() != records.len()) {
            out.push_str(&format!("{key}: {}\n", scalar(value)));
            continue;
        }
        let columns: Vec<&String> = records[0].keys().collect();
        let rows: Vec<Vec<String>> = records
            .iter()
            .map(|r| columns.iter().map(|c| scalar(&r[c.as_str()])).collect())
            .collect();
        let widths: Vec<usize> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                rows.iter()
                    .map(|r| r[i].len())
                    .chain([c.len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            format!("{}\n", padded.join("  ").trim_end())
        };
        out.push_str(&line(columns.iter().map(|c| c.as_str()).collect()));
        for row in &rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
    }
    out
}

/// Sends one message to the node `target` names and returns its reply.
async fn ask(
    target: &Target,
    message: Message,
    timeout: Duration,
) -> anyhow::Result<(SocketAddr, Reply)> {
    let mut peers = Peers::default();
    if let Some(path) = &target.config {
        if let Some(tls) = shoal_server::config::Config::load(path)?.internode_tls()? {
            peers = peers.with_tls(std::sync::Arc::new(tls));
        }
    }
    let address = SocketAddr::new(target.host, target.port);
    let reply = peers.call(address, &message, timeout).await;
    peers.stop();
    let reply =
        reply.map_err(|e| anyhow::anyhow!("cannot reach a Shoal node at {address}: {e}"))?;
    Ok((address, reply))
}

async fn repair(args: RepairArgs) -> anyhow::Result<shoal_replication::RepairReport> {
    let message = Message::Repair {
        keyspace: args.keyspace,
        table: args.table,
    };
    match ask(&args.target, message, Duration::from_secs(24 * 3600)).await? {
        (_, Reply::Repaired(report)) => Ok(report),
        (_, Reply::Error(error)) => anyhow::bail!("repair failed: {error}"),
        (address, other) => anyhow::bail!("{address} answered unexpectedly: {other:?}"),
    }
}

pub async fn fetch_status(target: &Target) -> anyhow::Result<Vec<MemberStatus>> {
    match ask(target, Message::Status, Duration::from_secs(5)).await? {
        (_, Reply::Status(members)) => Ok(members),
        (address, Reply::Error(error)) => anyhow::bail!("{address} answered: {error}"),
        (address, other) => anyhow::bail!("{address} answered unexpectedly: {other:?}"),
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The `nodetool status` layout.
pub fn render_status(members: &[MemberStatus]) -> String {
    let mut out = String::new();
    let mut datacenters: Vec<&str> = members.iter().map(|m| m.datacenter.as_str()).collect();
    datacenters.sort_unstable();
    datacenters.dedup();
    for datacenter in datacenters {
        let title = format!("Datacenter: {datacenter}");
        out.push_str(&format!("{title}\n{}\n", "=".repeat(title.len())));
        out.push_str("Status=Up/Down\n|/ State=Normal/Leaving/Joining/Moving\n");
        out.push_str(&format!(
            "{:<3} {:<15} {:<11} {:<8} {:<37} {:<8} {}\n",
            "--", "Address", "Load", "Tablets", "Host ID", "Rack", "Metadata"
        ));
        let mut rows: Vec<&MemberStatus> = members
            .iter()
            .filter(|m| m.datacenter == datacenter)
            .collect();
        rows.sort_by_key(|m| m.address);
        for member in rows {
            let status = if member.up { 'U' } else { 'D' };
            let state = match member.state.as_str() {
                "joining" => 'J',
                "leaving" | "removing" => 'L',
                _ => 'N',
            };
            out.push_str(&format!(
                "{:<3} {:<15} {:<11} {:<8} {:<37} {:<8} {}\n",
                format!("{status}{state}"),
                member.address.to_string(),
                member.load_bytes.map_or("?".to_string(), human_bytes),
                member.tablets,
                member.host_id.to_string(),
                member.rack,
                if member.voter { "voter" } else { "learner" },
            ));
        }
    }
    out
}
