//! INSERT: a row marker and a cell per column given (a static-only insert writes just the
//! static row).

use super::rows::{write_column_value, WriteContext};
use super::RowAddress;
use crate::values::{Bindings, Bound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::Insert;
use shoal_model::keys;
use shoal_model::token::murmur3_token;
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::WriteBatch;

/// An INSERT checked against its table.
#[derive(Debug)]
pub(crate) struct InsertPlan {
    /// The term given for each column, indexed like `table.columns`.
    values: Vec<Option<TypedTerm>>,
    /// Every clustering column has a value (otherwise only static columns are written).
    clustering_complete: bool,
}

/// The error for a key column bound to null or unset.
fn null_key(name: &str) -> CqlError {
    CqlError::invalid(format!("Invalid null value in condition for column {name}"))
}

impl InsertPlan {
    pub(crate) fn new(table: &TableMetadata, insert: &Insert) -> Result<InsertPlan, CqlError> {
        ensure(insert.json.is_none(), || {
            CqlError::invalid("INSERT JSON is not supported by Shoal yet")
        })?;
        ensure(insert.columns.len() == insert.values.len(), || {
            CqlError::invalid(format!(
                "Unmatched column names/values: {} names but {} values",
                insert.columns.len(),
                insert.values.len()
            ))
        })?;
        let mut values: Vec<Option<TypedTerm>> = vec![None; table.columns.len()];
        for (name, term) in insert.columns.iter().zip(&insert.values) {
            let (index, column) = table.require_column(name)?;
            ensure(values[index].is_none(), || {
                CqlError::invalid(format!("Multiple definitions found for column {name}"))
            })?;
            values[index] = Some(TypedTerm::new(term, &column.cql_type, name)?);
        }
        let given = |kind: ColumnKind| {
            table
                .columns
                .iter()
                .zip(&values)
                .filter(move |(column, _)| column.kind == kind)
        };
        if let Some((missing, _)) = given(ColumnKind::PartitionKey).find(|(_, v)| v.is_none()) {
            return Err(CqlError::invalid(format!(
                "Some partition key parts are missing: {}",
                missing.name
            )));
        }
        let clustering_complete = given(ColumnKind::Clustering).all(|(_, v)| v.is_some());
        // Beside the key, only static columns: the static row alone is written.
        let non_key = || {
            table.columns.iter().zip(&values).filter(|(column, _)| {
                !matches!(
                    column.kind,
                    ColumnKind::PartitionKey | ColumnKind::Clustering
                )
            })
        };
        let only_static = non_key().all(|(c, v)| v.is_none() || c.kind == ColumnKind::Static);
        let static_only_insert =
            only_static && table.clustering_count() > 0 && non_key().any(|(_, v)| v.is_some());
        if !(clustering_complete || static_only_insert) {
            let missing: Vec<&str> = table
                .clustering()
                .filter(|c| !insert.columns.contains(&c.name))
                .map(|c| c.name.as_str())
                .collect();
            return Err(CqlError::invalid(format!(
                "Some clustering keys are missing: {}",
                missing.join(", ")
            )));
        }
        Ok(InsertPlan {
            values,
            clustering_complete,
        })
    }

    /// Builds the INSERT's cells into `batch`.
    pub(crate) fn build(
        &self,
        ctx: &WriteContext<'_>,
        bindings: Bindings<'_>,
        batch: &mut WriteBatch,
    ) -> Result<Vec<RowAddress>, CqlError> {
        let table = ctx.table;
        let mut values: Vec<Option<Bound>> = self
            .values
            .iter()
            .map(|term| term.as_ref().map(|t| t.evaluate(bindings)).transpose())
            .collect::<Result<_, _>>()?;
        let mut key_components = Vec::with_capacity(table.partition_key_count());
        let mut clustering = Vec::new();
        for (column, value) in table.columns.iter().zip(values.iter_mut()) {
            match column.kind {
                ColumnKind::PartitionKey => match value.take() {
                    Some(Bound::Value(value)) => key_components.push(value.serialize()),
                    _ => return Err(null_key(&column.name)),
                },
                ColumnKind::Clustering if self.clustering_complete => match value.take() {
                    Some(Bound::Value(value)) => {
                        clustering.extend(crate::restrictions::encode_clustering_value(
                            table,
                            column.position as usize,
                            &value,
                        ))
                    }
                    _ => return Err(null_key(&column.name)),
                },
                _ => {}
            }
        }
        let partition_key = keys::serialize_partition_key(&key_components);
        ensure(partition_key.len() <= u16::MAX as usize, || {
            CqlError::invalid(format!(
                "Key length of {} is longer than maximum of 65535",
                partition_key.len()
            ))
        })?;
        let token = murmur3_token(&partition_key);
        let prefix = keys::partition_prefix(&table.id, token, &partition_key);
        if self.clustering_complete {
            let mut row_prefix = prefix.clone();
            row_prefix.push(keys::SECTION_ROW);
            row_prefix.extend_from_slice(&clustering);
            let mut writer = ctx.writer(batch, row_prefix);
            writer.marker();
            write_values(&mut writer, table, &mut values, ColumnKind::Regular);
        }
        let mut static_prefix = prefix;
        static_prefix.push(keys::SECTION_STATIC_ROW);
        let mut static_writer = ctx.writer(batch, static_prefix);
        write_values(&mut static_writer, table, &mut values, ColumnKind::Static);
        Ok(vec![RowAddress {
            token,
            partition_key,
            clustering: self.clustering_complete.then_some(clustering),
        }])
    }
}

/// Writes the values given for the columns of `kind`: a value, or null (a deletion);
/// unset leaves the column alone.
fn write_values(
    writer: &mut super::rows::RowWriter<'_>,
    table: &TableMetadata,
    values: &mut [Option<Bound>],
    kind: ColumnKind,
) {
    for (column, value) in table.columns.iter().zip(values.iter_mut()) {
        if column.kind != kind {
            continue;
        }
        match value.take() {
            Some(Bound::Value(v)) => write_column_value(writer, column, Some(v)),
            Some(Bound::Null) => write_column_value(writer, column, None),
            _ => {}
        }
    }
}
