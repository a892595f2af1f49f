//! SELECT: partition reads, token-ordered scans, filtering, projection and paging.
//!
//! A query either names its partitions (EQ/IN on the whole partition key) and reads each
//! with [`reader::read_partition`] over its clustering slices, or scans a token range of the
//! table with [`reader::scan_partitions`]. Rows stream through a [`SelectVisitor`], which
//! filters them, applies PER PARTITION LIMIT, LIMIT and the page size, and encodes the
//! selected columns straight into the response buffer. When a page fills up, the visitor
//! stops the storage walk and leaves a [`PagingState`] naming the last row returned.

use crate::paging::PagingState;
use crate::restrictions::{Filter, Restrictions};
use crate::values::{evaluate, timeuuid_millis, Bindings, Bound};
use crate::{ensure, Coordinator, CqlError, Session};
use shoal_cql::ast::{Operator, Select, Selector};
use shoal_cql::request::QueryParameters;
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::clustering::decode_component;
use shoal_model::keys::{self, increment_prefix};
use shoal_model::token::murmur3_token;
use shoal_model::{Cell, CqlType, TableId, Token, Value};
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::reader::{self, ClusteringSlice, Flow, PartitionHeader, Row, Visitor};
use std::sync::Arc;

/// One column's value in a row being produced: serialized bytes plus, for simple cells,
/// the write timestamp and remaining TTL.
#[derive(Debug, Clone, Default)]
struct ColumnValue {
    bytes: Option<Vec<u8>>,
    timestamp: Option<i64>,
    ttl: Option<i32>,
}

/// Splits a serialized partition key into typed values.
pub(crate) fn decode_partition_key_values(
    table: &TableMetadata,
    partition_key: &[u8],
) -> Result<Vec<Value>, CqlError> {
    let types: Vec<&CqlType> = table.partition_key().map(|c| &c.cql_type).collect();
    let parts = keys::split_partition_key(partition_key, types.len())
        .ok_or_else(|| CqlError::server("malformed stored partition key"))?;
    parts
        .iter()
        .zip(types)
        .map(|(bytes, t)| Ok(Value::deserialize(t, bytes)?))
        .collect()
}

/// Serializes the live cells of a non-frozen collection as one collection value.
fn collection_bytes(cql_type: &CqlType, cells: &[(Vec<u8>, Cell)]) -> Result<Vec<u8>, CqlError> {
    let mut out = Vec::new();
    out.extend_from_slice(&(cells.len() as i32).to_be_bytes());
    let push = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    for (path, cell) in cells {
        match cql_type {
            CqlType::List { .. } => push(&mut out, &cell.value),
            CqlType::Set { element, .. } => {
                let (value, _) = decode_component(path, element, false)?;
                push(&mut out, &value.serialize());
            }
            CqlType::Map { key, .. } => {
                let (value, _) = decode_component(path, key, false)?;
                push(&mut out, &value.serialize());
                push(&mut out, &cell.value);
            }
            _ => return Err(CqlError::server("not a collection")),
        }
    }
    Ok(out)
}

/// Fills `values` (indexed like `table.columns`) from a stored row's cells.
fn fill_from_row(
    table: &TableMetadata,
    row: Row,
    values: &mut [ColumnValue],
    now_seconds: i64,
) -> Result<(), CqlError> {
    for column in row.columns {
        let Some(index) = table.column_index(&column.name) else {
            continue;
        };
        let metadata = &table.columns[index];
        let mut cells = column.cells;
        // Cells older than a drop of this column name belong to the dropped column.
        if let Some(dropped) = table.dropped_columns.get(&column.name) {
            cells.retain(|(_, cell)| cell.timestamp.0 > dropped.dropped_at_micros);
        }
        if metadata.cql_type.is_multi_cell() {
            if !cells.is_empty() {
                values[index] = ColumnValue {
                    bytes: Some(collection_bytes(&metadata.cql_type, &cells)?),
                    timestamp: None,
                    ttl: None,
                };
            }
        } else if let Some((_, cell)) = cells.into_iter().next() {
            values[index] = ColumnValue {
                timestamp: Some(cell.timestamp.0),
                ttl: cell.remaining_ttl(now_seconds),
                bytes: Some(cell.value),
            };
        }
    }
    Ok(())
}

/// What one selected output column computes.
#[derive(Debug, Clone)]
enum Output {
    Column(usize),
    WriteTime(usize),
    Ttl(usize),
    Token,
    Count(Option<usize>),
    Min(usize),
    Max(usize),
    Sum(usize),
    Avg(usize),
    ToTimestamp(usize),
    ToUnixTimestamp(usize),
    ToDate(usize),
    Constant(Option<Vec<u8>>),
}

impl Output {
    fn is_aggregate(&self) -> bool {
        matches!(
            self,
            Output::Count(_) | Output::Min(_) | Output::Max(_) | Output::Sum(_) | Output::Avg(_)
        )
    }
}

struct Selection {
    columns: Vec<ColumnSpec>,
    outputs: Vec<Output>,
    aggregate: bool,
}

fn spec(table: &TableMetadata, name: String, cql_type: CqlType) -> ColumnSpec {
    ColumnSpec {
        keyspace: table.keyspace.clone(),
        table: table.name.clone(),
        name,
        cql_type,
    }
}

