//! INSERT, UPDATE, DELETE and BATCH: from statements to cell mutations.
//!
//! [`ModifyPlan::new`] checks a statement against its table once — which columns, which
//! operations on them, which rows or ranges its WHERE clause names — leaving only values
//! to bind. [`ModifyPlan::build`] turns one execution into cells in a [`WriteBatch`] (see
//! [`shoal_model::keys`] for where each cell lives): values, TTL'd values and tombstones,
//! all stamped with the statement's write timestamp. Nothing is read first, except where
//! CQL itself requires it: list element assignment and removal read the list through the
//! replication layer at the statement's consistency level ([`ModifyPlan::read_current`],
//! as Cassandra does), and conditional `IF` statements read the row. The batch goes to
//! the replication layer at the request's consistency level.
//!
//! - [`rows`] writes the cells of one row; [`insert`], [`update`] and [`delete`] plan and
//!   build each statement kind;
//! - [`conditional`] runs `IF` statements; [`batch`] runs BATCH.

pub(crate) mod batch;
mod conditional;
mod delete;
mod insert;
mod rows;
mod update;

use crate::class::StatementClass;
use crate::restrictions::{Restrictions, WherePlan};
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, Coordinator, CqlError, Session};
use delete::DeletePlan;
use insert::InsertPlan;
use rows::WriteContext;
use shoal_cql::ast::{Conditions, Statement, Using};
use shoal_cql::request::Consistency;
use shoal_cql::request::QueryParameters;
use shoal_cql::response::ResultBody;
use shoal_model::{keys, CqlType, Token, Value, WriteTimestamp};
use shoal_replication::{PartitionSource, WriteType};
use shoal_schema::{ColumnKind, KeyspaceMetadata, TableMetadata};
use shoal_storage::{Engine, WriteBatch};
use std::sync::Arc;
use update::UpdatePlan;

pub(crate) use conditional::{read_in_round, serial_read_error};

/// Cassandra's maximum TTL (20 years).
pub const MAX_TTL_SECONDS: i32 = 630_720_000;

/// A row a statement wrote (`clustering: None` for a static row or a whole partition).
pub(crate) struct RowAddress {
    pub(crate) token: Token,
    pub(crate) partition_key: Vec<u8>,
    pub(crate) clustering: Option<Vec<u8>>,
}

#[derive(Debug)]
enum ModifyKind {
    Insert(InsertPlan),
    Update(UpdatePlan),
    Delete(DeletePlan),
}

/// What a statement that reads before it writes sees of its partitions now.
pub(crate) enum CurrentState {
    /// This node's engine (nothing needs reading, or this replica may answer alone).
    Local,
    /// The partitions as reconciled from their replicas.
    Read(shoal_storage::MemoryEngine),
}

impl CurrentState {
    /// Partitions as their replicas' reconciled cells give them.
    pub(crate) fn from_cells(cells: shoal_replication::Cells) -> Result<CurrentState, CqlError> {
        let engine = shoal_storage::MemoryEngine::new();
        engine
            .write(&shoal_storage::WriteBatch::from(cells))
            .map_err(|e| CqlError::server(e.to_string()))?;
        Ok(CurrentState::Read(engine))
    }

    pub(crate) fn engine<'a>(&'a self, coordinator: &'a Coordinator) -> &'a dyn Engine {
        match self {
            CurrentState::Local => coordinator.engine().as_ref(),
            CurrentState::Read(engine) => engine,
        }
    }
}

/// An INSERT, UPDATE or DELETE checked against the schema.
pub(crate) struct ModifyPlan {
    pub(crate) table: Arc<TableMetadata>,
    pub(crate) keyspace: Arc<KeyspaceMetadata>,
    kind: ModifyKind,
    timestamp: Option<TypedTerm>,
    ttl: Option<TypedTerm>,
    /// `IF ...`: the write becomes a read, a check and a write.
    conditions: Option<Conditions>,
    /// The statement carries its own `USING TIMESTAMP` (not allowed in a batch that
    /// has one).
    pub(crate) has_own_timestamp: bool,
    /// A write, or a conditional write (a read, a check, then maybe a write).
    pub(crate) class: StatementClass,
    /// An UPDATE of a counter table: its cells are increments for the counters' leaders
    /// ([`crate::counter`]).
    pub(crate) counter_update: bool,
}

