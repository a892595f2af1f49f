//! User-defined types: `CREATE / ALTER / DROP TYPE`, and resolving the type names a
//! statement writes (`frozen<address>`) into the definitions tables embed.
//!
//! A table column stores the whole definition of the type it uses ([`CqlType::Udt`]), so
//! encoding, decoding and describing a value never looks anything up on the request path.
//! The price is paid here, once per schema change: `ALTER TYPE` rewrites, in the same
//! change, every type and every table column of the keyspace that embeds the altered type
//! (at any depth), so no table is ever left with a stale definition.
//!
//! A field keeps its position for life — `ALTER TYPE` only adds fields at the end or
//! renames them — because the cells of a non-frozen value are keyed by field position
//! ([`UserType::field_path`]) and old frozen values simply have fewer fields.

use super::{schema_change, user_keyspace_mut};
use crate::{ensure, Coordinator, CqlError};
use shoal_cql::ast::AlterTypeAction;
use shoal_cql::response::ResultBody;
use shoal_model::types::UserType;
use shoal_model::CqlType;
use shoal_schema::{validate_name, KeyspaceMetadata, TableMetadata};
use std::sync::Arc;

/// `cql_type` with every user-defined type name in it replaced by the keyspace's
/// definition (frozen as written).
pub(crate) fn resolve(
    keyspace: &KeyspaceMetadata,
    cql_type: &CqlType,
) -> Result<CqlType, CqlError> {
    cql_type.map_udts(&mut |inner: &CqlType| match inner {
        CqlType::UdtName {
            keyspace: named_keyspace,
            name,
            frozen,
        } => {
            if let Some(other) = named_keyspace.as_ref().filter(|k| **k != keyspace.name) {
                return Err(CqlError::invalid(format!(
                    "Statement on keyspace {} cannot refer to a user type in keyspace {other}; user types can only be used in the keyspace they are defined in",
                    keyspace.name
                )));
            }
            let definition = keyspace.types.get(name).ok_or_else(|| {
                CqlError::invalid(format!("Unknown type {}.{name}", keyspace.name))
            })?;
            Ok(Some(CqlType::Udt(Box::new(UserType {
                frozen: *frozen,
                ..definition.clone()
            }))))
        }
        _ => Ok(None),
    })
}

/// A non-frozen user-defined type is stored a cell per field; a field that is itself a
/// non-frozen collection cannot be, as in Cassandra.
pub(crate) fn check_non_frozen_nesting(cql_type: &CqlType) -> Result<(), CqlError> {
    if let Some(user_type) = cql_type.as_udt().filter(|udt| !udt.frozen) {
        ensure(!user_type.field_types().any(CqlType::is_multi_cell), || {
            CqlError::invalid(
                "Non-frozen UDTs with nested non-frozen collections are not supported",
            )
        })?;
    }
    Ok(())
}

/// A type as text with its user-defined types qualified by keyspace (`frozen<ks.address>`),
/// as some of Cassandra's messages print it.
fn qualified(cql_type: &CqlType) -> String {
    cql_type
        .map_udts::<std::convert::Infallible>(&mut |inner: &CqlType| {
            Ok(inner.as_udt().map(|udt| CqlType::UdtName {
                keyspace: Some(udt.keyspace.clone()),
                name: udt.name.clone(),
                frozen: udt.frozen,
            }))
        })
        .map_or_else(|never| match never {}, |t| t.to_string())
}

/// What a field of a type may be: anything but a counter or a non-frozen user-defined
/// type.
fn check_field_type(cql_type: &CqlType) -> Result<(), CqlError> {
    ensure(*cql_type != CqlType::Counter, || {
        CqlError::invalid("A user type cannot contain counters")
    })?;
    ensure(cql_type.as_udt().is_none_or(|udt| udt.frozen), || {
        CqlError::invalid("A user type cannot contain non-frozen UDTs")
    })
}

pub(crate) async fn create(
    coordinator: &Coordinator,
    keyspace: &str,
    name: &str,
    if_not_exists: bool,
    fields: &[(String, CqlType)],
) -> Result<ResultBody, CqlError> {
    validate_name("Type", name)?;
    ensure(CqlType::native_from_name(name).is_none(), || {
        CqlError::syntax(format!(
            "'{name}' is a native type name and cannot name a user type"
        ))
    })?;
    ensure(!fields.is_empty(), || {
        CqlError::invalid("A user type must have at least one field")
    })?;
    for (i, (field, _)) in fields.iter().enumerate() {
        ensure(!fields[..i].iter().any(|(other, _)| other == field), || {
            CqlError::invalid(format!("Duplicate field name '{field}' in type '{name}'"))
        })?;
    }
    let created = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            if keyspace_metadata.types.contains_key(name) {
                if if_not_exists {
                    return Ok(false);
                }
                return Err(CqlError::invalid(format!(
                    "A user type with name '{name}' already exists"
                )));
            }
            let mut resolved = Vec::with_capacity(fields.len());
            for (field, cql_type) in fields {
                let cql_type = resolve(keyspace_metadata, cql_type)?;
                check_field_type(&cql_type)?;
                resolved.push((field.clone(), cql_type));
            }
            keyspace_metadata.types.insert(
                name.to_string(),
                UserType {
                    keyspace: keyspace.to_string(),
                    name: name.to_string(),
                    fields: resolved,
                    frozen: false,
                },
            );
            Ok(true)
        })
        .await?;
    Ok(if created {
        schema_change("CREATED", "TYPE", keyspace, Some(name))
    } else {
        ResultBody::Void
    })
}

