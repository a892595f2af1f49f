//! SELECT: planned once, executed per request.
//!
//! [`SelectPlan::new`] checks a statement against the schema and decides everything its
//! shape decides — the table, the WHERE plan ([`WherePlan`]), the selection
//! ([`selection`]), ORDER BY direction, whether it needs ALLOW FILTERING — so that a
//! prepared SELECT executes without parsing, without looking its table up by name and
//! without analysing its WHERE clause again. [`SelectPlan::execute`] then reads either
//! named partitions with [`reader::read_partition`] over their clustering slices or a
//! token range with [`reader::scan_partitions`], through a [`visitor::SelectVisitor`]
//! that filters, pages and encodes rows. When a page fills up the visitor stops the walk
//! and leaves a [`PagingState`] naming the last row returned. A row's column values are
//! decoded in `columns`; the index or vector search a SELECT uses is chosen in `search`.

pub(crate) mod columns;
mod function_calls;
pub(crate) mod grouping;
mod search;
pub(crate) mod selection;
mod single_row;
mod system;
pub(crate) mod visitor;

use search::choose_index;
pub(crate) use search::{nearest_limit, IndexChoice, NearestPlan};
pub(crate) use single_row::{read_row_values, read_single_row};

use crate::class::StatementClass;
use crate::paging::PagingState;
use crate::restrictions::{Restrictions, WherePlan};
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, Coordinator, CqlError};
use selection::{compile_selection, Selection};
use shoal_cql::ast::Select;
use shoal_cql::request::QueryParameters;
use shoal_cql::response::ResultBody;
use shoal_model::keys::{self, increment_prefix};
use shoal_model::{CqlType, TableId, Token, Value};
use shoal_replication::PartitionRef;
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::reader::{self, ClusteringSlice, Flow};
use std::sync::Arc;
use visitor::{finish, ResumeAware, SelectVisitor};

/// A SELECT checked against the schema, ready to execute with any bound values.
pub(crate) struct SelectPlan {
    pub(crate) table: Arc<TableMetadata>,
    /// The keyspace's metadata, for consistency checks.
    pub(crate) keyspace: Arc<shoal_schema::KeyspaceMetadata>,
    /// The statement, for what is evaluated per execution (system tables' relations).
    select: Select,
    pub(crate) where_plan: WherePlan,
    selection: Selection,
    limit: Option<TypedTerm>,
    per_partition_limit: Option<TypedTerm>,
    /// `USING TIMEOUT`: how long the coordinator may take to answer.
    timeout: Option<TypedTerm>,
    /// ORDER BY runs against the declared clustering order.
    reversed: bool,
    clustering_restricted: bool,
    pub(crate) class: StatementClass,
    /// A scan answered through a secondary index: which index, and which of the bound
    /// filters gives the value it looks up ([`crate::index`]).
    pub(crate) index: Option<IndexChoice>,
    /// `ORDER BY v ANN OF [...]`: rows come nearest first.
    pub(crate) nearest: Option<NearestPlan>,
}

fn positive_int(term: &Option<TypedTerm>, bindings: Bindings<'_>) -> Result<Option<u64>, CqlError> {
    let Some(term) = term else {
        return Ok(None);
    };
    let what = &term.receiver;
    match term.evaluate(bindings)? {
        Bound::Value(Value::Int(n)) if n > 0 => Ok(Some(n as u64)),
        Bound::Value(Value::Int(_)) => Err(CqlError::invalid(format!(
            "{what} must be strictly positive"
        ))),
        Bound::Unset => Ok(None),
        _ => Err(CqlError::invalid(format!("Invalid null value of {what}"))),
    }
}

/// Storage key bounds of a token range.
fn token_range_keys(
    table_id: &TableId,
    lower: Option<(i64, bool)>,
    upper: Option<(i64, bool)>,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let start = match lower {
        None => keys::table_prefix(table_id),
        Some((token, true)) => keys::token_prefix(table_id, Token(token)),
        Some((token, false)) => match token.checked_add(1) {
            Some(next) => keys::token_prefix(table_id, Token(next)),
            None => return None,
        },
    };
    let end = match upper {
        None => keys::table_end(table_id),
        Some((token, false)) => keys::token_prefix(table_id, Token(token)),
        Some((token, true)) => match token.checked_add(1) {
            Some(next) => keys::token_prefix(table_id, Token(next)),
            None => keys::table_end(table_id),
        },
    };
    (start < end).then_some((start, end))
}

