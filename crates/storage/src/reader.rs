//! Reading rows back out of cells.
//!
//! A partition on disk is a run of keys (see [`shoal_model::keys`]): first its deletions
//! (partition deletion, range tombstones), then its static row, then its rows in clustering
//! order, each row a run of cells. This module walks those runs with a [`Cursor`] and hands
//! a [`Visitor`] only *live* data: it applies every deletion whose timestamp is at least a
//! cell's, drops expired cells, and leaves out rows with nothing live in them.
//!
//! A visitor steers the walk with [`Flow`], which is how LIMIT, paging and DISTINCT stop
//! reading as soon as they have enough.

use crate::{Cursor, Engine, Result, StorageError};
use shoal_model::fragment::{self, FragmentView};
use shoal_model::keys::{self, ColumnPart};
use shoal_model::{Cell, TableId, Token, WriteTimestamp};
use std::cmp::Ordering;

/// What the visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Skip the rest of this partition.
    NextPartition,
    /// Stop reading.
    Stop,
}

/// A deletion of every row whose clustering lies between two bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeTombstone {
    pub start: Vec<u8>,
    pub start_inclusive: bool,
    pub end: Vec<u8>,
    pub end_inclusive: bool,
    pub timestamp: WriteTimestamp,
}

/// Compares a full clustering with a bound prefix, looking only at the prefix's length.
fn compare_with_prefix(clustering: &[u8], prefix: &[u8]) -> Ordering {
    let length = clustering.len().min(prefix.len());
    clustering[..length]
        .cmp(&prefix[..length])
        .then(if clustering.len() < prefix.len() {
            Ordering::Less
        } else {
            Ordering::Equal
        })
}

impl RangeTombstone {
    pub fn covers(&self, clustering: &[u8]) -> bool {
        let after_start = match compare_with_prefix(clustering, &self.start) {
            Ordering::Greater => true,
            Ordering::Equal => self.start_inclusive,
            Ordering::Less => false,
        };
        let before_end = match compare_with_prefix(clustering, &self.end) {
            Ordering::Less => true,
            Ordering::Equal => self.end_inclusive,
            Ordering::Greater => false,
        };
        after_start && before_end
    }

    /// True when every clustering at or after `clustering` lies past this tombstone's end.
    pub fn ends_before(&self, clustering: &[u8]) -> bool {
        match compare_with_prefix(clustering, &self.end) {
            Ordering::Greater => true,
            Ordering::Equal => !self.end_inclusive,
            Ordering::Less => false,
        }
    }
}

/// A partition's identity and deletions, given to the visitor before its rows.
#[derive(Debug, Clone)]
pub struct PartitionHeader {
    pub token: Token,
    /// The serialized partition key.
    pub key: Vec<u8>,
    /// `table id | token | key`: the prefix of all of the partition's storage keys.
    pub prefix: Vec<u8>,
    pub deletion: Option<WriteTimestamp>,
    pub range_tombstones: Vec<RangeTombstone>,
    /// The live static cells, if any.
    pub static_row: Option<Row>,
}

impl PartitionHeader {
    /// The newest deletion covering a row: the partition's and any range tombstone's.
    fn deletion_floor(&self, clustering: &[u8]) -> Option<WriteTimestamp> {
        self.range_tombstones
            .iter()
            .filter(|tombstone| tombstone.covers(clustering))
            .map(|tombstone| tombstone.timestamp)
            .chain(self.deletion)
            .max()
    }
}

/// The live cells of one column (one cell for simple columns; one per element, keyed by
/// its path, for non-frozen collections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub cells: Vec<(Vec<u8>, Cell)>,
}

/// A live row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The byte-comparable clustering (empty for the static row and for tables without
    /// clustering columns).
    pub clustering: Vec<u8>,
    /// The live row marker, present when the row was written by INSERT.
    pub marker: Option<Cell>,
    pub columns: Vec<Column>,
}

impl Row {
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|column| column.name == name)
    }
}

/// Receives live data, in storage order.
pub trait Visitor {
    fn partition(&mut self, header: &PartitionHeader) -> Flow;
    fn row(&mut self, header: &PartitionHeader, row: Row) -> Flow;
    /// Called after the last row of a partition that was not left early.
    fn partition_end(&mut self, _header: &PartitionHeader) -> Flow {
        Flow::Continue
    }
}

/// A range of clustering encodings: `[lower, upper)`, `upper == None` meaning unbounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusteringSlice {
    pub lower: Vec<u8>,
    pub upper: Option<Vec<u8>>,
}

