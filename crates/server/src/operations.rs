//! The operator's commands on one node, as `nodetool` has them: flush, compact, table
//! statistics and latency histograms, compaction statistics, snapshots (RocksDB
//! checkpoints), drain, cleanup, info, the tablet ring, streams, and the cluster's
//! shape — decommission (this node leaves) and removenode (a dead node is removed). `shoal admin` sends an [`Operation`] to a node's internode port; the node
//! answers with JSON, which `shoal admin` prints as it is (`--json`) or as text.
//!
//! Snapshots are checkpoints of the node's whole store (data and metadata, hard links to
//! the immutable files) under `DATA_DIR/snapshots/TAG`. Restoring one: stop the node,
//! replace `DATA_DIR/rocksdb` with the snapshot's directory, start the node (README,
//! "Operations").

use crate::metrics::Metrics;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shoal_coordinator::Coordinator;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// What an operator asks a node to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Operation {
    /// Write the memtables out to disk.
    Flush,
    /// Compact everything stored (dropping what deletions and TTLs allow).
    Compact,
    /// Size and requests of each table (of one keyspace).
    TableStats {
        keyspace: Option<String>,
    },
    /// Read and write latency percentiles of one table (bucket bounds).
    TableHistograms {
        keyspace: String,
        table: String,
    },
    /// Compactions running and the compaction backlog.
    CompactionStats,
    /// A checkpoint of everything stored, named `tag`.
    Snapshot {
        tag: String,
    },
    ListSnapshots,
    /// Removes one snapshot, or all of them.
    ClearSnapshot {
        tag: Option<String>,
    },
    /// Flush, sync the commit log, and stop serving clients (before a shutdown).
    Drain,
    /// Removes the data of tablets this node is not a replica of (of one keyspace).
    Cleanup {
        keyspace: Option<String>,
    },
    Info,
    /// The tablets of one table and their replicas.
    Ring {
        keyspace: String,
        table: String,
    },
    /// Trace this share of requests (0 to 1) on the node (`system_traces`).
    SetTraceProbability {
        probability: f64,
    },
    TraceProbability,
    /// The node's mode, data streams, and the messages exchanged with each peer.
    NetStats,
    /// Leave the cluster: stream every tablet replica away, then stop serving clients.
    /// Answers once the node has left.
    Decommission,
    /// Remove a dead member: its replicas are rebuilt from the surviving ones. Answers
    /// once it is gone.
    RemoveNode {
        host_id: shoal_model::HostId,
    },
    /// Tablet migrations under way in the cluster, and this node's streams.
    Streams,
    /// Builds of secondary indexes on this node: each index, its table, keys scanned.
    IndexBuilds,
    /// The read scheduler: its order, and per class of reads the queue length, reads
    /// served and their mean queue wait.
    ReadStats,
    /// This node's on-disk bytes of each of `tablets`, in order: for a neighbour deciding
    /// whether two tablets are small enough to merge (`crate::splitting`), and for the
    /// metadata leader weighing tablets for the balancer (`crate::tablet_sizes`).
    TabletBytes {
        tablets: Vec<crate::streaming::TabletKeys>,
    },
}

/// What a node needs to carry out operations.
pub struct NodeOperations {
    pub coordinator: Arc<Coordinator>,
    pub metrics: Arc<Metrics>,
    /// Connections to the other nodes (netstats).
    pub peers: Arc<crate::internode::Peers>,
    /// Hints kept for replicas that were down (netstats).
    pub hints: Arc<shoal_replication::Hints>,
    pub data_dir: PathBuf,
    pub started: Instant,
    /// Stops the CQL listener and closes client connections (drain).
    pub close_clients: watch::Sender<bool>,
    /// This node's streams (netstats, streams).
    pub streaming: Arc<crate::streaming::Streaming>,
    /// Connections to peers, for asking one whether a node is still a member.
    pub detector: Arc<crate::membership::FailureDetector>,
}

impl NodeOperations {
    fn read_stats(&self) -> Value {
        let reads = self.coordinator.reads();
        let classes: Vec<Value> = reads
            .statistics()
            .into_iter()
            .map(|class| {
                let mean_wait_ms = if class.served == 0 {
                    0.0
                } else {
                    class.waited.as_secs_f64() * 1000.0 / class.served as f64
                };
                json!({
                    "class": class.class,
                    "queued": class.queued,
                    "served": class.served,
                    "mean_wait_ms": mean_wait_ms,
                })
            })
            .collect();
        json!({ "ordering": format!("{:?}", reads.ordering()), "classes": classes })
    }
}

