//! `CREATE INDEX` and `DROP INDEX`: the schema side of secondary indexes. An index is part
//! of its table's metadata ([`IndexMetadata`]); creating one changes the table (drivers
//! hear `UPDATED TABLE`, as from Cassandra) and every node then builds its local index of
//! the rows it holds in the background ([`crate::index`]).

use super::{schema_change, user_keyspace_mut};
use crate::{ensure, Coordinator, CqlError, ErrorCode};
use shoal_cql::ast::{CreateIndex, IndexTargetKind};
use shoal_cql::response::ResultBody;
use shoal_model::{CqlType, TableId};
use shoal_schema::{validate_name, ColumnKind, IndexMetadata, IndexTarget, KeyspaceMetadata};
use std::sync::Arc;

/// The index classes `USING` accepts: Cassandra 5.0's storage-attached index by any of its
/// names. Others (Lucene, …) are refused.
fn is_sai(class: &str) -> bool {
    let short = class.rsplit('.').next().unwrap_or(class);
    short.eq_ignore_ascii_case("sai") || short == "StorageAttachedIndex"
}

/// The name Cassandra gives an unnamed index: `table_column_idx`, then `_1`, `_2`… until
/// it is free in the keyspace.
fn default_name(keyspace: &KeyspaceMetadata, table: &str, column: &str) -> String {
    let base: String = format!("{table}_{column}_idx")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let mut name = base.clone();
    let mut suffix = 0;
    while index_exists(keyspace, &name) {
        suffix += 1;
        name = format!("{base}_{suffix}");
    }
    name
}

fn index_exists(keyspace: &KeyspaceMetadata, name: &str) -> bool {
    keyspace
        .tables
        .values()
        .any(|t| t.indexes.iter().any(|i| i.name == name))
}

/// What `target` means for a column of `cql_type`, with Cassandra's errors.
fn resolve_target(
    column: &str,
    cql_type: &CqlType,
    target: IndexTargetKind,
) -> Result<IndexTarget, CqlError> {
    let multi_cell = cql_type.is_multi_cell();
    let is_map = matches!(cql_type, CqlType::Map { .. });
    Ok(match target {
        IndexTargetKind::Simple | IndexTargetKind::Values => {
            if multi_cell && cql_type.as_udt().is_some() {
                return Err(CqlError::invalid(format!(
                    "Cannot create index on non-frozen UDT column {column}"
                )));
            }
            if target == IndexTargetKind::Values && !cql_type.is_collection() {
                return Err(CqlError::invalid(format!(
                    "Cannot create values() index on {column}. Non-collection columns only support simple indexes"
                )));
            }
            if cql_type.is_collection() && !multi_cell {
                if target == IndexTargetKind::Values {
                    return Err(CqlError::invalid(format!(
                        "Cannot create values() index on frozen column {column}. Frozen collections only support full() indexes"
                    )));
                }
                // A bare frozen collection is indexed whole, as `FULL`.
                return Ok(IndexTarget::Full);
            }
            IndexTarget::Values
        }
        IndexTargetKind::Keys | IndexTargetKind::Entries => {
            let what = if target == IndexTargetKind::Keys {
                "keys"
            } else {
                "entries"
            };
            ensure(cql_type.is_collection(), || {
                CqlError::invalid(format!(
                    "Cannot create {what}() index on {column}. Non-collection columns only support simple indexes"
                ))
            })?;
            ensure(is_map && multi_cell, || {
                let what = if target == IndexTargetKind::Keys {
                    "keys"
                } else {
                    "entries"
                };
                CqlError::invalid(format!(
                    "Cannot create index on {what} of column {column} with non-map type"
                ))
            })?;
            if target == IndexTargetKind::Keys {
                IndexTarget::Keys
            } else {
                IndexTarget::Entries
            }
        }
        IndexTargetKind::Full => {
            ensure(cql_type.is_collection() && !multi_cell, || {
                CqlError::invalid("full() indexes can only be created on frozen collections")
            })?;
            IndexTarget::Full
        }
    })
}

