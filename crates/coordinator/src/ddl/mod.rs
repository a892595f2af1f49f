//! Schema statements: CREATE/ALTER/DROP KEYSPACE and TABLE, and TRUNCATE.

use crate::{ensure, Coordinator, CqlError, ErrorCode, Session};
use shoal_cql::ast::{
    AlterTableAction, ColumnDefinition, CreateTable, Literal, Properties, Statement, Term,
};
use shoal_cql::response::{ResultBody, SchemaChange};
use shoal_model::token::Partitioner;
use shoal_model::CqlType;
use shoal_schema::{
    validate_name, ColumnKind, ColumnMetadata, KeyspaceConsistency, KeyspaceMetadata, Schema,
    TableMetadata, TableOptions,
};
use std::collections::BTreeMap;
use std::sync::Arc;

mod indexes;
mod user_types;

pub(crate) fn schema_change(
    change: &'static str,
    target: &'static str,
    keyspace: &str,
    name: Option<&str>,
) -> ResultBody {
    ResultBody::SchemaChange(SchemaChange {
        change,
        target,
        keyspace: keyspace.to_string(),
        name: name.map(str::to_string),
    })
}

pub(crate) async fn execute(
    coordinator: &Coordinator,
    session: &Session,
    statement: &Statement,
) -> Result<ResultBody, CqlError> {
    match statement {
        Statement::CreateKeyspace {
            name,
            if_not_exists,
            properties,
        } => create_keyspace(coordinator, name, *if_not_exists, properties).await,
        Statement::AlterKeyspace { name, properties } => {
            alter_keyspace(coordinator, name, properties).await
        }
        Statement::DropKeyspace { name, if_exists } => {
            drop_keyspace(coordinator, name, *if_exists).await
        }
        Statement::CreateTable(create) => create_table(coordinator, session, create).await,
        Statement::AlterTable { table, action } => {
            let keyspace = coordinator.keyspace_for(session, &table.keyspace)?;
            alter_table_statement(coordinator, &keyspace, table, action).await
        }
        Statement::DropTable { table, if_exists } => {
            let keyspace = coordinator.keyspace_for(session, &table.keyspace)?;
            drop_table(coordinator, &keyspace, table, *if_exists).await
        }
        Statement::Truncate(table) => {
            let keyspace = coordinator.keyspace_for(session, &table.keyspace)?;
            truncate(coordinator, &keyspace, table).await
        }
        Statement::CreateType {
            name,
            if_not_exists,
            fields,
        } => {
            let keyspace = coordinator.keyspace_for(session, &name.keyspace)?;
            user_types::create(coordinator, &keyspace, &name.name, *if_not_exists, fields).await
        }
        Statement::AlterType {
            name,
            if_exists,
            action,
        } => {
            let keyspace = coordinator.keyspace_for(session, &name.keyspace)?;
            user_types::alter(coordinator, &keyspace, &name.name, *if_exists, action).await
        }
        Statement::CreateIndex(create) => {
            let keyspace = coordinator.keyspace_for(session, &create.table.keyspace)?;
            indexes::create(coordinator, &keyspace, create).await
        }
        Statement::DropIndex { name, if_exists } => {
            let keyspace = coordinator.keyspace_for(session, &name.keyspace)?;
            indexes::drop(coordinator, &keyspace, &name.name, *if_exists).await
        }
        Statement::DropType { name, if_exists } => {
            let keyspace = coordinator.keyspace_for(session, &name.keyspace)?;
            user_types::drop(coordinator, &keyspace, &name.name, *if_exists).await
        }
        _ => Err(CqlError::server("not a schema statement")),
    }
}

async fn create_keyspace(
    coordinator: &Coordinator,
    name: &String,
    if_not_exists: bool,
    properties: &Properties,
) -> Result<ResultBody, CqlError> {
    validate_name("Keyspace", name)?;
    let (replication, durable_writes, consistency) = keyspace_properties(properties, None)?;
    let created = coordinator
        .schema
        .change(|schema| {
            if schema.keyspaces.contains_key(name) {
                if if_not_exists {
                    return Ok(false);
                }
                return Err(CqlError::new(
                    ErrorCode::AlreadyExists {
                        keyspace: name.clone(),
                        table: String::new(),
                    },
                    format!("Keyspace '{name}' already exists"),
                ));
            }
            schema.keyspaces.insert(
                name.clone(),
                KeyspaceMetadata {
                    types: BTreeMap::new(),
                    name: name.clone(),
                    replication: replication.clone(),
                    durable_writes,
                    tables: BTreeMap::new(),
                    is_system: false,
                    consistency,
                },
            );
            Ok(true)
        })
        .await?;
    Ok(if created {
        schema_change("CREATED", "KEYSPACE", name, None)
    } else {
        ResultBody::Void
    })
}

