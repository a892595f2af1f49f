//! The storage key layout. One table's data is ordered by
//! `(table id, token, partition key, section, clustering, column)`:
//!
//! ```text
//! table id (16) | token (8, sortable) | escaped partition key | 0x00 0x00
//!   | 0x10                                   partition deletion
//!   | 0x20 | start bound | end bound         range tombstone
//!   | 0x30 | column part | L (u16)           static row
//!   | 0x40 | clustering | column part | L    clustered row
//! column part (L is its length, stored last so that it never affects ordering):
//!   0x00                                     row deletion
//!   0x01                                     row marker (liveness from INSERT)
//!   0x02 | name length (u16) | name          whole-collection deletion
//!   0x03 | name length (u16) | name | path   cell (path: element key of a collection)
//! ```
//!
//! **A row's simple cells live under its marker's key.** The marker key (`0x01`) holds a
//! row fragment ([`crate::fragment`]): the marker and every cell without a collection
//! path, so a row written by one INSERT is one storage entry. `0x03` keys with an empty
//! path are what a write names a simple cell by, and what readers expand a fragment
//! into ([`crate::fragment::expand`]); the storage engine's writer packs them into the
//! fragment. Only a collection's elements are stored under `0x03` keys.
//!
//! Because the token comes first, a token range of a table — a tablet — is one contiguous
//! key range: scans walk it in token order, truncation and streaming take it whole.
//!
//! **Partitions of one token sort by key.** The partition key is escaped (`0x00` as
//! `0x00 0xff`) and ended by `0x00 0x00`, which keeps byte order and marks where the key
//! ends. A hashed table rarely has two partitions on one token; an ordered table
//! (`shoal_model::token::ordered_token`) has one for every key sharing its first eight
//! bytes, and this is what keeps those in key order too.
//!
//! **Deletions sort before what they shadow.** Within a partition the partition deletion
//! comes first, then every range tombstone, then the static row and the rows; within a
//! row the row deletion comes first, then the marker, then every collection deletion,
//! then the cells. So a walk in key order meets every deletion before any cell it can
//! shadow, which is what lets compaction drop shadowed cells as it passes them
//! (`shoal_storage::shadow`) and a forward read apply deletions without looking back.
//! [`STORAGE_FORMAT_VERSION`] changes whenever this layout does.

use crate::{TableId, Token};
use std::borrow::Cow;

/// Length of the table id prefix.
pub const TABLE_ID_LENGTH: usize = 16;
/// Length of `table id | token`: the prefix that bloom filters are built on.
pub const TOKEN_PREFIX_LENGTH: usize = TABLE_ID_LENGTH + 8;

pub const SECTION_PARTITION_DELETION: u8 = 0x10;
pub const SECTION_RANGE_TOMBSTONE: u8 = 0x20;
pub const SECTION_STATIC_ROW: u8 = 0x30;
pub const SECTION_ROW: u8 = 0x40;

pub const COLUMN_ROW_DELETION: u8 = 0x00;
pub const COLUMN_ROW_MARKER: u8 = 0x01;
pub const COLUMN_COLLECTION_DELETION: u8 = 0x02;
pub const COLUMN_CELL: u8 = 0x03;

/// The version of this key layout, of the cell encoding and of the cluster metadata kept
/// beside the data (a node's Raft log and state); a data directory written with another
/// version is refused at start-up rather than misread. 5: a row's marker and simple cells
/// are stored as one row fragment under the marker's key ([`crate::fragment`]; a version 4
/// store holds them under keys of their own, and a cell under both would be read twice).
pub const STORAGE_FORMAT_VERSION: u32 = 5;

/// Kinds of clustering bound in a range tombstone key.
pub const BOUND_INCLUSIVE: u8 = 1;
pub const BOUND_EXCLUSIVE: u8 = 0;

/// `table id` — all of a table's keys start with it.
pub fn table_prefix(table_id: &TableId) -> Vec<u8> {
    table_id.0.to_vec()
}

