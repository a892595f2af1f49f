//! Streamed entries into the store: a file built, then added to it.
//!
//! [`build_file`] writes the entries as a sorted file (`SstFileWriter`) on the caller's
//! thread. Streaming calls it from threads at its idle CPU priority, where building
//! competes with nothing a client waits for.
//!
//! Adding the file is different. RocksDB stops every write to the store until the file
//! is in its manifest, and meanwhile the writer queues every client write
//! ([`Writer::begin_ingestion`]). If that ran at the idle priority, a machine busy with
//! requests could keep the thread off the CPU for milliseconds while every write to the
//! node waited behind it: a priority inversion. So the [`Ingester`]'s own thread adds the
//! files, one at a time, at the priority the node started with.
//!
//! Measured over four 1 GiB joins each way (24 files per join, 2 cores), from the pause
//! of writes to the file's being in: at the idle priority a median of 10.6–14.5 ms per
//! file and 0.26–0.35 s per join; on this thread 2.7–3.3 ms and 0.07–0.10 s
//! (`bench/results/2026-12-01-ingest-priority`).

use super::writer::Writer;
use super::{column_family, io_error, DATA_FAMILY};
use crate::{Result, StorageError};
use rocksdb::{Options, DB};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// Files waiting for the ingestion thread at most; their builders wait beyond that.
const QUEUED_FILES: usize = 16;

/// Writes `entries` (sorted, distinct keys) to a new file at `path`, as merge operands
/// like every write: the stored cell reconciles with the ingested one by last-write-wins,
/// whichever is newer in RocksDB's order. The file is removed if building it fails.
pub(super) fn build_file(path: &Path, entries: &[(&[u8], &[u8])], options: &Options) -> Result<()> {
    let built = (|| -> std::result::Result<(), rocksdb::Error> {
        let mut file = rocksdb::SstFileWriter::create(options);
        file.open(path)?;
        for (key, value) in entries {
            file.merge(key, value)?;
        }
        file.finish()
    })();
    if let Err(error) = built {
        let _ = std::fs::remove_file(path);
        return Err(io_error(error));
    }
    Ok(())
}

/// A file to add, and where its outcome goes.
struct Request {
    path: PathBuf,
    answer: mpsc::SyncSender<Result<()>>,
}

/// The thread that adds built files to the store (see the module documentation).
pub(super) struct Ingester {
    requests: Option<mpsc::SyncSender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ingester {
    /// Starts the ingestion thread, at the calling thread's priority.
    pub(super) fn start(db: Arc<DB>, writer: Arc<Writer>) -> Result<Ingester> {
        let (requests, received) = mpsc::sync_channel::<Request>(QUEUED_FILES);
        let thread = std::thread::Builder::new()
            .name("shoal-ingest-add".into())
            .spawn(move || {
                for request in received {
                    let added = add_file(&db, &writer, &request.path);
                    let _ = std::fs::remove_file(&request.path);
                    let _ = request.answer.send(added);
                }
            })
            .map_err(|e| StorageError::Io(format!("cannot start the ingestion thread: {e}")))?;
        Ok(Ingester {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Adds the file at `path` to the store and removes it; returns once it is in.
    pub(super) fn add(&self, path: PathBuf) -> Result<()> {
        let stopped = || StorageError::Io("the store is closing".to_string());
        let requests = self.requests.as_ref().ok_or_else(stopped)?;
        let (answer, outcome) = mpsc::sync_channel(1);
        if let Err(mpsc::SendError(request)) = requests.send(Request { path, answer }) {
            let _ = std::fs::remove_file(&request.path);
            return Err(stopped());
        }
        outcome.recv().map_err(|_| stopped())?
    }

    /// Lets the thread finish the files queued and waits for it.
    pub(super) fn stop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Adds one file. An ingestion whose file overlaps the memtable flushes it first, stopping
/// every write to the store meanwhile. The writes a receiving node takes for the range are
/// staged elsewhere (`staging`), so the memtable normally holds none of its keys and the
/// file goes in as it is. If it does hold some (staging began late: the node restarted
/// while receiving), the memtable is flushed — which does not stop writes — and the
/// ingestion tried again; if writes landed in the range meanwhile, once more, letting it
/// flush.
fn add_file(db: &DB, writer: &Writer, path: &Path) -> Result<()> {
    let data = column_family(db, DATA_FAMILY)?;
    let mut options = rocksdb::IngestExternalFileOptions::default();
    options.set_move_files(true);
    options.set_allow_blocking_flush(false);
    let mut ingested = Ok(());
    for attempt in 0..3 {
        if attempt > 0 {
            db.flush_cf(data).map_err(io_error)?;
        }
        if attempt == 2 {
            options.set_allow_blocking_flush(true);
        }
        let started = std::time::Instant::now();
        let began;
        ingested = {
            let _ingestion = writer.begin_ingestion();
            began = started.elapsed();
            db.ingest_external_file_cf_opts(data, &options, vec![path])
        };
        tracing::debug!(
            micros = started.elapsed().as_micros() as u64,
            waited_to_begin_micros = began.as_micros() as u64,
            "added a streamed file to the store (writes to it went through the writer thread)"
        );
        if ingested.is_ok() {
            break;
        }
    }
    ingested.map_err(io_error)
}
