//! Cells: the unit of storage and of last-write-wins reconciliation.
//!
//! Every write, whether a value, an expiring value (TTL) or a deletion, is a cell stamped
//! with its [`WriteTimestamp`]. Writes never read what is already stored: two cells for
//! the same place are reconciled later — in the memtable, in compaction, or on read — by
//! [`Cell::reconcile`], which picks the greater of the two in one *total* order, so it is
//! commutative, associative and idempotent and every replica converges on the same winner
//! whatever order writes arrive in.
//!
//! The order is Cassandra's (`Cells.reconcile`, CASSANDRA-14592), extended by two final
//! tie-breaks so that no two different cells ever tie:
//!
//! 1. the higher write timestamp wins;
//! 2. on a tie, a dead-or-dying cell (tombstone or expiring) beats a live one, and a
//!    tombstone beats an expiring cell;
//! 3. then the later *local deletion time* wins (a tombstone's `deleted_at`, an expiring
//!    cell's `expires_at`);
//! 4. then the greater value bytes;
//! 5. (Shoal) then the greater TTL — Cassandra stops at 4 and may keep either of two cells
//!    that differ only in TTL, which leaves replicas' digests different forever;
//! 6. (Shoal) then a tombstone whose shadowed cells were cleared beats the same tombstone
//!    without the mark (see [`CellKind::Tombstone::shadow_cleared`]), so the mark sticks.
//!
//! Deletion times are seconds since the epoch, stored unsigned in 32 bits as Cassandra 5.0
//! stores them: they reach 2106, not 2038.
//!
//! Encoded form (the value stored under a cell's key):
//! `kind: u8 | timestamp: i64 BE | [ttl_seconds: i32, expires_at: u32] (expiring) |
//! [deleted_at: u32] (tombstone) | value bytes (live and expiring)`.

use crate::{DecodeError, WriteTimestamp};
use std::cmp::Ordering;

/// The latest local deletion time a cell can carry (2106-02-07T06:28:15Z), as in
/// Cassandra 5.0.
pub const MAX_DELETION_TIME: i64 = u32::MAX as i64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellKind {
    /// A value that lives until overwritten or deleted.
    Live,
    /// A value written with a TTL: it reads as deleted from `expires_at` (seconds) on.
    Expiring { ttl_seconds: i32, expires_at: i64 },
    /// A deletion, made at `deleted_at` (seconds; tombstones are purged after the table's
    /// gc_grace_seconds).
    Tombstone {
        deleted_at: i64,
        /// Set by storage garbage collection on a deletion that covers other keys
        /// (partition, range, row or collection deletion) once every cell it shadowed has
        /// been replaced by a tombstone of its own: from then on compaction may drop it.
        /// Never set on cells that travel between nodes.
        shadow_cleared: bool,
    },
}

/// One stored cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    pub timestamp: WriteTimestamp,
    pub kind: CellKind,
    /// The serialized value (empty for tombstones and row markers).
    pub value: Vec<u8>,
}

const KIND_LIVE: u8 = 0;
const KIND_EXPIRING: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;
const KIND_SHADOW_CLEARED_TOMBSTONE: u8 = 3;

/// A deletion time as stored: clamped into `0..=MAX_DELETION_TIME`.
fn deletion_time_bytes(seconds: i64) -> [u8; 4] {
    (seconds.clamp(0, MAX_DELETION_TIME) as u32).to_be_bytes()
}

impl Cell {
    pub fn live(timestamp: WriteTimestamp, value: Vec<u8>) -> Cell {
        Cell {
            timestamp,
            kind: CellKind::Live,
            value,
        }
    }

    /// A live cell, or an expiring one when `ttl_seconds > 0`. The expiry is clamped at
    /// [`MAX_DELETION_TIME`]; writers refuse TTLs that would pass it before building cells.
    pub fn with_ttl(
        timestamp: WriteTimestamp,
        value: Vec<u8>,
        ttl_seconds: i32,
        now_seconds: i64,
    ) -> Cell {
        if ttl_seconds > 0 {
            Cell {
                timestamp,
                kind: CellKind::Expiring {
                    ttl_seconds,
                    expires_at: (now_seconds + ttl_seconds as i64).min(MAX_DELETION_TIME),
                },
                value,
            }
        } else {
            Cell::live(timestamp, value)
        }
    }

    /// The encoding of [`Cell::with_ttl`]`(timestamp, value, ...)`, for a writer that holds
    /// the value borrowed: written straight into the encoding, never copied into a cell.
    pub fn encode_with_ttl(
        timestamp: WriteTimestamp,
        value: &[u8],
        ttl_seconds: i32,
        now_seconds: i64,
    ) -> Vec<u8> {
        let header = Cell::with_ttl(timestamp, Vec::new(), ttl_seconds, now_seconds);
        let mut out = Vec::with_capacity(17 + value.len());
        header.encode_into(&mut out);
        // The value is the encoding's last part.
        out.extend_from_slice(value);
        out
    }

