//! Vector indexes: the approximate-nearest-neighbour side of storage-attached indexes
//! (`CREATE INDEX … USING 'sai'` on a `vector<float, n>` column), answering
//! `ORDER BY v ANN OF [...] LIMIT k`.
//!
//! Each node keeps one HNSW graph per vector index (the [`usearch`] crate) over the rows
//! it stores, in memory. Why one graph per node rather than one per tablet: a query needs
//! every tablet's best rows, and searching eight small graphs costs about five times one
//! search of a graph eight times larger (measured in `docs/decisions/0012-vector-search.md`).
//! The graph still answers per tablet: every point carries its partition's token, and a
//! search keeps only the points in the token range it was asked for.
//!
//! - **In step with writes.** The replica hands every batch it applies to the catalog,
//!   which gives each cell of an indexed vector column to [`VectorIndex::apply`]: a live
//!   value adds a point for its row (replacing the row's previous point), a deleted value
//!   removes it. The last write wins by timestamp, as in the data: a write older than the
//!   one indexed for the row (a late hint, a repair) changes nothing.
//!   Row, range and partition deletions remove the points of the rows they cover (written
//!   no later than the deletion), and TRUNCATE empties the graph.
//! - **Never trusted.** A point may still outlive its row — a tablet that moved away, a
//!   deletion applied before the write it shadows arrived. Expired points are skipped by
//!   the search itself; every other hit is only a candidate, read back through the normal
//!   read path and scored from the stored value, so a stale point can cost a slot but
//!   never return a row that is not there.
//! - **Rebuilt, not persisted.** The graph is derived from the data, which the commit log
//!   and RocksDB already keep durable: a node rebuilds it in the background when it starts
//!   (or when the index is created), and until that build is done it answers searches
//!   exactly, by scoring every stored vector of the range asked.

use parking_lot::RwLock;
use shoal_model::keys::{self, ColumnPart};
use shoal_model::vector::{floats, is_zero, Similarity};
use shoal_model::{Cell, CellKind, TableId, Token};
use shoal_replication::index::{merge_vector_hits, VectorAnswer, VectorHit, VectorSearch};
use shoal_replication::Cells;
use shoal_storage::reader::RangeTombstone;
use shoal_storage::Engine;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

/// Graph parameters: 16 links per node and a beam of 128 while inserting, 32 while
/// searching; the graph holds its vectors as half-precision floats. Recall@10 stays above
/// 0.99 on the benchmark's data (decision 0012): the graph only proposes candidates,
/// which are scored again from the stored full-precision values.
const CONNECTIVITY: usize = 16;
const EXPANSION_ADD: usize = 128;
const EXPANSION_SEARCH: usize = 32;

/// Candidates a search asks the graph for at least, however small its LIMIT: the best of
/// several is the nearest far more reliably than a search for one (points replaced or
/// removed stay in the graph as holes a narrow search can get stuck beside).
const MIN_GRAPH_CANDIDATES: usize = 16;

/// Searches and inserts at once: each needs one of the graph's per-thread contexts.
const CONTEXTS: usize = 64;

/// What a point stands for.
struct Point {
    token: Token,
    partition_key: Box<[u8]>,
    /// Seconds since the epoch after which the value has expired (`i64::MAX`: never).
    expires_at: i64,
}

/// The rows indexed, and the point indexing each.
#[derive(Default)]
struct Points {
    by_key: HashMap<u64, Point>,
    /// The current point of each row (by its vector cell's storage key, so a partition's
    /// rows are one range), with that cell's write timestamp.
    by_row: BTreeMap<Box<[u8]>, (u64, i64)>,
    /// Points whose value has a TTL: while there are none, a search of the whole table
    /// needs no filter.
    expiring: usize,
}

impl Points {
    fn insert(&mut self, key: u64, point: Point) {
        if point.expires_at != i64::MAX {
            self.expiring += 1;
        }
        self.by_key.insert(key, point);
    }

    fn remove(&mut self, key: u64) {
        if let Some(point) = self.by_key.remove(&key) {
            if point.expires_at != i64::MAX {
                self.expiring -= 1;
            }
        }
    }
}

/// What a deletion covers in its partition.
enum Deletion {
    Partition,
    /// The row whose key the deletion's key is (its column part a row deletion).
    Row,
    Range(RangeTombstone),
}

/// One vector index on this node.
pub struct VectorIndex {
    pub(crate) table: TableId,
    column: Box<[u8]>,
    pub(crate) similarity: Similarity,
    dimension: usize,
    /// Growing the graph's capacity takes the write lock; everything else the read lock.
    graph: RwLock<Index>,
    points: RwLock<Points>,
    next_key: AtomicU64,
    /// Bounds concurrent graph calls to the contexts the graph reserved.
    permits: std::sync::Mutex<usize>,
    permit_freed: std::sync::Condvar,
}

