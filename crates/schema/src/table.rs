//! Tables and their columns, as Cassandra defines them.

use serde::{Deserialize, Serialize};
use shoal_cql::CqlError;
use shoal_model::token::{murmur3_token, ordered_token, Partitioner};
use shoal_model::{CqlType, TableId, Token, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColumnKind {
    PartitionKey,
    Clustering,
    Static,
    Regular,
}

impl ColumnKind {
    /// The name `system_schema.columns.kind` uses.
    pub fn schema_name(self) -> &'static str {
        match self {
            ColumnKind::PartitionKey => "partition_key",
            ColumnKind::Clustering => "clustering",
            ColumnKind::Static => "static",
            ColumnKind::Regular => "regular",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnMetadata {
    pub name: String,
    pub cql_type: CqlType,
    pub kind: ColumnKind,
    /// Position within the partition key or the clustering key; -1 otherwise.
    pub position: i32,
    /// Clustering columns only: stored in descending order.
    pub descending: bool,
}

/// Table options, with Cassandra 5.0's defaults. Shoal honours `default_time_to_live` and
/// `gc_grace_seconds`; the others are kept and shown so that tools round-trip them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableOptions {
    pub comment: String,
    pub default_time_to_live: i32,
    pub gc_grace_seconds: i32,
    pub bloom_filter_fp_chance: f64,
    pub crc_check_chance: f64,
    pub memtable_flush_period_in_ms: i32,
    pub min_index_interval: i32,
    pub max_index_interval: i32,
    pub speculative_retry: String,
    pub additional_write_policy: String,
    pub read_repair: String,
    pub caching: BTreeMap<String, String>,
    pub compaction: BTreeMap<String, String>,
    pub compression: BTreeMap<String, String>,
    /// How partition keys map to tokens; chosen in CREATE TABLE, never altered (it decides
    /// where every stored partition lives).
    #[serde(default)]
    pub partitioner: Partitioner,
}

impl Default for TableOptions {
    fn default() -> Self {
        let map = |entries: &[(&str, &str)]| {
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        TableOptions {
            comment: String::new(),
            default_time_to_live: 0,
            gc_grace_seconds: 864_000,
            bloom_filter_fp_chance: 0.01,
            crc_check_chance: 1.0,
            memtable_flush_period_in_ms: 0,
            min_index_interval: 128,
            max_index_interval: 2048,
            speculative_retry: "99p".into(),
            additional_write_policy: "99p".into(),
            read_repair: "BLOCKING".into(),
            caching: map(&[("keys", "ALL"), ("rows_per_partition", "NONE")]),
            compaction: map(&[
                (
                    "class",
                    "org.apache.cassandra.db.compaction.SizeTieredCompactionStrategy",
                ),
                ("max_threshold", "32"),
                ("min_threshold", "4"),
            ]),
            compression: map(&[
                ("chunk_length_in_kb", "16"),
                ("class", "org.apache.cassandra.io.compress.LZ4Compressor"),
            ]),
            partitioner: Partitioner::Murmur3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DroppedColumn {
    pub cql_type: CqlType,
    /// Microseconds: cells written at or before this time belong to the dropped column.
    pub dropped_at_micros: i64,
}

/// What of a column an index holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexTarget {
    /// The column's value; for a non-frozen list or set each element, for a non-frozen
    /// map each value (`CREATE INDEX ON t (c)`, `VALUES(c)`).
    Values,
    /// A non-frozen map's keys (`KEYS(m)`).
    Keys,
    /// A non-frozen map's entries (`ENTRIES(m)`, queried by `m[k] = v`).
    Entries,
    /// A frozen collection as a whole (`FULL(c)`).
    Full,
}

impl IndexTarget {
    /// How `system_schema.indexes.options['target']` and DESCRIBE write the target.
    pub fn describe(self, column: &str) -> String {
        match self {
            IndexTarget::Values => column.to_string(),
            IndexTarget::Keys => format!("keys({column})"),
            IndexTarget::Entries => format!("entries({column})"),
            IndexTarget::Full => format!("full({column})"),
        }
    }
}

/// A secondary index of a table (`CREATE INDEX`, `CREATE CUSTOM INDEX … USING 'sai'`).
/// Every replica keeps a local index of the rows it stores (`shoal_coordinator::index`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexMetadata {
    pub name: String,
    /// The id of the hidden table its entries live in (see `shoal_model::keys`).
    pub id: TableId,
    pub column: String,
    pub target: IndexTarget,
    /// A storage-attached index (`USING 'sai'`), as Cassandra 5.0 names it; both kinds
    /// are the same local index here.
    pub sai: bool,
    /// The class `USING` named, as written (DESCRIBE repeats it).
    #[serde(default)]
    pub class: Option<String>,
    /// `WITH OPTIONS = {…}` as written: for a vector index, `similarity_function`.
    #[serde(default)]
    pub options: std::collections::BTreeMap<String, String>,
}

impl IndexMetadata {
    /// The similarity function a vector index orders by (`similarity_function`,
    /// cosine unless the index names another), as written.
    pub fn similarity_function(&self) -> &str {
        self.options
            .get("similarity_function")
            .map_or("cosine", String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableMetadata {
    pub keyspace: String,
    pub name: String,
    pub id: TableId,
    /// Partition key, clustering, then the rest by name (Cassandra's order).
    pub columns: Vec<ColumnMetadata>,
    pub options: TableOptions,
    pub dropped_columns: BTreeMap<String, DroppedColumn>,
    /// Answered by `system_tables`, never stored.
    #[serde(default)]
    pub is_virtual: bool,
    /// Secondary indexes, in creation order.
    #[serde(default)]
    pub indexes: Vec<IndexMetadata>,
}

impl TableMetadata {
    /// The cells a row of this table is stored as, about: one per regular column and the
    /// row marker (a collection's elements are cells of their own, so this is a floor).
    pub fn cells_per_row(&self) -> u32 {
        let regular = self
            .columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Regular)
            .count();
        u32::try_from(regular + 1).unwrap_or(u32::MAX)
    }

    pub fn column(&self, name: &str) -> Option<&ColumnMetadata> {
        self.columns.iter().find(|c| c.name == name)
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The column, or the error Cassandra gives for an unknown one.
    pub fn require_column(&self, name: &str) -> Result<(usize, &ColumnMetadata), CqlError> {
        self.columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
            .ok_or_else(|| {
                CqlError::invalid(format!(
                    "Undefined column name {name} in table {}.{}",
                    self.keyspace, self.name
                ))
            })
    }

    pub fn partition_key(&self) -> impl Iterator<Item = &ColumnMetadata> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::PartitionKey)
    }

    pub fn clustering(&self) -> impl Iterator<Item = &ColumnMetadata> {
        self.columns
            .iter()
            .filter(|c| c.kind == ColumnKind::Clustering)
    }

    pub fn partition_key_count(&self) -> usize {
        self.partition_key().count()
    }

    pub fn clustering_count(&self) -> usize {
        self.clustering().count()
    }

    /// The token of a serialized partition key, by the table's partitioner.
    ///
    /// An ordered table orders a one-column key of a fixed-width type (integers, floating
    /// point numbers, timestamps, dates, times, booleans) by value, through its
    /// byte-comparable encoding — eight bytes at most, so such keys never share a token.
    /// Any other key (text, blobs, uuids, composite keys) orders by its serialized bytes, as
    /// Cassandra's ByteOrderedPartitioner does; keys sharing their first eight bytes share a
    /// token and are kept in byte order within it by the storage layout.
    pub fn token(&self, serialized_key: &[u8]) -> Token {
        match self.options.partitioner {
            Partitioner::Murmur3 => murmur3_token(serialized_key),
            Partitioner::Ordered => ordered_token(&self.key_order_bytes(serialized_key)),
        }
    }

    /// The bytes an ordered table's key orders by (see [`TableMetadata::token`]).
    fn key_order_bytes<'a>(&self, serialized_key: &'a [u8]) -> Cow<'a, [u8]> {
        let mut key_columns = self.partition_key();
        let (Some(only), None) = (key_columns.next(), key_columns.next()) else {
            return Cow::Borrowed(serialized_key);
        };
        let orders_by_value = matches!(
            only.cql_type,
            CqlType::Boolean
                | CqlType::Tinyint
                | CqlType::Smallint
                | CqlType::Int
                | CqlType::Bigint
                | CqlType::Float
                | CqlType::Double
                | CqlType::Timestamp
                | CqlType::Date
                | CqlType::Time
        );
        if !orders_by_value {
            return Cow::Borrowed(serialized_key);
        }
        match Value::deserialize(&only.cql_type, serialized_key) {
            Ok(value) => {
                let mut encoded = Vec::with_capacity(8);
                shoal_model::clustering::encode_component(&mut encoded, &value, false);
                Cow::Owned(encoded)
            }
            Err(_) => Cow::Borrowed(serialized_key),
        }
    }

    /// A counter table: its non-key columns are all counters (they never mix).
    pub fn is_counter(&self) -> bool {
        self.columns
            .iter()
            .any(|c| c.cql_type == shoal_model::CqlType::Counter)
    }

    pub fn has_static_columns(&self) -> bool {
        self.columns.iter().any(|c| c.kind == ColumnKind::Static)
    }

    /// Puts columns in Cassandra's order and numbers key positions.
    pub fn normalize_column_order(&mut self) {
        let rank = |c: &ColumnMetadata| match c.kind {
            ColumnKind::PartitionKey => (0, c.position, String::new()),
            ColumnKind::Clustering => (1, c.position, String::new()),
            ColumnKind::Static | ColumnKind::Regular => (2, 0, c.name.clone()),
        };
        self.columns.sort_by_key(rank);
    }
}