impl ClusteringSlice {
    pub fn all() -> ClusteringSlice {
        ClusteringSlice {
            lower: Vec::new(),
            upper: None,
        }
    }
}

/// The raw cells of one row, before deletions are applied.
struct RawRow {
    clustering: Vec<u8>,
    parts: Vec<(Vec<u8>, Cell)>,
}

fn decode_cell(bytes: &[u8]) -> Result<Cell> {
    Cell::decode(bytes).map_err(|e| StorageError::Corrupt(e.0))
}

/// Adds one stored entry of a row to its parts: a fragment under the marker's key
/// (decision 0018) gives its marker and each of its cells as parts of their own.
fn push_parts(parts: &mut Vec<(Vec<u8>, Cell)>, part: &[u8], value: &[u8]) -> Result<()> {
    if part != [keys::COLUMN_ROW_MARKER] || !fragment::is_fragment(value) {
        parts.push((part.to_vec(), decode_cell(value)?));
        return Ok(());
    }
    let view = FragmentView::parse(value).map_err(|e| StorageError::Corrupt(e.0))?;
    if let Some(marker) = view.marker {
        parts.push((part.to_vec(), decode_cell(marker)?));
    }
    for (name, cell) in view.cells {
        // The part alone: the key of the cell in an empty row, without its length.
        let mut column_part = fragment::simple_cell_key(&[], name);
        column_part.truncate(column_part.len() - 2);
        parts.push((column_part, decode_cell(cell)?));
    }
    Ok(())
}