pub(crate) async fn alter(
    coordinator: &Coordinator,
    keyspace: &str,
    name: &str,
    if_exists: bool,
    action: &AlterTypeAction,
) -> Result<ResultBody, CqlError> {
    let altered = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            let Some(current) = keyspace_metadata.types.get(name) else {
                if if_exists {
                    return Ok(false);
                }
                return Err(CqlError::invalid(format!(
                    "Type {keyspace}.{name} doesn't exist"
                )));
            };
            let mut definition = current.clone();
            match action {
                AlterTypeAction::Add {
                    field,
                    cql_type,
                    if_not_exists,
                } => {
                    if definition.field_index(field).is_some() {
                        if *if_not_exists {
                            return Ok(false);
                        }
                        return Err(CqlError::invalid(format!(
                            "Cannot add field {field} to type {keyspace}.{name}: a field with name {field} already exists"
                        )));
                    }
                    let cql_type = resolve(keyspace_metadata, cql_type)?;
                    ensure(!cql_type.mentions_udt(keyspace, name), || {
                        CqlError::invalid(format!(
                            "Cannot add new field {field} of type {} to user type {keyspace}.{name} as it would create a circular reference",
                            qualified(&cql_type)
                        ))
                    })?;
                    check_field_type(&cql_type)?;
                    definition.fields.push((field.clone(), cql_type));
                }
                AlterTypeAction::Rename { renames, if_exists } => {
                    for (from, to) in renames {
                        let Some(index) = definition.field_index(from) else {
                            if *if_exists {
                                continue;
                            }
                            return Err(CqlError::invalid(format!(
                                "Unkown field {from} in user type {keyspace}.{name}"
                            )));
                        };
                        // Cassandra's message names the keyspace only.
                        ensure(definition.field_index(to).is_none(), || {
                            CqlError::invalid(format!(
                                "Duplicate field name {to} in type {keyspace}"
                            ))
                        })?;
                        definition.fields[index].0 = to.clone();
                    }
                }
            }
            if definition == *current {
                return Ok(false);
            }
            replace_everywhere(keyspace_metadata, definition)?;
            Ok(true)
        })
        .await?;
    Ok(if altered {
        schema_change("UPDATED", "TYPE", keyspace, Some(name))
    } else {
        ResultBody::Void
    })
}

/// Installs `definition` and rewrites every type and table column of the keyspace that
/// embeds the type it replaces.
fn replace_everywhere(
    keyspace: &mut KeyspaceMetadata,
    definition: UserType,
) -> Result<(), CqlError> {
    let replace = |cql_type: &CqlType| {
        cql_type.map_udts::<CqlError>(&mut |inner: &CqlType| {
            Ok(inner
                .as_udt()
                .filter(|udt| udt.keyspace == definition.keyspace && udt.name == definition.name)
                .map(|udt| {
                    CqlType::Udt(Box::new(UserType {
                        frozen: udt.frozen,
                        ..definition.clone()
                    }))
                }))
        })
    };
    for other in keyspace.types.values_mut() {
        let fields = other
            .fields
            .iter()
            .map(|(field, cql_type)| Ok((field.clone(), replace(cql_type)?)))
            .collect::<Result<Vec<_>, CqlError>>()?;
        other.fields = fields;
    }
    let names: Vec<String> = keyspace.tables.keys().cloned().collect();
    for table_name in names {
        let table = &keyspace.tables[&table_name];
        if !table.columns.iter().any(|c| {
            c.cql_type
                .mentions_udt(&definition.keyspace, &definition.name)
        }) {
            continue;
        }
        let mut rewritten: TableMetadata = table.as_ref().clone();
        for column in &mut rewritten.columns {
            column.cql_type = replace(&column.cql_type)?;
            check_non_frozen_nesting(&column.cql_type)?;
        }
        keyspace.tables.insert(table_name, Arc::new(rewritten));
    }
    keyspace.types.insert(definition.name.clone(), definition);
    Ok(())
}

pub(crate) async fn drop(
    coordinator: &Coordinator,
    keyspace: &str,
    name: &str,
    if_exists: bool,
) -> Result<ResultBody, CqlError> {
    let dropped = coordinator
        .schema
        .change(|schema| {
            let keyspace_metadata = user_keyspace_mut(schema, keyspace)?;
            if !keyspace_metadata.types.contains_key(name) {
                if if_exists {
                    return Ok(false);
                }
                return Err(CqlError::invalid(format!(
                    "Type '{keyspace}.{name}' doesn't exist"
                )));
            }
            let using_types: Vec<&str> = keyspace_metadata
                .types
                .values()
                .filter(|other| other.name != name && other.mentions(keyspace, name))
                .map(|other| other.name.as_str())
                .collect();
            if !using_types.is_empty() {
                return Err(CqlError::invalid(format!(
                    "Cannot drop user type '{keyspace}.{name}' as it is still used by user types {}",
                    using_types.join(", ")
                )));
            }
            let using_tables: Vec<&str> = keyspace_metadata
                .tables
                .values()
                .filter(|table| {
                    table
                        .columns
                        .iter()
                        .any(|c| c.cql_type.mentions_udt(keyspace, name))
                })
                .map(|table| table.name.as_str())
                .collect();
            if !using_tables.is_empty() {
                return Err(CqlError::invalid(format!(
                    "Cannot drop user type '{keyspace}.{name}' as it is still used by tables {}",
                    using_tables.join(", ")
                )));
            }
            keyspace_metadata.types.remove(name);
            Ok(true)
        })
        .await?;
    Ok(if dropped {
        schema_change("DROPPED", "TYPE", keyspace, Some(name))
    } else {
        ResultBody::Void
    })
}
