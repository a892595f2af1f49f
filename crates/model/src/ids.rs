//! Identifiers as types, so that a table's id is never passed where a node's belongs.
//!
//! - [`HostId`] — a node, for the life of its data directory (Cassandra's host id).
//! - [`TableId`] — a table; the first 16 bytes of every storage key of the table.
//! - [`TabletId`] — a tablet of a table: stable while the tablet exists, so a tablet can be
//!   followed while it moves between nodes.
//!
//! Each serializes exactly as the bare value it wraps (`serde(transparent)`), so stored
//! metadata and internode messages keep their encoding.

use serde::{Deserialize, Serialize};
use std::fmt;

fn write_uuid(bytes: &[u8; 16], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(f, "{}", uuid::Uuid::from_bytes(*bytes))
}

/// A node of the cluster.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostId(pub [u8; 16]);

impl HostId {
    /// A new random id (a node's first start).
    pub fn random() -> HostId {
        HostId(*uuid::Uuid::new_v4().as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_uuid(&self.0, f)
    }
}

impl fmt::Debug for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostId({self})")
    }
}

/// A table.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TableId(pub [u8; 16]);

impl TableId {
    /// A new random id (CREATE TABLE).
    pub fn random() -> TableId {
        TableId(*uuid::Uuid::new_v4().as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The table a storage key belongs to.
    pub fn of_key(key: &[u8]) -> Option<TableId> {
        key.get(..16)?.try_into().ok().map(TableId)
    }
}

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_uuid(&self.0, f)
    }
}

impl fmt::Debug for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableId({self})")
    }
}

/// A tablet of one table.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct TabletId(pub u64);

impl fmt::Display for TabletId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tablet {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_show_as_uuids_and_come_from_keys() {
        let id = TableId([0x11; 16]);
        assert_eq!(id.to_string(), "11111111-1111-1111-1111-111111111111");
        let mut key = id.0.to_vec();
        key.push(7);
        assert_eq!(TableId::of_key(&key), Some(id));
        assert_eq!(TableId::of_key(&key[..3]), None);
    }
}
