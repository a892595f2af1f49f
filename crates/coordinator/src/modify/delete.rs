//! DELETE: of whole partitions, rows, clustering ranges, columns or collection elements,
//! decided by the statement's shape when planned.

use super::rows::{element_path, WriteContext};
use super::update::{list_element, RowTarget};
use super::{check_no_filters, missing_clustering, partitions, row_prefixes, RowAddress};
use crate::restrictions::WherePlan;
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::Delete;
use shoal_model::types::UserType;
use shoal_model::{keys, Cell, CqlType, Value};
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::{Engine, WriteBatch};

/// What a DELETE without columns removes.
#[derive(Debug)]
enum Whole {
    /// `DELETE FROM t WHERE pk = ?` on a table with clustering columns.
    Partitions,
    /// Every clustering column named: row deletions.
    Rows,
    /// A clustering prefix or slice: range tombstones.
    Ranges,
}

/// What deleting one named column removes.
#[derive(Debug)]
enum TargetOp {
    /// A simple column's cell.
    Cell,
    /// A whole non-frozen collection.
    Collection,
    /// `DELETE m[k]`.
    MapKey(TypedTerm),
    /// `DELETE l[i]`: reads the list first.
    ListIndex(TypedTerm),
    /// `DELETE s[e]`.
    SetElement(TypedTerm),
    /// `DELETE addr.zip`: one field of a non-frozen user-defined type.
    Field(usize),
}

#[derive(Debug)]
struct TargetPlan {
    column: usize,
    op: TargetOp,
}

/// A DELETE checked against its table.
#[derive(Debug)]
pub(crate) struct DeletePlan {
    pub(crate) where_plan: WherePlan,
    /// Columns deleted; empty deletes rows, ranges or partitions ([`Whole`]).
    targets: Vec<TargetPlan>,
    whole: Whole,
    /// Only static columns are deleted, and no clustering column is restricted.
    static_only: bool,
}

fn plan_target(
    table: &TableMetadata,
    target: &shoal_cql::ast::DeleteTarget,
) -> Result<TargetPlan, CqlError> {
    let (index, column) = table.require_column(&target.column)?;
    ensure(
        matches!(column.kind, ColumnKind::Regular | ColumnKind::Static),
        || {
            CqlError::invalid(format!(
                "Invalid identifier {} for deletion (should not be a PRIMARY KEY part)",
                column.name
            ))
        },
    )?;
    let name = column.name.as_str();
    if let Some(field) = &target.field {
        let field_index = super::update::udt_field(column, field)?;
        return Ok(TargetPlan {
            column: index,
            op: TargetOp::Field(field_index),
        });
    }
    let op = match (&target.element, &column.cql_type) {
        // A counter is a cell per shard: deleted as a whole, like a collection.
        (None, cql_type) if cql_type.is_multi_cell() || *cql_type == CqlType::Counter => {
            TargetOp::Collection
        }
        (None, _) => TargetOp::Cell,
        (
            Some(key),
            CqlType::Map {
                key: key_type,
                frozen: false,
                ..
            },
        ) => TargetOp::MapKey(TypedTerm::new(key, key_type, name)?),
        (Some(index), CqlType::List { frozen: false, .. }) => {
            TargetOp::ListIndex(TypedTerm::new(index, &CqlType::Int, name)?)
        }
        (
            Some(element),
            CqlType::Set {
                element: element_type,
                frozen: false,
            },
        ) => TargetOp::SetElement(TypedTerm::new(element, element_type, name)?),
        (Some(_), other) => {
            return Err(CqlError::invalid(format!(
                "Invalid element deletion for column {name} of type {other}"
            )));
        }
    };
    Ok(TargetPlan { column: index, op })
}

