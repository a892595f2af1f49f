//! Node configuration: one typed [`Config`], defaults in one place ([`Config::default`]),
//! loaded from a TOML file (`conf/shoal.toml` documents every field), overridden from the
//! command line, then checked by [`Config::validate`].

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// How writes become durable (Cassandra's `commitlog_sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitLogSync {
    /// Acknowledge at once; sync the log every `commitlog_sync_period_ms`. A crash loses at
    /// most that window of acknowledged writes.
    Periodic,
    /// Acknowledge a write only after the log sync that covers it; one sync serves every
    /// write of its epoch (group commit). Acknowledged writes survive `kill -9`.
    Group,
}

/// The order a node serves reads in (see `shoal_coordinator::schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadScheduling {
    /// Arrival order, as Cassandra's read stage (for comparison).
    Fifo,
    /// Point reads before scans; scans oldest first.
    PointFirst,
    /// Point reads before scans; scans spanning fewer tablets first, then smaller limits.
    NarrowFirst,
}

impl ReadScheduling {
    pub fn ordering(self) -> shoal_coordinator::schedule::Ordering {
        use shoal_coordinator::schedule::Ordering;
        match self {
            ReadScheduling::Fifo => Ordering::Fifo,
            ReadScheduling::PointFirst => Ordering::PointFirst {
                narrow_first: false,
            },
            ReadScheduling::NarrowFirst => Ordering::PointFirst { narrow_first: true },
        }
    }
}

/// How clients log in (Cassandra's `authenticator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Authenticator {
    /// Anyone may connect, without credentials.
    AllowAllAuthenticator,
    /// Clients log in with a role's name and password (SASL PLAIN).
    PasswordAuthenticator,
}

/// What logged-in roles may do (Cassandra's `authorizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Authorizer {
    /// Every client may run every statement.
    AllowAllAuthorizer,
    /// Statements are checked against the permissions granted to the role.
    CassandraAuthorizer,
}

