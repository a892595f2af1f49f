//! The engine's writer: every write to the data column family is applied either by the
//! caller itself or by the writer thread.
//!
//! - **The caller applies its own batch** when nothing is queued, no file is being
//!   ingested and no exclusive step (below) holds the applier — the common case: the write
//!   costs one RocksDB write on the caller's thread and no hand-off — no queue, no wake-up
//!   of another thread, no wake-up back. Callers on several threads apply at the same time
//!   (the applier is shared, [`RwLock`]): RocksDB joins their writes into one group itself,
//!   one WAL append for all, each thread inserting its own entries into the memtable. It is
//!   written with RocksDB's `no_slowdown`, so a caller never blocks on a write stall: when
//!   RocksDB would stall, the batch goes to the queue instead.
//! - **Otherwise the batch is queued** (bounded: [`QUEUE_SUBMISSIONS`]; a submitter waits for
//!   room asynchronously) and the writer thread takes all that are waiting (up to
//!   [`GROUP_BYTES`]) and applies them as one RocksDB write — one WAL append for the whole
//!   group — then tells each submitter. Under load, groups grow and the per-write cost of
//!   the WAL falls (seed 001's epoch group commit, applied to the memtable and the WAL), and
//!   an async server's workers keep serving requests while the writer works.
//!
//! - **Writes started together are applied together** on a thread that opened a
//!   [`WriteDeferral`]: a server's connection task opens one while it runs the requests it
//!   has just read, so the batches those requests submit are collected instead of applied
//!   one by one, and [`WriteDeferral::apply`] writes them as one RocksDB write (one WAL
//!   append) before the task answers. Each request's future resolves once its batch is
//!   applied. Only [`Writer::submit`] on that thread defers; synchronous writes never do.
//!
//! Some steps hold the applier **exclusively**, so that no write at all runs beside them:
//! collapsing a hot key, staging and releasing a range, starting and ending an ingestion,
//! and a writer-thread group that removes a range. Hot keys are why the first exists. Every
//! write is a merge operand, and a key written again and again would pile up operands that
//! every read must merge. Appliers count writes per key ([`WriteCounts`]: a fixed table of
//! counters indexed by the key's hash, small enough to mostly stay in the CPU's cache)
//! and, when a key has collected [`COLLAPSE_AFTER_OPERANDS`], its resolved value is
//! rewritten as a plain value right after that write, with the applier held exclusively. No
//! other write can come between that read and that rewrite, so the rewrite changes nothing
//! a reader can see.

use super::column_family;
use super::staging::{self, StagedRanges, STAGED_FAMILY};
use crate::{Result, StorageError};
use futures::future::{BoxFuture, FutureExt};
use parking_lot::{Condvar, Mutex, RwLock};
use rocksdb::{ErrorKind, WriteOptions, DB};
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

mod deferral;

use deferral::defer;
pub use deferral::WriteDeferral;

/// Submissions waiting for the writer thread before submitters wait for room.
const QUEUE_SUBMISSIONS: usize = 4096;
/// Bytes of cells one group takes at most (the rest waits for the next group).
const GROUP_BYTES: usize = 4 << 20;
/// Writes to one key after which its operands are collapsed into a value.
const COLLAPSE_AFTER_OPERANDS: u32 = 8;
/// Counters of [`WriteCounts`]: 64 Ki of 8 bytes, half a MiB, which mostly stays in the
/// CPU's cache. A key keeps its counter until a key of the same slot is written, so a key is
/// found hot when it is written [`COLLAPSE_AFTER_OPERANDS`] times within about this many
/// writes of other keys.
const COUNTER_SLOTS: usize = 1 << 16;
/// How long the writer thread keeps looking for the next submission before it sleeps:
/// under a steady load the next one comes within microseconds, and a sleep and wake-up
/// (two context switches) cost more than a short look.
const POLL_BEFORE_SLEEP: Duration = Duration::from_micros(20);