async fn alter_keyspace(
    coordinator: &Coordinator,
    name: &str,
    properties: &Properties,
) -> Result<ResultBody, CqlError> {
    coordinator
        .schema
        .change(|schema| {
            let keyspace = user_keyspace_mut(schema, name)?;
            let (replication, durable_writes, consistency) =
                keyspace_properties(properties, Some(keyspace))?;
            if consistency != keyspace.consistency {
                return Err(CqlError::config(format!(
                    "A keyspace's consistency cannot be changed (it is '{}'): create a new keyspace and copy the data",
                    keyspace.consistency.name()
                )));
            }
            keyspace.replication = replication;
            keyspace.durable_writes = durable_writes;
            Ok(true)
        })
        .await?;
    Ok(schema_change("UPDATED", "KEYSPACE", name, None))
}

async fn drop_keyspace(
    coordinator: &Coordinator,
    name: &str,
    if_exists: bool,
) -> Result<ResultBody, CqlError> {
    let dropped = coordinator
        .schema
        .change(|schema| {
            match schema.keyspaces.get(name) {
                None if if_exists => return Ok(false),
                None => {
                    return Err(CqlError::config(format!(
                        "Cannot drop non existing keyspace '{name}'."
                    )))
                }
                Some(k) if k.is_system => {
                    return Err(CqlError::new(
                        ErrorCode::Unauthorized,
                        format!("{name} keyspace is not user-modifiable"),
                    ))
                }
                Some(_) => {}
            }
            schema.keyspaces.remove(name);
            Ok(true)
        })
        .await?;
    Ok(if dropped {
        schema_change("DROPPED", "KEYSPACE", name, None)
    } else {
        ResultBody::Void
    })
}

async fn alter_table_statement(
    coordinator: &Coordinator,
    keyspace: &str,
    table: &shoal_cql::ast::QualifiedName,
    action: &AlterTableAction,
) -> Result<ResultBody, CqlError> {
    coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            let action = match action {
                AlterTableAction::Add(definitions) => {
                    let mut resolved = definitions.clone();
                    for definition in &mut resolved {
                        definition.cql_type =
                            user_types::resolve(keyspace_metadata, &definition.cql_type)?;
                    }
                    &AlterTableAction::Add(resolved)
                }
                other => other,
            };
            let current = keyspace_metadata.tables.get(&table.name).ok_or_else(|| {
                CqlError::invalid(format!("Table '{keyspace}.{}' doesn't exist", table.name))
            })?;
            if let AlterTableAction::Add(definitions) = action {
                for definition in definitions {
                    let adds_counter = definition.cql_type == CqlType::Counter;
                    ensure(adds_counter || !current.is_counter(), || {
                        CqlError::config(format!(
                            "{keyspace}.{}: Cannot have a non counter column (\"{}\") in a counter table",
                            table.name, definition.name
                        ))
                    })?;
                    ensure(!adds_counter || current.is_counter(), || {
                        CqlError::config(format!(
                            "{keyspace}.{}: Cannot have a counter column (\"{}\") in a non counter table",
                            table.name, definition.name
                        ))
                    })?;
                }
            }
            let altered = alter_table(current, action)?;
            check_counter_table(&altered)?;
            keyspace_metadata
                .tables
                .insert(table.name.clone(), Arc::new(altered));
            Ok(true)
        })
        .await?;
    Ok(schema_change(
        "UPDATED",
        "TABLE",
        keyspace,
        Some(&table.name),
    ))
}

