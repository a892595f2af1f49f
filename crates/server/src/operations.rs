//! The operator's commands on one node, as `nodetool` has them: flush, compact, table
//! statistics and latency histograms, compaction statistics, snapshots (RocksDB checkpoints), drain, cleanup, info, and
//! the tablet ring. `shoal admin` sends an [`Operation`] to a node's internode port; the node
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
                let _ = self.close_clients.send(true);
                engine.flush().map_err(|e| e.to_string())?;
                engine.sync().map_err(|e| e.to_string())?;
                Ok(json!({ "drained": true }))
            }
            Operation::Cleanup { keyspace } => self.cleanup(keyspace.as_deref()),
            Operation::Info => Ok(self.info()),
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
        }
    }

    /// As `nodetool netstats`: the node's mode, the data it streams (none yet: tablets
    /// do not move between nodes; hints are the data waiting to reach other nodes), and
    /// the messages exchanged with each peer.
    fn net_stats(&self) -> Value {
        let mode = if *self.close_clients.borrow() {
            "DRAINED"
        } else {
            "NORMAL"
        };
        let (hint_bytes, hints_dropped) = self.hints.stats();
        json!({
            "mode": mode,
            "streams": [],
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
            let tablets = placement.tablets.tablets();
            for (index, tablet) in tablets.iter().enumerate() {
                if tablet.replicas.contains(&me) {
                    continue;
                }
                // Tablet `index` holds the tokens after the previous tablet's last one, up
                // to and including its own last token.
                let lower = match index.checked_sub(1).map(|i| tablets[i].last_token.0) {
                    None => shoal_model::keys::table_prefix(&table.id),
                    Some(previous) => shoal_model::keys::token_prefix(
                        &table.id,
                        shoal_model::Token(previous.saturating_add(1)),
                    ),
                };
                let upper = match tablet.last_token.0.checked_add(1) {
                    Some(next) if index + 1 < tablets.len() => {
                        shoal_model::keys::token_prefix(&table.id, shoal_model::Token(next))
                    }
                    _ => shoal_model::keys::table_end(&table.id),
                };
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
                })
            })
            .collect();
        Ok(json!({ "keyspace": keyspace, "table": table, "tablets": tablets }))
    }
}
