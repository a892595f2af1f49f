//! Secondary indexes: what an index holds, kept in step with the data on every replica,
//! and how a query uses it.
//!
//! - **Entries.** [`IndexCatalog`] is this node's view of the schema's indexes. The
//!   replica hands it every batch of cells it applies (`shoal_replication::index`), and it
//!   answers with the index entries those cells add, written in the same atomic batch: a
//!   row marker per indexed base cell under the indexed value, carrying that cell's
//!   timestamp and TTL, so it lives exactly as long as the cell (layout:
//!   `shoal_model::keys::index_entry_key`), ordered by value and then base cell.
//!   Client writes,
//!   hints, read repair, repair and replayed batches all pass there, so no replica's
//!   index is ever behind its data. Entries of values since overwritten or deleted stay
//!   until they expire with their cell; a query never trusts them (below).
//! - **Building.** An index created over existing data is built on every node in the
//!   background ([`IndexCatalog::build_pending`]): a scan of the table's local data that
//!   writes the same entries. Until a node's build is done it answers lookups by computing
//!   those entries from its data as it scans it — slower, never incomplete. Tablets
//!   streamed in are indexed as they arrive ([`IndexCatalog::index_range`]). The code is
//!   in `build`.
//! - **Queries.** A SELECT whose WHERE clause filters on an indexed column without naming
//!   its partitions (an equality, or a range on a storage-attached index:
//!   [`lookup_predicate`]) reads the table like a filtered scan, but only the partitions
//!   the index names: [`CandidateView`] is an engine whose cursors walk those candidates in
//!   token order, fetched tablet by tablet from enough replicas for the consistency level.
//!   The scan's own filters then check every row, so an index query returns exactly what
//!   a filtered full scan would — never a stale hit — and pages, limits and replicas'
//!   reconciliation work as for any scan.

mod build;
pub mod vector;
pub mod view;

use vector::{VectorIndex, VectorIndexes};
pub use view::CandidateView;

use parking_lot::{Mutex, RwLock};
use shoal_cql::ast::Operator;
use shoal_model::clustering::{decode_component, encode_component};
use shoal_model::keys::{self, ColumnPart};
use shoal_model::{Cell, CqlType, TableId, Token, Value};
use shoal_replication::index::{
    add_candidate, lookup_candidates, IndexLookup, IndexPredicate, LocalIndexes, RangeBound,
    VectorAnswer, VectorSearch,
};
use shoal_replication::{Cells, PartitionRef};
use shoal_schema::{ColumnKind, IndexMetadata, IndexTarget, SchemaStore, TableMetadata};
use shoal_storage::{Engine, WriteBatch};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Where an index's value comes from in a stored row.
#[derive(Debug, Clone)]
enum Source {
    /// A regular or static column's cells (by name).
    Column { name: Vec<u8>, target: IndexTarget },
    /// A clustering column: the component at `position` of every live row.
    Clustering {
        position: usize,
        types: Vec<(CqlType, bool)>,
    },
    /// A component of a composite partition key.
    PartitionKey { position: usize, count: usize },
}

/// One index as the write path applies it.
#[derive(Debug, Clone)]
struct IndexSpec {
    id: TableId,
    source: Source,
    cql_type: CqlType,
}

/// The schema's indexes by table, for one schema version.
#[derive(Default)]
struct Indexed {
    version: [u8; 16],
    by_table: HashMap<TableId, Vec<IndexSpec>>,
    /// Every index of the schema: its name, for messages.
    names: HashMap<TableId, String>,
    /// Vector indexes (nearest-neighbour graphs, no entries), by index id.
    vectors: HashMap<TableId, Arc<VectorIndex>>,
}

/// What a storage-attached index on a `vector<float, n>` column orders by: its similarity
/// function and the vectors' dimension. `None` for every other index.
pub(crate) fn vector_index_of(
    table: &TableMetadata,
    index: &IndexMetadata,
) -> Option<(shoal_model::vector::Similarity, usize)> {
    if !index.sai {
        return None;
    }
    match &table.column(&index.column)?.cql_type {
        CqlType::Vector { element, dimension } if **element == CqlType::Float => {
            let similarity = shoal_model::vector::Similarity::named(index.similarity_function())?;
            Some((similarity, *dimension as usize))
        }
        _ => None,
    }
}

