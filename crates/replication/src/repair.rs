//! Anti-entropy repair: make every replica of every tablet hold the same cells.
//!
//! For each tablet of each table repaired, the coordinator cuts the tablet's token range
//! into [`SEGMENTS_PER_TABLET`] segments and asks every replica for one hash per segment
//! (a one-level Merkle tree) over its visible cells. Only segments whose hashes differ are
//! read — from every replica, in chunks — reconciled by last-write-wins, and the cells a
//! replica lacks are sent to it (the same path as read repair). Matching segments move no
//! data.
//!
//! Every replica of a tablet must be up, as in Cassandra; tablets with a replica down are
//! reported and skipped.

use crate::messages::{ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use serde::{Deserialize, Serialize};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId, Token};
use std::time::Duration;

/// Segments compared per tablet.
pub const SEGMENTS_PER_TABLET: usize = 16;
/// Cells per chunk when a differing segment is read.
const REPAIR_CHUNK_CELLS: u32 = 4096;
/// How long a replica may take to hash a tablet.
const HASH_TIMEOUT: Duration = Duration::from_secs(60);

/// What a repair did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RepairReport {
    pub tables: usize,
    pub tablets: usize,
    /// Tablets skipped because a replica was down.
    pub tablets_skipped: usize,
    pub segments_compared: usize,
    pub segments_differing: usize,
    /// Cells sent to replicas that lacked them.
    pub cells_repaired: usize,
}

/// The key bounds of `segments` equal token slices of `(first exclusive, last]`.
fn segment_bounds(
    table_id: &TableId,
    first_exclusive: Option<Token>,
    last: Token,
    segments: usize,
) -> Vec<Vec<u8>> {
    let start = first_exclusive.map_or(i64::MIN as i128, |t| t.0 as i128 + 1);
    let end = last.0 as i128 + 1; // exclusive
    let span = (end - start).max(1);
    let mut bounds = Vec::with_capacity(segments + 1);
    for i in 0..segments {
        let token = start + span * i as i128 / segments as i128;
        bounds.push(keys::token_prefix(table_id, Token(token as i64)));
    }
    bounds.push(if last == Token::MAX {
        keys::table_end(table_id)
    } else {
        keys::token_prefix(table_id, Token(end as i64))
    });
    bounds.dedup();
    bounds
}

impl StorageProxy {
    /// Repairs every tablet of `tables`: afterwards every replica holds every visible cell
    /// any replica held.
    pub async fn repair(&self, tables: Vec<TableId>) -> Result<RepairReport, CqlError> {
        let mut report = RepairReport {
            tables: tables.len(),
            ..RepairReport::default()
        };
        for table in tables {
            let state = self.topology.state();
            let Some(placement) = state.tables.get(&table) else {
                continue;
            };
            let mut previous: Option<Token> = None;
            for tablet in placement.tablets.tablets() {
                report.tablets += 1;
                let first_exclusive = previous;
                previous = Some(tablet.last_token);
                if tablet.transition.is_some() {
                    // Its replicas are changing: the next repair covers it.
                    report.tablets_skipped += 1;
                    continue;
                }
                let replicas = self.replicas_of(&state, &table, tablet.last_token);
                if replicas.len() < 2 {
                    continue;
                }
                if replicas.iter().any(|r| !r.alive) {
                    report.tablets_skipped += 1;
                    continue;
                }
                let bounds = segment_bounds(
                    &table,
                    first_exclusive,
                    tablet.last_token,
                    SEGMENTS_PER_TABLET,
                );
                let mut all_hashes = Vec::new();
                for replica in replicas.iter() {
                    let request = ReplicaRequest::RangeHashes {
                        bounds: bounds.clone(),
                    };
                    let hashes = match self.call(replica, request, HASH_TIMEOUT).await {
                        Ok(ReplicaResponse::Hashes(hashes)) => Ok(hashes),
                        Ok(other) => Err(format!("unexpected answer {other:?}")),
                        Err(error) => Err(error),
                    };
                    all_hashes.push(hashes.map_err(|e| {
                        CqlError::server(format!(
                            "repair: {} could not hash its data: {e}",
                            replica.address
                        ))
                    })?);
                }
                for (segment, range) in bounds.windows(2).enumerate() {
                    report.segments_compared += 1;
                    let first = all_hashes[0].get(segment);
                    if all_hashes.iter().all(|h| h.get(segment) == first) {
                        continue;
                    }
                    report.segments_differing += 1;
                    let mut start = range[0].clone();
                    loop {
                        let reconciled = self
                            .read_replicas(
                                &replicas,
                                Consistency::All,
                                &start,
                                &range[1],
                                REPAIR_CHUNK_CELLS,
                            )
                            .await?;
                        report.cells_repaired += reconciled.repaired;
                        match reconciled.covered_until {
                            Some(next) if next < range[1] => start = next,
                            _ => break,
                        }
                    }
                }
            }
        }
        tracing::info!(?report, "repair finished");
        self.repairs
            .repairs_finished
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.repairs.repair_cells.fetch_add(
            report.cells_repaired as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_tablet_exactly() {
        let table = TableId([7u8; 16]);
        let bounds = segment_bounds(&table, Some(Token(-100)), Token(100), 4);
        assert_eq!(bounds.len(), 5);
        assert_eq!(bounds[0], keys::token_prefix(&table, Token(-99)));
        assert_eq!(bounds[4], keys::token_prefix(&table, Token(101)));
        assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        let whole = segment_bounds(&table, None, Token::MAX, 16);
        assert_eq!(whole[0], keys::token_prefix(&table, Token::MIN));
        assert_eq!(whole[16], keys::table_end(&table));
    }
}
