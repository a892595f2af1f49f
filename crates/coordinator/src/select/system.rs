//! SELECT on the virtual system tables: their rows are generated
//! ([`crate::system_tables`]), every relation filters them, and the same visitor selects,
//! limits and encodes.

use crate::restrictions::Filter;
use crate::select::columns::ColumnValue;
use crate::select::selection::Selection;
use crate::select::visitor::{finish, SelectVisitor};
use crate::values::{evaluate, Bindings};
use crate::{Coordinator, CqlError};
use shoal_cql::ast::{Operator, Select};
use shoal_cql::request::QueryParameters;
use shoal_cql::response::ResultBody;
use shoal_model::{CqlType, Token, Value};
use shoal_schema::TableMetadata;
use shoal_storage::reader::{Flow, PartitionHeader};

pub(crate) fn select_virtual(
    coordinator: &Coordinator,
    table: &TableMetadata,
    select: &Select,
    selection: &Selection,
    limit: Option<u64>,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    // Every relation filters the generated rows.
    let mut filters = Vec::new();
    for relation in &select.relations {
        let shoal_cql::ast::RelationTarget::Column(name) = &relation.target else {
            return Err(CqlError::invalid(
                "Only single-column relations are supported on system tables",
            ));
        };
        let (index, column) = table.require_column(name)?;
        let values = if relation.operator == Operator::In {
            let list_type = CqlType::List {
                element: Box::new(column.cql_type.clone()),
                frozen: false,
            };
            match &relation.value {
                shoal_cql::ast::Term::Tuple(terms) => terms
                    .iter()
                    .map(|t| evaluate(t, &column.cql_type, bindings, name)?.into_value(name))
                    .collect::<Result<Vec<_>, _>>()?,
                term => match evaluate(term, &list_type, bindings, name)?.into_value(name)? {
                    Value::List(values) => values,
                    _ => Vec::new(),
                },
            }
        } else {
            vec![evaluate(&relation.value, &column.cql_type, bindings, name)?.into_value(name)?]
        };
        filters.push(Filter {
            column: index,
            operator: relation.operator,
            values,
            map_key: None,
        });
    }
    let rows = crate::system_tables::rows(coordinator, &coordinator.schema(), table);
    let mut visitor = SelectVisitor::new(table, selection, &filters, limit.unwrap_or(u64::MAX));
    let header = PartitionHeader {
        token: Token(0),
        key: Vec::new(),
        prefix: Vec::new(),
        deletion: None,
        range_tombstones: Vec::new(),
        static_row: None,
    };
    for row in rows {
        let values: Vec<ColumnValue> = row
            .into_iter()
            .map(|value| ColumnValue {
                bytes: value.map(|v| v.serialize()),
                ..ColumnValue::default()
            })
            .collect();
        if visitor.emit(&header, values, None) == Flow::Stop {
            break;
        }
        if let Some(error) = visitor.error.take() {
            return Err(error);
        }
    }
    let parameters = QueryParameters::default();
    finish(visitor, selection, &parameters, limit)
}
