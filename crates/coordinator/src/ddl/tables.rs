//! Table definitions: the columns and properties of `CREATE TABLE` (with the checks
//! Cassandra makes — column types per kind, counter tables, clustering order) and the
//! changes `ALTER TABLE` makes to them.

use super::{property_map, property_text, schema_change, user_keyspace_mut, user_types};
use crate::{ensure, Coordinator, CqlError, ErrorCode, Session};
use shoal_cql::ast::{AlterTableAction, ColumnDefinition, CreateTable, Properties, Term};
use shoal_cql::response::ResultBody;
use shoal_model::token::Partitioner;
use shoal_model::CqlType;
use shoal_schema::{validate_name, ColumnKind, ColumnMetadata, TableMetadata, TableOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

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
pub(super) fn check_counter_table(table: &TableMetadata) -> Result<(), CqlError> {
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

pub(super) async fn create_table(
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

pub(super) fn alter_table(
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