/// A writer-thread group slower than this is logged (at debug level, for diagnosis).
const SLOW_GROUP: Duration = Duration::from_micros(500);

/// `(key, encoded cell)` entries to merge.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// What a submission asks the writer to do.
pub(super) enum Operation {
    /// Merge these `(key, encoded cell)` entries.
    Cells(Entries),
    /// Remove every key of `[lower, upper)` (TRUNCATE, DROP, delivered hints, tablets
    /// leaving); durable when applied (the WAL is synced after its group). Always applied by
    /// the writer thread.
    DeleteRange { lower: Vec<u8>, upper: Vec<u8> },
}

impl Operation {
    fn bytes(&self) -> usize {
        match self {
            Operation::Cells(entries) => entries.iter().map(|(k, v)| k.len() + v.len()).sum(),
            Operation::DeleteRange { lower, upper } => lower.len() + upper.len(),
        }
    }
}

/// A queued operation, whom to tell when it is applied, and its place in the queue.
struct Submission {
    operation: Operation,
    done: oneshot::Sender<Result<()>>,
    _room: OwnedSemaphorePermit,
}

/// What waits for the writer thread.
#[derive(Default)]
struct Queue {
    pending: VecDeque<Submission>,
    /// The writer thread waits on [`Writer::wake`]: an enqueue must notify it.
    sleeping: bool,
    /// The engine is closing: nothing more is accepted, the thread ends once `pending` is
    /// empty.
    closed: bool,
}

/// Writes per key, counted on the write path of every key, so it must be cheap: a
/// direct-mapped table of counters (the key's hash picks the slot; the hash's high bits,
/// kept in the slot, tell its key from another that lands there). A key that meets
/// another in its slot starts counting over, which only delays a collapse. Appliers on
/// several threads count at once without a lock: a slot is one atomic word, and two
/// counts of one slot racing lose one of them — which, too, only delays a collapse.
///
/// (It replaced a hash map of up to 100,000 keys, several MiB, whose probes missed the
/// cache on nearly every write: 4% of a node's `perf` samples under a write load.)
struct WriteCounts {
    /// Per slot: the key's tag in the high half, its writes in the low half.
    slots: Box<[AtomicU64]>,
    /// Fixed seed: which keys share a slot does not change from run to run.
    hasher: foldhash::fast::FixedState,
}

impl WriteCounts {
    fn new() -> WriteCounts {
        WriteCounts {
            slots: (0..COUNTER_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: foldhash::fast::FixedState::with_seed(0x5e4d_50a1),
        }
    }

    /// Counts one write of `key`; true when this write makes it hot (its count then
    /// starts over).
    fn record(&self, key: &[u8]) -> bool {
        let hash = self.hasher.hash_one(key);
        let slot = &self.slots[hash as usize % COUNTER_SLOTS];
        let tag = hash >> 32;
        let current = slot.load(Ordering::Relaxed);
        let mut writes = if current >> 32 == tag {
            current as u32
        } else {
            0
        };
        writes += 1;
        let hot = writes >= COLLAPSE_AFTER_OPERANDS;
        if hot {
            writes = 0;
        }
        slot.store(tag << 32 | u64::from(writes), Ordering::Relaxed);
        hot
    }
}

/// What appliers share: read by every write, changed only with the applier held
/// exclusively.
struct Applier {
    counts: WriteCounts,
    /// Files being ingested (streaming): a collapse's read-then-rewrite could hide what an
    /// ingested file adds between the two, so none happens while this is above zero.
    collapse_paused: usize,
    /// Ranges whose writes go to the staging family ([`super::staging`]): read on every
    /// batch, so they live with the applier, which every write holds anyway.
    staged: StagedRanges,
}

/// What applying a batch inline came to.
enum Inline {
    Applied(Result<()>),
    /// Someone else is applying, something is queued, or RocksDB would have stalled the
    /// caller: the batch goes to the queue.
    Declined,
}

/// The writer shared by the engine, its callers and the writer thread.
pub(super) struct Writer {
    db: Arc<DB>,
    family: &'static str,
    /// Held shared by whoever applies a batch, exclusively by the steps nothing may run
    /// beside (see the module's documentation).
    applier: RwLock<Applier>,
    queue: Mutex<Queue>,
    wake: Condvar,
    room: Arc<Semaphore>,
    /// Files being ingested now ([`Writer::begin_ingestion`]).
    ingesting: AtomicUsize,
    /// When clients last wrote (the ingester holds files back meanwhile).
    last_write: LastWrite,
}

/// When a batch of cells was last applied, on the kernel's coarse monotonic clock (a tick,
/// a few milliseconds, is its resolution): cheap enough to note on every batch. Read by
/// the ingester ([`super::ingest`]), which adds streamed files together, fewer times, while
/// clients write: each addition stops every write to the store for a manifest sync.
#[derive(Default)]
pub(super) struct LastWrite(AtomicU64);

/// Milliseconds on the coarse monotonic clock (0 if it cannot be read).
fn coarse_millis() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE)
        .map(|now| now.tv_sec() as u64 * 1000 + now.tv_nsec() as u64 / 1_000_000)
        .unwrap_or(0)
}

