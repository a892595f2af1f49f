//! Conditional statements (`IF NOT EXISTS`, `IF EXISTS`, `IF col = value`): read the
//! row, check the conditions, write only if they hold, and answer with `[applied]` and,
//! when not applied, the row's current values — as Cassandra does. Serialized per
//! partition on this node; clusters of more than one node refuse them until lightweight
//! transactions exist.

use super::{ModifyPlan, RowAddress};
use crate::values::{evaluate, Bindings, Bound};
use crate::{ensure, Coordinator, CqlError};
use shoal_cql::ast::{Conditions, Operator};
use shoal_cql::request::{Consistency, QueryParameters};
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::{CqlType, Value};
use shoal_replication::WriteType;
use shoal_storage::WriteBatch;

/// What a condition compares: the column's value, one element of a collection (`m['k']`,
/// `l[0]`), or one field of a user-defined type (`addr.zip`) — its type and its current
/// value.
fn condition_target(
    condition: &shoal_cql::ast::ColumnCondition,
    cql_type: &CqlType,
    whole: Option<Value>,
    bindings: Bindings<'_>,
) -> Result<(CqlType, Option<Value>), CqlError> {
    let name = &condition.column;
    if let Some(field) = &condition.field {
        let user_type = cql_type.as_udt().ok_or_else(|| {
            CqlError::invalid(format!(
                "Invalid field condition on {name}: it is not a user-defined type"
            ))
        })?;
        let position = user_type.field_index(field).ok_or_else(|| {
            CqlError::invalid(format!(
                "UDT column {name} does not have a field named {field}"
            ))
        })?;
        let actual = match whole {
            Some(Value::Tuple(mut fields)) if position < fields.len() => {
                fields.swap_remove(position)
            }
            _ => None,
        };
        return Ok((user_type.fields[position].1.clone(), actual));
    }
    let Some(element) = &condition.element else {
        return Ok((cql_type.clone(), whole));
    };
    match cql_type {
        CqlType::Map { key, value, .. } => {
            let key = evaluate(element, key, bindings, name)?.into_value(name)?;
            let actual = match whole {
                Some(Value::Map(entries)) => entries
                    .into_iter()
                    .find(|(k, _)| k.compare(&key).is_eq())
                    .map(|(_, v)| v),
                _ => None,
            };
            Ok((value.as_ref().clone(), actual))
        }
        CqlType::List {
            element: element_type,
            ..
        } => {
            let index = match evaluate(element, &CqlType::Int, bindings, name)? {
                Bound::Value(Value::Int(i)) if i >= 0 => i as usize,
                _ => return Err(CqlError::invalid(format!("Invalid list index for {name}"))),
            };
            let actual = match whole {
                Some(Value::List(mut elements)) if index < elements.len() => {
                    Some(elements.swap_remove(index))
                }
                _ => None,
            };
            Ok((element_type.as_ref().clone(), actual))
        }
        other => Err(CqlError::invalid(format!(
            "Invalid element condition on {name} of type {other}: only lists and maps have elements"
        ))),
    }
}

/// `IF NOT EXISTS`, `IF EXISTS`, `IF col = value`: read, check and write under a
/// per-partition lock on this node. (Cluster-wide, these become Paxos/Raft rounds.)
pub(super) async fn execute(
    coordinator: &Coordinator,
    plan: &ModifyPlan,
    conditions: &Conditions,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let table = &plan.table;
    let serial = parameters.serial_consistency.unwrap_or(Consistency::Serial);
    ensure(
        matches!(serial, Consistency::Serial | Consistency::LocalSerial),
        || {
            CqlError::invalid(format!("Invalid consistency for conditional update. Must be one of SERIAL or LOCAL_SERIAL, got {}", serial.name()))
        },
    )?;
    coordinator.check_consistency(&plan.keyspace, Consistency::Quorum, true)?;
    ensure(coordinator.member_count() <= 1, || {
        CqlError::invalid("Conditional statements (IF ...) need lightweight transactions across replicas, which Shoal supports on a single node only for now")
    })?;
    // Find the single row the statement touches by building it once into a scratch batch.
    let mut scratch = WriteBatch::new();
    // A single node: its own engine is the current state.
    let touched = plan.build(
        coordinator.engine().as_ref(),
        bindings,
        parameters.default_timestamp,
        &mut scratch,
    )?;
    let [RowAddress {
        token,
        partition_key,
        clustering,
    }] = touched.as_slice()
    else {
        return Err(CqlError::invalid("IN on the partition key or the clustering key is not supported with conditional updates"));
    };
    let stripe = (token.0 as u64 % coordinator.condition_locks.len() as u64) as usize;
    let _guard = coordinator.condition_locks[stripe].lock().await;
    let current = crate::select::read_row_values(
        coordinator,
        table,
        *token,
        partition_key,
        clustering.as_deref(),
    )?;
    let applied = match conditions {
        Conditions::NotExists => current.is_none(),
        Conditions::Exists => current.is_some(),
        Conditions::Columns(list) => {
            let mut all = true;
            for condition in list {
                let (index, column) = table.require_column(&condition.column)?;
                let whole = current.as_ref().and_then(|row| row[index].clone());
                let (receiver_type, actual) =
                    condition_target(condition, &column.cql_type, whole, bindings)?;
                let expected = evaluate(&condition.value, &receiver_type, bindings, &column.name)?;
                let holds = match (condition.operator, &expected, &actual) {
                    (Operator::Eq, Bound::Null, None) => true,
                    (Operator::NotEq, Bound::Null, Some(_)) => true,
                    (_, Bound::Value(expected), Some(actual)) => {
                        let order = actual.compare(expected);
                        match condition.operator {
                            Operator::Eq => order.is_eq(),
                            Operator::NotEq => !order.is_eq(),
                            Operator::Lt => order.is_lt(),
                            Operator::Lte => order.is_le(),
                            Operator::Gt => order.is_gt(),
                            Operator::Gte => order.is_ge(),
                            _ => {
                                return Err(CqlError::invalid("Unsupported operator in condition"))
                            }
                        }
                    }
                    (Operator::NotEq, Bound::Value(_), None) => true,
                    _ => false,
                };
                all &= holds;
            }
            all
        }
    };
    if applied {
        // Rebuild with a fresh timestamp so the write is newer than what was checked.
        let mut batch = WriteBatch::new();
        plan.build(
            coordinator.engine().as_ref(),
            bindings,
            parameters.default_timestamp,
            &mut batch,
        )?;
        coordinator
            .replication
            .write(batch, Consistency::One, WriteType::Simple)
            .await?;
    }
    let mut columns = vec![ColumnSpec {
        keyspace: table.keyspace.clone(),
        table: table.name.clone(),
        name: "[applied]".into(),
        cql_type: CqlType::Boolean,
    }];
    let mut cells: Vec<Option<Vec<u8>>> = vec![Some(Value::Boolean(applied).serialize())];
    if !applied {
        if let Some(row) = &current {
            for (column, value) in table.columns.iter().zip(row) {
                columns.push(ColumnSpec {
                    keyspace: table.keyspace.clone(),
                    table: table.name.clone(),
                    name: column.name.clone(),
                    cql_type: column.cql_type.clone(),
                });
                cells.push(value.as_ref().map(Value::serialize));
            }
        }
    }
    let mut buffer = RowsBuffer::new(columns.len());
    buffer.push_row(cells.iter().map(|c| c.as_deref()));
    Ok(ResultBody::Rows(Rows {
        columns,
        paging_state: None,
        skip_metadata: false,
        rows: buffer,
    }))
}
