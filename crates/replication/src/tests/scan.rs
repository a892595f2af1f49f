//! Forward scans across tablets: every cell once, in key order, wherever the scan starts
//! or skips to; as many tablets fetched at once as the scan's LIMIT needs, by the cells
//! per tablet the replicas tell with their replies.

use super::sim::{SimCluster, TABLE};
use crate::consistency::WriteType;
use crate::estimates::{tablets_to_fetch, ScanEstimates, MAX_PARALLEL_TABLETS};
use crate::messages::{ScanTicket, TabletCells};
use crate::range::{ReplicatedView, SCAN_CHUNK_CELLS};
use shoal_cql::request::Consistency;
use shoal_model::token::murmur3_token;
use shoal_model::{keys, Cell, TabletId, WriteTimestamp};
use shoal_storage::{Engine, WriteBatch};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_scan_fetches_its_tablet_and_the_fewest_following_ones_that_cover_what_it_wants() {
    // Nothing known of the next tablets: the one the scan is in, alone.
    assert_eq!(tablets_to_fetch(&[], 100.0, MAX_PARALLEL_TABLETS), 1);
    assert_eq!(
        tablets_to_fetch(&[None, None], 100.0, MAX_PARALLEL_TABLETS),
        1
    );
    // The first tablet does not count (the scan may start near its end): one following
    // tablet holding enough.
    assert_eq!(
        tablets_to_fetch(&[Some(500.0), Some(500.0)], 100.0, MAX_PARALLEL_TABLETS),
        2
    );
    // Following tablets are added until their cells cover what is wanted.
    let forty = [Some(40.0); 5];
    assert_eq!(tablets_to_fetch(&forty, 100.0, MAX_PARALLEL_TABLETS), 4);
    assert_eq!(tablets_to_fetch(&forty, 80.0, MAX_PARALLEL_TABLETS), 3);
    // A tablet nothing is known of ends the set before it.
    assert_eq!(
        tablets_to_fetch(&[Some(40.0), None, Some(40.0)], 100.0, MAX_PARALLEL_TABLETS),
        2
    );
    // Empty tablets: as many as allowed, never more than there are.
    assert_eq!(
        tablets_to_fetch(&[Some(0.0); 20], 100.0, MAX_PARALLEL_TABLETS),
        MAX_PARALLEL_TABLETS
    );
    assert_eq!(
        tablets_to_fetch(&[Some(0.0); 2], 100.0, MAX_PARALLEL_TABLETS),
        3
    );
    // Fan-out turned off (`scan_parallel_tablets = 1`): one tablet after another.
    assert_eq!(tablets_to_fetch(&[Some(0.0); 20], 100.0, 1), 1);
}

