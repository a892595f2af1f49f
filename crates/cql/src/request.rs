//! Decoding client requests.

use crate::frame::opcode;
pub use crate::wire::BoundValue;
use crate::wire::WireReader;
use crate::CqlError;

/// A consistency level as the protocol numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Consistency {
    Any,
    One,
    Two,
    Three,
    Quorum,
    All,
    LocalQuorum,
    EachQuorum,
    Serial,
    LocalSerial,
    LocalOne,
}

impl Consistency {
    pub fn from_code(code: u16) -> Result<Consistency, CqlError> {
        Ok(match code {
            0 => Consistency::Any,
            1 => Consistency::One,
            2 => Consistency::Two,
            3 => Consistency::Three,
            4 => Consistency::Quorum,
            5 => Consistency::All,
            6 => Consistency::LocalQuorum,
            7 => Consistency::EachQuorum,
            8 => Consistency::Serial,
            9 => Consistency::LocalSerial,
            10 => Consistency::LocalOne,
            other => {
                return Err(CqlError::protocol(format!(
                    "Unknown consistency level {other}"
                )))
            }
        })
    }

    pub fn code(self) -> u16 {
        match self {
            Consistency::Any => 0,
            Consistency::One => 1,
            Consistency::Two => 2,
            Consistency::Three => 3,
            Consistency::Quorum => 4,
            Consistency::All => 5,
            Consistency::LocalQuorum => 6,
            Consistency::EachQuorum => 7,
            Consistency::Serial => 8,
            Consistency::LocalSerial => 9,
            Consistency::LocalOne => 10,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Consistency::Any => "ANY",
            Consistency::One => "ONE",
            Consistency::Two => "TWO",
            Consistency::Three => "THREE",
            Consistency::Quorum => "QUORUM",
            Consistency::All => "ALL",
            Consistency::LocalQuorum => "LOCAL_QUORUM",
            Consistency::EachQuorum => "EACH_QUORUM",
            Consistency::Serial => "SERIAL",
            Consistency::LocalSerial => "LOCAL_SERIAL",
            Consistency::LocalOne => "LOCAL_ONE",
        }
    }

    /// `SERIAL` or `LOCAL_SERIAL`: the levels of a lightweight transaction's Paxos phase.
    pub fn is_serial(self) -> bool {
        matches!(self, Consistency::Serial | Consistency::LocalSerial)
    }

    /// The quorum a serial level stands for (what a lightweight transaction reads and
    /// finishes earlier proposals at): `LOCAL_QUORUM` for `LOCAL_SERIAL`, else `QUORUM`.
    pub fn serial_quorum(self) -> Consistency {
        match self {
            Consistency::LocalSerial => Consistency::LocalQuorum,
            _ => Consistency::Quorum,
        }
    }

    /// How many replicas must answer, given the replication factor (one datacenter).
    pub fn required_replicas(self, replication_factor: usize) -> usize {
        match self {
            Consistency::Any | Consistency::One | Consistency::LocalOne => 1,
            Consistency::Two => 2,
            Consistency::Three => 3,
            Consistency::Quorum
            | Consistency::LocalQuorum
            | Consistency::EachQuorum
            | Consistency::Serial
            | Consistency::LocalSerial => replication_factor / 2 + 1,
            Consistency::All => replication_factor,
        }
    }
}

/// The parameters of QUERY and EXECUTE.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryParameters {
    pub consistency: Consistency,
    pub values: Vec<BoundValue>,
    /// Names of the values, when the client bound them by name.
    pub names: Option<Vec<String>>,
    pub skip_metadata: bool,
    pub page_size: Option<i32>,
    pub paging_state: Option<Vec<u8>>,
    pub serial_consistency: Option<Consistency>,
    pub default_timestamp: Option<i64>,
}

impl Default for QueryParameters {
    fn default() -> Self {
        QueryParameters {
            consistency: Consistency::One,
            values: Vec::new(),
            names: None,
            skip_metadata: false,
            page_size: None,
            paging_state: None,
            serial_consistency: None,
            default_timestamp: None,
        }
    }
}

/// One statement of a BATCH.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchQuery {
    Text(String),
    Prepared(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct BatchStatement {
    pub query: BatchQuery,
    pub values: Vec<BoundValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Logged,
    Unlogged,
    Counter,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    pub kind: BatchKind,
    pub statements: Vec<BatchStatement>,
    pub consistency: Consistency,
    pub serial_consistency: Option<Consistency>,
    pub default_timestamp: Option<i64>,
}

/// A decoded request message.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Startup(Vec<(String, String)>),
    Options,
    Query {
        query: String,
        parameters: QueryParameters,
    },
    Prepare {
        query: String,
    },
    Execute {
        id: Vec<u8>,
        parameters: QueryParameters,
    },
    Batch(BatchRequest),
    Register(Vec<String>),
    AuthResponse(Vec<u8>),
}

const VALUES: u8 = 0x01;
const SKIP_METADATA: u8 = 0x02;
const PAGE_SIZE: u8 = 0x04;
const PAGING_STATE: u8 = 0x08;
const SERIAL_CONSISTENCY: u8 = 0x10;
const DEFAULT_TIMESTAMP: u8 = 0x20;
const NAMES_FOR_VALUES: u8 = 0x40;

