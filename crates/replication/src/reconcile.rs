//! Reconciliation: replicas' answers for one range merged cell by cell by last-write-wins
//! ([`shoal_model::Cell::reconcile`]), cut to what every answer covers, without what a
//! deletion shadows; and, for each replica, the reconciled cells it did not hold (what
//! read repair and anti-entropy repair send it).

use crate::messages::Cells;
use crate::topology::Replica;
use shoal_model::Cell;
use std::collections::BTreeMap;

/// Replicas' answers merged by last-write-wins, covering `[lower, covered_until)`.
#[derive(Debug)]
pub struct Reconciled {
    pub cells: Cells,
    /// `None`: the whole requested range.
    pub covered_until: Option<Vec<u8>>,
    /// For a chunk read backwards: it covers `[covered_from, upper)` (`None`: from the
    /// requested lower bound).
    pub covered_from: Option<Vec<u8>>,
    /// Cells sent to replicas that lacked them (read repair).
    pub repaired: usize,
}

/// One replica's answer: its cells and whether they cover the whole range asked for.
pub(crate) type Answer = (Replica, Cells, bool);

/// Merges `answers` by last-write-wins; gives them back for read repair
/// ([`repairs_for`]) when there were several to compare.
///
/// A single answer is taken as it is: a replica answers with the visible cells of the
/// range in key order (`replica::read_visible`), so there is nothing to merge, nothing to
/// drop and nobody to repair. At consistency ONE every chunk of a scan is one answer;
/// merging it through a sorted map and copying every cell took about a quarter of a scan
/// thread's CPU.
pub(crate) fn reconcile(mut answers: Vec<Answer>) -> (Reconciled, Vec<Answer>) {
    if answers.len() == 1 {
        let (_, cells, complete) = answers.pop().expect("one answer");
        let covered_until = match complete {
            true => None,
            false => cells.last().map(|(key, _)| just_after(key.clone())),
        };
        let reconciled = Reconciled {
            cells,
            covered_until,
            covered_from: None,
            repaired: 0,
        };
        return (reconciled, Vec::new());
    }
    (merge(&answers), answers)
}

/// Several answers merged cell by cell.
fn merge(answers: &[Answer]) -> Reconciled {
    // An incomplete answer only speaks for keys up to its last one.
    let covered_until = answers
        .iter()
        .filter(|(_, _, complete)| !complete)
        .filter_map(|(_, cells, _)| cells.last().map(|(k, _)| k.clone()))
        .min();
    let mut merged: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
    for (_, cells, _) in answers {
        for (key, value) in cells {
            if covered_until.as_ref().is_some_and(|c| key > c) {
                break;
            }
            merged
                .entry(key.as_slice())
                .and_modify(|current| *current = Cell::reconcile_encoded(current, value))
                .or_insert(value.as_slice());
        }
    }
    Reconciled {
        // A deletion one replica holds hides what another still sends: reconcile to the
        // visible cells, so that repair never sends a replica cells that are dead anyway.
        cells: shoal_storage::shadow::without_shadowed(
            merged
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        ),
        covered_until: covered_until.map(just_after),
        covered_from: None,
        repaired: 0,
    }
}

/// An answer that ends at `key` covers everything up to and including it: the next read
/// continues just after it.
fn just_after(mut key: Vec<u8>) -> Vec<u8> {
    key.push(0);
    key
}

/// Replicas' answers to a backward chunk read (each covering `[from, upper)`), cut to what
/// every answer covers — `[the greatest from, upper)` — and merged; with the cut answers
/// when there were several (for [`repairs_for`]).
pub(crate) fn reconcile_before(
    answers: Vec<(Replica, Cells, Option<Vec<u8>>)>,
) -> (Reconciled, Vec<Answer>) {
    let covered_from = answers.iter().filter_map(|(_, _, from)| from.clone()).max();
    let cut: Vec<Answer> = answers
        .into_iter()
        .map(|(replica, mut cells, _)| {
            if let Some(from) = &covered_from {
                cells.retain(|(key, _)| key >= from);
            }
            (replica, cells, true)
        })
        .collect();
    let (reconciled, answers) = reconcile(cut);
    let reconciled = Reconciled {
        covered_from,
        ..reconciled
    };
    (reconciled, answers)
}

