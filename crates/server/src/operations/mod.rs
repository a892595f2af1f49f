//! The operator's commands on one node, as `nodetool` has them: flush, compact, table
//! statistics and latency histograms, compaction statistics, snapshots (RocksDB
//! checkpoints), drain, cleanup, info, the tablet ring, streams, and the cluster's
//! shape — decommission (this node leaves) and removenode (a dead node is removed).
//! `shoal admin` sends an [`Operation`] to a node's internode port; the node answers with
//! JSON, which `shoal admin` prints as it is (`--json`) or as text. The reports are in
//! `reports`, decommission and removenode in `leaving`.
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

mod leaving;
mod reports;

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
    /// Enter the cluster, for a node started with `join_ring = false`. Answers at once;
    /// the node then joins as any new node does (`UJ`, then `UN`). While the node waits,
    /// its join gate (`membership::join_gate`) answers this; once the node has entered,
    /// [`NodeOperations::perform`] answers that it has joined already.
    Join,
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
    /// Waits until this node is a normal member and no tablet migration is under way in
    /// the cluster: the end of its join (`shoal admin join --wait`). Asked while the node
    /// is still starting, its join gate answers [`crate::membership::join_gate::STILL_STARTING`].
    AwaitJoined,
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
            Operation::Join => return Err("this node has joined the cluster already".into()),
            Operation::Decommission => return self.decommission().await,
            Operation::RemoveNode { host_id } => return self.remove_node(host_id).await,
            Operation::Streams => return Ok(self.streams()),
            Operation::IndexBuilds => {
                return Ok(json!(self.coordinator.index_catalog().progress()))
            }
            Operation::ReadStats => return Ok(self.read_stats()),
            Operation::AwaitJoined => return self.wait_until_joined().await,
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
            Operation::Join
            | Operation::Decommission
            | Operation::RemoveNode { .. }
            | Operation::Streams
            | Operation::IndexBuilds
            | Operation::ReadStats
            | Operation::AwaitJoined => Err("handled before".into()),
        }
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
}
