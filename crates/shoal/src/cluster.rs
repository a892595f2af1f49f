//! `shoal cluster`: a local cluster of real `shoal server` processes on 127.0.0.1…N, for
//! development and tests (like `ccm`).
//!
//! Node `i` listens on 127.0.0.`i` (CQL 9042, internode 7000 — every address of 127/8 is
//! loopback), keeps its data and log in `DIR/node<i>/`, and uses 127.0.0.1 as its seed.
//! Nodes start one after another, each once the previous one accepts clients, so the
//! first bootstraps the cluster and the others join it. The nodes share the machine, so
//! each gets `cores / N` request threads (at least one). `start` stays in the foreground
//! and stops every node on Ctrl-C unless `--detach` is given; `stop` stops a detached
//! cluster from its pid files; `add` starts more nodes that join the running cluster
//! (its tablets move to them while it serves).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Start N local nodes; nodes of an existing local cluster that are not running are
    /// restarted, running ones are left alone.
    Start(StartArgs),
    /// Stop the nodes of a local cluster started with --detach.
    Stop(DirArg),
    /// Which nodes of a local cluster run, and the cluster's view of them.
    Status(DirArg),
    /// Start more nodes (127.0.0.N+1 …) that join the running local cluster, data and
    /// all; they stay running in the background.
    Add(AddArgs),
}

#[derive(clap::Args)]
pub struct AddArgs {
    /// How many nodes to add.
    #[arg(long, default_value_t = 1)]
    pub count: u8,
    #[command(flatten)]
    pub dir: DirArg,
    /// Request threads per new node (default: as `start` would give them).
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Commit log sync mode for the new nodes: periodic or group.
    #[arg(long, default_value = "periodic")]
    pub commitlog_sync: String,
    /// The new nodes require logins (as the cluster's, see `start --auth`).
    #[arg(long)]
    pub auth: bool,
}

