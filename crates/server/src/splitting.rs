//! Splitting the tablets of ordered tables as they grow, and merging them as they shrink.
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
//! When the data goes away (deleted, expired, truncated), the pieces are merged back:
//!
//! - a tablet whose bytes and its right neighbour's (asked of that tablet's primary when
//!   this node does not hold it) are together under a quarter of `tablet_split_mib` is
//!   marked to merge with it (`Command::PlanTabletMerge`) — a quarter, so that a merged
//!   tablet is far from being split again;
//! - the balancer moves the neighbour onto the tablet's nodes (and leaves the pair alone
//!   while it evens out load);
//! - once both are held by the same nodes, the tablet's primary merges them
//!   (`Command::MergeTablets`): again no data moves.
//!
//! A table never merges below the tablets it was created with ([`TABLETS_PER_NODE`] per
//! node then). One split or merge step per node per check keeps the metadata log and the
//! balancer calm. A tablet whose bytes all sit on one token (keys sharing their first eight
//! bytes) cannot be split. A pair marked to merge stays marked if it grows again before the
//! merge; the merged tablet is then split like any other.
//!
//! Tablets of strongly consistent keyspaces split the same way, by size, but each is a Raft
//! group, and its halves need groups of their own: the split is planned, the group fenced
//! and the split finished once every member applied the fence
//! ([`crate::strong::splits`]); they merge the same way, a marked pair held by the same
//! nodes fencing both groups before the merged tablet gets a group of its own.
//!
//! [`TABLETS_PER_NODE`]: shoal_cluster::TABLETS_PER_NODE

use crate::internode::{Message, Peers, Reply};
use crate::operations::Operation;
use crate::strong::splits::SplitDriver;
use crate::strong::StrongTables;
use shoal_cluster::{ClusterMetadata, ClusterState, Command, CommandOutcome};
use shoal_coordinator::Coordinator;
use shoal_model::token::Partitioner;
use shoal_model::{keys, HostId, TableId, TabletId, Token};
use shoal_schema::{KeyspaceConsistency, TableMetadata};
use shoal_storage::Engine;
use std::sync::Arc;
use std::time::Duration;

/// How often a node measures the tablets it leads.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Two neighbouring tablets merge when together they hold less than the split size
/// divided by this.
pub const MERGE_FRACTION: u64 = 4;

/// How long a tablet's primary has to tell its bytes.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Splits this node's oversized tablets of ordered tables and merges its small ones, for
/// as long as the node runs.
pub async fn run(
    metadata: Arc<ClusterMetadata>,
    coordinator: Arc<Coordinator>,
    peers: Arc<Peers>,
    strong: Arc<StrongTables>,
    split_bytes: u64,
) {
    let merge_bytes = split_bytes / MERGE_FRACTION;
    let mut strong_splits = SplitDriver::new(strong, Arc::clone(&metadata));
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        strong_splits.end_planned().await;
        let strong_tables = ordered_tables(&coordinator, KeyspaceConsistency::Strong);
        if let Some((table, tablet, at)) =
            oversized_tablet(&metadata, &coordinator, &strong_tables, split_bytes)
        {
            strong_splits.split(table, &tablet, at).await;
            continue;
        }
        let ready = ready_merge(&metadata.state(), &strong_tables, metadata.me().host_id);
        if let Some((table, first, second)) = ready {
            strong_splits.merge(table, &first, &second).await;
            continue;
        }
        let tables = ordered_tables(&coordinator, KeyspaceConsistency::Eventual);
        let split = oversized_tablet(&metadata, &coordinator, &tables, split_bytes).map(
            |(table, tablet, at)| Command::SplitTablet {
                table,
                tablet: tablet.id,
                at,
            },
        );
        let step = match split {
            Some(split) => Some(split),
            None => {
                let all = [tables.as_slice(), &strong_tables].concat();
                merge_step(
                    &metadata,
                    &coordinator,
                    &peers,
                    (&tables, &all),
                    merge_bytes,
                )
                .await
            }
        };
        let Some(step) = step else {
            continue;
        };
        match metadata.propose(step.clone()).await {
            Ok(CommandOutcome::Applied) => tracing::info!(?step, "changed a table's tablets"),
            // The tablets moved or changed meanwhile: measured again next time.
            Ok(outcome) => tracing::debug!(?step, ?outcome, "tablet split or merge not applied"),
            Err(error) => tracing::warn!(%error, "could not propose a tablet split or merge"),
        }
    }
}