/// TLS on the CQL port (Cassandra's `client_encryption_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientTls {
    /// Plain connections only.
    Off,
    /// TLS or plain, as each client starts.
    Optional,
    /// TLS only.
    Required,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name reported in `system.local.cluster_name`.
    pub cluster_name: String,
    /// Directory for data and metadata; created if missing.
    pub data_dir: PathBuf,
    /// Address to listen on for CQL clients (and, later, other nodes).
    pub listen_address: IpAddr,
    /// CQL native protocol port.
    pub cql_port: u16,
    /// Port peers reach this node on (cluster metadata, replication, pings).
    pub internode_port: u16,
    /// Seed nodes' addresses; empty: this node is its own seed.
    pub seeds: Vec<IpAddr>,
    /// No hints are kept for a replica down longer than this.
    pub max_hint_window_ms: u64,
    /// Bound on all hints this node keeps.
    pub max_hints_mib: u64,
    /// Threads running requests (0: one per core): as many again serve client connections
    /// (see `connection_threads`), each connection on one of them. Nodes sharing a machine
    /// (a local cluster) do better with the cores divided among them.
    pub worker_threads: usize,
    /// `narrow_first` (default), `point_first` or `fifo`: the order reads are served in.
    pub read_scheduling: ReadScheduling,
    /// Threads serving scans, and point reads while scans run (0: one per core).
    pub read_threads: usize,
    /// CPU priority of scan work (the read and scan threads) in the point-first orders,
    /// as a Unix niceness: 1 to 18 yield to point reads more and more (Linux's batch
    /// policy at that niceness; 14, the default, keeps scans about 4% of a normal
    /// thread's share under any load), 19 yields entirely (Linux's idle policy: a point
    /// read's thread takes the core at once when it wakes, but on cores that requests keep
    /// busy all the time scans barely move and time out). `fifo` ignores it.
    pub scan_nice: u8,
    /// Tablets a scan fetches at once at most, sized by the replicas' estimates of their
    /// cells (1: one tablet after another, as Cassandra's range reads without a
    /// concurrency factor).
    pub scan_parallel_tablets: usize,
    /// Cells a scan asks of a replica per chunk at most: the unit of scan work a read
    /// thread does before it turns to the next queued read. Small chunks (4096, the
    /// default: a few hundred rows) let a queued point read in between; a chunk the size
    /// of a driver's page (e.g. 65536) reads a page in one go, as Cassandra's read stage
    /// does.
    pub scan_chunk_cells: u32,
    /// How long a range read's work may wait for its turn — a scan for a scan thread, a
    /// chunk on a replica — before it is refused (Cassandra's `range_request_timeout`):
    /// by then a client with the drivers' default timeouts has given up on it.
    pub range_request_timeout_ms: u64,
    /// Datacenter and rack this node reports.
    pub datacenter: String,
    pub rack: String,
    /// `periodic` (default) or `group`.
    pub commitlog_sync: CommitLogSync,
    /// Periodic mode: how often the write-ahead log is synced.
    pub commitlog_sync_period_ms: u64,
    /// Largest accepted frame body (Cassandra's `native_transport_max_frame_size`).
    pub max_frame_bytes: usize,
    /// Requests one connection may have in flight; beyond it requests get `Overloaded`.
    pub max_requests_in_flight_per_connection: usize,
    /// Client connections accepted at once; beyond it new connections are closed.
    pub max_connections: usize,
    /// RocksDB block cache, in MiB.
    pub block_cache_mib: usize,
    /// RocksDB memtable size, in MiB.
    pub memtable_mib: usize,
    /// Log filter, e.g. `info` or `shoal=debug` (overridden by RUST_LOG).
    pub log_level: String,
    /// `AllowAllAuthenticator` (default) or `PasswordAuthenticator`.
    pub authenticator: Authenticator,
    /// `AllowAllAuthorizer` (default) or `CassandraAuthorizer` (needs
    /// `PasswordAuthenticator`).
    pub authorizer: Authorizer,
    /// Port of the Prometheus endpoint (`/metrics` on the listen address); 0: none.
    pub metrics_port: u16,
    /// `off` (default), `optional` or `required`: TLS for clients on the CQL port.
    pub client_tls: ClientTls,
    /// The node's certificate chain (PEM), for client TLS; reloaded when it changes.
    pub tls_certificate: Option<PathBuf>,
    /// The certificate's private key (PEM).
    pub tls_private_key: Option<PathBuf>,
    /// Mutual TLS between nodes: each presents `tls_certificate` and accepts only peers
    /// whose certificate chains to `tls_ca_certificate` and names their address.
    pub internode_tls: bool,
    /// The cluster's CA certificate (PEM), for internode TLS.
    pub tls_ca_certificate: Option<PathBuf>,
    /// With client TLS on: clients must present a certificate signed by this CA (PEM),
    /// as Cassandra's `require_client_auth`; unset (default): no client certificate asked.
    pub client_tls_ca_certificate: Option<PathBuf>,
    /// Start as the replacement of the dead member at this address (Cassandra's
    /// `replace_address_first_boot`): its replicas are rebuilt here first.
    pub replace_address: Option<IpAddr>,
    /// Enter the cluster as the node starts (the default). `false`: the node opens its
    /// store and answers its peers and `shoal admin`, but enters the cluster (and then
    /// serves clients) only once `shoal admin join` asks it to, as Cassandra's
    /// `-Dcassandra.join_ring=false` and `nodetool join`.
    pub join_ring: bool,
    /// Hard cap on the bytes this node streams (sent and received together) per second,
    /// in MiB; 0: no cap but the adaptive one.
    pub stream_throughput_mib_per_s: u64,
    /// While this node serves client requests, the most it streams per second (sent and
    /// received together), in MiB, whatever the latency policy allows; 0 (the default):
    /// no such limit — streaming's idle CPU priority (`stream_nice` 19) already gives
    /// the cores to requests first.
    pub stream_throughput_under_load_mib_per_s: u64,
    /// The client latency (99th percentile, milliseconds) streaming backs off to keep:
    /// while requests served here are slower, streaming slows down; when they are faster,
    /// or there are none, it speeds up to the cap.
    pub stream_target_p99_ms: u64,
    /// How many times the client p99 seen while nothing streams streaming may let it grow
    /// (the target is then the lower of this and `stream_target_p99_ms`); 0: off.
    pub stream_p99_growth: f64,
    /// Tablet migrations one node takes part in at once (as source or destination).
    pub migrations_per_node: usize,
    /// CPU priority of streaming work, as a Unix niceness: 0 competes equally with client
    /// requests, 1 to 18 yield more and more (Linux's batch policy at that niceness), 19
    /// (the default) yields entirely: Linux's idle policy, streaming runs on the CPU
    /// nothing else wants.
    pub stream_nice: u8,
    /// A tablet of an ordered table holding more than this many MiB on disk is split in
    /// two (see `splitting`); 0: never split.
    pub tablet_split_mib: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cluster_name: "Shoal Cluster".into(),
            data_dir: PathBuf::from("data"),
            listen_address: IpAddr::from([127, 0, 0, 1]),
            cql_port: 9042,
            internode_port: 7000,
            seeds: Vec::new(),
            max_hint_window_ms: 3 * 3600 * 1000,
            max_hints_mib: 1024,
            worker_threads: 0,
            read_scheduling: ReadScheduling::NarrowFirst,
            read_threads: 0,
            scan_parallel_tablets: shoal_replication::estimates::MAX_PARALLEL_TABLETS,
            scan_chunk_cells: shoal_replication::range::SCAN_CHUNK_CELLS,
            range_request_timeout_ms: shoal_replication::RANGE_READ_TIMEOUT.as_millis() as u64,
            datacenter: "datacenter1".into(),
            rack: "rack1".into(),
            commitlog_sync: CommitLogSync::Periodic,
            commitlog_sync_period_ms: 10_000,
            max_frame_bytes: shoal_cql::frame::DEFAULT_MAX_FRAME_BYTES,
            max_requests_in_flight_per_connection: 2048,
            max_connections: 1024,
            block_cache_mib: 256,
            memtable_mib: 16,
            log_level: "info".into(),
            authenticator: Authenticator::AllowAllAuthenticator,
            authorizer: Authorizer::AllowAllAuthorizer,
            metrics_port: 9180,
            client_tls: ClientTls::Off,
            tls_certificate: None,
            tls_private_key: None,
            internode_tls: false,
            tls_ca_certificate: None,
            client_tls_ca_certificate: None,
            replace_address: None,
            join_ring: true,
            stream_throughput_mib_per_s: 0,
            stream_throughput_under_load_mib_per_s: 0,
            stream_target_p99_ms: 20,
            stream_p99_growth: 0.0,
            migrations_per_node: 8,
            tablet_split_mib: 128,
            stream_nice: 19,
            scan_nice: shoal_coordinator::schedule::SCAN_THREAD_NICE,
        }
    }
}

