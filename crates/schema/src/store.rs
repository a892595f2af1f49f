//! The current schema: an immutable [`Schema`] snapshot behind an `Arc`, and the
//! [`SchemaStore`] that changes it through the cluster's replicated metadata.

use crate::{replication_strategy, KeyspaceMetadata, TableMetadata};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use shoal_cluster::{ClusterMetadata, Command, CommandOutcome, VersionedRecord};
use shoal_cql::response::SchemaChange;
use shoal_cql::{ensure, CqlError};
use shoal_model::{keys, TableId, WriteTimestamp};
use shoal_placement::ReplicationStrategy;
use shoal_storage::Engine;
use std::collections::BTreeMap;
use std::sync::Arc;

/// An immutable schema snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schema {
    pub version: [u8; 16],
    pub keyspaces: BTreeMap<String, KeyspaceMetadata>,
    /// Tables truncated (the latest TRUNCATE of each) or dropped (truncated at the end of
    /// time), so storage keeps what they held dead however late it arrives — a hint, a
    /// slow replica, repair from a node that missed the TRUNCATE
    /// ([`shoal_storage::Engine::set_truncated_at`]).
    #[serde(default)]
    pub truncations: Vec<Truncation>,
}

/// A table's data written at or before `at` (µs since the epoch) is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    pub table: TableId,
    pub at: i64,
}

/// What a dropped table is truncated at: everything it ever held.
pub const DROPPED: i64 = i64::MAX;

impl Schema {
    /// Records that `table` was truncated at `at` (replacing an earlier truncation).
    pub fn record_truncation(&mut self, table: TableId, at: i64) {
        match self.truncations.iter_mut().find(|t| t.table == table) {
            Some(truncation) => truncation.at = truncation.at.max(at),
            None => self.truncations.push(Truncation { table, at }),
        }
    }

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

    /// The keyspace holding the table with id `table`.
    pub fn keyspace_of_table(&self, table: &TableId) -> Option<&KeyspaceMetadata> {
        self.keyspaces
            .values()
            .find(|keyspace| keyspace.tables.values().any(|t| t.id == *table))
    }

    pub fn user_keyspaces(&self) -> impl Iterator<Item = &KeyspaceMetadata> {
        self.keyspaces.values().filter(|k| !k.is_system)
    }
}

const SCHEMA_METADATA_KEY: &[u8] = b"schema";