fn statement_parts(
    statement: &Statement,
) -> Result<(&shoal_cql::ast::QualifiedName, &Using, Option<Conditions>), CqlError> {
    Ok(match statement {
        Statement::Insert(insert) => (
            &insert.table,
            &insert.using,
            insert.if_not_exists.then_some(Conditions::NotExists),
        ),
        Statement::Update(update) => (&update.table, &update.using, update.conditions.clone()),
        Statement::Delete(delete) => (&delete.table, &delete.using, delete.conditions.clone()),
        _ => {
            return Err(CqlError::invalid(
                "Only INSERT, UPDATE and DELETE are modifications",
            ))
        }
    })
}

impl ModifyPlan {
    pub(crate) fn new(
        coordinator: &Coordinator,
        session: &Session,
        schema: &shoal_schema::Schema,
        statement: &Statement,
    ) -> Result<ModifyPlan, CqlError> {
        let (name, using, conditions) = statement_parts(statement)?;
        let keyspace_name = coordinator.keyspace_for(session, &name.keyspace)?;
        let keyspace = Arc::new(schema.keyspace(&keyspace_name)?.clone());
        let table = Arc::clone(schema.table(&keyspace_name, &name.name)?);
        ensure(!table.is_virtual, || {
            CqlError::new(
                crate::ErrorCode::Unauthorized,
                format!("{keyspace_name} keyspace is not user-modifiable"),
            )
        })?;
        let kind = match statement {
            Statement::Insert(insert) => ModifyKind::Insert(InsertPlan::new(&table, insert)?),
            Statement::Update(update) => ModifyKind::Update(UpdatePlan::new(&table, update)?),
            Statement::Delete(delete) => ModifyKind::Delete(DeletePlan::new(&table, delete)?),
            _ => return Err(CqlError::invalid("not a modification")),
        };
        let counter_update = table.is_counter() && matches!(kind, ModifyKind::Update(_));
        if table.is_counter() {
            ensure(conditions.is_none(), || {
                CqlError::invalid("Conditions on counters are not supported")
            })?;
            ensure(using.timestamp.is_none(), || {
                CqlError::invalid("Cannot provide custom timestamp for counter updates")
            })?;
        }
        if counter_update {
            ensure(using.ttl.is_none(), || {
                CqlError::invalid("Cannot provide custom TTL for counter updates")
            })?;
        }
        let timestamp = using
            .timestamp
            .as_ref()
            .map(|term| TypedTerm::new(term, &CqlType::Bigint, "[timestamp]"))
            .transpose()?;
        let ttl = using
            .ttl
            .as_ref()
            .map(|term| TypedTerm::new(term, &CqlType::Int, "[ttl]"))
            .transpose()?;
        Ok(ModifyPlan {
            table,
            keyspace,
            kind,
            class: if conditions.is_some() {
                StatementClass::ConditionalWrite
            } else {
                StatementClass::Write
            },
            has_own_timestamp: timestamp.is_some(),
            timestamp,
            ttl,
            conditions,
            counter_update,
        })
    }

    fn timestamp(&self, bindings: Bindings<'_>) -> Result<Option<i64>, CqlError> {
        match self
            .timestamp
            .as_ref()
            .map(|t| t.evaluate(bindings))
            .transpose()?
        {
            None | Some(Bound::Unset) => Ok(None),
            Some(Bound::Value(Value::Bigint(t))) => Ok(Some(t)),
            Some(_) => Err(CqlError::invalid("Invalid null value of timestamp")),
        }
    }

    fn ttl(&self, bindings: Bindings<'_>) -> Result<i32, CqlError> {
        let default = self.table.options.default_time_to_live;
        match self
            .ttl
            .as_ref()
            .map(|t| t.evaluate(bindings))
            .transpose()?
        {
            None | Some(Bound::Unset) => Ok(default),
            Some(Bound::Value(Value::Int(ttl))) => {
                ensure(ttl >= 0, || {
                    CqlError::invalid(format!(
                        "A TTL must be greater or equal to 0, but was {ttl}"
                    ))
                })?;
                ensure(ttl <= MAX_TTL_SECONDS, || {
                    CqlError::invalid(format!(
                        "ttl is too large. requested ({ttl}) maximum ({MAX_TTL_SECONDS})"
                    ))
                })?;
                Ok(ttl)
            }
            Some(_) => Err(CqlError::invalid("Invalid null value of TTL")),
        }
    }