fn token_in_range(token: Token, lower: Option<(i64, bool)>, upper: Option<(i64, bool)>) -> bool {
    let above = match lower {
        None => true,
        Some((bound, inclusive)) => token.0 > bound || (inclusive && token.0 == bound),
    };
    let below = match upper {
        None => true,
        Some((bound, inclusive)) => token.0 < bound || (inclusive && token.0 == bound),
    };
    above && below
}

/// Narrows slices to what comes after `clustering` in read order.
fn slices_after(
    slices: &[ClusteringSlice],
    clustering: &[u8],
    reversed: bool,
) -> Vec<ClusteringSlice> {
    slices
        .iter()
        .filter_map(|slice| {
            let mut narrowed = slice.clone();
            if reversed {
                let bound = clustering.to_vec();
                if narrowed.upper.as_ref().is_none_or(|upper| bound < *upper) {
                    narrowed.upper = Some(bound);
                }
            } else {
                let after = increment_prefix(clustering)?;
                if after > narrowed.lower {
                    narrowed.lower = after;
                }
            }
            match &narrowed.upper {
                Some(upper) if *upper <= narrowed.lower => None,
                _ => Some(narrowed),
            }
        })
        .collect()
}

impl SelectPlan {
    /// Plans `select` against `keyspace` (the statement's or the session's).
    pub(crate) fn new(
        schema: &shoal_schema::Schema,
        keyspace: &str,
        select: &Select,
    ) -> Result<SelectPlan, CqlError> {
        let keyspace_metadata = Arc::new(schema.keyspace(keyspace)?.clone());
        let table = Arc::clone(schema.table(keyspace, &select.table.name)?);
        let selection = compile_selection(&table, select)?;
        let limit = select
            .limit
            .as_ref()
            .map(|term| TypedTerm::new(term, &CqlType::Int, "LIMIT"))
            .transpose()?;
        let per_partition_limit = select
            .per_partition_limit
            .as_ref()
            .map(|term| TypedTerm::new(term, &CqlType::Int, "PER PARTITION LIMIT"))
            .transpose()?;
        let timeout = select
            .timeout
            .as_ref()
            .map(|term| TypedTerm::new(term, &CqlType::Duration, "USING TIMEOUT"))
            .transpose()?;
        let mut plan = SelectPlan {
            keyspace: keyspace_metadata,
            select: select.clone(),
            where_plan: WherePlan::default(),
            selection,
            limit,
            per_partition_limit,
            timeout,
            reversed: false,
            clustering_restricted: false,
            class: StatementClass::System,
            index: None,
            nearest: None,
            table,
        };
        if plan.table.is_virtual {
            return Ok(plan);
        }
        let table = &plan.table;
        let mut where_plan = WherePlan::analyse(table, &select.relations)?;
        let scanning = !where_plan.names_partitions();
        for (position, _, _) in where_plan.filter_shapes() {
            let name = &table.columns[position].name;
            let vector_indexed = table.indexes.iter().any(|index| {
                index.column == *name && crate::index::vector_index_of(table, index).is_some()
            });
            ensure(!vector_indexed, || {
                CqlError::invalid("Vector indexes only support ANN queries")
            })?;
        }
        let nearest = NearestPlan::new(table, select, &plan.selection, &where_plan, scanning)?;
        let clustering_restricted =
            where_plan.clustering_prefix_columns > 0 || where_plan.has_clustering_slice;
        let (index, filters_remain) = choose_index(table, &mut where_plan, scanning);
        // An EQ on the first clustering column, indexed, is answered like any indexed
        // filter (it was added as one).
        let clustering_answered = index.is_some()
            && where_plan.clustering_prefix_columns == 1
            && !where_plan.has_clustering_slice
            && table.clustering().next().is_some_and(|column| {
                crate::index::index_for(table, &column.name, shoal_cql::ast::Operator::Eq, false)
                    .is_some()
            });
        // A nearest-neighbour query's filters were all checked to be indexed.
        let needs_filtering = nearest.is_none()
            && (filters_remain
                || (scanning && clustering_restricted && !select.distinct && !clustering_answered));
        ensure(!needs_filtering || select.allow_filtering, || {
            CqlError::invalid("Cannot execute this query as it might involve data filtering and thus may have unpredictable performance. If you want to execute this query despite the performance unpredictability, use ALLOW FILTERING")
        })?;
        if select.distinct {
            ensure(!clustering_restricted, || {
                CqlError::invalid("SELECT DISTINCT with WHERE clause only supports restriction by partition key and/or static columns.")
            })?;
        }
        if let Some(limit) = &plan.limit {
            if nearest.is_some() {
                if let Ok(Bound::Value(Value::Int(limit))) = limit.evaluate(Bindings::NONE) {
                    nearest_limit(limit.max(0) as u64)?;
                }
            }
        }
        plan.reversed = order_by_reverses(table, select, scanning)?;
        plan.class = if scanning {
            StatementClass::Scan
        } else if where_plan.names_full_rows(table) && !where_plan.partition_in {
            StatementClass::PointRead
        } else {
            StatementClass::PartitionSlice
        };
        plan.clustering_restricted = clustering_restricted;
        plan.where_plan = where_plan;
        plan.index = index;
        plan.nearest = nearest;
        Ok(plan)
    }

