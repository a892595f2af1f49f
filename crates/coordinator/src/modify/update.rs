//! UPDATE: assignments resolved against their columns' types when planned; each
//! execution writes them into every row its WHERE clause names.

use super::rows::{element_path, list_path, write_column_value, RowWriter, WriteContext};
use super::{check_no_filters, missing_clustering, partitions, row_prefixes, RowAddress};
use crate::restrictions::WherePlan;
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::{Assignment, Update};
use shoal_model::{keys, Cell, CqlType, Token, Value};
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::{Engine, WriteBatch};

/// What one assignment does to its column.
#[derive(Debug)]
enum AssignmentOp {
    /// `c = value`: the whole value (a non-frozen collection is replaced).
    Set(TypedTerm),
    /// `l = l + [...]` or `l = [...] + l`.
    Append { value: TypedTerm, prepend: bool },
    /// `s = s + {...}`.
    AddToSet(TypedTerm),
    /// `m = m + {...}`.
    AddToMap(TypedTerm),
    /// `s = s - {...}`.
    RemoveFromSet(TypedTerm),
    /// `m = m - {keys}`.
    RemoveMapKeys(TypedTerm),
    /// `l = l - [...]`: reads the list first.
    RemoveFromList(TypedTerm),
    /// `l[i] = value`: reads the list first.
    SetListElement { index: TypedTerm, value: TypedTerm },
    /// `m[k] = value`.
    SetMapElement { key: TypedTerm, value: TypedTerm },
    /// `addr.zip = value` on a non-frozen user-defined type: field `index`'s cell.
    SetField { index: usize, value: TypedTerm },
    /// `c = c + n` / `c = c - n` on a counter: a delta cell for the counter's leader
    /// ([`crate::counter`]).
    Increment { delta: TypedTerm, negate: bool },
}

#[derive(Debug)]
struct AssignmentPlan {
    column: usize,
    op: AssignmentOp,
}

/// An UPDATE checked against its table.
#[derive(Debug)]
pub(crate) struct UpdatePlan {
    pub(crate) where_plan: WherePlan,
    assignments: Vec<AssignmentPlan>,
    /// Only static columns are assigned, and no clustering column is restricted.
    static_only: bool,
}

