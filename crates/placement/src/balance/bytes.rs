//! Bytes, as the balancer weighs them: what each tablet holds, and what that adds up to
//! on each node over every table.
//!
//! Replica counts come first (a node within one replica of every other, table by table);
//! bytes decide what counts leave open:
//!
//! - which tablet a heavy node gives a light one: the one that brings their bytes closest;
//! - which node takes a replica when several hold as many: the one holding fewest bytes;
//! - which tablets two nodes holding as many replicas hold: when one holds more bytes than
//!   the other by at least [`Bytes::worth_moving`], it gives a tablet and takes back the
//!   other's smallest (or, holding the table's odd replica, just gives one), so counts stay
//!   even and bytes come closer.
//!
//! Tablet sizes are measured (RocksDB's estimate of the tablet's key range on one of its
//! replicas) and a tablet not measured weighs nothing. A node's bytes are the sum of its
//! tablets' sizes — counting moves under way, and moves planned this round, as done — not
//! a figure measured on the node: a tablet half streamed in or not compacted away yet
//! would otherwise look like load still to be moved, and the balancer would move more.

use super::Move;
use shoal_model::{HostId, TableId, TabletId};
use std::collections::BTreeMap;

use crate::tablet::TabletMap;

/// The smallest difference between two nodes' bytes a move is started for: below it,
/// streaming costs more than the difference is worth, and estimates wobble by that much.
pub const SMALLEST_GAIN: u64 = 16 << 20;

/// What tablets and nodes hold, in bytes.
#[derive(Debug, Clone, Default)]
pub struct Bytes {
    tablets: BTreeMap<(TableId, TabletId), u64>,
    nodes: BTreeMap<HostId, u64>,
}

impl Bytes {
    /// From measured tablet sizes and every table's map (tablets not in `tablets` weigh
    /// nothing).
    pub fn new<'m>(
        tablets: BTreeMap<(TableId, TabletId), u64>,
        maps: impl IntoIterator<Item = (TableId, &'m TabletMap)>,
    ) -> Bytes {
        let mut nodes: BTreeMap<HostId, u64> = BTreeMap::new();
        for (table, map) in maps {
            for tablet in map.tablets() {
                let size = tablets.get(&(table, tablet.id)).copied().unwrap_or(0);
                for host in tablet.new_replicas() {
                    *nodes.entry(host).or_default() += size;
                }
            }
        }
        Bytes { tablets, nodes }
    }

    /// One tablet's size.
    pub fn of_tablet(&self, table: TableId, tablet: TabletId) -> u64 {
        self.tablets.get(&(table, tablet)).copied().unwrap_or(0)
    }

    /// What a node holds over every table.
    pub fn of_node(&self, host: &HostId) -> u64 {
        self.nodes.get(host).copied().unwrap_or(0)
    }

    /// The smallest fall in the difference between two nodes' bytes that a tablet of
    /// `table` is moved for: half its average tablet (so that tablets of even size never
    /// trade places back and forth), and at least [`SMALLEST_GAIN`].
    pub fn worth_moving(&self, table: TableId, map: &TabletMap) -> u64 {
        let count = map.tablets().len().max(1) as u64;
        let total: u64 = map
            .tablets()
            .iter()
            .map(|t| self.of_tablet(table, t.id))
            .sum();
        (total / count / 2).max(SMALLEST_GAIN)
    }

    /// Counts a planned move as done.
    pub(super) fn charge(&mut self, table: TableId, planned: &Move) {
        let size = self.of_tablet(table, planned.tablet);
        if let Some(held) = planned.leaving.and_then(|h| self.nodes.get_mut(&h)) {
            *held = held.saturating_sub(size);
        }
        if let Some(pending) = planned.pending {
            *self.nodes.entry(pending).or_default() += size;
        }
    }
}

/// How much closer moving a tablet of `size` bytes from a node holding `from` bytes to one
/// holding `to` brings the two (zero when it brings them no closer).
pub(super) fn gain(from: u64, to: u64, size: u64) -> u64 {
    let difference = from as i128 - to as i128;
    let after = (difference - 2 * size as i128).abs();
    (difference.abs() - after).max(0) as u64
}

/// How far apart moving a tablet of `size` bytes leaves the two nodes.
pub(super) fn distance_after(from: u64, to: u64, size: u64) -> u64 {
    (from as i128 - to as i128 - 2 * size as i128).unsigned_abs() as u64
}
