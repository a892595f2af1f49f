//! BATCH: several modifications applied with one timestamp, as one replicated write.
//!
//! A batch is a `BEGIN BATCH ... APPLY BATCH` statement or a protocol BATCH message (of
//! prepared statements and statement texts, whose plans the coordinator resolves). Every
//! statement's plan is built into one [`WriteBatch`], stamped with the batch's
//! timestamp, `USING TIMESTAMP`, the protocol's default timestamp or the clock. A logged
//! batch is applied everywhere or nowhere (the replication layer's batchlog); an unlogged
//! one is applied partition by partition.

use super::ModifyPlan;
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, Coordinator, CqlError, Session};
use shoal_cql::ast::{Batch, BatchType};
use shoal_cql::request::{Consistency, QueryParameters};
use shoal_cql::response::ResultBody;
use shoal_model::{CqlType, Value, WriteTimestamp};
use shoal_storage::WriteBatch;

pub(crate) fn only_modifications() -> CqlError {
    CqlError::invalid(
        "Invalid statement in batch: only UPDATE, INSERT and DELETE statements are allowed.",
    )
}

/// A parsed `BEGIN BATCH ... APPLY BATCH`.
pub(crate) async fn execute_batch_statement(
    coordinator: &Coordinator,
    session: &Session,
    batch: &Batch,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let batch_timestamp = match &batch.using.timestamp {
        None => None,
        Some(term) => {
            match TypedTerm::new(term, &CqlType::Bigint, "[timestamp]")?.evaluate(bindings)? {
                Bound::Value(Value::Bigint(t)) => Some(t),
                Bound::Unset => None,
                _ => return Err(CqlError::invalid("Invalid null value of timestamp")),
            }
        }
    };
    let schema = coordinator.schema();
    let plans = batch
        .statements
        .iter()
        .map(|statement| ModifyPlan::new(coordinator, session, &schema, statement))
        .collect::<Result<Vec<_>, _>>()?;
    coordinator.authorize_writes(session, &plans.iter().collect::<Vec<_>>())?;
    let statements: Vec<(&ModifyPlan, Bindings<'_>)> =
        plans.iter().map(|plan| (plan, bindings)).collect();
    apply(
        coordinator,
        &statements,
        (parameters.consistency, parameters.serial_consistency),
        batch.batch_type,
        (batch_timestamp, parameters.default_timestamp),
    )
    .await
}

/// A counter batch: every statement's increments, each partition's applied by its leader.
async fn apply_counters(
    coordinator: &Coordinator,
    statements: &[(&ModifyPlan, Bindings<'_>)],
    consistency: Consistency,
    batch_timestamp: Option<i64>,
) -> Result<ResultBody, CqlError> {
    ensure(batch_timestamp.is_none(), || {
        CqlError::invalid("Cannot provide custom timestamp for counter BATCH")
    })?;
    let mut increments = WriteBatch::new();
    for (plan, bindings) in statements {
        coordinator.check_consistency(&plan.keyspace, consistency, true)?;
        super::check_counter_consistency(&plan.table, consistency)?;
        plan.build(
            coordinator.engine().as_ref(),
            *bindings,
            None,
            &mut increments,
        )?;
    }
    coordinator.increment(increments, consistency).await?;
    Ok(ResultBody::Void)
}

/// Builds every statement into one write; `levels` are the batch's consistency and serial
/// consistency (for conditions), `timestamps` are `BEGIN BATCH USING TIMESTAMP` and the
/// protocol's default timestamp. A batch with conditions is one lightweight transaction
/// ([`super::conditional::execute_batch`]).
pub(crate) async fn apply(
    coordinator: &Coordinator,
    statements: &[(&ModifyPlan, Bindings<'_>)],
    levels: (Consistency, Option<Consistency>),
    kind: BatchType,
    timestamps: (Option<i64>, Option<i64>),
) -> Result<ResultBody, CqlError> {
    let (consistency, serial) = levels;
    let (batch_timestamp, default_timestamp) = timestamps;
    if statements.iter().any(|(plan, _)| plan.conditions.is_some()) {
        return super::conditional::execute_batch(
            coordinator,
            statements,
            consistency,
            serial,
            batch_timestamp,
        )
        .await;
    }
    let counters = statements
        .iter()
        .filter(|(plan, _)| plan.counter_update)
        .count();
    if kind == BatchType::Counter {
        ensure(counters == statements.len(), || {
            CqlError::invalid("Cannot include non-counter statement in a counter batch")
        })?;
    }
    if kind == BatchType::Logged {
        ensure(counters == 0, || {
            CqlError::invalid("Cannot include a counter statement in a logged batch")
        })?;
    }
    ensure(counters == 0 || counters == statements.len(), || {
        CqlError::invalid("Counter and non-counter mutations cannot exist in the same batch")
    })?;
    if counters > 0 {
        return apply_counters(coordinator, statements, consistency, batch_timestamp).await;
    }
    let logged = kind == BatchType::Logged;
    let mut batch = WriteBatch::new();
    // One timestamp for every statement of the batch, as in Cassandra.
    let timestamp = Some(
        batch_timestamp
            .or(default_timestamp)
            .unwrap_or_else(|| WriteTimestamp::now().0),
    );
    for (plan, bindings) in statements {
        coordinator.check_consistency(&plan.keyspace, consistency, true)?;
        ensure(
            !(plan.has_own_timestamp && batch_timestamp.is_some()),
            || CqlError::invalid("Timestamp must be set either on BATCH or individual statements"),
        )?;
        let current = plan
            .read_current(coordinator, *bindings, consistency)
            .await?;
        plan.build(
            current.engine(coordinator),
            *bindings,
            timestamp,
            &mut batch,
        )?;
    }
    if !batch.is_empty() {
        coordinator
            .replication
            .write_batch(batch, consistency, logged)
            .await?;
    }
    Ok(ResultBody::Void)
}
