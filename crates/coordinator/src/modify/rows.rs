//! Writing the cells of one row: [`RowWriter`] stamps every cell of a statement with its
//! write timestamp and TTL under the row's key prefix (see [`shoal_model::keys`] for where
//! each cell lives), and [`write_column_value`] turns a whole value into cells — one for a
//! simple column, a collection deletion plus one per element for a non-frozen
//! collection.

use crate::values::new_timeuuid;
use shoal_model::clustering::encode_component;
use shoal_model::keys;
use shoal_model::types::UserType;
use shoal_model::{Cell, Value, WriteTimestamp};
use shoal_schema::{ColumnMetadata, TableMetadata};
use shoal_storage::WriteBatch;

/// Where and how one statement writes.
pub(crate) struct WriteContext<'a> {
    pub(crate) table: &'a TableMetadata,
    pub(crate) timestamp: WriteTimestamp,
    pub(crate) ttl_seconds: i32,
    pub(crate) now_seconds: i64,
}

impl WriteContext<'_> {
    /// A writer for the row whose keys start with `prefix`, stamped with this statement's
    /// timestamp and TTL.
    pub(crate) fn writer<'b>(&self, batch: &'b mut WriteBatch, prefix: Vec<u8>) -> RowWriter<'b> {
        RowWriter {
            batch,
            prefix,
            timestamp: self.timestamp,
            ttl_seconds: self.ttl_seconds,
            now_seconds: self.now_seconds,
        }
    }
}

/// Bytes a cell's key has room for after its row's prefix: a column name, a collection
/// element's path and the part's length, for most columns.
const COLUMN_PART_ROOM: usize = 48;

/// Writes the cells of one row (or of a partition's static row).
pub(crate) struct RowWriter<'a> {
    pub(crate) batch: &'a mut WriteBatch,
    /// `partition prefix | section [| clustering]`.
    prefix: Vec<u8>,
    timestamp: WriteTimestamp,
    ttl_seconds: i32,
    now_seconds: i64,
}

impl RowWriter<'_> {
    fn put(&mut self, part: impl FnOnce(&mut Vec<u8>), cell: Cell) {
        self.put_encoded(part, cell.encode());
    }

    fn put_encoded(&mut self, part: impl FnOnce(&mut Vec<u8>), encoded_cell: Vec<u8>) {
        // Room for the column part from the start (a clone of the prefix would have none,
        // and every cell's key would be allocated twice).
        let mut key = Vec::with_capacity(self.prefix.len() + COLUMN_PART_ROOM);
        key.extend_from_slice(&self.prefix);
        keys::push_column_part(&mut key, part);
        self.batch.merge(key, encoded_cell);
    }

    fn live(&self, value: Vec<u8>) -> Cell {
        Cell::with_ttl(self.timestamp, value, self.ttl_seconds, self.now_seconds)
    }

    fn tombstone(&self) -> Cell {
        Cell::tombstone(self.timestamp, self.now_seconds)
    }

    pub(crate) fn marker(&mut self) {
        let cell = self.live(Vec::new());
        self.put(|k| k.push(keys::COLUMN_ROW_MARKER), cell);
    }

    pub(crate) fn row_deletion(&mut self) {
        let cell = self.tombstone();
        self.put(|k| k.push(keys::COLUMN_ROW_DELETION), cell);
    }

    pub(crate) fn cell(&mut self, column: &str, path: &[u8], value: Option<Vec<u8>>) {
        let cell = match value {
            Some(bytes) => self.live(bytes),
            None => self.tombstone(),
        };
        self.put(|k| keys::push_cell_column(k, column, path), cell);
    }

    /// [`RowWriter::cell`] of a scalar column's live value the caller holds borrowed: the
    /// value is copied once, straight into the cell's encoding.
    pub(crate) fn scalar_cell(&mut self, column: &str, value: &[u8]) {
        let encoded =
            Cell::encode_with_ttl(self.timestamp, value, self.ttl_seconds, self.now_seconds);
        self.put_encoded(|k| keys::push_cell_column(k, column, b""), encoded);
    }

    /// Deletes a whole non-frozen collection; `before_write` shadows only what is older
    /// than this statement, so the statement's own elements survive (an overwrite).
    pub(crate) fn collection_deletion(&mut self, column: &str, before_write: bool) {
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
pub(crate) fn list_path(prepend: bool) -> Vec<u8> {
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

pub(crate) fn element_path(value: &Value) -> Vec<u8> {
    let mut path = Vec::new();
    encode_component(&mut path, value, false);
    path
}

/// Writes a whole value into a column (INSERT, or UPDATE `c = value`).
pub(crate) fn write_column_value(
    writer: &mut RowWriter<'_>,
    column: &ColumnMetadata,
    value: Option<Value>,
) {
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
        // A non-frozen user-defined type: a cell per non-null field.
        Some(Value::Tuple(fields)) => {
            for (index, field) in fields.into_iter().enumerate() {
                if let Some(value) = field {
                    writer.cell(
                        &column.name,
                        &UserType::field_path(index),
                        Some(value.serialize()),
                    );
                }
            }
        }
        _ => {}
    }
}