async fn drop_table(
    coordinator: &Coordinator,
    keyspace: &str,
    table: &shoal_cql::ast::QualifiedName,
    if_exists: bool,
) -> Result<ResultBody, CqlError> {
    let dropped = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = match schema.keyspaces.get_mut(keyspace) {
                Some(k) if k.is_system => {
                    return Err(CqlError::new(
                        ErrorCode::Unauthorized,
                        format!("{keyspace} keyspace is not user-modifiable"),
                    ))
                }
                Some(k) => k,
                None if if_exists => return Ok(false),
                None => {
                    return Err(CqlError::invalid(format!(
                        "Keyspace '{keyspace}' doesn't exist"
                    )))
                }
            };
            match keyspace_metadata.tables.remove(&table.name) {
                Some(_) => Ok(true),
                None if if_exists => Ok(false),
                None => Err(CqlError::invalid(format!(
                    "Table '{keyspace}.{}' doesn't exist",
                    table.name
                ))),
            }
        })
        .await?;
    Ok(if dropped {
        schema_change("DROPPED", "TABLE", keyspace, Some(&table.name))
    } else {
        ResultBody::Void
    })
}

async fn truncate(
    coordinator: &Coordinator,
    keyspace: &str,
    table: &shoal_cql::ast::QualifiedName,
) -> Result<ResultBody, CqlError> {
    let schema = coordinator.schema();
    let metadata = schema.table(keyspace, &table.name)?;
    ensure(!metadata.is_virtual, || {
        CqlError::invalid(format!(
            "Cannot truncate the system table {keyspace}.{}",
            table.name
        ))
    })?;
    // Recorded first, through the cluster's metadata: from then on every node's storage
    // hides what was written before, whatever arrives late or a node failed to delete.
    let table_id = metadata.id;
    let truncated_at = shoal_model::timestamp::now_micros();
    coordinator
        .schema
        .change(|schema| {
            schema.record_truncation(table_id, truncated_at);
            Ok(true)
        })
        .await?;
    coordinator.replication.truncate(table_id).await?;
    Ok(ResultBody::Void)
}

pub(crate) fn user_keyspace_mut<'a>(
    schema: &'a mut Schema,
    name: &str,
) -> Result<&'a mut KeyspaceMetadata, CqlError> {
    match schema.keyspaces.get_mut(name) {
        Some(k) if k.is_system => Err(CqlError::new(
            ErrorCode::Unauthorized,
            format!("{name} keyspace is not user-modifiable"),
        )),
        Some(k) => Ok(k),
        None => Err(CqlError::invalid(format!(
            "Keyspace '{name}' does not exist"
        ))),
    }
}

/// A property value as text (strings, numbers, booleans).
fn property_text(term: &Term, property: &str) -> Result<String, CqlError> {
    match term {
        Term::Literal(Literal::String(s))
        | Term::Literal(Literal::Integer(s))
        | Term::Literal(Literal::Float(s)) => Ok(s.clone()),
        Term::Literal(Literal::Boolean(b)) => Ok(b.to_string()),
        Term::Negative(inner) => Ok(format!("-{}", property_text(inner, property)?)),
        _ => Err(CqlError::syntax(format!(
            "Invalid value for property '{property}'"
        ))),
    }
}

fn property_map(term: &Term, property: &str) -> Result<BTreeMap<String, String>, CqlError> {
    match term {
        Term::Map(entries) => entries
            .iter()
            .map(|(k, v)| Ok((property_text(k, property)?, property_text(v, property)?)))
            .collect(),
        _ => Err(CqlError::syntax(format!(
            "Invalid value for property '{property}': expected a map"
        ))),
    }
}

/// A keyspace's replication, `durable_writes` and `consistency`, from its properties (and,
/// for ALTER, what it had).
fn keyspace_properties(
    properties: &Properties,
    current: Option<&KeyspaceMetadata>,
) -> Result<(BTreeMap<String, String>, bool, KeyspaceConsistency), CqlError> {
    let mut replication = current.map(|k| k.replication.clone());
    let mut durable_writes = current.is_none_or(|k| k.durable_writes);
    let mut consistency = current.map_or(KeyspaceConsistency::Eventual, |k| k.consistency);
    for (name, value) in properties {
        match name.as_str() {
            "replication" => replication = Some(validate_replication(property_map(value, name)?)?),
            "durable_writes" => {
                durable_writes = property_text(value, name)?
                    .parse()
                    .map_err(|_| CqlError::syntax("Invalid boolean value for durable_writes"))?;
            }
            "consistency" => {
                let text = property_text(value, name)?;
                consistency = KeyspaceConsistency::parse(&text).ok_or_else(|| {
                    CqlError::config(format!(
                        "Invalid consistency '{text}': expected 'eventual' (each request's consistency level) or 'strong' (every request through its tablet's Raft group)"
                    ))
                })?;
            }
            other => return Err(CqlError::syntax(format!("Unknown property '{other}'"))),
        }
    }
    let replication =
        replication.ok_or_else(|| CqlError::config("Missing mandatory option 'replication'"))?;
    Ok((replication, durable_writes, consistency))
}