/// The ordered tables of keyspaces of `consistency`.
fn ordered_tables(
    coordinator: &Coordinator,
    consistency: KeyspaceConsistency,
) -> Vec<Arc<TableMetadata>> {
    let schema = coordinator.schema();
    schema
        .user_keyspaces()
        .filter(|keyspace| keyspace.consistency == consistency)
        .flat_map(|keyspace| keyspace.tables.values())
        .filter(|table| table.options.partitioner == Partitioner::Ordered)
        .cloned()
        .collect()
}

/// The first tablet of `tables` this node leads that holds more than `split_bytes`, and
/// the token to split it at.
fn oversized_tablet(
    metadata: &ClusterMetadata,
    coordinator: &Coordinator,
    tables: &[Arc<TableMetadata>],
    split_bytes: u64,
) -> Option<(TableId, shoal_placement::Tablet, Token)> {
    let me = metadata.me().host_id;
    let state = metadata.state();
    let engine = coordinator.engine().as_ref();
    for table in tables {
        let Some(placement) = state.tables.get(&table.id) else {
            continue;
        };
        let mut after = None;
        for tablet in placement.tablets.tablets() {
            let bounds = (after, tablet.last_token);
            after = Some(tablet.last_token);
            if tablet.transition.is_some()
                || tablet.replicas.first() != Some(&me)
                || placement.strong_plan_of(tablet.id).is_some()
            {
                continue;
            }
            let bytes = range_bytes(engine, &table.id, bounds.0, bounds.1);
            if bytes <= split_bytes {
                continue;
            }
            if let Some(at) = middle_token(engine, &table.id, bounds.0, bounds.1, bytes) {
                return Some((table.id, tablet.clone(), at));
            }
        }
    }
    None
}

/// A pair of neighbouring tablets, the first led by this node, that may be merged.
struct MergeCandidate {
    table: TableId,
    first: TabletId,
    first_bounds: (Option<Token>, Token),
    second_bounds: (Option<Token>, Token),
    /// `None`: this node holds the second tablet; else its primary, to ask.
    second_primary: Option<HostId>,
}

/// The next merge step this node should propose: a marked pair of an `eventual` table now
/// held by the same nodes merged, else the first pair of small neighbours of `all` the
/// ordered tables marked.
async fn merge_step(
    metadata: &ClusterMetadata,
    coordinator: &Coordinator,
    peers: &Peers,
    (eventual, all): (&[Arc<TableMetadata>], &[Arc<TableMetadata>]),
    merge_bytes: u64,
) -> Option<Command> {
    let me = metadata.me().host_id;
    let candidates = {
        let state = metadata.state();
        // A ready pair of a strongly consistent table merges through `SplitDriver::merge`.
        if let Some((table, first, second)) = ready_merge(&state, eventual, me) {
            return Some(Command::MergeTablets {
                table,
                first: first.id,
                second: second.id,
            });
        }
        merge_candidates(&state, all, me)
    };
    let engine = coordinator.engine().as_ref();
    for candidate in candidates {
        let (after, last) = candidate.first_bounds;
        let first_bytes = range_bytes(engine, &candidate.table, after, last);
        if first_bytes >= merge_bytes {
            continue;
        }
        let (after, last) = candidate.second_bounds;
        let second_bytes = match candidate.second_primary {
            None => Some(range_bytes(engine, &candidate.table, after, last)),
            Some(primary) => {
                let state = metadata.state();
                let address = state.member_by_host(&primary).map(|m| m.internode_address);
                drop(state);
                match address {
                    Some(address) => ask_bytes(peers, address, candidate.table, after, last).await,
                    None => None,
                }
            }
        };
        if second_bytes.is_some_and(|second| first_bytes + second < merge_bytes) {
            return Some(Command::PlanTabletMerge {
                table: candidate.table,
                first: candidate.first,
            });
        }
    }
    None
}

