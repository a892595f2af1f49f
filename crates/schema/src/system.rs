//! The system keyspaces and their tables (`system`, `system_schema`,
//! `system_virtual_schema`, `system_auth`, `system_traces`), with Cassandra 5.0's column
//! names and types. Most are *virtual*: defined here, their rows generated on every read
//! by the coordinator, never stored. `system_traces` is stored and replicated like a user
//! keyspace (SimpleStrategy, RF 2, as Cassandra): query traces are written there, with a
//! TTL, and read back by drivers from any node ([`stored_system_tables`]).

use crate::{ColumnKind, ColumnMetadata, KeyspaceMetadata, TableMetadata, TableOptions};
use shoal_model::{CqlType, TableId};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const SYSTEM: &str = "system";
pub const SYSTEM_SCHEMA: &str = "system_schema";
pub const SYSTEM_VIRTUAL_SCHEMA: &str = "system_virtual_schema";
/// Roles and permissions, generated from the replicated roles (`shoal-auth`).
pub const SYSTEM_AUTH: &str = "system_auth";
/// Query traces (`TRACING ON`, `settraceprobability`): stored, replicated tables.
pub const SYSTEM_TRACES: &str = "system_traces";
/// The datacenter a node is in unless its configuration says otherwise.
pub const DEFAULT_DATACENTER: &str = "datacenter1";

type ColumnList<'a> = &'a [(&'a str, &'a str)];

fn virtual_table(
    keyspace: &str,
    name: &str,
    partition_key: ColumnList<'_>,
    clustering: ColumnList<'_>,
    regular: ColumnList<'_>,
) -> Arc<TableMetadata> {
    system_table(keyspace, name, partition_key, clustering, regular, true)
}

fn system_table(
    keyspace: &str,
    name: &str,
    partition_key: ColumnList<'_>,
    clustering: ColumnList<'_>,
    regular: ColumnList<'_>,
    is_virtual: bool,
) -> Arc<TableMetadata> {
    let mut columns = Vec::new();
    let mut add = |list: ColumnList<'_>, kind: ColumnKind| {
        for (position, (column, type_text)) in list.iter().enumerate() {
            columns.push(ColumnMetadata {
                name: column.to_string(),
                cql_type: CqlType::parse(type_text).unwrap_or(CqlType::Text),
                kind,
                position: if kind == ColumnKind::Regular {
                    -1
                } else {
                    position as i32
                },
                descending: false,
            });
        }
    };
    add(partition_key, ColumnKind::PartitionKey);
    add(clustering, ColumnKind::Clustering);
    add(regular, ColumnKind::Regular);
    let mut table = TableMetadata {
        indexes: Vec::new(),
        keyspace: keyspace.to_string(),
        name: name.to_string(),
        id: TableId(
            *uuid::Uuid::new_v5(
                &uuid::Uuid::NAMESPACE_OID,
                format!("{keyspace}.{name}").as_bytes(),
            )
            .as_bytes(),
        ),
        columns,
        options: TableOptions::default(),
        dropped_columns: BTreeMap::new(),
        is_virtual,
    };
    table.normalize_column_order();
    Arc::new(table)
}

fn keyspace(
    name: &str,
    replication_class: &str,
    tables: Vec<Arc<TableMetadata>>,
) -> KeyspaceMetadata {
    KeyspaceMetadata {
        types: BTreeMap::new(),
        name: name.to_string(),
        replication: BTreeMap::from([("class".to_string(), replication_class.to_string())]),
        durable_writes: true,
        tables: tables.into_iter().map(|t| (t.name.clone(), t)).collect(),
        is_system: true,
        consistency: crate::KeyspaceConsistency::Eventual,
    }
}

/// `system_traces`: a trace's session (one row per traced request) and its events.
fn traces_keyspace() -> KeyspaceMetadata {
    let sessions = system_table(
        SYSTEM_TRACES,
        "sessions",
        &[("session_id", "uuid")],
        &[],
        &[
            ("client", "inet"),
            ("command", "text"),
            ("coordinator", "inet"),
            ("coordinator_port", "int"),
            ("duration", "int"),
            ("parameters", "map<text, text>"),
            ("request", "text"),
            ("started_at", "timestamp"),
        ],
        false,
    );
    let events = system_table(
        SYSTEM_TRACES,
        "events",
        &[("session_id", "uuid")],
        &[("event_id", "timeuuid")],
        &[
            ("activity", "text"),
            ("source", "inet"),
            ("source_elapsed", "int"),
            ("source_port", "int"),
            ("thread", "text"),
        ],
        false,
    );
    KeyspaceMetadata {
        types: BTreeMap::new(),
        name: SYSTEM_TRACES.to_string(),
        replication: BTreeMap::from([
            (
                "class".to_string(),
                "org.apache.cassandra.locator.SimpleStrategy".to_string(),
            ),
            ("replication_factor".to_string(), "2".to_string()),
        ]),
        durable_writes: true,
        tables: [sessions, events]
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect(),
        is_system: true,
        consistency: crate::KeyspaceConsistency::Eventual,
    }
}