fn compile_selection(
    table: &TableMetadata,
    select: &Select,
    bindings: Bindings<'_>,
) -> Result<Selection, CqlError> {
    let mut columns = Vec::new();
    let mut outputs = Vec::new();
    if select.items.is_empty() {
        for (index, column) in table.columns.iter().enumerate() {
            if select.distinct
                && !matches!(column.kind, ColumnKind::PartitionKey | ColumnKind::Static)
            {
                continue;
            }
            columns.push(spec(table, column.name.clone(), column.cql_type.clone()));
            outputs.push(Output::Column(index));
        }
    }
    for item in &select.items {
        let simple_column = |name: &str, what: &str| -> Result<usize, CqlError> {
            let (index, column) = table.require_column(name)?;
            ensure(!column.cql_type.is_multi_cell(), || {
                CqlError::invalid(format!(
                    "Cannot use selection function {what} on non-frozen collection {name}"
                ))
            })?;
            ensure(
                !matches!(
                    column.kind,
                    ColumnKind::PartitionKey | ColumnKind::Clustering
                ),
                || {
                    CqlError::invalid(format!(
                        "Cannot use selection function {what} on PRIMARY KEY part {name}"
                    ))
                },
            )?;
            Ok(index)
        };
        let (name, cql_type, output) = match &item.selector {
            Selector::Column(name) => {
                let (index, column) = table.require_column(name)?;
                if select.distinct {
                    ensure(
                        matches!(column.kind, ColumnKind::PartitionKey | ColumnKind::Static),
                        || {
                            CqlError::invalid(format!("SELECT DISTINCT queries must only request partition key columns and/or static columns (not {name})"))
                        },
                    )?;
                }
                (name.clone(), column.cql_type.clone(), Output::Column(index))
            }
            Selector::WriteTime(name) => (
                format!("writetime({name})"),
                CqlType::Bigint,
                Output::WriteTime(simple_column(name, "writetime")?),
            ),
            Selector::Ttl(name) => (
                format!("ttl({name})"),
                CqlType::Int,
                Output::Ttl(simple_column(name, "ttl")?),
            ),
            Selector::CountAll => ("count".to_string(), CqlType::Bigint, Output::Count(None)),
            Selector::Token(names) => {
                let expected: Vec<&str> = table.partition_key().map(|c| c.name.as_str()).collect();
                ensure(
                    names
                        .iter()
                        .map(String::as_str)
                        .eq(expected.iter().copied()),
                    || {
                        CqlError::invalid(format!(
                            "token() must be called with the partition key columns in order: {}",
                            expected.join(", ")
                        ))
                    },
                )?;
                (
                    format!("system.token({})", names.join(", ")),
                    CqlType::Bigint,
                    Output::Token,
                )
            }
            Selector::Function { name, arguments } => {
                let function = name.to_ascii_lowercase();
                let argument_column =
                    |position: usize| -> Result<(usize, CqlType, String), CqlError> {
                        match arguments.get(position) {
                            Some(Selector::Column(column)) => {
                                let (index, metadata) = table.require_column(column)?;
                                Ok((index, metadata.cql_type.clone(), column.clone()))
                            }
                            _ => Err(CqlError::invalid(format!(
                                "Function {function} takes a column argument in Shoal"
                            ))),
                        }
                    };
                match (function.as_str(), arguments.len()) {
                    ("count", 1) => {
                        let (index, _, column) = argument_column(0)?;
                        (
                            format!("system.count({column})"),
                            CqlType::Bigint,
                            Output::Count(Some(index)),
                        )
                    }
                    ("min" | "max" | "sum" | "avg", 1) => {
                        let (index, cql_type, column) = argument_column(0)?;
                        if matches!(function.as_str(), "sum" | "avg") {
                            ensure(cql_type.is_numeric(), || {
                                CqlError::invalid(format!(
                                    "Invalid call to function {function}: {column} is not numeric"
                                ))
                            })?;
                        }
                        let output = match function.as_str() {
                            "min" => Output::Min(index),
                            "max" => Output::Max(index),
                            "sum" => Output::Sum(index),
                            _ => Output::Avg(index),
                        };
                        (format!("system.{function}({column})"), cql_type, output)
                    }
                    ("totimestamp" | "dateof", 1) => {
                        let (index, _, column) = argument_column(0)?;
                        (
                            format!("system.{function}({column})"),
                            CqlType::Timestamp,
                            Output::ToTimestamp(index),
                        )
                    }
                    ("tounixtimestamp" | "unixtimestampof", 1) => {
                        let (index, _, column) = argument_column(0)?;
                        (
                            format!("system.{function}({column})"),
                            CqlType::Bigint,
                            Output::ToUnixTimestamp(index),
                        )
                    }
                    ("todate", 1) => {
                        let (index, _, column) = argument_column(0)?;
                        (
                            format!("system.todate({column})"),
                            CqlType::Date,
                            Output::ToDate(index),
                        )
                    }
                    ("now", 0)
                    | ("uuid", 0)
                    | ("currenttimestamp", 0)
                    | ("currentdate", 0)
                    | ("currenttime", 0)
                    | ("currenttimeuuid", 0) => {
                        let cql_type = match function.as_str() {
                            "now" | "currenttimeuuid" => CqlType::Timeuuid,
                            "uuid" => CqlType::Uuid,
                            "currenttimestamp" => CqlType::Timestamp,
                            "currentdate" => CqlType::Date,
                            _ => CqlType::Time,
                        };
                        let term = shoal_cql::ast::Term::Function {
                            name: function.clone(),
                            arguments: Vec::new(),
                        };
                        let value = evaluate(&term, &cql_type, bindings, &function)?;
                        let bytes = match value {
                            Bound::Value(v) => Some(v.serialize()),
                            _ => None,
                        };
                        (
                            format!("system.{function}()"),
                            cql_type,
                            Output::Constant(bytes),
                        )
                    }
                    _ => {
                        return Err(CqlError::invalid(format!(
                            "Unknown function '{function}' with {} arguments",
                            arguments.len()
                        )))
                    }
                }
            }
            Selector::Cast { .. } => {
                return Err(CqlError::invalid(
                    "CAST in selections is not supported by Shoal yet",
                ))
            }
            Selector::Literal(term) => {
                let (cql_type, shown) = match term {
                    shoal_cql::ast::Term::Literal(shoal_cql::ast::Literal::Integer(text)) => {
                        (CqlType::Int, text.clone())
                    }
                    shoal_cql::ast::Term::Literal(shoal_cql::ast::Literal::String(text)) => {
                        (CqlType::Text, format!("'{text}'"))
                    }
                    shoal_cql::ast::Term::Cast { cql_type, .. } => {
                        (cql_type.clone(), "?".to_string())
                    }
                    _ => (CqlType::Text, "literal".to_string()),
                };
                let bytes = match evaluate(term, &cql_type, bindings, "selection")? {
                    Bound::Value(v) => Some(v.serialize()),
                    _ => None,
                };
                (shown, cql_type, Output::Constant(bytes))
            }
        };
        columns.push(spec(table, item.alias.clone().unwrap_or(name), cql_type));
        outputs.push(output);
    }
    let aggregate = outputs.iter().any(Output::is_aggregate);
    Ok(Selection {
        columns,
        outputs,
        aggregate,
    })
}