impl Config {
    /// Reads a TOML file; missing fields keep their defaults.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
        toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("invalid config file {}: {e}", path.display()))
    }

    /// Threads client connections are spread over: `worker_threads`, or one per core.
    pub fn connection_threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => threads,
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.cql_port != 0, "cql_port must not be 0");
        anyhow::ensure!(self.internode_port != 0, "internode_port must not be 0");
        anyhow::ensure!(
            self.worker_threads <= 1024,
            "worker_threads must be at most 1024 (0 means one per core)"
        );
        anyhow::ensure!(
            self.read_threads <= 1024,
            "read_threads must be at most 1024 (0 means one per core)"
        );
        anyhow::ensure!(
            (1..=64).contains(&self.scan_parallel_tablets),
            "scan_parallel_tablets must be between 1 and 64 (got {})",
            self.scan_parallel_tablets
        );
        anyhow::ensure!(
            (64..=1_048_576).contains(&self.scan_chunk_cells),
            "scan_chunk_cells must be between 64 and 1048576 (got {})",
            self.scan_chunk_cells
        );
        anyhow::ensure!(
            (100..=3_600_000).contains(&self.range_request_timeout_ms),
            "range_request_timeout_ms must be between 100 and 3600000 (got {})",
            self.range_request_timeout_ms
        );
        anyhow::ensure!(
            self.internode_port != self.cql_port,
            "internode_port and cql_port must differ"
        );
        anyhow::ensure!(
            self.commitlog_sync_period_ms >= 1 && self.commitlog_sync_period_ms <= 600_000,
            "commitlog_sync_period_ms must be between 1 and 600000 (got {})",
            self.commitlog_sync_period_ms
        );
        anyhow::ensure!(
            (1024..=256 * 1024 * 1024).contains(&self.max_frame_bytes),
            "max_frame_bytes must be between 1 KiB and 256 MiB (got {})",
            self.max_frame_bytes
        );
        anyhow::ensure!(
            (1..=32_768).contains(&self.max_requests_in_flight_per_connection),
            "max_requests_in_flight_per_connection must be between 1 and 32768"
        );
        anyhow::ensure!(
            self.max_connections >= 1,
            "max_connections must be at least 1"
        );
        anyhow::ensure!(
            self.block_cache_mib >= 8,
            "block_cache_mib must be at least 8"
        );
        anyhow::ensure!(self.memtable_mib >= 1, "memtable_mib must be at least 1");
        anyhow::ensure!(
            !self.cluster_name.is_empty(),
            "cluster_name must not be empty"
        );
        anyhow::ensure!(
            self.authorizer == Authorizer::AllowAllAuthorizer
                || self.authenticator == Authenticator::PasswordAuthenticator,
            "authorizer = \"CassandraAuthorizer\" needs authenticator = \"PasswordAuthenticator\""
        );
        anyhow::ensure!(
            self.client_tls == ClientTls::Off
                || (self.tls_certificate.is_some() && self.tls_private_key.is_some()),
            "client_tls = \"{}\" needs tls_certificate and tls_private_key (PEM files)",
            match self.client_tls {
                ClientTls::Optional => "optional",
                _ => "required",
            }
        );
        anyhow::ensure!(
            (1..=64).contains(&self.migrations_per_node),
            "migrations_per_node must be between 1 and 64 (got {})",
            self.migrations_per_node
        );
        anyhow::ensure!(
            (1..=19).contains(&self.scan_nice),
            "scan_nice must be between 1 and 19 (got {})",
            self.scan_nice
        );
        anyhow::ensure!(
            self.stream_nice <= 19,
            "stream_nice must be between 0 and 19 (got {})",
            self.stream_nice
        );
        anyhow::ensure!(
            self.stream_throughput_under_load_mib_per_s == 0
                || self.stream_throughput_under_load_mib_per_s >= 4,
            "stream_throughput_under_load_mib_per_s must be 0 (no limit) or at least 4 (got {})",
            self.stream_throughput_under_load_mib_per_s
        );
        anyhow::ensure!(
            self.stream_target_p99_ms >= 1,
            "stream_target_p99_ms must be at least 1"
        );
        anyhow::ensure!(
            self.stream_p99_growth == 0.0
                || (self.stream_p99_growth >= 1.0 && self.stream_p99_growth.is_finite()),
            "stream_p99_growth must be 0 (off) or a number of at least 1 (got {})",
            self.stream_p99_growth
        );
        anyhow::ensure!(
            self.replace_address != Some(self.listen_address) || !self.seeds.is_empty(),
            "replace_address needs seeds: a replacement joins the cluster through them"
        );
        anyhow::ensure!(
            self.client_tls_ca_certificate.is_none() || self.client_tls != ClientTls::Off,
            "client_tls_ca_certificate asks clients for certificates, which needs client_tls = \"optional\" or \"required\""
        );
        Ok(())
    }

    /// The internode TLS configuration, loaded (`None` when internode TLS is off).
    pub fn internode_tls(&self) -> anyhow::Result<Option<crate::tls::InternodeTls>> {
        if !self.internode_tls {
            return Ok(None);
        }
        match (&self.tls_certificate, &self.tls_private_key, &self.tls_ca_certificate) {
            (Some(certificate), Some(key), Some(ca)) => {
                Ok(Some(crate::tls::InternodeTls::load(certificate, key, ca)?))
            }
            _ => anyhow::bail!(
                "internode_tls needs tls_certificate, tls_private_key and tls_ca_certificate (PEM files)"
            ),
        }
    }

    /// Which of authentication and authorization this node enforces.
    pub fn auth_settings(&self) -> shoal_auth::AuthSettings {
        shoal_auth::AuthSettings {
            authentication: self.authenticator == Authenticator::PasswordAuthenticator,
            authorization: self.authorizer == Authorizer::CassandraAuthorizer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_is_valid_and_matches_the_defaults() {
        // The directory at run time: one target directory serves several checkouts.
        let manifest = std::env::var("CARGO_MANIFEST_DIR")
            .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let path = Path::new(&manifest).join("../../conf/shoal.toml");
        let config = Config::load(&path).unwrap();
        config.validate().unwrap();
        assert_eq!(config, Config::default());
    }

    /// Why `config` is refused.
    fn refusal(config: Config) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        let config = Config {
            commitlog_sync_period_ms: 0,
            ..Config::default()
        };
        assert!(refusal(config).contains("commitlog_sync_period_ms"));
        assert!(toml::from_str::<Config>("no_such_field = 1").is_err());
        // A limit under load too low to move a tablet in reasonable time.
        let config = Config {
            stream_throughput_under_load_mib_per_s: 1,
            ..Config::default()
        };
        assert!(refusal(config).contains("stream_throughput_under_load_mib_per_s"));
        // Scan work at a normal priority would compete with point reads as equals.
        for scan_nice in [0, 20] {
            let config = Config {
                scan_nice,
                ..Config::default()
            };
            assert!(refusal(config).contains("scan_nice must be between 1 and 19"));
        }
        // A scan chunk of no cells would never move; one past a megacell could buffer
        // gigabytes per chunk.
        for scan_chunk_cells in [0, 2 << 20] {
            let config = Config {
                scan_chunk_cells,
                ..Config::default()
            };
            assert!(refusal(config).contains("scan_chunk_cells must be between 64 and 1048576"));
        }
    }
}
