//! Making acknowledged writes durable without an fsync per request.
//!
//! Both modes hand each batch to the engine's writer (its write-ahead log and memtable;
//! concurrent batches share one write) without blocking the caller. What differs is when
//! the client hears back:
//!
//! - [`CommitLogSync::Periodic`]: immediately; a background thread syncs the log every
//!   `commitlog_sync_period_ms`.
//! - [`CommitLogSync::Group`]: epoch-based group commit (seed 001). Writers join the open
//!   epoch after their batch is in the log; a sync thread closes the epoch, syncs the log
//!   once and then releases every writer of that epoch (and earlier) together. Under load,
//!   one sync acknowledges hundreds of writes; with a single writer, latency is one sync.
//!
//! A failed sync *poisons* the log: it may have lost writes it cannot name, so it stops
//! acknowledging any write from then on (as fjall and PostgreSQL do after fsyncgate).

use crate::config::CommitLogSync;
use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use shoal_coordinator::CqlError;
use shoal_replication::WriteLog;
use shoal_storage::{Engine, WriteBatch};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::watch;

/// What the sync thread has made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Durable {
    /// Every write that joined an epoch <= this one is durable.
    epoch: u64,
    poisoned: bool,
}

struct Shared {
    engine: Arc<dyn Engine>,
    mode: CommitLogSync,
    period: Duration,
    /// The epoch new writes join.
    open_epoch: AtomicU64,
    /// Set by writers that wait, cleared by the sync thread.
    sync_requested: Mutex<bool>,
    wake: Condvar,
    durable: watch::Sender<Durable>,
    poisoned: AtomicBool,
    stopping: AtomicBool,
}