/// One graph context, held for a graph call.
struct Permit<'a>(&'a VectorIndex);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.permits.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.permit_freed.notify_one();
    }
}

impl VectorIndex {
    pub fn new(
        table: TableId,
        column: &str,
        similarity: Similarity,
        dimension: usize,
    ) -> Result<VectorIndex, String> {
        let metric = match similarity {
            Similarity::Cosine => MetricKind::Cos,
            Similarity::DotProduct => MetricKind::IP,
            Similarity::Euclidean => MetricKind::L2sq,
        };
        let options = IndexOptions {
            dimensions: dimension,
            metric,
            quantization: ScalarKind::F16,
            connectivity: CONNECTIVITY,
            expansion_add: EXPANSION_ADD,
            expansion_search: EXPANSION_SEARCH,
            multi: false,
        };
        let graph = Index::new(&options).map_err(|e| e.to_string())?;
        graph
            .reserve_capacity_and_threads(1024, CONTEXTS)
            .map_err(|e| e.to_string())?;
        Ok(VectorIndex {
            table,
            column: column.as_bytes().into(),
            similarity,
            dimension,
            graph: RwLock::new(graph),
            points: RwLock::new(Points::default()),
            next_key: AtomicU64::new(0),
            permits: std::sync::Mutex::new(CONTEXTS),
            permit_freed: std::sync::Condvar::new(),
        })
    }

