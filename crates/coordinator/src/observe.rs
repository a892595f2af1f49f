//! What the coordinator tells an observer about every statement it has run — its class,
//! consistency level, tables and time — and about every error answered, so the server can keep request metrics
//! without this crate knowing how they are exported.

use crate::class::StatementClass;
use crate::CqlError;
use shoal_cql::request::Consistency;
use shoal_schema::TableMetadata;
use std::time::Duration;

/// One statement, run.
pub struct Observed<'a> {
    pub class: StatementClass,
    pub consistency: Consistency,
    /// The stored tables it read or wrote (none for schema and system statements).
    pub tables: &'a [&'a TableMetadata],
    pub elapsed: Duration,
}

/// Receives every statement a coordinator runs, on the request's thread: keep it cheap.
pub trait StatementObserver: Send + Sync {
    fn observe(&self, statement: &Observed<'_>);

    /// An error answered to a client (any request, parse errors included).
    fn error(&self, error: &CqlError);

    /// A read of `table` went over `count` tombstones (deletions, expired cells).
    fn tombstones(&self, _table: &TableMetadata, _count: u64) {}
}
