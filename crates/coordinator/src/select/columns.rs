//! A row's column values as a selection sees them ([`ColumnValue`]): decoded from the
//! cells the storage walk hands over — simple cells with their write time and TTL,
//! collections and user-defined types serialized whole with each element's times, the
//! partition key's components — and the computed cells of a selection (functions,
//! casts, `writetime`/`ttl`, JSON).

use crate::functions;
use crate::select::selection::Output;
use crate::values::json;
use crate::CqlError;
use shoal_model::clustering::decode_component;
use shoal_model::types::UserType;
use shoal_model::{keys, Cell, CqlType, Value};
use shoal_schema::TableMetadata;
use shoal_storage::reader::Row;

/// One column's value in a row being produced: serialized bytes plus, for simple cells,
/// the write timestamp and remaining TTL; for the cells of a non-frozen collection or
/// user-defined type, each one's (`writetime(c)` and `ttl(c)` list them), with `timestamp`
/// their latest.
#[derive(Debug, Clone, Default)]
pub(crate) struct ColumnValue {
    pub(crate) bytes: Option<Vec<u8>>,
    pub(crate) timestamp: Option<i64>,
    pub(crate) ttl: Option<i32>,
    pub(crate) element_times: Vec<Option<CellTime>>,
}

/// When one cell was written and how long it has left to live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CellTime {
    pub(crate) timestamp: i64,
    pub(crate) ttl: Option<i32>,
}

/// Each element's cell time of a non-frozen collection (in element order) or user-defined
/// type (one per field, `None` where the field has no cell).
fn times_of_elements(
    cql_type: &CqlType,
    cells: &[(Vec<u8>, Cell)],
    now_seconds: i64,
) -> Vec<Option<CellTime>> {
    let time = |cell: &Cell| CellTime {
        timestamp: cell.timestamp.0,
        ttl: cell.remaining_ttl(now_seconds),
    };
    match cql_type {
        CqlType::Udt(user_type) => {
            let mut fields = vec![None; user_type.fields.len()];
            for (path, cell) in cells {
                if let Some(slot) = UserType::field_of_path(path).and_then(|i| fields.get_mut(i)) {
                    *slot = Some(time(cell));
                }
            }
            fields
        }
        _ => cells.iter().map(|(_, cell)| Some(time(cell))).collect(),
    }
}

