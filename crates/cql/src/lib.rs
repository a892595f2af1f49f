//! CQL: the native protocol v4 and the language, with no sockets.
//!
//! - [`frame`] — the 9-byte frame header, version negotiation and LZ4 body compression.
//! - [`request`] — decoding client messages (STARTUP, OPTIONS, QUERY, PREPARE, EXECUTE,
//!   BATCH, REGISTER, AUTH_RESPONSE) and their query parameters.
//! - [`response`] — encoding server messages (READY, SUPPORTED, RESULT of every kind,
//!   ERROR, EVENT) and result metadata.
//! - [`error`] — [`CqlError`], the protocol's error codes: the vocabulary every layer uses
//!   to tell the client what to do next.
//! - [`ast`], [`lexer`], [`parser`] — the CQL statement language, parsed into
//!   [`ast::Statement`]s.
//!
//! Everything that decodes client bytes checks lengths and returns a protocol error
//! instead of panicking.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod ast;
pub mod error;
pub mod frame;
pub mod lexer;
pub mod parser;
pub mod request;
pub mod response;
mod wire;

#[cfg(test)]
mod fuzz;

pub use error::{ensure, CqlError, ErrorCode};