#[test]
fn a_tablet_no_replica_told_of_counts_as_the_tables_mean() {
    let estimates = ScanEstimates::default();
    let (a, b, c) = (TabletId(1), TabletId(2), TabletId(3));
    assert_eq!(estimates.cells_in(&TABLE, &[a]), vec![None]);
    // Whole tablets read, for tables whose replicas tell nothing.
    estimates.observe(TABLE, 8);
    assert_eq!(estimates.cells_in(&TABLE, &[a]), vec![Some(8.0)]);
    // The replicas' word wins, and their mean stands for the others.
    estimates.record(&TabletCells {
        table: TABLE,
        tablets: vec![(a, 10), (b, 30)],
    });
    assert_eq!(
        estimates.cells_in(&TABLE, &[a, b, c]),
        vec![Some(10.0), Some(30.0), Some(20.0)]
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
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
    let runtime = runtime();
    let (cluster, written) = loaded_cluster(&runtime, 300);
    let proxy = Arc::clone(&cluster.nodes[0].proxy);
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
    let learnt = proxy.scan_estimates.cells_in(&TABLE, &[TabletId(0)])[0].unwrap();
    assert!(
        learnt < f64::from(SCAN_CHUNK_CELLS),
        "{learnt} cells per tablet"
    );
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// A cluster of three nodes (replication factor 1: each tablet's cells are on one node)
/// holding `count` one-cell partitions; their keys in order.
fn loaded_cluster(runtime: &tokio::runtime::Runtime, count: usize) -> (SimCluster, Vec<Vec<u8>>) {
    let cluster = SimCluster::new(3, 1, Duration::from_secs(3600), 1 << 20);
    let mut batch = WriteBatch::new();
    let mut written: Vec<Vec<u8>> = (0..count)
        .map(|i| cell_key(format!("key-{i}").as_bytes()))
        .collect();
    for key in &written {
        batch.merge(
            key.clone(),
            Cell::live(WriteTimestamp(1), b"x".to_vec()).encode(),
        );
    }
    written.sort();
    runtime
        .block_on(
            cluster.nodes[0]
                .proxy
                .write(batch, Consistency::All, WriteType::Simple),
        )
        .unwrap();
    (cluster, written)
}

/// The first `count` cells a scan of the whole table in the turn of `ticket` returns.
fn first_cells(view: ReplicatedView, count: usize) -> Vec<Vec<u8>> {
    std::thread::spawn(move || {
        let (lower, upper) = (keys::table_prefix(&TABLE), keys::table_end(&TABLE));
        let mut cursor = view.scan(&lower, &upper, false).unwrap();
        let mut keys = Vec::new();
        while let Some((key, _)) = cursor.current() {
            keys.push(key.to_vec());
            if keys.len() == count {
                break;
            }
            cursor.advance();
        }
        cursor.status().unwrap();
        keys
    })
    .join()
    .unwrap()
}

#[test]
fn replicas_tell_the_cells_of_their_tablets_with_every_scan_chunk() {
    let runtime = runtime();
    let (cluster, written) = loaded_cluster(&runtime, 300);
    let proxy = Arc::clone(&cluster.nodes[0].proxy);
    let view = ReplicatedView::new(
        Arc::clone(&proxy),
        TABLE,
        Consistency::One,
        runtime.handle().clone(),
    )
    .in_turn_of(ScanTicket::now(64, 1_000), 1);
    assert_eq!(first_cells(view, usize::MAX), written);
    // Every node served chunks, so every tablet's count is known: exactly, from the
    // simulated nodes' in-memory engines.
    let tablets = cluster.state.tables[&TABLE].tablets.tablets();
    let ids: Vec<TabletId> = tablets.iter().map(|tablet| tablet.id).collect();
    let mut after = None;
    let actual: Vec<Option<f64>> = tablets
        .iter()
        .map(|tablet| {
            let (lower, upper) = keys::token_range(&TABLE, after, tablet.last_token);
            after = Some(tablet.last_token);
            let inside = written
                .iter()
                .filter(|key| **key >= lower && **key < upper)
                .count();
            Some(inside as f64)
        })
        .collect();
    assert_eq!(proxy.scan_estimates.cells_in(&TABLE, &ids), actual);
    runtime.shutdown_timeout(Duration::from_secs(1));
}

#[test]
fn a_scan_with_a_small_limit_asks_the_replicas_for_little() {
    let runtime = runtime();
    let (cluster, written) = loaded_cluster(&runtime, 300);
    let proxy = Arc::clone(&cluster.nodes[0].proxy);
    let view = |limit: u64| {
        ReplicatedView::new(
            Arc::clone(&proxy),
            TABLE,
            Consistency::One,
            runtime.handle().clone(),
        )
        .in_turn_of(ScanTicket::now(64, limit), 1)
    };
    // A first scan learns the tablets' cells.
    assert_eq!(first_cells(view(1_000), usize::MAX), written);
    let answered = || cluster.network.cells_answered.load(Ordering::Relaxed);
    let before = answered();
    // LIMIT 5: the tablet the scan starts in and, as tablets here hold about a dozen
    // cells each, one more — five cells asked of each.
    assert_eq!(first_cells(view(5), 5), written[..5].to_vec());
    let asked = answered() - before;
    assert!(asked <= 10, "{asked} cells answered for a scan of 5");
    runtime.shutdown_timeout(Duration::from_secs(1));
}