impl LastWrite {
    /// Notes a batch applied now. Stores only when the tick changed, so that threads on
    /// several cores mostly share the line instead of taking it from each other.
    fn note(&self) {
        let now = coarse_millis();
        if self.0.load(Ordering::Relaxed) != now {
            self.0.store(now, Ordering::Relaxed);
        }
    }

    /// Whether a batch was applied within `window` (to the clock's resolution).
    pub(super) fn within(&self, window: Duration) -> bool {
        let last = self.0.load(Ordering::Relaxed);
        last != 0 && coarse_millis().saturating_sub(last) <= window.as_millis() as u64
    }
}

fn io_error(error: rocksdb::Error) -> StorageError {
    StorageError::Io(error.into_string())
}

fn closed_error() -> StorageError {
    StorageError::Io("the engine is closed".into())
}

impl Writer {
    pub(super) fn new(db: Arc<DB>, family: &'static str) -> Arc<Writer> {
        Arc::new(Writer {
            db,
            family,
            applier: RwLock::new(Applier {
                counts: WriteCounts::new(),
                collapse_paused: 0,
                staged: StagedRanges::default(),
            }),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            room: Arc::new(Semaphore::new(QUEUE_SUBMISSIONS)),
            ingesting: AtomicUsize::new(0),
            last_write: LastWrite::default(),
        })
    }