/// A pair marked to merge whose first tablet this node leads, held by the same nodes, at
/// rest and not being split or merged already: the table and the pair.
fn ready_merge(
    state: &ClusterState,
    tables: &[Arc<TableMetadata>],
    me: HostId,
) -> Option<(TableId, shoal_placement::Tablet, shoal_placement::Tablet)> {
    for table in tables {
        let Some(placement) = state.tables.get(&table.id) else {
            continue;
        };
        for (first, second) in placement.tablets.merges() {
            if first.replicas.first() == Some(&me)
                && first.held_by_same_nodes(second)
                && first.transition.is_none()
                && second.transition.is_none()
                && placement.strong_plan_of(first.id).is_none()
                && placement.strong_plan_of(second.id).is_none()
            {
                return Some((table.id, first.clone(), second.clone()));
            }
        }
    }
    None
}

/// Pairs of neighbours at rest and not marked, the first led by this node, of tables with
/// more tablets than they are created with.
fn merge_candidates(
    state: &ClusterState,
    tables: &[Arc<TableMetadata>],
    me: HostId,
) -> Vec<MergeCandidate> {
    let mut candidates = Vec::new();
    for table in tables {
        let Some(placement) = state.tables.get(&table.id) else {
            continue;
        };
        let tablets = placement.tablets.tablets();
        let marked = placement.tablets.merges().count();
        let floor = state.merge_floor(&table.id).unwrap_or(usize::MAX);
        if tablets.len().saturating_sub(marked) <= floor {
            continue;
        }
        let mut after = None;
        for pair in tablets.windows(2) {
            let (first, second) = (&pair[0], &pair[1]);
            let first_bounds = (after, first.last_token);
            after = Some(first.last_token);
            let at_rest = |id| !placement.tablets.in_merge(id);
            if first.replicas.first() != Some(&me)
                || first.transition.is_some()
                || second.transition.is_some()
                || !at_rest(first.id)
                || !at_rest(second.id)
            {
                continue;
            }
            let second_primary = if second.replicas.contains(&me) {
                None
            } else {
                match second.replicas.first() {
                    Some(primary) => Some(*primary),
                    None => continue,
                }
            };
            candidates.push(MergeCandidate {
                table: table.id,
                first: first.id,
                first_bounds,
                second_bounds: (Some(first.last_token), second.last_token),
                second_primary,
            });
        }
    }
    candidates
}

/// The bytes the node at `address` holds of `table` in `(after, last]`; `None` when it
/// does not answer in time.
async fn ask_bytes(
    peers: &Peers,
    address: std::net::SocketAddr,
    table: TableId,
    after: Option<Token>,
    last: Token,
) -> Option<u64> {
    let tablet = crate::streaming::TabletKeys { table, after, last };
    ask_tablet_bytes(peers, address, vec![tablet], ASK_TIMEOUT)
        .await?
        .first()
        .copied()
}

/// The bytes the node at `address` holds of each of `tablets`, in order; `None` when it
/// does not answer within `timeout`.
pub(crate) async fn ask_tablet_bytes(
    peers: &Peers,
    address: std::net::SocketAddr,
    tablets: Vec<crate::streaming::TabletKeys>,
    timeout: std::time::Duration,
) -> Option<Vec<u64>> {
    let count = tablets.len();
    let question = Message::Operate(Operation::TabletBytes { tablets });
    let Ok(Reply::Operated(answer)) = peers.call(address, &question, timeout).await else {
        return None;
    };
    let answer: serde_json::Value = serde_json::from_str(&answer).ok()?;
    let bytes: Vec<u64> = answer
        .get("bytes")?
        .as_array()?
        .iter()
        .map(|b| b.as_u64())
        .collect::<Option<_>>()?;
    (bytes.len() == count).then_some(bytes)
}

/// On-disk bytes of each of `tablets` on this node, in order.
pub(crate) fn tablets_bytes(
    engine: &dyn Engine,
    tablets: &[crate::streaming::TabletKeys],
) -> Vec<u64> {
    tablets
        .iter()
        .map(|t| range_bytes(engine, &t.table, t.after, t.last))
        .collect()
}

/// On-disk bytes of `table` in the tokens `(after, last]`.
pub(crate) fn range_bytes(
    engine: &dyn Engine,
    table: &TableId,
    after: Option<Token>,
    last: Token,
) -> u64 {
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