    fn permit(&self) -> Permit<'_> {
        let mut free = self.permits.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self
                .permit_freed
                .wait(free)
                .unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Permit(self)
    }

    /// Points in the graph (including those of rows deleted since).
    pub fn point_count(&self) -> usize {
        self.points.read().by_key.len()
    }

    /// Applies the cells of a batch that belong to this index's column, and the
    /// deletions of rows, ranges and partitions of its table.
    pub fn apply(&self, cells: &Cells) {
        for (key, value) in cells {
            if TableId::of_key(key) != Some(self.table) {
                continue;
            }
            let Some((token, partition_key, rest)) = keys::split_partition(key) else {
                continue;
            };
            let partition = &key[..key.len() - rest.len()];
            let deletion = match rest.first() {
                Some(&keys::SECTION_PARTITION_DELETION) => Some(Deletion::Partition),
                Some(&keys::SECTION_RANGE_TOMBSTONE) => {
                    keys::parse_range_tombstone(rest).map(|(start, si, end, ei)| {
                        Deletion::Range(RangeTombstone {
                            start: start.to_vec(),
                            start_inclusive: si,
                            end: end.to_vec(),
                            end_inclusive: ei,
                            timestamp: shoal_model::WriteTimestamp(0),
                        })
                    })
                }
                _ => {
                    let Some((_, _, column_part)) = keys::split_row_key(rest) else {
                        continue;
                    };
                    match keys::parse_column_part(column_part) {
                        Some(ColumnPart::Cell { column, .. }) if *column == *self.column => None,
                        Some(ColumnPart::RowDeletion) => Some(Deletion::Row),
                        _ => continue,
                    }
                }
            };
            let Ok(cell) = Cell::decode(value) else {
                continue;
            };
            match deletion {
                None => self.apply_cell(key, token, &partition_key, &cell),
                Some(deletion) if cell.is_tombstone() => {
                    self.delete(partition, key, &deletion, cell.timestamp.0)
                }
                Some(_) => {}
            }
        }
    }

    /// Removes the points of the rows a deletion at `timestamp` covers.
    fn delete(&self, partition: &[u8], key: &[u8], deletion: &Deletion, timestamp: i64) {
        let mut removed = Vec::new();
        {
            let mut points = self.points.write();
            let upper = keys::increment_prefix(partition);
            let rows = points.by_row.range::<[u8], _>((
                std::ops::Bound::Included(partition),
                match &upper {
                    Some(upper) => std::ops::Bound::Excluded(upper.as_slice()),
                    None => std::ops::Bound::Unbounded,
                },
            ));
            for (row_key, (point, indexed_at)) in rows {
                if *indexed_at > timestamp {
                    continue;
                }
                let covered = match deletion {
                    Deletion::Partition => true,
                    Deletion::Row | Deletion::Range(_) => {
                        let rest = &row_key[partition.len()..];
                        let Some((section, clustering, _)) = keys::split_row_key(rest) else {
                            continue;
                        };
                        match deletion {
                            // The row deletion's key is the row's, up to the column part.
                            Deletion::Row => {
                                let row_end = key.len() - 3;
                                row_key.len() > row_end && row_key[..row_end] == key[..row_end]
                            }
                            _ => {
                                section == keys::SECTION_ROW
                                    && matches!(deletion, Deletion::Range(range) if range.covers(clustering))
                            }
                        }
                    }
                };
                if covered {
                    removed.push((row_key.clone(), *point));
                }
            }
            for (row_key, point) in &removed {
                points.by_row.remove(row_key);
                points.remove(*point);
            }
        }
        for (_, point) in removed {
            self.remove_from_graph(point);
        }
    }

    /// Forgets every point (the table was truncated).
    pub fn clear(&self) {
        let mut points = self.points.write();
        let graph = self.graph.write();
        if let Err(error) = graph.reset() {
            tracing::warn!(%error, "a vector index could not be emptied");
            return;
        }
        if let Err(error) = graph.reserve_capacity_and_threads(1024, CONTEXTS) {
            tracing::warn!(%error, "a vector index could not be emptied");
        }
        *points = Points::default();
    }

    fn apply_cell(&self, key: &[u8], token: Token, partition_key: &[u8], cell: &Cell) {
        let timestamp = cell.timestamp.0;
        let expires_at = match cell.kind {
            CellKind::Live => i64::MAX,
            CellKind::Expiring { expires_at, .. } => expires_at,
            CellKind::Tombstone { .. } => {
                let mut points = self.points.write();
                let current = points.by_row.get(key).copied();
                if let Some((old, indexed_at)) = current {
                    if indexed_at <= timestamp {
                        points.by_row.remove(key);
                        points.remove(old);
                        drop(points);
                        self.remove_from_graph(old);
                    }
                }
                return;
            }
        };
        let vector = floats(&cell.value);
        if vector.len() != self.dimension
            || (self.similarity == Similarity::Cosine && is_zero(&vector))
        {
            return;
        }
        let new = self.next_key.fetch_add(1, Ordering::Relaxed);
        let replaced = {
            let mut points = self.points.write();
            if let Some((current, indexed_at)) = points.by_row.get(key) {
                // An older write, or the same write again (a retry, a repair).
                let indexed = points.by_key.contains_key(current);
                if *indexed_at > timestamp || (*indexed_at == timestamp && indexed) {
                    return;
                }
            }
            points.insert(
                new,
                Point {
                    token,
                    partition_key: partition_key.into(),
                    expires_at,
                },
            );
            let previous = points.by_row.insert(key.into(), (new, timestamp));
            if let Some((old, _)) = previous {
                points.remove(old);
            }
            previous.map(|(old, _)| old)
        };
        self.add_to_graph(new, &vector);
        if let Some(old) = replaced {
            self.remove_from_graph(old);
        }
    }

    fn add_to_graph(&self, key: u64, vector: &[f32]) {
        let _permit = self.permit();
        loop {
            {
                let graph = self.graph.read();
                if graph.size() < graph.capacity() {
                    if let Err(error) = graph.add(key, vector) {
                        tracing::warn!(%error, "a vector was not indexed");
                    }
                    return;
                }
            }
            let graph = self.graph.write();
            if graph.size() >= graph.capacity() {
                let capacity = (graph.capacity() * 2).max(1024);
                if let Err(error) = graph.reserve_capacity_and_threads(capacity, CONTEXTS) {
                    tracing::warn!(%error, "a vector index could not grow");
                    return;
                }
            }
        }
    }

    fn remove_from_graph(&self, key: u64) {
        let _permit = self.permit();
        let _ = self.graph.read().remove(key);
    }

    /// The partitions of the best `search.limit` rows of the token range asked, from
    /// the graph.
    pub fn search(&self, search: &VectorSearch, now_seconds: i64) -> Result<VectorAnswer, String> {
        let _permit = self.permit();
        let points = self.points.read();
        let graph = self.graph.read();
        let limit = search.limit as usize;
        let wanted = limit.max(MIN_GRAPH_CANDIDATES).min(points.by_key.len());
        if limit == 0 || wanted == 0 {
            return Ok(VectorAnswer {
                hits: Vec::new(),
                complete: true,
            });
        }
        let whole_table = search.from == Token::MIN && search.upto == Token::MAX;
        let matches = if whole_table && points.expiring == 0 {
            // Every point qualifies: the plain search (points of a row replaced while the
            // search ran have no entry any more and are dropped below).
            graph.search(&search.query, wanted)
        } else {
            let keep = |key: u64| {
                points.by_key.get(&key).is_some_and(|point| {
                    point.expires_at > now_seconds
                        && (whole_table
                            || (search.from <= point.token && point.token <= search.upto))
                })
            };
            graph.filtered_search(&search.query, wanted, keep)
        }
        .map_err(|e| e.to_string())?;
        let complete = matches.keys.len() < search.limit as usize;
        let hits = matches
            .keys
            .iter()
            .zip(&matches.distances)
            .filter_map(|(key, distance)| {
                let point = points.by_key.get(key)?;
                Some(VectorHit {
                    token: point.token,
                    partition_key: point.partition_key.to_vec(),
                    score: self.score_of_distance(*distance),
                })
            })
            .collect();
        Ok(VectorAnswer {
            hits: merge_vector_hits(hits, search.limit as usize),
            complete,
        })
    }

    /// The similarity score (Cassandra's, in [0, 1]) of a graph distance.
    fn score_of_distance(&self, distance: f32) -> f32 {
        match self.similarity {
            // Cosine and inner-product distances are `1 - cos` and `1 - a·b`.
            Similarity::Cosine | Similarity::DotProduct => 1.0 - distance / 2.0,
            Similarity::Euclidean => 1.0 / (1.0 + distance),
        }
    }

    /// The best `search.limit` partitions of the token range asked, by scoring every
    /// vector stored there: the answer while the graph is still being built.
    pub fn search_exactly(
        &self,
        engine: &dyn Engine,
        search: &VectorSearch,
        now_seconds: i64,
    ) -> Result<VectorAnswer, String> {
        let lower = keys::token_prefix(&self.table, search.from);
        let upper = match search.upto.0.checked_add(1) {
            Some(next) => keys::token_prefix(&self.table, Token(next)),
            None => keys::table_end(&self.table),
        };
        let mut cursor = engine
            .scan(&lower, &upper, false)
            .map_err(|e| e.to_string())?;
        let mut hits: Vec<VectorHit> = Vec::new();
        let mut scored = 0usize;
        while let Some((stored_key, stored)) = cursor.current() {
            // A row fragment holds the row's simple cells (decision 0018): each is scored.
            let cells =
                shoal_model::fragment::expand(stored_key, stored).map_err(|e| e.to_string())?;
            for (key, value) in cells {
                if let Some(hit) = self.score_stored(&key, value, &search.query, now_seconds) {
                    hits.push(hit);
                    scored += 1;
                    if hits.len() >= 4 * (search.limit as usize).max(256) {
                        hits = merge_vector_hits(hits, search.limit as usize);
                    }
                }
            }
            cursor.advance();
        }
        cursor.status().map_err(|e| e.to_string())?;
        Ok(VectorAnswer {
            hits: merge_vector_hits(hits, search.limit as usize),
            complete: scored <= search.limit as usize,
        })
    }

    fn score_stored(&self, key: &[u8], value: &[u8], query: &[f32], now: i64) -> Option<VectorHit> {
        let (token, partition_key, rest) = keys::split_partition(key)?;
        let (_, _, column_part) = keys::split_row_key(rest)?;
        match keys::parse_column_part(column_part)? {
            ColumnPart::Cell { column, .. } if *column == *self.column => {}
            _ => return None,
        }
        let cell = Cell::decode(value).ok()?;
        if !cell.is_live(now) {
            return None;
        }
        let score = self.similarity.score(&floats(&cell.value), query).ok()?;
        Some(VectorHit {
            token,
            partition_key: partition_key.to_vec(),
            score,
        })
    }
}

/// Every vector index of this node, by index id.
#[derive(Default)]
pub struct VectorIndexes {
    by_index: RwLock<HashMap<TableId, std::sync::Arc<VectorIndex>>>,
}

impl VectorIndexes {
    /// The index `id`, made empty the first time it is asked for.
    pub fn get_or_create(
        &self,
        id: TableId,
        make: impl FnOnce() -> Result<VectorIndex, String>,
    ) -> Option<std::sync::Arc<VectorIndex>> {
        if let Some(index) = self.by_index.read().get(&id) {
            return Some(std::sync::Arc::clone(index));
        }
        let mut all = self.by_index.write();
        if let Some(index) = all.get(&id) {
            return Some(std::sync::Arc::clone(index));
        }
        match make() {
            Ok(index) => {
                let index = std::sync::Arc::new(index);
                all.insert(id, std::sync::Arc::clone(&index));
                Some(index)
            }
            Err(error) => {
                tracing::warn!(%error, "a vector index could not be created");
                None
            }
        }
    }

    /// Forgets indexes that are no longer in the schema.
    pub fn retain(&self, mut keep: impl FnMut(&TableId) -> bool) {
        self.by_index.write().retain(|id, _| keep(id));
    }
}

#[cfg(test)]
mod tests;