/// How often a schema change is recomputed when another change won the race.
const SCHEMA_CHANGE_ATTEMPTS: usize = 20;

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
                for (type_name, definition) in &keyspace.types {
                    match old.types.get(type_name) {
                        None => changes.push(change("CREATED", "TYPE", name, Some(type_name))),
                        Some(previous) if previous != definition => {
                            changes.push(change("UPDATED", "TYPE", name, Some(type_name)))
                        }
                        Some(_) => {}
                    }
                }
                for type_name in old.types.keys() {
                    if !keyspace.types.contains_key(type_name) {
                        changes.push(change("DROPPED", "TYPE", name, Some(type_name)));
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

/// The tables the cluster places on tablets: every user table of `schema` and the stored
/// system tables (`system_traces`).
fn placed_tables(schema: &Schema) -> BTreeMap<TableId, ReplicationStrategy> {
    let mut tables = table_ids(schema);
    for (keyspace, table) in crate::system::stored_system_tables() {
        tables.insert(table.id, replication_strategy(&keyspace));
    }
    tables
}

/// The user tables of `schema` with their replication.
fn table_ids(schema: &Schema) -> BTreeMap<TableId, ReplicationStrategy> {
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
    /// Bumped after every installation: a check on the write path that the schema is
    /// still the one it derived something from costs one atomic load.
    installed: std::sync::atomic::AtomicU64,
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
                truncations: Vec::new(),
            },
        };
        let store = SchemaStore {
            current: RwLock::new(Arc::new(Schema {
                version: schema.version,
                keyspaces: BTreeMap::new(),
                truncations: Vec::new(),
            })),
            engine,
            cluster: RwLock::new(None),
            install_lock: parking_lot::Mutex::new(()),
            installed: std::sync::atomic::AtomicU64::new(0),
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

    /// How many schemas were installed so far: read it before [`SchemaStore::current`],
    /// and while it has not changed, nothing derived from that schema is stale.
    pub fn installations(&self) -> u64 {
        self.installed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The current schema's version.
    pub fn version(&self) -> [u8; 16] {
        self.current.read().version
    }

    /// Publishes `next` (user keyspaces; system ones are added): registers gc grace
    /// periods and truncations, removes the data of tables that no longer exist, and
    /// returns what changed.
    fn install(&self, next: Schema) -> Vec<SchemaChange> {
        let _serialized = self.install_lock.lock();
        self.install_serialized(next)
    }

    /// [`Self::install`] for a caller holding `install_lock`.
    fn install_serialized(&self, mut next: Schema) -> Vec<SchemaChange> {
        for keyspace in crate::system::system_keyspaces() {
            next.keyspaces.insert(keyspace.name.clone(), keyspace);
        }
        let before = self.current();
        let live_tables = table_ids(&next);
        let dropped: Vec<TableId> = table_ids(&before)
            .into_keys()
            .filter(|id| !live_tables.contains_key(id))
            .collect();
        if !dropped.is_empty() {
            // The truncation recorded for a dropped table already hides its data and lets
            // compaction drop it; removing it now only frees the space sooner. A synced
            // range deletion has no business on the caller's (often a runtime) thread.
            let engine = Arc::clone(&self.engine);
            std::thread::spawn(move || {
                for id in dropped {
                    if let Err(error) =
                        engine.delete_range(&keys::table_prefix(&id), &keys::table_end(&id))
                    {
                        tracing::warn!(%error, "could not remove a dropped table's data");
                    }
                }
            });
        }
        for keyspace in next.user_keyspaces() {
            for table in keyspace.tables.values() {
                self.engine
                    .set_gc_grace_seconds(table.id, table.options.gc_grace_seconds);
            }
        }
        for truncation in &next.truncations {
            self.engine
                .set_truncated_at(truncation.table, WriteTimestamp(truncation.at));
        }
        let changes = schema_diff(&before, &next);
        *self.current.write() = Arc::new(next);
        self.installed
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        changes
    }

    /// Installs the cluster's schema if it differs from the current one; returns what
    /// changed (for SCHEMA_CHANGE events).
    ///
    /// The cluster's state is read under the install lock: two callers racing (the loop
    /// following the metadata and a statement that just changed the schema) then install
    /// in the order the cluster applied the changes, and the schema never steps back to a
    /// version one of them read before the other installed a newer one.
    pub fn install_from_cluster(
        &self,
        cluster: &ClusterMetadata,
    ) -> Result<Vec<SchemaChange>, CqlError> {
        let _serialized = self.install_lock.lock();
        let Some(record) = cluster.state().schema.clone() else {
            return Ok(Vec::new());
        };
        if record.version == self.current().version {
            return Ok(Vec::new());
        }
        let schema: Schema = serde_json::from_slice(&record.bytes)
            .map_err(|e| CqlError::server(format!("the cluster's schema is unreadable: {e}")))?;
        Ok(self.install_serialized(schema))
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
            // Tables the change dropped (DROP TABLE, DROP KEYSPACE) stay dead everywhere.
            let remaining = table_ids(&next);
            for id in table_ids(&base).into_keys() {
                if !remaining.contains_key(&id) {
                    next.record_truncation(id, DROPPED);
                }
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
                schema: VersionedRecord {
                    version: next.version,
                    bytes,
                },
                tables: placed_tables(&next),
            };
            match cluster.propose(command).await.map_err(|e| {
                CqlError::server(format!("the schema change did not reach the cluster: {e}"))
            })? {
                CommandOutcome::Applied => {
                    self.sync_from(cluster)?;
                    return Ok(true);
                }
                CommandOutcome::Moved => {
                    self.sync_from(cluster)?;
                }
                CommandOutcome::Rejected(message) => return Err(CqlError::server(message)),
            }
        }
        Err(CqlError::server(
            "the schema kept changing concurrently; retry the statement",
        ))
    }

    /// Places the stored system tables (`system_traces`) on a cluster whose metadata does
    /// not have them yet (a new cluster, before its first schema change): one schema
    /// change that changes nothing but carries them. Every later change carries them too.
    pub async fn place_system_tables(&self) -> Result<(), CqlError> {
        let Some(cluster) = self.cluster.read().clone() else {
            return Ok(());
        };
        let placed = |state: &shoal_cluster::ClusterState| {
            crate::system::stored_system_tables()
                .iter()
                .all(|(_, table)| state.tables.contains_key(&table.id))
        };
        if placed(&cluster.state()) {
            return Ok(());
        }
        self.change(|_| Ok(!placed(&cluster.state())))
            .await
            .map(drop)
    }

    fn sync_from(&self, cluster: &ClusterMetadata) -> Result<(), CqlError> {
        self.install_from_cluster(cluster).map(drop)
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