/// The system tables that are stored and replicated (placed on tablets like user tables),
/// with their keyspace.
pub fn stored_system_tables() -> Vec<(KeyspaceMetadata, Arc<TableMetadata>)> {
    let traces = traces_keyspace();
    traces
        .tables
        .values()
        .map(|table| (traces.clone(), Arc::clone(table)))
        .collect()
}

/// True for the id of a table [`stored_system_tables`] lists: placed on tablets, but not
/// what clients' requests are routed by.
pub fn is_stored_system_table(id: &shoal_model::TableId) -> bool {
    static IDS: std::sync::OnceLock<Vec<shoal_model::TableId>> = std::sync::OnceLock::new();
    IDS.get_or_init(|| {
        stored_system_tables()
            .iter()
            .map(|(_, table)| table.id)
            .collect()
    })
    .contains(id)
}

const TABLE_OPTION_COLUMNS: ColumnList<'static> = &[
    ("additional_write_policy", "text"),
    ("allow_auto_snapshot", "boolean"),
    ("bloom_filter_fp_chance", "double"),
    ("caching", "frozen<map<text, text>>"),
    ("cdc", "boolean"),
    ("comment", "text"),
    ("compaction", "frozen<map<text, text>>"),
    ("compression", "frozen<map<text, text>>"),
    ("crc_check_chance", "double"),
    ("default_time_to_live", "int"),
    ("extensions", "frozen<map<text, blob>>"),
    ("flags", "frozen<set<text>>"),
    ("gc_grace_seconds", "int"),
    ("id", "uuid"),
    ("incremental_backups", "boolean"),
    ("max_index_interval", "int"),
    ("memtable", "text"),
    ("memtable_flush_period_in_ms", "int"),
    ("min_index_interval", "int"),
    ("read_repair", "text"),
    ("speculative_retry", "text"),
];

/// The system keyspaces and their virtual tables.
pub fn system_keyspaces() -> Vec<KeyspaceMetadata> {
    vec![
        system_keyspace(),
        system_schema_keyspace(),
        system_virtual_schema_keyspace(),
        system_auth_keyspace(),
        traces_keyspace(),
    ]
}

/// The columns of `system_schema.columns` (and of the virtual schema's) after the names.
const COLUMN_COLUMNS: ColumnList<'static> = &[
    ("clustering_order", "text"),
    ("column_name_bytes", "blob"),
    ("kind", "text"),
    ("position", "int"),
    ("type", "text"),
];

/// The columns of `system_schema.views`: a table's options but the ones views do not
/// have, and what the view selects from its base table.
fn view_columns() -> Vec<(&'static str, &'static str)> {
    let mut view_columns: Vec<(&str, &str)> = TABLE_OPTION_COLUMNS
        .iter()
        .copied()
        .filter(|(name, _)| {
            !matches!(
                *name,
                "flags" | "allow_auto_snapshot" | "incremental_backups" | "memtable"
            )
        })
        .collect();
    view_columns.extend([
        ("base_table_id", "uuid"),
        ("base_table_name", "text"),
        ("include_all_columns", "boolean"),
        ("where_clause", "text"),
    ]);
    view_columns
}

/// The `system` keyspace: this node (`local`) and its peers, as drivers read them.
fn system_keyspace() -> KeyspaceMetadata {
    keyspace(
        SYSTEM,
        "org.apache.cassandra.locator.LocalStrategy",
        vec![
            virtual_table(
                SYSTEM,
                "local",
                &[("key", "text")],
                &[],
                &[
                    ("bootstrapped", "text"),
                    ("broadcast_address", "inet"),
                    ("broadcast_port", "int"),
                    ("cluster_name", "text"),
                    ("cql_version", "text"),
                    ("data_center", "text"),
                    ("gossip_generation", "int"),
                    ("host_id", "uuid"),
                    ("listen_address", "inet"),
                    ("listen_port", "int"),
                    ("native_protocol_version", "text"),
                    ("partitioner", "text"),
                    ("rack", "text"),
                    ("release_version", "text"),
                    ("rpc_address", "inet"),
                    ("rpc_port", "int"),
                    ("schema_version", "uuid"),
                    ("tokens", "set<text>"),
                    ("truncated_at", "map<uuid, blob>"),
                ],
            ),
            virtual_table(
                SYSTEM,
                "peers",
                &[("peer", "inet")],
                &[],
                &[
                    ("data_center", "text"),
                    ("host_id", "uuid"),
                    ("preferred_ip", "inet"),
                    ("rack", "text"),
                    ("release_version", "text"),
                    ("rpc_address", "inet"),
                    ("schema_version", "uuid"),
                    ("tokens", "set<text>"),
                ],
            ),
            virtual_table(
                SYSTEM,
                "peers_v2",
                &[("peer", "inet")],
                &[("peer_port", "int")],
                &[
                    ("data_center", "text"),
                    ("host_id", "uuid"),
                    ("native_address", "inet"),
                    ("native_port", "int"),
                    ("preferred_ip", "inet"),
                    ("preferred_port", "int"),
                    ("rack", "text"),
                    ("release_version", "text"),
                    ("schema_version", "uuid"),
                    ("tokens", "set<text>"),
                ],
            ),
        ],
    )
}