thread_local! {
    static TOMBSTONES_READ: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tombstones (deletions of any kind, and cells whose TTL has passed) the reads on this
/// thread have gone over since it started. A caller that reads a table on a thread takes
/// the difference around its read (the per-table `tombstones` metric): no lock, no
/// shared counter on the read path.
pub fn tombstones_read_on_this_thread() -> u64 {
    TOMBSTONES_READ.with(std::cell::Cell::get)
}

fn count_tombstones(count: u64) {
    if count > 0 {
        TOMBSTONES_READ.with(|read| read.set(read.get() + count));
    }
}

/// Applies deletions and expiry to a raw row; `None` when nothing in it is live.
fn assemble_row(mut raw: RawRow, floor: Option<WriteTimestamp>, now_seconds: i64) -> Option<Row> {
    // Parts in key order, whichever way the cursor went and wherever a fragment's cells
    // were expanded (at its marker, before the row's collection parts).
    if !raw.parts.is_sorted_by(|a, b| a.0 <= b.0) {
        raw.parts.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let mut row_floor = floor;
    let mut collection_deletions: Vec<(Vec<u8>, WriteTimestamp)> = Vec::new();
    let mut dead = 0;
    for (part, cell) in &raw.parts {
        if !cell.is_live(now_seconds) {
            dead += 1;
        }
        match keys::parse_column_part(part) {
            Some(ColumnPart::RowDeletion) if cell.is_tombstone() => {
                row_floor = row_floor.max(Some(cell.timestamp));
            }
            Some(ColumnPart::CollectionDeletion { column }) if cell.is_tombstone() => {
                collection_deletions.push((column.to_vec(), cell.timestamp));
            }
            _ => {}
        }
    }
    count_tombstones(dead);
    let shadowed = |cell: &Cell, floor: Option<WriteTimestamp>| match floor {
        Some(deleted) => cell.timestamp <= deleted,
        None => false,
    };

    let mut marker = None;
    let mut columns: Vec<Column> = Vec::new();
    for (part, cell) in raw.parts {
        match keys::parse_column_part(&part) {
            Some(ColumnPart::RowMarker)
                if cell.is_live(now_seconds) && !shadowed(&cell, row_floor) =>
            {
                marker = Some(cell);
            }
            Some(ColumnPart::Cell { column, path }) => {
                if !cell.is_live(now_seconds) {
                    continue;
                }
                let collection_floor = collection_deletions
                    .iter()
                    .filter(|(name, _)| name == column)
                    .map(|(_, timestamp)| *timestamp)
                    .max();
                if shadowed(&cell, row_floor.max(collection_floor)) {
                    continue;
                }
                let path = path.to_vec();
                match columns.last_mut() {
                    Some(last) if last.name.as_bytes() == column => last.cells.push((path, cell)),
                    _ => columns.push(Column {
                        name: String::from_utf8_lossy(column).into_owned(),
                        cells: vec![(path, cell)],
                    }),
                }
            }
            _ => {}
        }
    }
    if marker.is_none() && columns.is_empty() {
        return None;
    }
    // Reverse cursors deliver a row's cells backwards; keep element order ascending.
    for column in &mut columns {
        if column.cells.windows(2).any(|pair| pair[0].0 > pair[1].0) {
            column.cells.sort_by(|a, b| a.0.cmp(&b.0));
        }
    }
    Some(Row {
        clustering: raw.clustering,
        marker,
        columns,
    })
}

/// Reads the next raw row at the cursor, if the cursor is on a row of the partition whose
/// storage keys start with `partition_prefix` and, when given, inside `[lower, upper)`.
fn next_raw_row(
    cursor: &mut dyn Cursor,
    partition_prefix: &[u8],
    bounds: Option<(&[u8], &[u8])>,
) -> Result<Option<RawRow>> {
    let mut row: Option<RawRow> = None;
    while let Some((key, value)) = cursor.current() {
        if !key.starts_with(partition_prefix) {
            break;
        }
        if let Some((lower, upper)) = bounds {
            if key < lower || key >= upper {
                break;
            }
        }
        let Some((_, clustering, part)) = keys::split_row_key(&key[partition_prefix.len()..])
        else {
            return Err(StorageError::Corrupt("malformed row key".into()));
        };
        match &mut row {
            Some(current) if current.clustering != clustering => break,
            Some(current) => push_parts(&mut current.parts, part, value)?,
            None => {
                let mut parts = Vec::new();
                push_parts(&mut parts, part, value)?;
                row = Some(RawRow {
                    clustering: clustering.to_vec(),
                    parts,
                })
            }
        }
        cursor.advance();
    }
    Ok(row)
}

/// Reads a partition's deletions and static row from a forward cursor positioned at the
/// partition's first key; leaves the cursor at its first clustered row (or past it).
/// `truncation` (the table's, [`Engine::truncated_at`]) counts as a partition deletion.
fn read_header(
    cursor: &mut dyn Cursor,
    token: Token,
    key: &[u8],
    prefix: Vec<u8>,
    now_seconds: i64,
    truncation: Option<WriteTimestamp>,
) -> Result<PartitionHeader> {
    let mut header = PartitionHeader {
        token,
        key: key.to_vec(),
        deletion: truncation,
        range_tombstones: Vec::new(),
        static_row: None,
        prefix,
    };
    let mut static_parts: Vec<(Vec<u8>, Cell)> = Vec::new();
    while let Some((storage_key, value)) = cursor.current() {
        if !storage_key.starts_with(&header.prefix) {
            break;
        }
        let rest = &storage_key[header.prefix.len()..];
        match rest.first() {
            Some(&keys::SECTION_PARTITION_DELETION) => {
                let cell = decode_cell(value)?;
                if cell.is_tombstone() {
                    count_tombstones(1);
                    header.deletion = header.deletion.max(Some(cell.timestamp));
                }
            }
            Some(&keys::SECTION_RANGE_TOMBSTONE) => {
                let (start, start_inclusive, end, end_inclusive) =
                    keys::parse_range_tombstone(rest).ok_or_else(|| {
                        StorageError::Corrupt("malformed range tombstone key".into())
                    })?;
                let cell = decode_cell(value)?;
                if cell.is_tombstone() {
                    count_tombstones(1);
                    header.range_tombstones.push(RangeTombstone {
                        start: start.to_vec(),
                        start_inclusive,
                        end: end.to_vec(),
                        end_inclusive,
                        timestamp: cell.timestamp,
                    });
                }
            }
            Some(&keys::SECTION_STATIC_ROW) => {
                let (_, _, part) = keys::split_row_key(rest)
                    .ok_or_else(|| StorageError::Corrupt("malformed static key".into()))?;
                push_parts(&mut static_parts, part, value)?;
            }
            _ => break,
        }
        cursor.advance();
    }
    if !static_parts.is_empty() {
        let raw = RawRow {
            clustering: Vec::new(),
            parts: static_parts,
        };
        header.static_row = assemble_row(raw, header.deletion, now_seconds);
    }
    Ok(header)
}

/// Reads one partition: its header, then its live rows within `slices`, in clustering
/// order or reversed. Returns the visitor's last [`Flow`].
#[allow(clippy::too_many_arguments)]
pub fn read_partition(
    engine: &dyn Engine,
    table_id: &TableId,
    token: Token,
    key: &[u8],
    slices: &[ClusteringSlice],
    reversed: bool,
    now_seconds: i64,
    visitor: &mut dyn Visitor,
) -> Result<Flow> {
    let prefix = keys::partition_prefix(table_id, token, key);
    let mut header_lower = prefix.clone();
    header_lower.push(keys::SECTION_PARTITION_DELETION);
    let partition_end =
        keys::increment_prefix(&prefix).unwrap_or_else(|| vec![0xff; prefix.len() + 1]);
    // Forward reads use one cursor for the header and every slice (one iterator per
    // partition read); reversed reads need a second, descending cursor for the rows.
    let mut cursor = engine.scan(&header_lower, &partition_end, false)?;
    let truncation = engine.truncated_at(table_id);
    let header = read_header(
        cursor.as_mut(),
        token,
        key,
        prefix.clone(),
        now_seconds,
        truncation,
    )?;
    cursor.status()?;
    match visitor.partition(&header) {
        Flow::Continue => {}
        Flow::NextPartition => return Ok(Flow::Continue),
        Flow::Stop => return Ok(Flow::Stop),
    }
    let mut rows_prefix = prefix;
    rows_prefix.push(keys::SECTION_ROW);
    for slice in slices {
        let mut lower = rows_prefix.clone();
        lower.extend_from_slice(&slice.lower);
        let upper = match &slice.upper {
            Some(upper) => {
                let mut bound = rows_prefix.clone();
                bound.extend_from_slice(upper);
                bound
            }
            None => partition_end.clone(),
        };
        if lower >= upper {
            continue;
        }
        if reversed {
            cursor = engine.scan(&lower, &upper, true)?;
        } else if cursor.current().is_some_and(|(k, _)| k < lower.as_slice()) {
            cursor.skip_to(&lower);
        }
        while let Some(raw) = next_raw_row(cursor.as_mut(), &header.prefix, Some((&lower, &upper)))?
        {
            let floor = header.deletion_floor(&raw.clustering);
            if let Some(row) = assemble_row(raw, floor, now_seconds) {
                match visitor.row(&header, row) {
                    Flow::Continue => {}
                    Flow::NextPartition => return Ok(Flow::Continue),
                    Flow::Stop => return Ok(Flow::Stop),
                }
            }
        }
        cursor.status()?;
    }
    Ok(visitor.partition_end(&header))
}

/// Walks every partition whose storage keys lie in `[lower, upper)` — `lower` must be the
/// start of a partition, a token or a table — in token order.
pub fn scan_partitions(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    now_seconds: i64,
    visitor: &mut dyn Visitor,
) -> Result<Flow> {
    let mut cursor = engine.scan(lower, upper, false)?;
    // The table's truncation, looked up again only when the scan reaches another table.
    let mut truncation: Option<(TableId, Option<WriteTimestamp>)> = None;
    loop {
        let (token, partition_key, prefix) = match cursor.current() {
            None => break,
            Some((storage_key, _)) => {
                let (token, partition_key, rest) = keys::split_partition(storage_key)
                    .ok_or_else(|| StorageError::Corrupt("malformed partition key".into()))?;
                let prefix = storage_key[..storage_key.len() - rest.len()].to_vec();
                (token, partition_key.to_vec(), prefix)
            }
        };
        let table = TableId::of_key(&prefix);
        let table_truncation = match (&truncation, table) {
            (Some((cached, at)), Some(table)) if *cached == table => *at,
            (_, Some(table)) => {
                let at = engine.truncated_at(&table);
                truncation = Some((table, at));
                at
            }
            (_, None) => None,
        };
        let header = read_header(
            cursor.as_mut(),
            token,
            &partition_key,
            prefix,
            now_seconds,
            table_truncation,
        )?;
        let mut flow = visitor.partition(&header);
        while flow == Flow::Continue {
            let on_partition_row =
                matches!(cursor.current(), Some((k, _)) if k.starts_with(&header.prefix));
            if !on_partition_row {
                flow = visitor.partition_end(&header);
                break;
            }
            let Some(raw) = next_raw_row(cursor.as_mut(), &header.prefix, None)? else {
                flow = visitor.partition_end(&header);
                break;
            };
            let floor = header.deletion_floor(&raw.clustering);
            if let Some(row) = assemble_row(raw, floor, now_seconds) {
                flow = visitor.row(&header, row);
            }
        }
        match flow {
            Flow::Stop => return Ok(Flow::Stop),
            Flow::NextPartition | Flow::Continue => {
                if let Some(next) = keys::increment_prefix(&header.prefix) {
                    if matches!(cursor.current(), Some((k, _)) if k.starts_with(&header.prefix)) {
                        cursor.skip_to(&next);
                    }
                } else {
                    break;
                }
            }
        }
    }
    cursor.status()?;
    Ok(Flow::Continue)
}
