//! Schema: keyspaces, tables and columns, as Cassandra defines them.
//!
//! - [`TableMetadata`] (with [`ColumnMetadata`] and [`TableOptions`]) and
//!   [`KeyspaceMetadata`] describe what exists; [`replication_strategy`] turns a keyspace's
//!   replication options into what placement understands.
//! - [`Schema`] is an immutable snapshot of every keyspace; [`SchemaStore`] holds the
//!   current one behind an `Arc` (readers clone the `Arc` and never lock across a
//!   request) and changes it: through the cluster's replicated metadata, as a
//!   compare-and-set on the schema version, each change getting a new version UUID that
//!   `system.local.schema_version` reports and drivers compare. The schema also records
//!   truncated and dropped tables ([`Truncation`]), so every node's storage keeps their
//!   old data dead.
//! - [`system`] defines the system keyspaces' virtual tables.
//!
//! Columns keep Cassandra's order: partition key components, then clustering columns, then
//! static and regular columns by name.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod keyspace;
pub mod store;
pub mod system;
pub mod table;

pub use keyspace::{replication_strategy, KeyspaceConsistency, KeyspaceMetadata};
pub use store::{schema_diff, validate_name, Schema, SchemaStore, Truncation, DROPPED};
pub use table::{
    ColumnKind, ColumnMetadata, DroppedColumn, IndexMetadata, IndexTarget, TableMetadata,
    TableOptions,
};