/// A `list<bigint>` or `list<int>` of per-element times, null where an element has none
/// (`None` when the column has no cell).
pub(crate) fn time_list<const N: usize>(
    times: &[Option<CellTime>],
    of: impl Fn(&CellTime) -> Option<[u8; N]>,
) -> Option<Vec<u8>> {
    if times.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(4 + times.len() * (4 + N));
    out.extend_from_slice(&(times.len() as i32).to_be_bytes());
    for time in times {
        match time.as_ref().and_then(&of) {
            Some(bytes) => {
                out.extend_from_slice(&(N as i32).to_be_bytes());
                out.extend_from_slice(&bytes);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    Some(out)
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

/// Serializes the live cells of a non-frozen collection (or user-defined type) as one
/// value.
fn collection_bytes(cql_type: &CqlType, cells: &[(Vec<u8>, Cell)]) -> Result<Vec<u8>, CqlError> {
    if let CqlType::Udt(user_type) = cql_type {
        return Ok(udt_bytes(user_type, cells));
    }
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

/// A non-frozen user-defined type's value from its field cells (keyed by field position):
/// every field of the type, in order, null where no cell is live.
fn udt_bytes(user_type: &UserType, cells: &[(Vec<u8>, Cell)]) -> Vec<u8> {
    let mut fields: Vec<Option<&[u8]>> = vec![None; user_type.fields.len()];
    for (path, cell) in cells {
        if let Some(slot) = UserType::field_of_path(path).and_then(|i| fields.get_mut(i)) {
            *slot = Some(&cell.value);
        }
    }
    let mut out = Vec::new();
    for field in fields {
        match field {
            Some(bytes) => {
                out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                out.extend_from_slice(bytes);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    out
}

/// Fills `values` (indexed like `table.columns`) from a stored row's cells; with
/// `element_times`, the write time and TTL of each element of a non-frozen collection or
/// UDT too (only `writetime(c)` and `ttl(c)` of such a column read them).
pub(crate) fn fill_from_row(
    table: &TableMetadata,
    row: Row,
    values: &mut [ColumnValue],
    now_seconds: i64,
    element_times: bool,
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
        if metadata.cql_type == CqlType::Counter {
            // A cell per shard: the counter is their sum, written when its latest shard
            // was; counters never expire.
            if !cells.is_empty() {
                let total = crate::counter::counter_value(cells.iter().map(|(_, cell)| cell));
                values[index] = ColumnValue {
                    bytes: Some(total.to_be_bytes().to_vec()),
                    timestamp: cells.iter().map(|(_, cell)| cell.timestamp.0).max(),
                    ttl: None,
                    element_times: Vec::new(),
                };
            }
        } else if metadata.cql_type.is_multi_cell() {
            if !cells.is_empty() {
                values[index] = ColumnValue {
                    bytes: Some(collection_bytes(&metadata.cql_type, &cells)?),
                    timestamp: cells.iter().map(|(_, cell)| cell.timestamp.0).max(),
                    ttl: None,
                    element_times: if element_times {
                        times_of_elements(&metadata.cql_type, &cells, now_seconds)
                    } else {
                        Vec::new()
                    },
                };
            }
        } else if let Some((_, cell)) = cells.into_iter().next() {
            values[index] = ColumnValue {
                timestamp: Some(cell.timestamp.0),
                ttl: cell.remaining_ttl(now_seconds),
                bytes: Some(cell.value),
                element_times: Vec::new(),
            };
        }
    }
    Ok(())
}

/// The cell of an output computed from others (a function, `toJson`, a field, a
/// similarity), given its arguments' cells in [`Output::arguments`] order.
pub(crate) fn computed_cell(
    output: &Output,
    arguments: Vec<Option<Vec<u8>>>,
) -> Result<Option<Vec<u8>>, CqlError> {
    let typed = |cell: Option<&Vec<u8>>, cql_type: &CqlType| {
        cell.map(|bytes| Value::deserialize(cql_type, bytes))
            .transpose()
            .map_err(CqlError::from)
    };
    Ok(match (output, arguments.as_slice()) {
        (Output::ToJson { cql_type, .. }, [argument]) => {
            let value = typed(argument.as_ref(), cql_type)?;
            Some(json::optional_to_json(value.as_ref(), cql_type).into_bytes())
        }
        (Output::Field { index, .. }, [argument]) => argument
            .as_ref()
            .and_then(|bytes| shoal_model::value::tuple_element(bytes, *index)),
        (Output::Call { call, .. }, [argument]) => {
            let value = typed(argument.as_ref(), &call.argument_type)?;
            call.apply(value)?.map(|result| result.serialize())
        }
        (
            Output::Mask {
                masking,
                value_type,
                ..
            },
            [value, rest @ ..],
        ) => {
            let replacement = match rest.first() {
                Some(bytes) => typed(bytes.as_ref(), value_type)?,
                None => None,
            };
            masking
                .apply(typed(value.as_ref(), value_type)?, value_type, replacement)
                .map(|masked| masked.serialize())
        }
        (Output::Similarity { similarity, .. }, [Some(left), Some(right)]) => Some(
            functions::similarity(*similarity, left, right)?
                .to_be_bytes()
                .to_vec(),
        ),
        _ => None,
    })
}

#[cfg(test)]
mod time_list_tests {
    use super::*;

    #[test]
    fn a_time_list_has_one_element_per_cell_and_null_where_a_cell_has_no_time() {
        let times = [
            Some(CellTime {
                timestamp: 7,
                ttl: Some(30),
            }),
            None,
            Some(CellTime {
                timestamp: 9,
                ttl: None,
            }),
        ];
        let ttls = time_list(&times, |time| time.ttl.map(i32::to_be_bytes)).unwrap();
        let mut expected = 3i32.to_be_bytes().to_vec();
        expected.extend_from_slice(&4i32.to_be_bytes());
        expected.extend_from_slice(&30i32.to_be_bytes());
        expected.extend_from_slice(&(-1i32).to_be_bytes());
        expected.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(ttls, expected);
        let written = time_list(&times, |time| Some(time.timestamp.to_be_bytes())).unwrap();
        assert_eq!(written.len(), 4 + (4 + 8) + 4 + (4 + 8));
        assert_eq!(
            time_list(&[], |time| Some(time.timestamp.to_be_bytes())),
            None
        );
    }
}