/// The first key after every key of the table.
pub fn table_end(table_id: &TableId) -> Vec<u8> {
    increment_prefix(&table_id.0).unwrap_or_else(|| vec![0xff; TABLE_ID_LENGTH + 1])
}

/// `table id | token`: the start of a token's keys.
pub fn token_prefix(table_id: &TableId, token: Token) -> Vec<u8> {
    let mut key = Vec::with_capacity(TOKEN_PREFIX_LENGTH);
    key.extend_from_slice(&table_id.0);
    key.extend_from_slice(&token.to_sortable_bytes());
    key
}

/// The keys `[lower, upper)` of the tokens `(after, last]` of a table — one tablet's
/// data (`after: None`: from the table's first token).
pub fn token_range(table_id: &TableId, after: Option<Token>, last: Token) -> (Vec<u8>, Vec<u8>) {
    let lower = match after {
        Some(after) if after < Token::MAX => token_prefix(table_id, Token(after.0 + 1)),
        Some(_) => table_end(table_id),
        None => table_prefix(table_id),
    };
    let upper = if last == Token::MAX {
        table_end(table_id)
    } else {
        token_prefix(table_id, Token(last.0 + 1))
    };
    (lower, upper)
}

/// `table id | token | partition key`: the prefix of every key of one partition.
pub fn partition_prefix(table_id: &TableId, token: Token, partition_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(TOKEN_PREFIX_LENGTH + 4 + partition_key.len() + 64);
    key.extend_from_slice(&table_id.0);
    key.extend_from_slice(&token.to_sortable_bytes());
    crate::clustering::escape_bytes(&mut key, partition_key);
    key
}

/// The table and token a storage key belongs to.
pub fn table_and_token(key: &[u8]) -> Option<(TableId, Token)> {
    Some((TableId::of_key(key)?, token_of_key(key)?))
}

/// The token of a storage key, or of a bare `table id | token` prefix (a scan bound).
pub fn token_of_key(key: &[u8]) -> Option<Token> {
    let token_bytes = key
        .get(TABLE_ID_LENGTH..TOKEN_PREFIX_LENGTH)?
        .try_into()
        .ok()?;
    Some(Token::from_sortable_bytes(token_bytes))
}

/// Splits a storage key where its partition key ends: `(table id | token | partition key,
/// the rest)` — the partition's prefix, as [`partition_prefix`] builds it, and what
/// follows. Nothing is decoded or copied (for callers that compare partitions or read the
/// row part, cell after cell).
pub fn split_at_partition_end(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let length = crate::clustering::escaped_length(key.get(TOKEN_PREFIX_LENGTH..)?)?;
    Some(key.split_at(TOKEN_PREFIX_LENGTH + length))
}

/// A storage key split after its partition key: `(token, partition key, the rest)`.
pub type PartitionParts<'a> = (Token, Cow<'a, [u8]>, &'a [u8]);

/// Splits a storage key into `(token, partition key, rest after the partition key)`. The
/// partition key is borrowed from `key` unless it holds a zero byte (then it is unescaped
/// into a copy).
pub fn split_partition(key: &[u8]) -> Option<PartitionParts<'_>> {
    split_token_and_key(key.get(TABLE_ID_LENGTH..)?)
}

/// Splits `token | escaped partition key | rest` (a storage key after its table id).
fn split_token_and_key(bytes: &[u8]) -> Option<PartitionParts<'_>> {
    let token = Token::from_sortable_bytes(bytes.get(..8)?.try_into().ok()?);
    let body = &bytes[8..];
    let length = crate::clustering::escaped_length(body)?;
    let escaped = &body[..length - 2];
    let partition_key = if escaped.contains(&0) {
        Cow::Owned(crate::clustering::unescape_front(body).ok()?)
    } else {
        Cow::Borrowed(escaped)
    };
    Some((token, partition_key, &body[length..]))
}

