//! INSERT, UPDATE, DELETE and BATCH: from statements to cell mutations.
//!
//! Every modification becomes cells in a [`WriteBatch`] (see [`shoal_model::keys`] for
//! where each cell lives): values, TTL'd values and tombstones, all stamped with the
//! statement's write timestamp. Nothing is read first, except where CQL itself requires it
//! (list element assignment and removal, and conditional `IF` statements, as in Cassandra).
//! A BATCH is one [`WriteBatch`], applied atomically on this node.

use crate::read;
use crate::restrictions::Restrictions;
use crate::values::{evaluate, new_timeuuid, Bindings, Bound};
use crate::{ensure, Coordinator, CqlError, Session};
use shoal_cql::ast::{
    Assignment, Batch, BatchType, Conditions, Delete, Insert, Operator, Statement, Term, Update,
    Using,
};
use shoal_cql::request::{BatchQuery, BatchRequest, Consistency, QueryParameters};
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::clustering::{decode_component, encode_component};
use shoal_model::keys;
use shoal_model::token::murmur3_token;
use shoal_model::{Cell, CqlType, Token, Value, WriteTimestamp};
use shoal_replication::WriteType;
use shoal_schema::{ColumnKind, ColumnMetadata, KeyspaceMetadata, TableMetadata};
use shoal_storage::WriteBatch;
use std::sync::Arc;

/// Cassandra's maximum TTL (20 years).
pub const MAX_TTL_SECONDS: i32 = 630_720_000;

/// A row a statement wrote (`clustering: None` for a static row or a whole partition).
pub(crate) struct RowAddress {
    token: Token,
    partition_key: Vec<u8>,
    clustering: Option<Vec<u8>>,
}

/// Where and how one statement writes.
struct WriteContext<'a> {
    table: &'a TableMetadata,
    timestamp: WriteTimestamp,
    ttl_seconds: i32,
    now_seconds: i64,
}

impl WriteContext<'_> {
    /// A writer for the row whose keys start with `prefix`, stamped with this statement's
    /// timestamp and TTL.
    fn writer<'b>(&self, batch: &'b mut WriteBatch, prefix: Vec<u8>) -> RowWriter<'b> {
        RowWriter {
            batch,
            prefix,
            timestamp: self.timestamp,
            ttl_seconds: self.ttl_seconds,
            now_seconds: self.now_seconds,
        }
    }
}

/// Writes the cells of one row (or of a partition's static row).
struct RowWriter<'a> {
    batch: &'a mut WriteBatch,
    /// `partition prefix | section [| clustering]`.
    prefix: Vec<u8>,
    timestamp: WriteTimestamp,
    ttl_seconds: i32,
    now_seconds: i64,
}

impl RowWriter<'_> {
    fn put(&mut self, part: impl FnOnce(&mut Vec<u8>), cell: Cell) {
        let mut key = self.prefix.clone();
        keys::push_column_part(&mut key, part);
        self.batch.merge(key, cell.encode());
    }

    fn live(&self, value: Vec<u8>) -> Cell {
        Cell::with_ttl(self.timestamp, value, self.ttl_seconds, self.now_seconds)
    }

    fn tombstone(&self) -> Cell {
        Cell::tombstone(self.timestamp, self.now_seconds)
    }

    fn marker(&mut self) {
        let cell = self.live(Vec::new());
        self.put(|k| k.push(keys::COLUMN_ROW_MARKER), cell);
    }

    fn row_deletion(&mut self) {
        let cell = self.tombstone();
        self.put(|k| k.push(keys::COLUMN_ROW_DELETION), cell);
    }

    fn cell(&mut self, column: &str, path: &[u8], value: Option<Vec<u8>>) {
        let cell = match value {
            Some(bytes) => self.live(bytes),
            None => self.tombstone(),
        };
        self.put(|k| keys::push_cell_column(k, column, path), cell);
    }

    /// Deletes a whole non-frozen collection; `before_write` shadows only what is older
    /// than this statement, so the statement's own elements survive (an overwrite).
    fn collection_deletion(&mut self, column: &str, before_write: bool) {
        let timestamp = if before_write {
            WriteTimestamp(self.timestamp.0 - 1)
        } else {
            self.timestamp
        };
        let cell = Cell::tombstone(timestamp, self.now_seconds);
        self.put(|k| keys::push_collection_deletion(k, column), cell);
    }
}

/// A list element's cell path: time-ordered, so appends sort after and prepends before
/// existing elements.
fn list_path(prepend: bool) -> Vec<u8> {
    let uuid = new_timeuuid();
    let ticks = shoal_model::value::uuid_timestamp(&uuid);
    let mut path = Vec::with_capacity(17);
    if prepend {
        path.push(0);
        path.extend_from_slice(&(u64::MAX - ticks).to_be_bytes());
    } else {
        path.push(1);
        path.extend_from_slice(&ticks.to_be_bytes());
    }
    path.extend_from_slice(&uuid[8..]);
    path
}