    /// The WHERE clause of the rows whose current list elements building the statement
    /// needs (`l[i] = v`, `l = l - [...]`, `DELETE l[i]`); `None` when it reads nothing.
    fn reads_lists_of(&self) -> Option<&WherePlan> {
        match &self.kind {
            ModifyKind::Insert(_) => None,
            ModifyKind::Update(update) => update.reads_lists().then_some(&update.where_plan),
            ModifyKind::Delete(delete) => delete.reads_lists().then_some(&delete.where_plan),
        }
    }

    /// Reads the partitions the statement writes when it must see them first (list
    /// element operations), through the replication layer at `consistency` — never just
    /// this node's engine, which need not be a replica or up to date.
    pub(crate) async fn read_current(
        &self,
        coordinator: &Coordinator,
        bindings: Bindings<'_>,
        consistency: Consistency,
    ) -> Result<CurrentState, CqlError> {
        let Some(where_plan) = self.reads_lists_of() else {
            return Ok(CurrentState::Local);
        };
        // Boxed: only list element operations read, and unboxed their read would make every
        // plain write's future as large as it (moved whole at every await above it).
        Box::pin(self.read_lists(where_plan, coordinator, bindings, consistency)).await
    }

    /// [`Self::read_current`]'s read of the partitions `where_plan` names.
    async fn read_lists(
        &self,
        where_plan: &WherePlan,
        coordinator: &Coordinator,
        bindings: Bindings<'_>,
        consistency: Consistency,
    ) -> Result<CurrentState, CqlError> {
        let restrictions = where_plan.bind(&self.table, bindings)?;
        let partitions = partitions(&self.table, &restrictions)?;
        // A write at ANY reads what one replica has.
        let consistency = match consistency {
            Consistency::Any => Consistency::One,
            level => level,
        };
        match coordinator
            .replication
            .read_partitions(self.table.id, &partitions, consistency)
            .await?
        {
            PartitionSource::Local(_) => Ok(CurrentState::Local),
            PartitionSource::Merged(engine) => Ok(CurrentState::Read(engine)),
            PartitionSource::TooLarge => Err(CqlError::invalid(
                "List element operations on a partition too large to read whole from its replicas are not supported by Shoal yet; use ONE on a replica or rewrite the whole list",
            )),
        }
    }

    /// Builds one execution's cells into `batch`; `default_timestamp` is the protocol's
    /// (or the batch's) when the statement has none of its own.
    pub(crate) fn build(
        &self,
        current: &dyn Engine,
        bindings: Bindings<'_>,
        default_timestamp: Option<i64>,
        batch: &mut WriteBatch,
    ) -> Result<Vec<RowAddress>, CqlError> {
        let table = &self.table;
        // One clock read gives the statement's timestamp (unless it has its own) and the
        // "now" its TTL and tombstones count from.
        let wall_micros = shoal_model::timestamp::now_micros();
        let timestamp = self
            .timestamp(bindings)?
            .or(default_timestamp)
            .map(WriteTimestamp)
            .unwrap_or_else(|| WriteTimestamp::issue(wall_micros));
        // Deletions never expire.
        let ttl_seconds = match self.kind {
            ModifyKind::Delete(_) => 0,
            _ => self.ttl(bindings)?,
        };
        let now_seconds = wall_micros / 1_000_000;
        ensure(
            now_seconds + ttl_seconds as i64 <= shoal_model::cell::MAX_DELETION_TIME,
            || {
                CqlError::invalid(format!(
                    "Request on table {}.{} with ttl of {ttl_seconds} seconds exceeds maximum supported expiration date of 2106-02-07T06:28:15+00:00. Use a lower TTL.",
                    table.keyspace, table.name
                ))
            },
        )?;
        let ctx = WriteContext {
            table,
            timestamp,
            ttl_seconds,
            now_seconds,
        };
        match &self.kind {
            ModifyKind::Insert(insert) => insert.build(&ctx, bindings, batch),
            ModifyKind::Update(update) => update.build(current, &ctx, bindings, batch),
            ModifyKind::Delete(delete) => delete.build(current, &ctx, bindings, batch),
        }
    }

