//! Conditional statements (`IF NOT EXISTS`, `IF EXISTS`, `IF col = value`, `IF col IN
//! (…)`): lightweight transactions. Each runs a Paxos round on its partition's replicas
//! ([`shoal_replication::paxos`]) — on one node or many alike: the row is read at a
//! quorum inside the round, the conditions checked, and the update proposed only when
//! they hold. The answer is `[applied]` and, when not applied, the row's current values,
//! as Cassandra gives them.

use super::{CurrentState, ModifyPlan, RowAddress};
use crate::values::{evaluate, Bindings, Bound};
use crate::{ensure, Coordinator, CqlError};
use shoal_cql::ast::{Conditions, Operator};
use shoal_cql::request::{Consistency, QueryParameters};
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::{CqlType, Token, Value};
use shoal_replication::paxos::{PaxosKey, ProposalOutcome, CAS_CONTENTION_TIMEOUT};
use shoal_replication::PartitionSource;
use shoal_storage::{MemoryEngine, WriteBatch};

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

/// The consistency level the Paxos phase of a conditional statement uses: the request's
/// serial consistency, `SERIAL` by default.
pub(crate) fn serial_consistency(parameters: &QueryParameters) -> Result<Consistency, CqlError> {
    let serial = parameters.serial_consistency.unwrap_or(Consistency::Serial);
    ensure(serial.is_serial(), || {
        CqlError::invalid(format!("Invalid consistency for conditional update. Must be one of SERIAL or LOCAL_SERIAL, got {}", serial.name()))
    })?;
    Ok(serial)
}

/// The level a decided update is committed at: the request's consistency, which may not
/// be a serial one (Cassandra's message).
pub(crate) fn commit_consistency(parameters: &QueryParameters) -> Result<Consistency, CqlError> {
    let consistency = parameters.consistency;
    ensure(!consistency.is_serial(), || {
        CqlError::invalid(format!("{} is not supported as conditional update commit consistency. Use ANY if you mean \"make sure it is accepted but I don't care how many replicas commit it for non-SERIAL reads\"", consistency.name()))
    })?;
    Ok(consistency)
}

/// Every column's current value in one row, by position in the table.
type RowValues = Vec<Option<Value>>;

/// Whether `conditions` hold for the row's current values (`None`: no such row).
fn conditions_hold(
    table: &shoal_schema::TableMetadata,
    conditions: &Conditions,
    current: Option<&Vec<Option<Value>>>,
    bindings: Bindings<'_>,
) -> Result<bool, CqlError> {
    Ok(match conditions {
        Conditions::NotExists => current.is_none(),
        Conditions::Exists => current.is_some(),
        Conditions::Columns(list) => {
            let mut all = true;
            for condition in list {
                let (index, column) = table.require_column(&condition.column)?;
                let whole = current.and_then(|row| row[index].clone());
                let (receiver_type, actual) =
                    condition_target(condition, &column.cql_type, whole, bindings)?;
                all &= condition_holds(condition, &receiver_type, actual.as_ref(), bindings)?;
            }
            all
        }
    })
}