    /// Applies `operation`: on the caller's thread when the writer is free, through the
    /// writer thread otherwise. The future resolves once it is applied.
    pub(super) fn submit(self: &Arc<Self>, operation: Operation) -> BoxFuture<'static, Result<()>> {
        let operation = match operation {
            Operation::Cells(entries) => match defer(self, entries) {
                Ok(deferred) => return deferred,
                Err(entries) => Operation::Cells(entries),
            },
            other => other,
        };
        self.submit_now(operation)
    }

    /// [`Writer::submit`] without deferral: for callers that block on the outcome.
    pub(super) fn submit_now(
        self: &Arc<Self>,
        operation: Operation,
    ) -> BoxFuture<'static, Result<()>> {
        if let Operation::Cells(entries) = &operation {
            if let Inline::Applied(result) = self.try_apply_inline(entries.iter()) {
                return futures::future::ready(result).boxed();
            }
        }
        self.submit_queued(operation)
    }

    /// Queues `operation` for the writer thread.
    fn submit_queued(self: &Arc<Self>, operation: Operation) -> BoxFuture<'static, Result<()>> {
        let writer = Arc::clone(self);
        async move {
            let room = Arc::clone(&writer.room)
                .acquire_owned()
                .await
                .map_err(|_| closed_error())?;
            let (done, applied) = oneshot::channel();
            writer.enqueue(Submission {
                operation,
                done,
                _room: room,
            })?;
            applied
                .await
                .map_err(|_| StorageError::Io("the writer has stopped".into()))?
        }
        .boxed()
    }

    fn try_apply_inline<'e>(
        &self,
        entries: impl Iterator<Item = &'e (Vec<u8>, Vec<u8>)>,
    ) -> Inline {
        if self.ingesting.load(Ordering::Acquire) > 0 {
            return Inline::Declined;
        }
        {
            let queue = self.queue.lock();
            if queue.closed || !queue.pending.is_empty() {
                return Inline::Declined;
            }
        }
        let Some(applier) = self.applier.try_read() else {
            return Inline::Declined;
        };
        let (data, staging) = match applier.families(&self.db, self.family) {
            Ok(families) => families,
            Err(error) => return Inline::Applied(Err(error)),
        };
        let batch = applier.batch(data, staging, entries);
        let mut options = WriteOptions::default();
        options.set_sync(false);
        options.set_no_slowdown(true);
        match self.db.write_opt(batch.batch, &options) {
            Ok(()) => {
                drop(applier);
                self.last_write.note();
                self.collapse_hot(&batch.hot);
                Inline::Applied(Ok(()))
            }
            Err(error) if error.kind() == ErrorKind::Incomplete => Inline::Declined,
            Err(error) => Inline::Applied(Err(io_error(error))),
        }
    }

    /// Collapses the keys a write made hot, with the applier held exclusively (see
    /// [`Applier::collapse_hot`]).
    fn collapse_hot(&self, hot: &[Vec<u8>]) {
        if !hot.is_empty() {
            self.applier
                .write()
                .collapse_hot(&self.db, self.family, hot);
        }
    }

    fn enqueue(&self, submission: Submission) -> Result<()> {
        let mut queue = self.queue.lock();
        if queue.closed {
            return Err(closed_error());
        }
        queue.pending.push_back(submission);
        if queue.sleeping {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// For as long as the returned guard lives, a file is being ingested:
    /// - no hot key is collapsed (a collapse running now finishes first: it holds the
    ///   applier): its read-then-rewrite could hide what the file adds between the two;
    /// - no caller applies its own batch: every write goes through the writer thread.
    ///   RocksDB stops every write while it adds a file to the store (until its manifest
    ///   is synced), and a caller would wait for that on its own thread — an async
    ///   server's worker, which has other requests to serve meanwhile.
    pub(super) fn begin_ingestion(&self) -> Ingestion<'_> {
        self.applier.write().collapse_paused += 1;
        self.ingesting.fetch_add(1, Ordering::AcqRel);
        Ingestion(self)
    }

    /// Whether clients wrote to the store within `window`.
    pub(super) fn written_within(&self, window: Duration) -> bool {
        self.last_write.within(window)
    }

    /// Stages the writes to `[lower, upper)` ([`super::staging`]), dropping whatever a
    /// staging of it before left behind.
    pub(super) fn stage(&self, lower: &[u8], upper: &[u8]) -> Result<()> {
        let mut applier = self.applier.write();
        let staged = column_family(&self.db, STAGED_FAMILY)?;
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(staged, lower, upper);
        self.db.write(batch).map_err(io_error)?;
        applier.staged.add(lower, upper);
        Ok(())
    }

    /// Ends the staging of `[lower, upper)` and of every staged range overlapping it, and
    /// moves their staged writes into the data; answers how many stored entries it moved.
    /// No write is applied meanwhile: the applier is held. If the move fails, the ranges
    /// stay staged.
    pub(super) fn release(&self, lower: &[u8], upper: &[u8]) -> Result<usize> {
        let mut applier = self.applier.write();
        let released = applier.staged.remove_overlapping(lower, upper);
        let mut ranges = released.clone();
        ranges.push((lower.to_vec(), upper.to_vec()));
        let moved = (|| {
            let staged = column_family(&self.db, STAGED_FAMILY)?;
            let data = column_family(&self.db, self.family)?;
            let mut batch = rocksdb::WriteBatch::default();
            let moved = staging::release_batch(&self.db, staged, data, &ranges, &mut batch)?;
            let mut options = WriteOptions::default();
            options.set_sync(false);
            self.db.write_opt(batch, &options).map_err(io_error)?;
            Ok(moved)
        })();
        if moved.is_err() {
            for (lower, upper) in &released {
                applier.staged.add(lower, upper);
            }
        }
        moved
    }

    /// Stops accepting submissions; the writer thread ends once it has applied what is
    /// queued.
    pub(super) fn close(&self) {
        self.queue.lock().closed = true;
        self.wake.notify_one();
    }

    /// The writer thread: applies queued submissions until the engine closes.
    pub(super) fn run(self: Arc<Self>) {
        while let Some(group) = self.next_group() {
            let started = Instant::now();
            // A range removal runs with no write beside it, as it did when every write
            // took its turn: a write that raced it is applied wholly before or after.
            let removes_range = group
                .iter()
                .any(|s| matches!(s.operation, Operation::DeleteRange { .. }));
            let (mut result, hot) = if removes_range {
                self.applier
                    .write()
                    .write_group(&self.db, self.family, &group)
            } else {
                self.applier
                    .read()
                    .write_group(&self.db, self.family, &group)
            };
            if result.is_ok() {
                self.last_write.note();
                self.collapse_hot(&hot);
            }
            // A range removal is durable when it returns. The WAL is synced on its own,
            // after the group, with the applier free: a synced write would make every
            // write that joins RocksDB's write group wait for the fsync.
            if removes_range && result.is_ok() {
                result = super::sync_wal(&self.db);
            }
            let took = started.elapsed();
            if took > SLOW_GROUP {
                tracing::debug!(
                    micros = took.as_micros() as u64,
                    submissions = group.len(),
                    "a write group was slow to apply"
                );
            }
            for submission in group {
                let _ = submission.done.send(result.clone());
            }
        }
    }

    /// The submissions of the next group (polled for a moment, then waited for); `None`
    /// once the engine has closed and nothing is left.
    fn next_group(&self) -> Option<Vec<Submission>> {
        let started = Instant::now();
        let mut queue = self.queue.lock();
        loop {
            if !queue.pending.is_empty() {
                let mut group = Vec::new();
                let mut bytes = 0;
                while bytes < GROUP_BYTES {
                    let Some(next) = queue.pending.pop_front() else {
                        break;
                    };
                    bytes += next.operation.bytes();
                    group.push(next);
                }
                return Some(group);
            }
            if queue.closed {
                return None;
            }
            if started.elapsed() < POLL_BEFORE_SLEEP {
                drop(queue);
                std::thread::yield_now();
                queue = self.queue.lock();
            } else {
                queue.sleeping = true;
                self.wake.wait(&mut queue);
                queue.sleeping = false;
            }
        }
    }
}