    /// Runs the statement: conditional statements through [`conditional`], others as one
    /// replicated write at the request's consistency level.
    pub(crate) async fn execute(
        &self,
        coordinator: &Coordinator,
        parameters: &QueryParameters,
        bindings: Bindings<'_>,
    ) -> Result<ResultBody, CqlError> {
        if let (StatementClass::ConditionalWrite, Some(conditions)) = (self.class, &self.conditions)
        {
            // Boxed: a conditional write's future is large, and every plain write's future
            // would be as large as this branch (moved whole at every await above it).
            return Box::pin(conditional::execute(
                coordinator,
                self,
                conditions,
                parameters,
                bindings,
            ))
            .await;
        }
        coordinator.check_consistency(&self.keyspace, parameters.consistency, true)?;
        if self.counter_update {
            check_counter_consistency(&self.table, parameters.consistency)?;
            let mut increments = WriteBatch::new();
            self.build(
                coordinator.engine().as_ref(),
                bindings,
                None,
                &mut increments,
            )?;
            coordinator
                .increment(increments, parameters.consistency)
                .await?;
            return Ok(ResultBody::Void);
        }
        let current = self
            .read_current(coordinator, bindings, parameters.consistency)
            .await?;
        let mut batch = WriteBatch::new();
        self.build(
            current.engine(coordinator),
            bindings,
            parameters.default_timestamp,
            &mut batch,
        )?;
        coordinator
            .replication
            .write(batch, parameters.consistency, WriteType::Simple)
            .await?;
        Ok(ResultBody::Void)
    }
}

/// Counter increments are not idempotent: `ANY` (a hint standing for the write) is
/// refused, as in Cassandra.
pub(crate) fn check_counter_consistency(
    table: &TableMetadata,
    consistency: Consistency,
) -> Result<(), CqlError> {
    ensure(consistency != Consistency::Any, || {
        CqlError::invalid(format!(
            "Consistency level ANY is not yet supported for counter table {}",
            table.name
        ))
    })
}

/// Refuses a WHERE clause that filters (only key columns may be restricted).
fn check_no_filters(table: &TableMetadata, where_plan: &WherePlan) -> Result<(), CqlError> {
    if let Some(index) = where_plan.first_filter_column() {
        let column = &table.columns[index];
        let message = match column.kind {
            ColumnKind::Regular | ColumnKind::Static => format!("Non PRIMARY KEY columns found in where clause: {}", column.name),
            _ => format!("PRIMARY KEY column \"{}\" cannot be restricted as preceding column is not restricted", column.name),
        };
        return Err(CqlError::invalid(message));
    }
    Ok(())
}

/// Refuses a WHERE clause that does not name its partitions.
fn check_partitions_named(table: &TableMetadata, where_plan: &WherePlan) -> Result<(), CqlError> {
    if !where_plan.names_partitions() {
        let missing: Vec<&str> = table.partition_key().map(|c| c.name.as_str()).collect();
        return Err(CqlError::invalid(format!(
            "Some partition key parts are missing: {}",
            missing.join(", ")
        )));
    }
    ensure(!where_plan.has_token_bounds(), || {
        CqlError::invalid(
            "The token function cannot be used in WHERE clauses for UPDATE and DELETE statements",
        )
    })
}

fn missing_clustering(table: &TableMetadata, prefix_columns: usize) -> CqlError {
    let missing: Vec<&str> = table
        .clustering()
        .skip(prefix_columns)
        .map(|c| c.name.as_str())
        .collect();
    CqlError::invalid(format!(
        "Some clustering keys are missing: {}",
        missing.join(", ")
    ))
}

/// The partitions a modification writes.
fn partitions(
    table: &TableMetadata,
    restrictions: &Restrictions,
) -> Result<Vec<(Token, Vec<u8>)>, CqlError> {
    let keys = restrictions.partition_keys.as_deref().unwrap_or_default();
    for key in keys {
        ensure(key.len() <= u16::MAX as usize, || {
            CqlError::invalid(format!(
                "Key length of {} is longer than maximum of 65535",
                key.len()
            ))
        })?;
    }
    Ok(keys.iter().map(|k| (table.token(k), k.clone())).collect())
}

/// `(row key prefix, clustering)` of every row the restrictions name in one partition (the
/// static row when `static_only`).
fn row_prefixes(
    table: &TableMetadata,
    token: Token,
    partition_key: &[u8],
    restrictions: &Restrictions,
    static_only: bool,
) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let prefix = keys::partition_prefix(&table.id, token, partition_key);
    if static_only {
        let mut key = prefix;
        key.push(keys::SECTION_STATIC_ROW);
        return vec![(key, None)];
    }
    restrictions
        .clustering_prefixes
        .iter()
        .map(|clustering| {
            let mut key = prefix.clone();
            key.push(keys::SECTION_ROW);
            key.extend_from_slice(clustering);
            (key, Some(clustering.clone()))
        })
        .collect()
}
