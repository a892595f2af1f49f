use super::*;
use shoal_model::timestamp::WriteTimestamp;

fn cell_key(table: &TableId, partition: u32) -> (Token, Vec<u8>, Vec<u8>) {
    let partition_key = partition.to_be_bytes().to_vec();
    let token = shoal_model::token::murmur3_token(&partition_key);
    let mut key = keys::partition_prefix(table, token, &partition_key);
    key.push(keys::SECTION_ROW);
    keys::push_column_part(&mut key, |part| keys::push_cell_column(part, "v", &[]));
    (token, partition_key, key)
}

fn vector_cell(vector: &[f32], timestamp: i64) -> Vec<u8> {
    Cell {
        timestamp: WriteTimestamp(timestamp),
        kind: CellKind::Live,
        value: vector.iter().flat_map(|x| x.to_be_bytes()).collect(),
    }
    .encode()
}

fn search(index: &VectorIndex, query: &[f32], limit: u32) -> Vec<Vec<u8>> {
    let search = VectorSearch {
        table: index.table,
        index: TableId([9; 16]),
        query: query.to_vec(),
        from: Token::MIN,
        upto: Token::MAX,
        limit,
    };
    index
        .search(&search, 0)
        .unwrap()
        .hits
        .into_iter()
        .map(|hit| hit.partition_key)
        .collect()
}

#[test]
fn the_latest_write_of_a_row_is_the_one_indexed() {
    let table = TableId([1; 16]);
    let index = VectorIndex::new(table, "v", Similarity::Euclidean, 2).unwrap();
    let (_, one, key) = cell_key(&table, 1);
    let (_, two, other) = cell_key(&table, 2);
    index.apply(&vec![(other, vector_cell(&[5.0, 5.0], 10))]);
    index.apply(&vec![(key.clone(), vector_cell(&[0.0, 0.0], 10))]);
    assert_eq!(search(&index, &[0.0, 0.0], 1), vec![one.clone()]);
    // Moved away by a later write; an older one arriving late changes nothing.
    index.apply(&vec![(key.clone(), vector_cell(&[9.0, 9.0], 20))]);
    index.apply(&vec![(key.clone(), vector_cell(&[0.0, 0.0], 15))]);
    assert_eq!(search(&index, &[0.0, 0.0], 1), vec![two]);
    assert_eq!(index.point_count(), 2);
    // Deleted: gone from the graph.
    let tombstone = Cell {
        timestamp: WriteTimestamp(30),
        kind: CellKind::Tombstone {
            deleted_at: 0,
            shadow_cleared: false,
        },
        value: Vec::new(),
    };
    index.apply(&vec![(key, tombstone.encode())]);
    assert_eq!(index.point_count(), 1);
    assert_eq!(search(&index, &[9.0, 9.0], 5).len(), 1);
}

fn tombstone(timestamp: i64) -> Vec<u8> {
    Cell {
        timestamp: WriteTimestamp(timestamp),
        kind: CellKind::Tombstone {
            deleted_at: 0,
            shadow_cleared: false,
        },
        value: Vec::new(),
    }
    .encode()
}

/// The vector cell key of row `clustering` of partition 1, and its partition prefix.
fn row_cell(table: &TableId, clustering: u8) -> (Vec<u8>, Vec<u8>) {
    let partition_key = 1u32.to_be_bytes().to_vec();
    let token = shoal_model::token::murmur3_token(&partition_key);
    let partition = keys::partition_prefix(table, token, &partition_key);
    let mut key = partition.clone();
    key.push(keys::SECTION_ROW);
    key.push(clustering);
    keys::push_column_part(&mut key, |part| keys::push_cell_column(part, "v", &[]));
    (key, partition)
}

#[test]
fn row_range_and_partition_deletions_remove_the_rows_they_cover() {
    let table = TableId([3; 16]);
    let index = VectorIndex::new(table, "v", Similarity::Euclidean, 2).unwrap();
    for clustering in 0..6u8 {
        let (key, _) = row_cell(&table, clustering);
        index.apply(&vec![(key, vector_cell(&[clustering as f32, 0.0], 10))]);
    }
    assert_eq!(index.point_count(), 6);
    let (_, partition) = row_cell(&table, 0);
    // Row 1 deleted.
    let mut row = partition.clone();
    row.push(keys::SECTION_ROW);
    row.push(1);
    keys::push_column_part(&mut row, |part| part.push(keys::COLUMN_ROW_DELETION));
    index.apply(&vec![(row, tombstone(20))]);
    assert_eq!(index.point_count(), 5);
    // Rows 2..=3 deleted by a range; an older range deletion of 4..=5 changes nothing.
    let mut range = partition.clone();
    keys::push_range_tombstone(&mut range, &[2], true, &[3], true);
    index.apply(&vec![(range, tombstone(20))]);
    assert_eq!(index.point_count(), 3);
    let mut older = partition.clone();
    keys::push_range_tombstone(&mut older, &[4], true, &[5], true);
    index.apply(&vec![(older, tombstone(5))]);
    assert_eq!(index.point_count(), 3);
    // The whole partition.
    let mut whole = partition.clone();
    whole.push(keys::SECTION_PARTITION_DELETION);
    index.apply(&vec![(whole, tombstone(30))]);
    assert_eq!(index.point_count(), 0);
    assert!(search(&index, &[0.0, 0.0], 5).is_empty());
}

#[test]
fn a_truncated_table_leaves_an_empty_index() {
    let table = TableId([4; 16]);
    let index = VectorIndex::new(table, "v", Similarity::Cosine, 2).unwrap();
    let (key, _) = row_cell(&table, 0);
    index.apply(&vec![(key.clone(), vector_cell(&[1.0, 0.0], 1))]);
    index.clear();
    assert_eq!(index.point_count(), 0);
    index.apply(&vec![(key, vector_cell(&[0.0, 1.0], 2))]);
    assert_eq!(search(&index, &[0.0, 1.0], 5).len(), 1);
}

#[test]
fn a_search_keeps_to_its_token_range() {
    let table = TableId([2; 16]);
    let index = VectorIndex::new(table, "v", Similarity::Cosine, 2).unwrap();
    let mut tokens = Vec::new();
    for partition in 0..200u32 {
        let (token, _, key) = cell_key(&table, partition);
        tokens.push(token);
        index.apply(&vec![(
            key,
            vector_cell(&[1.0, partition as f32 / 200.0], 1),
        )]);
    }
    let search = VectorSearch {
        table,
        index: TableId([9; 16]),
        query: vec![1.0, 0.0],
        from: Token(0),
        upto: Token::MAX,
        limit: 10,
    };
    let hits = index.search(&search, 0).unwrap().hits;
    assert_eq!(hits.len(), 10);
    assert!(hits.iter().all(|hit| hit.token >= Token(0)));
    assert!(hits.windows(2).all(|pair| pair[0].score >= pair[1].score));
}