    /// The `USING TIMEOUT` of one execution: a positive duration of days at most (months
    /// have no fixed length).
    pub(crate) fn timeout_of(
        &self,
        bindings: Bindings<'_>,
    ) -> Result<Option<std::time::Duration>, CqlError> {
        let Some(term) = &self.timeout else {
            return Ok(None);
        };
        match term.evaluate(bindings)? {
            Bound::Value(Value::Duration {
                months: 0,
                days,
                nanoseconds,
            }) if days >= 0 && nanoseconds >= 0 && (days, nanoseconds) != (0, 0) => Ok(Some(
                std::time::Duration::from_secs(days as u64 * 86_400)
                    + std::time::Duration::from_nanos(nanoseconds as u64),
            )),
            Bound::Unset => Ok(None),
            Bound::Value(Value::Duration { .. }) => Err(CqlError::invalid(
                "USING TIMEOUT must be a positive duration without months",
            )),
            _ => Err(CqlError::invalid("Invalid null value of USING TIMEOUT")),
        }
    }

    /// The LIMIT of one execution.
    pub(crate) fn limit_of(&self, bindings: Bindings<'_>) -> Result<Option<u64>, CqlError> {
        positive_int(&self.limit, bindings)
    }

    /// The ticket of one execution of this scan, beginning now: how the read scheduler
    /// ranks it on every node. Its width is the share of the token ring
    /// it may cover in 64ths (tablets are ranges of the ring, so a scan spanning fewer
    /// tablets is narrower), its limit the rows one page of it may return. A scan that
    /// stops after a LIMIT smaller than a page ends where those rows end, wherever its
    /// range does: how far that is is not known before it runs, so it counts as one 64th
    /// and such scans are ordered by their limits.
    pub(crate) fn scan_ticket(
        &self,
        parameters: &QueryParameters,
    ) -> Result<crate::schedule::ScanTicket, CqlError> {
        let bindings = Bindings {
            values: &parameters.values,
            names: parameters.names.as_deref(),
        };
        let restrictions = self.where_plan.bind(&self.table, bindings)?;
        let lower = restrictions
            .token_lower
            .map_or(i64::MIN, |(bound, _)| bound);
        let upper = restrictions
            .token_upper
            .map_or(i64::MAX, |(bound, _)| bound);
        let share = (upper as i128 - lower as i128).max(0) as f64 / u64::MAX as f64;
        let limit = positive_int(&self.limit, bindings)?.unwrap_or(u64::MAX);
        let page = match parameters.page_size {
            Some(size) if size > 0 => size as u64,
            _ => u64::MAX,
        };
        let width = if limit < page {
            1
        } else {
            ((share * 64.0).ceil() as u32).clamp(1, 64)
        };
        Ok(crate::schedule::ScanTicket::now(width, limit.min(page)))
    }

    /// The table's id, unless it is virtual.
    pub(crate) fn stored_table(&self) -> Option<TableId> {
        (!self.table.is_virtual).then_some(self.table.id)
    }

    /// The named partitions of a bound WHERE clause, for the replication layer.
    pub(crate) fn partitions(
        table: &TableMetadata,
        restrictions: &Restrictions,
    ) -> Option<Vec<PartitionRef>> {
        let keys = restrictions.partition_keys.as_ref()?;
        Some(
            keys.iter()
                .map(|key| (table.token(key), key.clone()))
                .collect(),
        )
    }

    /// Runs the SELECT over `engine` (this node's, the replicas' reconciled cells, or a
    /// view across the cluster) with this execution's values.
    pub(crate) fn execute(
        &self,
        coordinator: &Coordinator,
        engine: &dyn shoal_storage::Engine,
        parameters: &QueryParameters,
        bindings: Bindings<'_>,
        restrictions: Option<&Restrictions>,
    ) -> Result<ResultBody, CqlError> {
        // The read runs on this thread: the tombstones it went over are the difference.
        let before = shoal_storage::reader::tombstones_read_on_this_thread();
        let result = self.read(coordinator, engine, parameters, bindings, restrictions);
        let tombstones = shoal_storage::reader::tombstones_read_on_this_thread() - before;
        if tombstones > 0 {
            coordinator.observe_tombstones(&self.table, tombstones);
        }
        result
    }

