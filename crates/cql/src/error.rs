//! Errors as the client sees them: the CQL protocol's error codes, each with a message a
//! person can act on and the extra fields drivers read (for retries and load balancing).

use std::fmt;

/// The protocol's error codes, grouped by what the client should do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorCode {
    /// 0x0000 — a bug or an unexpected failure on our side.
    Server,
    /// 0x000A — the client broke the protocol.
    Protocol,
    /// 0x0100
    BadCredentials,
    /// 0x1000 — not enough live replicas for the consistency level.
    Unavailable {
        consistency: u16,
        required: i32,
        alive: i32,
    },
    /// 0x1001 — the node is too busy; retry elsewhere or later.
    Overloaded,
    /// 0x1002
    IsBootstrapping,
    /// 0x1003
    Truncate,
    /// 0x1100
    WriteTimeout {
        consistency: u16,
        received: i32,
        block_for: i32,
        write_type: String,
    },
    /// 0x1200
    ReadTimeout {
        consistency: u16,
        received: i32,
        block_for: i32,
        data_present: bool,
    },
    /// 0x1400 — a function (e.g. `fromJson()`) failed on the value it was given.
    FunctionFailure {
        keyspace: String,
        function: String,
        argument_types: Vec<String>,
    },
    /// 0x2000 — the statement does not parse.
    Syntax,
    /// 0x2100
    Unauthorized,
    /// 0x2200 — the statement parses but is not valid (unknown column, wrong type...).
    Invalid,
    /// 0x2300 — configuration (e.g. an unsupported replication strategy option).
    Config,
    /// 0x2400 — CREATE of something that exists.
    AlreadyExists { keyspace: String, table: String },
    /// 0x2500 — EXECUTE of an id this node does not know: re-prepare.
    Unprepared { id: Vec<u8> },
}

impl ErrorCode {
    pub fn code(&self) -> i32 {
        match self {
            ErrorCode::Server => 0x0000,
            ErrorCode::Protocol => 0x000A,
            ErrorCode::BadCredentials => 0x0100,
            ErrorCode::Unavailable { .. } => 0x1000,
            ErrorCode::Overloaded => 0x1001,
            ErrorCode::IsBootstrapping => 0x1002,
            ErrorCode::Truncate => 0x1003,
            ErrorCode::WriteTimeout { .. } => 0x1100,
            ErrorCode::ReadTimeout { .. } => 0x1200,
            ErrorCode::FunctionFailure { .. } => 0x1400,
            ErrorCode::Syntax => 0x2000,
            ErrorCode::Unauthorized => 0x2100,
            ErrorCode::Invalid => 0x2200,
            ErrorCode::Config => 0x2300,
            ErrorCode::AlreadyExists { .. } => 0x2400,
            ErrorCode::Unprepared { .. } => 0x2500,
        }
    }
}

/// An error to send to the client (or from the node that ran a request for another).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CqlError {
    pub code: ErrorCode,
    pub message: String,
}

impl CqlError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> CqlError {
        CqlError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Invalid, message)
    }

    pub fn syntax(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Syntax, message)
    }

    pub fn protocol(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Protocol, message)
    }

    pub fn server(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Server, message)
    }

    pub fn config(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Config, message)
    }

    pub fn overloaded(message: impl Into<String>) -> CqlError {
        CqlError::new(ErrorCode::Overloaded, message)
    }

    /// The native function `system.<function>(argument_types)` failed: `message` says on
    /// what.
    pub fn function_failure(
        function: &str,
        argument_types: &[&str],
        message: impl Into<String>,
    ) -> CqlError {
        CqlError::new(
            ErrorCode::FunctionFailure {
                keyspace: "system".into(),
                function: function.into(),
                argument_types: argument_types.iter().map(|t| t.to_string()).collect(),
            },
            message,
        )
    }
}

impl fmt::Display for CqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {:#06x})", self.message, self.code.code())
    }
}

impl std::error::Error for CqlError {}

impl From<shoal_model::DecodeError> for CqlError {
    fn from(error: shoal_model::DecodeError) -> CqlError {
        CqlError::invalid(error.0)
    }
}

/// Returns `error()` unless `condition` holds.
pub fn ensure(condition: bool, error: impl FnOnce() -> CqlError) -> Result<(), CqlError> {
    if condition {
        Ok(())
    } else {
        Err(error())
    }
}
