//! The engine's writer: one thread that applies every write to the data column family.
//!
//! Callers submit batches to a bounded queue; the writer takes all that are waiting
//! (up to [`GROUP_BYTES`]) and applies them as one RocksDB write — one WAL append and one
//! pass through RocksDB's write path for the whole group — then tells each submitter. Under
//! load, groups grow and the per-write cost of the WAL falls; when idle, a write waits for
//! nothing but the thread's wake-up. Writes also leave the caller's thread, so an async
//! server's workers keep serving requests while the writer works (seed 001's epoch group
//! commit, applied to the memtable and the WAL).
//!
//! Being the only writer also makes hot keys cheap to keep readable. Every write is a
//! merge operand, and a key written again and again would pile up operands that every
//! read must merge. The writer counts writes per key (a hash table, cleared when large)
//! and, when a key has collected [`COLLAPSE_AFTER_OPERANDS`], rewrites its resolved value
//! as a plain value right after the group. No other write can come between that read and
//! that rewrite, so the rewrite changes nothing a reader can see.

use crate::{Result, StorageError};
use rocksdb::{WriteOptions, DB};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Submissions waiting for the writer before submitters wait for room.
pub(super) const QUEUE_SUBMISSIONS: usize = 4096;
/// Bytes of cells one group takes at most (the rest waits for the next group).
const GROUP_BYTES: usize = 4 << 20;
/// Writes to one key after which its operands are collapsed into a value.
pub(super) const COLLAPSE_AFTER_OPERANDS: u32 = 8;
/// Keys whose writes are counted before the count starts over.
const TRACKED_KEYS: usize = 100_000;

/// What a submission asks the writer to do.
pub(super) enum Operation {
    /// Merge these `(key, encoded cell)` entries.
    Cells(Vec<(Vec<u8>, Vec<u8>)>),
    /// Remove every key of `[lower, upper)` (TRUNCATE, DROP, delivered hints); the group
    /// it is in is synced.
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

/// An operation, and whom to tell when it is applied.
pub(super) struct Submission {
    pub(super) operation: Operation,
    pub(super) done: oneshot::Sender<Result<()>>,
}

/// How long the writer keeps looking for the next submission before it sleeps: under a
/// steady load the next one comes within microseconds, and a sleep and wake-up (two
/// context switches) cost more than a short look.
const POLL_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(20);

/// The next submission: polled for a moment, then waited for.
fn next_submission(queue: &mut mpsc::Receiver<Submission>) -> Option<Submission> {
    let started = std::time::Instant::now();
    loop {
        match queue.try_recv() {
            Ok(submission) => return Some(submission),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) if started.elapsed() < POLL_BEFORE_SLEEP => {
                std::thread::yield_now()
            }
            Err(mpsc::error::TryRecvError::Empty) => return queue.blocking_recv(),
        }
    }
}

/// The writer's state: the database it writes and its per-key write counts.
pub(super) struct WriterThread {
    db: Arc<DB>,
    family: &'static str,
    counts: HashMap<u64, u32>,
    hasher: std::collections::hash_map::RandomState,
}

fn io_error(error: rocksdb::Error) -> StorageError {
    StorageError::Io(error.into_string())
}

impl WriterThread {
    pub(super) fn new(db: Arc<DB>, family: &'static str) -> WriterThread {
        WriterThread {
            db,
            family,
            counts: HashMap::new(),
            hasher: Default::default(),
        }
    }

    /// Applies submissions until every submitter has gone.
    pub(super) fn run(mut self, mut queue: mpsc::Receiver<Submission>) {
        let mut group: Vec<Submission> = Vec::new();
        while let Some(first) = next_submission(&mut queue) {
            let mut bytes = first.operation.bytes();
            group.push(first);
            while bytes < GROUP_BYTES {
                match queue.try_recv() {
                    Ok(next) => {
                        bytes += next.operation.bytes();
                        group.push(next);
                    }
                    Err(_) => break,
                }
            }
            let (result, hot) = self.write_group(&group);
            for submission in group.drain(..) {
                let _ = submission.done.send(result.clone());
            }
            if result.is_ok() && !hot.is_empty() {
                if let Err(error) = self.collapse(&hot) {
                    tracing::warn!(%error, "could not collapse a hot key's operands");
                }
            }
        }
    }

    /// Writes a group as one batch; returns the outcome and the keys that became hot.
    fn write_group(&mut self, group: &[Submission]) -> (Result<()>, Vec<Vec<u8>>) {
        let Some(data) = self.db.cf_handle(self.family) else {
            return (
                Err(StorageError::Corrupt("missing data column family".into())),
                Vec::new(),
            );
        };
        let mut batch = rocksdb::WriteBatch::default();
        let mut hot = Vec::new();
        let mut sync = false;
        if self.counts.len() > TRACKED_KEYS {
            self.counts.clear();
        }
        for submission in group {
            match &submission.operation {
                Operation::Cells(entries) => {
                    for (key, cell) in entries {
                        batch.merge_cf(data, key, cell);
                        let count = self.counts.entry(self.hasher.hash_one(key)).or_insert(0);
                        *count += 1;
                        if *count >= COLLAPSE_AFTER_OPERANDS {
                            *count = 0;
                            hot.push(key.clone());
                        }
                    }
                }
                Operation::DeleteRange { lower, upper } => {
                    batch.delete_range_cf(data, lower, upper);
                    sync = true;
                }
            }
        }
        let mut options = WriteOptions::default();
        options.set_sync(sync);
        (self.db.write_opt(batch, &options).map_err(io_error), hot)
    }

    /// Rewrites each hot key's resolved value as a plain value, so reads stop merging its
    /// operands. Safe because this thread is the only writer: nothing is written to the
    /// key between the read and the rewrite.
    fn collapse(&self, hot: &[Vec<u8>]) -> Result<()> {
        let Some(data) = self.db.cf_handle(self.family) else {
            return Ok(());
        };
        let mut batch = rocksdb::WriteBatch::default();
        for key in hot {
            if let Some(value) = self.db.get_cf(data, key).map_err(io_error)? {
                batch.put_cf(data, key, value);
            }
        }
        let mut options = WriteOptions::default();
        options.set_sync(false);
        self.db.write_opt(batch, &options).map_err(io_error)
    }
}