fn numeric_as_f64(value: &Value) -> f64 {
    match value {
        Value::Tinyint(v) => *v as f64,
        Value::Smallint(v) => *v as f64,
        Value::Int(v) => *v as f64,
        Value::Bigint(v) | Value::Counter(v) => *v as f64,
        Value::Float(v) => *v as f64,
        Value::Double(v) => *v,
        Value::Varint(v) => v.to_string().parse().unwrap_or(0.0),
        Value::Decimal { unscaled, scale } => {
            unscaled.to_string().parse::<f64>().unwrap_or(0.0) / 10f64.powi(*scale)
        }
        _ => 0.0,
    }
}

fn numeric_from_f64(cql_type: &CqlType, value: f64, integral_sum: i128) -> Value {
    match cql_type {
        CqlType::Tinyint => Value::Tinyint(integral_sum as i8),
        CqlType::Smallint => Value::Smallint(integral_sum as i16),
        CqlType::Int => Value::Int(integral_sum as i32),
        CqlType::Bigint | CqlType::Counter => Value::Bigint(integral_sum as i64),
        CqlType::Varint => Value::Varint(num_bigint::BigInt::from(integral_sum)),
        CqlType::Float => Value::Float(value as f32),
        CqlType::Decimal => crate::values::literal_value(
            &shoal_cql::ast::Literal::Float(format!("{value:?}")),
            cql_type,
            "sum",
            false,
        )
        .unwrap_or(Value::Double(value)),
        _ => Value::Double(value),
    }
}

fn integral(value: &Value) -> i128 {
    match value {
        Value::Tinyint(v) => *v as i128,
        Value::Smallint(v) => *v as i128,
        Value::Int(v) => *v as i128,
        Value::Bigint(v) | Value::Counter(v) => *v as i128,
        Value::Varint(v) => i128::try_from(v).unwrap_or(0),
        _ => 0,
    }
}

/// Running state of one aggregate output.
#[derive(Debug, Clone, Default)]
struct Accumulator {
    count: i64,
    sum: f64,
    integral_sum: i128,
    best: Option<Value>,
    first_bytes: Option<Option<Vec<u8>>>,
}

/// A row kept for sorting across partitions: its clustering and its output cells.
type SortableRow = (Vec<u8>, Vec<Option<Vec<u8>>>);

struct SelectVisitor<'a> {
    table: &'a TableMetadata,
    selection: &'a Selection,
    filters: &'a [Filter],
    /// In scans, clustering restrictions become a row predicate.
    row_slices: Option<Vec<ClusteringSlice>>,
    distinct: bool,
    /// Emit a row for a partition that has only static data.
    static_only_rows: bool,
    page_size: usize,
    limit_remaining: u64,
    per_partition_limit: u64,
    now_seconds: i64,
    // Per partition.
    partition_values: Vec<ColumnValue>,
    partition_rows: u64,
    partition_matched_any: bool,
    // Output.
    buffer: RowsBuffer,
    emitted: usize,
    last_position: Option<(Token, Vec<u8>, Option<Vec<u8>>)>,
    has_more: bool,
    accumulators: Vec<Accumulator>,
    sort_rows: Option<Vec<SortableRow>>,
    error: Option<CqlError>,
}

