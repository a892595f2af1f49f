//! Packing a batch's cells into row fragments (decision 0018): the marker and the simple
//! cells of one row, written together, become one merge operand under the row marker's key.

use shoal_model::fragment;
use shoal_model::keys::{self, ColumnPart};
use shoal_model::Cell;
use std::borrow::Cow;

/// The first byte of the internal tables' ids (Paxos `fd…`, batchlog `fe…`, hints `ff…`):
/// they are read by exact key and never packed.
const FIRST_INTERNAL_TABLE_BYTE: u8 = 0xfd;

/// Where a key stands in its row, when it is a user table row's marker or simple cell.
struct Slot<'k> {
    /// `partition | section | clustering`: the row's keys all start with it.
    row: &'k [u8],
    /// `None` for the marker, the column's name for a simple cell.
    column: Option<&'k [u8]>,
}

fn slot(key: &[u8]) -> Option<Slot<'_>> {
    if *key.first()? >= FIRST_INTERNAL_TABLE_BYTE {
        return None;
    }
    let (_, rest) = keys::split_at_partition_end(key)?;
    let (section, _, column_part) = keys::split_row_key(rest)?;
    if section != keys::SECTION_ROW && section != keys::SECTION_STATIC_ROW {
        return None;
    }
    let row = &key[..key.len() - 2 - column_part.len()];
    match keys::parse_column_part(column_part)? {
        ColumnPart::RowMarker => Some(Slot { row, column: None }),
        ColumnPart::Cell { column, path: [] } => Some(Slot {
            row,
            column: Some(column),
        }),
        _ => None,
    }
}

/// True when `key` is a row marker's key, under which fragments are stored.
pub(super) fn is_marker_key(key: &[u8]) -> bool {
    fragment::marker_row(key).is_some()
}

/// A merge operand to write: `(key, operand)`, borrowed from the batch when an entry is
/// written as it is.
pub(super) type Operand<'e> = (Cow<'e, [u8]>, Cow<'e, [u8]>);

/// One row's marker and cells, collected from consecutive entries.
struct Run<'e> {
    row: &'e [u8],
    marker: Option<&'e [u8]>,
    cells: Vec<(&'e [u8], &'e [u8])>,
}

impl<'e> Run<'e> {
    fn finish(self) -> Operand<'e> {
        let key = fragment::marker_key(self.row);
        let fragment = fragment::encode_fragment(self.marker, self.cells);
        (Cow::Owned(key), Cow::Owned(fragment))
    }
}

/// The operands `entries` come to: each run of consecutive entries that are one row's
/// marker or simple cells as one fragment under the marker's key, every other entry as
/// it is.
pub(super) fn pack<'e>(entries: impl Iterator<Item = &'e (Vec<u8>, Vec<u8>)>) -> Vec<Operand<'e>> {
    let (at_least, _) = entries.size_hint();
    let mut operands = Vec::with_capacity(at_least);
    let mut run: Option<Run<'e>> = None;
    for (key, value) in entries {
        let Some(slot) = slot(key) else {
            operands.extend(run.take().map(Run::finish));
            operands.push((
                Cow::Borrowed(key.as_slice()),
                Cow::Borrowed(value.as_slice()),
            ));
            continue;
        };
        let open = match &mut run {
            Some(open) if open.row == slot.row => open,
            _ => {
                operands.extend(run.take().map(Run::finish));
                run.insert(Run {
                    row: slot.row,
                    marker: None,
                    cells: Vec::new(),
                })
            }
        };
        match slot.column {
            None => {
                open.marker = Some(match open.marker {
                    Some(kept) => Cell::reconcile_encoded(kept, value),
                    None => value,
                })
            }
            Some(column) => open.cells.push((column, value)),
        }
    }
    operands.extend(run.map(Run::finish));
    operands
}
