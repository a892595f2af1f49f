//! `GROUP BY`: which rows form a group ([`Grouping`]), checked as Cassandra checks it.

use crate::{ensure, CqlError};
use shoal_cql::ast::Select;
use shoal_schema::{ColumnKind, TableMetadata};

/// How `GROUP BY` groups rows: by partition, and within it by the first
/// `clustering_columns` clustering values. Rows of one group are consecutive in a walk in
/// key order, so a group ends when the next row's key differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grouping {
    pub(crate) clustering_columns: usize,
}

impl Grouping {
    /// The grouping `select`'s GROUP BY asks for, checked as Cassandra checks it: primary
    /// key columns in their declared order, the whole partition key first; a column may
    /// be left out only when the WHERE clause fixes it with `=`.
    pub(crate) fn of(table: &TableMetadata, select: &Select) -> Result<Option<Grouping>, CqlError> {
        if select.group_by.is_empty() {
            return Ok(None);
        }
        let fixed_by_equality = |name: &str| {
            select.relations.iter().any(|relation| {
                relation.operator == shoal_cql::ast::Operator::Eq
                    && matches!(&relation.target, shoal_cql::ast::RelationTarget::Column(c) if c == name)
            })
        };
        let mut named = select.group_by.iter().peekable();
        let mut clustering_columns = 0;
        for column in table.partition_key().chain(table.clustering()) {
            let Some(next) = named.peek() else { break };
            if *next == &column.name {
                named.next();
                if column.kind == ColumnKind::Clustering {
                    clustering_columns = column.position as usize + 1;
                }
            } else if !fixed_by_equality(&column.name) {
                break;
            }
        }
        if let Some(unused) = named.next() {
            let (_, column) = table.require_column(unused)?;
            return Err(CqlError::invalid(
                if matches!(
                    column.kind,
                    ColumnKind::PartitionKey | ColumnKind::Clustering
                ) {
                    "Group by currently only support groups of columns following their declared order in the PRIMARY KEY".to_string()
                } else {
                    format!("Group by is currently only supported on the columns of the PRIMARY KEY, got {unused}")
                },
            ));
        }
        let partition_grouped = table
            .partition_key()
            .all(|c| select.group_by.contains(&c.name) || fixed_by_equality(&c.name));
        ensure(partition_grouped, || {
            CqlError::invalid("Group by currently only support groups of columns following their declared order in the PRIMARY KEY")
        })?;
        ensure(!select.distinct, || {
            CqlError::invalid(
                "Grouping on clustering columns is not allowed for SELECT DISTINCT queries",
            )
        })?;
        Ok(Some(Grouping { clustering_columns }))
    }
}