/// Appends a column part and its trailing length to a row key that already holds
/// `partition prefix | section [| clustering]`.
pub fn push_column_part(key: &mut Vec<u8>, part: impl FnOnce(&mut Vec<u8>)) {
    let start = key.len();
    part(key);
    let length = (key.len() - start) as u16;
    key.extend_from_slice(&length.to_be_bytes());
}

/// Splits the part of a row key after the partition key (`section | clustering | column
/// part | L`) into `(section, clustering, column part)`.
pub fn split_row_key(rest: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&section, body) = rest.split_first()?;
    if body.len() < 2 {
        return None;
    }
    let length = u16::from_be_bytes([body[body.len() - 2], body[body.len() - 1]]) as usize;
    let column_end = body.len() - 2;
    let column_start = column_end.checked_sub(length)?;
    Some((
        section,
        &body[..column_start],
        &body[column_start..column_end],
    ))
}

/// Appends a regular column's cell part: `0x03 | len | name | path`.
pub fn push_cell_column(key: &mut Vec<u8>, column: &str, path: &[u8]) {
    key.push(COLUMN_CELL);
    key.extend_from_slice(&(column.len() as u16).to_be_bytes());
    key.extend_from_slice(column.as_bytes());
    key.extend_from_slice(path);
}

/// Appends a whole-collection deletion part: `0x02 | len | name`.
pub fn push_collection_deletion(key: &mut Vec<u8>, column: &str) {
    key.push(COLUMN_COLLECTION_DELETION);
    key.extend_from_slice(&(column.len() as u16).to_be_bytes());
    key.extend_from_slice(column.as_bytes());
}

/// A parsed column part.
#[derive(Debug, PartialEq, Eq)]
pub enum ColumnPart<'a> {
    RowMarker,
    RowDeletion,
    Cell { column: &'a [u8], path: &'a [u8] },
    CollectionDeletion { column: &'a [u8] },
}

pub fn parse_column_part(bytes: &[u8]) -> Option<ColumnPart<'_>> {
    let (&tag, rest) = bytes.split_first()?;
    match tag {
        COLUMN_ROW_MARKER => Some(ColumnPart::RowMarker),
        COLUMN_ROW_DELETION => Some(ColumnPart::RowDeletion),
        COLUMN_CELL | COLUMN_COLLECTION_DELETION => {
            let length = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
            let column = rest.get(2..2 + length)?;
            if tag == COLUMN_CELL {
                Some(ColumnPart::Cell {
                    column,
                    path: &rest[2 + length..],
                })
            } else {
                Some(ColumnPart::CollectionDeletion { column })
            }
        }
        _ => None,
    }
}

/// The smallest byte string greater than every string starting with `prefix`, or `None`
/// when the prefix is all `0xff`.
pub fn increment_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut bytes = prefix.to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return Some(bytes);
        }
    }
    None
}

/// Serializes a partition key as Cassandra does: a single component is its bytes; a
/// composite key is, per component, `u16 length | bytes | 0x00`. The token hashes this.
pub fn serialize_partition_key(components: &[impl AsRef<[u8]>]) -> Vec<u8> {
    if components.len() == 1 {
        return components[0].as_ref().to_vec();
    }
    let mut out = Vec::new();
    for component in components {
        let component = component.as_ref();
        out.extend_from_slice(&(component.len() as u16).to_be_bytes());
        out.extend_from_slice(component);
        out.push(0);
    }
    out
}

/// Splits a serialized partition key back into `count` components.
pub fn split_partition_key(serialized: &[u8], count: usize) -> Option<Vec<&[u8]>> {
    if count == 1 {
        return Some(vec![serialized]);
    }
    let mut components = Vec::with_capacity(count);
    let mut position = 0;
    for _ in 0..count {
        let length_bytes = serialized.get(position..position + 2)?;
        let length = u16::from_be_bytes([length_bytes[0], length_bytes[1]]) as usize;
        components.push(serialized.get(position + 2..position + 2 + length)?);
        position += 3 + length;
    }
    (position == serialized.len()).then_some(components)
}