fn validate_replication(
    mut options: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, CqlError> {
    let class = options
        .remove("class")
        .ok_or_else(|| CqlError::config("Missing replication strategy class"))?;
    let short = class.rsplit('.').next().unwrap_or(&class).to_string();
    let full_class = format!("org.apache.cassandra.locator.{short}");
    let check_factor = |key: &str, value: &str| -> Result<(), CqlError> {
        match value.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(()),
            _ => Err(CqlError::config(format!(
                "Replication factor must be non-negative integer; found {value} for {key}"
            ))),
        }
    };
    match short.as_str() {
        "SimpleStrategy" => {
            let factor = options.get("replication_factor").ok_or_else(|| {
                CqlError::config("SimpleStrategy requires a replication_factor strategy option.")
            })?;
            check_factor("replication_factor", factor)?;
            if let Some(other) = options.keys().find(|k| k.as_str() != "replication_factor") {
                return Err(CqlError::config(format!("Unrecognized strategy option {{{other}}} passed to SimpleStrategy for keyspace")));
            }
        }
        "NetworkTopologyStrategy" => {
            if let Some(factor) = options.remove("replication_factor") {
                check_factor("replication_factor", &factor)?;
                options.insert(shoal_schema::system::DEFAULT_DATACENTER.to_string(), factor);
            }
            for (datacenter, factor) in &options {
                check_factor(datacenter, factor)?;
            }
        }
        "LocalStrategy" | "EverywhereStrategy" => {
            return Err(CqlError::config(format!(
                "Unable to use given strategy class: {class} is reserved for system keyspaces"
            )));
        }
        _ => {
            return Err(CqlError::config(format!(
                "Unable to find replication strategy class 'org.apache.cassandra.locator.{short}'"
            )))
        }
    }
    options.insert("class".into(), full_class);
    Ok(options)
}

fn check_column_type(definition: &ColumnDefinition, kind: ColumnKind) -> Result<(), CqlError> {
    let cql_type = &definition.cql_type;
    if matches!(kind, ColumnKind::PartitionKey | ColumnKind::Clustering) {
        ensure(!cql_type.is_multi_cell(), || {
            let what = if cql_type.is_collection() {
                format!("collection type {cql_type}")
            } else {
                format!("user-defined type \"{cql_type}\"")
            };
            CqlError::invalid(format!(
                "Invalid non-frozen {what} for PRIMARY KEY component {}",
                definition.name
            ))
        })?;
        ensure(*cql_type != CqlType::Duration, || {
            CqlError::invalid(format!(
                "duration type is not supported for PRIMARY KEY column '{}'",
                definition.name
            ))
        })?;
    }
    if *cql_type == CqlType::Counter {
        ensure(
            !matches!(kind, ColumnKind::PartitionKey | ColumnKind::Clustering),
            || {
                CqlError::invalid(format!(
                    "counter type is not supported for PRIMARY KEY column '{}'",
                    definition.name
                ))
            },
        )?;
    } else if contains_counter(cql_type) {
        return Err(CqlError::invalid(format!(
            "Counters are not allowed inside collections: {cql_type}"
        )));
    }
    user_types::check_non_frozen_nesting(cql_type)?;
    Ok(())
}

/// True when a counter appears inside `cql_type` (a collection, tuple or vector of them).
fn contains_counter(cql_type: &CqlType) -> bool {
    match cql_type {
        CqlType::Counter => true,
        CqlType::List { element, .. }
        | CqlType::Set { element, .. }
        | CqlType::Vector { element, .. } => contains_counter(element),
        CqlType::Map { key, value, .. } => contains_counter(key) || contains_counter(value),
        CqlType::Tuple(elements) => elements.iter().any(contains_counter),
        _ => false,
    }
}

