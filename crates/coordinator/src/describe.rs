//! Server-side `DESCRIBE`, as Cassandra 4.0+ answers it (cqlsh 6 sends these statements
//! to the server and prints the rows).
//!
//! Listing forms (`DESCRIBE KEYSPACES`, `TABLES`, ...) return `keyspace_name, type, name`;
//! element forms (`DESCRIBE KEYSPACE ks`, `TABLE t`, `SCHEMA`) add `create_statement`.

use crate::{Coordinator, CqlError, Session};
use shoal_cql::ast::{DescribeTarget, QualifiedName};
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::types::{quote_if_needed, UserType};
use shoal_model::{CqlType, Value};
use shoal_schema::{ColumnKind, KeyspaceConsistency, KeyspaceMetadata, TableMetadata};
use std::collections::BTreeMap;
use std::fmt::Write as _;

fn text_map_literal(map: &BTreeMap<String, String>) -> String {
    Value::Map(
        map.iter()
            .map(|(k, v)| (Value::Text(k.clone()), Value::Text(v.clone())))
            .collect(),
    )
    .to_cql_literal()
}

/// `CREATE KEYSPACE ...;` as Cassandra prints it.
pub fn keyspace_statement(keyspace: &KeyspaceMetadata) -> String {
    let mut replication = keyspace.replication.clone();
    if let Some(class) = replication.get_mut("class") {
        if let Some(short) = class.strip_prefix("org.apache.cassandra.locator.") {
            *class = short.to_string();
        }
    }
    let consistency = match keyspace.consistency {
        KeyspaceConsistency::Eventual => String::new(),
        strong => format!("  AND consistency = '{}'", strong.name()),
    };
    format!(
        "CREATE KEYSPACE {} WITH replication = {}  AND durable_writes = {}{consistency};",
        quote_if_needed(&keyspace.name),
        text_map_literal(&replication),
        keyspace.durable_writes
    )
}

/// `CREATE TABLE ...;` as Cassandra prints it.
pub fn table_statement(table: &TableMetadata) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "CREATE TABLE {}.{} (",
        quote_if_needed(&table.keyspace),
        quote_if_needed(&table.name)
    );
    let partition_key: Vec<String> = table
        .partition_key()
        .map(|c| quote_if_needed(&c.name))
        .collect();
    let clustering: Vec<String> = table
        .clustering()
        .map(|c| quote_if_needed(&c.name))
        .collect();
    let inline_key = partition_key.len() == 1 && clustering.is_empty();
    for column in &table.columns {
        let _ = write!(
            out,
            "    {} {}",
            quote_if_needed(&column.name),
            column.cql_type
        );
        if column.kind == ColumnKind::Static {
            out.push_str(" static");
        }
        if inline_key && column.kind == ColumnKind::PartitionKey {
            out.push_str(" PRIMARY KEY");
        }
        out.push_str(",\n");
    }
    if inline_key {
        out.truncate(out.len() - 2);
        out.push('\n');
    } else {
        let partition = if partition_key.len() == 1 {
            partition_key[0].clone()
        } else {
            format!("({})", partition_key.join(", "))
        };
        let mut key = vec![partition];
        key.extend(clustering.iter().cloned());
        let _ = writeln!(out, "    PRIMARY KEY ({})", key.join(", "));
    }
    out.push(')');
    let mut options: Vec<String> = Vec::new();
    if !clustering.is_empty() {
        let order: Vec<String> = table
            .clustering()
            .map(|c| {
                format!(
                    "{} {}",
                    quote_if_needed(&c.name),
                    if c.descending { "DESC" } else { "ASC" }
                )
            })
            .collect();
        options.push(format!("CLUSTERING ORDER BY ({})", order.join(", ")));
    }
    let o = &table.options;
    options.extend([
        format!("additional_write_policy = '{}'", o.additional_write_policy),
        "allow_auto_snapshot = true".to_string(),
        format!("bloom_filter_fp_chance = {}", o.bloom_filter_fp_chance),
        format!("caching = {}", text_map_literal(&o.caching)),
        "cdc = false".to_string(),
        format!(
            "comment = {}",
            Value::Text(o.comment.clone()).to_cql_literal()
        ),
        format!("compaction = {}", text_map_literal(&o.compaction)),
        format!("compression = {}", text_map_literal(&o.compression)),
        "memtable = 'default'".to_string(),
        format!("crc_check_chance = {:?}", o.crc_check_chance),
        format!("default_time_to_live = {}", o.default_time_to_live),
        "extensions = {}".to_string(),
        format!("gc_grace_seconds = {}", o.gc_grace_seconds),
        "incremental_backups = true".to_string(),
        format!("max_index_interval = {}", o.max_index_interval),
        format!(
            "memtable_flush_period_in_ms = {}",
            o.memtable_flush_period_in_ms
        ),
        format!("min_index_interval = {}", o.min_index_interval),
        format!("read_repair = '{}'", o.read_repair),
        format!("speculative_retry = '{}'", o.speculative_retry),
    ]);
    // Shown only when it is not the default, so that a hashed table's DESCRIBE stays what
    // Cassandra prints.
    if o.partitioner != shoal_model::token::Partitioner::Murmur3 {
        options.push(format!("partitioner = '{}'", o.partitioner.name()));
    }
    let _ = write!(out, " WITH {}", options.join("\n    AND "));
    out.push(';');
    out
}

