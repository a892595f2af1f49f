//! Row fragments: a row's marker and its simple cells stored as one value, under the row
//! marker's key.
//!
//! One key per cell makes a row of ten columns eleven storage entries: eleven memtable
//! inserts when it is written, eleven entries every flush and compaction merges, filters and
//! rewrites, eleven entries a point read walks. A fragment holds the part of a row that is
//! addressed by column alone — the marker (liveness from INSERT) and every cell without a
//! collection path — so that part is one entry. Deletions (partition, range, row,
//! whole-collection) and the elements of non-frozen collections keep keys of their own: they
//! cover or address something a fragment cannot name.
//!
//! A fragment is *what one write said about the row*: writes stay blind. Two fragments of
//! the same row are joined column by column, each column's cells by [`Cell::reconcile`], the
//! markers likewise ([`join_encoded`]); so joining is commutative, associative and
//! idempotent exactly as reconciling one cell is, and replicas converge whatever order
//! fragments arrive in.
//!
//! Encoded form:
//!
//! ```text
//! 0x10 | marker length (u32 BE, 0 = none) | marker cell | cell count (u16 BE)
//!      | (name length (u16 BE) | name | cell length (u32 BE) | cell)*   names ascending
//! ```
//!
//! A cell's encoding starts with its kind (`0..=3`, see [`crate::cell`]), never `0x10`, so
//! a value under a marker key is told apart by its first byte: a plain cell there is a
//! marker written before fragments existed, read as a fragment holding that marker alone.

use crate::cell::Cell;
use crate::keys;
use crate::DecodeError;

/// First byte of an encoded fragment.
pub const FRAGMENT_KIND: u8 = 0x10;

/// True when `value` (stored under a row marker's key) is an encoded fragment rather than
/// a plain marker cell.
pub fn is_fragment(value: &[u8]) -> bool {
    value.first() == Some(&FRAGMENT_KIND)
}

/// True when the stored entry `(key, value)` is a row fragment: a fragment's encoding
/// under a row marker's key (a plain marker cell or any other key's value is not).
pub fn is_stored_fragment(key: &[u8], value: &[u8]) -> bool {
    is_fragment(value) && marker_row(key).is_some()
}

/// How many cells a stored value holds, read from its header alone: a fragment's marker
/// and cells, any other value one (a value too short to say counts as one).
pub fn cells_held(value: &[u8]) -> usize {
    if !is_fragment(value) {
        return 1;
    }
    let mut rest = &value[1..];
    let Ok(marker_length) = take_u32(&mut rest) else {
        return 1;
    };
    let marker = usize::from(marker_length > 0);
    match take(&mut rest, marker_length).and_then(|_| take_u16(&mut rest)) {
        Ok(count) => (marker + count).max(1),
        Err(_) => 1,
    }
}

/// A fragment read in place: the marker's and the cells' encodings borrowed from the
/// stored value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FragmentView<'a> {
    /// The encoded marker cell, if this fragment carries one.
    pub marker: Option<&'a [u8]>,
    /// `(column name, encoded cell)`, names strictly ascending.
    pub cells: Vec<(&'a [u8], &'a [u8])>,
}

fn truncated() -> DecodeError {
    DecodeError::new("Truncated row fragment")
}

/// Splits `length` bytes off the front of `bytes`.
fn take<'a>(bytes: &mut &'a [u8], length: usize) -> Result<&'a [u8], DecodeError> {
    if bytes.len() < length {
        return Err(truncated());
    }
    let (head, tail) = bytes.split_at(length);
    *bytes = tail;
    Ok(head)
}

fn take_u16(bytes: &mut &[u8]) -> Result<usize, DecodeError> {
    let raw = take(bytes, 2)?;
    Ok(u16::from_be_bytes([raw[0], raw[1]]) as usize)
}

fn take_u32(bytes: &mut &[u8]) -> Result<usize, DecodeError> {
    let raw = take(bytes, 4)?;
    Ok(u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize)
}

