//! Schema: keyspaces, tables and columns, as Cassandra defines them.
//!
//! [`Schema`] is an immutable snapshot; [`SchemaStore`] holds the current one behind an
//! `Arc` (readers clone the `Arc`, never lock across a request) and persists every change
//! in the engine's metadata before publishing it. Each change gets a new schema version
//! (a UUID), which `system.local.schema_version` reports and drivers compare.
//!
//! Columns keep Cassandra's order: partition key components, then clustering columns, then
//! static and regular columns by name. Tables of the system keyspaces (`system`,
//! `system_schema`, ...) are *virtual*: defined here, answered by
//! [`crate::system_tables`], never stored.

use crate::{ensure, CqlError};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use shoal_cluster::{ClusterMetadata, Command, CommandOutcome, SchemaRecord};
use shoal_cql::response::SchemaChange;
use shoal_model::keys;
use shoal_model::CqlType;
use shoal_placement::ReplicationStrategy;
use shoal_storage::Engine;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnKind {
    PartitionKey,
    Clustering,
    Static,
    Regular,
}

impl ColumnKind {
    /// The name `system_schema.columns.kind` uses.
    pub fn schema_name(self) -> &'static str {
        match self {
            ColumnKind::PartitionKey => "partition_key",
            ColumnKind::Clustering => "clustering",
            ColumnKind::Static => "static",
            ColumnKind::Regular => "regular",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnMetadata {
    pub name: String,
    pub cql_type: CqlType,
    pub kind: ColumnKind,
    /// Position within the partition key or the clustering key; -1 otherwise.
    pub position: i32,
    /// Clustering columns only: stored in descending order.
    pub descending: bool,
}

/// Table options, with Cassandra 5.0's defaults. Shoal honours `default_time_to_live` and
/// `gc_grace_seconds`; the others are kept and shown so that tools round-trip them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableOptions {
    pub comment: String,
    pub default_time_to_live: i32,
    pub gc_grace_seconds: i32,
    pub bloom_filter_fp_chance: f64,
    pub crc_check_chance: f64,
    pub memtable_flush_period_in_ms: i32,
    pub min_index_interval: i32,
    pub max_index_interval: i32,
    pub speculative_retry: String,
    pub additional_write_policy: String,
    pub read_repair: String,
    pub caching: BTreeMap<String, String>,
    pub compaction: BTreeMap<String, String>,
    pub compression: BTreeMap<String, String>,
}

impl Default for TableOptions {
    fn default() -> Self {
        let map = |entries: &[(&str, &str)]| {
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        TableOptions {
            comment: String::new(),
            default_time_to_live: 0,
            gc_grace_seconds: 864_000,
            bloom_filter_fp_chance: 0.01,
            crc_check_chance: 1.0,
            memtable_flush_period_in_ms: 0,
            min_index_interval: 128,
            max_index_interval: 2048,
            speculative_retry: "99p".into(),
            additional_write_policy: "99p".into(),
            read_repair: "BLOCKING".into(),
            caching: map(&[("keys", "ALL"), ("rows_per_partition", "NONE")]),
            compaction: map(&[
                (
                    "class",
                    "org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy",
                ),
                ("max_threshold", "32"),
                ("min_threshold", "4"),
            ]),
            compression: map(&[
                ("chunk_length_in_kb", "16"),
                ("class", "org.apache.cassandra.io.compress.LZ4Compressor"),
            ]),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedColumn {
    pub cql_type: CqlType,
    /// Microseconds: cells written at or before this time belong to the dropped column.
    pub dropped_at_micros: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableMetadata {
    pub keyspace: String,
    pub name: String,
    pub id: [u8; 16],
    /// Partition key, clustering, then the rest by name (Cassandra's order).
    pub columns: Vec<ColumnMetadata>,
    pub options: TableOptions,
    pub dropped_columns: BTreeMap<String, DroppedColumn>,
    /// Answered by `system_tables`, never stored.
    #[serde(default)]
    pub is_virtual: bool,
}

impl TableMetadata {
    pub fn column(&self, name: &str) -> Option<&ColumnMetadata> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The column, or the error Cassandra gives for an unknown one.
    pub fn require_column(&self, name: &str) -> Result<(usize, &ColumnMetadata), CqlError> {
        self.columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
            .ok_or_else(|| {
                CqlError::invalid(format!(
                    "Undefined column name {name} in table {}.{}",
                    self.keyspace, self.name
                ))
            })
    }

    pub fn partition_key(&self) -> impl Iterator<Item = &ColumnMetadata> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::PartitionKey)
    }

    pub fn clustering(&self) -> impl Iterator<Item = &ColumnMetadata> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Clustering)
    }

    pub fn partition_key_count(&self) -> usize {
        self.partition_key().count()
    }

    pub fn clustering_count(&self) -> usize {
        self.clustering().count()
    }

    pub fn has_static_columns(&self) -> bool {
        self.columns.iter().any(|c| c.kind == ColumnKind::Static)
    }

    /// Puts columns in Cassandra's order and numbers key positions.
    pub fn normalize_column_order(&mut self) {
        let rank = |c: &ColumnMetadata| match c.kind {
            ColumnKind::PartitionKey => (0, c.position, String::new()),
            ColumnKind::Clustering => (1, c.position, String::new()),
            ColumnKind::Static | ColumnKind::Regular => (2, 0, c.name.clone()),
        };
        self.columns.sort_by_key(rank);
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyspaceMetadata {
    pub name: String,
    /// `class` plus the strategy's options, as `system_schema.keyspaces.replication` shows.
    pub replication: BTreeMap<String, String>,
    pub durable_writes: bool,
    pub tables: BTreeMap<String, Arc<TableMetadata>>,
    #[serde(default)]
    pub is_system: bool,
}

impl KeyspaceMetadata {
    /// The replication factor in this node's datacenter.
    pub fn replication_factor(&self) -> usize {
        let class = self
            .replication
            .get("class")
            .map(String::as_str)
            .unwrap_or("");
        if class.ends_with("LocalStrategy") {
            return 1;
        }
        if let Some(factor) = self.replication.get("replication_factor") {
            return factor.parse().unwrap_or(1);
        }
        self.replication
            .iter()
            .filter(|(k, _)| k.as_str() != "class")
            .filter_map(|(_, v)| v.parse::<usize>().ok())
            .sum::<usize>()
            .max(1)
    }
}

/// An immutable schema snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schema {
    pub version: [u8; 16],
    pub keyspaces: BTreeMap<String, KeyspaceMetadata>,
}

impl Schema {
    pub fn keyspace(&self, name: &str) -> Result<&KeyspaceMetadata, CqlError> {
        self.keyspaces
            .get(name)
            .ok_or_else(|| CqlError::invalid(format!("Keyspace '{name}' does not exist")))
    }

    pub fn table(&self, keyspace: &str, table: &str) -> Result<&Arc<TableMetadata>, CqlError> {
        let keyspace_metadata = self.keyspace(keyspace)?;
        keyspace_metadata
            .tables
            .get(table)
            .ok_or_else(|| CqlError::invalid(format!("table {table} does not exist")))
    }

    pub fn user_keyspaces(&self) -> impl Iterator<Item = &KeyspaceMetadata> {
        self.keyspaces.values().filter(|k| !k.is_system)
    }
}

const SCHEMA_METADATA_KEY: &[u8] = b"schema";

/// How often a schema change is recomputed when another change won the race.
const SCHEMA_CHANGE_ATTEMPTS: usize = 20;

/// A keyspace's replication as placement understands it.
pub fn replication_strategy(keyspace: &KeyspaceMetadata) -> ReplicationStrategy {
    let class = keyspace
        .replication
        .get("class")
        .map(String::as_str)
        .unwrap_or("");
    if class.ends_with("NetworkTopologyStrategy") {
        let factors = keyspace
            .replication
            .iter()
            .filter(|(k, _)| k.as_str() != "class" && k.as_str() != "replication_factor")
            .filter_map(|(dc, n)| n.parse::<usize>().ok().map(|n| (dc.clone(), n)))
            .collect();
        ReplicationStrategy::NetworkTopology { factors }
    } else {
        ReplicationStrategy::Simple {
            factor: keyspace.replication_factor(),
        }
    }
}

/// What changed between two schemas, as SCHEMA_CHANGE events describe it.
pub fn schema_diff(before: &Schema, after: &Schema) -> Vec<SchemaChange> {
    let change = |change, target, keyspace: &str, name: Option<&str>| SchemaChange {
        change,
        target,
        keyspace: keyspace.to_string(),
        name: name.map(str::to_string),
    };
    let mut changes = Vec::new();
    for (name, keyspace) in after.user_keyspaces().map(|k| (&k.name, k)) {
        match before.keyspaces.get(name) {
            None => changes.push(change("CREATED", "KEYSPACE", name, None)),
            Some(old) => {
                if old.replication != keyspace.replication
                    || old.durable_writes != keyspace.durable_writes
                {
                    changes.push(change("UPDATED", "KEYSPACE", name, None));
                }
                for (table, metadata) in &keyspace.tables {
                    match old.tables.get(table) {
                        None => changes.push(change("CREATED", "TABLE", name, Some(table))),
                        Some(previous) if previous != metadata => {
                            changes.push(change("UPDATED", "TABLE", name, Some(table)))
                        }
                        Some(_) => {}
                    }
                }
                for table in old.tables.keys() {
                    if !keyspace.tables.contains_key(table) {
                        changes.push(change("DROPPED", "TABLE", name, Some(table)));
                    }
                }
            }
        }
    }
    for name in before.user_keyspaces().map(|k| &k.name) {
        if !after.keyspaces.contains_key(name) {
            changes.push(change("DROPPED", "KEYSPACE", name, None));
        }
    }
    changes
}

fn table_ids(schema: &Schema) -> BTreeMap<[u8; 16], ReplicationStrategy> {
    schema
        .user_keyspaces()
        .flat_map(|k| {
            let strategy = replication_strategy(k);
            k.tables.values().map(move |t| (t.id, strategy.clone()))
        })
        .collect()
}

/// Holds the current schema and persists changes: in the engine's metadata on a node
/// without a cluster, through the cluster's replicated metadata otherwise.
pub struct SchemaStore {
    current: RwLock<Arc<Schema>>,
    engine: Arc<dyn Engine>,
    cluster: RwLock<Option<Arc<ClusterMetadata>>>,
    /// Serializes installing schemas (reads never take it).
    install_lock: parking_lot::Mutex<()>,
}

impl SchemaStore {
    /// Loads the persisted user schema (if any) and adds the system keyspaces.
    pub fn open(engine: Arc<dyn Engine>) -> Result<SchemaStore, CqlError> {
        let stored = engine
            .metadata_with_prefix(SCHEMA_METADATA_KEY)
            .map_err(|e| CqlError::server(e.to_string()))?;
        let schema = match stored.into_iter().find(|(k, _)| k == SCHEMA_METADATA_KEY) {
            Some((_, bytes)) => serde_json::from_slice::<Schema>(&bytes)
                .map_err(|e| CqlError::server(format!("stored schema is unreadable: {e}")))?,
            None => Schema {
                version: *uuid::Uuid::new_v4().as_bytes(),
                keyspaces: BTreeMap::new(),
            },
        };
        let store = SchemaStore {
            current: RwLock::new(Arc::new(Schema {
                version: schema.version,
                keyspaces: BTreeMap::new(),
            })),
            engine,
            cluster: RwLock::new(None),
            install_lock: parking_lot::Mutex::new(()),
        };
        store.install(schema);
        Ok(store)
    }

    /// From now on, changes go through the cluster's metadata.
    pub fn attach_cluster(&self, cluster: Arc<ClusterMetadata>) {
        *self.cluster.write() = Some(cluster);
    }

    pub fn current(&self) -> Arc<Schema> {
        Arc::clone(&self.current.read())
    }

    /// Publishes `next` (user keyspaces; system ones are added): registers gc grace
    /// periods, removes the data of tables that no longer exist, and returns what changed.
    fn install(&self, mut next: Schema) -> Vec<SchemaChange> {
        let _serialized = self.install_lock.lock();
        for keyspace in crate::system_tables::system_keyspaces() {
            next.keyspaces.insert(keyspace.name.clone(), keyspace);
        }
        let before = self.current();
        let live_tables = table_ids(&next);
        for id in table_ids(&before).keys() {
            if !live_tables.contains_key(id) {
                if let Err(error) = self
                    .engine
                    .delete_range(&keys::table_prefix(id), &keys::table_end(id))
                {
                    tracing::warn!(%error, "could not remove a dropped table's data");
                }
            }
        }
        for keyspace in next.user_keyspaces() {
            for table in keyspace.tables.values() {
                self.engine
                    .set_gc_grace_seconds(table.id, table.options.gc_grace_seconds);
            }
        }
        let changes = schema_diff(&before, &next);
        *self.current.write() = Arc::new(next);
        changes
    }

    /// Installs the cluster's schema if it differs from the current one; returns what
    /// changed (for SCHEMA_CHANGE events).
    pub fn install_from_cluster(
        &self,
        record: &SchemaRecord,
    ) -> Result<Vec<SchemaChange>, CqlError> {
        if record.version == self.current().version {
            return Ok(Vec::new());
        }
        let schema: Schema = serde_json::from_slice(&record.bytes)
            .map_err(|e| CqlError::server(format!("the cluster's schema is unreadable: {e}")))?;
        Ok(self.install(schema))
    }

    /// Applies `change` to a copy of the schema and publishes it (on a cluster: through
    /// the replicated metadata, recomputing the change if another one got there first).
    /// `change` returns `Ok(false)` when it made no change (IF [NOT] EXISTS).
    pub async fn change(
        &self,
        mut change: impl FnMut(&mut Schema) -> Result<bool, CqlError>,
    ) -> Result<bool, CqlError> {
        let cluster = self.cluster.read().clone();
        for _ in 0..SCHEMA_CHANGE_ATTEMPTS {
            let base = self.current();
            let mut next = (*base).clone();
            if !change(&mut next)? {
                return Ok(false);
            }
            next.version = *uuid::Uuid::new_v4().as_bytes();
            next.keyspaces.retain(|_, k| !k.is_system);
            let bytes = serde_json::to_vec(&next).map_err(|e| CqlError::server(e.to_string()))?;
            let Some(cluster) = &cluster else {
                self.engine
                    .put_metadata(SCHEMA_METADATA_KEY, &bytes)
                    .map_err(|e| CqlError::server(format!("could not persist the schema: {e}")))?;
                self.install(next);
                return Ok(true);
            };
            // The change was computed from `base`; if the cluster's schema is not `base`,
            // this node is behind: catch up and recompute.
            let base_version = cluster.state().schema.as_ref().map(|s| s.version);
            if base_version.is_some_and(|v| v != base.version) {
                self.sync_from(cluster)?;
                continue;
            }
            let command = Command::ChangeSchema {
                base_version,
                schema: SchemaRecord {
                    version: next.version,
                    bytes,
                },
                tables: table_ids(&next),
            };
            match cluster.propose(command).await.map_err(|e| {
                CqlError::server(format!("the schema change did not reach the cluster: {e}"))
            })? {
                CommandOutcome::Applied => {
                    self.sync_from(cluster)?;
                    return Ok(true);
                }
                CommandOutcome::SchemaMoved => {
                    self.sync_from(cluster)?;
                }
                CommandOutcome::Rejected(message) => return Err(CqlError::server(message)),
            }
        }
        Err(CqlError::server(
            "the schema kept changing concurrently; retry the statement",
        ))
    }

    fn sync_from(&self, cluster: &ClusterMetadata) -> Result<(), CqlError> {
        if let Some(record) = &cluster.state().schema {
            self.install_from_cluster(record)?;
        }
        Ok(())
    }
}

/// Validates a keyspace or table name as Cassandra does.
pub fn validate_name(kind: &str, name: &str) -> Result<(), CqlError> {
    ensure(
        !name.is_empty()
            && name.len() <= 48
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        || {
            CqlError::invalid(format!(
            "{kind} name must not be empty, more than 48 characters long, or contain non-alphanumeric-underscore characters (got \"{name}\")"
        ))
        },
    )
}
