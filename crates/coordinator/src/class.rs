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

impl StatementClass {
    pub const ALL: [StatementClass; 7] = [
        StatementClass::PointRead,
        StatementClass::PartitionSlice,
        StatementClass::Scan,
        StatementClass::Write,
        StatementClass::ConditionalWrite,
        StatementClass::Schema,
        StatementClass::System,
    ];

    /// The name metrics label it with.
    pub fn name(self) -> &'static str {
        match self {
            StatementClass::PointRead => "point_read",
            StatementClass::PartitionSlice => "partition_slice",
            StatementClass::Scan => "scan",
            StatementClass::Write => "write",
            StatementClass::ConditionalWrite => "conditional_write",
            StatementClass::Schema => "schema",
            StatementClass::System => "system",
        }
    }
}