impl Indexed {
    fn of(schema: &shoal_schema::Schema, vectors: &VectorIndexes) -> Indexed {
        let mut indexed = Indexed {
            version: schema.version,
            ..Indexed::default()
        };
        for table in schema.user_keyspaces().flat_map(|k| k.tables.values()) {
            for index in &table.indexes {
                if let Some((similarity, dimension)) = vector_index_of(table, index) {
                    let made = vectors.get_or_create(index.id, || {
                        VectorIndex::new(table.id, &index.column, similarity, dimension)
                    });
                    if let Some(vector) = made {
                        indexed.names.insert(index.id, index.name.clone());
                        indexed.vectors.insert(index.id, vector);
                    }
                    continue;
                }
                let Some(spec) = IndexSpec::of(table, index) else {
                    continue;
                };
                indexed.names.insert(index.id, index.name.clone());
                indexed.by_table.entry(table.id).or_default().push(spec);
            }
        }
        indexed
    }
}

impl IndexSpec {
    fn of(table: &TableMetadata, index: &IndexMetadata) -> Option<IndexSpec> {
        let column = table.column(&index.column)?;
        let source = match column.kind {
            ColumnKind::Regular | ColumnKind::Static => Source::Column {
                name: column.name.as_bytes().to_vec(),
                target: index.target,
            },
            ColumnKind::Clustering => Source::Clustering {
                position: column.position as usize,
                types: table
                    .clustering()
                    .map(|c| (c.cql_type.clone(), c.descending))
                    .collect(),
            },
            ColumnKind::PartitionKey => Source::PartitionKey {
                position: column.position as usize,
                count: table.partition_key_count(),
            },
        };
        Some(IndexSpec {
            id: index.id,
            source,
            cql_type: column.cql_type.clone(),
        })
    }

    /// The indexed value (byte-comparable) this live cell gives, if any.
    fn value_of(
        &self,
        partition_key: &[u8],
        section: u8,
        clustering: &[u8],
        part: &ColumnPart<'_>,
        cell: &Cell,
    ) -> Option<Vec<u8>> {
        let encoded = |value: &Value| {
            let mut out = Vec::new();
            encode_component(&mut out, value, false);
            out
        };
        match &self.source {
            Source::Column { name, target } => {
                let ColumnPart::Cell { column, path } = part else {
                    return None;
                };
                if *column != name.as_slice() {
                    return None;
                }
                match (&self.cql_type, target) {
                    (
                        CqlType::List {
                            element,
                            frozen: false,
                        },
                        IndexTarget::Values,
                    ) => Value::deserialize(element, &cell.value)
                        .ok()
                        .map(|v| encoded(&v)),
                    // A set's element and a map's key are the cell path, already encoded.
                    (CqlType::Set { frozen: false, .. }, IndexTarget::Values)
                    | (CqlType::Map { frozen: false, .. }, IndexTarget::Keys) => {
                        Some(path.to_vec())
                    }
                    (
                        CqlType::Map {
                            value,
                            frozen: false,
                            ..
                        },
                        IndexTarget::Values,
                    ) => Value::deserialize(value, &cell.value)
                        .ok()
                        .map(|v| encoded(&v)),
                    (
                        CqlType::Map {
                            value,
                            frozen: false,
                            ..
                        },
                        IndexTarget::Entries,
                    ) => {
                        let value = Value::deserialize(value, &cell.value).ok()?;
                        let mut entry = path.to_vec();
                        encode_component(&mut entry, &value, false);
                        Some(entry)
                    }
                    (cql_type, _) if !cql_type.is_multi_cell() => {
                        Value::deserialize(cql_type, &cell.value)
                            .ok()
                            .map(|v| encoded(&v))
                    }
                    _ => None,
                }
            }
            Source::Clustering { position, types } => {
                if section != keys::SECTION_ROW {
                    return None;
                }
                let mut rest = clustering;
                for (index, (cql_type, descending)) in types.iter().enumerate() {
                    let (value, used) = decode_component(rest, cql_type, *descending).ok()?;
                    if index == *position {
                        return Some(encoded(&value));
                    }
                    rest = rest.get(used..)?;
                }
                None
            }
            Source::PartitionKey { position, count } => {
                let components = keys::split_partition_key(partition_key, *count)?;
                let value = Value::deserialize(&self.cql_type, components.get(*position)?).ok()?;
                Some(encoded(&value))
            }
        }
    }
}