/// `CREATE INDEX ...;` as Cassandra prints it.
pub fn index_statement(table: &TableMetadata, index: &shoal_schema::IndexMetadata) -> String {
    let target = index.target.describe(&quote_if_needed(&index.column));
    let on = format!(
        "{}.{} ({target})",
        quote_if_needed(&table.keyspace),
        quote_if_needed(&table.name)
    );
    if let Some(class) = &index.class {
        let options = if index.options.is_empty() {
            String::new()
        } else {
            let pairs: Vec<String> = index
                .options
                .iter()
                .map(|(k, v)| format!("'{}': '{}'", k.replace('\'', "''"), v.replace('\'', "''")))
                .collect();
            format!(" WITH OPTIONS = {{{}}}", pairs.join(", "))
        };
        format!(
            "CREATE CUSTOM INDEX {} ON {on} USING '{}'{options};",
            quote_if_needed(&index.name),
            class.replace('\'', "''")
        )
    } else {
        format!("CREATE INDEX {} ON {on};", quote_if_needed(&index.name))
    }
}

/// `CREATE TYPE ...;` as Cassandra prints it.
pub fn type_statement(user_type: &UserType) -> String {
    let fields: Vec<String> = user_type
        .fields
        .iter()
        .map(|(field, cql_type)| format!("    {} {cql_type}", quote_if_needed(field)))
        .collect();
    format!(
        "CREATE TYPE {}.{} (\n{}\n);",
        quote_if_needed(&user_type.keyspace),
        quote_if_needed(&user_type.name),
        fields.join(",\n")
    )
}

/// A keyspace's types, each after the types it uses (then by name), as DESCRIBE must
/// print them for the statements to replay.
fn types_in_dependency_order(keyspace: &KeyspaceMetadata) -> Vec<&UserType> {
    let mut ordered: Vec<&UserType> = Vec::new();
    let mut remaining: Vec<&UserType> = keyspace.types.values().collect();
    while !remaining.is_empty() {
        let before = remaining.len();
        remaining.retain(|candidate| {
            let ready = keyspace.types.values().all(|other| {
                other.name == candidate.name
                    || !candidate
                        .field_types()
                        .any(|t| t.mentions_udt(&other.keyspace, &other.name))
                    || ordered.iter().any(|done| done.name == other.name)
            });
            if ready {
                ordered.push(candidate);
            }
            !ready
        });
        if remaining.len() == before {
            // Not possible for types the DDL accepted; print the rest rather than loop.
            ordered.append(&mut remaining);
        }
    }
    ordered
}

struct DescribeRows {
    with_statement: bool,
    rows: Vec<[String; 4]>,
}

impl DescribeRows {
    fn new(with_statement: bool) -> DescribeRows {
        DescribeRows {
            with_statement,
            rows: Vec::new(),
        }
    }

    fn keyspace(&mut self, keyspace: &KeyspaceMetadata) {
        self.rows.push([
            keyspace.name.clone(),
            "keyspace".into(),
            keyspace.name.clone(),
            keyspace_statement(keyspace),
        ]);
    }

    fn table(&mut self, table: &TableMetadata) {
        self.rows.push([
            table.keyspace.clone(),
            "table".into(),
            table.name.clone(),
            table_statement(table),
        ]);
    }

    /// The table and then its indexes, as the element forms print them.
    fn table_with_indexes(&mut self, table: &TableMetadata) {
        self.table(table);
        for index in &table.indexes {
            self.rows.push([
                table.keyspace.clone(),
                "index".into(),
                index.name.clone(),
                index_statement(table, index),
            ]);
        }
    }

    fn user_type(&mut self, user_type: &UserType) {
        self.rows.push([
            user_type.keyspace.clone(),
            "type".into(),
            user_type.name.clone(),
            type_statement(user_type),
        ]);
    }

    fn keyspace_with_tables(&mut self, keyspace: &KeyspaceMetadata, only: bool) {
        self.keyspace(keyspace);
        if !only {
            for user_type in types_in_dependency_order(keyspace) {
                self.user_type(user_type);
            }
            for table in keyspace.tables.values() {
                self.table_with_indexes(table);
            }
        }
    }

    fn into_result(self) -> ResultBody {
        let names: &[&str] = if self.with_statement {
            &["keyspace_name", "type", "name", "create_statement"]
        } else {
            &["keyspace_name", "type", "name"]
        };
        let columns: Vec<ColumnSpec> = names
            .iter()
            .map(|name| ColumnSpec {
                keyspace: String::new(),
                table: String::new(),
                name: name.to_string(),
                cql_type: CqlType::Text,
            })
            .collect();
        let mut buffer = RowsBuffer::new(columns.len());
        for row in &self.rows {
            buffer.push_row(
                row[..columns.len()]
                    .iter()
                    .map(|cell| Some(cell.as_bytes())),
            );
        }
        ResultBody::Rows(Rows {
            columns,
            paging_state: None,
            skip_metadata: false,
            rows: buffer,
        })
    }
}