/// A counter table holds counters only besides its key, and no default TTL.
fn check_counter_table(table: &TableMetadata) -> Result<(), CqlError> {
    if !table.is_counter() {
        return Ok(());
    }
    ensure(
        table.columns.iter().all(|c| {
            matches!(c.kind, ColumnKind::PartitionKey | ColumnKind::Clustering)
                || c.cql_type == CqlType::Counter
        }),
        || CqlError::invalid("Cannot mix counter and non counter columns in the same table"),
    )?;
    ensure(table.options.default_time_to_live == 0, || {
        CqlError::invalid("Cannot set default_time_to_live on a table with counters")
    })
}

async fn create_table(
    coordinator: &Coordinator,
    session: &Session,
    create: &CreateTable,
) -> Result<ResultBody, CqlError> {
    let keyspace = coordinator.keyspace_for(session, &create.table.keyspace)?;
    let name = &create.table.name;
    validate_name("Table", name)?;
    ensure(!create.compact_storage, || {
        CqlError::invalid("COMPACT STORAGE tables are not supported (as in Cassandra 5.0)")
    })?;
    ensure(!create.partition_key.is_empty(), || {
        CqlError::invalid("No PRIMARY KEY specifed for table (exactly one required)")
    })?;

    let mut options = TableOptions::default();
    apply_table_properties(&mut options, &create.properties)?;
    let id = shoal_model::TableId::random();
    let created = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, &keyspace)?;
            if keyspace_metadata.tables.contains_key(name) {
                if create.if_not_exists {
                    return Ok(false);
                }
                return Err(CqlError::new(
                    ErrorCode::AlreadyExists {
                        keyspace: keyspace.clone(),
                        table: name.clone(),
                    },
                    format!("Table '{keyspace}.{name}' already exists"),
                ));
            }
            // User-defined types are resolved against the keyspace as this change sees it.
            let mut resolved = create.clone();
            for definition in &mut resolved.columns {
                definition.cql_type = user_types::resolve(keyspace_metadata, &definition.cql_type)?;
            }
            let mut table = TableMetadata {
                indexes: Vec::new(),
                keyspace: keyspace.clone(),
                name: name.clone(),
                id,
                columns: table_columns(&keyspace, name, &resolved)?,
                options: options.clone(),
                dropped_columns: BTreeMap::new(),
                is_virtual: false,
            };
            table.normalize_column_order();
            check_counter_table(&table)?;
            keyspace_metadata
                .tables
                .insert(name.clone(), Arc::new(table));
            Ok(true)
        })
        .await?;
    Ok(if created {
        schema_change("CREATED", "TABLE", &keyspace, Some(name))
    } else {
        ResultBody::Void
    })
}