/// Checks `WITH OPTIONS`: a storage-attached index on a vector column takes
/// `similarity_function` (its ANN ordering); no other option is built yet (SAI's text
/// analysis — case_sensitive, normalize, ascii — is refused rather than ignored).
fn check_options(
    column: &str,
    cql_type: &CqlType,
    sai: bool,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<(), CqlError> {
    let vector = match cql_type {
        CqlType::Vector { element, dimension } if sai => Some((element, *dimension)),
        _ => None,
    };
    if let Some((element, _)) = vector {
        ensure(**element == CqlType::Float, || {
            CqlError::invalid(
                "SAI ANN indexes are only allowed on vector columns with float elements",
            )
        })?;
    }
    let unknown: Vec<&str> = options
        .keys()
        .map(String::as_str)
        .filter(|option| vector.is_none() || *option != "similarity_function")
        .collect();
    if !unknown.is_empty() {
        if !sai {
            return Err(CqlError::invalid(format!(
                "Index options are not supported by Shoal's default index (got '{}'); use USING 'sai'",
                unknown[0]
            )));
        }
        if unknown
            .iter()
            .any(|o| ["case_sensitive", "normalize", "ascii"].contains(o))
        {
            return Err(CqlError::invalid(format!(
                "Index options are not supported by Shoal yet (got '{}'): indexes match values exactly",
                unknown[0]
            )));
        }
        return Err(CqlError::config(format!(
            "Properties specified [{}] are not understood by StorageAttachedIndex",
            unknown.join(", ")
        )));
    }
    if let Some((_, dimension)) = vector {
        let function = options
            .get("similarity_function")
            .map_or("cosine", String::as_str);
        let similarity = shoal_model::vector::Similarity::named(function).ok_or_else(|| {
            CqlError::invalid(format!(
                "Similarity function {} was not recognized for the index on {column}. Valid values are: EUCLIDEAN, DOT_PRODUCT, COSINE",
                function.to_ascii_uppercase()
            ))
        })?;
        ensure(
            !(similarity == shoal_model::vector::Similarity::Cosine && dimension == 1),
            || CqlError::invalid("Cosine similarity is not supported for single-dimension vectors"),
        )?;
    }
    Ok(())
}

pub(crate) async fn create(
    coordinator: &Coordinator,
    keyspace: &str,
    create: &CreateIndex,
) -> Result<ResultBody, CqlError> {
    let sai = match &create.using {
        None => false,
        Some(class) if is_sai(class) => true,
        Some(class) => {
            return Err(CqlError::config(format!(
                "Unable to find custom indexer class '{class}'"
            )))
        }
    };
    if let Some(name) = &create.name {
        validate_name("Index", name)?;
    }
    // `WITH OPTIONS = {'name': 'value', …}`.
    let mut options = std::collections::BTreeMap::new();
    for (property, value) in &create.options {
        if !property.eq_ignore_ascii_case("options") {
            return Err(CqlError::syntax(format!("Unknown property '{property}'")));
        }
        for (option, value) in super::property_map(value, property)? {
            options.insert(option.to_ascii_lowercase(), value);
        }
    }
    let table_name = &create.table.name;
    let id = TableId::random();
    let created = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            ensure(
                keyspace_metadata.consistency != shoal_schema::KeyspaceConsistency::Strong,
                || {
                    CqlError::invalid(
                        "Secondary indexes on tables of a strongly consistent keyspace are not supported yet",
                    )
                },
            )?;
            let table = keyspace_metadata.tables.get(table_name).ok_or_else(|| {
                CqlError::invalid(format!("Table '{keyspace}.{table_name}' doesn't exist"))
            })?;
            ensure(!table.is_counter(), || {
                CqlError::invalid("Secondary indexes on counter tables are not supported")
            })?;
            let column = table.column(&create.column).ok_or_else(|| {
                CqlError::invalid(format!("Undefined column name {}", create.column))
            })?;
            ensure(
                !(column.kind == ColumnKind::PartitionKey && table.partition_key_count() == 1),
                || {
                    CqlError::invalid(format!(
                        "Cannot create secondary index on the only partition key column {}",
                        column.name
                    ))
                },
            )?;
            let target = resolve_target(&column.name, &column.cql_type, create.target)?;
            check_options(&column.name, &column.cql_type, sai, &options)?;
            if let Some(name) = &create.name {
                if index_exists(keyspace_metadata, name) {
                    if create.if_not_exists {
                        return Ok(false);
                    }
                    return Err(CqlError::new(
                        ErrorCode::AlreadyExists {
                            keyspace: keyspace.to_string(),
                            table: table_name.clone(),
                        },
                        format!("Index '{name}' already exists"),
                    ));
                }
            }
            if let Some(existing) = table
                .indexes
                .iter()
                .find(|i| i.column == column.name && i.target == target && i.options == options)
            {
                if create.if_not_exists {
                    return Ok(false);
                }
                return Err(CqlError::invalid(format!(
                    "Index {} is a duplicate of existing index {}",
                    create.name.clone().unwrap_or_else(|| default_name(
                        keyspace_metadata,
                        table_name,
                        &column.name
                    )),
                    existing.name
                )));
            }
            if sai {
                if let Some(existing) = table
                    .indexes
                    .iter()
                    .find(|i| i.sai && i.column == column.name)
                {
                    if create.if_not_exists
                        && create.name.as_ref().is_none_or(|n| *n == existing.name)
                    {
                        return Ok(false);
                    }
                    return Err(CqlError::invalid(format!(
                        "Cannot create more than one storage-attached index on the same column: {}",
                        column.name
                    )));
                }
            }
            let name = create
                .name
                .clone()
                .unwrap_or_else(|| default_name(keyspace_metadata, table_name, &column.name));
            let index = IndexMetadata {
                name,
                id,
                column: column.name.clone(),
                target,
                sai,
                class: create.using.clone(),
                options: options.clone(),
            };
            let mut altered = table.as_ref().clone();
            altered.indexes.push(index);
            keyspace_metadata
                .tables
                .insert(table_name.clone(), Arc::new(altered));
            Ok(true)
        })
        .await?;
    if created {
        // Build this node's part at once: a small table's index is complete when the
        // statement returns; a large one's keeps building in the background (other nodes
        // start theirs as they see the schema change), answering from the data meanwhile.
        coordinator.indexes.build_pending();
        let deadline = tokio::time::Instant::now() + BUILD_WAIT;
        while !coordinator.indexes.is_built(&id) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    Ok(if created {
        schema_change("UPDATED", "TABLE", keyspace, Some(table_name))
    } else {
        ResultBody::Void
    })
}

/// How long CREATE INDEX waits for this node's build before returning.
const BUILD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) async fn drop(
    coordinator: &Coordinator,
    keyspace: &str,
    name: &str,
    if_exists: bool,
) -> Result<ResultBody, CqlError> {
    let mut table_of_index = None;
    let dropped = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            let Some(table) = keyspace_metadata
                .tables
                .values()
                .find(|t| t.indexes.iter().any(|i| i.name == name))
                .cloned()
            else {
                if if_exists {
                    return Ok(false);
                }
                return Err(CqlError::invalid(format!(
                    "Index '{keyspace}.{name}' doesn't exist"
                )));
            };
            let mut altered = table.as_ref().clone();
            altered.indexes.retain(|i| i.name != name);
            keyspace_metadata
                .tables
                .insert(altered.name.clone(), Arc::new(altered));
            table_of_index = Some(table.name.clone());
            Ok(true)
        })
        .await?;
    Ok(match table_of_index.filter(|_| dropped) {
        Some(table) => schema_change("UPDATED", "TABLE", keyspace, Some(&table)),
        None => ResultBody::Void,
    })
}