impl<'a> FragmentView<'a> {
    /// Reads a value stored under a row marker's key: a fragment, or a plain marker cell.
    pub fn parse(value: &'a [u8]) -> Result<FragmentView<'a>, DecodeError> {
        if !is_fragment(value) {
            return Ok(FragmentView {
                marker: Some(value),
                cells: Vec::new(),
            });
        }
        let mut rest = &value[1..];
        let marker_length = take_u32(&mut rest)?;
        let marker = match marker_length {
            0 => None,
            length => Some(take(&mut rest, length)?),
        };
        let count = take_u16(&mut rest)?;
        let mut cells: Vec<(&[u8], &[u8])> = Vec::with_capacity(count);
        for _ in 0..count {
            let name_length = take_u16(&mut rest)?;
            let name = take(&mut rest, name_length)?;
            let cell_length = take_u32(&mut rest)?;
            let cell = take(&mut rest, cell_length)?;
            if cell.is_empty() {
                return Err(DecodeError::new("A row fragment holds an empty cell"));
            }
            if cells.last().is_some_and(|(previous, _)| *previous >= name) {
                return Err(DecodeError::new(
                    "A row fragment's columns are out of order or repeated",
                ));
            }
            cells.push((name, cell));
        }
        if !rest.is_empty() {
            return Err(DecodeError::new("Bytes after a row fragment's last cell"));
        }
        Ok(FragmentView { marker, cells })
    }

    /// The encoded cell of `column`, if this fragment carries one.
    pub fn cell(&self, column: &[u8]) -> Option<&'a [u8]> {
        self.cells
            .binary_search_by(|(name, _)| (*name).cmp(column))
            .ok()
            .map(|at| self.cells[at].1)
    }

    /// True when the fragment says nothing (no marker, no cell).
    pub fn is_empty(&self) -> bool {
        self.marker.is_none() && self.cells.is_empty()
    }

    /// Encodes this fragment; one that holds a marker and no cell is encoded as the plain
    /// marker cell, as rows with nothing but a marker (index entries) have always been.
    pub fn encode(&self) -> Vec<u8> {
        if let (Some(marker), true) = (self.marker, self.cells.is_empty()) {
            return marker.to_vec();
        }
        let cell_bytes: usize = self
            .cells
            .iter()
            .map(|(name, cell)| 6 + name.len() + cell.len())
            .sum();
        let marker = self.marker.unwrap_or_default();
        let mut out = Vec::with_capacity(7 + marker.len() + cell_bytes);
        out.push(FRAGMENT_KIND);
        out.extend_from_slice(&(marker.len() as u32).to_be_bytes());
        out.extend_from_slice(marker);
        out.extend_from_slice(&(self.cells.len() as u16).to_be_bytes());
        for (name, cell) in &self.cells {
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(cell.len() as u32).to_be_bytes());
            out.extend_from_slice(cell);
        }
        out
    }
}

/// Builds a fragment's encoding from a marker and cells given in any order; of two cells
/// for one column the winner by last-write-wins is kept.
pub fn encode_fragment<'a>(
    marker: Option<&'a [u8]>,
    cells: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Vec<u8> {
    let mut cells: Vec<(&[u8], &[u8])> = cells.into_iter().collect();
    cells.sort_by(|a, b| a.0.cmp(b.0));
    cells.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 = Cell::reconcile_encoded(kept.1, later.1);
            true
        } else {
            false
        }
    });
    FragmentView { marker, cells }.encode()
}

/// Joins values stored under one row marker's key (fragments or plain marker cells): the
/// markers reconcile, and each column's cells reconcile, by [`Cell::reconcile`]'s order.
/// Undecodable operands are ignored unless every operand is, so a corrupt value never
/// hides a good one; of undecodable ones alone the smallest bytes are kept, as
/// [`Cell::reconcile_encoded`] does.
pub fn join_encoded<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut views: Vec<FragmentView<'a>> = Vec::new();
    let mut undecodable: Option<&'a [u8]> = None;
    for value in values {
        match FragmentView::parse(value) {
            Ok(view) => views.push(view),
            Err(_) => {
                undecodable = Some(match undecodable {
                    Some(kept) => std::cmp::min(kept, value),
                    None => value,
                });
            }
        }
    }
    if views.is_empty() {
        return undecodable.unwrap_or_default().to_vec();
    }
    if let [only] = views.as_slice() {
        // Already in order (parsing refuses disorder); a plain marker becomes a fragment.
        return only.encode();
    }
    let marker = views
        .iter()
        .filter_map(|view| view.marker)
        .reduce(Cell::reconcile_encoded);
    encode_fragment(marker, views.into_iter().flat_map(|view| view.cells))
}

