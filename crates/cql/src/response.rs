//! Encoding server responses.

use crate::error::ErrorCode;
use crate::frame::opcode;
use crate::wire::{put_bytes, put_int, put_short, put_short_bytes, put_string, put_string_list};
use crate::CqlError;
use shoal_model::CqlType;

/// One column of a result or of a prepared statement's bind variables.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnSpec {
    pub keyspace: String,
    pub table: String,
    pub name: String,
    pub cql_type: CqlType,
}

/// Rows, encoded as they are produced: `rows_count` rows of `[bytes]` cells in `content`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowsBuffer {
    pub column_count: usize,
    pub row_count: i32,
    pub content: Vec<u8>,
}

impl RowsBuffer {
    pub fn new(column_count: usize) -> RowsBuffer {
        RowsBuffer {
            column_count,
            row_count: 0,
            content: Vec::new(),
        }
    }

    /// Appends one row; `cells` must hold one entry per column.
    pub fn push_row<'a>(&mut self, cells: impl IntoIterator<Item = Option<&'a [u8]>>) {
        for cell in cells {
            put_bytes(&mut self.content, cell);
        }
        self.row_count += 1;
    }
}

/// A `Rows` result.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub columns: Vec<ColumnSpec>,
    pub paging_state: Option<Vec<u8>>,
    /// The client said it already has the metadata (EXECUTE with skip_metadata).
    pub skip_metadata: bool,
    pub rows: RowsBuffer,
}