fn read_parameters(reader: &mut WireReader<'_>) -> Result<QueryParameters, CqlError> {
    let consistency = Consistency::from_code(reader.short()?)?;
    let flags = reader.byte()?;
    let mut parameters = QueryParameters {
        consistency,
        skip_metadata: flags & SKIP_METADATA != 0,
        ..QueryParameters::default()
    };
    if flags & VALUES != 0 {
        let count = reader.short()?;
        // At most what the frame can hold (each value takes at least its 4-byte length).
        parameters
            .values
            .reserve((count as usize).min(reader.remaining() / 4));
        let mut names = Vec::new();
        for _ in 0..count {
            if flags & NAMES_FOR_VALUES != 0 {
                names.push(reader.string()?);
            }
            parameters.values.push(reader.value()?);
        }
        if flags & NAMES_FOR_VALUES != 0 {
            parameters.names = Some(names);
        }
    }
    if flags & PAGE_SIZE != 0 {
        parameters.page_size = Some(reader.int()?);
    }
    if flags & PAGING_STATE != 0 {
        let length = reader.int()?;
        if length >= 0 {
            parameters.paging_state =
                Some(reader.take(length as usize, "a paging state")?.to_vec());
        }
    }
    if flags & SERIAL_CONSISTENCY != 0 {
        parameters.serial_consistency = Some(Consistency::from_code(reader.short()?)?);
    }
    if flags & DEFAULT_TIMESTAMP != 0 {
        parameters.default_timestamp = Some(reader.long()?);
    }
    Ok(parameters)
}

impl Request {
    /// Decodes the (decompressed) body of a request with the given opcode.
    pub fn decode(op: u8, body: &[u8]) -> Result<Request, CqlError> {
        let mut reader = WireReader::new(body);
        let request = match op {
            opcode::STARTUP => Request::Startup(reader.string_map()?),
            opcode::OPTIONS => Request::Options,
            opcode::QUERY => {
                let query = reader.long_string()?;
                let parameters = read_parameters(&mut reader)?;
                Request::Query { query, parameters }
            }
            opcode::PREPARE => Request::Prepare {
                query: reader.long_string()?,
            },
            opcode::EXECUTE => {
                let id = reader.short_bytes()?;
                let parameters = read_parameters(&mut reader)?;
                Request::Execute { id, parameters }
            }
            opcode::BATCH => {
                let kind = match reader.byte()? {
                    0 => BatchKind::Logged,
                    1 => BatchKind::Unlogged,
                    2 => BatchKind::Counter,
                    other => return Err(CqlError::protocol(format!("Unknown batch type {other}"))),
                };
                let count = reader.short()?;
                let mut statements = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    let query = match reader.byte()? {
                        0 => BatchQuery::Text(reader.long_string()?),
                        1 => BatchQuery::Prepared(reader.short_bytes()?),
                        other => {
                            return Err(CqlError::protocol(format!(
                            "Invalid query kind in BATCH messages. Must be 0 or 1 but got {other}"
                        )))
                        }
                    };
                    let value_count = reader.short()?;
                    let mut values = Vec::with_capacity(value_count as usize);
                    for _ in 0..value_count {
                        values.push(reader.value()?);
                    }
                    statements.push(BatchStatement { query, values });
                }
                let consistency = Consistency::from_code(reader.short()?)?;
                let flags = if reader.remaining() > 0 {
                    reader.byte()?
                } else {
                    0
                };
                if flags & NAMES_FOR_VALUES != 0 {
                    return Err(CqlError::protocol(
                        "Named values are not supported in BATCH (as in Cassandra)",
                    ));
                }
                let serial_consistency = if flags & SERIAL_CONSISTENCY != 0 {
                    Some(Consistency::from_code(reader.short()?)?)
                } else {
                    None
                };
                let default_timestamp = if flags & DEFAULT_TIMESTAMP != 0 {
                    Some(reader.long()?)
                } else {
                    None
                };
                Request::Batch(BatchRequest {
                    kind,
                    statements,
                    consistency,
                    serial_consistency,
                    default_timestamp,
                })
            }
            opcode::REGISTER => Request::Register(reader.string_list()?),
            opcode::AUTH_RESPONSE => {
                let length = reader.int()?;
                let token = if length > 0 {
                    reader.take(length as usize, "an auth token")?.to_vec()
                } else {
                    Vec::new()
                };
                Request::AuthResponse(token)
            }
            other => {
                return Err(CqlError::protocol(format!(
                    "Unknown or unexpected request opcode {other:#04x}"
                )))
            }
        };
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_with_all_parameters_decodes() {
        let mut body = Vec::new();
        let query = b"SELECT * FROM t";
        body.extend_from_slice(&(query.len() as i32).to_be_bytes());
        body.extend_from_slice(query);
        body.extend_from_slice(&4u16.to_be_bytes()); // QUORUM
        body.push(VALUES | PAGE_SIZE | DEFAULT_TIMESTAMP);
        body.extend_from_slice(&2u16.to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.push(7);
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&100i32.to_be_bytes());
        body.extend_from_slice(&42i64.to_be_bytes());
        let Request::Query { query, parameters } = Request::decode(opcode::QUERY, &body).unwrap()
        else {
            panic!("not a query")
        };
        assert_eq!(query, "SELECT * FROM t");
        assert_eq!(parameters.consistency, Consistency::Quorum);
        assert_eq!(
            parameters.values,
            vec![BoundValue::Bytes(vec![7]), BoundValue::Null]
        );
        assert_eq!(parameters.page_size, Some(100));
        assert_eq!(parameters.default_timestamp, Some(42));
    }

    #[test]
    fn truncated_bodies_are_protocol_errors() {
        for body in [&[0u8, 0, 0, 9, b'S'][..], &[], &[0, 0, 0, 0, 0, 99]] {
            let error = Request::decode(opcode::QUERY, body).unwrap_err();
            assert_eq!(error.code, crate::ErrorCode::Protocol);
        }
        assert!(Request::decode(0x55, &[]).is_err());
    }
}