    fn read(
        &self,
        coordinator: &Coordinator,
        engine: &dyn shoal_storage::Engine,
        parameters: &QueryParameters,
        bindings: Bindings<'_>,
        restrictions: Option<&Restrictions>,
    ) -> Result<ResultBody, CqlError> {
        let table = &self.table;
        coordinator.check_consistency(&self.keyspace, parameters.consistency, false)?;
        let selection = self.selection.bind(bindings)?;
        let limit = positive_int(&self.limit, bindings)?;
        let nearest = match &self.nearest {
            Some(plan) => {
                limit.map(nearest_limit).transpose()?;
                Some(visitor::Nearest {
                    column: plan.column,
                    query: plan.query(bindings)?,
                    similarity: plan.similarity,
                })
            }
            None => None,
        };
        let per_partition_limit = positive_int(&self.per_partition_limit, bindings)?;
        if table.is_virtual {
            return system::select_virtual(
                coordinator,
                table,
                &self.select,
                &selection,
                limit,
                bindings,
            );
        }
        let bound;
        let restrictions = match restrictions {
            Some(restrictions) => restrictions,
            None => {
                bound = self.where_plan.bind(table, bindings)?;
                &bound
            }
        };
        let page_size = match parameters.page_size {
            // An aggregate is one row; grouped results page by groups.
            // Nearest-neighbour results come whole, as from Cassandra.
            Some(size)
                if size > 0
                    && nearest.is_none()
                    && (!selection.aggregate || selection.grouping.is_some()) =>
            {
                size as usize
            }
            _ => usize::MAX,
        };
        let sort_across_partitions = !self.select.order_by.is_empty()
            && restrictions
                .partition_keys
                .as_ref()
                .is_some_and(|k| k.len() > 1);
        ensure(
            !(sort_across_partitions && selection.grouping.is_some()),
            || {
                CqlError::invalid("GROUP BY is not supported with ORDER BY on a query naming several partitions with IN; remove the ORDER BY and sort client side")
            },
        )?;
        ensure(!(sort_across_partitions && page_size != usize::MAX), || {
            CqlError::invalid("Cannot page queries with both ORDER BY and a IN restriction on the partition key; you must either remove the ORDER BY or the IN and sort client side, or disable paging for this query")
        })?;
        let resume = match &parameters.paging_state {
            Some(bytes) => Some(PagingState::decode(bytes)?),
            None => None,
        };
        // Nearest first: every candidate row is scored, then the best LIMIT kept.
        let limit_remaining = match (&resume, &nearest) {
            (_, Some(_)) => u64::MAX,
            (Some(resume), None) => resume.remaining,
            (None, None) => limit.unwrap_or(u64::MAX),
        };
        let scanning = restrictions.partition_keys.is_none();
        let slices = restrictions.slices();
        let mut visitor = SelectVisitor {
            row_slices: if scanning && self.clustering_restricted {
                Some(slices.clone())
            } else {
                None
            },
            distinct: self.select.distinct,
            static_only_rows: !self.clustering_restricted && table.has_static_columns(),
            page_size,
            per_partition_limit: per_partition_limit.unwrap_or(u64::MAX),
            now_seconds: shoal_model::timestamp::now_seconds(),
            sort_rows: if sort_across_partitions || nearest.is_some() {
                Some(Vec::new())
            } else {
                None
            },
            nearest,
            ..SelectVisitor::new(table, &selection, &restrictions.filters, limit_remaining)
        };
        match &restrictions.partition_keys {
            Some(partition_keys) => self.read_partitions(
                engine,
                restrictions,
                partition_keys,
                &slices,
                resume.as_ref(),
                &mut visitor,
            )?,
            None => self.scan(engine, restrictions, resume.as_ref(), &mut visitor)?,
        }
        finish(visitor, &selection, parameters, limit)
    }

