//! The storage walk's consumer for a SELECT: [`SelectVisitor`] receives live rows from
//! [`shoal_storage::reader`], filters them, counts LIMIT / PER PARTITION LIMIT / page size,
//! computes the selection (or the aggregates), and encodes cells straight into the
//! response buffer. A full page stops the walk and remembers the last row returned, which
//! the paging state names.

use crate::functions::{integral, numeric_as_f64, numeric_from_f64};
use crate::paging::PagingState;
use crate::restrictions::Filter;
use crate::select::columns::{
    computed_cell, decode_partition_key_values, fill_from_row, time_list, ColumnValue,
};
use crate::select::grouping::Grouping;
use crate::select::selection::{Aggregate, Output, Selection};
use crate::CqlError;
use shoal_cql::ast::Operator;
use shoal_cql::request::QueryParameters;
use shoal_cql::response::{ResultBody, Rows, RowsBuffer};
use shoal_model::clustering::decode_component;
use shoal_model::{keys, Token, Value};
use shoal_schema::TableMetadata;
use shoal_storage::reader::{ClusteringSlice, Flow, PartitionHeader, Row, Visitor};

/// Running state of one aggregate.
#[derive(Debug, Clone, Default)]
pub(crate) struct Accumulator {
    count: i64,
    sum: f64,
    integral_sum: i128,
    best: Option<Value>,
}

/// The running state of an aggregating SELECT (or of one `GROUP BY` group): each
/// aggregate's, and the first row, whose values the outputs that are not aggregates show
/// (as in Cassandra).
#[derive(Debug, Clone, Default)]
pub(crate) struct Aggregation {
    accumulators: Vec<Accumulator>,
    first_row: Option<(Vec<ColumnValue>, Token)>,
}

impl Aggregation {
    pub(crate) fn new(selection: &Selection) -> Aggregation {
        Aggregation {
            accumulators: vec![Accumulator::default(); selection.aggregate_slots],
            first_row: None,
        }
    }
}

/// A row kept for sorting across partitions: its clustering and its output cells.
type SortableRow = (Vec<u8>, Vec<Option<Vec<u8>>>);

pub(crate) struct SelectVisitor<'a> {
    pub(crate) table: &'a TableMetadata,
    pub(crate) selection: &'a Selection,
    pub(crate) filters: &'a [Filter],
    /// In scans, clustering restrictions become a row predicate.
    pub(crate) row_slices: Option<Vec<ClusteringSlice>>,
    pub(crate) distinct: bool,
    /// Emit a row for a partition that has only static data.
    pub(crate) static_only_rows: bool,
    pub(crate) page_size: usize,
    pub(crate) limit_remaining: u64,
    pub(crate) per_partition_limit: u64,
    pub(crate) now_seconds: i64,
    // Per partition.
    pub(crate) partition_values: Vec<ColumnValue>,
    pub(crate) partition_rows: u64,
    pub(crate) partition_matched_any: bool,
    // Output.
    pub(crate) buffer: RowsBuffer,
    pub(crate) emitted: usize,
    pub(crate) last_position: Option<(Token, Vec<u8>, Option<Vec<u8>>)>,
    pub(crate) has_more: bool,
    pub(crate) aggregation: Aggregation,
    /// `GROUP BY`: the key (partition key, clustering prefix) of the group being
    /// accumulated.
    pub(crate) group: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) sort_rows: Option<Vec<SortableRow>>,
    /// `ORDER BY v ANN OF [...]`: rows are sorted by their vector's score, best first
    /// (rows without a vector are left out).
    pub(crate) nearest: Option<Nearest>,
    pub(crate) error: Option<CqlError>,
}

/// How a nearest-neighbour query scores a row.
#[derive(Debug, Clone)]
pub(crate) struct Nearest {
    /// The vector column's position in the table's columns.
    pub(crate) column: usize,
    pub(crate) query: Vec<f32>,
    pub(crate) similarity: shoal_model::vector::Similarity,
}

impl Nearest {
    /// A sort key putting higher scores first; `None` for a row with no vector to score.
    fn sort_key(&self, values: &[ColumnValue]) -> Option<Vec<u8>> {
        let bytes = values.get(self.column)?.bytes.as_ref()?;
        let score = self
            .similarity
            .score(&shoal_model::vector::floats(bytes), &self.query)
            .ok()?;
        // Scores are in [0, 1]: their bits order as unsigned integers.
        Some((!score.to_bits()).to_be_bytes().to_vec())
    }
}