/// Appends a range tombstone's key part to a partition prefix:
/// `0x20 | start length (u16) | start | start inclusive | end length | end | end inclusive`.
/// Bounds are clustering prefixes in their byte-comparable encoding; an empty inclusive
/// bound is unbounded.
pub fn push_range_tombstone(
    key: &mut Vec<u8>,
    start: &[u8],
    start_inclusive: bool,
    end: &[u8],
    end_inclusive: bool,
) {
    key.push(SECTION_RANGE_TOMBSTONE);
    for (bound, inclusive) in [(start, start_inclusive), (end, end_inclusive)] {
        key.extend_from_slice(&(bound.len() as u16).to_be_bytes());
        key.extend_from_slice(bound);
        key.push(if inclusive {
            BOUND_INCLUSIVE
        } else {
            BOUND_EXCLUSIVE
        });
    }
}

/// Parses the part after the partition key of a range tombstone key into
/// `(start, start inclusive, end, end inclusive)`.
pub fn parse_range_tombstone(rest: &[u8]) -> Option<(&[u8], bool, &[u8], bool)> {
    let (&section, mut body) = rest.split_first()?;
    if section != SECTION_RANGE_TOMBSTONE {
        return None;
    }
    let mut bounds = Vec::with_capacity(2);
    for _ in 0..2 {
        let length = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize;
        let bound = body.get(2..2 + length)?;
        let inclusive = *body.get(2 + length)? == BOUND_INCLUSIVE;
        bounds.push((bound, inclusive));
        body = &body[3 + length..];
    }
    Some((bounds[0].0, bounds[0].1, bounds[1].0, bounds[1].1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_split_back() {
        let table = TableId([7u8; 16]);
        let key = partition_prefix(&table, Token(-5), b"pk");
        let mut full = key.clone();
        full.push(SECTION_ROW);
        full.extend_from_slice(b"ck");
        push_column_part(&mut full, |k| push_cell_column(k, "v", b"p"));
        let (token, partition_key, rest) = split_partition(&full).unwrap();
        assert_eq!((token, &*partition_key), (Token(-5), &b"pk"[..]));
        let (section, clustering, column) = split_row_key(rest).unwrap();
        assert_eq!((section, clustering), (SECTION_ROW, &b"ck"[..]));
        assert_eq!(
            parse_column_part(column),
            Some(ColumnPart::Cell {
                column: b"v",
                path: b"p"
            })
        );
        assert!(split_partition(&key[..10]).is_none());
    }

    #[test]
    fn partitions_of_one_token_sort_by_key_bytes_and_split_back() {
        let table = TableId([7u8; 16]);
        // Zero bytes, a key that is a prefix of another, lengths that disagree with order.
        let partition_keys: [&[u8]; 7] = [
            b"",
            b"\x00",
            b"\x00\x00",
            b"\x00\x01",
            b"a",
            b"a\x00z",
            b"ab",
        ];
        let mut cells = Vec::new();
        for partition_key in partition_keys {
            let mut cell = partition_prefix(&table, Token(9), partition_key);
            cell.push(SECTION_ROW);
            push_column_part(&mut cell, |k| push_cell_column(k, "v", b""));
            let (token, split_key, rest) = split_partition(&cell).unwrap();
            assert_eq!((token, &*split_key), (Token(9), partition_key));
            assert_eq!(rest.first(), Some(&SECTION_ROW));
            cells.push(cell);
        }
        let mut sorted = cells.clone();
        sorted.sort();
        assert_eq!(sorted, cells, "storage order is partition key order");
    }

    #[test]
    fn composite_partition_keys_round_trip() {
        let components = vec![b"a".to_vec(), vec![0, 0, 0, 1]];
        let serialized = serialize_partition_key(&components);
        let split = split_partition_key(&serialized, 2).unwrap();
        assert_eq!(split, vec![&b"a"[..], &[0, 0, 0, 1][..]]);
        assert!(split_partition_key(&serialized, 3).is_none());
    }

    #[test]
    fn column_parts_parse() {
        let mut key = Vec::new();
        push_cell_column(&mut key, "tags", b"path");
        assert_eq!(
            parse_column_part(&key),
            Some(ColumnPart::Cell {
                column: b"tags",
                path: b"path"
            })
        );
        assert_eq!(increment_prefix(&[1, 0xff]), Some(vec![2]));
        assert_eq!(increment_prefix(&[0xff]), None);
    }

    #[test]
    fn within_a_partition_every_deletion_sorts_before_what_it_shadows() {
        let table = TableId([1u8; 16]);
        let partition = partition_prefix(&table, Token(3), b"pk");
        let row = |clustering: &[u8], part: &dyn Fn(&mut Vec<u8>)| {
            let mut key = partition.clone();
            key.push(SECTION_ROW);
            key.extend_from_slice(clustering);
            push_column_part(&mut key, part);
            key
        };
        let mut partition_deletion = partition.clone();
        partition_deletion.push(SECTION_PARTITION_DELETION);
        let mut range = partition.clone();
        push_range_tombstone(&mut range, b"", true, b"", true);
        let mut static_cell = partition.clone();
        static_cell.push(SECTION_STATIC_ROW);
        push_column_part(&mut static_cell, |k| push_cell_column(k, "a", b""));
        let row_deletion = row(b"c", &|k| k.push(COLUMN_ROW_DELETION));
        let marker = row(b"c", &|k| k.push(COLUMN_ROW_MARKER));
        // Collection deletions of every column come before any cell of the row, including
        // cells of columns whose names sort first.
        let collection_deletion = row(b"c", &|k| push_collection_deletion(k, "zz"));
        let cell = row(b"c", &|k| push_cell_column(k, "a", b"\x00"));
        let ordered = [
            &partition_deletion,
            &range,
            &static_cell,
            &row_deletion,
            &marker,
            &collection_deletion,
            &cell,
        ];
        for pair in ordered.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{:?} must sort before {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// Local secondary index entries use the data layout above, as rows of a hidden table
/// whose id is the index's own id, ordered by indexed value and then by base cell — so one
/// value's entries are one contiguous range listing base partitions in token order, and
/// the values of a range (`v >= 10 AND v < 20`) are one contiguous range too. One row per
/// indexed base *cell*: its clustering is the escaped value followed by the base cell's key
/// after the table id (`token | escaped partition key | section | clustering | column part
/// | L`). Each entry is a row marker carrying its base cell's
/// timestamp and TTL: it lives exactly as long as that cell (two cells of a row with one
/// value — a map's two keys, a row's marker and a column for a clustering index — each keep
/// their own), and compaction, garbage collection and the visible-cell reader treat it like
/// any row.
///
/// ```text
/// index id (16) | first 8 bytes of escaped value (the "token") | 0x00 0x00 (no partition key)
///   | 0x40 | escaped value | base token (8) | escaped base key
///          | base section [| base clustering] | base column part | base L
///   | 0x01 | L
/// ```
///
/// `value` is the indexed value's byte-comparable encoding
/// ([`crate::clustering::encode_component`]); escaping it (`0x00` as `0x00 0xff`, ended by
/// `0x00 0x00`) keeps its order and marks where it ends whatever its type. Its first eight
/// bytes stand in the token's place, so key order is value order and the bloom filters on
/// `table id | token` still let an equality lookup skip files without the value's prefix.
pub fn index_entry_key(index: &TableId, value: &[u8], base_cell: &[u8]) -> Option<Vec<u8>> {
    if value.len() > u16::MAX as usize {
        return None;
    }
    let mut key = index_value_prefix(index, value);
    key.extend_from_slice(base_cell);
    push_column_part(&mut key, |k| k.push(COLUMN_ROW_MARKER));
    Some(key)
}

/// Where an escaped value starts in `index`: its "partition" (the value's first eight
/// escaped bytes as the token) and the row section.
fn index_value_start(index: &TableId, escaped_value: &[u8]) -> Vec<u8> {
    let mut first = [0u8; 8];
    let len = escaped_value.len().min(8);
    first[..len].copy_from_slice(&escaped_value[..len]);
    let mut key = partition_prefix(index, Token::from_sortable_bytes(first), &[]);
    key.push(SECTION_ROW);
    key
}

/// The prefix of every entry of `value` in `index`.
pub fn index_value_prefix(index: &TableId, value: &[u8]) -> Vec<u8> {
    let mut escaped = Vec::with_capacity(value.len() + 4);
    crate::clustering::escape_bytes(&mut escaped, value);
    let mut key = index_value_start(index, &escaped);
    key.extend_from_slice(&escaped);
    key
}

/// The key range of `value`'s entries whose base token is at least `from`.
pub fn index_value_range(index: &TableId, value: &[u8], from: Token) -> (Vec<u8>, Vec<u8>) {
    let prefix = index_value_prefix(index, value);
    let mut lower = prefix.clone();
    lower.extend_from_slice(&from.to_sortable_bytes());
    let upper = increment_prefix(&prefix).unwrap_or_else(|| table_end(index));
    (lower, upper)
}

/// The key range of the entries of every value between `lower` and `upper` (each a
/// byte-comparable value and whether it is included; `None`: unbounded).
pub fn index_values_range(
    index: &TableId,
    lower: Option<(&[u8], bool)>,
    upper: Option<(&[u8], bool)>,
) -> (Vec<u8>, Vec<u8>) {
    let start = match lower {
        None => table_prefix(index),
        Some((value, true)) => index_value_prefix(index, value),
        Some((value, false)) => {
            increment_prefix(&index_value_prefix(index, value)).unwrap_or_else(|| table_end(index))
        }
    };
    let end = match upper {
        None => table_end(index),
        Some((value, true)) => {
            increment_prefix(&index_value_prefix(index, value)).unwrap_or_else(|| table_end(index))
        }
        Some((value, false)) => index_value_prefix(index, value),
    };
    (start, end)
}

/// A data key after its table id: what an index entry's clustering holds.
pub fn base_cell_of(key: &[u8]) -> Option<&[u8]> {
    key.get(TABLE_ID_LENGTH..)
}

/// An index entry's indexed value (byte-comparable, still escaped) and what follows it.
fn split_index_entry(entry_key: &[u8]) -> Option<(&[u8], &[u8])> {
    let (_, rest) = split_at_partition_end(entry_key)?;
    let rest = rest.strip_prefix(&[SECTION_ROW])?;
    Some(rest.split_at(crate::clustering::escaped_length(rest)?))
}

/// The base partition `(token, partition key)` after an entry's value.
fn base_partition(base: &[u8]) -> Option<(Token, Cow<'_, [u8]>)> {
    let (token, partition_key, _) = split_token_and_key(base)?;
    Some((token, partition_key))
}

/// An index entry's indexed value (byte-comparable) and the base partition
/// `(token, partition key)` it points at.
pub fn index_entry_parts(entry_key: &[u8]) -> Option<(Vec<u8>, Token, Cow<'_, [u8]>)> {
    let (value, base) = split_index_entry(entry_key)?;
    let (token, partition_key) = base_partition(base)?;
    let value = crate::clustering::unescape_front(value).ok()?;
    Some((value, token, partition_key))
}

/// The base partition `(token, partition key)` an index entry's key points at.
pub fn index_entry_base(entry_key: &[u8]) -> Option<(Token, Cow<'_, [u8]>)> {
    base_partition(split_index_entry(entry_key)?.1)
}

#[cfg(test)]
mod index_tests {
    use super::*;

    #[test]
    fn an_index_entry_points_back_at_its_base_partition_in_token_order() {
        let table = TableId([7; 16]);
        let index = TableId([9; 16]);
        let mut row = partition_prefix(&table, Token(-5), b"key");
        row.push(SECTION_ROW);
        row.extend_from_slice(b"clustering");
        let mut cell = row.clone();
        push_column_part(&mut cell, |k| push_cell_column(k, "v", b""));
        let base_cell = base_cell_of(&cell).unwrap();
        assert!(base_cell.starts_with(&row[TABLE_ID_LENGTH..]));
        let entry = index_entry_key(&index, b"value", base_cell).unwrap();
        assert_eq!(
            index_entry_base(&entry),
            Some((Token(-5), Cow::Borrowed(&b"key"[..])))
        );
        let (lower, upper) = index_value_range(&index, b"value", Token(-10));
        assert!(lower <= entry && entry < upper);
        let (later, _) = index_value_range(&index, b"value", Token(0));
        assert!(entry < later, "entries sort by base token");
        let (other_lower, other_upper) = index_value_range(&index, b"valuf", Token::MIN);
        assert!(
            !(other_lower <= entry && entry < other_upper),
            "another value's range holds none of this value's entries"
        );
    }

    /// A base cell of partition `key` (token `token`) of a table.
    fn base_cell(token: i64, key: &[u8]) -> Vec<u8> {
        let mut cell = partition_prefix(&TableId([7; 16]), Token(token), key);
        cell.push(SECTION_ROW);
        push_column_part(&mut cell, |k| push_cell_column(k, "v", b""));
        base_cell_of(&cell).unwrap().to_vec()
    }

    #[test]
    fn index_entries_sort_by_value_then_base_token_and_give_both_back() {
        let index = TableId([9; 16]);
        // Values with zero bytes, a common prefix longer than the token's eight bytes,
        // and one that is empty.
        let values: [&[u8]; 6] = [
            b"",
            b"\x00",
            b"\x00\x00\x01",
            b"\x00\x01",
            b"abcdefghij-1",
            b"abcdefghij-2",
        ];
        let mut entries = Vec::new();
        for value in values {
            for token in [-3, 8] {
                let entry = index_entry_key(&index, value, &base_cell(token, b"k")).unwrap();
                let (read_value, read_token, read_key) = index_entry_parts(&entry).unwrap();
                assert_eq!(
                    (read_value.as_slice(), read_token, &*read_key),
                    (value, Token(token), &b"k"[..])
                );
                entries.push(entry);
            }
        }
        let mut sorted = entries.clone();
        sorted.sort();
        assert_eq!(sorted, entries, "value order, then base token order");
    }

    #[test]
    fn a_value_range_holds_exactly_the_entries_of_its_values() {
        let index = TableId([9; 16]);
        let values: Vec<Vec<u8>> = (0u8..6).map(|v| vec![0, v, 0]).collect();
        let entries: Vec<Vec<u8>> = values
            .iter()
            .map(|value| index_entry_key(&index, value, &base_cell(1, b"k")).unwrap())
            .collect();
        let inside = |(lower, upper): (Vec<u8>, Vec<u8>)| -> Vec<usize> {
            (0..entries.len())
                .filter(|&i| lower <= entries[i] && entries[i] < upper)
                .collect()
        };
        let (two, four) = (values[2].as_slice(), values[4].as_slice());
        assert_eq!(
            inside(index_values_range(
                &index,
                Some((two, true)),
                Some((four, true))
            )),
            [2, 3, 4]
        );
        assert_eq!(
            inside(index_values_range(
                &index,
                Some((two, false)),
                Some((four, false))
            )),
            [3]
        );
        assert_eq!(
            inside(index_values_range(&index, None, Some((two, false)))),
            [0, 1]
        );
        assert_eq!(
            inside(index_values_range(&index, Some((four, false)), None)),
            [5]
        );
        assert_eq!(
            inside(index_values_range(&index, None, None)),
            [0, 1, 2, 3, 4, 5]
        );
    }
}
