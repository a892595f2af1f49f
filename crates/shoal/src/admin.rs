//! `shoal admin`: operations on a running cluster, like `nodetool`.

use shoal_server::internode::{MemberStatus, Message, Peers, Reply};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Each node's state (up/down, normal/joining), address, load and tablet count.
    Status(Target),
    /// Make every replica of every tablet converge (after a node was down longer than
    /// the hint window). Every replica must be up.
    Repair(RepairArgs),
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
}

pub fn run(command: AdminCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
    }
}

/// Sends one message to the node `target` names and returns its reply.
async fn ask(
    target: &Target,
    message: Message,
    timeout: Duration,
) -> anyhow::Result<(SocketAddr, Reply)> {
    let peers = Peers::default();
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
                "leaving" => 'L',
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