/// One `column op value` (or `column IN (…)`) against the column's current value.
fn condition_holds(
    condition: &shoal_cql::ast::ColumnCondition,
    receiver_type: &CqlType,
    actual: Option<&Value>,
    bindings: Bindings<'_>,
) -> Result<bool, CqlError> {
    let name = &condition.column;
    let compare = |expected: &Bound| -> Result<bool, CqlError> {
        Ok(match (condition.operator, expected, actual) {
            (Operator::Eq | Operator::In, Bound::Null, None) => true,
            (Operator::NotEq, Bound::Null, Some(_)) => true,
            (operator, Bound::Value(expected), Some(actual)) => {
                let order = actual.compare(expected);
                match operator {
                    Operator::Eq | Operator::In => order.is_eq(),
                    Operator::NotEq => !order.is_eq(),
                    Operator::Lt => order.is_lt(),
                    Operator::Lte => order.is_le(),
                    Operator::Gt => order.is_gt(),
                    Operator::Gte => order.is_ge(),
                    _ => return Err(CqlError::invalid("Unsupported operator in condition")),
                }
            }
            (Operator::NotEq, Bound::Value(_), None) => true,
            (Operator::Lt | Operator::Lte | Operator::Gt | Operator::Gte, Bound::Null, _) => {
                let symbol = match condition.operator {
                    Operator::Lt => "<",
                    Operator::Lte => "<=",
                    Operator::Gt => ">",
                    _ => ">=",
                };
                return Err(CqlError::invalid(format!(
                    "Invalid comparison with null for operator \"{symbol}\""
                )));
            }
            _ => false,
        })
    };
    if condition.operator != Operator::In {
        let expected = evaluate(&condition.value, receiver_type, bindings, name)?;
        return compare(&expected);
    }
    // `IN (a, b, …)` or `IN ?` (a list bound whole).
    let candidates: Vec<Bound> = match &condition.value {
        shoal_cql::ast::Term::List(items) | shoal_cql::ast::Term::Tuple(items) => items
            .iter()
            .map(|item| evaluate(item, receiver_type, bindings, name))
            .collect::<Result<_, _>>()?,
        other => {
            let list_type = CqlType::List {
                element: Box::new(receiver_type.clone()),
                frozen: false,
            };
            match evaluate(other, &list_type, bindings, name)? {
                Bound::Value(Value::List(items)) => items.into_iter().map(Bound::Value).collect(),
                Bound::Null => vec![Bound::Null],
                _ => return Err(CqlError::invalid(format!("Invalid IN condition on {name}"))),
            }
        }
    };
    for candidate in &candidates {
        if compare(candidate)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The columns a not-applied answer shows, by position in the table (`None`: all of
/// them), as Cassandra picks them: every column after `IF EXISTS` / `IF NOT EXISTS`,
/// else the conditioned columns — and in a batch the primary key too, so that rows can
/// be told apart.
fn shown_columns(
    table: &shoal_schema::TableMetadata,
    conditions: &[&Conditions],
    batch: bool,
) -> Result<Option<Vec<usize>>, CqlError> {
    let mut shown = Vec::new();
    for conditions in conditions {
        let Conditions::Columns(list) = conditions else {
            return Ok(None);
        };
        for condition in list {
            shown.push(table.require_column(&condition.column)?.0);
        }
    }
    if batch {
        shown.extend(
            table
                .partition_key()
                .chain(table.clustering())
                .filter_map(|column| table.column_index(&column.name)),
        );
    }
    shown.sort_unstable();
    shown.dedup();
    Ok(Some(shown))
}

/// The `[applied]` answer: alone when applied (or when no row the conditions read
/// exists); otherwise one row per existing row with the `shown` columns' current values,
/// as Cassandra returns them.
fn applied_result(
    table: &shoal_schema::TableMetadata,
    applied: bool,
    current: &[&Vec<Option<Value>>],
    shown: Option<&[usize]>,
) -> ResultBody {
    let all: Vec<usize> = (0..table.columns.len()).collect();
    let shown = shown.unwrap_or(&all);
    let mut columns = vec![ColumnSpec {
        keyspace: table.keyspace.clone(),
        table: table.name.clone(),
        name: "[applied]".into(),
        cql_type: CqlType::Boolean,
    }];
    let applied_cell = Some(Value::Boolean(applied).serialize());
    if applied || current.is_empty() {
        let mut buffer = RowsBuffer::new(1);
        buffer.push_row(std::iter::once(applied_cell.as_deref()));
        return ResultBody::Rows(Rows {
            columns,
            paging_state: None,
            skip_metadata: false,
            rows: buffer,
        });
    }
    columns.extend(shown.iter().map(|&index| {
        let column = &table.columns[index];
        ColumnSpec {
            keyspace: table.keyspace.clone(),
            table: table.name.clone(),
            name: column.name.clone(),
            cql_type: column.cql_type.clone(),
        }
    }));
    let mut buffer = RowsBuffer::new(columns.len());
    for row in current {
        let cells: Vec<Option<Vec<u8>>> = std::iter::once(applied_cell.clone())
            .chain(
                shown
                    .iter()
                    .map(|&index| row[index].as_ref().map(Value::serialize)),
            )
            .collect();
        buffer.push_row(cells.iter().map(|c| c.as_deref()));
    }
    ResultBody::Rows(Rows {
        columns,
        paging_state: None,
        skip_metadata: false,
        rows: buffer,
    })
}

/// A conditional statement may not carry its own timestamp: the ballot is its timestamp.
fn check_no_custom_timestamp(plan: &ModifyPlan, message: &str) -> Result<(), CqlError> {
    ensure(!plan.has_own_timestamp, || CqlError::invalid(message))
}

/// A SERIAL read whose Paxos round timed out reports a read timeout, as Cassandra does.
pub(crate) fn serial_read_error(error: CqlError) -> CqlError {
    match error.code {
        shoal_cql::ErrorCode::WriteTimeout {
            consistency,
            received,
            block_for,
            ..
        } => CqlError::new(
            shoal_cql::ErrorCode::ReadTimeout {
                consistency,
                received,
                block_for,
                data_present: false,
            },
            error.message,
        ),
        _ => error,
    }
}

/// The one row a conditional statement touches (its conditions read it). Statements
/// that read lists before writing name it in their WHERE clause; the others are built
/// once, into nothing, to see which row they write.
fn touched_row(plan: &ModifyPlan, bindings: Bindings<'_>) -> Result<RowAddress, CqlError> {
    let several =
        || CqlError::invalid("IN on the partition key is not supported with conditional updates");
    if let Some(where_plan) = plan.reads_lists_of() {
        let restrictions = where_plan.bind(&plan.table, bindings)?;
        let [(token, partition_key)] =
            <[_; 1]>::try_from(super::partitions(&plan.table, &restrictions)?)
                .map_err(|_| several())?;
        let clustering = match restrictions.clustering_prefixes.as_slice() {
            [] => None,
            [clustering] => Some(clustering.clone()),
            _ => return Err(several()),
        };
        return Ok(RowAddress {
            token,
            partition_key,
            clustering,
        });
    }
    let mut scratch = WriteBatch::new();
    let touched = plan.build(&MemoryEngine::new(), bindings, None, &mut scratch)?;
    <[RowAddress; 1]>::try_from(touched)
        .map(|[row]| row)
        .map_err(|_| several())
}

/// Reads the partition at a quorum inside a Paxos round: the engine to read it from.
pub(crate) async fn read_in_round(
    coordinator: &Coordinator,
    table: &shoal_schema::TableMetadata,
    partitions: &[(Token, Vec<u8>)],
    serial: Consistency,
) -> Result<CurrentState, CqlError> {
    match coordinator
        .replication
        .read_partitions(table.id, partitions, serial.serial_quorum())
        .await?
    {
        PartitionSource::Local(_) => Ok(CurrentState::Local),
        PartitionSource::Merged(engine) => Ok(CurrentState::Read(engine)),
        PartitionSource::TooLarge => Err(CqlError::invalid(format!(
            "Conditional statements and SERIAL reads on partitions of more than {} cells are not supported by Shoal yet",
            shoal_replication::read::GATHER_LIMIT_CELLS
        ))),
    }
}

/// A condition to check inside a round: the statement's conditions, the row they read
/// (by clustering; `None`: the static row) and the statement's bound values.
type Check<'a> = (&'a Conditions, Option<Vec<u8>>, Bindings<'a>);

/// What one lightweight transaction does: on which partition, which conditions it checks,
/// which statements it applies when they hold, at which levels.
struct Transaction<'a> {
    table: &'a shoal_schema::TableMetadata,
    key: PaxosKey,
    checks: Vec<Check<'a>>,
    statements: &'a [(&'a ModifyPlan, Bindings<'a>)],
    /// The columns a not-applied answer shows.
    shown: Option<Vec<usize>>,
    serial: Consistency,
    consistency: Consistency,
}

impl Transaction<'_> {
    /// Paxos rounds until one decides: prepare, read the partition at a quorum, check
    /// every condition against its row; not applied → the rows' current values; applied
    /// → every statement built with the ballot's time, proposed and committed (a
    /// preempted proposal starts a new round). The transactions this node runs on the
    /// partition go one at a time, in arrival order.
    async fn run(&self, coordinator: &Coordinator) -> Result<ResultBody, CqlError> {
        let (table, key) = (self.table, &self.key);
        let deadline = tokio::time::Instant::now() + CAS_CONTENTION_TIMEOUT;
        // A turn that has not come by the deadline leaves it passed: the prepare below
        // then answers with the contention timeout (`WriteTimeout`, `CAS`).
        let mut turn = coordinator.replication.paxos_turn(key, deadline).await;
        loop {
            let round = coordinator
                .replication
                .paxos_prepare(key, self.serial, deadline, &mut turn)
                .await?;
            let partition = [(key.token, key.partition_key.clone())];
            let state = match round.partition {
                // Read by the quorum as it promised (Paxos v2): no read round trip.
                Some(cells) => CurrentState::from_cells(cells)?,
                None => read_in_round(coordinator, table, &partition, self.serial).await?,
            };
            let engine = state.engine(coordinator);
            let mut applied = true;
            // The rows the conditions read that exist, once each, by clustering.
            let mut rows: Vec<(Option<Vec<u8>>, RowValues)> = Vec::new();
            for (conditions, clustering, bindings) in &self.checks {
                let current = crate::select::read_row_values(
                    engine,
                    table,
                    key.token,
                    &key.partition_key,
                    clustering.as_deref(),
                )?;
                applied &= conditions_hold(table, conditions, current.as_ref(), *bindings)?;
                if let Some(values) = current {
                    if !rows.iter().any(|(seen, _)| seen == clustering) {
                        rows.push((clustering.clone(), values));
                    }
                }
            }
            if !applied {
                let current: Vec<&RowValues> = rows.iter().map(|(_, values)| values).collect();
                return Ok(applied_result(
                    table,
                    false,
                    &current,
                    self.shown.as_deref(),
                ));
            }
            let mut update = WriteBatch::new();
            for (plan, bindings) in self.statements {
                plan.build(engine, *bindings, Some(round.ballot.micros), &mut update)?;
            }
            drop(state);
            let outcome = coordinator
                .replication
                .paxos_propose(
                    key,
                    round.ballot,
                    update.into_entries(),
                    self.serial,
                    self.consistency,
                    &mut turn,
                )
                .await?;
            match outcome {
                ProposalOutcome::Committed => return Ok(applied_result(table, true, &[], None)),
                ProposalOutcome::Preempted => continue,
            }
        }
    }
}

/// `IF NOT EXISTS`, `IF EXISTS`, `IF col = value`: a lightweight transaction on the
/// row's partition ([`shoal_replication::paxos`]): a Paxos prepare, a quorum read of the
/// row, the check, and — when the conditions hold — a proposal of the update written
/// with the ballot's time, committed at the request's consistency level.
pub(super) async fn execute(
    coordinator: &Coordinator,
    plan: &ModifyPlan,
    conditions: &Conditions,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let table = &plan.table;
    let serial = serial_consistency(parameters)?;
    let consistency = commit_consistency(parameters)?;
    coordinator.check_consistency(&plan.keyspace, consistency, true)?;
    check_no_custom_timestamp(
        plan,
        "Cannot provide custom timestamp for conditional updates",
    )?;
    let row = touched_row(plan, bindings)?;
    let statements = [(plan, bindings)];
    Transaction {
        table,
        key: PaxosKey {
            table: table.id,
            token: row.token,
            partition_key: row.partition_key,
        },
        checks: vec![(conditions, row.clustering, bindings)],
        statements: &statements,
        shown: shown_columns(table, &[conditions], false)?,
        serial,
        consistency,
    }
    .run(coordinator)
    .await
}

/// A BATCH with conditions: one lightweight transaction on the one partition every
/// statement writes. Every statement's conditions are checked against its row; when all
/// hold, every statement is applied, written with the ballot's time.
pub(super) async fn execute_batch(
    coordinator: &Coordinator,
    statements: &[(&ModifyPlan, Bindings<'_>)],
    consistency: Consistency,
    serial: Option<Consistency>,
    batch_timestamp: Option<i64>,
) -> Result<ResultBody, CqlError> {
    let parameters = QueryParameters {
        consistency,
        serial_consistency: serial,
        ..QueryParameters::default()
    };
    let serial = serial_consistency(&parameters)?;
    let consistency = commit_consistency(&parameters)?;
    ensure(batch_timestamp.is_none(), || {
        CqlError::invalid("Cannot provide custom timestamp for conditional BATCH")
    })?;
    let Some((first, _)) = statements.first() else {
        return Ok(ResultBody::Void);
    };
    let table = &first.table;
    let mut partition: Option<(Token, Vec<u8>)> = None;
    let mut checks: Vec<Check<'_>> = Vec::new();
    for (plan, bindings) in statements {
        ensure(plan.table.id == table.id, || {
            CqlError::invalid("Batch with conditions cannot span multiple tables")
        })?;
        ensure(!plan.counter_update, || {
            CqlError::invalid("Cannot include a counter statement in a conditional BATCH")
        })?;
        check_no_custom_timestamp(
            plan,
            "Cannot provide custom timestamp for conditional BATCH",
        )?;
        coordinator.check_consistency(&plan.keyspace, consistency, true)?;
        let touched: Vec<(Token, Vec<u8>)> = match plan.reads_lists_of() {
            Some(where_plan) => {
                super::partitions(&plan.table, &where_plan.bind(&plan.table, *bindings)?)?
            }
            None => {
                let mut scratch = WriteBatch::new();
                let rows = plan.build(&MemoryEngine::new(), *bindings, None, &mut scratch)?;
                rows.into_iter()
                    .map(|row| (row.token, row.partition_key))
                    .collect()
            }
        };
        for this in touched {
            match &partition {
                None => partition = Some(this),
                Some(seen) => ensure(*seen == this, || {
                    CqlError::invalid("Batch with conditions cannot span multiple partitions")
                })?,
            }
        }
        if let Some(conditions) = &plan.conditions {
            let row = touched_row(plan, *bindings)?;
            checks.push((conditions, row.clustering, *bindings));
        }
    }
    let Some((token, partition_key)) = partition else {
        return Ok(applied_result(table, true, &[], None));
    };
    let conditions: Vec<&Conditions> = checks.iter().map(|(c, _, _)| *c).collect();
    let shown = shown_columns(table, &conditions, true)?;
    Transaction {
        table,
        key: PaxosKey {
            table: table.id,
            token,
            partition_key,
        },
        checks,
        statements,
        shown,
        serial,
        consistency,
    }
    .run(coordinator)
    .await
}