fn element_path(value: &Value) -> Vec<u8> {
    let mut path = Vec::new();
    encode_component(&mut path, value, false);
    path
}

/// Writes a whole value into a column (INSERT, or UPDATE `c = value`).
fn write_column_value(writer: &mut RowWriter<'_>, column: &ColumnMetadata, value: Option<Value>) {
    if !column.cql_type.is_multi_cell() {
        writer.cell(&column.name, b"", value.map(|v| v.serialize()));
        return;
    }
    writer.collection_deletion(&column.name, true);
    match value {
        Some(Value::List(elements)) => {
            for element in elements {
                writer.cell(&column.name, &list_path(false), Some(element.serialize()));
            }
        }
        Some(Value::Set(elements)) => {
            for element in elements {
                writer.cell(&column.name, &element_path(&element), Some(Vec::new()));
            }
        }
        Some(Value::Map(entries)) => {
            for (key, value) in entries {
                writer.cell(&column.name, &element_path(&key), Some(value.serialize()));
            }
        }
        _ => {}
    }
}

fn eval(
    term: &Term,
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Bound, CqlError> {
    evaluate(term, cql_type, bindings, receiver)
}

fn using_timestamp(using: &Using, bindings: Bindings<'_>) -> Result<Option<i64>, CqlError> {
    match &using.timestamp {
        None => Ok(None),
        Some(term) => match eval(term, &CqlType::Bigint, bindings, "[timestamp]")? {
            Bound::Value(Value::Bigint(t)) => Ok(Some(t)),
            Bound::Unset => Ok(None),
            _ => Err(CqlError::invalid("Invalid null value of timestamp")),
        },
    }
}

fn using_ttl(
    using: &Using,
    table: &TableMetadata,
    bindings: Bindings<'_>,
) -> Result<i32, CqlError> {
    match &using.ttl {
        None => Ok(table.options.default_time_to_live),
        Some(term) => match eval(term, &CqlType::Int, bindings, "[ttl]")? {
            Bound::Value(Value::Int(ttl)) => {
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
            Bound::Unset => Ok(table.options.default_time_to_live),
            _ => Err(CqlError::invalid("Invalid null value of TTL")),
        },
    }
}

/// The partitions a modification names: every partition key column by EQ or IN.
fn partitions(
    table: &TableMetadata,
    restrictions: &Restrictions,
) -> Result<Vec<(Token, Vec<u8>)>, CqlError> {
    let Some(keys) = &restrictions.partition_keys else {
        let missing: Vec<&str> = table.partition_key().map(|c| c.name.as_str()).collect();
        return Err(CqlError::invalid(format!(
            "Some partition key parts are missing: {}",
            missing.join(", ")
        )));
    };
    ensure(
        restrictions.token_lower.is_none() && restrictions.token_upper.is_none(),
        || {
            CqlError::invalid("The token function cannot be used in WHERE clauses for UPDATE and DELETE statements")
        },
    )?;
    for key in keys {
        ensure(key.len() <= u16::MAX as usize, || {
            CqlError::invalid(format!(
                "Key length of {} is longer than maximum of 65535",
                key.len()
            ))
        })?;
    }
    Ok(keys.iter().map(|k| (murmur3_token(k), k.clone())).collect())
}

fn check_no_filters(table: &TableMetadata, restrictions: &Restrictions) -> Result<(), CqlError> {
    if let Some(filter) = restrictions.filters.first() {
        let column = &table.columns[filter.column];
        let message = match column.kind {
            ColumnKind::Regular | ColumnKind::Static => format!("Non PRIMARY KEY columns found in where clause: {}", column.name),
            _ => format!("PRIMARY KEY column \"{}\" cannot be restricted as preceding column is not restricted", column.name),
        };
        return Err(CqlError::invalid(message));
    }
    Ok(())
}

fn missing_clustering(table: &TableMetadata, restrictions: &Restrictions) -> CqlError {
    let missing: Vec<&str> = table
        .clustering()
        .skip(restrictions.clustering_prefix_columns)
        .map(|c| c.name.as_str())
        .collect();
    CqlError::invalid(format!(
        "Some clustering keys are missing: {}",
        missing.join(", ")
    ))
}

fn build_insert(
    ctx: &WriteContext<'_>,
    insert: &Insert,
    bindings: Bindings<'_>,
    batch: &mut WriteBatch,
) -> Result<Vec<RowAddress>, CqlError> {
    let table = ctx.table;
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
    let mut values: Vec<Option<Bound>> = vec![None; table.columns.len()];
    for (name, term) in insert.columns.iter().zip(&insert.values) {
        let (index, column) = table.require_column(name)?;
        ensure(values[index].is_none(), || {
            CqlError::invalid(format!("Multiple definitions found for column {name}"))
        })?;
        values[index] = Some(eval(term, &column.cql_type, bindings, name)?);
    }
    let mut key_components = Vec::new();
    for column in table.partition_key() {
        match values[table.column_index(&column.name).unwrap_or(0)].take() {
            Some(Bound::Value(value)) => key_components.push(value.serialize()),
            Some(_) => {
                return Err(CqlError::invalid(format!(
                    "Invalid null value in condition for column {}",
                    column.name
                )))
            }
            None => {
                return Err(CqlError::invalid(format!(
                    "Some partition key parts are missing: {}",
                    column.name
                )))
            }
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
    let mut clustering = Vec::new();
    let mut clustering_complete = true;
    for (position, column) in table.clustering().enumerate() {
        match values[table.column_index(&column.name).unwrap_or(0)].take() {
            Some(Bound::Value(value)) => clustering.extend(
                crate::restrictions::encode_clustering_value(table, position, &value),
            ),
            Some(_) => {
                return Err(CqlError::invalid(format!(
                    "Invalid null value in condition for column {}",
                    column.name
                )))
            }
            None => clustering_complete = false,
        }
    }
    let only_static = table
        .columns
        .iter()
        .zip(&values)
        .all(|(column, value)| value.is_none() || column.kind == ColumnKind::Static);
    let static_only_insert =
        only_static && table.clustering_count() > 0 && values.iter().any(Option::is_some);
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
    let prefix = keys::partition_prefix(&table.id, token, &partition_key);
    let mut row_prefix = prefix.clone();
    let mut static_prefix = prefix;
    static_prefix.push(keys::SECTION_STATIC_ROW);
    if clustering_complete {
        row_prefix.push(keys::SECTION_ROW);
        row_prefix.extend_from_slice(&clustering);
        let mut writer = ctx.writer(batch, row_prefix);
        writer.marker();
        for (column, value) in table.columns.iter().zip(values.iter_mut()) {
            if column.kind == ColumnKind::Regular {
                match value.take() {
                    Some(Bound::Value(v)) => write_column_value(&mut writer, column, Some(v)),
                    Some(Bound::Null) => write_column_value(&mut writer, column, None),
                    _ => {}
                }
            }
        }
    }
    let mut static_writer = ctx.writer(batch, static_prefix);
    for (column, value) in table.columns.iter().zip(values.iter_mut()) {
        if column.kind == ColumnKind::Static {
            match value.take() {
                Some(Bound::Value(v)) => write_column_value(&mut static_writer, column, Some(v)),
                Some(Bound::Null) => write_column_value(&mut static_writer, column, None),
                _ => {}
            }
        }
    }
    Ok(vec![RowAddress {
        token,
        partition_key,
        clustering: clustering_complete.then_some(clustering),
    }])
}

/// Reads the current cells of one column of one row (for list operations).
fn current_cells(
    coordinator: &Coordinator,
    table: &TableMetadata,
    token: Token,
    partition_key: &[u8],
    clustering: Option<&[u8]>,
    column: &str,
) -> Result<Vec<(Vec<u8>, Cell)>, CqlError> {
    let row = read::read_single_row(coordinator, table, token, partition_key, clustering)?;
    Ok(row
        .and_then(|row| row.columns.into_iter().find(|c| c.name == column))
        .map(|c| c.cells)
        .unwrap_or_default())
}

struct RowTarget<'a> {
    coordinator: &'a Coordinator,
    token: Token,
    partition_key: &'a [u8],
    clustering: Option<&'a [u8]>,
}

fn apply_assignment(
    writer: &mut RowWriter<'_>,
    target: &RowTarget<'_>,
    table: &TableMetadata,
    assignment: &Assignment,
    bindings: Bindings<'_>,
) -> Result<(), CqlError> {
    let name = assignment.column();
    let (_, column) = table.require_column(name)?;
    ensure(
        matches!(column.kind, ColumnKind::Regular | ColumnKind::Static),
        || CqlError::invalid(format!("PRIMARY KEY part {name} found in SET part")),
    )?;
    let list_index = |key: &Term| -> Result<usize, CqlError> {
        match eval(key, &CqlType::Int, bindings, name)? {
            Bound::Value(Value::Int(i)) if i >= 0 => Ok(i as usize),
            Bound::Value(Value::Int(i)) => Err(CqlError::invalid(format!(
                "Invalid negative list index {i}"
            ))),
            _ => Err(CqlError::invalid("Invalid null value for list index")),
        }
    };
    match (assignment, &column.cql_type) {
        (Assignment::Set { value, .. }, cql_type) => match eval(value, cql_type, bindings, name)? {
            Bound::Value(v) => write_column_value(writer, column, Some(v)),
            Bound::Null => write_column_value(writer, column, None),
            Bound::Unset => {}
        },
        (
            Assignment::Add { value, .. } | Assignment::Prepend { value, .. },
            cql_type @ CqlType::List { frozen: false, .. },
        ) => {
            if let Bound::Value(Value::List(elements)) = eval(value, cql_type, bindings, name)? {
                let prepend = matches!(assignment, Assignment::Prepend { .. });
                let ordered: Vec<Value> = if prepend {
                    elements.into_iter().rev().collect()
                } else {
                    elements
                };
                for element in ordered {
                    writer.cell(name, &list_path(prepend), Some(element.serialize()));
                }
            }
        }
        (Assignment::Add { value, .. }, cql_type @ CqlType::Set { frozen: false, .. }) => {
            if let Bound::Value(Value::Set(elements)) = eval(value, cql_type, bindings, name)? {
                for element in elements {
                    writer.cell(name, &element_path(&element), Some(Vec::new()));
                }
            }
        }
        (Assignment::Add { value, .. }, cql_type @ CqlType::Map { frozen: false, .. }) => {
            if let Bound::Value(Value::Map(entries)) = eval(value, cql_type, bindings, name)? {
                for (key, value) in entries {
                    writer.cell(name, &element_path(&key), Some(value.serialize()));
                }
            }
        }
        (Assignment::Remove { value, .. }, cql_type @ CqlType::Set { frozen: false, .. }) => {
            if let Bound::Value(Value::Set(elements)) = eval(value, cql_type, bindings, name)? {
                for element in elements {
                    writer.cell(name, &element_path(&element), None);
                }
            }
        }
        (
            Assignment::Remove { value, .. },
            CqlType::Map {
                key, frozen: false, ..
            },
        ) => {
            let keys_type = CqlType::Set {
                element: key.clone(),
                frozen: false,
            };
            if let Bound::Value(Value::Set(keys)) = eval(value, &keys_type, bindings, name)? {
                for key in keys {
                    writer.cell(name, &element_path(&key), None);
                }
            }
        }
        (Assignment::Remove { value, .. }, cql_type @ CqlType::List { frozen: false, .. }) => {
            if let Bound::Value(Value::List(removed)) = eval(value, cql_type, bindings, name)? {
                let removed: Vec<Vec<u8>> = removed.iter().map(Value::serialize).collect();
                for (path, cell) in current_cells(
                    target.coordinator,
                    table,
                    target.token,
                    target.partition_key,
                    target.clustering,
                    name,
                )? {
                    if removed.contains(&cell.value) {
                        writer.cell(name, &path, None);
                    }
                }
            }
        }
        (
            Assignment::SetElement { key, value, .. },
            CqlType::List {
                element,
                frozen: false,
            },
        ) => {
            let index = list_index(key)?;
            let cells = current_cells(
                target.coordinator,
                table,
                target.token,
                target.partition_key,
                target.clustering,
                name,
            )?;
            let (path, _) = cells.get(index).ok_or_else(|| {
                CqlError::invalid(format!(
                    "List index {index} out of bound, list has size {}",
                    cells.len()
                ))
            })?;
            let new_value = match eval(value, element, bindings, name)? {
                Bound::Value(v) => Some(v.serialize()),
                _ => None,
            };
            writer.cell(name, path, new_value);
        }
        (
            Assignment::SetElement { key, value, .. },
            CqlType::Map {
                key: key_type,
                value: value_type,
                frozen: false,
            },
        ) => {
            let key = eval(key, key_type, bindings, name)?.into_value(name)?;
            let new_value = match eval(value, value_type, bindings, name)? {
                Bound::Value(v) => Some(v.serialize()),
                _ => None,
            };
            writer.cell(name, &element_path(&key), new_value);
        }
        (Assignment::SetElement { .. }, other) => {
            return Err(CqlError::invalid(format!("Invalid operation ({name}[...] = ...) for non-list, non-map column {name} of type {other}")));
        }
        (_, other) => {
            return Err(CqlError::invalid(format!("Invalid operation ({name} = {name} +/- ...) for non-collection column {name} of type {other}")));
        }
    }
    Ok(())
}

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

fn build_update(
    coordinator: &Coordinator,
    ctx: &WriteContext<'_>,
    update: &Update,
    bindings: Bindings<'_>,
    batch: &mut WriteBatch,
) -> Result<Vec<RowAddress>, CqlError> {
    let table = ctx.table;
    let restrictions = Restrictions::analyse(table, &update.relations, bindings)?;
    check_no_filters(table, &restrictions)?;
    ensure(!restrictions.has_clustering_slice, || {
        CqlError::invalid(
            "Slice restrictions are not supported on the clustering columns in UPDATE statements",
        )
    })?;
    let static_only = update.assignments.iter().all(|a| {
        table
            .column(a.column())
            .is_some_and(|c| c.kind == ColumnKind::Static)
    });
    let static_only =
        static_only && restrictions.clustering_prefix_columns == 0 && table.clustering_count() > 0;
    if !static_only && !restrictions.names_full_rows(table) {
        return Err(missing_clustering(table, &restrictions));
    }
    let mut touched = Vec::new();
    for (token, partition_key) in partitions(table, &restrictions)? {
        for (prefix, clustering) in
            row_prefixes(table, token, &partition_key, &restrictions, static_only)
        {
            let target = RowTarget {
                coordinator,
                token,
                partition_key: &partition_key,
                clustering: clustering.as_deref(),
            };
            let mut writer = ctx.writer(batch, prefix);
            let mut static_writer_prefix = keys::partition_prefix(&table.id, token, &partition_key);
            static_writer_prefix.push(keys::SECTION_STATIC_ROW);
            for assignment in &update.assignments {
                let is_static = table
                    .column(assignment.column())
                    .is_some_and(|c| c.kind == ColumnKind::Static);
                if is_static && !static_only {
                    let mut static_writer = ctx.writer(writer.batch, static_writer_prefix.clone());
                    let static_target = RowTarget {
                        clustering: None,
                        ..target
                    };
                    apply_assignment(
                        &mut static_writer,
                        &static_target,
                        table,
                        assignment,
                        bindings,
                    )?;
                } else {
                    apply_assignment(&mut writer, &target, table, assignment, bindings)?;
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

fn build_delete(
    coordinator: &Coordinator,
    ctx: &WriteContext<'_>,
    delete: &Delete,
    bindings: Bindings<'_>,
    batch: &mut WriteBatch,
) -> Result<Vec<RowAddress>, CqlError> {
    let table = ctx.table;
    ensure(delete.using.ttl.is_none(), || {
        CqlError::invalid("Cannot set TTL on DELETE")
    })?;
    let restrictions = Restrictions::analyse(table, &delete.relations, bindings)?;
    check_no_filters(table, &restrictions)?;
    let mut touched = Vec::new();
    let whole_partition =
        restrictions.clustering_prefix_columns == 0 && !restrictions.has_clustering_slice;
    for (token, partition_key) in partitions(table, &restrictions)? {
        let prefix = keys::partition_prefix(&table.id, token, &partition_key);
        if delete.targets.is_empty() {
            if whole_partition && table.clustering_count() > 0 {
                let mut key = prefix.clone();
                key.push(keys::SECTION_PARTITION_DELETION);
                batch.merge(
                    key,
                    Cell::tombstone(ctx.timestamp, ctx.now_seconds).encode(),
                );
            } else if restrictions.names_full_rows(table) {
                for (row_prefix, clustering) in
                    row_prefixes(table, token, &partition_key, &restrictions, false)
                {
                    let mut writer = ctx.writer(batch, row_prefix);
                    writer.row_deletion();
                    touched.push(RowAddress {
                        token,
                        partition_key: partition_key.clone(),
                        clustering,
                    });
                }
                continue;
            } else {
                for slice in restrictions.slices() {
                    let mut key = prefix.clone();
                    let (end, end_inclusive) = match &slice.upper {
                        Some(upper) => (upper.as_slice(), false),
                        None => (&[][..], true),
                    };
                    keys::push_range_tombstone(&mut key, &slice.lower, true, end, end_inclusive);
                    batch.merge(
                        key,
                        Cell::tombstone(ctx.timestamp, ctx.now_seconds).encode(),
                    );
                }
            }
            touched.push(RowAddress {
                token,
                partition_key: partition_key.clone(),
                clustering: None,
            });
            continue;
        }
        let static_only = delete.targets.iter().all(|t| {
            table
                .column(&t.column)
                .is_some_and(|c| c.kind == ColumnKind::Static)
        });
        let static_only = static_only && restrictions.clustering_prefix_columns == 0;
        if !static_only && !restrictions.names_full_rows(table) {
            return Err(missing_clustering(table, &restrictions));
        }
        for (row_prefix, clustering) in row_prefixes(
            table,
            token,
            &partition_key,
            &restrictions,
            static_only && table.clustering_count() > 0,
        ) {
            let mut writer = ctx.writer(batch, row_prefix);
            for target in &delete.targets {
                let (_, column) = table.require_column(&target.column)?;
                ensure(
                    matches!(column.kind, ColumnKind::Regular | ColumnKind::Static),
                    || {
                        CqlError::invalid(format!(
                            "Invalid identifier {} for deletion (should not be a PRIMARY KEY part)",
                            column.name
                        ))
                    },
                )?;
                if column.kind == ColumnKind::Static && !static_only {
                    return Err(CqlError::invalid("Deleting static and regular columns in one DELETE is not supported by Shoal yet"));
                }
                match (&target.element, &column.cql_type) {
                    (None, cql_type) if cql_type.is_multi_cell() => {
                        writer.collection_deletion(&column.name, false)
                    }
                    (None, _) => writer.cell(&column.name, b"", None),
                    (
                        Some(key),
                        CqlType::Map {
                            key: key_type,
                            frozen: false,
                            ..
                        },
                    ) => {
                        let key = eval(key, key_type, bindings, &column.name)?
                            .into_value(&column.name)?;
                        writer.cell(&column.name, &element_path(&key), None);
                    }
                    (Some(index), CqlType::List { frozen: false, .. }) => {
                        let index = match eval(index, &CqlType::Int, bindings, &column.name)? {
                            Bound::Value(Value::Int(i)) if i >= 0 => i as usize,
                            _ => return Err(CqlError::invalid("Invalid list index")),
                        };
                        let cells = current_cells(
                            coordinator,
                            table,
                            token,
                            &partition_key,
                            clustering.as_deref(),
                            &column.name,
                        )?;
                        let (path, _) = cells.get(index).ok_or_else(|| {
                            CqlError::invalid(format!(
                                "List index {index} out of bound, list has size {}",
                                cells.len()
                            ))
                        })?;
                        writer.cell(&column.name, path, None);
                    }
                    (
                        Some(element),
                        CqlType::Set {
                            element: element_type,
                            frozen: false,
                        },
                    ) => {
                        let element = eval(element, element_type, bindings, &column.name)?
                            .into_value(&column.name)?;
                        writer.cell(&column.name, &element_path(&element), None);
                    }
                    (Some(_), other) => {
                        return Err(CqlError::invalid(format!(
                            "Invalid element deletion for column {} of type {other}",
                            column.name
                        )));
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

/// Builds the cells of one INSERT/UPDATE/DELETE into `batch`.
fn build_statement(
    coordinator: &Coordinator,
    table: &TableMetadata,
    statement: &Statement,
    bindings: Bindings<'_>,
    default_timestamp: Option<i64>,
    batch: &mut WriteBatch,
) -> Result<Vec<RowAddress>, CqlError> {
    let using = match statement {
        Statement::Insert(insert) => &insert.using,
        Statement::Update(update) => &update.using,
        Statement::Delete(delete) => &delete.using,
        _ => {
            return Err(CqlError::invalid(
                "Only INSERT, UPDATE and DELETE are modifications",
            ))
        }
    };
    let timestamp = using_timestamp(using, bindings)?
        .or(default_timestamp)
        .map(WriteTimestamp)
        .unwrap_or_else(WriteTimestamp::now);
    let ttl_seconds = match statement {
        // Deletions never expire.
        Statement::Delete(_) => 0,
        _ => using_ttl(using, table, bindings)?,
    };
    let now_seconds = shoal_model::timestamp::now_seconds();
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
    match statement {
        Statement::Insert(insert) => build_insert(&ctx, insert, bindings, batch),
        Statement::Update(update) => build_update(coordinator, &ctx, update, bindings, batch),
        Statement::Delete(delete) => build_delete(coordinator, &ctx, delete, bindings, batch),
        _ => unreachable_modification(),
    }
}

fn unreachable_modification() -> Result<Vec<RowAddress>, CqlError> {
    Err(CqlError::server("not a modification statement"))
}

fn statement_table(statement: &Statement) -> &shoal_cql::ast::QualifiedName {
    match statement {
        Statement::Insert(insert) => &insert.table,
        Statement::Update(update) => &update.table,
        Statement::Delete(delete) => &delete.table,
        _ => &EMPTY_NAME,
    }
}

static EMPTY_NAME: shoal_cql::ast::QualifiedName = shoal_cql::ast::QualifiedName {
    keyspace: None,
    name: String::new(),
};

fn conditions_of(statement: &Statement) -> Option<Conditions> {
    match statement {
        Statement::Insert(insert) if insert.if_not_exists => Some(Conditions::NotExists),
        Statement::Update(update) => update.conditions.clone(),
        Statement::Delete(delete) => delete.conditions.clone(),
        _ => None,
    }
}

fn resolve_table<'s>(
    coordinator: &Coordinator,
    session: &Session,
    schema: &'s shoal_schema::Schema,
    statement: &Statement,
) -> Result<(&'s KeyspaceMetadata, Arc<TableMetadata>), CqlError> {
    let name = statement_table(statement);
    let keyspace_name = coordinator.keyspace_for(session, &name.keyspace)?;
    let keyspace = schema.keyspace(&keyspace_name)?;
    let table = Arc::clone(schema.table(&keyspace_name, &name.name)?);
    ensure(!table.is_virtual, || {
        CqlError::new(
            crate::ErrorCode::Unauthorized,
            format!("{keyspace_name} keyspace is not user-modifiable"),
        )
    })?;
    Ok((keyspace, table))
}

pub(crate) async fn execute_modification(
    coordinator: &Coordinator,
    session: &mut Session,
    statement: &Statement,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let schema = coordinator.schema();
    let (keyspace, table) = resolve_table(coordinator, session, &schema, statement)?;
    if let Some(conditions) = conditions_of(statement) {
        return execute_conditional(
            coordinator,
            keyspace,
            &table,
            statement,
            &conditions,
            parameters,
            bindings,
        )
        .await;
    }
    coordinator.check_consistency(keyspace, parameters.consistency, true)?;
    let mut batch = WriteBatch::new();
    build_statement(
        coordinator,
        &table,
        statement,
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

/// `IF NOT EXISTS`, `IF EXISTS`, `IF col = value`: read, check and write under a
/// per-partition lock on this node. (Cluster-wide, these become Paxos/Raft rounds.)
async fn execute_conditional(
    coordinator: &Coordinator,
    keyspace: &KeyspaceMetadata,
    table: &Arc<TableMetadata>,
    statement: &Statement,
    conditions: &Conditions,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    let serial = parameters.serial_consistency.unwrap_or(Consistency::Serial);
    ensure(
        matches!(serial, Consistency::Serial | Consistency::LocalSerial),
        || {
            CqlError::invalid(format!("Invalid consistency for conditional update. Must be one of SERIAL or LOCAL_SERIAL, got {}", serial.name()))
        },
    )?;
    coordinator.check_consistency(keyspace, Consistency::Quorum, true)?;
    ensure(coordinator.member_count() <= 1, || {
        CqlError::invalid("Conditional statements (IF ...) need lightweight transactions across replicas, which Shoal supports on a single node only for now")
    })?;
    // Find the single row the statement touches by building it once into a scratch batch.
    let mut scratch = WriteBatch::new();
    let touched = build_statement(
        coordinator,
        table,
        statement,
        bindings,
        parameters.default_timestamp,
        &mut scratch,
    )?;
    let [RowAddress {
        token,
        partition_key,
        clustering,
    }] = touched.as_slice()
    else {
        return Err(CqlError::invalid("IN on the partition key or the clustering key is not supported with conditional updates"));
    };
    let stripe = (token.0 as u64 % coordinator.condition_locks.len() as u64) as usize;
    let _guard = coordinator.condition_locks[stripe].lock().await;
    let current = read::read_row_values(
        coordinator,
        table,
        *token,
        partition_key,
        clustering.as_deref(),
    )?;
    let applied = match conditions {
        Conditions::NotExists => current.is_none(),
        Conditions::Exists => current.is_some(),
        Conditions::Columns(list) => {
            let mut all = true;
            for condition in list {
                let (index, column) = table.require_column(&condition.column)?;
                ensure(condition.element.is_none(), || {
                    CqlError::invalid(
                        "Conditions on collection elements are not supported by Shoal yet",
                    )
                })?;
                let expected =
                    evaluate(&condition.value, &column.cql_type, bindings, &column.name)?;
                let actual = current.as_ref().and_then(|row| row[index].clone());
                let holds = match (condition.operator, &expected, &actual) {
                    (Operator::Eq, Bound::Null, None) => true,
                    (Operator::NotEq, Bound::Null, Some(_)) => true,
                    (_, Bound::Value(expected), Some(actual)) => {
                        let order = actual.compare(expected);
                        match condition.operator {
                            Operator::Eq => order.is_eq(),
                            Operator::NotEq => !order.is_eq(),
                            Operator::Lt => order.is_lt(),
                            Operator::Lte => order.is_le(),
                            Operator::Gt => order.is_gt(),
                            Operator::Gte => order.is_ge(),
                            _ => {
                                return Err(CqlError::invalid("Unsupported operator in condition"))
                            }
                        }
                    }
                    (Operator::NotEq, Bound::Value(_), None) => true,
                    _ => false,
                };
                all &= holds;
            }
            all
        }
    };
    if applied {
        // Rebuild with a fresh timestamp so the write is newer than what was checked.
        let mut batch = WriteBatch::new();
        build_statement(
            coordinator,
            table,
            statement,
            bindings,
            parameters.default_timestamp,
            &mut batch,
        )?;
        coordinator
            .replication
            .write(batch, Consistency::One, WriteType::Simple)
            .await?;
    }
    let mut columns = vec![ColumnSpec {
        keyspace: table.keyspace.clone(),
        table: table.name.clone(),
        name: "[applied]".into(),
        cql_type: CqlType::Boolean,
    }];
    let mut cells: Vec<Option<Vec<u8>>> = vec![Some(Value::Boolean(applied).serialize())];
    if !applied {
        if let Some(row) = &current {
            for (column, value) in table.columns.iter().zip(row) {
                columns.push(ColumnSpec {
                    keyspace: table.keyspace.clone(),
                    table: table.name.clone(),
                    name: column.name.clone(),
                    cql_type: column.cql_type.clone(),
                });
                cells.push(value.as_ref().map(Value::serialize));
            }
        }
    }
    let mut buffer = RowsBuffer::new(columns.len());
    buffer.push_row(cells.iter().map(|c| c.as_deref()));
    Ok(ResultBody::Rows(Rows {
        columns,
        paging_state: None,
        skip_metadata: false,
        rows: buffer,
    }))
}

/// A parsed `BEGIN BATCH ... APPLY BATCH`.
pub(crate) async fn execute_batch_statement(
    coordinator: &Coordinator,
    session: &mut Session,
    batch: &Batch,
    parameters: &QueryParameters,
    bindings: Bindings<'_>,
) -> Result<ResultBody, CqlError> {
    ensure(batch.batch_type != BatchType::Counter, || {
        CqlError::invalid("Counter batches are not supported by Shoal yet")
    })?;
    let batch_timestamp = using_timestamp(&batch.using, bindings)?;
    let statements: Vec<(&Statement, Bindings<'_>)> =
        batch.statements.iter().map(|s| (s, bindings)).collect();
    apply_batch(
        coordinator,
        session,
        &statements,
        parameters.consistency,
        batch_timestamp,
        parameters.default_timestamp,
    )
    .await
}

/// A protocol BATCH message.
pub(crate) async fn execute_protocol_batch(
    coordinator: &Coordinator,
    session: &mut Session,
    request: &BatchRequest,
) -> Result<ResultBody, CqlError> {
    ensure(
        request.kind != shoal_cql::request::BatchKind::Counter,
        || CqlError::invalid("Counter batches are not supported by Shoal yet"),
    )?;
    let mut parsed: Vec<(Arc<crate::prepared::PreparedStatement>, usize)> =
        Vec::with_capacity(request.statements.len());
    for (index, statement) in request.statements.iter().enumerate() {
        let prepared = match &statement.query {
            BatchQuery::Prepared(id) => coordinator.prepared.get(id).ok_or_else(|| {
                CqlError::new(
                    crate::ErrorCode::Unprepared { id: id.clone() },
                    format!("Prepared query with ID {} not found", crate::hex(id)),
                )
            })?,
            BatchQuery::Text(text) => Arc::new(crate::prepared::PreparedStatement::parse(
                text,
                session.keyspace.clone(),
            )?),
        };
        ensure(prepared.statement.is_modification(), || {
            CqlError::invalid("Invalid statement in batch: only UPDATE, INSERT and DELETE statements are allowed.")
        })?;
        parsed.push((prepared, index));
    }
    let statements: Vec<(&Statement, Bindings<'_>)> = parsed
        .iter()
        .map(|(prepared, index)| {
            (
                &prepared.statement,
                Bindings {
                    values: &request.statements[*index].values,
                    names: None,
                },
            )
        })
        .collect();
    // Statements prepared in another keyspace keep it.
    let keyspace_override = parsed.first().and_then(|(p, _)| p.keyspace.clone());
    let mut batch_session = Session {
        keyspace: keyspace_override.or_else(|| session.keyspace.clone()),
    };
    apply_batch(
        coordinator,
        &mut batch_session,
        &statements,
        request.consistency,
        None,
        request.default_timestamp,
    )
    .await
}

/// `batch_timestamp` is `BEGIN BATCH USING TIMESTAMP`; `default_timestamp` the protocol's.
async fn apply_batch(
    coordinator: &Coordinator,
    session: &mut Session,
    statements: &[(&Statement, Bindings<'_>)],
    consistency: Consistency,
    batch_timestamp: Option<i64>,
    default_timestamp: Option<i64>,
) -> Result<ResultBody, CqlError> {
    let schema = coordinator.schema();
    let mut batch = WriteBatch::new();
    // One timestamp for every statement of the batch, as in Cassandra.
    let timestamp = Some(
        batch_timestamp
            .or(default_timestamp)
            .unwrap_or_else(|| WriteTimestamp::now().0),
    );
    for (statement, bindings) in statements {
        ensure(conditions_of(statement).is_none(), || {
            CqlError::invalid("Conditional statements in BATCH are not supported by Shoal yet")
        })?;
        let (keyspace, table) = resolve_table(coordinator, session, &schema, statement)?;
        coordinator.check_consistency(keyspace, consistency, true)?;
        let has_own_timestamp = match statement {
            Statement::Insert(i) => i.using.timestamp.is_some(),
            Statement::Update(u) => u.using.timestamp.is_some(),
            Statement::Delete(d) => d.using.timestamp.is_some(),
            _ => false,
        };
        ensure(!(has_own_timestamp && batch_timestamp.is_some()), || {
            CqlError::invalid("Timestamp must be set either on BATCH or individual statements")
        })?;
        build_statement(
            coordinator,
            &table,
            statement,
            *bindings,
            timestamp,
            &mut batch,
        )?;
    }
    if !batch.is_empty() {
        coordinator
            .replication
            .write(batch, consistency, WriteType::Batch)
            .await?;
    }
    Ok(ResultBody::Void)
}

/// Decodes a row's clustering bytes into serialized values (for results and conditions).
pub(crate) fn decode_clustering(
    table: &TableMetadata,
    clustering: &[u8],
) -> Result<Vec<Value>, CqlError> {
    let mut values = Vec::new();
    let mut position = 0;
    for column in table.clustering() {
        let (value, used) =
            decode_component(&clustering[position..], &column.cql_type, column.descending)?;
        values.push(value);
        position += used;
    }
    Ok(values)
}