/// `system_schema`: the keyspaces, tables, columns, types, indexes and views of the schema.
fn system_schema_keyspace() -> KeyspaceMetadata {
    keyspace(
        SYSTEM_SCHEMA,
        "org.apache.cassandra.locator.LocalStrategy",
        vec![
            virtual_table(
                SYSTEM_SCHEMA,
                "keyspaces",
                &[("keyspace_name", "text")],
                &[],
                &[
                    ("durable_writes", "boolean"),
                    ("replication", "frozen<map<text, text>>"),
                ],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "tables",
                &[("keyspace_name", "text")],
                &[("table_name", "text")],
                TABLE_OPTION_COLUMNS,
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "columns",
                &[("keyspace_name", "text")],
                &[("table_name", "text"), ("column_name", "text")],
                COLUMN_COLUMNS,
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "dropped_columns",
                &[("keyspace_name", "text")],
                &[("table_name", "text"), ("column_name", "text")],
                &[
                    ("dropped_time", "timestamp"),
                    ("kind", "text"),
                    ("type", "text"),
                ],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "triggers",
                &[("keyspace_name", "text")],
                &[("table_name", "text"), ("trigger_name", "text")],
                &[("options", "frozen<map<text, text>>")],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "views",
                &[("keyspace_name", "text")],
                &[("view_name", "text")],
                &view_columns(),
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "types",
                &[("keyspace_name", "text")],
                &[("type_name", "text")],
                &[
                    ("field_names", "frozen<list<text>>"),
                    ("field_types", "frozen<list<text>>"),
                ],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "functions",
                &[("keyspace_name", "text")],
                &[
                    ("function_name", "text"),
                    ("argument_types", "frozen<list<text>>"),
                ],
                &[
                    ("argument_names", "frozen<list<text>>"),
                    ("body", "text"),
                    ("called_on_null_input", "boolean"),
                    ("language", "text"),
                    ("return_type", "text"),
                ],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "aggregates",
                &[("keyspace_name", "text")],
                &[
                    ("aggregate_name", "text"),
                    ("argument_types", "frozen<list<text>>"),
                ],
                &[
                    ("final_func", "text"),
                    ("initcond", "text"),
                    ("return_type", "text"),
                    ("state_func", "text"),
                    ("state_type", "text"),
                ],
            ),
            virtual_table(
                SYSTEM_SCHEMA,
                "indexes",
                &[("keyspace_name", "text")],
                &[("table_name", "text"), ("index_name", "text")],
                &[("kind", "text"), ("options", "frozen<map<text, text>>")],
            ),
        ],
    )
}

/// `system_virtual_schema`: the virtual keyspaces, tables and columns.
fn system_virtual_schema_keyspace() -> KeyspaceMetadata {
    keyspace(
        SYSTEM_VIRTUAL_SCHEMA,
        "org.apache.cassandra.locator.LocalStrategy",
        vec![
            virtual_table(
                SYSTEM_VIRTUAL_SCHEMA,
                "keyspaces",
                &[("keyspace_name", "text")],
                &[],
                &[],
            ),
            virtual_table(
                SYSTEM_VIRTUAL_SCHEMA,
                "tables",
                &[("keyspace_name", "text")],
                &[("table_name", "text")],
                &[("comment", "text")],
            ),
            virtual_table(
                SYSTEM_VIRTUAL_SCHEMA,
                "columns",
                &[("keyspace_name", "text")],
                &[("table_name", "text"), ("column_name", "text")],
                COLUMN_COLUMNS,
            ),
        ],
    )
}

/// `system_auth`: roles, their members and permissions.
fn system_auth_keyspace() -> KeyspaceMetadata {
    keyspace(
        SYSTEM_AUTH,
        "org.apache.cassandra.locator.LocalStrategy",
        vec![
            virtual_table(
                SYSTEM_AUTH,
                "roles",
                &[("role", "text")],
                &[],
                &[
                    ("can_login", "boolean"),
                    ("is_superuser", "boolean"),
                    ("member_of", "set<text>"),
                    ("salted_hash", "text"),
                ],
            ),
            virtual_table(
                SYSTEM_AUTH,
                "role_members",
                &[("role", "text")],
                &[("member", "text")],
                &[],
            ),
            virtual_table(
                SYSTEM_AUTH,
                "role_permissions",
                &[("role", "text")],
                &[("resource", "text")],
                &[("permissions", "set<text>")],
            ),
        ],
    )
}