/// The columns of a CREATE TABLE, checked: every key column defined once, static columns
/// only beside clustering columns, CLUSTERING ORDER following the clustering key.
fn table_columns(
    keyspace: &str,
    name: &str,
    create: &CreateTable,
) -> Result<Vec<ColumnMetadata>, CqlError> {
    let mut seen = std::collections::HashSet::new();
    for definition in &create.columns {
        ensure(seen.insert(definition.name.clone()), || {
            CqlError::invalid(format!(
                "Duplicate column '{}' declaration for table {keyspace}.{name}",
                definition.name
            ))
        })?;
    }
    let definition_of = |column: &str| {
        create
            .columns
            .iter()
            .find(|d| d.name == column)
            .ok_or_else(|| {
                CqlError::invalid(format!(
                    "Unknown definition {column} referenced in PRIMARY KEY"
                ))
            })
    };
    let mut columns = Vec::new();
    let mut key_columns = std::collections::HashSet::new();
    for (position, column) in create.partition_key.iter().enumerate() {
        let definition = definition_of(column)?;
        ensure(key_columns.insert(column.clone()), || {
            CqlError::invalid(format!("Duplicate definition for {column} in PRIMARY KEY"))
        })?;
        ensure(!definition.is_static, || {
            CqlError::invalid(format!(
                "Static column {column} cannot be part of the PRIMARY KEY"
            ))
        })?;
        check_column_type(definition, ColumnKind::PartitionKey)?;
        columns.push(ColumnMetadata {
            name: column.clone(),
            cql_type: definition.cql_type.clone(),
            kind: ColumnKind::PartitionKey,
            position: position as i32,
            descending: false,
        });
    }
    if !create.clustering_order.is_empty() {
        let ordered: Vec<&String> = create.clustering_order.iter().map(|(c, _)| c).collect();
        let expected: Vec<&String> = create.clustering_key.iter().take(ordered.len()).collect();
        for (column, _) in &create.clustering_order {
            ensure(create.clustering_key.contains(column), || {
                CqlError::invalid(format!("Only clustering key columns can be defined in CLUSTERING ORDER directive: {column} is not a clustering column"))
            })?;
        }
        ensure(ordered == expected, || {
            CqlError::invalid("The order of columns in the CLUSTERING ORDER directive must match that of the clustering columns")
        })?;
    }
    for (position, column) in create.clustering_key.iter().enumerate() {
        let definition = definition_of(column)?;
        ensure(key_columns.insert(column.clone()), || {
            CqlError::invalid(format!("Duplicate definition for {column} in PRIMARY KEY"))
        })?;
        ensure(!definition.is_static, || {
            CqlError::invalid(format!(
                "Static column {column} cannot be part of the PRIMARY KEY"
            ))
        })?;
        check_column_type(definition, ColumnKind::Clustering)?;
        let descending = create
            .clustering_order
            .iter()
            .any(|(c, desc)| c == column && *desc);
        columns.push(ColumnMetadata {
            name: column.clone(),
            cql_type: definition.cql_type.clone(),
            kind: ColumnKind::Clustering,
            position: position as i32,
            descending,
        });
    }
    for definition in &create.columns {
        if key_columns.contains(&definition.name) {
            continue;
        }
        ensure(
            !definition.is_static || !create.clustering_key.is_empty(),
            || {
                CqlError::invalid(format!(
                    "Static column {} cannot be added to a table without clustering columns",
                    definition.name
                ))
            },
        )?;
        check_column_type(definition, ColumnKind::Regular)?;
        columns.push(ColumnMetadata {
            name: definition.name.clone(),
            cql_type: definition.cql_type.clone(),
            kind: if definition.is_static {
                ColumnKind::Static
            } else {
                ColumnKind::Regular
            },
            position: -1,
            descending: false,
        });
    }
    Ok(columns)
}

fn apply_table_properties(
    options: &mut TableOptions,
    properties: &Properties,
) -> Result<(), CqlError> {
    for (name, value) in properties {
        let int = |value: &Term| -> Result<i32, CqlError> {
            property_text(value, name)?.parse().map_err(|_| {
                CqlError::syntax(format!("Invalid integer value for property '{name}'"))
            })
        };
        let double = |value: &Term| -> Result<f64, CqlError> {
            property_text(value, name)?.parse().map_err(|_| {
                CqlError::syntax(format!("Invalid double value for property '{name}'"))
            })
        };
        match name.as_str() {
            "comment" => options.comment = property_text(value, name)?,
            "default_time_to_live" => {
                let ttl = int(value)?;
                ensure((0..=630_720_000).contains(&ttl), || {
                    CqlError::config(format!(
                        "default_time_to_live must be between 0 and 630720000 (got {ttl})"
                    ))
                })?;
                options.default_time_to_live = ttl;
            }
            "gc_grace_seconds" => {
                let seconds = int(value)?;
                ensure(seconds >= 0, || {
                    CqlError::config("gc_grace_seconds must be non-negative")
                })?;
                options.gc_grace_seconds = seconds;
            }
            "bloom_filter_fp_chance" => options.bloom_filter_fp_chance = double(value)?,
            "crc_check_chance" => options.crc_check_chance = double(value)?,
            "memtable_flush_period_in_ms" => options.memtable_flush_period_in_ms = int(value)?,
            "min_index_interval" => options.min_index_interval = int(value)?,
            "max_index_interval" => options.max_index_interval = int(value)?,
            "speculative_retry" => options.speculative_retry = property_text(value, name)?,
            "additional_write_policy" => {
                options.additional_write_policy = property_text(value, name)?
            }
            "read_repair" => options.read_repair = property_text(value, name)?.to_uppercase(),
            "caching" => options.caching = property_map(value, name)?,
            "compaction" => options.compaction = property_map(value, name)?,
            "compression" => options.compression = property_map(value, name)?,
            "partitioner" => {
                let partitioner = property_text(value, name)?;
                options.partitioner = Partitioner::parse(&partitioner).ok_or_else(|| {
                    CqlError::config(format!(
                        "Unknown partitioner '{partitioner}': a table's partitioner is 'murmur3' (keys spread by hash, the default) or 'ordered' (keys kept in order)"
                    ))
                })?;
            }
            "cdc" | "extensions" | "memtable" | "allow_auto_snapshot" | "incremental_backups" => {}
            other => return Err(CqlError::syntax(format!("Unknown property '{other}'"))),
        }
    }
    Ok(())
}