fn plan_assignment(
    table: &TableMetadata,
    assignment: &Assignment,
) -> Result<AssignmentPlan, CqlError> {
    let name = assignment.column();
    let (index, column) = table.require_column(name)?;
    ensure(
        matches!(column.kind, ColumnKind::Regular | ColumnKind::Static),
        || CqlError::invalid(format!("PRIMARY KEY part {name} found in SET part")),
    )?;
    let typed = |term, cql_type: &CqlType| TypedTerm::new(term, cql_type, name);
    let op = match (assignment, &column.cql_type) {
        (Assignment::Add { value, .. } | Assignment::Remove { value, .. }, CqlType::Counter) => {
            AssignmentOp::Increment {
                delta: typed(value, &CqlType::Counter)?,
                negate: matches!(assignment, Assignment::Remove { .. }),
            }
        }
        (_, CqlType::Counter) => {
            return Err(CqlError::invalid(format!(
                "Cannot set the value of counter column {name} (counters can only be incremented/decremented, not set)"
            )));
        }
        (Assignment::Set { value, .. }, cql_type) => AssignmentOp::Set(typed(value, cql_type)?),
        (
            Assignment::Add { value, .. } | Assignment::Prepend { value, .. },
            cql_type @ CqlType::List { frozen: false, .. },
        ) => AssignmentOp::Append {
            value: typed(value, cql_type)?,
            prepend: matches!(assignment, Assignment::Prepend { .. }),
        },
        (Assignment::Add { value, .. }, cql_type @ CqlType::Set { frozen: false, .. }) => {
            AssignmentOp::AddToSet(typed(value, cql_type)?)
        }
        (Assignment::Add { value, .. }, cql_type @ CqlType::Map { frozen: false, .. }) => {
            AssignmentOp::AddToMap(typed(value, cql_type)?)
        }
        (Assignment::Remove { value, .. }, cql_type @ CqlType::Set { frozen: false, .. }) => {
            AssignmentOp::RemoveFromSet(typed(value, cql_type)?)
        }
        (
            Assignment::Remove { value, .. },
            CqlType::Map {
                key, frozen: false, ..
            },
        ) => {
            let keys_type = CqlType::Set {
                element: key.clone(),
                frozen: false,
            };
            AssignmentOp::RemoveMapKeys(typed(value, &keys_type)?)
        }
        (Assignment::Remove { value, .. }, cql_type @ CqlType::List { frozen: false, .. }) => {
            AssignmentOp::RemoveFromList(typed(value, cql_type)?)
        }
        (
            Assignment::SetElement { key, value, .. },
            CqlType::List {
                element,
                frozen: false,
            },
        ) => AssignmentOp::SetListElement {
            index: typed(key, &CqlType::Int)?,
            value: typed(value, element)?,
        },
        (
            Assignment::SetElement { key, value, .. },
            CqlType::Map {
                key: key_type,
                value: value_type,
                frozen: false,
            },
        ) => AssignmentOp::SetMapElement {
            key: typed(key, key_type)?,
            value: typed(value, value_type)?,
        },
        (Assignment::SetField { field, value, .. }, _) => {
            let index = udt_field(column, field)?;
            let field_type = &column.cql_type.as_udt().map(|u| u.fields[index].1.clone());
            let field_type = field_type.as_ref().unwrap_or(&CqlType::Blob);
            AssignmentOp::SetField {
                index,
                value: TypedTerm::new(value, field_type, &format!("{name}.{field}"))?,
            }
        }
        (Assignment::SetElement { .. }, other) => {
            return Err(CqlError::invalid(format!("Invalid operation ({name}[...] = ...) for non-list, non-map column {name} of type {other}")));
        }
        (_, other) => {
            return Err(CqlError::invalid(format!("Invalid operation ({name} = {name} +/- ...) for non-collection column {name} of type {other}")));
        }
    };
    Ok(AssignmentPlan { column: index, op })
}

/// The position of `field` in `column`, a non-frozen user-defined type (the only kind
/// whose fields are written or deleted one by one).
pub(crate) fn udt_field(
    column: &shoal_schema::ColumnMetadata,
    field: &str,
) -> Result<usize, CqlError> {
    let name = &column.name;
    let user_type = column.cql_type.as_udt().ok_or_else(|| {
        CqlError::invalid(format!(
            "Invalid field deletion or update for non-UDT column {name}"
        ))
    })?;
    ensure(!user_type.frozen, || {
        CqlError::invalid(format!(
            "Invalid operation ({name}.{field} = ...) for frozen UDT column {name}"
        ))
    })?;
    user_type.field_index(field).ok_or_else(|| {
        CqlError::invalid(format!(
            "UDT column {name} does not have a field named {field}"
        ))
    })
}

impl UpdatePlan {
    pub(crate) fn new(table: &TableMetadata, update: &Update) -> Result<UpdatePlan, CqlError> {
        let where_plan = WherePlan::analyse(table, &update.relations)?;
        check_no_filters(table, &where_plan)?;
        ensure(!where_plan.has_clustering_slice, || {
            CqlError::invalid(
                "Slice restrictions are not supported on the clustering columns in UPDATE statements",
            )
        })?;
        let assignments = update
            .assignments
            .iter()
            .map(|assignment| plan_assignment(table, assignment))
            .collect::<Result<Vec<_>, _>>()?;
        let all_static = assignments
            .iter()
            .all(|a| table.columns[a.column].kind == ColumnKind::Static);
        let static_only =
            all_static && where_plan.clustering_prefix_columns == 0 && table.clustering_count() > 0;
        if !static_only && !where_plan.names_full_rows(table) {
            return Err(missing_clustering(
                table,
                where_plan.clustering_prefix_columns,
            ));
        }
        super::check_partitions_named(table, &where_plan)?;
        Ok(UpdatePlan {
            where_plan,
            assignments,
            static_only,
        })
    }