/// What an index lookup searches for, from a query's bound filters and the position of the
/// one its index answers: that filter's value (`=`, `CONTAINS`, `CONTAINS KEY`), or
/// `key ++ value` for `m[key] = value`; for a range filter, the range of that column's
/// range filters (`v > 3 AND v <= 9`). Byte-comparable encodings throughout.
pub(crate) fn lookup_predicate(
    filters: &[crate::restrictions::Filter],
    chosen: usize,
) -> Option<IndexPredicate> {
    let filter = filters.get(chosen)?;
    let encoded = |value: &Value| {
        let mut out = Vec::new();
        encode_component(&mut out, value, false);
        out
    };
    match (filter.operator, filter.values.as_slice()) {
        (Operator::Eq | Operator::Contains | Operator::ContainsKey, [value]) => {
            let mut out = Vec::new();
            if let Some(key) = &filter.map_key {
                encode_component(&mut out, key, false);
            }
            encode_component(&mut out, value, false);
            Some(IndexPredicate::Equals(out))
        }
        (Operator::Lt | Operator::Lte | Operator::Gt | Operator::Gte, [_]) => {
            // At most one bound per side (the planner refuses two): find each.
            let bound = |inclusive: Operator, exclusive: Operator| -> RangeBound {
                filters
                    .iter()
                    .find_map(|other| match other.values.as_slice() {
                        [value] if other.column == filter.column && other.map_key.is_none() => {
                            (other.operator == inclusive || other.operator == exclusive)
                                .then(|| (encoded(value), other.operator == inclusive))
                        }
                        _ => None,
                    })
            };
            let lower = bound(Operator::Gte, Operator::Gt);
            let upper = bound(Operator::Lte, Operator::Lt);
            Some(IndexPredicate::Range { lower, upper })
        }
        _ => None,
    }
}

/// Which index of `table` can answer a filter with `operator` on `column` (`map_entry`:
/// the filter is `m[key] = value`). Ranges (`<`, `<=`, `>`, `>=`) are answered by
/// storage-attached indexes on single-value columns whose byte-comparable encoding orders
/// exactly as the type does (every type but `decimal`, whose encoding orders by an
/// approximation first).
pub(crate) fn index_for<'t>(
    table: &'t TableMetadata,
    column: &str,
    operator: Operator,
    map_entry: bool,
) -> Option<&'t IndexMetadata> {
    let cql_type = &table.column(column)?.cql_type;
    let orders_exactly = !cql_type.is_collection()
        && !matches!(cql_type, CqlType::Decimal | CqlType::Vector { .. })
        && !cql_type.is_multi_cell();
    table.indexes.iter().find(|index| {
        index.column == column
            && vector_index_of(table, index).is_none()
            && match (operator, index.target) {
                (Operator::Eq, IndexTarget::Entries) => map_entry,
                (Operator::Eq, IndexTarget::Values) => !map_entry && !cql_type.is_collection(),
                (Operator::Eq, IndexTarget::Full) => !map_entry,
                (Operator::Contains, IndexTarget::Values) => cql_type.is_multi_cell(),
                (Operator::ContainsKey, IndexTarget::Keys) => true,
                (
                    Operator::Lt | Operator::Lte | Operator::Gt | Operator::Gte,
                    IndexTarget::Values,
                ) => index.sai && !map_entry && orders_exactly,
                _ => false,
            }
    })
}

/// How far this node's build of one index has come.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BuildProgress {
    pub index: String,
    pub table: String,
    /// Stored keys of the table scanned so far.
    pub keys_scanned: u64,
    pub done: bool,
}

/// The prefix of the metadata keys recording that an index's build finished on this node,
/// with the entries in their current layout (`shoal_model::keys::index_entry_key`).
const BUILT_PREFIX: &[u8] = b"index-built-v2/";
/// The same record for entries in the first layout (one partition per hashed value, no
/// ranges): such an index is built again, its old entries deleted first.
const BUILT_PREFIX_V1: &[u8] = b"index-built/";

/// The metadata key recording that an index's build finished on this node.
fn built_key(index: &TableId) -> Vec<u8> {
    let mut key = BUILT_PREFIX.to_vec();
    key.extend_from_slice(&index.0);
    key
}