/// While it lives, a file is being ingested ([`Writer::begin_ingestion`]).
pub(super) struct Ingestion<'w>(&'w Writer);

impl Drop for Ingestion<'_> {
    fn drop(&mut self) {
        self.0.ingesting.fetch_sub(1, Ordering::AcqRel);
        self.0.applier.write().collapse_paused -= 1;
    }
}

/// A batch ready to write, and the keys it makes hot.
struct PreparedBatch {
    batch: rocksdb::WriteBatch,
    hot: Vec<Vec<u8>>,
}

impl Applier {
    /// The data family `family`, and the staging family while some range is staged.
    fn families<'a>(
        &self,
        db: &'a DB,
        family: &str,
    ) -> Result<(&'a rocksdb::ColumnFamily, Option<&'a rocksdb::ColumnFamily>)> {
        let staging = if self.staged.is_empty() {
            None
        } else {
            Some(column_family(db, STAGED_FAMILY)?)
        };
        Ok((column_family(db, family)?, staging))
    }

    /// The merge operands of `entries` — in `data`, or in `staging` for keys of a staged
    /// range — counting each key's writes to the data.
    fn batch<'e>(
        &self,
        data: &rocksdb::ColumnFamily,
        staging: Option<&rocksdb::ColumnFamily>,
        entries: impl Iterator<Item = &'e (Vec<u8>, Vec<u8>)>,
    ) -> PreparedBatch {
        let mut prepared = PreparedBatch {
            batch: rocksdb::WriteBatch::default(),
            hot: Vec::new(),
        };
        let mut operands = super::pack::pack(entries);
        // In key order: RocksDB inserts a batch written by one thread into the memtable's
        // skip list from where the previous insert ended (its "splice"), so a key near the
        // previous one is found without descending from the top again. Stable, so that
        // operands of one key keep their order.
        operands.sort_by(|(a, _), (b, _)| a.cmp(b));
        for (key, operand) in &operands {
            if let Some(staging) = staging.filter(|_| self.staged.contains(key)) {
                prepared.batch.merge_cf(staging, key, operand);
                continue;
            }
            prepared.batch.merge_cf(data, key, operand);
            if self.counts.record(key) {
                prepared.hot.push(key.to_vec());
            }
        }
        prepared
    }

    /// Writes a group as one batch; returns the outcome and the keys that became hot.
    fn write_group(
        &self,
        db: &DB,
        family: &str,
        group: &[Submission],
    ) -> (Result<()>, Vec<Vec<u8>>) {
        let cells = group
            .iter()
            .flat_map(|submission| match &submission.operation {
                Operation::Cells(entries) => entries.as_slice(),
                Operation::DeleteRange { .. } => &[],
            });
        let (data, staging) = match self.families(db, family) {
            Ok(families) => families,
            Err(error) => return (Err(error), Vec::new()),
        };
        let mut prepared = self.batch(data, staging, cells);
        for submission in group {
            if let Operation::DeleteRange { lower, upper } = &submission.operation {
                prepared.batch.delete_range_cf(data, lower, upper);
                // What is staged there goes too: it would join the data later.
                if let Some(staging) = staging {
                    prepared.batch.delete_range_cf(staging, lower, upper);
                }
            }
        }
        let mut options = WriteOptions::default();
        options.set_sync(false);
        (
            db.write_opt(prepared.batch, &options).map_err(io_error),
            prepared.hot,
        )
    }

    /// Rewrites each hot key's resolved value as a plain value, so reads stop merging its
    /// operands. Safe because the caller holds the applier exclusively: nothing is written
    /// to the key between the read and the rewrite. Optional work: it never waits on a
    /// write stall, and a failure only leaves the operands for a later collapse.
    fn collapse_hot(&self, db: &DB, family: &str, hot: &[Vec<u8>]) {
        if hot.is_empty() || self.collapse_paused > 0 {
            return;
        }
        match Self::collapse(db, family, hot) {
            Err(error) if error.kind() != ErrorKind::Incomplete => {
                tracing::warn!(error = %error.into_string(), "could not collapse a hot key's operands")
            }
            _ => {}
        }
    }

    fn collapse(db: &DB, family: &str, hot: &[Vec<u8>]) -> std::result::Result<(), rocksdb::Error> {
        let Ok(data) = column_family(db, family) else {
            return Ok(());
        };
        let mut batch = rocksdb::WriteBatch::default();
        for key in hot {
            if let Some(value) = db.get_cf(data, key)? {
                batch.put_cf(data, key, value);
            }
        }
        let mut options = WriteOptions::default();
        options.set_sync(false);
        options.set_no_slowdown(true);
        db.write_opt(batch, &options)
    }
}

#[cfg(test)]
mod tests;