    /// True when an assignment needs the list's current elements (`l[i] = v`,
    /// `l = l - [...]`).
    pub(crate) fn reads_lists(&self) -> bool {
        self.assignments.iter().any(|a| {
            matches!(
                a.op,
                AssignmentOp::RemoveFromList(_) | AssignmentOp::SetListElement { .. }
            )
        })
    }

    /// Builds the UPDATE's cells into `batch`.
    pub(crate) fn build(
        &self,
        current: &dyn Engine,
        ctx: &WriteContext<'_>,
        bindings: Bindings<'_>,
        batch: &mut WriteBatch,
    ) -> Result<Vec<RowAddress>, CqlError> {
        let table = ctx.table;
        let restrictions = self.where_plan.bind(table, bindings)?;
        let mut touched = Vec::new();
        for (token, partition_key) in partitions(table, &restrictions)? {
            let mut static_prefix = keys::partition_prefix(&table.id, token, &partition_key);
            static_prefix.push(keys::SECTION_STATIC_ROW);
            for (prefix, clustering) in row_prefixes(
                table,
                token,
                &partition_key,
                &restrictions,
                self.static_only,
            ) {
                let target = RowTarget {
                    current,
                    token,
                    partition_key: &partition_key,
                    clustering: clustering.as_deref(),
                };
                let mut writer = ctx.writer(batch, prefix);
                for assignment in &self.assignments {
                    let is_static = table.columns[assignment.column].kind == ColumnKind::Static;
                    if is_static && !self.static_only {
                        let mut static_writer = ctx.writer(writer.batch, static_prefix.clone());
                        let static_target = RowTarget {
                            clustering: None,
                            ..target
                        };
                        apply(
                            &mut static_writer,
                            &static_target,
                            table,
                            assignment,
                            bindings,
                        )?;
                    } else {
                        apply(&mut writer, &target, table, assignment, bindings)?;
                    }
                }
                touched.push(RowAddress {
                    token,
                    partition_key: partition_key.clone(),
                    clustering,
                });
            }
        }
        Ok(touched)
    }
}

/// The row an assignment writes, for the operations that read it first.
#[derive(Clone, Copy)]
pub(crate) struct RowTarget<'a> {
    /// The rows' current state, read at the statement's consistency level.
    pub(crate) current: &'a dyn Engine,
    pub(crate) token: Token,
    pub(crate) partition_key: &'a [u8],
    pub(crate) clustering: Option<&'a [u8]>,
}

impl RowTarget<'_> {
    /// The current cells of one column of the row (for list operations).
    pub(crate) fn current_cells(
        &self,
        table: &TableMetadata,
        column: &str,
    ) -> Result<Vec<(Vec<u8>, Cell)>, CqlError> {
        let row = crate::select::read_single_row(
            self.current,
            table,
            self.token,
            self.partition_key,
            self.clustering,
        )?;
        Ok(row
            .and_then(|row| row.columns.into_iter().find(|c| c.name == column))
            .map(|c| c.cells)
            .unwrap_or_default())
    }
}

/// The `index`th element of a list, as Cassandra reports a missing one.
pub(crate) fn list_element(cells: &[(Vec<u8>, Cell)], index: usize) -> Result<&[u8], CqlError> {
    cells
        .get(index)
        .map(|(path, _)| path.as_slice())
        .ok_or_else(|| {
            CqlError::invalid(format!(
                "List index {index} out of bound, list has size {}",
                cells.len()
            ))
        })
}