/// Entries written per batch while building.
const BUILD_BATCH_ENTRIES: usize = 2048;

/// This node's secondary indexes.
pub struct IndexCatalog {
    schema: Arc<SchemaStore>,
    engine: Arc<dyn Engine>,
    indexed: RwLock<Arc<Indexed>>,
    /// Whether the schema has any index at all, and which installation of the schema
    /// that was read from — one word (`installation << 1 | any index`), so the pair is
    /// always consistent: while it holds, a write checks it and nothing else.
    no_index_check: std::sync::atomic::AtomicU64,
    /// Indexes whose build finished here (their entries cover everything stored).
    built: RwLock<HashSet<TableId>>,
    /// Builds under way or done since the node started, by index.
    progress: Mutex<HashMap<TableId, BuildProgress>>,
    /// The nearest-neighbour graphs of vector indexes (in memory, rebuilt at start).
    vectors: VectorIndexes,
}

impl IndexCatalog {
    pub fn new(schema: Arc<SchemaStore>, engine: Arc<dyn Engine>) -> IndexCatalog {
        for (old, _) in engine
            .metadata_with_prefix(BUILT_PREFIX_V1)
            .unwrap_or_default()
        {
            let _ = engine.delete_metadata(&old);
        }
        let built = engine
            .metadata_with_prefix(BUILT_PREFIX)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(key, _)| {
                let id = key.get(BUILT_PREFIX.len()..BUILT_PREFIX.len() + 16)?;
                Some(TableId(id.try_into().ok()?))
            })
            .collect();
        IndexCatalog {
            schema,
            engine,
            indexed: RwLock::new(Arc::new(Indexed::default())),
            no_index_check: std::sync::atomic::AtomicU64::new(u64::MAX),
            built: RwLock::new(built),
            progress: Mutex::new(HashMap::new()),
            vectors: VectorIndexes::default(),
        }
    }

    /// True when the current schema has no index at all (the common case, checked on
    /// every write without taking a lock).
    fn has_no_index(&self) -> bool {
        use std::sync::atomic::Ordering;
        // Read before the schema: the schema read below is at least this installation.
        let installed = self.schema.installations();
        let checked = self.no_index_check.load(Ordering::Acquire);
        if checked != u64::MAX && checked >> 1 == installed {
            return checked & 1 == 0;
        }
        let indexed = self.current();
        let any = !indexed.names.is_empty();
        self.no_index_check
            .store(installed << 1 | u64::from(any), Ordering::Release);
        !any
    }

    /// The indexes of the current schema (recomputed when its version changes).
    fn current(&self) -> Arc<Indexed> {
        let schema = self.schema.current();
        {
            let indexed = self.indexed.read();
            if indexed.version == schema.version {
                return Arc::clone(&indexed);
            }
        }
        let fresh = Arc::new(Indexed::of(&schema, &self.vectors));
        self.vectors.retain(|id| fresh.vectors.contains_key(id));
        for id in fresh.names.keys() {
            // Stale entries are dropped by compaction as soon as they are deleted.
            self.engine.set_gc_grace_seconds(*id, 0);
        }
        *self.indexed.write() = Arc::clone(&fresh);
        fresh
    }

    /// The entries of `cells` for the indexes in `indexed`: one per indexed live cell.
    /// Vector indexes take their cells into their graphs instead.
    fn entries_with(indexed: &Indexed, cells: &Cells, out: &mut Cells) {
        for vector in indexed.vectors.values() {
            vector.apply(cells);
        }
        if indexed.by_table.is_empty() {
            return;
        }
        let now = shoal_model::timestamp::now_seconds();
        for (key, value) in cells {
            let Some(specs) = TableId::of_key(key).and_then(|t| indexed.by_table.get(&t)) else {
                continue;
            };
            let Ok(cell) = Cell::decode(value) else {
                continue;
            };
            if !cell.is_live(now) {
                continue;
            }
            let Some((_, partition_key, rest)) = keys::split_partition(key) else {
                continue;
            };
            let Some((section, clustering, column_part)) = keys::split_row_key(rest) else {
                continue;
            };
            let (Some(part), Some(base_cell)) = (
                keys::parse_column_part(column_part),
                keys::base_cell_of(key),
            ) else {
                continue;
            };
            for spec in specs {
                let Some(indexed_value) =
                    spec.value_of(&partition_key, section, clustering, &part, &cell)
                else {
                    continue;
                };
                let Some(entry_key) = keys::index_entry_key(&spec.id, &indexed_value, base_cell)
                else {
                    tracing::warn!("a value too large to index was not indexed");
                    continue;
                };
                let entry = Cell {
                    timestamp: cell.timestamp,
                    kind: cell.kind,
                    value: Vec::new(),
                };
                out.push((entry_key, entry.encode()));
            }
        }
    }

    fn write_entries(&self, indexed: &Indexed, cells: &Cells) -> Result<(), String> {
        let mut entries = Vec::new();
        Self::entries_with(indexed, cells, &mut entries);
        if entries.is_empty() {
            return Ok(());
        }
        self.engine
            .write(&WriteBatch::from(entries))
            .map_err(|e| e.to_string())
    }
}

