//! The rows of the virtual system tables drivers and tools read: `system.local`,
//! `system.peers`, `system.peers_v2`, the nine `system_schema` tables and
//! `system_virtual_schema`, and `system_auth` (defined in [`shoal_schema::system`]). They
//! are generated from the schema, the roles, the cluster's metadata and the node's
//! identity on every read; nothing is stored here.

use crate::{Coordinator, CQL_VERSION, RELEASE_VERSION};
use shoal_model::Value;
use shoal_schema::system::{SYSTEM, SYSTEM_AUTH, SYSTEM_SCHEMA, SYSTEM_VIRTUAL_SCHEMA};
use shoal_schema::{ColumnKind, KeyspaceMetadata, Schema, TableMetadata};
use std::collections::BTreeMap;

fn text(value: &str) -> Option<Value> {
    Some(Value::Text(value.to_string()))
}

fn text_map(map: &BTreeMap<String, String>) -> Option<Value> {
    Some(Value::Map(
        map.iter()
            .map(|(k, v)| (Value::Text(k.clone()), Value::Text(v.clone())))
            .collect(),
    ))
}

fn text_set(values: impl IntoIterator<Item = String>) -> Option<Value> {
    let mut elements: Vec<Value> = values.into_iter().map(Value::Text).collect();
    elements.sort_by(|a, b| a.compare(b));
    Some(Value::Set(elements))
}

/// Builds a row in the table's column order from `(column, value)` pairs.
fn row(table: &TableMetadata, values: Vec<(&str, Option<Value>)>) -> Vec<Option<Value>> {
    let mut row = vec![None; table.columns.len()];
    for (name, value) in values {
        if let Some(index) = table.column_index(name) {
            row[index] = value;
        }
    }
    row
}

/// Keyspaces listed in `system_schema` (every keyspace but the virtual one).
fn schema_keyspaces(schema: &Schema) -> impl Iterator<Item = &KeyspaceMetadata> {
    schema
        .keyspaces
        .values()
        .filter(|k| k.name != SYSTEM_VIRTUAL_SCHEMA)
}

fn column_rows(table: &TableMetadata, target: &TableMetadata) -> Vec<Vec<Option<Value>>> {
    target
        .columns
        .iter()
        .map(|column| {
            let clustering_order = match column.kind {
                ColumnKind::Clustering if column.descending => "desc",
                ColumnKind::Clustering => "asc",
                _ => "none",
            };
            row(
                table,
                vec![
                    ("keyspace_name", text(&target.keyspace)),
                    ("table_name", text(&target.name)),
                    ("column_name", text(&column.name)),
                    ("clustering_order", text(clustering_order)),
                    (
                        "column_name_bytes",
                        Some(Value::Blob(column.name.as_bytes().to_vec())),
                    ),
                    ("kind", text(column.kind.schema_name())),
                    ("position", Some(Value::Int(column.position))),
                    ("type", text(&column.cql_type.to_string())),
                ],
            )
        })
        .collect()
}