fn apply(
    writer: &mut RowWriter<'_>,
    target: &RowTarget<'_>,
    table: &TableMetadata,
    assignment: &AssignmentPlan,
    bindings: Bindings<'_>,
) -> Result<(), CqlError> {
    let column = &table.columns[assignment.column];
    let name = column.name.as_str();
    let value = |term: &TypedTerm| term.evaluate(bindings);
    match &assignment.op {
        AssignmentOp::Set(term) => match value(term)? {
            Bound::Value(v) => write_column_value(writer, column, Some(v)),
            Bound::Null => write_column_value(writer, column, None),
            Bound::Unset => {}
        },
        AssignmentOp::Append {
            value: term,
            prepend,
        } => {
            if let Bound::Value(Value::List(elements)) = value(term)? {
                let ordered: Vec<Value> = if *prepend {
                    elements.into_iter().rev().collect()
                } else {
                    elements
                };
                for element in ordered {
                    writer.cell(name, &list_path(*prepend), Some(element.serialize()));
                }
            }
        }
        AssignmentOp::AddToSet(term) => {
            if let Bound::Value(Value::Set(elements)) = value(term)? {
                for element in elements {
                    writer.cell(name, &element_path(&element), Some(Vec::new()));
                }
            }
        }
        AssignmentOp::AddToMap(term) => {
            if let Bound::Value(Value::Map(entries)) = value(term)? {
                for (key, value) in entries {
                    writer.cell(name, &element_path(&key), Some(value.serialize()));
                }
            }
        }
        AssignmentOp::RemoveFromSet(term) | AssignmentOp::RemoveMapKeys(term) => {
            if let Bound::Value(Value::Set(elements)) = value(term)? {
                for element in elements {
                    writer.cell(name, &element_path(&element), None);
                }
            }
        }
        AssignmentOp::RemoveFromList(term) => {
            if let Bound::Value(Value::List(removed)) = value(term)? {
                let removed: Vec<Vec<u8>> = removed.iter().map(Value::serialize).collect();
                for (path, cell) in target.current_cells(table, name)? {
                    if removed.contains(&cell.value) {
                        writer.cell(name, &path, None);
                    }
                }
            }
        }
        AssignmentOp::SetListElement {
            index,
            value: element,
        } => {
            let index = match value(index)? {
                Bound::Value(Value::Int(i)) if i >= 0 => i as usize,
                Bound::Value(Value::Int(i)) => {
                    return Err(CqlError::invalid(format!(
                        "Invalid negative list index {i}"
                    )))
                }
                _ => return Err(CqlError::invalid("Invalid null value for list index")),
            };
            let cells = target.current_cells(table, name)?;
            let path = list_element(&cells, index)?;
            let new_value = match value(element)? {
                Bound::Value(v) => Some(v.serialize()),
                _ => None,
            };
            writer.cell(name, path, new_value);
        }
        AssignmentOp::SetMapElement {
            key,
            value: element,
        } => {
            let key = value(key)?.into_value(name)?;
            let new_value = match value(element)? {
                Bound::Value(v) => Some(v.serialize()),
                _ => None,
            };
            writer.cell(name, &element_path(&key), new_value);
        }
        AssignmentOp::Increment { delta, negate } => match value(delta)? {
            Bound::Value(Value::Counter(n) | Value::Bigint(n)) => {
                let n = if *negate { n.wrapping_neg() } else { n };
                writer.cell(name, b"", Some(crate::counter::delta_bytes(n)));
            }
            Bound::Value(_) | Bound::Null => {
                return Err(CqlError::invalid(
                    "Invalid null value for counter increment/decrement",
                ))
            }
            Bound::Unset => {}
        },
        AssignmentOp::SetField {
            index,
            value: field_value,
        } => match value(field_value)? {
            Bound::Value(v) => writer.cell(
                name,
                &shoal_model::types::UserType::field_path(*index),
                Some(v.serialize()),
            ),
            Bound::Null => writer.cell(
                name,
                &shoal_model::types::UserType::field_path(*index),
                None,
            ),
            Bound::Unset => {}
        },
    }
    Ok(())
}
