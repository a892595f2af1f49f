//! Splitting the tablets of ordered tables as they grow.
//!
//! An ordered table (`WITH partitioner = 'ordered'`) keeps its partitions in key order, so
//! its keys are not spread by a hash: sequential inserts — increasing ids, timestamps —
//! all land in the one tablet that holds the end of the key range, and a fresh table's
//! evenly cut tablets mean nothing for keys that share a prefix. ByteOrdered Cassandra
//! left that hot spot to an operator moving tokens by hand. Here the tablets follow the
//! data instead:
//!
//! - every node measures, every [`CHECK_EVERY`], the tablets of ordered tables it is the
//!   primary replica of (its on-disk bytes in the tablet's key range, as RocksDB
//!   estimates them: memtables are not counted until they are flushed);
//! - a tablet holding more than `tablet_split_mib` is split at the token that halves its
//!   bytes ([`middle_token`]), through the metadata log (`Command::SplitTablet`): both
//!   halves keep the replicas, so no data moves;
//! - the balancer then moves halves to other nodes like any tablet, so a growing table
//!   spreads over the whole cluster.
//!
//! One split per node per check keeps the metadata log and the balancer calm. A tablet
//! whose bytes all sit on one token (keys sharing their first eight bytes) cannot be
//! split. Tablets of strongly consistent keyspaces are not split: their Raft group would
//! have to split with them, which is not built.

use shoal_cluster::{ClusterMetadata, Command, CommandOutcome};
use shoal_coordinator::Coordinator;
use shoal_model::token::Partitioner;
use shoal_model::{keys, TableId, Token};
use shoal_schema::KeyspaceConsistency;
use shoal_storage::Engine;
use std::sync::Arc;
use std::time::Duration;

/// How often a node measures the tablets it leads.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Splits this node's oversized tablets of ordered tables, for as long as the node runs.
pub async fn run(metadata: Arc<ClusterMetadata>, coordinator: Arc<Coordinator>, split_bytes: u64) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let Some(split) = oversized_tablet(&metadata, &coordinator, split_bytes) else {
            continue;
        };
        match metadata.propose(split.clone()).await {
            Ok(CommandOutcome::Applied) => tracing::info!(?split, "split a tablet"),
            // The tablet moved or was split meanwhile: measured again next time.
            Ok(outcome) => tracing::debug!(?split, ?outcome, "tablet split not applied"),
            Err(error) => tracing::warn!(%error, "could not propose a tablet split"),
        }
    }
}

/// The split of the first tablet this node leads that holds more than `split_bytes`.
fn oversized_tablet(
    metadata: &ClusterMetadata,
    coordinator: &Coordinator,
    split_bytes: u64,
) -> Option<Command> {
    let me = metadata.me().host_id;
    let state = metadata.state();
    let schema = coordinator.schema();
    let engine = coordinator.engine().as_ref();
    let ordered_tables = schema
        .user_keyspaces()
        .filter(|keyspace| keyspace.consistency != KeyspaceConsistency::Strong)
        .flat_map(|keyspace| keyspace.tables.values())
        .filter(|table| table.options.partitioner == Partitioner::Ordered);
    for table in ordered_tables {
        let Some(placement) = state.tables.get(&table.id) else {
            continue;
        };
        let mut after = None;
        for tablet in placement.tablets.tablets() {
            let bounds = (after, tablet.last_token);
            after = Some(tablet.last_token);
            if tablet.transition.is_some() || tablet.replicas.first() != Some(&me) {
                continue;
            }
            let bytes = range_bytes(engine, &table.id, bounds.0, bounds.1);
            if bytes <= split_bytes {
                continue;
            }
            if let Some(at) = middle_token(engine, &table.id, bounds.0, bounds.1, bytes) {
                return Some(Command::SplitTablet {
                    table: table.id,
                    tablet: tablet.id,
                    at,
                });
            }
        }
    }
    None
}

/// On-disk bytes of `table` in the tokens `(after, last]`.
fn range_bytes(engine: &dyn Engine, table: &TableId, after: Option<Token>, last: Token) -> u64 {
    let (lower, upper) = keys::token_range(table, after, last);
    engine.approximate_range_bytes(&lower, &upper).unwrap_or(0)
}

/// The token strictly inside `(after, last]` — so that both halves are non-empty ranges —
/// up to which `table` holds about half of the tablet's `bytes`, found by bisection over
/// the token space (64 steps at most); `None` when no such token splits the bytes (they
/// all sit on one token, or estimates are too coarse to tell).
fn middle_token(
    engine: &dyn Engine,
    table: &TableId,
    after: Option<Token>,
    last: Token,
    bytes: u64,
) -> Option<Token> {
    let first = after.map_or(i64::MIN as i128 + 1, |after| after.0 as i128 + 1);
    // The split token ends the lower half; the upper half must keep at least `last`.
    let (mut low, mut high) = (first, last.0 as i128 - 1);
    if low > high {
        return None;
    }
    let half = bytes / 2;
    while low < high {
        let middle = low + (high - low) / 2;
        if range_bytes(engine, table, after, Token(middle as i64)) < half {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    let at = Token(low as i64);
    let lower = range_bytes(engine, table, after, at);
    let upper = range_bytes(engine, table, Some(at), last);
    (lower > 0 && upper > 0).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::{Cell, WriteTimestamp};
    use shoal_storage::{RocksEngine, RocksOptions, WriteBatch};

    #[test]
    fn the_middle_token_halves_a_tablets_bytes() {
        let directory = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(directory.path(), &RocksOptions::default()).unwrap();
        let table = TableId([3; 16]);
        // 2,000 partitions of 1 KiB on tokens 0, 10, 20, …
        let mut batch = WriteBatch::new();
        for i in 0..2_000i64 {
            let mut key = keys::partition_prefix(&table, Token(i * 10), &i.to_be_bytes());
            key.push(keys::SECTION_ROW);
            keys::push_column_part(&mut key, |k| keys::push_cell_column(k, "v", b""));
            batch.merge(
                key,
                Cell::live(WriteTimestamp(1), vec![i as u8; 1024]).encode(),
            );
        }
        engine.write(&batch).unwrap();
        engine.flush().unwrap();
        let bytes = range_bytes(&engine, &table, None, Token::MAX);
        assert!(bytes > 1_000_000, "{bytes} bytes on disk");
        let at = middle_token(&engine, &table, None, Token::MAX, bytes).unwrap();
        assert!(
            (7_000..13_000).contains(&at.0),
            "half of 0..20,000 is near 10,000, not {}",
            at.0
        );
        // Nothing in the range, or everything on one token: no split.
        assert_eq!(
            middle_token(&engine, &table, Some(Token(30_000)), Token::MAX, bytes),
            None
        );
        assert_eq!(
            middle_token(&engine, &table, Some(Token(-1)), Token(0), bytes),
            None
        );
    }
}
