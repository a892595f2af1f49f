//! Anti-entropy repair: make every replica of every tablet hold the same cells.
//!
//! For each tablet of each table repaired, the coordinator cuts the tablet's token range
//! into [`SEGMENTS_PER_TABLET`] segments and asks every replica for one hash per segment
//! (a one-level Merkle tree). Only segments whose hashes differ are read — from every
//! replica, in chunks — reconciled by last-write-wins, and the cells a replica lacks are
//! sent to it (the same path as read repair). Matching segments move no data.
//!
//! Every replica of a tablet must be up, as in Cassandra; tablets with a replica down are
//! reported and skipped.

use crate::replication::{ReplicaRequest, ReplicaResponse};
use crate::{Coordinator, CqlError};
use serde::{Deserialize, Serialize};
use shoal_cql::request::Consistency;
use shoal_model::{keys, Token};
use shoal_storage::Engine;
use std::hash::Hasher;

/// Segments compared per tablet.
pub const SEGMENTS_PER_TABLET: usize = 16;
/// Cells per chunk when a differing segment is read.
const REPAIR_CHUNK_CELLS: u32 = 4096;

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

/// One hash per range `[bounds[i], bounds[i+1])`, over every visible key and encoded cell
/// (what a replica would send: see [`shoal_storage::shadow::visit_visible`]).
/// (The standard library's hasher: every node runs the same binary.)
pub fn range_hashes(engine: &dyn Engine, bounds: &[Vec<u8>]) -> Result<Vec<u64>, String> {
    let mut hashes = Vec::with_capacity(bounds.len().saturating_sub(1));
    let now_seconds = shoal_model::timestamp::now_seconds();
    for range in bounds.windows(2) {
        let mut hasher = std::hash::DefaultHasher::new();
        shoal_storage::shadow::visit_visible(
            engine,
            &range[0],
            &range[1],
            now_seconds,
            |key, value| {
                crate::replication::hash_cell(&mut hasher, key, value);
                true
            },
        )
        .map_err(|e| e.to_string())?;
        hashes.push(hasher.finish());
    }
    Ok(hashes)
}

/// The key bounds of `segments` equal token slices of `(first exclusive, last]`.
fn segment_bounds(
    table_id: &[u8; 16],
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

impl Coordinator {
    /// Repairs every table (or those of `keyspace`, or just `keyspace.table`).
    pub async fn repair(
        &self,
        keyspace: Option<&str>,
        table: Option<&str>,
    ) -> Result<RepairReport, CqlError> {
        let Some(cluster) = &self.cluster else {
            return Ok(RepairReport::default());
        };
        let schema = self.schema();
        if let Some(keyspace) = keyspace {
            schema.keyspace(keyspace)?;
            if let Some(table) = table {
                schema.table(keyspace, table)?;
            }
        }
        let tables: Vec<[u8; 16]> = schema
            .user_keyspaces()
            .filter(|k| keyspace.is_none_or(|name| name == k.name))
            .flat_map(|k| k.tables.values())
            .filter(|t| table.is_none_or(|name| name == t.name))
            .map(|t| t.id)
            .collect();
        let mut report = RepairReport {
            tables: tables.len(),
            ..RepairReport::default()
        };
        for table_id in tables {
            let state = cluster.metadata.state();
            let Some(placement) = state.tables.get(&table_id) else {
                continue;
            };
            let mut previous: Option<Token> = None;
            for tablet in placement.tablets.tablets() {
                report.tablets += 1;
                let first_exclusive = previous;
                previous = Some(tablet.last_token);
                let replicas = cluster.replicas_of(&state, &table_id, tablet.last_token);
                if replicas.len() < 2 {
                    continue;
                }
                if replicas.iter().any(|r| !r.alive) {
                    report.tablets_skipped += 1;
                    continue;
                }
                let bounds = segment_bounds(
                    &table_id,
                    first_exclusive,
                    tablet.last_token,
                    SEGMENTS_PER_TABLET,
                );
                let mut all_hashes = Vec::new();
                for replica in replicas.iter() {
                    let hashes = if replica.local {
                        range_hashes(self.engine.as_ref(), &bounds)
                    } else {
                        match cluster
                            .transport
                            .send(
                                replica.address,
                                ReplicaRequest::RangeHashes {
                                    bounds: bounds.clone(),
                                },
                                std::time::Duration::from_secs(60),
                            )
                            .await
                        {
                            Ok(ReplicaResponse::Hashes(hashes)) => Ok(hashes),
                            Ok(other) => Err(format!("unexpected answer {other:?}")),
                            Err(error) => Err(error),
                        }
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
                                cluster,
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
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_tablet_exactly() {
        let table = [7u8; 16];
        let bounds = segment_bounds(&table, Some(Token(-100)), Token(100), 4);
        assert_eq!(bounds.len(), 5);
        assert_eq!(bounds[0], keys::token_prefix(&table, Token(-99)));
        assert_eq!(bounds[4], keys::token_prefix(&table, Token(101)));
        assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        let whole = segment_bounds(&table, None, Token::MAX, 16);
        assert_eq!(whole[0], keys::token_prefix(&table, Token::MIN));
        assert_eq!(whole[16], keys::table_end(&table));
    }

    #[test]
    fn equal_data_hashes_equal_and_a_difference_shows() {
        let a = shoal_storage::MemoryEngine::new();
        let b = shoal_storage::MemoryEngine::new();
        let cell = |value: &[u8]| {
            shoal_model::Cell::live(shoal_model::WriteTimestamp(1), value.to_vec()).encode()
        };
        let mut batch = shoal_storage::WriteBatch::new();
        batch.merge(b"k1".to_vec(), cell(b"v1"));
        a.write(&batch).unwrap();
        b.write(&batch).unwrap();
        let bounds = vec![b"k".to_vec(), b"k5".to_vec(), b"l".to_vec()];
        assert_eq!(range_hashes(&a, &bounds), range_hashes(&b, &bounds));
        let mut more = shoal_storage::WriteBatch::new();
        more.merge(b"k7".to_vec(), cell(b"v7"));
        b.write(&more).unwrap();
        let (ha, hb) = (
            range_hashes(&a, &bounds).unwrap(),
            range_hashes(&b, &bounds).unwrap(),
        );
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
    }
}
