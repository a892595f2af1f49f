//! INSERT: a row marker and a cell per column given (a static-only insert writes just the
//! static row). `INSERT JSON` names its columns in a JSON object, read when the statement
//! runs (the text may be a bind marker).

use super::rows::{write_column_value, WriteContext};
use super::RowAddress;
use crate::values::{json, Bindings, Bound, SerializedBound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::Insert;
use shoal_model::keys;
use shoal_schema::{ColumnKind, ColumnMetadata, TableMetadata};
use shoal_storage::WriteBatch;

/// An INSERT checked against its table.
#[derive(Debug)]
pub(crate) struct InsertPlan {
    /// The term given for each column, indexed like `table.columns`.
    values: Vec<Option<TypedTerm>>,
    /// Every clustering column has a value (otherwise only static columns are written).
    clustering_complete: bool,
    /// `INSERT JSON`: the values come from this JSON object instead of `values`.
    json: Option<JsonValues>,
}

/// The JSON text of an `INSERT JSON`, and what columns it leaves out become.
#[derive(Debug)]
struct JsonValues {
    text: TypedTerm,
    /// `DEFAULT UNSET`: left as they are; otherwise (`DEFAULT NULL`) set to null.
    missing: Bound,
}

impl JsonValues {
    /// The value of every column, indexed like `table.columns`, from the JSON object.
    fn evaluate(
        &self,
        table: &TableMetadata,
        bindings: Bindings<'_>,
    ) -> Result<Vec<Option<Bound>>, CqlError> {
        let text = match self.text.evaluate(bindings)? {
            Bound::Value(shoal_model::Value::Text(text)) => text,
            _ => return Err(CqlError::invalid("Got null for INSERT JSON values")),
        };
        let parsed = serde_json::from_str(&text).map_err(|e| {
            CqlError::invalid(format!("Could not decode JSON string as a map: {e}"))
        })?;
        let serde_json::Value::Object(object) = parsed else {
            return Err(CqlError::invalid(format!(
                "Could not decode JSON string as a map: {text}"
            )));
        };
        let mut values = vec![Some(self.missing.clone()); table.columns.len()];
        let mut given = vec![false; table.columns.len()];
        for (key, value) in &object {
            // Like identifiers in CQL: case-insensitive unless written in double quotes.
            let name = match key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
                Some(quoted) => quoted.to_string(),
                None => key.to_lowercase(),
            };
            let index = table.column_index(&name).ok_or_else(|| {
                CqlError::invalid(format!(
                    "JSON values map contains unrecognized column: {key}"
                ))
            })?;
            ensure(!given[index], || {
                CqlError::invalid(format!("Multiple definitions found for column {name}"))
            })?;
            given[index] = true;
            let column = &table.columns[index];
            values[index] = Some(match json::from_json(value, &column.cql_type, &name)? {
                Some(value) => Bound::Value(value),
                None => Bound::Null,
            });
        }
        Ok(values)
    }
}

/// The error for a key column bound to null or unset.
fn null_key(name: &str) -> CqlError {
    CqlError::invalid(format!("Invalid null value in condition for column {name}"))
}

impl InsertPlan {
    pub(crate) fn new(table: &TableMetadata, insert: &Insert) -> Result<InsertPlan, CqlError> {
        crate::ensure(!table.is_counter(), || {
            CqlError::invalid(
                "INSERT statements are not allowed on counter tables, use UPDATE instead",
            )
        })?;
        if let Some(text) = &insert.json {
            return Ok(InsertPlan {
                values: vec![None; table.columns.len()],
                // A key column missing from the JSON is null, refused when the row is built.
                clustering_complete: true,
                json: Some(JsonValues {
                    text: TypedTerm::new(text, &shoal_model::CqlType::Text, "[json]")?,
                    missing: if insert.json_default_unset {
                        Bound::Unset
                    } else {
                        Bound::Null
                    },
                }),
            });
        }
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
            json: None,
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
        let mut values: Vec<Option<Given<'_>>> = match &self.json {
            Some(json) => json
                .evaluate(table, bindings)?
                .into_iter()
                .map(|value| value.map(Given::Value))
                .collect(),
            None => table
                .columns
                .iter()
                .zip(&self.values)
                .map(|(column, term)| {
                    term.as_ref()
                        .map(|term| Given::evaluate(column, term, bindings))
                        .transpose()
                })
                .collect::<Result<_, _>>()?,
        };
        let mut key_components = Vec::with_capacity(table.partition_key_count());
        let mut clustering = Vec::new();
        for (column, value) in table.columns.iter().zip(values.iter_mut()) {
            match column.kind {
                ColumnKind::PartitionKey => match value.take().map(Given::into_serialized) {
                    Some(SerializedBound::Value(bytes)) => key_components.push(bytes),
                    _ => return Err(null_key(&column.name)),
                },
                ColumnKind::Clustering if self.clustering_complete => match value.take() {
                    Some(Given::Value(Bound::Value(value))) => {
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
        let token = table.token(&partition_key);
        let prefix = keys::partition_prefix(&table.id, token, &partition_key);
        if self.clustering_complete {
            // Sized up front: a clone of `prefix` would have no room for the rest.
            let mut row_prefix = Vec::with_capacity(prefix.len() + 1 + clustering.len());
            row_prefix.extend_from_slice(&prefix);
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

/// A column's value for one execution, in the form the column needs: a [`Value`] for a
/// clustering part (encoded in clustering order) and a collection (a cell per element);
/// the stored bytes for the rest (partition key parts and scalar cells), which a bound
/// value usually is already, so it is stored without being decoded and encoded again.
enum Given<'a> {
    Value(Bound),
    Serialized(SerializedBound<'a>),
}

impl<'a> Given<'a> {
    fn evaluate(
        column: &ColumnMetadata,
        term: &TypedTerm,
        bindings: Bindings<'a>,
    ) -> Result<Given<'a>, CqlError> {
        if column.kind == ColumnKind::Clustering || column.cql_type.is_multi_cell() {
            term.evaluate(bindings).map(Given::Value)
        } else {
            term.evaluate_serialized(bindings).map(Given::Serialized)
        }
    }

    fn into_serialized(self) -> SerializedBound<'a> {
        match self {
            Given::Value(bound) => bound.into(),
            Given::Serialized(serialized) => serialized,
        }
    }
}

/// Writes the values given for the columns of `kind`: a value, or null (a deletion);
/// unset leaves the column alone.
fn write_values(
    writer: &mut super::rows::RowWriter<'_>,
    table: &TableMetadata,
    values: &mut [Option<Given<'_>>],
    kind: ColumnKind,
) {
    for (column, value) in table.columns.iter().zip(values.iter_mut()) {
        if column.kind != kind {
            continue;
        }
        match value.take() {
            Some(Given::Value(Bound::Value(v))) => write_column_value(writer, column, Some(v)),
            Some(Given::Value(Bound::Null) | Given::Serialized(SerializedBound::Null)) => {
                write_column_value(writer, column, None)
            }
            // Only scalar columns are given serialized: one cell.
            Some(Given::Serialized(SerializedBound::Value(bytes))) => {
                writer.scalar_cell(&column.name, &bytes)
            }
            _ => {}
        }
    }
}