/// The node's commit log policy; implements the coordinator's [`WriteLog`].
pub struct CommitLog {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn stopped_error() -> CqlError {
    CqlError::server("This node is shutting down and no longer acknowledges writes.")
}

fn poisoned_error() -> CqlError {
    CqlError::server("A write-ahead log sync failed earlier; this node no longer acknowledges writes. Restart it after checking its disk.")
}

impl CommitLog {
    pub fn start(
        engine: Arc<dyn Engine>,
        mode: CommitLogSync,
        period_ms: u64,
    ) -> std::io::Result<Arc<CommitLog>> {
        let (durable, _) = watch::channel(Durable {
            epoch: 0,
            poisoned: false,
        });
        let shared = Arc::new(Shared {
            engine,
            mode,
            period: Duration::from_millis(period_ms),
            open_epoch: AtomicU64::new(1),
            sync_requested: Mutex::new(false),
            wake: Condvar::new(),
            durable,
            poisoned: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("shoal-commit-log".into())
            .spawn(move || sync_loop(&thread_shared))?;
        Ok(Arc::new(CommitLog {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Syncs once more and stops the sync thread (clean shutdown).
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            let mut requested = self.shared.sync_requested.lock();
            *requested = true;
            self.shared.wake.notify_all();
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
        if let Err(error) = self.shared.engine.sync() {
            tracing::error!(%error, "final log sync failed");
        }
    }

    async fn append_batch(&self, batch: WriteBatch) -> Result<(), CqlError> {
        let shared = &self.shared;
        if shared.poisoned.load(Ordering::Acquire) {
            return Err(poisoned_error());
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return Err(stopped_error());
        }
        shared
            .engine
            .write_async(batch)
            .await
            .map_err(|e| CqlError::server(e.to_string()))?;
        // Join the open epoch: the sync that closes it starts after our write returned.
        let epoch = shared.open_epoch.load(Ordering::SeqCst);
        // Seen after the write and the epoch: if the log is not stopping yet, its final
        // sync (which begins only after `stopping` is set) covers this write. If it is, no
        // sync may come any more, so the write is not acknowledged.
        if shared.stopping.load(Ordering::SeqCst) {
            return Err(stopped_error());
        }
        if shared.mode == CommitLogSync::Periodic {
            return Ok(());
        }
        let mut durable = shared.durable.subscribe();
        {
            let mut requested = shared.sync_requested.lock();
            if !*requested {
                *requested = true;
                shared.wake.notify_one();
            }
        }
        let state = durable
            .wait_for(|d| d.epoch >= epoch || d.poisoned)
            .await
            .map_err(|_| CqlError::server("the commit log stopped"))?;
        if state.poisoned && state.epoch < epoch {
            return Err(poisoned_error());
        }
        Ok(())
    }
}

fn sync_loop(shared: &Shared) {
    loop {
        {
            let mut requested = shared.sync_requested.lock();
            match shared.mode {
                CommitLogSync::Group => {
                    while !*requested && !shared.stopping.load(Ordering::SeqCst) {
                        shared.wake.wait(&mut requested);
                    }
                }
                CommitLogSync::Periodic => {
                    if !shared.stopping.load(Ordering::SeqCst) {
                        shared.wake.wait_for(&mut requested, shared.period);
                    }
                }
            }
            *requested = false;
        }
        if shared.stopping.load(Ordering::SeqCst) {
            // Release any waiter: the final sync happens in `stop`.
            let epoch = shared.open_epoch.load(Ordering::SeqCst);
            if shared.engine.sync().is_ok() {
                shared.durable.send_replace(Durable {
                    epoch,
                    poisoned: false,
                });
            }
            return;
        }
        // Close the epoch: writers that read it are already in the log.
        let closing = shared.open_epoch.fetch_add(1, Ordering::SeqCst);
        match shared.engine.sync() {
            Ok(()) => {
                shared.durable.send_replace(Durable {
                    epoch: closing,
                    poisoned: false,
                });
            }
            Err(error) => {
                tracing::error!(%error, "write-ahead log sync failed; refusing further writes");
                shared.poisoned.store(true, Ordering::Release);
                shared.durable.send_modify(|d| d.poisoned = true);
            }
        }
    }
}

impl WriteLog for CommitLog {
    fn append(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        Box::pin(self.append_batch(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_storage::{Cursor, MemoryEngine, StorageError};
    use std::sync::atomic::AtomicUsize;

    /// An engine that counts syncs and can be made to fail them.
    struct CountingEngine {
        inner: MemoryEngine,
        syncs: AtomicUsize,
        fail: AtomicBool,
    }

    impl Engine for CountingEngine {
        fn write(&self, batch: &WriteBatch) -> shoal_storage::Result<()> {
            self.inner.write(batch)
        }
        fn scan<'a>(
            &'a self,
            lower: &[u8],
            upper: &[u8],
            reverse: bool,
        ) -> shoal_storage::Result<Box<dyn Cursor + 'a>> {
            self.inner.scan(lower, upper, reverse)
        }
        fn delete_range(&self, lower: &[u8], upper: &[u8]) -> shoal_storage::Result<()> {
            self.inner.delete_range(lower, upper)
        }
        fn sync(&self) -> shoal_storage::Result<()> {
            std::thread::sleep(Duration::from_millis(2));
            self.syncs.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err(StorageError::Io("injected".into()));
            }
            Ok(())
        }
        fn put_metadata(&self, key: &[u8], value: &[u8]) -> shoal_storage::Result<()> {
            self.inner.put_metadata(key, value)
        }
        fn delete_metadata(&self, key: &[u8]) -> shoal_storage::Result<()> {
            self.inner.delete_metadata(key)
        }
        fn metadata_with_prefix(
            &self,
            prefix: &[u8],
        ) -> shoal_storage::Result<Vec<(Vec<u8>, Vec<u8>)>> {
            self.inner.metadata_with_prefix(prefix)
        }
        fn set_gc_grace_seconds(&self, table_id: shoal_model::TableId, seconds: i32) {
            self.inner.set_gc_grace_seconds(table_id, seconds)
        }
        fn gc_grace_seconds(&self, table_id: &shoal_model::TableId) -> Option<i32> {
            self.inner.gc_grace_seconds(table_id)
        }
        fn collect_garbage(&self) -> shoal_storage::Result<shoal_storage::GarbageReport> {
            self.inner.collect_garbage()
        }
        fn flush(&self) -> shoal_storage::Result<()> {
            self.inner.flush()
        }
        fn compact_all(&self) -> shoal_storage::Result<()> {
            self.inner.compact_all()
        }
        fn approximate_size_bytes(&self) -> u64 {
            0
        }
    }

    fn engine() -> Arc<CountingEngine> {
        Arc::new(CountingEngine {
            inner: MemoryEngine::new(),
            syncs: AtomicUsize::new(0),
            fail: AtomicBool::new(false),
        })
    }

    fn one_cell_batch(i: u32) -> WriteBatch {
        let mut batch = WriteBatch::new();
        batch.merge(
            i.to_be_bytes().to_vec(),
            shoal_model::Cell::live(shoal_model::WriteTimestamp(1), vec![]).encode(),
        );
        batch
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_shares_syncs_between_concurrent_writers() {
        let engine = engine();
        let log = CommitLog::start(engine.clone(), CommitLogSync::Group, 1000).unwrap();
        let writers: Vec<_> = (0..200)
            .map(|i| {
                let log = Arc::clone(&log);
                tokio::spawn(async move { log.append(one_cell_batch(i)).await })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap().unwrap();
        }
        let syncs = engine.syncs.load(Ordering::SeqCst);
        assert!(syncs >= 1, "every acknowledged write needs a sync");
        assert!(
            syncs < 200,
            "group commit must not sync once per write (saw {syncs} syncs for 200 writes)"
        );
        log.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_sync_poisons_the_log() {
        let engine = engine();
        engine.fail.store(true, Ordering::SeqCst);
        let log = CommitLog::start(engine.clone(), CommitLogSync::Group, 1000).unwrap();
        assert!(log.append(one_cell_batch(1)).await.is_err());
        engine.fail.store(false, Ordering::SeqCst);
        let error = log.append(one_cell_batch(2)).await.unwrap_err();
        assert!(error.message.contains("no longer acknowledges writes"));
        log.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_log_acknowledges_nothing() {
        for mode in [CommitLogSync::Group, CommitLogSync::Periodic] {
            let engine = engine();
            let log = CommitLog::start(engine.clone(), mode, 1000).unwrap();
            log.append(one_cell_batch(1)).await.unwrap();
            log.stop();
            let syncs = engine.syncs.load(Ordering::SeqCst);
            let error = log.append(one_cell_batch(2)).await.unwrap_err();
            assert!(
                error.message.contains("shutting down"),
                "{mode:?}: {error:?}"
            );
            assert_eq!(engine.syncs.load(Ordering::SeqCst), syncs);
        }
    }

    /// A down peer, as the failure detector would report it.
    struct OneDown;

    impl shoal_replication::Liveness for OneDown {
        fn is_alive(&self, _: &shoal_model::HostId) -> bool {
            false
        }
        fn down_for(&self, _: &shoal_model::HostId) -> Option<Duration> {
            Some(Duration::from_secs(1))
        }
        fn schema_version(&self, _: &shoal_model::HostId) -> Option<[u8; 16]> {
            None
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stored_hint_is_as_durable_as_an_acknowledged_write() {
        // In group mode a hint is kept only once the log sync covering it returned: an
        // `ANY` write acknowledged on that hint survives a crash like any other.
        let engine = engine();
        let log = CommitLog::start(engine.clone(), CommitLogSync::Group, 1000).unwrap();
        let hints = Arc::new(shoal_replication::Hints::new(
            engine.clone(),
            log.clone(),
            Arc::new(OneDown),
            Duration::from_secs(3600),
            1 << 20,
        ));
        let before = engine.syncs.load(Ordering::SeqCst);
        let cells = vec![(b"key".to_vec(), b"cell".to_vec())];
        hints
            .store(shoal_model::HostId([9; 16]), &cells)
            .await
            .unwrap();
        assert!(
            engine.syncs.load(Ordering::SeqCst) > before,
            "the hint was acknowledged before any sync"
        );
        assert!(hints.pending_for(&shoal_model::HostId([9; 16])));
        log.stop();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn periodic_mode_acknowledges_without_waiting_for_a_sync() {
        let engine = engine();
        let log = CommitLog::start(engine.clone(), CommitLogSync::Periodic, 60_000).unwrap();
        log.append(one_cell_batch(1)).await.unwrap();
        assert_eq!(engine.syncs.load(Ordering::SeqCst), 0);
        log.stop();
        assert!(
            engine.syncs.load(Ordering::SeqCst) >= 1,
            "stop syncs what was acknowledged"
        );
    }
}