#[derive(clap::Args)]
pub struct DirArg {
    /// Where the nodes' data and logs live.
    #[arg(long, default_value = "shoal-cluster")]
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct StartArgs {
    /// How many nodes (127.0.0.1 … 127.0.0.N).
    #[arg(long, default_value_t = 3)]
    pub nodes: u8,
    #[command(flatten)]
    pub dir: DirArg,
    /// Leave the nodes running and return.
    #[arg(long)]
    pub detach: bool,
    /// Request threads per node; by default the machine's cores divided among the nodes
    /// (at least one); 0 means one per core for every node.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Commit log sync mode for every node: periodic or group.
    #[arg(long, default_value = "periodic")]
    pub commitlog_sync: String,
    /// Every node requires a login and checks permissions (see `shoal server --auth`).
    #[arg(long)]
    pub auth: bool,
}

const START_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `shoal cluster start` waits for every node to be up and normal.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The ports every local node listens on: the server's defaults (`shoal cluster` gives
/// its nodes addresses of their own, not ports).
const CQL_PORT: u16 = 9042;
const INTERNODE_PORT: u16 = 7000;

fn node_address(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// Where `shoal admin` reaches node `index` of a local cluster.
fn admin_target(index: u8) -> crate::admin::Target {
    crate::admin::Target {
        host: node_address(index),
        port: INTERNODE_PORT,
        config: None,
    }
}

fn node_dir(dir: &Path, index: u8) -> PathBuf {
    dir.join(format!("node{index}"))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false)
}

fn read_pid(dir: &Path, index: u8) -> Option<u32> {
    std::fs::read_to_string(node_dir(dir, index).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn node_indexes(dir: &Path) -> Vec<u8> {
    (1..=254u8)
        .take_while(|i| node_dir(dir, *i).exists())
        .collect()
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Refuses to start a node on an address whose client or internode port another process
/// holds (typically a local cluster started from another directory and still running):
/// the new node would fail to bind and exit, and the process already listening would
/// answer in its place, so the cluster would seem to start.
fn ensure_ports_free(address: IpAddr) -> anyhow::Result<()> {
    for port in [CQL_PORT, INTERNODE_PORT] {
        if let Err(error) = std::net::TcpListener::bind((address, port)) {
            anyhow::bail!(
                "{address}:{port} is in use ({error}): is another local cluster running? Stop it first (shoal cluster stop --dir ITS_DIRECTORY)"
            );
        }
    }
    Ok(())
}

fn wait_for_port(address: SocketAddr, pid: u32, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if !pid_alive(pid) {
            anyhow::bail!(
                "the node for {address} exited; its log ({}) ends with:\n{}",
                log.display(),
                log_tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("the node for {address} did not accept clients within {START_TIMEOUT:?}")
}

fn stop_nodes(dir: &Path) -> usize {
    let mut stopped = 0;
    let indexes = node_indexes(dir);
    let pids: Vec<(u8, u32)> = indexes
        .iter()
        .filter_map(|i| read_pid(dir, *i).map(|p| (*i, p)))
        .filter(|(_, p)| pid_alive(*p))
        .collect();
    for (_, pid) in &pids {
        signal(*pid, "TERM");
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for (index, pid) in pids {
        while pid_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if pid_alive(pid) {
            signal(pid, "KILL");
        }
        let _ = std::fs::remove_file(node_dir(dir, index).join("pid"));
        stopped += 1;
    }
    stopped
}

pub fn run(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Start(args) => start(args),
        ClusterCommand::Stop(args) => {
            let stopped = stop_nodes(&args.dir);
            println!("stopped {stopped} node(s) of {}", args.dir.display());
            Ok(())
        }
        ClusterCommand::Status(args) => status(&args.dir),
        ClusterCommand::Add(args) => add(args),
    }
}

/// How one node of a local cluster is started.
struct NodeLaunch<'a> {
    executable: &'a Path,
    dir: &'a Path,
    worker_threads: usize,
    commitlog_sync: &'a str,
    auth: bool,
}

impl NodeLaunch<'_> {
    /// Starts node `index` and waits until it accepts clients.
    fn spawn(&self, index: u8) -> anyhow::Result<std::process::Child> {
        ensure_ports_free(node_address(index))?;
        let data_dir = node_dir(self.dir, index);
        std::fs::create_dir_all(&data_dir)?;
        let log_path = data_dir.join("shoal.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut command = Command::new(self.executable);
        command
            .arg("server")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--listen-address")
            .arg(node_address(index).to_string())
            .arg("--seeds")
            .arg(node_address(1).to_string())
            .arg("--commitlog-sync")
            .arg(self.commitlog_sync)
            .arg("--worker-threads")
            .arg(self.worker_threads.to_string())
            .args(self.auth.then_some("--auth"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group: Ctrl-C reaches `shoal cluster`, which stops
            // the nodes cleanly.
            command.process_group(0);
        }
        let child = command.spawn()?;
        std::fs::write(data_dir.join("pid"), child.id().to_string())?;
        if let Err(error) = wait_for_port(
            SocketAddr::new(node_address(index), CQL_PORT),
            child.id(),
            &log_path,
        ) {
            signal(child.id(), "TERM");
            reap(vec![child]);
            return Err(error);
        }
        println!(
            "node {index} up on {} (log: {})",
            node_address(index),
            log_path.display()
        );
        Ok(child)
    }
}

fn add(args: AddArgs) -> anyhow::Result<()> {
    let dir = &args.dir.dir;
    let existing = node_indexes(dir);
    anyhow::ensure!(
        !existing.is_empty(),
        "no local cluster in {}: start one with `shoal cluster start`",
        dir.display()
    );
    anyhow::ensure!(
        existing
            .iter()
            .any(|i| read_pid(dir, *i).is_some_and(pid_alive)),
        "no node of the local cluster in {} runs: start it first",
        dir.display()
    );
    let first = existing.len() as u8 + 1;
    let last = first
        .checked_add(args.count.saturating_sub(1))
        .filter(|last| *last < 255)
        .ok_or_else(|| anyhow::anyhow!("a local cluster has at most 254 nodes"))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let executable = std::env::current_exe()?;
    let launch = NodeLaunch {
        executable: &executable,
        dir,
        worker_threads: args
            .worker_threads
            .unwrap_or((cores / last as usize).max(1)),
        commitlog_sync: &args.commitlog_sync,
        auth: args.auth,
    };
    for index in first..=last {
        // Detached: the node outlives this command (`shoal cluster stop` stops it).
        let child = launch.spawn(index)?;
        drop(child);
    }
    println!(
        "{} node(s) added; they take their share of tablets in the background (watch with: shoal admin status, shoal admin streams)",
        last - first + 1
    );
    Ok(())
}

fn start(args: StartArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=254).contains(&args.nodes),
        "--nodes must be between 1 and 254"
    );
    let dir = &args.dir.dir;
    let executable = std::env::current_exe()?;
    // The nodes share this machine: divide its cores among them.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let worker_threads = args
        .worker_threads
        .unwrap_or((cores / args.nodes as usize).max(1));
    let launch = NodeLaunch {
        executable: &executable,
        dir,
        worker_threads,
        commitlog_sync: &args.commitlog_sync,
        auth: args.auth,
    };
    let mut started = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for index in 1..=args.nodes {
            if let Some(pid) = read_pid(dir, index).filter(|pid| pid_alive(*pid)) {
                println!("node {index} already running (pid {pid})");
                continue;
            }
            started.push(launch.spawn(index)?);
        }
        Ok(())
    })();
    if let Err(error) = result {
        // Stop what this command started, not nodes that were already running.
        for child in &started {
            signal(child.id(), "TERM");
        }
        reap(started);
        return Err(error);
    }
    if !started.is_empty() {
        wait_until_normal(args.nodes)?;
    }
    println!(
        "{} node(s) running. Connect with: cqlsh 127.0.0.1   (status: shoal admin status)",
        args.nodes
    );
    if args.detach {
        println!("Stop with: shoal cluster stop --dir {}", dir.display());
        return Ok(());
    }
    println!("Ctrl-C stops the cluster.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(crate::wait_for_shutdown_signal());
    let stopped = stop_nodes(dir);
    reap(started);
    println!("stopped {stopped} node(s)");
    Ok(())
}

/// Waits until node 1 sees `nodes` members up and normal (`UN`), as `ccm` waits for a
/// cluster: a node that joins takes its share of tablets first, and drivers learn of it
/// once it is normal. A cluster that does not settle in time is reported, not stopped.
fn wait_until_normal(nodes: u8) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let target = admin_target(1);
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let settled = runtime
            .block_on(crate::admin::fetch_status(&target))
            .is_ok_and(|members| {
                members.len() >= nodes as usize
                    && members.iter().all(|m| m.up && m.state == "normal")
            });
        if settled {
            return Ok(());
        }
        if Instant::now() >= deadline {
            eprintln!(
                "the nodes are running but not all are up and normal after {}s: see shoal admin status",
                SETTLE_TIMEOUT.as_secs()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the nodes this command started once they were told to stop, so none is
/// left behind as a zombie.
fn reap(children: Vec<std::process::Child>) {
    let deadline = Instant::now() + STOP_TIMEOUT;
    for mut child in children {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn status(dir: &Path) -> anyhow::Result<()> {
    let indexes = node_indexes(dir);
    anyhow::ensure!(!indexes.is_empty(), "no local cluster in {}", dir.display());
    let mut running = None;
    for index in &indexes {
        let state = match read_pid(dir, *index) {
            Some(pid) if pid_alive(pid) => {
                running.get_or_insert(*index);
                format!("running (pid {pid})")
            }
            _ => "stopped".to_string(),
        };
        println!("node{index} {}: {state}", node_address(*index));
    }
    if let Some(index) = running {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let target = admin_target(index);
        let members = runtime.block_on(crate::admin::fetch_status(&target))?;
        println!();
        print!("{}", crate::admin::render_status(&members));
    }
    Ok(())
}