impl<'a> SelectVisitor<'a> {
    /// A visitor with no paging, no per-partition limit and nothing to sort.
    fn new(
        table: &'a TableMetadata,
        selection: &'a Selection,
        filters: &'a [Filter],
        limit_remaining: u64,
    ) -> SelectVisitor<'a> {
        SelectVisitor {
            table,
            selection,
            filters,
            row_slices: None,
            distinct: false,
            static_only_rows: false,
            page_size: usize::MAX,
            limit_remaining,
            per_partition_limit: u64::MAX,
            now_seconds: 0,
            partition_values: Vec::new(),
            partition_rows: 0,
            partition_matched_any: false,
            buffer: RowsBuffer::new(selection.columns.len()),
            emitted: 0,
            last_position: None,
            has_more: false,
            accumulators: vec![Accumulator::default(); selection.outputs.len()],
            sort_rows: None,
            error: None,
        }
    }

    fn fail(&mut self, error: CqlError) -> Flow {
        self.error = Some(error);
        Flow::Stop
    }

    fn begin_partition(&mut self, header: &PartitionHeader) -> Result<(), CqlError> {
        self.partition_rows = 0;
        self.partition_matched_any = false;
        let mut values = vec![ColumnValue::default(); self.table.columns.len()];
        let key_values = decode_partition_key_values(self.table, &header.key)?;
        let parts = keys::split_partition_key(&header.key, key_values.len()).unwrap_or_default();
        for (column, bytes) in self.table.partition_key().zip(parts) {
            if let Some(index) = self.table.column_index(&column.name) {
                values[index].bytes = Some(bytes.to_vec());
            }
        }
        if let Some(static_row) = &header.static_row {
            fill_from_row(
                self.table,
                static_row.clone(),
                &mut values,
                self.now_seconds,
            )?;
        }
        self.partition_values = values;
        Ok(())
    }

    fn matches_filters(&self, values: &[ColumnValue]) -> Result<bool, CqlError> {
        for filter in self.filters {
            let column = &self.table.columns[filter.column];
            let Some(bytes) = &values[filter.column].bytes else {
                return Ok(false);
            };
            let value = Value::deserialize(&column.cql_type, bytes)?;
            let holds = match (filter.operator, &filter.map_key) {
                (Operator::Eq, Some(key)) => match &value {
                    Value::Map(entries) => entries.iter().any(|(k, v)| {
                        k.compare(key).is_eq() && v.compare(&filter.values[0]).is_eq()
                    }),
                    _ => false,
                },
                (Operator::Contains, _) => match &value {
                    Value::List(elements) | Value::Set(elements) => elements
                        .iter()
                        .any(|e| e.compare(&filter.values[0]).is_eq()),
                    Value::Map(entries) => entries
                        .iter()
                        .any(|(_, v)| v.compare(&filter.values[0]).is_eq()),
                    _ => false,
                },
                (Operator::ContainsKey, _) => match &value {
                    Value::Map(entries) => entries
                        .iter()
                        .any(|(k, _)| k.compare(&filter.values[0]).is_eq()),
                    _ => false,
                },
                (Operator::In, _) => filter.values.iter().any(|v| value.compare(v).is_eq()),
                (operator, _) => {
                    let order = value.compare(&filter.values[0]);
                    match operator {
                        Operator::Eq => order.is_eq(),
                        Operator::Lt => order.is_lt(),
                        Operator::Lte => order.is_le(),
                        Operator::Gt => order.is_gt(),
                        Operator::Gte => order.is_ge(),
                        _ => false,
                    }
                }
            };
            if !holds {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn output_cells(
        &self,
        values: &[ColumnValue],
        token: Token,
    ) -> Result<Vec<Option<Vec<u8>>>, CqlError> {
        let mut cells = Vec::with_capacity(self.selection.outputs.len());
        for output in &self.selection.outputs {
            let cell = match output {
                Output::Column(index) => values[*index].bytes.clone(),
                Output::WriteTime(index) => {
                    values[*index].timestamp.map(|t| t.to_be_bytes().to_vec())
                }
                Output::Ttl(index) => values[*index].ttl.map(|t| t.to_be_bytes().to_vec()),
                Output::Token => Some(token.0.to_be_bytes().to_vec()),
                Output::Constant(bytes) => bytes.clone(),
                Output::ToTimestamp(index)
                | Output::ToUnixTimestamp(index)
                | Output::ToDate(index) => {
                    let column = &self.table.columns[*index];
                    match &values[*index].bytes {
                        None => None,
                        Some(bytes) => {
                            let millis = match Value::deserialize(&column.cql_type, bytes)? {
                                Value::Timeuuid(u) => timeuuid_millis(&u),
                                Value::Timestamp(t) => t,
                                Value::Date(d) => {
                                    (d as i64 - shoal_model::value::DATE_EPOCH_OFFSET as i64)
                                        * 86_400_000
                                }
                                _ => {
                                    return Err(CqlError::invalid(format!(
                                        "Cannot convert column {} of type {}",
                                        column.name, column.cql_type
                                    )))
                                }
                            };
                            Some(match output {
                                Output::ToTimestamp(_) => Value::Timestamp(millis).serialize(),
                                Output::ToUnixTimestamp(_) => Value::Bigint(millis).serialize(),
                                _ => Value::Date(
                                    (millis.div_euclid(86_400_000)
                                        + shoal_model::value::DATE_EPOCH_OFFSET as i64)
                                        as u32,
                                )
                                .serialize(),
                            })
                        }
                    }
                }
                Output::Count(_)
                | Output::Min(_)
                | Output::Max(_)
                | Output::Sum(_)
                | Output::Avg(_) => None,
            };
            cells.push(cell);
        }
        Ok(cells)
    }

    fn accumulate(&mut self, values: &[ColumnValue], token: Token) -> Result<(), CqlError> {
        let plain = self.output_cells(values, token)?;
        for (i, output) in self.selection.outputs.iter().enumerate() {
            let accumulator = &mut self.accumulators[i];
            if accumulator.first_bytes.is_none() {
                accumulator.first_bytes = Some(plain[i].clone());
            }
            let typed = |index: usize| -> Result<Option<Value>, CqlError> {
                let column = &self.table.columns[index];
                values[index]
                    .bytes
                    .as_ref()
                    .map(|b| Value::deserialize(&column.cql_type, b))
                    .transpose()
                    .map_err(CqlError::from)
            };
            match output {
                Output::Count(None) => accumulator.count += 1,
                Output::Count(Some(index)) if values[*index].bytes.is_some() => {
                    accumulator.count += 1;
                }
                Output::Min(index) | Output::Max(index) => {
                    if let Some(value) = typed(*index)? {
                        let better = match &accumulator.best {
                            None => true,
                            Some(best) => {
                                let order = value.compare(best);
                                if matches!(output, Output::Min(_)) {
                                    order.is_lt()
                                } else {
                                    order.is_gt()
                                }
                            }
                        };
                        if better {
                            accumulator.best = Some(value);
                        }
                    }
                }
                Output::Sum(index) | Output::Avg(index) => {
                    if let Some(value) = typed(*index)? {
                        accumulator.count += 1;
                        accumulator.sum += numeric_as_f64(&value);
                        accumulator.integral_sum += integral(&value);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn finish_aggregate(&mut self) {
        let mut cells = Vec::with_capacity(self.selection.outputs.len());
        for (i, output) in self.selection.outputs.iter().enumerate() {
            let accumulator = &self.accumulators[i];
            let column_type = |index: usize| self.table.columns[index].cql_type.clone();
            cells.push(match output {
                Output::Count(_) => Some(accumulator.count.to_be_bytes().to_vec()),
                Output::Min(_) | Output::Max(_) => accumulator.best.as_ref().map(Value::serialize),
                Output::Sum(index) => Some(
                    numeric_from_f64(
                        &column_type(*index),
                        accumulator.sum,
                        accumulator.integral_sum,
                    )
                    .serialize(),
                ),
                Output::Avg(index) => {
                    let count = accumulator.count.max(1);
                    Some(
                        numeric_from_f64(
                            &column_type(*index),
                            accumulator.sum / count as f64,
                            accumulator.integral_sum / count as i128,
                        )
                        .serialize(),
                    )
                }
                _ => accumulator.first_bytes.clone().flatten(),
            });
        }
        self.buffer.push_row(cells.iter().map(|c| c.as_deref()));
    }

    /// Emits one candidate row; returns the flow for the storage walk.
    fn emit(
        &mut self,
        header: &PartitionHeader,
        values: Vec<ColumnValue>,
        clustering: Option<Vec<u8>>,
    ) -> Flow {
        match self.matches_filters(&values) {
            Ok(true) => {}
            Ok(false) => return Flow::Continue,
            Err(error) => return self.fail(error),
        }
        if self.selection.aggregate {
            if let Err(error) = self.accumulate(&values, header.token) {
                return self.fail(error);
            }
            self.partition_matched_any = true;
            return if self.distinct {
                Flow::NextPartition
            } else {
                Flow::Continue
            };
        }
        if self.emitted >= self.page_size {
            self.has_more = true;
            return Flow::Stop;
        }
        let cells = match self.output_cells(&values, header.token) {
            Ok(cells) => cells,
            Err(error) => return self.fail(error),
        };
        match &mut self.sort_rows {
            Some(rows) => rows.push((clustering.clone().unwrap_or_default(), cells)),
            None => self.buffer.push_row(cells.iter().map(|c| c.as_deref())),
        }
        self.emitted += 1;
        self.partition_rows += 1;
        self.partition_matched_any = true;
        self.limit_remaining = self.limit_remaining.saturating_sub(1);
        self.last_position = Some((header.token, header.key.clone(), clustering));
        if self.limit_remaining == 0 {
            return Flow::Stop;
        }
        if self.distinct || self.partition_rows >= self.per_partition_limit {
            // Nothing more from this partition: paging resumes at the next one.
            if let Some(position) = &mut self.last_position {
                position.2 = None;
            }
            return Flow::NextPartition;
        }
        Flow::Continue
    }
}

fn in_slices(slices: &[ClusteringSlice], clustering: &[u8]) -> bool {
    slices.iter().any(|slice| {
        clustering >= slice.lower.as_slice()
            && slice
                .upper
                .as_ref()
                .is_none_or(|upper| clustering < upper.as_slice())
    })
}

impl Visitor for SelectVisitor<'_> {
    fn partition(&mut self, header: &PartitionHeader) -> Flow {
        match self.begin_partition(header) {
            Ok(()) => Flow::Continue,
            Err(error) => self.fail(error),
        }
    }

    fn row(&mut self, header: &PartitionHeader, mut row: Row) -> Flow {
        if let Some(slices) = &self.row_slices {
            if !in_slices(slices, &row.clustering) {
                return Flow::Continue;
            }
        }
        let mut values = self.partition_values.clone();
        let mut position = 0;
        for column in self.table.clustering() {
            match decode_component(
                &row.clustering[position..],
                &column.cql_type,
                column.descending,
            ) {
                Ok((value, used)) => {
                    position += used;
                    if let Some(index) = self.table.column_index(&column.name) {
                        values[index].bytes = Some(value.serialize());
                    }
                }
                Err(error) => return self.fail(error.into()),
            }
        }
        let clustering = std::mem::take(&mut row.clustering);
        if let Err(error) = fill_from_row(self.table, row, &mut values, self.now_seconds) {
            return self.fail(error);
        }
        self.emit(header, values, Some(clustering))
    }

    fn partition_end(&mut self, header: &PartitionHeader) -> Flow {
        if self.partition_rows == 0
            && !self.partition_matched_any
            && self.static_only_rows
            && header.static_row.is_some()
        {
            let values = self.partition_values.clone();
            let flow = self.emit(header, values, None);
            if let Some(position) = &mut self.last_position {
                if position.1 == header.key {
                    position.2 = None;
                }
            }
            return flow;
        }
        Flow::Continue
    }
}

fn positive_int(
    term: &shoal_cql::ast::Term,
    bindings: Bindings<'_>,
    what: &str,
) -> Result<Option<u64>, CqlError> {
    match evaluate(term, &CqlType::Int, bindings, what)? {
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

/// The table and partitions a SELECT on named partitions reads (`None`: a scan, a
/// virtual table, or a statement that fails later with a proper error).
pub(crate) fn partitions_of(
    coordinator: &Coordinator,
    session: &Session,
    select: &Select,
    bindings: Bindings<'_>,
) -> Option<(TableId, Vec<shoal_replication::PartitionRef>)> {
    let keyspace = coordinator
        .keyspace_for(session, &select.table.keyspace)
        .ok()?;
    let schema = coordinator.schema();
    let table = schema.table(&keyspace, &select.table.name).ok()?;
    if table.is_virtual {
        return None;
    }
    let restrictions = Restrictions::analyse(table, &select.relations, bindings).ok()?;
    let partitions = restrictions
        .partition_keys?
        .into_iter()
        .map(|key| (murmur3_token(&key), key))
        .collect();
    Some((table.id, partitions))
}

pub(crate) fn execute_select(
    coordinator: &Coordinator,
    engine: &dyn shoal_storage::Engine,
    session: &Session,
    select: &Select,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let keyspace_name = coordinator.keyspace_for(session, &select.table.keyspace)?;
    let schema = coordinator.schema();
    let keyspace = schema.keyspace(&keyspace_name)?;
    let table = Arc::clone(schema.table(&keyspace_name, &select.table.name)?);
    coordinator.check_consistency(keyspace, parameters.consistency, false)?;
    ensure(!select.json, || {
        CqlError::invalid("SELECT JSON is not supported by Shoal yet")
    })?;
    ensure(select.group_by.is_empty(), || {
        CqlError::invalid("GROUP BY is not supported by Shoal yet")
    })?;

    let selection = compile_selection(&table, select, bindings)?;
    let limit = match &select.limit {
        Some(term) => positive_int(term, bindings, "LIMIT")?,
        None => None,
    };
    let per_partition_limit = match &select.per_partition_limit {
        Some(term) => positive_int(term, bindings, "PER PARTITION LIMIT")?,
        None => None,
    };
    if table.is_virtual {
        return select_virtual(
            coordinator,
            &schema,
            &table,
            select,
            &selection,
            limit,
            bindings,
        );
    }
    let restrictions = Restrictions::analyse(&table, &select.relations, bindings)?;
    let scanning = restrictions.partition_keys.is_none();
    let clustering_restricted =
        restrictions.clustering_prefix_columns > 0 || restrictions.has_clustering_slice;
    let needs_filtering =
        restrictions.needs_filtering || (scanning && clustering_restricted && !select.distinct);
    ensure(!needs_filtering || select.allow_filtering, || {
        CqlError::invalid("Cannot execute this query as it might involve data filtering and thus may have unpredictable performance. If you want to execute this query despite the performance unpredictability, use ALLOW FILTERING")
    })?;
    if select.distinct {
        ensure(!clustering_restricted, || {
            CqlError::invalid("SELECT DISTINCT with WHERE clause only supports restriction by partition key and/or static columns.")
        })?;
    }

    // ORDER BY: a prefix of the clustering columns, all in declared or all in reversed order.
    let mut reversed = false;
    if !select.order_by.is_empty() {
        ensure(!scanning, || {
            CqlError::invalid("ORDER BY is only supported when the partition key is restricted by an EQ or an IN.")
        })?;
        let clustering: Vec<_> = table.clustering().collect();
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
    }
    let page_size = match parameters.page_size {
        Some(size) if size > 0 && !selection.aggregate => size as usize,
        _ => usize::MAX,
    };
    let sort_across_partitions = !select.order_by.is_empty()
        && restrictions
            .partition_keys
            .as_ref()
            .is_some_and(|k| k.len() > 1);
    ensure(!(sort_across_partitions && page_size != usize::MAX), || {
        CqlError::invalid("Cannot page queries with both ORDER BY and a IN restriction on the partition key; you must either remove the ORDER BY or the IN and sort client side, or disable paging for this query")
    })?;

    let resume = match &parameters.paging_state {
        Some(bytes) => Some(PagingState::decode(bytes)?),
        None => None,
    };
    let limit_remaining = resume
        .as_ref()
        .map_or(limit.unwrap_or(u64::MAX), |r| r.remaining);
    let slices = restrictions.slices();
    let mut visitor = SelectVisitor {
        row_slices: if scanning && clustering_restricted {
            Some(slices.clone())
        } else {
            None
        },
        distinct: select.distinct,
        static_only_rows: !clustering_restricted && table.has_static_columns(),
        page_size,
        per_partition_limit: per_partition_limit.unwrap_or(u64::MAX),
        now_seconds: shoal_model::timestamp::now_seconds(),
        sort_rows: if sort_across_partitions {
            Some(Vec::new())
        } else {
            None
        },
        ..SelectVisitor::new(&table, &selection, &restrictions.filters, limit_remaining)
    };
    let storage_error = |e: shoal_storage::StorageError| CqlError::server(e.to_string());

    if let Some(partition_keys) = &restrictions.partition_keys {
        for partition_key in partition_keys {
            let token = murmur3_token(partition_key);
            if !token_in_range(token, restrictions.token_lower, restrictions.token_upper) {
                continue;
            }
            let mut partition_slices = slices.clone();
            if let Some(state) = &resume {
                match partition_key.cmp(&state.partition_key) {
                    std::cmp::Ordering::Less => continue,
                    std::cmp::Ordering::Equal => match &state.clustering {
                        None => continue,
                        Some(clustering) => {
                            partition_slices = slices_after(&slices, clustering, reversed);
                            visitor.partition_rows = 0;
                        }
                    },
                    std::cmp::Ordering::Greater => {}
                }
            }
            if reversed {
                partition_slices.reverse();
            }
            let resumed_partition = resume
                .as_ref()
                .is_some_and(|s| s.partition_key == *partition_key && s.clustering.is_some());
            let flow = {
                let per_partition_before = if resumed_partition {
                    resume.as_ref().map_or(0, |s| s.partition_rows)
                } else {
                    0
                };
                let mut wrapper = ResumeAware {
                    inner: &mut visitor,
                    initial_partition_rows: per_partition_before,
                };
                reader::read_partition(
                    engine,
                    &table.id,
                    token,
                    partition_key,
                    &partition_slices,
                    reversed,
                    wrapper.inner.now_seconds,
                    &mut wrapper,
                )
                .map_err(storage_error)?
            };
            if let Some(error) = visitor.error.take() {
                return Err(error);
            }
            if flow == Flow::Stop {
                break;
            }
        }
    } else {
        let Some((mut start, end)) = token_range_keys(
            &table.id,
            restrictions.token_lower,
            restrictions.token_upper,
        ) else {
            return Ok(finish(visitor, &selection, parameters, limit));
        };
        let mut stopped = false;
        if let Some(state) = &resume {
            let prefix = keys::partition_prefix(&table.id, state.token, &state.partition_key);
            if let Some(clustering) = &state.clustering {
                let rest = slices_after(&[ClusteringSlice::all()], clustering, false);
                let mut wrapper = ResumeAware {
                    initial_partition_rows: state.partition_rows,
                    inner: &mut visitor,
                };
                let flow = reader::read_partition(
                    engine,
                    &table.id,
                    state.token,
                    &state.partition_key,
                    &rest,
                    false,
                    wrapper.inner.now_seconds,
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
            reader::scan_partitions(engine, &start, &end, visitor.now_seconds, &mut visitor)
                .map_err(storage_error)?;
            if let Some(error) = visitor.error.take() {
                return Err(error);
            }
        }
    }
    Ok(finish(visitor, &selection, parameters, limit))
}

/// True when a SELECT reads a token range of a stored table rather than named partitions
/// (no EQ/IN on every partition key column); such reads run on the scan stage.
pub(crate) fn is_scan(coordinator: &Coordinator, session: &Session, select: &Select) -> bool {
    let Ok(keyspace) = coordinator.keyspace_for(session, &select.table.keyspace) else {
        return false;
    };
    let schema = coordinator.schema();
    let Ok(table) = schema.table(&keyspace, &select.table.name) else {
        return false;
    };
    if table.is_virtual {
        return false;
    }
    let names_partitions = table.partition_key().all(|column| {
        select.relations.iter().any(|relation| {
            matches!(&relation.target, shoal_cql::ast::RelationTarget::Column(name) if *name == column.name)
                && matches!(relation.operator, Operator::Eq | Operator::In)
        })
    });
    !names_partitions
}

/// Sets the per-partition row count when a page resumes inside a partition.
struct ResumeAware<'v, 'a> {
    inner: &'v mut SelectVisitor<'a>,
    initial_partition_rows: u64,
}

impl Visitor for ResumeAware<'_, '_> {
    fn partition(&mut self, header: &PartitionHeader) -> Flow {
        let flow = self.inner.partition(header);
        self.inner.partition_rows = self.initial_partition_rows;
        self.inner.partition_matched_any = self.initial_partition_rows > 0;
        flow
    }
    fn row(&mut self, header: &PartitionHeader, row: Row) -> Flow {
        self.inner.row(header, row)
    }
    fn partition_end(&mut self, header: &PartitionHeader) -> Flow {
        self.inner.partition_end(header)
    }
}

fn finish(
    mut visitor: SelectVisitor<'_>,
    selection: &Selection,
    parameters: &QueryParameters,
    limit: Option<u64>,
) -> ResultBody {
    if selection.aggregate {
        visitor.finish_aggregate();
    }
    if let Some(mut rows) = visitor.sort_rows.take() {
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(limit) = limit {
            rows.truncate(limit as usize);
        }
        for (_, cells) in &rows {
            visitor.buffer.push_row(cells.iter().map(|c| c.as_deref()));
        }
    }
    let paging_state = if visitor.has_more {
        visitor
            .last_position
            .map(|(token, partition_key, clustering)| {
                PagingState {
                    token,
                    partition_key,
                    clustering,
                    remaining: visitor.limit_remaining,
                    partition_rows: visitor.partition_rows,
                }
                .encode()
            })
    } else {
        None
    };
    ResultBody::Rows(Rows {
        columns: selection.columns.clone(),
        paging_state,
        skip_metadata: parameters.skip_metadata,
        rows: visitor.buffer,
    })
}

fn select_virtual(
    coordinator: &Coordinator,
    schema: &shoal_schema::Schema,
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
    let rows = crate::system_tables::rows(coordinator, schema, table);
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
                timestamp: None,
                ttl: None,
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
    Ok(finish(visitor, selection, &parameters, limit))
}

/// Reads one live row (or the static row when `clustering` is `None`).
pub(crate) fn read_single_row(
    coordinator: &Coordinator,
    table: &TableMetadata,
    token: Token,
    partition_key: &[u8],
    clustering: Option<&[u8]>,
) -> Result<Option<Row>, CqlError> {
    struct One {
        row: Option<Row>,
        static_row: Option<Row>,
    }
    impl Visitor for One {
        fn partition(&mut self, header: &PartitionHeader) -> Flow {
            self.static_row = header.static_row.clone();
            Flow::Continue
        }
        fn row(&mut self, _: &PartitionHeader, row: Row) -> Flow {
            self.row = Some(row);
            Flow::Stop
        }
    }
    let slices = match clustering {
        Some(clustering) => vec![ClusteringSlice {
            lower: clustering.to_vec(),
            upper: increment_prefix(clustering),
        }],
        None => Vec::new(),
    };
    let mut one = One {
        row: None,
        static_row: None,
    };
    let now = shoal_model::timestamp::now_seconds();
    reader::read_partition(
        coordinator.engine().as_ref(),
        &table.id,
        token,
        partition_key,
        &slices,
        false,
        now,
        &mut one,
    )
    .map_err(|e| CqlError::server(e.to_string()))?;
    Ok(if clustering.is_some() {
        one.row
    } else {
        one.static_row
    })
}

/// The typed values of every column of one row, if it exists (conditional updates).
pub(crate) fn read_row_values(
    coordinator: &Coordinator,
    table: &TableMetadata,
    token: Token,
    partition_key: &[u8],
    clustering: Option<&[u8]>,
) -> Result<Option<Vec<Option<Value>>>, CqlError> {
    let Some(row) = read_single_row(coordinator, table, token, partition_key, clustering)? else {
        return Ok(None);
    };
    let now = shoal_model::timestamp::now_seconds();
    let mut values = vec![ColumnValue::default(); table.columns.len()];
    fill_from_row(table, row, &mut values, now)?;
    let key_values = decode_partition_key_values(table, partition_key)?;
    let mut typed: Vec<Option<Value>> = Vec::with_capacity(values.len());
    for (column, value) in table.columns.iter().zip(values) {
        typed.push(match &value.bytes {
            Some(bytes) => Some(Value::deserialize(&column.cql_type, bytes)?),
            None => None,
        });
    }
    for (column, value) in table.partition_key().zip(key_values) {
        if let Some(index) = table.column_index(&column.name) {
            typed[index] = Some(value);
        }
    }
    if let Some(clustering) = clustering {
        for (column, value) in table
            .clustering()
            .zip(crate::write::decode_clustering(table, clustering)?)
        {
            if let Some(index) = table.column_index(&column.name) {
                typed[index] = Some(value);
            }
        }
    }
    Ok(Some(typed))
}

/// The result columns a SELECT returns (for PREPARE), checking the selection.
pub(crate) fn result_columns(
    table: &TableMetadata,
    select: &Select,
) -> Result<Vec<ColumnSpec>, CqlError> {
    Ok(compile_selection(table, select, Bindings::NONE)?.columns)
}
