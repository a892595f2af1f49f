//! Reading one row from an engine — this node's, or the replicas' reconciled cells: what
//! list element operations and conditional statements read before they write.

use crate::select::columns::{decode_partition_key_values, fill_from_row, ColumnValue};
use crate::CqlError;
use shoal_model::clustering::decode_component;
use shoal_model::keys::increment_prefix;
use shoal_model::{Token, Value};
use shoal_schema::TableMetadata;
use shoal_storage::reader::{self, ClusteringSlice, Flow, PartitionHeader, Row, Visitor};
use shoal_storage::Engine;

/// Reads one live row (or the static row when `clustering` is `None`).
pub(crate) fn read_single_row(
    engine: &dyn Engine,
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
        engine,
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
    engine: &dyn Engine,
    table: &TableMetadata,
    token: Token,
    partition_key: &[u8],
    clustering: Option<&[u8]>,
) -> Result<Option<Vec<Option<Value>>>, CqlError> {
    let Some(row) = read_single_row(engine, table, token, partition_key, clustering)? else {
        return Ok(None);
    };
    let now = shoal_model::timestamp::now_seconds();
    let mut values = vec![ColumnValue::default(); table.columns.len()];
    fill_from_row(table, row, &mut values, now, false)?;
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
            .zip(decode_clustering(table, clustering)?)
        {
            if let Some(index) = table.column_index(&column.name) {
                typed[index] = Some(value);
            }
        }
    }
    Ok(Some(typed))
}

/// Decodes a row's clustering bytes into typed values (for results and conditions).
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
