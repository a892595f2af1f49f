//! Forward scans across tablets: every cell once, in key order, wherever the scan starts
//! or skips to; sparse tablets fetched several at once once the table's cells per tablet
//! are known.

use super::sim::{SimCluster, TABLE};
use crate::consistency::WriteType;
use crate::range::{tablets_to_fetch, ReplicatedView, MAX_PARALLEL_TABLETS, SCAN_CHUNK_CELLS};
use shoal_cql::request::Consistency;
use shoal_model::token::murmur3_token;
use shoal_model::{keys, Cell, WriteTimestamp};
use shoal_storage::{Engine, WriteBatch};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn the_tablets_fetched_at_once_cover_one_chunk_beyond_the_first() {
    assert_eq!(tablets_to_fetch(None, 100), 1);
    let chunk = f64::from(SCAN_CHUNK_CELLS);
    // Large tablets: the one the scan is in and the next (it may start near its end).
    assert_eq!(tablets_to_fetch(Some(chunk * 3.0), 100), 2);
    assert_eq!(tablets_to_fetch(Some(chunk), 100), 2);
    assert_eq!(tablets_to_fetch(Some(chunk / 3.0), 100), 4);
    // Sparse tablets: as many as allowed, never more than there are.
    assert_eq!(tablets_to_fetch(Some(1.0), 100), MAX_PARALLEL_TABLETS);
    assert_eq!(tablets_to_fetch(Some(0.0), 3), 3);
}

/// The storage key of partition `key`'s one cell.
fn cell_key(key: &[u8]) -> Vec<u8> {
    let mut cell = keys::partition_prefix(&TABLE, murmur3_token(key), key);
    cell.push(keys::SECTION_ROW);
    keys::push_column_part(&mut cell, |k| keys::push_cell_column(k, "v", b""));
    cell
}

#[test]
fn a_scan_over_sparse_tablets_returns_every_cell_once_in_key_order() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Replication factor 1: each tablet's cells are on one node.
    let cluster = SimCluster::new(3, 1, Duration::from_secs(3600), 1 << 20);
    let mut batch = WriteBatch::new();
    let mut written: Vec<Vec<u8>> = (0..300)
        .map(|i| cell_key(format!("key-{i}").as_bytes()))
        .collect();
    for key in &written {
        batch.merge(
            key.clone(),
            Cell::live(WriteTimestamp(1), b"x".to_vec()).encode(),
        );
    }
    written.sort();
    let proxy = Arc::clone(&cluster.nodes[0].proxy);
    runtime
        .block_on(proxy.write(batch, Consistency::All, WriteType::Simple))
        .unwrap();
    let tablets = cluster.state.tables[&TABLE].tablets.tablets().len();
    assert!(tablets > MAX_PARALLEL_TABLETS, "{tablets} tablets");
    let view = ReplicatedView::new(
        Arc::clone(&proxy),
        TABLE,
        Consistency::One,
        runtime.handle().clone(),
    );
    let scanned = std::thread::spawn(move || {
        let (lower, upper) = (keys::table_prefix(&TABLE), keys::table_end(&TABLE));
        let mut passes = Vec::new();
        // The first pass learns the table's cells per tablet; the second fetches several
        // tablets at once; both see the same cells.
        for _ in 0..2 {
            let mut cursor = view.scan(&lower, &upper, false).unwrap();
            let mut keys = Vec::new();
            while let Some((key, _)) = cursor.current() {
                keys.push(key.to_vec());
                cursor.advance();
            }
            cursor.status().unwrap();
            passes.push(keys);
        }
        // A cursor that skips to a key in the middle goes on from exactly there.
        let mut cursor = view.scan(&lower, &upper, false).unwrap();
        let mut middle = passes[0][150].clone();
        cursor.skip_to(&middle);
        let mut rest = Vec::new();
        while let Some((key, _)) = cursor.current() {
            rest.push(key.to_vec());
            cursor.advance();
        }
        // And one that skips to just past a key starts at the next one.
        middle.push(0);
        let mut cursor = view.scan(&lower, &upper, false).unwrap();
        cursor.skip_to(&middle);
        let after = cursor.current().map(|(key, _)| key.to_vec());
        (passes, rest, after)
    })
    .join()
    .unwrap();
    let (passes, rest, after) = scanned;
    assert_eq!(passes[0], written);
    assert_eq!(passes[1], written);
    assert_eq!(rest, written[150..].to_vec());
    assert_eq!(after, Some(written[151].clone()));
    let learnt = proxy.scan_estimates.cells_per_tablet(&TABLE).unwrap();
    assert!(
        learnt < f64::from(SCAN_CHUNK_CELLS),
        "{learnt} cells per tablet"
    );
    runtime.shutdown_timeout(Duration::from_secs(1));
}