/// A tag must be a plain name: it becomes a directory.
fn check_tag(tag: &str) -> Result<(), String> {
    let valid = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !tag.starts_with('.');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid snapshot tag '{tag}': use letters, digits, '-', '_' and '.' (not first)"
        ))
    }
}

fn directory_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| match entry.metadata() {
                    Ok(m) if m.is_dir() => directory_bytes(&entry.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

impl NodeOperations {
    fn snapshots_dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// Runs `operation`; blocking work runs on a blocking thread.
    pub async fn perform(self: &Arc<Self>, operation: Operation) -> Result<Value, String> {
        match operation {
            Operation::Decommission => return self.decommission().await,
            Operation::RemoveNode { host_id } => return self.remove_node(host_id).await,
            Operation::Streams => return Ok(self.streams()),
            Operation::IndexBuilds => {
                return Ok(json!(self.coordinator.index_catalog().progress()))
            }
            Operation::ReadStats => return Ok(self.read_stats()),
            _ => {}
        }
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || this.perform_blocking(operation))
            .await
            .map_err(|_| "the operation failed unexpectedly".to_string())?
    }

    fn perform_blocking(&self, operation: Operation) -> Result<Value, String> {
        let engine = self.coordinator.engine();
        match operation {
            Operation::Flush => {
                engine.flush().map_err(|e| e.to_string())?;
                Ok(json!({ "flushed": true }))
            }
            Operation::Compact => {
                let started = Instant::now();
                engine.compact_all().map_err(|e| e.to_string())?;
                Ok(json!({ "compacted": true, "seconds": started.elapsed().as_secs_f64() }))
            }
            Operation::TableStats { keyspace } => self.table_stats(keyspace.as_deref()),
            Operation::TableHistograms { keyspace, table } => {
                self.table_histograms(&keyspace, &table)
            }
            Operation::CompactionStats => {
                let figures: serde_json::Map<String, Value> = engine
                    .statistics()
                    .into_iter()
                    .map(|s| {
                        (
                            s.name.trim_start_matches("storage_").to_string(),
                            json!(s.value),
                        )
                    })
                    .collect();
                Ok(Value::Object(figures))
            }
            Operation::Snapshot { tag } => {
                check_tag(&tag)?;
                let directory = self.snapshots_dir().join(&tag);
                if directory.exists() {
                    return Err(format!("snapshot '{tag}' already exists"));
                }
                std::fs::create_dir_all(self.snapshots_dir()).map_err(|e| e.to_string())?;
                engine.checkpoint(&directory).map_err(|e| e.to_string())?;
                Ok(
                    json!({ "tag": tag, "directory": directory, "bytes": directory_bytes(&directory) }),
                )
            }
            Operation::ListSnapshots => {
                let mut snapshots = Vec::new();
                if let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) {
                    for entry in entries.flatten() {
                        snapshots.push(json!({
                            "tag": entry.file_name().to_string_lossy(),
                            "directory": entry.path(),
                            "bytes": directory_bytes(&entry.path()),
                        }));
                    }
                }
                snapshots.sort_by(|a, b| a["tag"].as_str().cmp(&b["tag"].as_str()));
                Ok(json!({ "snapshots": snapshots }))
            }
            Operation::ClearSnapshot { tag } => {
                let removed: Vec<String> = match tag {
                    Some(tag) => {
                        check_tag(&tag)?;
                        let directory = self.snapshots_dir().join(&tag);
                        if !directory.exists() {
                            return Err(format!("there is no snapshot '{tag}'"));
                        }
                        std::fs::remove_dir_all(&directory).map_err(|e| e.to_string())?;
                        vec![tag]
                    }
                    None => {
                        let mut removed = Vec::new();
                        if let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) {
                            for entry in entries.flatten() {
                                std::fs::remove_dir_all(entry.path()).map_err(|e| e.to_string())?;
                                removed.push(entry.file_name().to_string_lossy().into_owned());
                            }
                        }
                        removed
                    }
                };
                Ok(json!({ "removed": removed }))
            }
            Operation::Drain => {
                self.close_clients.send_replace(true);
                engine.flush().map_err(|e| e.to_string())?;
                engine.sync().map_err(|e| e.to_string())?;
                Ok(json!({ "drained": true }))
            }
            Operation::Cleanup { keyspace } => self.cleanup(keyspace.as_deref()),
            Operation::Info => Ok(self.info()),
            Operation::TabletBytes { tablets } => Ok(json!({
                "bytes": crate::splitting::tablets_bytes(engine.as_ref(), &tablets)
            })),
            Operation::Ring { keyspace, table } => self.ring(&keyspace, &table),
            Operation::SetTraceProbability { probability } => {
                self.coordinator
                    .trace_sampler()
                    .set_probability(probability)?;
                tracing::info!(probability, "trace probability set");
                Ok(json!({ "trace_probability": probability }))
            }
            Operation::TraceProbability => {
                Ok(json!({ "trace_probability": self.coordinator.trace_sampler().probability() }))
            }
            Operation::NetStats => Ok(self.net_stats()),
            Operation::Decommission
            | Operation::RemoveNode { .. }
            | Operation::Streams
            | Operation::IndexBuilds
            | Operation::ReadStats => Err("handled before".into()),
        }
    }

    /// As `nodetool netstats`: the node's mode, the tablets it streams in and out (and
    /// hints, the data waiting to reach other nodes), and the messages exchanged with
    /// each peer.
    fn net_stats(&self) -> Value {
        let mode = if *self.close_clients.borrow() {
            "DRAINED"
        } else {
            match self.my_state() {
                Some(shoal_cluster::MemberState::Joining) => "JOINING",
                Some(shoal_cluster::MemberState::Leaving) => "LEAVING",
                Some(_) => "NORMAL",
                None => "DECOMMISSIONED",
            }
        };
        let (hint_bytes, hints_dropped) = self.hints.stats();
        let status = self.streaming.status();
        let receiving = status.incoming.iter().map(|s| {
            json!({
                "direction": "receiving",
                "tablet": s.tablet,
                "peers": s.sources.join(","),
                "bytes_done": s.bytes_received,
                "bytes_total": s.bytes_estimated,
            })
        });
        let sending = status.outgoing.iter().map(|s| {
            json!({
                "direction": "sending",
                "tablet": null,
                "peers": null,
                "bytes_done": s.bytes_sent,
                "bytes_total": null,
            })
        });
        json!({
            "mode": mode,
            "streams": receiving.chain(sending).collect::<Vec<_>>(),
            "stream_rate_limit_mib_per_s": status.rate_bytes_per_s.map(|b| b >> 20),
            "stream_policy": status.policy,
            "hints_pending_bytes": hint_bytes,
            "hints_dropped": hints_dropped,
            "peers": self.peers.statistics(),
        })
    }

    fn table_stats(&self, keyspace: Option<&str>) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        if let Some(keyspace) = keyspace {
            schema.keyspace(keyspace).map_err(|e| e.message)?;
        }
        let engine = self.coordinator.engine();
        let tables: Vec<Value> = schema
            .user_keyspaces()
            .filter(|k| keyspace.is_none_or(|name| name == k.name))
            .flat_map(|k| k.tables.values())
            .map(|table| {
                let lower = shoal_model::keys::table_prefix(&table.id);
                let upper = shoal_model::keys::table_end(&table.id);
                let (reads, writes) = self.metrics.table_requests(&table.id);
                json!({
                    "keyspace": table.keyspace,
                    "table": table.name,
                    "disk_bytes": engine.approximate_range_bytes(&lower, &upper),
                    "local_reads": reads,
                    "local_writes": writes,
                    "gc_grace_seconds": table.options.gc_grace_seconds,
                })
            })
            .collect();
        Ok(json!({ "tables": tables }))
    }

    /// Deletes, table by table, the token ranges of the tablets whose replicas do not
    /// include this node (data left behind when tablets were placed elsewhere).
    fn cleanup(&self, keyspace: Option<&str>) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        if let Some(keyspace) = keyspace {
            schema.keyspace(keyspace).map_err(|e| e.message)?;
        }
        let Some(cluster) = self.coordinator.cluster() else {
            return Ok(json!({ "tablets_cleaned": 0 }));
        };
        let state = cluster.metadata.state();
        let me = self.coordinator.info().host_id;
        let engine = self.coordinator.engine();
        let mut cleaned = 0;
        for table in schema
            .user_keyspaces()
            .filter(|k| keyspace.is_none_or(|name| name == k.name))
            .flat_map(|k| k.tables.values())
        {
            let Some(placement) = state.tables.get(&table.id) else {
                continue;
            };
            for tablet in placement.tablets.tablets() {
                // A tablet moving here (or away from here) is not left behind.
                if tablet.involves(&me) {
                    continue;
                }
                let Some((after, last)) = placement.tablets.bounds_of(tablet.id) else {
                    continue;
                };
                let (lower, upper) = shoal_model::keys::token_range(&table.id, after, last);
                engine
                    .delete_range(&lower, &upper)
                    .map_err(|e| e.to_string())?;
                cleaned += 1;
            }
        }
        Ok(json!({ "tablets_cleaned": cleaned }))
    }

    /// Percentiles of a table's read and write latencies coordinated here, as the upper
    /// bound of the histogram bucket they fall in (buckets double from 50 µs).
    fn table_histograms(&self, keyspace: &str, table: &str) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        let metadata = schema.table(keyspace, table).map_err(|e| e.message)?;
        let (reads, writes) = self
            .metrics
            .table_latencies(&metadata.id)
            .unwrap_or_default();
        let percentiles: Vec<Value> = [0.5, 0.75, 0.95, 0.98, 0.99, 1.0]
            .into_iter()
            .map(|quantile| {
                let micros = |latency: &crate::metrics::Latency| {
                    latency
                        .quantile(quantile)
                        .map(|seconds| if seconds >= f64::MAX { None } else { Some((seconds * 1e6).round() as u64) })
                };
                json!({
                    "percentile": if quantile >= 1.0 { "max".to_string() } else { format!("{}%", quantile * 100.0) },
                    "read_latency_us_at_most": micros(&reads),
                    "write_latency_us_at_most": micros(&writes),
                })
            })
            .collect();
        Ok(json!({ "keyspace": keyspace, "table": table, "percentiles": percentiles }))
    }

    fn info(&self) -> Value {
        let info = self.coordinator.info();
        let engine = self.coordinator.engine();
        let clients_served = !*self.close_clients.borrow();
        json!({
            "id": info.host_id.to_string(),
            "address": info.address,
            "datacenter": info.datacenter,
            "rack": info.rack,
            "uptime_seconds": self.started.elapsed().as_secs(),
            "load_bytes": engine.approximate_size_bytes(),
            "schema_version": uuid::Uuid::from_bytes(self.coordinator.schema().version).to_string(),
            "native_transport_active": clients_served,
            "members": self.coordinator.member_count(),
            "data_directory": self.data_dir,
        })
    }

    /// This node's state in the cluster (`None`: not a member, or no cluster).
    fn my_state(&self) -> Option<shoal_cluster::MemberState> {
        let cluster = self.coordinator.cluster()?;
        let state = cluster.metadata.state();
        state
            .member_by_host(&self.coordinator.info().host_id)
            .map(|m| m.state)
    }

    /// Migrations under way in the cluster (as this node knows them) and this node's
    /// streams.
    fn streams(&self) -> Value {
        let mut migrations = Vec::new();
        if let Some(cluster) = self.coordinator.cluster() {
            let state = cluster.metadata.state();
            let schema = self.coordinator.schema();
            let address = |host: &Option<shoal_model::HostId>| {
                host.and_then(|h| state.member_by_host(&h))
                    .map(|m| m.internode_address.ip().to_string())
                    .unwrap_or_else(|| "-".into())
            };
            for (table, tablet, transition) in state.migrations() {
                let name = schema
                    .keyspace_of_table(&table)
                    .and_then(|k| {
                        k.tables
                            .values()
                            .find(|t| t.id == table)
                            .map(|t| format!("{}.{}", k.name, t.name))
                    })
                    .unwrap_or_else(|| table.to_string());
                migrations.push(json!({
                    "migration": transition.id.0,
                    "table": name,
                    "tablet": tablet.0,
                    "from": address(&transition.leaving),
                    "to": address(&transition.pending),
                    "stage": transition.stage.name(),
                }));
            }
        }
        let status = self.streaming.status();
        json!({
            "migrations": migrations,
            "receiving": status.incoming.iter().map(|s| json!({
                "migration": s.migration,
                "tablet": s.tablet,
                "from": s.sources,
                "bytes_done": s.bytes_received,
                "bytes_total": s.bytes_estimated,
                "mib_per_s": (s.bytes_received as f64 / s.seconds.max(0.001) / 1048576.0 * 10.0).round() / 10.0,
                "state": s.state,
            })).collect::<Vec<_>>(),
            "sending": status.outgoing,
            "rate_limit_mib_per_s": status.rate_bytes_per_s.map(|b| b >> 20),
            "policy": status.policy,
            "streamed_bytes_total": status.total_bytes,
        })
    }

    /// Waits until `host` is no longer a member, as this node applies the metadata or, if
    /// this node stopped hearing the metadata (it has left itself), as another member
    /// says.
    async fn wait_until_gone(&self, host: shoal_model::HostId) -> Result<(), String> {
        let cluster = self
            .coordinator
            .cluster()
            .ok_or("this node is not part of a cluster")?;
        let mut states = cluster.metadata.subscribe();
        loop {
            let state = Arc::clone(&states.borrow_and_update());
            if state.member_by_host(&host).is_none() {
                return Ok(());
            }
            let others: Vec<std::net::SocketAddr> = state
                .members
                .values()
                .filter(|m| m.host_id != host && m.host_id != self.coordinator.info().host_id)
                .filter(|m| {
                    shoal_replication::Liveness::is_alive(self.detector.as_ref(), &m.host_id)
                })
                .map(|m| m.internode_address)
                .collect();
            for other in others.iter().take(1) {
                let answer = self
                    .peers
                    .call(
                        *other,
                        &crate::internode::Message::Status,
                        std::time::Duration::from_secs(5),
                    )
                    .await;
                if let Ok(crate::internode::Reply::Status(members)) = answer {
                    if members.iter().all(|m| m.host_id != host) {
                        return Ok(());
                    }
                }
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), states.changed()).await;
        }
    }

    async fn decommission(&self) -> Result<Value, String> {
        let started = Instant::now();
        let cluster = self
            .coordinator
            .cluster()
            .ok_or("this node is not part of a cluster")?;
        let me = self.coordinator.info().host_id;
        let state = cluster.metadata.state();
        let member = state
            .member_by_host(&me)
            .ok_or("this node has already left the cluster")?;
        if member.state != shoal_cluster::MemberState::Leaving {
            self.check_room_without(&state, member)?;
            let outcome = cluster
                .metadata
                .propose(shoal_cluster::Command::SetMemberState {
                    host_id: me,
                    from: vec![
                        shoal_cluster::MemberState::Normal,
                        shoal_cluster::MemberState::Joining,
                    ],
                    to: shoal_cluster::MemberState::Leaving,
                })
                .await
                .map_err(|e| e.to_string())?;
            if let shoal_cluster::CommandOutcome::Rejected(reason) = outcome {
                return Err(format!("cannot decommission: {reason}"));
            }
            tracing::info!("decommissioning: streaming every tablet replica to other nodes");
        }
        self.wait_until_gone(me).await?;
        // A node outside the cluster routes by a tablet map nobody updates any more, and
        // must not campaign in a metadata group it is no longer part of.
        self.close_clients.send_replace(true);
        cluster.metadata.mark_left();
        cluster.metadata.shutdown().await;
        tracing::info!(
            "this node has left the cluster; it no longer serves clients and can be stopped"
        );
        Ok(json!({ "decommissioned": true, "seconds": started.elapsed().as_secs_f64() }))
    }

    /// Refuses to take `leaving` out when a keyspace's replication could no longer be met
    /// without it (as Cassandra refuses a decommission that would leave too few nodes).
    fn check_room_without(
        &self,
        state: &shoal_cluster::ClusterState,
        leaving: &shoal_cluster::Member,
    ) -> Result<(), String> {
        let remaining: Vec<&shoal_cluster::Member> = state
            .members
            .values()
            .filter(|m| m.host_id != leaving.host_id && m.state.accepts_replicas())
            .collect();
        let schema = self.coordinator.schema();
        for (table, placement) in &state.tables {
            let needed: Vec<(Option<&str>, usize)> = match &placement.strategy {
                shoal_placement::ReplicationStrategy::Simple { factor } => vec![(None, *factor)],
                shoal_placement::ReplicationStrategy::NetworkTopology { factors } => factors
                    .iter()
                    .map(|(dc, factor)| (Some(dc.as_str()), *factor))
                    .collect(),
            };
            for (datacenter, factor) in needed {
                let available = remaining
                    .iter()
                    .filter(|m| datacenter.is_none_or(|dc| m.datacenter == dc))
                    .count();
                let held_before = datacenter.is_none_or(|dc| leaving.datacenter == dc);
                if held_before && available < factor {
                    let keyspace = schema
                        .keyspace_of_table(table)
                        .map(|k| k.name.clone())
                        .unwrap_or_else(|| table.to_string());
                    return Err(format!(
                        "Not enough live nodes to maintain replication factor in keyspace {keyspace} (RF = {factor}, nodes left = {available}). Perform a forceful decommission to ignore."
                    ));
                }
            }
        }
        Ok(())
    }

    async fn remove_node(&self, host_id: shoal_model::HostId) -> Result<Value, String> {
        let started = Instant::now();
        let cluster = self
            .coordinator
            .cluster()
            .ok_or("this node is not part of a cluster")?;
        if host_id == self.coordinator.info().host_id {
            return Err("Cannot remove self: use decommission on this node instead".into());
        }
        let state = cluster.metadata.state();
        let Some(member) = state.member_by_host(&host_id) else {
            return Err(format!("Host ID not found: {host_id}"));
        };
        if cluster.liveness.is_alive(&host_id) {
            return Err(format!(
                "Node /{} is alive and owns this ID. Use decommission command to remove it from the ring",
                member.internode_address.ip()
            ));
        }
        if member.state != shoal_cluster::MemberState::Removing {
            let outcome = cluster
                .metadata
                .propose(shoal_cluster::Command::SetMemberState {
                    host_id,
                    from: vec![
                        shoal_cluster::MemberState::Normal,
                        shoal_cluster::MemberState::Joining,
                        shoal_cluster::MemberState::Leaving,
                    ],
                    to: shoal_cluster::MemberState::Removing,
                })
                .await
                .map_err(|e| e.to_string())?;
            if let shoal_cluster::CommandOutcome::Rejected(reason) = outcome {
                return Err(format!("cannot remove the node: {reason}"));
            }
            tracing::info!(node = %member.internode_address, "removing a dead node: rebuilding its replicas from the others");
        }
        self.wait_until_gone(host_id).await?;
        Ok(json!({ "removed": host_id.to_string(), "seconds": started.elapsed().as_secs_f64() }))
    }

    fn ring(&self, keyspace: &str, table: &str) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        let metadata = schema.table(keyspace, table).map_err(|e| e.message)?;
        let Some(cluster) = self.coordinator.cluster() else {
            return Err("this node is not part of a cluster".into());
        };
        let state = cluster.metadata.state();
        let Some(placement) = state.tables.get(&metadata.id) else {
            return Err(format!(
                "{keyspace}.{table} has no tablets (a virtual table?)"
            ));
        };
        let address = |host: &shoal_model::HostId| {
            state
                .members
                .values()
                .find(|m| m.host_id == *host)
                .map(|m| m.internode_address.ip().to_string())
                .unwrap_or_else(|| host.to_string())
        };
        let tablets: Vec<Value> = placement
            .tablets
            .tablets()
            .iter()
            .map(|tablet| {
                json!({
                    "id": tablet.id.0,
                    "last_token": tablet.last_token.0,
                    "replicas": tablet.replicas.iter().map(address).collect::<Vec<_>>(),
                    "moving": tablet.transition.as_ref().map(|t| format!(
                        "{} -> {} ({})",
                        t.leaving.as_ref().map_or("-".to_string(), address),
                        t.pending.as_ref().map_or("-".to_string(), address),
                        t.stage.name()
                    )),
                })
            })
            .collect();
        Ok(json!({ "keyspace": keyspace, "table": table, "tablets": tablets }))
    }
}