impl LocalIndexes for IndexCatalog {
    fn entries(&self, cells: &Cells, out: &mut Cells) {
        if self.has_no_index() {
            return;
        }
        let indexed = self.current();
        Self::entries_with(&indexed, cells, out);
    }

    fn indexes_table(&self, table: &TableId) -> bool {
        !self.has_no_index() && self.current().by_table.contains_key(table)
    }

    fn candidates(
        &self,
        engine: &dyn Engine,
        lookup: &IndexLookup,
        upto: Token,
    ) -> Result<Vec<PartitionRef>, String> {
        let indexed = self.current();
        if !indexed.names.contains_key(&lookup.index) {
            return Err("the index was dropped".into());
        }
        if self.is_built(&lookup.index) {
            return lookup_candidates(engine, lookup, upto);
        }
        // Still building here: the same entries, computed from the data as it is read.
        let Some(spec) = indexed
            .by_table
            .get(&lookup.table)
            .and_then(|specs| specs.iter().find(|s| s.id == lookup.index))
        else {
            return Err("the index was dropped".into());
        };
        let only = Indexed {
            by_table: HashMap::from([(lookup.table, vec![spec.clone()])]),
            ..Indexed::default()
        };
        let lower = keys::token_prefix(&lookup.table, lookup.from);
        let upper = match upto.0.checked_add(1) {
            Some(next) => keys::token_prefix(&lookup.table, Token(next)),
            None => keys::table_end(&lookup.table),
        };
        let mut cursor = engine
            .scan(&lower, &upper, false)
            .map_err(|e| e.to_string())?;
        let mut found: Vec<PartitionRef> = Vec::new();
        while let Some((key, value)) = cursor.current() {
            // A row fragment holds the row's simple cells (decision 0018): each is indexed.
            let cells: Vec<(Vec<u8>, Vec<u8>)> = shoal_model::fragment::expand(key, value)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(key, cell)| (key, cell.to_vec()))
                .collect();
            let mut entries = Vec::new();
            Self::entries_with(&only, &cells, &mut entries);
            for (entry, _) in entries {
                let Some((value, token, partition_key)) = keys::index_entry_parts(&entry) else {
                    continue;
                };
                if token >= lookup.from
                    && lookup.predicate.matches(&value)
                    && !add_candidate(&mut found, token, &partition_key, lookup.limit)
                {
                    return Ok(found);
                }
            }
            cursor.advance();
        }
        cursor.status().map_err(|e| e.to_string())?;
        Ok(found)
    }

    fn vector_search(
        &self,
        engine: &dyn Engine,
        search: &VectorSearch,
    ) -> Result<VectorAnswer, String> {
        // From the graph once this node's build is done; until then by scoring every
        // stored vector of the range.
        let Some(vector) = self.current().vectors.get(&search.index).cloned() else {
            return Err("the index was dropped".into());
        };
        let now = shoal_model::timestamp::now_seconds();
        if self.is_built(&search.index) {
            vector.search(search, now)
        } else {
            vector.search_exactly(engine, search, now)
        }
    }

    fn truncated(&self, table: TableId) {
        for vector in self.current().vectors.values() {
            if vector.table == table {
                vector.clear();
            }
        }
    }
}

impl IndexCatalog {
    /// True once this node's build of `index` is done.
    pub(crate) fn is_built(&self, index: &TableId) -> bool {
        self.built.read().contains(index)
    }
}