    /// Reads the named partitions, in key order, from where a resumed page left off.
    fn read_partitions(
        &self,
        engine: &dyn shoal_storage::Engine,
        restrictions: &Restrictions,
        partition_keys: &[Vec<u8>],
        slices: &[ClusteringSlice],
        resume: Option<&PagingState>,
        visitor: &mut SelectVisitor<'_>,
    ) -> Result<(), CqlError> {
        for partition_key in partition_keys {
            let token = self.table.token(partition_key);
            if !token_in_range(token, restrictions.token_lower, restrictions.token_upper) {
                continue;
            }
            let mut partition_slices = slices.to_vec();
            if let Some(state) = resume {
                match partition_key.cmp(&state.partition_key) {
                    std::cmp::Ordering::Less => continue,
                    std::cmp::Ordering::Equal => match &state.clustering {
                        None => continue,
                        Some(clustering) => {
                            partition_slices = slices_after(slices, clustering, self.reversed);
                            visitor.partition_rows = 0;
                        }
                    },
                    std::cmp::Ordering::Greater => {}
                }
            }
            if self.reversed {
                partition_slices.reverse();
            }
            let resumed_partition =
                resume.is_some_and(|s| s.partition_key == *partition_key && s.clustering.is_some());
            let per_partition_before = if resumed_partition {
                resume.map_or(0, |s| s.partition_rows)
            } else {
                0
            };
            let now_seconds = visitor.now_seconds;
            let mut wrapper = ResumeAware {
                inner: &mut *visitor,
                initial_partition_rows: per_partition_before,
            };
            let flow = reader::read_partition(
                engine,
                &self.table.id,
                token,
                partition_key,
                &partition_slices,
                self.reversed,
                now_seconds,
                &mut wrapper,
            )
            .map_err(storage_error)?;
            if let Some(error) = visitor.error.take() {
                return Err(error);
            }
            if flow == Flow::Stop {
                break;
            }
        }
        Ok(())
    }

    /// Scans the token range in token order, from where a resumed page left off.
    fn scan(
        &self,
        engine: &dyn shoal_storage::Engine,
        restrictions: &Restrictions,
        resume: Option<&PagingState>,
        visitor: &mut SelectVisitor<'_>,
    ) -> Result<(), CqlError> {
        let table_id = &self.table.id;
        let Some((mut start, end)) =
            token_range_keys(table_id, restrictions.token_lower, restrictions.token_upper)
        else {
            return Ok(());
        };
        let mut stopped = false;
        if let Some(state) = resume {
            let prefix = keys::partition_prefix(table_id, state.token, &state.partition_key);
            if let Some(clustering) = &state.clustering {
                let rest = slices_after(&[ClusteringSlice::all()], clustering, false);
                let now_seconds = visitor.now_seconds;
                let mut wrapper = ResumeAware {
                    initial_partition_rows: state.partition_rows,
                    inner: &mut *visitor,
                };
                let flow = reader::read_partition(
                    engine,
                    table_id,
                    state.token,
                    &state.partition_key,
                    &rest,
                    false,
                    now_seconds,
                    &mut wrapper,
                )
                .map_err(storage_error)?;
                if let Some(error) = visitor.error.take() {
                    return Err(error);
                }
                stopped = flow == Flow::Stop;
            }
            match increment_prefix(&prefix) {
                Some(next) if next > start => start = next,
                Some(_) => {}
                None => stopped = true,
            }
        }
        if !stopped && start < end {
            let now_seconds = visitor.now_seconds;
            reader::scan_partitions(engine, &start, &end, now_seconds, visitor)
                .map_err(storage_error)?;
            if let Some(error) = visitor.error.take() {
                return Err(error);
            }
        }
        Ok(())
    }
}

fn storage_error(error: shoal_storage::StorageError) -> CqlError {
    CqlError::server(error.to_string())
}

/// Whether ORDER BY reads partitions in reverse clustering order: it must name a prefix
/// of the clustering columns, all in their declared order or all reversed.
fn order_by_reverses(
    table: &TableMetadata,
    select: &Select,
    scanning: bool,
) -> Result<bool, CqlError> {
    if select.order_by.is_empty() {
        return Ok(false);
    }
    ensure(!scanning, || {
        CqlError::invalid(
            "ORDER BY is only supported when the partition key is restricted by an EQ or an IN.",
        )
    })?;
    let clustering: Vec<_> = table.clustering().collect();
    let mut reversed = false;
    for (i, (name, descending)) in select.order_by.iter().enumerate() {
        let column = clustering.get(i).filter(|c| c.name == *name).ok_or_else(|| {
            match table.column(name) {
                Some(c) if c.kind == ColumnKind::Clustering => CqlError::invalid("Order by currently only supports the ordering of columns following their declared order in the PRIMARY KEY"),
                _ => CqlError::invalid(format!("Order by is currently only supported on the clustered columns of the PRIMARY KEY, got {name}")),
            }
        })?;
        let flips = *descending != column.descending;
        if i == 0 {
            reversed = flips;
        } else {
            ensure(flips == reversed, || {
                CqlError::invalid("Unsupported order by relation")
            })?;
        }
    }
    Ok(reversed)
}