impl<'a> SelectVisitor<'a> {
    /// A visitor with no paging, no per-partition limit and nothing to sort.
    pub(crate) fn new(
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
            aggregation: Aggregation::new(selection),
            group: None,
            sort_rows: None,
            nearest: None,
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
                self.selection.element_times,
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

    /// Each output's cell for one row, before [`Selection::finish_row`]. Aggregates give
    /// `None` here (see [`SelectVisitor::accumulate`]).
    fn output_cells(
        &self,
        values: &[ColumnValue],
        token: Token,
    ) -> Result<Vec<Option<Vec<u8>>>, CqlError> {
        self.selection
            .outputs
            .iter()
            .map(|output| self.output_cell(output, values, token))
            .collect()
    }

    fn output_cell(
        &self,
        output: &Output,
        values: &[ColumnValue],
        token: Token,
    ) -> Result<Option<Vec<u8>>, CqlError> {
        Ok(match output {
            Output::Column(index) => values[*index].bytes.clone(),
            Output::WriteTime(index) => values[*index].timestamp.map(|t| t.to_be_bytes().to_vec()),
            Output::Ttl(index) => values[*index].ttl.map(|t| t.to_be_bytes().to_vec()),
            // The latest of the cells: a single cell's own timestamp.
            Output::MaxWriteTime(index) => {
                values[*index].timestamp.map(|t| t.to_be_bytes().to_vec())
            }
            Output::WriteTimes(index) => time_list(&values[*index].element_times, |time| {
                Some(time.timestamp.to_be_bytes())
            }),
            Output::Ttls(index) => time_list(&values[*index].element_times, |time| {
                time.ttl.map(i32::to_be_bytes)
            }),
            Output::Token => Some(token.0.to_be_bytes().to_vec()),
            Output::Constant(bytes) => bytes.clone(),
            Output::ToJson { .. }
            | Output::Field { .. }
            | Output::Call { .. }
            | Output::Similarity { .. }
            | Output::Mask { .. } => {
                let arguments = output
                    .arguments()
                    .iter()
                    .map(|argument| self.output_cell(argument, values, token))
                    .collect::<Result<Vec<_>, CqlError>>()?;
                computed_cell(output, arguments)?
            }
            // Aggregates are computed once the rows are in (`finish_aggregate`); terms
            // are constants by now (`Selection::bind`).
            Output::Aggregate { .. } | Output::Term(_) => None,
        })
    }

    fn accumulate(&mut self, values: &[ColumnValue], token: Token) -> Result<(), CqlError> {
        if self.aggregation.first_row.is_none() {
            self.aggregation.first_row = Some((values.to_vec(), token));
        }
        for output in &self.selection.outputs {
            self.accumulate_into(output, values, token)?;
        }
        Ok(())
    }

    /// Adds one row to every aggregate inside `output`.
    fn accumulate_into(
        &mut self,
        output: &Output,
        values: &[ColumnValue],
        token: Token,
    ) -> Result<(), CqlError> {
        let Output::Aggregate {
            function,
            argument,
            argument_type,
            slot,
        } = output
        else {
            for argument in output.arguments() {
                self.accumulate_into(argument, values, token)?;
            }
            return Ok(());
        };
        let value = match argument {
            // count(*): every row.
            None => {
                self.aggregation.accumulators[*slot].count += 1;
                return Ok(());
            }
            Some(argument) => match self.output_cell(argument, values, token)? {
                None => return Ok(()),
                Some(bytes) => Value::deserialize(argument_type, &bytes)?,
            },
        };
        let accumulator = &mut self.aggregation.accumulators[*slot];
        match function {
            Aggregate::Count => accumulator.count += 1,
            Aggregate::Min | Aggregate::Max => {
                let better = accumulator.best.as_ref().is_none_or(|best| {
                    let order = value.compare(best);
                    if *function == Aggregate::Min {
                        order.is_lt()
                    } else {
                        order.is_gt()
                    }
                });
                if better {
                    accumulator.best = Some(value);
                }
            }
            Aggregate::Sum | Aggregate::Avg => {
                accumulator.count += 1;
                accumulator.sum += numeric_as_f64(&value);
                accumulator.integral_sum += integral(&value);
            }
        }
        Ok(())
    }

    /// One output's cell once the rows are aggregated: an aggregate's result, computed on
    /// for the functions of aggregates (`abs(max(v))`); any other output as the first row
    /// gives it.
    fn aggregated_cell(&self, output: &Output) -> Result<Option<Vec<u8>>, CqlError> {
        if !output.has_aggregate() {
            return match &self.aggregation.first_row {
                Some((values, token)) => self.output_cell(output, values, *token),
                None => Ok(None),
            };
        }
        Ok(match output {
            Output::Aggregate {
                function,
                argument_type,
                slot,
                ..
            } => {
                let accumulator = &self.aggregation.accumulators[*slot];
                match function {
                    Aggregate::Count => Some(accumulator.count.to_be_bytes().to_vec()),
                    Aggregate::Min | Aggregate::Max => {
                        accumulator.best.as_ref().map(Value::serialize)
                    }
                    Aggregate::Sum => Some(
                        numeric_from_f64(argument_type, accumulator.sum, accumulator.integral_sum)
                            .serialize(),
                    ),
                    Aggregate::Avg => {
                        let count = accumulator.count.max(1);
                        Some(
                            numeric_from_f64(
                                argument_type,
                                accumulator.sum / count as f64,
                                accumulator.integral_sum / count as i128,
                            )
                            .serialize(),
                        )
                    }
                }
            }
            _ => {
                let arguments = output
                    .arguments()
                    .iter()
                    .map(|argument| self.aggregated_cell(argument))
                    .collect::<Result<Vec<_>, CqlError>>()?;
                computed_cell(output, arguments)?
            }
        })
    }

    fn finish_aggregate(&mut self) {
        let cells: Result<Vec<Option<Vec<u8>>>, CqlError> = self
            .selection
            .outputs
            .iter()
            .map(|output| self.aggregated_cell(output))
            .collect();
        match cells.and_then(|cells| self.selection.finish_row(cells)) {
            Ok(cells) => self.buffer.push_row(cells.iter().map(|c| c.as_deref())),
            Err(error) => {
                self.fail(error);
            }
        }
    }

    /// `GROUP BY`: adds a row to its group. The first row of a new group closes the one
    /// before (its result row is emitted); a full page or the LIMIT stops the walk there,
    /// so a page always ends on a whole group and paging resumes at the next one.
    fn group_row(
        &mut self,
        grouping: Grouping,
        header: &PartitionHeader,
        values: &[ColumnValue],
        clustering: Option<Vec<u8>>,
    ) -> Flow {
        let prefix = match clustering.as_deref() {
            Some(bytes) => {
                match clustering_prefix(self.table, bytes, grouping.clustering_columns) {
                    Ok(prefix) => prefix.to_vec(),
                    Err(error) => return self.fail(error),
                }
            }
            None => Vec::new(),
        };
        let same_group = self
            .group
            .as_ref()
            .is_some_and(|(key, group_prefix)| *key == header.key && *group_prefix == prefix);
        if !same_group {
            if self.group.is_some() {
                self.close_group();
                if self.limit_remaining == 0 {
                    return Flow::Stop;
                }
                if self.emitted >= self.page_size {
                    self.has_more = true;
                    return Flow::Stop;
                }
            }
            self.group = Some((header.key.clone(), prefix));
        }
        if let Err(error) = self.accumulate(values, header.token) {
            return self.fail(error);
        }
        self.partition_matched_any = true;
        self.last_position = Some((header.token, header.key.clone(), clustering));
        Flow::Continue
    }

    /// Emits the open group's result row and starts afresh.
    pub(crate) fn close_group(&mut self) {
        if self.group.take().is_none() {
            return;
        }
        self.finish_aggregate();
        self.aggregation = Aggregation::new(self.selection);
        self.emitted += 1;
        self.limit_remaining = self.limit_remaining.saturating_sub(1);
    }

    /// Emits one candidate row; returns the flow for the storage walk.
    pub(crate) fn emit(
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
        if let Some(grouping) = self.selection.grouping {
            return self.group_row(grouping, header, &values, clustering);
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
        let nearest_key = match &self.nearest {
            Some(nearest) => match nearest.sort_key(&values) {
                Some(key) => Some(key),
                None => return Flow::Continue,
            },
            None => None,
        };
        if self.emitted >= self.page_size {
            self.has_more = true;
            return Flow::Stop;
        }
        let cells = match self
            .output_cells(&values, header.token)
            .and_then(|cells| self.selection.finish_row(cells))
        {
            Ok(cells) => cells,
            Err(error) => return self.fail(error),
        };
        match &mut self.sort_rows {
            Some(rows) => rows.push((
                nearest_key.unwrap_or_else(|| clustering.clone().unwrap_or_default()),
                cells,
            )),
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
        let element_times = self.selection.element_times;
        if let Err(error) = fill_from_row(
            self.table,
            row,
            &mut values,
            self.now_seconds,
            element_times,
        ) {
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

/// Sets the per-partition row count when a page resumes inside a partition.
pub(crate) struct ResumeAware<'v, 'a> {
    pub(crate) inner: &'v mut SelectVisitor<'a>,
    pub(crate) initial_partition_rows: u64,
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

pub(crate) fn finish(
    mut visitor: SelectVisitor<'_>,
    selection: &Selection,
    parameters: &QueryParameters,
    limit: Option<u64>,
) -> Result<ResultBody, CqlError> {
    if selection.grouping.is_some() {
        // The last group ends with the walk (unless the walk stopped on a group boundary).
        visitor.close_group();
    } else if selection.aggregate {
        visitor.finish_aggregate();
    }
    if let Some(error) = visitor.error.take() {
        return Err(error);
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
    Ok(ResultBody::Rows(Rows {
        columns: selection.columns.clone(),
        paging_state,
        skip_metadata: parameters.skip_metadata,
        rows: visitor.buffer,
    }))
}

/// The bytes of the first `columns` clustering values of a row's clustering.
fn clustering_prefix<'c>(
    table: &TableMetadata,
    clustering: &'c [u8],
    columns: usize,
) -> Result<&'c [u8], CqlError> {
    let mut position = 0;
    for column in table.clustering().take(columns) {
        let (_, used) =
            decode_component(&clustering[position..], &column.cql_type, column.descending)?;
        position += used;
    }
    Ok(&clustering[..position])
}
