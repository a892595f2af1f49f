//! Shoal's data model: the pure vocabulary every other layer speaks. No I/O happens here.
//!
//! A Cassandra table is a map from a *partition key* to a sorted map of *rows*, each row
//! addressed by its *clustering key* and holding *cells* (one per column, or one per element
//! of a non-frozen collection). The types that carry those ideas:
//!
//! - [`Token`] — where a partition lives: Cassandra's Murmur3 hash of the serialized
//!   partition key ([`token::murmur3_token`]), bit-for-bit the value Cassandra computes, or
//!   for an ordered table the key's first eight bytes ([`token::ordered_token`]).
//! - [`CqlType`] and [`Value`] — CQL's type system and typed values, with the native
//!   protocol's byte serialization ([`Value::serialize`], [`Value::deserialize`]), which is
//!   also how cell values are stored.
//! - [`clustering`] — an order-preserving byte encoding of clustering keys, so that the
//!   storage engine's byte order *is* the table's clustering order (ASC or DESC).
//! - [`Cell`] — a stored cell: write timestamp, optional TTL, value or tombstone, with the
//!   last-write-wins rule ([`Cell::reconcile`]) that every replica and every storage
//!   engine applies.
//! - [`keys`] — the storage key layout `(table id, token, partition key, section,
//!   clustering, column)` that keeps a token range one contiguous key range.
//! - [`WriteTimestamp`] — microseconds since the epoch, the clock of last-write-wins.
//! - [`vector`] — how close two `vector<float, n>` values are (cosine, euclidean, dot
//!   product), for the similarity functions and vector search.
//! - [`HostId`], [`TableId`], [`TabletId`] — identifiers as types.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cell;
pub mod clustering;
pub mod fragment;
pub mod ids;
pub mod keys;
pub mod timestamp;
pub mod token;
pub mod types;
pub mod value;
pub mod vector;

#[cfg(test)]
mod fuzz;

pub use cell::{Cell, CellKind};
pub use ids::{HostId, TableId, TabletId};
pub use timestamp::WriteTimestamp;
pub use token::Token;
pub use types::CqlType;
pub use value::Value;

/// An error decoding bytes that came from a client or the disk. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

impl DecodeError {
    pub fn new(message: impl Into<String>) -> Self {
        DecodeError(message.into())
    }
}