/// What a schema change did, for RESULT and EVENT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// CREATED, UPDATED or DROPPED.
    pub change: &'static str,
    /// KEYSPACE, TABLE or TYPE.
    pub target: &'static str,
    pub keyspace: String,
    /// The table's or type's name, for TABLE and TYPE targets.
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub id: Vec<u8>,
    pub bind_columns: Vec<ColumnSpec>,
    /// Indexes of the bind columns that make up the partition key, in key order.
    pub partition_key_indexes: Vec<u16>,
    pub result_columns: Vec<ColumnSpec>,
    /// The statement is a lightweight transaction (it has an `IF`).
    pub conditional: bool,
    /// The metadata flag that marks a lightweight transaction, when the connection
    /// negotiated ScyllaDB's `SCYLLA_LWT_ADD_METADATA_MARK` extension (ScyllaDB's drivers
    /// then send every transaction on a partition to the same replica, so they queue on
    /// one coordinator instead of contending from several); set by the connection.
    pub lwt_mark: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResultBody {
    Void,
    Rows(Rows),
    SetKeyspace(String),
    Prepared(Prepared),
    SchemaChange(SchemaChange),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    SchemaChange(SchemaChange),
    /// NEW_NODE or REMOVED_NODE, with the node's CQL address.
    TopologyChange {
        change: &'static str,
        address: std::net::SocketAddr,
    },
    /// UP or DOWN.
    StatusChange {
        change: &'static str,
        address: std::net::SocketAddr,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Ready,
    /// The client must log in; the authenticator's class name tells it how.
    Authenticate(String),
    /// The login succeeded; the final SASL token, if any.
    AuthSuccess(Option<Vec<u8>>),
    Supported(Vec<(String, Vec<String>)>),
    Result(ResultBody),
    Error(CqlError),
    Event(Event),
}

impl Response {
    /// The opcode and the encoded body.
    pub fn encode(&self) -> (u8, Vec<u8>) {
        self.encode_onto(Vec::new())
    }

    /// The opcode, and `body` with the encoded body appended (a frame's header can go
    /// first, so that a large result is not copied again behind it).
    pub fn encode_onto(&self, mut body: Vec<u8>) -> (u8, Vec<u8>) {
        let op = match self {
            Response::Ready => opcode::READY,
            Response::Authenticate(authenticator) => {
                put_string(&mut body, authenticator);
                opcode::AUTHENTICATE
            }
            Response::AuthSuccess(token) => {
                put_bytes(&mut body, token.as_deref());
                opcode::AUTH_SUCCESS
            }
            Response::Supported(options) => {
                put_short(&mut body, options.len() as u16);
                for (key, values) in options {
                    put_string(&mut body, key);
                    let values: Vec<&str> = values.iter().map(String::as_str).collect();
                    put_string_list(&mut body, &values);
                }
                opcode::SUPPORTED
            }
            Response::Result(result) => {
                encode_result(&mut body, result);
                opcode::RESULT
            }
            Response::Error(error) => {
                encode_error(&mut body, error);
                opcode::ERROR
            }
            Response::Event(event) => {
                encode_event(&mut body, event);
                opcode::EVENT
            }
        };
        (op, body)
    }
}

fn encode_error(out: &mut Vec<u8>, error: &CqlError) {
    put_int(out, error.code.code());
    put_string(out, &error.message);
    match &error.code {
        ErrorCode::Unavailable {
            consistency,
            required,
            alive,
        } => {
            put_short(out, *consistency);
            put_int(out, *required);
            put_int(out, *alive);
        }
        ErrorCode::WriteTimeout {
            consistency,
            received,
            block_for,
            write_type,
        } => {
            put_short(out, *consistency);
            put_int(out, *received);
            put_int(out, *block_for);
            put_string(out, write_type);
        }
        ErrorCode::ReadTimeout {
            consistency,
            received,
            block_for,
            data_present,
        } => {
            put_short(out, *consistency);
            put_int(out, *received);
            put_int(out, *block_for);
            out.push(*data_present as u8);
        }
        ErrorCode::AlreadyExists { keyspace, table } => {
            put_string(out, keyspace);
            put_string(out, table);
        }
        ErrorCode::Unprepared { id } => put_short_bytes(out, id),
        ErrorCode::FunctionFailure {
            keyspace,
            function,
            argument_types,
        } => {
            put_string(out, keyspace);
            put_string(out, function);
            let types: Vec<&str> = argument_types.iter().map(String::as_str).collect();
            put_string_list(out, &types);
        }
        _ => {}
    }
}

fn encode_schema_change(out: &mut Vec<u8>, change: &SchemaChange) {
    put_string(out, change.change);
    put_string(out, change.target);
    put_string(out, &change.keyspace);
    if let Some(name) = &change.name {
        put_string(out, name);
    }
}

fn encode_event(out: &mut Vec<u8>, event: &Event) {
    match event {
        Event::SchemaChange(change) => {
            put_string(out, "SCHEMA_CHANGE");
            encode_schema_change(out, change);
        }
        Event::TopologyChange { change, address } | Event::StatusChange { change, address } => {
            let kind = if matches!(event, Event::TopologyChange { .. }) {
                "TOPOLOGY_CHANGE"
            } else {
                "STATUS_CHANGE"
            };
            put_string(out, kind);
            put_string(out, change);
            match address.ip() {
                std::net::IpAddr::V4(ip) => {
                    out.push(4);
                    out.extend_from_slice(&ip.octets());
                }
                std::net::IpAddr::V6(ip) => {
                    out.push(16);
                    out.extend_from_slice(&ip.octets());
                }
            }
            put_int(out, address.port() as i32);
        }
    }
}

/// The protocol's [option] for a type.
pub fn encode_type(out: &mut Vec<u8>, cql_type: &CqlType) {
    let id: u16 = match cql_type {
        CqlType::Ascii => 0x01,
        CqlType::Bigint => 0x02,
        CqlType::Blob => 0x03,
        CqlType::Boolean => 0x04,
        CqlType::Counter => 0x05,
        CqlType::Decimal => 0x06,
        CqlType::Double => 0x07,
        CqlType::Float => 0x08,
        CqlType::Int => 0x09,
        CqlType::Timestamp => 0x0B,
        CqlType::Uuid => 0x0C,
        CqlType::Text => 0x0D,
        CqlType::Varint => 0x0E,
        CqlType::Timeuuid => 0x0F,
        CqlType::Inet => 0x10,
        CqlType::Date => 0x11,
        CqlType::Time => 0x12,
        CqlType::Smallint => 0x13,
        CqlType::Tinyint => 0x14,
        CqlType::Duration => {
            // v4 has no id for duration: it travels as a custom type, as Cassandra sends it.
            put_short(out, 0x0000);
            put_string(out, "org.apache.cassandra.db.marshal.DurationType");
            return;
        }
        CqlType::List { element, .. } => {
            put_short(out, 0x20);
            encode_type(out, element);
            return;
        }
        CqlType::Map { key, value, .. } => {
            put_short(out, 0x21);
            encode_type(out, key);
            encode_type(out, value);
            return;
        }
        CqlType::Set { element, .. } => {
            put_short(out, 0x22);
            encode_type(out, element);
            return;
        }
        CqlType::Vector { .. } => {
            // A custom type in v4 and v5 alike, named as Cassandra names it.
            put_short(out, 0x0000);
            put_string(out, &cql_type.marshal_class());
            return;
        }
        CqlType::Tuple(elements) => {
            put_short(out, 0x31);
            put_short(out, elements.len() as u16);
            for element in elements {
                encode_type(out, element);
            }
            return;
        }
        CqlType::Udt(user_type) => {
            put_short(out, 0x30);
            put_string(out, &user_type.keyspace);
            put_string(out, &user_type.name);
            put_short(out, user_type.fields.len() as u16);
            for (field, field_type) in &user_type.fields {
                put_string(out, field);
                encode_type(out, field_type);
            }
            return;
        }
        // Schema statements resolve every name before a type reaches the wire.
        CqlType::UdtName { .. } => 0x03,
    };
    put_short(out, id);
}

const GLOBAL_TABLES_SPEC: i32 = 0x01;
const HAS_MORE_PAGES: i32 = 0x02;
const NO_METADATA: i32 = 0x04;

fn shared_table(columns: &[ColumnSpec]) -> Option<(&str, &str)> {
    let first = columns.first()?;
    columns
        .iter()
        .all(|c| c.keyspace == first.keyspace && c.table == first.table)
        .then_some((first.keyspace.as_str(), first.table.as_str()))
}

fn encode_column_specs(out: &mut Vec<u8>, columns: &[ColumnSpec], global: Option<(&str, &str)>) {
    if let Some((keyspace, table)) = global {
        put_string(out, keyspace);
        put_string(out, table);
    }
    for column in columns {
        if global.is_none() {
            put_string(out, &column.keyspace);
            put_string(out, &column.table);
        }
        put_string(out, &column.name);
        encode_type(out, &column.cql_type);
    }
}

/// Rows metadata: flags, column count, paging state, then column specs unless skipped.
fn encode_rows_metadata(
    out: &mut Vec<u8>,
    columns: &[ColumnSpec],
    paging_state: Option<&[u8]>,
    skip: bool,
) {
    let global = shared_table(columns);
    let mut flags = 0;
    if skip {
        flags |= NO_METADATA;
    } else if global.is_some() {
        flags |= GLOBAL_TABLES_SPEC;
    }
    if paging_state.is_some() {
        flags |= HAS_MORE_PAGES;
    }
    put_int(out, flags);
    put_int(out, columns.len() as i32);
    if let Some(state) = paging_state {
        put_bytes(out, Some(state));
    }
    if !skip {
        encode_column_specs(out, columns, global);
    }
}

fn encode_result(out: &mut Vec<u8>, result: &ResultBody) {
    match result {
        ResultBody::Void => put_int(out, 0x0001),
        ResultBody::Rows(rows) => {
            put_int(out, 0x0002);
            encode_rows_metadata(
                out,
                &rows.columns,
                rows.paging_state.as_deref(),
                rows.skip_metadata,
            );
            put_int(out, rows.rows.row_count);
            out.extend_from_slice(&rows.rows.content);
        }
        ResultBody::SetKeyspace(keyspace) => {
            put_int(out, 0x0003);
            put_string(out, keyspace);
        }
        ResultBody::Prepared(prepared) => {
            put_int(out, 0x0004);
            put_short_bytes(out, &prepared.id);
            let global = shared_table(&prepared.bind_columns);
            let global_flag = if global.is_some() {
                GLOBAL_TABLES_SPEC
            } else {
                0
            };
            let lwt_flag = match prepared.lwt_mark {
                Some(mark) if prepared.conditional => mark as i32,
                _ => 0,
            };
            put_int(out, global_flag | lwt_flag);
            put_int(out, prepared.bind_columns.len() as i32);
            put_int(out, prepared.partition_key_indexes.len() as i32);
            for index in &prepared.partition_key_indexes {
                put_short(out, *index);
            }
            encode_column_specs(out, &prepared.bind_columns, global);
            encode_rows_metadata(out, &prepared.result_columns, None, false);
        }
        ResultBody::SchemaChange(change) => {
            put_int(out, 0x0005);
            encode_schema_change(out, change);
        }
    }
}