/// The row of a row marker's key (`partition | section | clustering`), or `None` when
/// `key` is not a marker's key.
pub fn marker_row(key: &[u8]) -> Option<&[u8]> {
    key.strip_suffix(&[keys::COLUMN_ROW_MARKER, 0, 1])
}

/// The row marker's key of `row` (`partition | section | clustering`): where the row's
/// fragment is stored; [`marker_row`] undoes it.
pub fn marker_key(row: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(row.len() + 3);
    key.extend_from_slice(row);
    keys::push_column_part(&mut key, |k| k.push(keys::COLUMN_ROW_MARKER));
    key
}

/// The key a simple cell of `column` in `row` (`partition | section | clustering`) is
/// named by: `row | 0x03 | len | name | L`.
pub fn simple_cell_key(row: &[u8], column: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(row.len() + column.len() + 5);
    key.extend_from_slice(row);
    keys::push_column_part(&mut key, |k| {
        k.push(keys::COLUMN_CELL);
        k.extend_from_slice(&(column.len() as u16).to_be_bytes());
        k.extend_from_slice(column);
    });
    key
}

/// A cell's key and its encoding, borrowed from the stored value.
pub type KeyedCell<'v> = (Vec<u8>, &'v [u8]);

/// The cells one stored entry holds, each under the key a write names it by, in key
/// order: a fragment under a marker's key gives its marker (under `key`) and each of its
/// cells (under [`simple_cell_key`]); any other entry is the one cell it is.
pub fn expand<'v>(key: &[u8], value: &'v [u8]) -> Result<Vec<KeyedCell<'v>>, DecodeError> {
    let row = match marker_row(key) {
        Some(row) if is_fragment(value) => row,
        _ => return Ok(vec![(key.to_vec(), value)]),
    };
    let view = FragmentView::parse(value)?;
    let mut cells: Vec<(Vec<u8>, &[u8])> = Vec::with_capacity(1 + view.cells.len());
    if let Some(marker) = view.marker {
        cells.push((key.to_vec(), marker));
    }
    for (name, cell) in view.cells {
        cells.push((simple_cell_key(row, name), cell));
    }
    // Names sort by bytes, keys by length first (`len | name`): sort by key.
    cells.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WriteTimestamp;

    fn live(timestamp: i64, value: &str) -> Vec<u8> {
        Cell::live(WriteTimestamp(timestamp), value.as_bytes().to_vec()).encode()
    }

    fn tombstone(timestamp: i64) -> Vec<u8> {
        Cell::tombstone(WriteTimestamp(timestamp), 1_700_000_000).encode()
    }

    fn marker(timestamp: i64) -> Vec<u8> {
        Cell::live(WriteTimestamp(timestamp), Vec::new()).encode()
    }

    /// `(marker, [(column, cell)])` of an encoded value, for comparing outcomes.
    type Contents = (Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

    fn contents(value: &[u8]) -> Contents {
        let view = FragmentView::parse(value).unwrap();
        (
            view.marker.map(<[u8]>::to_vec),
            view.cells
                .iter()
                .map(|(name, cell)| (String::from_utf8(name.to_vec()).unwrap(), cell.to_vec()))
                .collect(),
        )
    }

    #[test]
    fn a_fragment_round_trips_and_finds_its_cells() {
        let (m, a, b) = (marker(5), live(5, "x"), live(6, "y"));
        let encoded = encode_fragment(Some(&m), [(&b"b"[..], &b[..]), (&b"a"[..], &a[..])]);
        assert!(is_fragment(&encoded));
        let view = FragmentView::parse(&encoded).unwrap();
        assert_eq!(view.marker, Some(&m[..]));
        assert_eq!(view.cell(b"a"), Some(&a[..]));
        assert_eq!(view.cell(b"b"), Some(&b[..]));
        assert_eq!(view.cell(b"c"), None);
        assert_eq!(view.encode(), encoded);
        assert_eq!(cells_held(&encoded), 3);
        let unmarked = encode_fragment(None, [(&b"a"[..], &a[..])]);
        assert_eq!(cells_held(&unmarked), 1);
        assert_eq!(cells_held(&m), 1);
        assert_eq!(
            cells_held(&encoded[..3]),
            1,
            "a truncated header counts as one"
        );
    }

    #[test]
    fn a_plain_marker_cell_reads_as_a_fragment_of_that_marker() {
        let m = marker(7);
        assert!(!is_fragment(&m));
        let view = FragmentView::parse(&m).unwrap();
        assert_eq!(view.marker, Some(&m[..]));
        assert!(view.cells.is_empty());
    }

    #[test]
    fn a_marker_alone_stays_a_plain_cell_and_joins_into_a_fragment() {
        let (early, late, a) = (marker(5), marker(9), live(7, "x"));
        assert_eq!(encode_fragment(Some(&early), []), early);
        assert_eq!(join_encoded([&early[..], &late[..]]), late);
        let joined = join_encoded([&early[..], &encode_fragment(None, [(&b"a"[..], &a[..])])]);
        assert!(is_fragment(&joined));
        assert_eq!(contents(&joined), (Some(early), vec![("a".into(), a)]));
    }

    #[test]
    fn truncated_or_disordered_fragments_are_refused() {
        let (m, a) = (marker(5), live(5, "x"));
        let encoded = encode_fragment(Some(&m), [(&b"a"[..], &a[..])]);
        for length in 1..encoded.len() {
            assert!(
                FragmentView::parse(&encoded[..length]).is_err(),
                "{length} bytes of {} parsed",
                encoded.len()
            );
        }
        let disordered = FragmentView {
            marker: None,
            cells: vec![(b"b", &a), (b"a", &a)],
        }
        .encode();
        assert!(FragmentView::parse(&disordered).is_err());
        assert!(FragmentView::parse(&[FRAGMENT_KIND, 0, 0, 0, 0, 0, 0, 9]).is_err());
    }

    #[test]
    fn joining_reconciles_each_column_and_the_marker_on_its_own() {
        // An INSERT at 10 (marker, a, b), an UPDATE of b at 20, a DELETE of a at 15.
        let insert = encode_fragment(
            Some(&marker(10)),
            [
                (&b"a"[..], &live(10, "a1")[..]),
                (&b"b"[..], &live(10, "b1")[..]),
            ],
        );
        let update = encode_fragment(None, [(&b"b"[..], &live(20, "b2")[..])]);
        let delete = encode_fragment(None, [(&b"a"[..], &tombstone(15)[..])]);
        let joined = join_encoded([&insert[..], &update[..], &delete[..]]);
        assert_eq!(
            contents(&joined),
            (
                Some(marker(10)),
                vec![("a".into(), tombstone(15)), ("b".into(), live(20, "b2"))]
            )
        );
    }

    #[test]
    fn joining_is_order_free_and_idempotent() {
        let values = [
            encode_fragment(Some(&marker(10)), [(&b"a"[..], &live(10, "a1")[..])]),
            encode_fragment(Some(&marker(12)), [(&b"c"[..], &live(12, "c")[..])]),
            encode_fragment(None, [(&b"a"[..], &tombstone(10)[..])]),
            marker(11),
        ];
        let expected = join_encoded(values.iter().map(Vec::as_slice));
        let orders: [[usize; 4]; 4] = [[3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1], [0, 0, 1, 2]];
        for order in orders {
            let mut chosen: Vec<&[u8]> = order.iter().map(|&i| values[i].as_slice()).collect();
            if order == [0, 0, 1, 2] {
                chosen.push(&values[3]);
            }
            assert_eq!(join_encoded(chosen), expected, "order {order:?}");
        }
        // Joining a joined value with a part of it changes nothing.
        assert_eq!(join_encoded([&expected[..], &values[2][..]]), expected);
        // The tie on timestamp 10 between a live cell and a tombstone goes to the tombstone.
        assert_eq!(
            FragmentView::parse(&expected).unwrap().cell(b"a"),
            Some(&tombstone(10)[..])
        );
        assert_eq!(
            FragmentView::parse(&expected).unwrap().marker,
            Some(&marker(12)[..])
        );
    }

    #[test]
    fn a_corrupt_operand_never_hides_a_good_one() {
        let good = encode_fragment(Some(&marker(3)), [(&b"a"[..], &live(3, "a")[..])]);
        let corrupt = vec![FRAGMENT_KIND, 0, 0];
        assert_eq!(join_encoded([&corrupt[..], &good[..]]), good);
        assert_eq!(join_encoded([&good[..], &corrupt[..]]), good);
        assert_eq!(join_encoded([&corrupt[..]]), corrupt);
    }
}