/// All rows of a virtual table, in its column order.
pub fn rows(
    coordinator: &Coordinator,
    schema: &Schema,
    table: &TableMetadata,
) -> Vec<Vec<Option<Value>>> {
    match (table.keyspace.as_str(), table.name.as_str()) {
        (SYSTEM, "local") => vec![local_row(coordinator, schema, table)],
        (SYSTEM, "peers") | (SYSTEM, "peers_v2") => peer_rows(coordinator, table),
        (SYSTEM_SCHEMA, "keyspaces") => schema_keyspaces(schema)
            .map(|k| {
                row(
                    table,
                    vec![
                        ("keyspace_name", text(&k.name)),
                        ("durable_writes", Some(Value::Boolean(k.durable_writes))),
                        ("replication", text_map(&k.replication)),
                    ],
                )
            })
            .collect(),
        (SYSTEM_SCHEMA, "tables") => table_rows(schema, table),
        (SYSTEM_SCHEMA, "columns") => schema_keyspaces(schema)
            .flat_map(|k| k.tables.values())
            .flat_map(|t| column_rows(table, t))
            .collect(),
        (SYSTEM_SCHEMA, "indexes") => schema_keyspaces(schema)
            .flat_map(|k| k.tables.values())
            .flat_map(|t| {
                t.indexes.iter().map(move |index| {
                    let mut options = index.options.clone();
                    options.insert("target".to_string(), index.target.describe(&index.column));
                    if let Some(class) = &index.class {
                        options.insert("class_name".to_string(), class.clone());
                    }
                    let kind = if index.class.is_some() {
                        "CUSTOM"
                    } else {
                        "COMPOSITES"
                    };
                    row(
                        table,
                        vec![
                            ("keyspace_name", text(&t.keyspace)),
                            ("table_name", text(&t.name)),
                            ("index_name", text(&index.name)),
                            ("kind", text(kind)),
                            ("options", text_map(&options)),
                        ],
                    )
                })
            })
            .collect(),
        (SYSTEM_SCHEMA, "types") => schema_keyspaces(schema)
            .flat_map(|k| k.types.values())
            .map(|user_type| {
                let texts = |values: Vec<String>| {
                    Some(Value::List(values.into_iter().map(Value::Text).collect()))
                };
                row(
                    table,
                    vec![
                        ("keyspace_name", text(&user_type.keyspace)),
                        ("type_name", text(&user_type.name)),
                        (
                            "field_names",
                            texts(user_type.fields.iter().map(|(f, _)| f.clone()).collect()),
                        ),
                        (
                            "field_types",
                            texts(user_type.field_types().map(|t| t.to_string()).collect()),
                        ),
                    ],
                )
            })
            .collect(),
        (SYSTEM_SCHEMA, "dropped_columns") => schema_keyspaces(schema)
            .flat_map(|k| k.tables.values())
            .flat_map(|t| {
                t.dropped_columns.iter().map(|(name, dropped)| {
                    row(
                        table,
                        vec![
                            ("keyspace_name", text(&t.keyspace)),
                            ("table_name", text(&t.name)),
                            ("column_name", text(name)),
                            (
                                "dropped_time",
                                Some(Value::Timestamp(dropped.dropped_at_micros / 1000)),
                            ),
                            ("kind", text("regular")),
                            ("type", text(&dropped.cql_type.to_string())),
                        ],
                    )
                })
            })
            .collect(),
        (SYSTEM_VIRTUAL_SCHEMA, "keyspaces") => schema
            .keyspaces
            .values()
            .filter(|k| k.name == SYSTEM_VIRTUAL_SCHEMA)
            .map(|k| row(table, vec![("keyspace_name", text(&k.name))]))
            .collect(),
        (SYSTEM_VIRTUAL_SCHEMA, "tables") => schema
            .keyspaces
            .values()
            .filter(|k| k.name == SYSTEM_VIRTUAL_SCHEMA)
            .flat_map(|k| k.tables.values())
            .map(|t| {
                row(
                    table,
                    vec![
                        ("keyspace_name", text(&t.keyspace)),
                        ("table_name", text(&t.name)),
                        ("comment", text("")),
                    ],
                )
            })
            .collect(),
        (SYSTEM_VIRTUAL_SCHEMA, "columns") => schema
            .keyspaces
            .values()
            .filter(|k| k.name == SYSTEM_VIRTUAL_SCHEMA)
            .flat_map(|k| k.tables.values())
            .flat_map(|t| column_rows(table, t))
            .collect(),
        (SYSTEM_AUTH, name) => auth_rows(coordinator, table, name),
        _ => Vec::new(),
    }
}

