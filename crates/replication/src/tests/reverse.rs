//! Reverse reads across replicas: `ORDER BY … DESC LIMIT n` on a large partition fetches
//! the partition's end, chunk by chunk from the back — not the whole partition.

use super::sim::{SimCluster, TABLE};
use crate::consistency::WriteType;
use crate::range::{ReplicatedView, SCAN_CHUNK_CELLS};
use shoal_cql::request::Consistency;
use shoal_model::clustering::encode_component;
use shoal_model::token::murmur3_token;
use shoal_model::{keys, Cell, Value, WriteTimestamp};
use shoal_storage::reader::{self, ClusteringSlice, Flow, PartitionHeader, Row, Visitor};
use shoal_storage::WriteBatch;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const ROWS: i32 = 5 * SCAN_CHUNK_CELLS as i32;

fn clustering(row: i32) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_component(&mut bytes, &Value::Int(row), false);
    bytes
}

/// Keeps the first `limit` rows' clustering, then stops.
struct FirstRows {
    limit: usize,
    rows: Vec<Vec<u8>>,
}

impl Visitor for FirstRows {
    fn partition(&mut self, _: &PartitionHeader) -> Flow {
        Flow::Continue
    }
    fn row(&mut self, _: &PartitionHeader, row: Row) -> Flow {
        self.rows.push(row.clustering);
        if self.rows.len() == self.limit {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }
}

#[test]
fn a_reverse_read_with_a_limit_fetches_the_end_of_a_large_partition_only() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cluster = SimCluster::new(3, 3, Duration::from_secs(3600), 1 << 20);
    let key = b"wide".to_vec();
    let token = murmur3_token(&key);
    let mut batch = WriteBatch::new();
    for row in 0..ROWS {
        let mut cell = keys::partition_prefix(&TABLE, token, &key);
        cell.push(keys::SECTION_ROW);
        cell.extend_from_slice(&clustering(row));
        keys::push_column_part(&mut cell, |k| keys::push_cell_column(k, "v", b""));
        batch.merge(cell, Cell::live(WriteTimestamp(1), b"x".to_vec()).encode());
    }
    let proxy = Arc::clone(&cluster.nodes[0].proxy);
    runtime
        .block_on(proxy.write(batch, Consistency::All, WriteType::Simple))
        .unwrap();
    cluster.network.cells_answered.store(0, Ordering::Relaxed);

    let view = ReplicatedView::new(proxy, TABLE, Consistency::Quorum, runtime.handle().clone());
    let mut first = FirstRows {
        limit: 10,
        rows: Vec::new(),
    };
    let read = std::thread::spawn(move || {
        reader::read_partition(
            &view,
            &TABLE,
            token,
            &key,
            &[ClusteringSlice::all()],
            true,
            shoal_model::timestamp::now_seconds(),
            &mut first,
        )
        .map(|_| first.rows)
    });
    let rows = read.join().unwrap().unwrap();
    let expected: Vec<Vec<u8>> = (ROWS - 10..ROWS).rev().map(clustering).collect();
    assert_eq!(rows, expected, "the last ten rows, greatest first");
    let fetched = cluster.network.cells_answered.load(Ordering::Relaxed);
    assert!(
        fetched <= 3 * SCAN_CHUNK_CELLS as u64,
        "a reverse read of ten rows fetched {fetched} cells of a {ROWS}-row partition"
    );
}
