//! Statement classes: what kind of work a planned statement is, decided when it is planned
//! ([`crate::plan`]). Request scheduling orders by class (point reads before scans).

/// What kind of work a statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementClass {
    /// Whole rows of named partitions: `WHERE pk = ? AND ck = ?`.
    PointRead,
    /// Part or all of named partitions: a clustering slice, IN, or no clustering key.
    PartitionSlice,
    /// A token range or the whole table.
    Scan,
    /// INSERT, UPDATE, DELETE, BATCH.
    Write,
    /// A write with an IF condition (a read before the write).
    ConditionalWrite,
    /// CREATE, ALTER, DROP, TRUNCATE.
    Schema,
    /// USE, DESCRIBE, and reads of the virtual system tables.
    System,
}