/// For each replica, the reconciled cells it does not hold exactly.
pub(crate) fn repairs_for(answers: &[Answer], reconciled: &Reconciled) -> Vec<(Replica, Cells)> {
    if answers.len() < 2 {
        return Vec::new();
    }
    let mut repairs = Vec::new();
    for (replica, cells, _) in answers {
        let held: BTreeMap<&[u8], &[u8]> = cells
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_slice()))
            .collect();
        let missing: Cells = reconciled
            .cells
            .iter()
            .filter(|(key, value)| held.get(key.as_slice()) != Some(&value.as_slice()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            repairs.push((replica.clone(), missing));
        }
    }
    repairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::{HostId, WriteTimestamp};
    use std::net::SocketAddr;

    fn replica(id: u8) -> Replica {
        Replica {
            host_id: HostId([id; 16]),
            address: SocketAddr::from(([127, 0, 0, id], 7000)),
            datacenter: "dc1".into(),
            local: id == 1,
            alive: true,
            topology_version: 0,
        }
    }

    fn cell(timestamp: i64, value: &[u8]) -> Vec<u8> {
        Cell::live(WriteTimestamp(timestamp), value.to_vec()).encode()
    }

    #[test]
    fn reconcile_keeps_the_newest_cell_and_repairs_stale_replicas() {
        let answers = vec![
            (
                replica(1),
                vec![
                    (b"a".to_vec(), cell(1, b"old")),
                    (b"b".to_vec(), cell(5, b"b")),
                ],
                true,
            ),
            (replica(2), vec![(b"a".to_vec(), cell(2, b"new"))], true),
        ];
        let (reconciled, answers) = reconcile(answers);
        assert_eq!(
            reconciled.cells,
            vec![
                (b"a".to_vec(), cell(2, b"new")),
                (b"b".to_vec(), cell(5, b"b"))
            ]
        );
        let repairs = repairs_for(&answers, &reconciled);
        assert_eq!(repairs.len(), 2);
        assert_eq!(repairs[0].1, vec![(b"a".to_vec(), cell(2, b"new"))]);
        assert_eq!(repairs[1].1, vec![(b"b".to_vec(), cell(5, b"b"))]);
    }

    #[test]
    fn the_only_answer_is_what_reconciling_it_makes() {
        let deletion = Cell::tombstone(WriteTimestamp(4), 0).encode();
        let cells = vec![
            (b"a".to_vec(), cell(1, b"1")),
            (b"b".to_vec(), deletion),
            (b"c".to_vec(), cell(3, b"3")),
        ];
        for complete in [true, false] {
            for cells in [cells.clone(), Vec::new()] {
                let merged = merge(&[(replica(2), cells.clone(), complete)]);
                let (only, kept) = reconcile(vec![(replica(2), cells, complete)]);
                assert!(kept.is_empty(), "one answer: nobody to repair");
                assert_eq!(only.cells, merged.cells);
                assert_eq!(only.covered_until, merged.covered_until);
                assert_eq!(only.covered_from, merged.covered_from);
                assert_eq!(only.repaired, merged.repaired);
            }
        }
    }

    #[test]
    fn an_incomplete_answer_limits_what_the_chunk_covers() {
        let answers = vec![
            (replica(1), vec![(b"a".to_vec(), cell(1, b"1"))], false),
            (
                replica(2),
                vec![
                    (b"a".to_vec(), cell(1, b"1")),
                    (b"c".to_vec(), cell(1, b"3")),
                ],
                true,
            ),
        ];
        let (reconciled, _) = reconcile(answers);
        assert_eq!(
            reconciled.cells.len(),
            1,
            "c is beyond what replica 1 covered"
        );
        assert_eq!(reconciled.covered_until, Some(b"a\0".to_vec()));
    }
}