    pub fn tombstone(timestamp: WriteTimestamp, deleted_at: i64) -> Cell {
        Cell {
            timestamp,
            kind: CellKind::Tombstone {
                deleted_at,
                shadow_cleared: false,
            },
            value: Vec::new(),
        }
    }

    pub fn is_tombstone(&self) -> bool {
        matches!(self.kind, CellKind::Tombstone { .. })
    }

    /// True when the cell holds a value at `now_seconds` (not deleted, not expired).
    pub fn is_live(&self, now_seconds: i64) -> bool {
        match self.kind {
            CellKind::Live => true,
            CellKind::Expiring { expires_at, .. } => now_seconds < expires_at,
            CellKind::Tombstone { .. } => false,
        }
    }

    /// Seconds of TTL left at `now_seconds`, for `SELECT TTL(column)`.
    pub fn remaining_ttl(&self, now_seconds: i64) -> Option<i32> {
        match self.kind {
            CellKind::Expiring { expires_at, .. } => {
                Some((expires_at - now_seconds).clamp(0, i32::MAX as i64) as i32)
            }
            _ => None,
        }
    }

    /// From when on this dead cell counts towards gc_grace_seconds, if it is dead at
    /// `now_seconds`: a tombstone from its deletion; an expired cell from when it was
    /// written (`expires_at - ttl`), as Cassandra purges expired cells — every replica held
    /// it since then, so it can never be missing one of them.
    pub fn dead_since(&self, now_seconds: i64) -> Option<i64> {
        match self.kind {
            CellKind::Live => None,
            CellKind::Expiring {
                ttl_seconds,
                expires_at,
            } => (now_seconds >= expires_at).then_some(expires_at - ttl_seconds as i64),
            CellKind::Tombstone { deleted_at, .. } => Some(deleted_at),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17 + self.value.len());
        self.encode_into(&mut out);
        out
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self.kind {
            CellKind::Live => {
                out.push(KIND_LIVE);
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
            }
            CellKind::Expiring {
                ttl_seconds,
                expires_at,
            } => {
                out.push(KIND_EXPIRING);
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
                out.extend_from_slice(&ttl_seconds.to_be_bytes());
                out.extend_from_slice(&deletion_time_bytes(expires_at));
            }
            CellKind::Tombstone {
                deleted_at,
                shadow_cleared,
            } => {
                out.push(if shadow_cleared {
                    KIND_SHADOW_CLEARED_TOMBSTONE
                } else {
                    KIND_TOMBSTONE
                });
                out.extend_from_slice(&self.timestamp.0.to_be_bytes());
                out.extend_from_slice(&deletion_time_bytes(deleted_at));
            }
        }
        out.extend_from_slice(&self.value);
    }

    pub fn decode(bytes: &[u8]) -> Result<Cell, DecodeError> {
        let header = |length: usize| {
            if bytes.len() < length {
                Err(DecodeError::new("Truncated cell"))
            } else {
                Ok(())
            }
        };
        header(9)?;
        let timestamp =
            WriteTimestamp(i64::from_be_bytes(bytes[1..9].try_into().unwrap_or([0; 8])));
        let word_at = |at: usize| bytes[at..at + 4].try_into().unwrap_or([0; 4]);
        match bytes[0] {
            KIND_LIVE => Ok(Cell::live(timestamp, bytes[9..].to_vec())),
            KIND_EXPIRING => {
                header(17)?;
                Ok(Cell {
                    timestamp,
                    kind: CellKind::Expiring {
                        ttl_seconds: i32::from_be_bytes(word_at(9)),
                        expires_at: u32::from_be_bytes(word_at(13)) as i64,
                    },
                    value: bytes[17..].to_vec(),
                })
            }
            kind @ (KIND_TOMBSTONE | KIND_SHADOW_CLEARED_TOMBSTONE) => {
                header(13)?;
                if bytes.len() > 13 {
                    return Err(DecodeError::new("A tombstone carries no value"));
                }
                Ok(Cell {
                    timestamp,
                    kind: CellKind::Tombstone {
                        deleted_at: u32::from_be_bytes(word_at(9)) as i64,
                        shadow_cleared: kind == KIND_SHADOW_CLEARED_TOMBSTONE,
                    },
                    value: Vec::new(),
                })
            }
            other => Err(DecodeError(format!("Unknown cell kind {other}"))),
        }
    }

