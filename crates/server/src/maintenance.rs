//! Background storage maintenance the node runs on its own.
//!
//! Garbage collection ([`shoal_storage::Engine::collect_garbage`]) lets compaction drop
//! covering deletions (partition, range, row and collection deletions) once their grace
//! period is over and what they shadowed has been cleared. Compaction reports such
//! deletions as it meets them; this loop clears them on a blocking thread every
//! [`GARBAGE_COLLECTION_INTERVAL`], so the work follows compaction's pace and never runs
//! on the request path.
//!
//! Hint sweeps ([`shoal_replication::Hints::sweep`]) remove, every
//! [`HINT_SWEEP_INTERVAL`], hints for dropped or truncated tables and hints older than
//! their table's gc_grace_seconds, even for a replica that never returns.
//!
//! The default superuser ([`create_default_superuser`]) is created on a new cluster with
//! authentication on, and the `system_traces` tables are placed ([`place_system_tables`]),
//! each retried until the cluster's metadata accepts it.
//!
//! Batchlog replay ([`shoal_replication::StorageProxy::replay_batches`]) writes again the
//! logged batches whose coordinator did not finish them, every [`BATCHLOG_REPLAY_INTERVAL`].
//!
//! Compaction follows the write load ([`shoal_storage::Engine::adapt_compaction`], every
//! [`COMPACTION_ADAPT_INTERVAL`]): level 0 is compacted late while writes are heavy and
//! at once when they go quiet.

use shoal_replication::batchlog::REPLAY_AFTER;
use shoal_replication::StorageProxy;
use shoal_storage::Engine;
use std::sync::Arc;
use std::time::Duration;

/// How often this node looks for logged batches to replay (as Cassandra).
pub const BATCHLOG_REPLAY_INTERVAL: Duration = Duration::from_secs(10);

/// How often hints that are no longer due are removed.
pub const HINT_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// How often reported deletions are cleared.
pub const GARBAGE_COLLECTION_INTERVAL: Duration = Duration::from_secs(10);

/// How often this node looks for secondary indexes to build (created, or dropped).
pub const INDEX_BUILD_INTERVAL: Duration = Duration::from_millis(200);

/// How often the storage engine's compaction is fitted to the write load.
pub const COMPACTION_ADAPT_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the build of every secondary index of the schema this node has not built, and
/// forgets dropped ones, every [`INDEX_BUILD_INTERVAL`] until the task is dropped.
pub async fn build_indexes_regularly(indexes: Arc<shoal_coordinator::index::IndexCatalog>) {
    let mut interval = tokio::time::interval(INDEX_BUILD_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        indexes.build_pending();
    }
}

/// Runs garbage collection every [`GARBAGE_COLLECTION_INTERVAL`] until the task is
/// dropped.
pub async fn collect_garbage_regularly(engine: Arc<dyn Engine>) {
    let mut interval = tokio::time::interval(GARBAGE_COLLECTION_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let engine = Arc::clone(&engine);
        match tokio::task::spawn_blocking(move || engine.collect_garbage()).await {
            Ok(Ok(report)) if report.deletions_cleared > 0 => {
                tracing::debug!(?report, "cleared expired deletions for compaction")
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "storage garbage collection failed"),
            Err(_) => return,
        }
    }
}

/// Lets the storage engine fit its compaction to the write load
/// ([`Engine::adapt_compaction`]) and release idle readers
/// ([`Engine::release_idle_readers`]) every [`COMPACTION_ADAPT_INTERVAL`] until the task
/// is dropped.
pub async fn adapt_compaction_regularly(engine: Arc<dyn Engine>) {
    let mut interval = tokio::time::interval(COMPACTION_ADAPT_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // A few property reads, and an options change when the trigger moves: no
        // blocking work worth a thread of its own. Dropping idle pooled iterators is as
        // light, and wants the same once-a-second beat.
        engine.adapt_compaction();
        engine.release_idle_readers();
    }
}

/// Replays unfinished logged batches every [`BATCHLOG_REPLAY_INTERVAL`] until the task is
/// dropped.
pub async fn replay_batches_regularly(proxy: Arc<StorageProxy>) {
    let mut interval = tokio::time::interval(BATCHLOG_REPLAY_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        match proxy.replay_batches(REPLAY_AFTER).await {
            Ok(0) => {}
            Ok(replayed) => tracing::info!(replayed, "replayed logged batches from the batchlog"),
            Err(error) => tracing::warn!(%error, "batchlog replay failed"),
        }
    }
}

/// Removes hints that are no longer due every [`HINT_SWEEP_INTERVAL`] until the task is
/// dropped.
pub async fn sweep_hints_regularly(proxy: Arc<StorageProxy>) {
    let mut interval = tokio::time::interval(HINT_SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let hints = Arc::clone(proxy.hints());
        match tokio::task::spawn_blocking(move || hints.sweep()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(removed, "removed hints that are no longer due"),
            Ok(Err(error)) => tracing::warn!(%error, "sweeping hints failed"),
            Err(_) => return,
        }
    }
}

/// Creates the default superuser if the cluster has no roles yet, retrying (the cluster
/// may still be electing a leader) until it is done.
pub async fn create_default_superuser(coordinator: Arc<shoal_coordinator::Coordinator>) {
    retry_until_done("create the default superuser", || {
        coordinator.roles().ensure_default_superuser()
    })
    .await
}

/// Places the stored system tables (`system_traces`) on a new cluster, retrying until the
/// cluster's metadata takes the change.
pub async fn place_system_tables(coordinator: Arc<shoal_coordinator::Coordinator>) {
    retry_until_done("place the system_traces tables", || {
        coordinator.schema_store().place_system_tables()
    })
    .await
}

/// Runs `attempt` until it succeeds, backing off from 100 ms to 5 s between attempts.
async fn retry_until_done<F>(what: &str, mut attempt: impl FnMut() -> F)
where
    F: std::future::Future<Output = Result<(), shoal_cql::CqlError>>,
{
    let mut delay = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(message = %error.message, "cannot {what} yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}