impl DeletePlan {
    pub(crate) fn new(table: &TableMetadata, delete: &Delete) -> Result<DeletePlan, CqlError> {
        ensure(delete.using.ttl.is_none(), || {
            CqlError::invalid("Cannot set TTL on DELETE")
        })?;
        let where_plan = WherePlan::analyse(table, &delete.relations)?;
        check_no_filters(table, &where_plan)?;
        super::check_partitions_named(table, &where_plan)?;
        let targets = delete
            .targets
            .iter()
            .map(|target| plan_target(table, target))
            .collect::<Result<Vec<_>, _>>()?;
        let whole_partition =
            where_plan.clustering_prefix_columns == 0 && !where_plan.has_clustering_slice;
        let whole = if whole_partition && table.clustering_count() > 0 {
            Whole::Partitions
        } else if where_plan.names_full_rows(table) {
            Whole::Rows
        } else {
            Whole::Ranges
        };
        let all_static = targets
            .iter()
            .all(|t| table.columns[t.column].kind == ColumnKind::Static);
        let static_only = all_static && where_plan.clustering_prefix_columns == 0;
        if !targets.is_empty() {
            if !static_only && !where_plan.names_full_rows(table) {
                return Err(missing_clustering(
                    table,
                    where_plan.clustering_prefix_columns,
                ));
            }
            let mixed = targets
                .iter()
                .any(|t| table.columns[t.column].kind == ColumnKind::Static)
                && !static_only;
            ensure(!mixed, || {
                CqlError::invalid("Deleting static and regular columns in one DELETE is not supported by Shoal yet")
            })?;
        }
        Ok(DeletePlan {
            where_plan,
            targets,
            whole,
            static_only,
        })
    }

    /// True when a target needs the list's current elements (`DELETE l[i]`).
    pub(crate) fn reads_lists(&self) -> bool {
        self.targets
            .iter()
            .any(|t| matches!(t.op, TargetOp::ListIndex(_)))
    }

    /// Builds the DELETE's tombstones into `batch`.
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
            let prefix = keys::partition_prefix(&table.id, token, &partition_key);
            let tombstone = || Cell::tombstone(ctx.timestamp, ctx.now_seconds).encode();
            if self.targets.is_empty() {
                match self.whole {
                    Whole::Partitions => {
                        let mut key = prefix.clone();
                        key.push(keys::SECTION_PARTITION_DELETION);
                        batch.merge(key, tombstone());
                    }
                    Whole::Rows => {
                        for (row_prefix, clustering) in
                            row_prefixes(table, token, &partition_key, &restrictions, false)
                        {
                            ctx.writer(batch, row_prefix).row_deletion();
                            touched.push(RowAddress {
                                token,
                                partition_key: partition_key.clone(),
                                clustering,
                            });
                        }
                        continue;
                    }
                    Whole::Ranges => {
                        for slice in restrictions.slices() {
                            let mut key = prefix.clone();
                            let (end, end_inclusive) = match &slice.upper {
                                Some(upper) => (upper.as_slice(), false),
                                None => (&[][..], true),
                            };
                            keys::push_range_tombstone(
                                &mut key,
                                &slice.lower,
                                true,
                                end,
                                end_inclusive,
                            );
                            batch.merge(key, tombstone());
                        }
                    }
                }
                touched.push(RowAddress {
                    token,
                    partition_key: partition_key.clone(),
                    clustering: None,
                });
                continue;
            }
            let static_rows = self.static_only && table.clustering_count() > 0;
            for (row_prefix, clustering) in
                row_prefixes(table, token, &partition_key, &restrictions, static_rows)
            {
                let target_row = RowTarget {
                    current,
                    token,
                    partition_key: &partition_key,
                    clustering: clustering.as_deref(),
                };
                let mut writer = ctx.writer(batch, row_prefix);
                for target in &self.targets {
                    let column = &table.columns[target.column];
                    let name = column.name.as_str();
                    match &target.op {
                        TargetOp::Collection => writer.collection_deletion(name, false),
                        TargetOp::Cell => writer.cell(name, b"", None),
                        TargetOp::MapKey(key) | TargetOp::SetElement(key) => {
                            let element = key.evaluate(bindings)?.into_value(name)?;
                            writer.cell(name, &element_path(&element), None);
                        }
                        TargetOp::ListIndex(index) => {
                            let index = match index.evaluate(bindings)? {
                                Bound::Value(Value::Int(i)) if i >= 0 => i as usize,
                                _ => return Err(CqlError::invalid("Invalid list index")),
                            };
                            let cells = target_row.current_cells(table, name)?;
                            writer.cell(name, list_element(&cells, index)?, None);
                        }
                        TargetOp::Field(index) => {
                            writer.cell(name, &UserType::field_path(*index), None);
                        }
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