    /// Which of two encoded cells wins (see the module docs for the order).
    pub fn reconcile_encoded<'a>(a: &'a [u8], b: &'a [u8]) -> &'a [u8] {
        match (Cell::decode(a), Cell::decode(b)) {
            (Ok(x), Ok(y)) => match x.precedence(&y) {
                Ordering::Less => b,
                Ordering::Greater => a,
                // Equal cells encode equally; keep the smaller bytes to stay symmetric.
                Ordering::Equal => std::cmp::min(a, b),
            },
            // An undecodable operand loses to a decodable one; of two bad ones the smaller
            // bytes win, so the choice does not depend on the order they arrived in.
            (Ok(_), Err(_)) => a,
            (Err(_), Ok(_)) => b,
            (Err(_), Err(_)) => std::cmp::min(a, b),
        }
    }

    /// The winner of two cells for the same place.
    pub fn reconcile(self, other: Cell) -> Cell {
        if self.precedence(&other) == Ordering::Less {
            other
        } else {
            self
        }
    }

    /// The total order of [`Cell::reconcile`]: `Greater` wins.
    pub fn precedence(&self, other: &Cell) -> Ordering {
        /// `(class, local deletion time, ttl, shadow cleared)`.
        fn rank(cell: &Cell) -> (u8, i64, i32, bool) {
            match cell.kind {
                CellKind::Live => (0, 0, 0, false),
                CellKind::Expiring {
                    ttl_seconds,
                    expires_at,
                } => (1, expires_at, ttl_seconds, false),
                CellKind::Tombstone {
                    deleted_at,
                    shadow_cleared,
                } => (2, deleted_at, 0, shadow_cleared),
            }
        }
        let (mine, theirs) = (rank(self), rank(other));
        self.timestamp
            .cmp(&other.timestamp)
            .then(mine.0.cmp(&theirs.0))
            .then(mine.1.cmp(&theirs.1))
            .then_with(|| self.value.cmp(&other.value))
            .then(mine.2.cmp(&theirs.2))
            .then(mine.3.cmp(&theirs.3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_encoded_from_a_borrowed_value_is_the_cell_encoded() {
        for ttl in [0, 60] {
            let cell = Cell::with_ttl(WriteTimestamp(42), b"value".to_vec(), ttl, 1_000);
            assert_eq!(
                Cell::encode_with_ttl(WriteTimestamp(42), b"value", ttl, 1_000),
                cell.encode()
            );
        }
    }

    #[test]
    fn newest_timestamp_wins_in_any_order() {
        let old = Cell::live(WriteTimestamp(10), b"old".to_vec());
        let new = Cell::live(WriteTimestamp(20), b"new".to_vec());
        assert_eq!(old.clone().reconcile(new.clone()), new);
        assert_eq!(new.clone().reconcile(old), new);
    }

    #[test]
    fn tombstone_wins_a_timestamp_tie() {
        let value = Cell::live(WriteTimestamp(10), b"v".to_vec());
        let deletion = Cell::tombstone(WriteTimestamp(10), 5);
        assert_eq!(value.clone().reconcile(deletion.clone()), deletion);
        assert_eq!(deletion.clone().reconcile(value), deletion);
    }

    #[test]
    fn on_a_tie_deletion_time_is_compared_before_the_value() {
        // Cassandra: two expiring cells of one timestamp → the later expiry wins, whatever
        // their values.
        let small_value_late = Cell::with_ttl(WriteTimestamp(1), b"a".to_vec(), 100, 1_000);
        let big_value_early = Cell::with_ttl(WriteTimestamp(1), b"z".to_vec(), 50, 1_000);
        assert_eq!(
            big_value_early.clone().reconcile(small_value_late.clone()),
            small_value_late
        );
        // An expiring cell beats a live one of the same timestamp, even a larger value.
        let live = Cell::live(WriteTimestamp(1), b"zzz".to_vec());
        assert_eq!(
            live.reconcile(small_value_late.clone()).kind,
            small_value_late.kind
        );
    }

    #[test]
    fn cells_that_differ_only_in_ttl_reconcile_the_same_way_everywhere() {
        let a = Cell {
            timestamp: WriteTimestamp(1),
            kind: CellKind::Expiring {
                ttl_seconds: 10,
                expires_at: 500,
            },
            value: b"v".to_vec(),
        };
        let b = Cell {
            kind: CellKind::Expiring {
                ttl_seconds: 20,
                expires_at: 500,
            },
            ..a.clone()
        };
        assert_eq!(a.clone().reconcile(b.clone()), b);
        assert_eq!(b.clone().reconcile(a.clone()), b);
        let (ea, eb) = (a.encode(), b.encode());
        assert_eq!(
            Cell::reconcile_encoded(&ea, &eb),
            Cell::reconcile_encoded(&eb, &ea)
        );
    }

    #[test]
    fn cells_round_trip_and_bad_bytes_are_errors() {
        for cell in [
            Cell::live(WriteTimestamp(-3), b"abc".to_vec()),
            Cell::with_ttl(WriteTimestamp(7), b"x".to_vec(), 60, 1000),
            Cell::tombstone(WriteTimestamp(9), 123),
            Cell {
                timestamp: WriteTimestamp(9),
                kind: CellKind::Tombstone {
                    deleted_at: 3_000_000_000,
                    shadow_cleared: true,
                },
                value: Vec::new(),
            },
        ] {
            assert_eq!(Cell::decode(&cell.encode()).unwrap(), cell);
        }
        assert!(Cell::decode(&[1, 2]).is_err());
        assert!(Cell::decode(&[9; 20]).is_err());
        assert!(Cell::decode(&[2; 20]).is_err(), "a tombstone with a value");
    }

    #[test]
    fn expiring_cells_die_at_their_expiry_even_after_2038() {
        let cell = Cell::with_ttl(WriteTimestamp(1), vec![], 10, 100);
        assert!(cell.is_live(109));
        assert!(!cell.is_live(110));
        assert_eq!(cell.remaining_ttl(104), Some(6));
        // 2030 plus twenty years is past i32 seconds; it must not be cut at 2038.
        let late = Cell::with_ttl(WriteTimestamp(1), vec![], 630_720_000, 1_900_000_000);
        let decoded = Cell::decode(&late.encode()).unwrap();
        assert_eq!(
            decoded.kind,
            CellKind::Expiring {
                ttl_seconds: 630_720_000,
                expires_at: 2_530_720_000
            }
        );
        assert!(decoded.is_live(2_530_719_999));
    }

    #[test]
    fn an_expired_cell_counts_towards_gc_grace_from_its_write() {
        let cell = Cell::with_ttl(WriteTimestamp(1), vec![], 10, 100);
        assert_eq!(cell.dead_since(105), None, "not expired yet");
        assert_eq!(cell.dead_since(110), Some(100));
        assert_eq!(
            Cell::tombstone(WriteTimestamp(1), 42).dead_since(0),
            Some(42)
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn cell() -> impl Strategy<Value = Cell> {
            // Few distinct timestamps, deletion times and values, so ties are common.
            let kind = prop_oneof![
                Just(CellKind::Live),
                (1i32..4, 0i64..4).prop_map(|(ttl_seconds, expires_at)| CellKind::Expiring {
                    ttl_seconds,
                    expires_at
                }),
                (0i64..4, any::<bool>()).prop_map(|(deleted_at, shadow_cleared)| {
                    CellKind::Tombstone {
                        deleted_at,
                        shadow_cleared,
                    }
                }),
            ];
            (0i64..4, kind, proptest::collection::vec(0u8..3, 0..3)).prop_map(
                |(timestamp, kind, value)| Cell {
                    timestamp: WriteTimestamp(timestamp),
                    value: if matches!(kind, CellKind::Tombstone { .. }) {
                        Vec::new()
                    } else {
                        value
                    },
                    kind,
                },
            )
        }

        proptest! {
            #[test]
            fn reconcile_is_commutative(a in cell(), b in cell()) {
                prop_assert_eq!(a.clone().reconcile(b.clone()), b.clone().reconcile(a.clone()));
                let (ea, eb) = (a.encode(), b.encode());
                prop_assert_eq!(Cell::reconcile_encoded(&ea, &eb), Cell::reconcile_encoded(&eb, &ea));
            }

            #[test]
            fn reconcile_is_associative(a in cell(), b in cell(), c in cell()) {
                let left = a.clone().reconcile(b.clone()).reconcile(c.clone());
                let right = a.reconcile(b.reconcile(c));
                prop_assert_eq!(left, right);
            }

            #[test]
            fn reconcile_is_idempotent(a in cell(), b in cell()) {
                prop_assert_eq!(a.clone().reconcile(a.clone()), a.clone());
                let winner = a.clone().reconcile(b.clone());
                prop_assert_eq!(winner.clone().reconcile(b), winner);
            }

            #[test]
            fn only_identical_cells_tie(a in cell(), b in cell()) {
                prop_assert_eq!(a.precedence(&b) == Ordering::Equal, a == b);
            }

            #[test]
            fn decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
                if let Ok(cell) = Cell::decode(&bytes) {
                    prop_assert_eq!(Cell::decode(&cell.encode()), Ok(cell));
                }
            }
        }
    }
}
