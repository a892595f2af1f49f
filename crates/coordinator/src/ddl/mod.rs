//! Schema statements: CREATE/ALTER/DROP KEYSPACE and TABLE, and TRUNCATE (table
//! definitions in `tables`, user-defined types in `user_types`, indexes in `indexes`).

use crate::{ensure, Coordinator, CqlError, ErrorCode, Session};
use shoal_cql::ast::{AlterTableAction, Literal, Properties, Statement, Term};
use shoal_cql::response::{ResultBody, SchemaChange};
use shoal_model::CqlType;
use shoal_schema::{validate_name, KeyspaceConsistency, KeyspaceMetadata, Schema};
use std::collections::BTreeMap;
use std::sync::Arc;

mod indexes;
mod tables;

use tables::{alter_table, check_counter_table, create_table};
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