/// `system_auth.roles`, `role_members` and `role_permissions`, from the replicated roles.
fn auth_rows(
    coordinator: &Coordinator,
    table: &TableMetadata,
    name: &str,
) -> Vec<Vec<Option<Value>>> {
    let roles = coordinator.roles().current();
    match name {
        "roles" => roles
            .roles
            .values()
            .map(|role| {
                row(
                    table,
                    vec![
                        ("role", text(&role.name)),
                        ("can_login", Some(Value::Boolean(role.can_login))),
                        ("is_superuser", Some(Value::Boolean(role.is_superuser))),
                        ("member_of", text_set(role.member_of.iter().cloned())),
                        ("salted_hash", role.salted_hash.as_deref().and_then(text)),
                    ],
                )
            })
            .collect(),
        "role_members" => {
            let mut members: Vec<(&String, &String)> = roles
                .roles
                .values()
                .flat_map(|member| {
                    member
                        .member_of
                        .iter()
                        .map(move |role| (role, &member.name))
                })
                .collect();
            members.sort();
            members
                .into_iter()
                .map(|(role, member)| {
                    row(table, vec![("role", text(role)), ("member", text(member))])
                })
                .collect()
        }
        "role_permissions" => roles
            .grants
            .iter()
            .map(|((role, resource), permissions)| {
                row(
                    table,
                    vec![
                        ("role", text(role)),
                        ("resource", text(&resource_path(resource))),
                        (
                            "permissions",
                            text_set(permissions.iter().map(|p| p.name().to_string())),
                        ),
                    ],
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// How Cassandra names a resource in `system_auth.role_permissions`: `data/ks/t`.
fn resource_path(resource: &shoal_auth::Resource) -> String {
    use shoal_auth::Resource;
    match resource {
        Resource::AllKeyspaces => "data".into(),
        Resource::Keyspace(keyspace) => format!("data/{keyspace}"),
        Resource::Table { keyspace, table } => format!("data/{keyspace}/{table}"),
        Resource::AllRoles => "roles".into(),
        Resource::Role(role) => format!("roles/{role}"),
    }
}

/// `system.local`: this node.
fn local_row(
    coordinator: &Coordinator,
    schema: &Schema,
    table: &TableMetadata,
) -> Vec<Option<Value>> {
    let info = coordinator.info();
    let schema_version = Some(Value::Uuid(schema.version));
    row(
        table,
        vec![
            ("key", text("local")),
            ("bootstrapped", text("COMPLETED")),
            ("broadcast_address", Some(Value::Inet(info.address))),
            ("broadcast_port", Some(Value::Int(7000))),
            ("cluster_name", text(&info.cluster_name)),
            ("cql_version", text(CQL_VERSION)),
            ("data_center", text(&info.datacenter)),
            (
                "gossip_generation",
                Some(Value::Int(info.gossip_generation)),
            ),
            ("host_id", Some(Value::Uuid(info.host_id.0))),
            ("listen_address", Some(Value::Inet(info.address))),
            ("listen_port", Some(Value::Int(7000))),
            ("native_protocol_version", text("4")),
            (
                "partitioner",
                text("org.apache.cassandra.dht.Murmur3Partitioner"),
            ),
            ("rack", text(&info.rack)),
            ("release_version", text(RELEASE_VERSION)),
            ("rpc_address", Some(Value::Inet(info.address))),
            ("rpc_port", Some(Value::Int(info.cql_port as i32))),
            ("schema_version", schema_version),
            (
                "tokens",
                text_set(coordinator.local_tokens().iter().map(i64::to_string)),
            ),
        ],
    )
}

/// Whether token-aware drivers are routed by `table`'s tablets: clients' tables are, the
/// stored system tables (tracing) are not.
pub fn routed_table(table: &shoal_model::TableId) -> bool {
    !shoal_schema::system::is_stored_system_table(table)
}

/// `system.peers` and `system.peers_v2`: every other member that owns tokens in the ring
/// drivers route by. A joining node is listed once it is normal, as Cassandra lists it
/// once its bootstrap is over (drivers ignore a row without tokens anyway).
fn peer_rows(coordinator: &Coordinator, table: &TableMetadata) -> Vec<Vec<Option<Value>>> {
    let info = coordinator.info();
    let Some(cluster) = coordinator.cluster() else {
        return Vec::new();
    };
    let state = cluster.metadata.state();
    let mut ring = state.ring_tokens(routed_table);
    state
        .members
        .values()
        .filter(|m| m.host_id != info.host_id && m.state != shoal_cluster::MemberState::Joining)
        .map(|member| (member, ring.remove(&member.host_id).unwrap_or_default()))
        .filter(|(_, tokens)| !tokens.is_empty())
        .map(|(member, tokens)| {
            let address = Some(Value::Inet(member.cql_address.ip()));
            let version = cluster
                .liveness
                .schema_version(&member.host_id)
                .map(Value::Uuid);
            let tokens = text_set(tokens.iter().map(|t| t.0.to_string()));
            row(
                table,
                vec![
                    ("peer", Some(Value::Inet(member.internode_address.ip()))),
                    (
                        "peer_port",
                        Some(Value::Int(member.internode_address.port() as i32)),
                    ),
                    ("data_center", text(&member.datacenter)),
                    ("host_id", Some(Value::Uuid(member.host_id.0))),
                    ("rack", text(&member.rack)),
                    ("release_version", text(RELEASE_VERSION)),
                    ("rpc_address", address.clone()),
                    ("native_address", address),
                    (
                        "native_port",
                        Some(Value::Int(member.cql_address.port() as i32)),
                    ),
                    ("schema_version", version),
                    ("tokens", tokens),
                ],
            )
        })
        .collect()
}

/// `system_schema.tables`: every table with its options.
fn table_rows(schema: &Schema, table: &TableMetadata) -> Vec<Vec<Option<Value>>> {
    schema_keyspaces(schema)
        .flat_map(|k| k.tables.values())
        .map(|t| {
            let o = &t.options;
            row(
                table,
                vec![
                    ("keyspace_name", text(&t.keyspace)),
                    ("table_name", text(&t.name)),
                    ("additional_write_policy", text(&o.additional_write_policy)),
                    ("allow_auto_snapshot", Some(Value::Boolean(true))),
                    (
                        "bloom_filter_fp_chance",
                        Some(Value::Double(o.bloom_filter_fp_chance)),
                    ),
                    ("caching", text_map(&o.caching)),
                    ("cdc", Some(Value::Boolean(false))),
                    ("comment", text(&o.comment)),
                    ("compaction", text_map(&o.compaction)),
                    ("compression", text_map(&o.compression)),
                    ("crc_check_chance", Some(Value::Double(o.crc_check_chance))),
                    (
                        "default_time_to_live",
                        Some(Value::Int(o.default_time_to_live)),
                    ),
                    ("extensions", Some(Value::Map(Vec::new()))),
                    ("flags", text_set(["compound".to_string()])),
                    ("gc_grace_seconds", Some(Value::Int(o.gc_grace_seconds))),
                    ("id", Some(Value::Uuid(t.id.0))),
                    ("incremental_backups", Some(Value::Boolean(true))),
                    ("max_index_interval", Some(Value::Int(o.max_index_interval))),
                    ("memtable", text("default")),
                    (
                        "memtable_flush_period_in_ms",
                        Some(Value::Int(o.memtable_flush_period_in_ms)),
                    ),
                    ("min_index_interval", Some(Value::Int(o.min_index_interval))),
                    ("read_repair", text(&o.read_repair)),
                    ("speculative_retry", text(&o.speculative_retry)),
                ],
            )
        })
        .collect()
}
