//! What a SELECT searches by, beyond its key: the secondary index that answers its
//! filters ([`choose_index`]), and for `ORDER BY v ANN OF [...]` the vector column, the
//! vector index and the query vector ([`NearestPlan`]).

use super::selection::Selection;
use crate::restrictions::WherePlan;
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::Select;
use shoal_model::{CqlType, TableId};
use shoal_schema::TableMetadata;

/// The largest LIMIT of a nearest-neighbour query, as in Cassandra.
pub(crate) const NEAREST_LIMIT_MAX: u64 = 1000;

/// What `ORDER BY v ANN OF [...]` orders by: the vector column, the vector index that
/// answers it, and the query vector.
#[derive(Debug, Clone)]
pub(crate) struct NearestPlan {
    /// The vector column's position in the table's columns.
    pub(crate) column: usize,
    pub(crate) index: TableId,
    pub(crate) similarity: shoal_model::vector::Similarity,
    vector: TypedTerm,
}

impl NearestPlan {
    /// Checks an `ORDER BY … ANN OF` against the table and the rest of the statement, as
    /// Cassandra does; `None` without one.
    pub(super) fn new(
        table: &TableMetadata,
        select: &Select,
        selection: &Selection,
        where_plan: &WherePlan,
        scanning: bool,
    ) -> Result<Option<NearestPlan>, CqlError> {
        let Some((name, term)) = &select.ann else {
            return Ok(None);
        };
        ensure(select.order_by.is_empty(), || {
            CqlError::invalid("ANN ordering does not support any other ordering")
        })?;
        let column = table
            .column(name)
            .ok_or_else(|| CqlError::invalid(format!("Undefined column name {name}")))?;
        let CqlType::Vector { element, .. } = &column.cql_type else {
            return Err(CqlError::invalid(format!(
                "Unexpected receiver type '{}'; only list and vector are expected",
                column.cql_type
            )));
        };
        ensure(**element == CqlType::Float, || {
            CqlError::invalid("ANN ordering is only supported on float vector indexes")
        })?;
        let (index, similarity) = table
            .indexes
            .iter()
            .filter(|index| index.column == column.name)
            .find_map(|index| {
                crate::index::vector_index_of(table, index).map(|(s, _)| (index.id, s))
            })
            .ok_or_else(|| {
                CqlError::invalid("ANN ordering by vector requires the column to be indexed")
            })?;
        ensure(select.limit.is_some(), || {
            CqlError::invalid("Top-K queries must have a limit specified and the limit must be less than the query page size")
        })?;
        ensure(select.per_partition_limit.is_none(), || {
            CqlError::invalid("Top-K queries do not support per-partition limits")
        })?;
        ensure(!selection.aggregate && selection.grouping.is_none(), || {
            CqlError::invalid("Top-K queries can not be run with aggregation")
        })?;
        ensure(!where_plan.partition_in, || {
            CqlError::invalid(
                "Select on indexed columns and with IN clause for the PRIMARY KEY are not supported",
            )
        })?;
        // Rows are filtered after the search, so every filter must be one an index answers.
        let mut restricted: Vec<(usize, shoal_cql::ast::Operator, bool)> =
            where_plan.filter_shapes();
        if scanning {
            let clustering_restricted =
                where_plan.clustering_prefix_columns + usize::from(where_plan.has_clustering_slice);
            for column in table.clustering().take(clustering_restricted) {
                if let Some(position) = table.column_index(&column.name) {
                    restricted.push((position, shoal_cql::ast::Operator::Eq, false));
                }
            }
        }
        for (position, operator, map_entry) in restricted {
            let indexed =
                crate::index::index_for(table, &table.columns[position].name, operator, map_entry)
                    .is_some_and(|index| index.sai);
            ensure(indexed, || {
                CqlError::invalid(
                    "ANN ordering by vector requires all restricted column(s) to be indexed",
                )
            })?;
        }
        Ok(Some(NearestPlan {
            column: table.column_index(&column.name).unwrap_or_default(),
            index,
            similarity,
            vector: TypedTerm::new(term, &column.cql_type, &column.name)?,
        }))
    }

    /// The query vector of one execution.
    pub(crate) fn query(&self, bindings: Bindings<'_>) -> Result<Vec<f32>, CqlError> {
        let vector = match self.vector.evaluate(bindings)? {
            Bound::Value(value) => shoal_model::vector::floats(&value.serialize()),
            Bound::Null | Bound::Unset => {
                return Err(CqlError::invalid(format!(
                    "Unsupported null value for column {}",
                    self.vector.receiver
                )))
            }
        };
        ensure(
            !(self.similarity == shoal_model::vector::Similarity::Cosine
                && shoal_model::vector::is_zero(&vector)),
            || {
                CqlError::invalid("Zero and near-zero vectors cannot be indexed or queried with cosine similarity")
            },
        )?;
        Ok(vector)
    }
}

/// A nearest-neighbour query's LIMIT, checked against Cassandra's maximum.
pub(crate) fn nearest_limit(limit: u64) -> Result<u64, CqlError> {
    ensure(limit <= NEAREST_LIMIT_MAX, || {
        CqlError::invalid(format!(
            "Use of ANN OF in an ORDER BY clause requires a LIMIT that is not greater than {NEAREST_LIMIT_MAX}. LIMIT was {limit}"
        ))
    })?;
    Ok(limit)
}

/// The index a scan uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndexChoice {
    pub(crate) id: TableId,
    /// The position of its filter in the bound restrictions' filters.
    pub(crate) filter: usize,
}

/// Which index answers the WHERE clause, and whether filters remain that only ALLOW
/// FILTERING permits: with storage-attached indexes every indexed filter is answered (the
/// others are checked on the rows); with the default index only one filter may be.
pub(super) fn choose_index(
    table: &TableMetadata,
    where_plan: &mut WherePlan,
    scanning: bool,
) -> (Option<IndexChoice>, bool) {
    if table.indexes.is_empty() {
        return (None, where_plan.needs_filtering);
    }
    // A scan restricted by EQ on an indexed clustering column: check it as a filter too.
    if scanning && !where_plan.has_clustering_slice {
        for position in 0..where_plan.clustering_prefix_columns {
            let Some(column) = table.clustering().nth(position) else {
                break;
            };
            if crate::index::index_for(table, &column.name, shoal_cql::ast::Operator::Eq, false)
                .is_some()
            {
                where_plan.filter_clustering_eq(table, position);
            }
        }
    }
    let shapes = where_plan.filter_shapes();
    let indexes: Vec<Option<&shoal_schema::IndexMetadata>> = shapes
        .iter()
        .map(|(column, operator, map_entry)| {
            crate::index::index_for(table, &table.columns[*column].name, *operator, *map_entry)
        })
        .collect();
    // An equality names fewer partitions than a range, as a rule: use its index if any.
    let is_range = |position: usize| {
        use shoal_cql::ast::Operator::{Gt, Gte, Lt, Lte};
        matches!(shapes[position].1, Lt | Lte | Gt | Gte)
    };
    let indexed = |position: &usize| indexes[*position].is_some();
    let Some(filter) = (0..shapes.len())
        .filter(indexed)
        .find(|position| !is_range(*position))
        .or_else(|| (0..shapes.len()).find(indexed))
    else {
        return (None, where_plan.needs_filtering);
    };
    let all_answered = indexes.iter().all(|i| i.is_some_and(|i| i.sai))
        || (shapes.len() == 1 && indexes[0].is_some());
    let id = indexes[filter].map(|i| i.id);
    let choice = id.filter(|_| scanning).map(|id| IndexChoice { id, filter });
    (choice, !all_answered)
}