fn alter_table(
    current: &TableMetadata,
    action: &AlterTableAction,
) -> Result<TableMetadata, CqlError> {
    let mut table = current.clone();
    let qualified = format!("{}.{}", table.keyspace, table.name);
    match action {
        AlterTableAction::Add(definitions) => {
            for definition in definitions {
                ensure(table.column(&definition.name).is_none(), || {
                    CqlError::invalid(format!(
                        "Column with name '{}' already exists",
                        definition.name
                    ))
                })?;
                ensure(
                    !definition.is_static || table.clustering_count() > 0,
                    || {
                        CqlError::invalid("Static columns are only useful (and thus allowed) if the table has at least one clustering column".to_string())
                    },
                )?;
                if let Some(dropped) = table.dropped_columns.get(&definition.name) {
                    ensure(dropped.cql_type == definition.cql_type, || {
                        CqlError::invalid(format!(
                            "Cannot re-add previously dropped column '{}' of type {}, incompatible with previous type {}",
                            definition.name, definition.cql_type, dropped.cql_type
                        ))
                    })?;
                }
                check_column_type(definition, ColumnKind::Regular)?;
                table.columns.push(ColumnMetadata {
                    name: definition.name.clone(),
                    cql_type: definition.cql_type.clone(),
                    kind: if definition.is_static {
                        ColumnKind::Static
                    } else {
                        ColumnKind::Regular
                    },
                    position: -1,
                    descending: false,
                });
            }
        }
        AlterTableAction::Drop(names) => {
            for name in names {
                let (index, column) = table.require_column(name).map_err(|_| {
                    CqlError::invalid(format!("Column {name} was not found in table {qualified}"))
                })?;
                ensure(
                    matches!(column.kind, ColumnKind::Regular | ColumnKind::Static),
                    || CqlError::invalid(format!("Cannot drop PRIMARY KEY column {name}")),
                )?;
                let dependent: Vec<&str> = table
                    .indexes
                    .iter()
                    .filter(|i| i.column == *name)
                    .map(|i| i.name.as_str())
                    .collect();
                ensure(dependent.is_empty(), || {
                    CqlError::invalid(format!(
                        "Cannot drop column {name} because it has dependent secondary indexes ({})",
                        dependent.join(", ")
                    ))
                })?;
                let dropped = table.columns.remove(index);
                table.dropped_columns.insert(
                    dropped.name,
                    shoal_schema::DroppedColumn {
                        cql_type: dropped.cql_type,
                        dropped_at_micros: shoal_model::WriteTimestamp::now().0,
                    },
                );
            }
        }
        AlterTableAction::Rename(renames) => {
            for (from, to) in renames {
                ensure(table.column(to).is_none(), || {
                    CqlError::invalid(format!("Cannot rename column {from} to {to} in table {qualified}; another column of that name already exist"))
                })?;
                let index = table.column_index(from).ok_or_else(|| {
                    CqlError::invalid(format!("Column {from} was not found in table {qualified}"))
                })?;
                ensure(
                    matches!(
                        table.columns[index].kind,
                        ColumnKind::PartitionKey | ColumnKind::Clustering
                    ),
                    || CqlError::invalid(format!("Cannot rename non PRIMARY KEY column {from}")),
                )?;
                table.columns[index].name = to.clone();
                // Indexes follow the column (their entries hold its values, not its name).
                for index in table.indexes.iter_mut().filter(|i| i.column == *from) {
                    index.column = to.clone();
                }
            }
        }
        AlterTableAction::AlterType { .. } => {
            return Err(CqlError::invalid(
                "Altering column types is no longer supported",
            ));
        }
        AlterTableAction::With(properties) => {
            let partitioner = table.options.partitioner;
            apply_table_properties(&mut table.options, properties)?;
            ensure(table.options.partitioner == partitioner, || {
                CqlError::invalid(format!(
                    "Cannot change the partitioner of table {qualified}: it decides where every stored partition lives"
                ))
            })?;
        }
    }
    table.normalize_column_order();
    Ok(table)
}