pub(crate) fn execute(
    coordinator: &Coordinator,
    session: &Session,
    target: &DescribeTarget,
    only: bool,
) -> Result<ResultBody, CqlError> {
    let schema = coordinator.schema();
    let current_keyspace = |named: &Option<String>| coordinator.keyspace_for(session, named);
    let mut rows;
    match target {
        DescribeTarget::Keyspaces => {
            rows = DescribeRows::new(false);
            for keyspace in schema.keyspaces.values() {
                rows.keyspace(keyspace);
            }
        }
        DescribeTarget::Tables => {
            rows = DescribeRows::new(false);
            for keyspace in schema.keyspaces.values() {
                if session
                    .keyspace
                    .as_ref()
                    .is_some_and(|k| *k != keyspace.name)
                {
                    continue;
                }
                for table in keyspace.tables.values() {
                    rows.table(table);
                }
            }
        }
        DescribeTarget::Types => {
            rows = DescribeRows::new(false);
            for keyspace in schema.keyspaces.values() {
                if session
                    .keyspace
                    .as_ref()
                    .is_some_and(|k| *k != keyspace.name)
                {
                    continue;
                }
                for user_type in keyspace.types.values() {
                    rows.user_type(user_type);
                }
            }
        }
        DescribeTarget::Type(name) => {
            let keyspace = current_keyspace(&name.keyspace)?;
            rows = DescribeRows::new(true);
            let user_type = schema
                .keyspace(&keyspace)?
                .types
                .get(&name.name)
                .ok_or_else(|| {
                    CqlError::invalid(format!(
                        "User defined type '{}' not found in '{keyspace}'",
                        name.name
                    ))
                })?;
            rows.user_type(user_type);
        }
        DescribeTarget::Functions | DescribeTarget::Aggregates => {
            rows = DescribeRows::new(false);
        }
        DescribeTarget::Keyspace(name) => {
            let name = current_keyspace(name)?;
            rows = DescribeRows::new(true);
            rows.keyspace_with_tables(schema.keyspace(&name)?, only);
        }
        DescribeTarget::Table(table) => {
            let keyspace = current_keyspace(&table.keyspace)?;
            rows = DescribeRows::new(true);
            let metadata = schema.table(&keyspace, &table.name).map_err(|_| {
                CqlError::invalid(format!(
                    "Table '{}' not found in keyspace '{keyspace}'",
                    table.name
                ))
            })?;
            rows.table_with_indexes(metadata);
        }
        DescribeTarget::Schema { full } => {
            rows = DescribeRows::new(true);
            for keyspace in schema.keyspaces.values().filter(|k| *full || !k.is_system) {
                rows.keyspace_with_tables(keyspace, false);
            }
        }
        DescribeTarget::Name(QualifiedName {
            keyspace: None,
            name,
        }) if schema.keyspaces.contains_key(name) => {
            rows = DescribeRows::new(true);
            rows.keyspace_with_tables(schema.keyspace(name)?, only);
        }
        DescribeTarget::Name(name)
            if current_keyspace(&name.keyspace)
                .ok()
                .and_then(|k| schema.keyspaces.get(&k))
                .is_some_and(|k| {
                    k.types.contains_key(&name.name) && !k.tables.contains_key(&name.name)
                }) =>
        {
            let keyspace = current_keyspace(&name.keyspace)?;
            rows = DescribeRows::new(true);
            rows.user_type(&schema.keyspace(&keyspace)?.types[&name.name]);
        }
        DescribeTarget::Name(table) => {
            let keyspace = current_keyspace(&table.keyspace)?;
            rows = DescribeRows::new(true);
            let metadata = schema.table(&keyspace, &table.name).map_err(|_| {
                CqlError::invalid(format!(
                    "'{}' not found in keyspace '{keyspace}'",
                    table.name
                ))
            })?;
            rows.table_with_indexes(metadata);
        }
        DescribeTarget::Cluster => {
            let columns: Vec<ColumnSpec> = ["cluster", "partitioner", "snitch"]
                .iter()
                .map(|name| ColumnSpec {
                    keyspace: String::new(),
                    table: String::new(),
                    name: name.to_string(),
                    cql_type: CqlType::Text,
                })
                .collect();
            let mut buffer = RowsBuffer::new(3);
            let info = coordinator.info();
            buffer.push_row([
                Some(info.cluster_name.as_bytes()),
                Some(&b"org.apache.cassandra.dht.Murmur3Partitioner"[..]),
                Some(&b"org.apache.cassandra.locator.SimpleSnitch"[..]),
            ]);
            return Ok(ResultBody::Rows(Rows {
                columns,
                paging_state: None,
                skip_metadata: false,
                rows: buffer,
            }));
        }
    }
    Ok(rows.into_result())
}
