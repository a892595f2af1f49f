//! Streamed entries into the store: a file built, then added to it.
//!
//! A [`FileBuilder`] writes the entries as a sorted file (`SstFileWriter`) on the caller's
//! thread, a batch at a time as they arrive. Streaming builds from threads at its idle CPU
//! priority, where building competes with nothing a client waits for.
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
//!
//! **Files are added together while clients write.** Each addition stops the store's writes
//! for about one manifest sync (a few milliseconds), however many files it adds. One file
//! at a time, a 1 GiB join paused a joining node's writes some 24 times, and the writes
//! that waited there were most of the join's slowest (`a write was slow to reach its
//! consistency level`: every one waited for the joining node, 1–6 ms). So while clients
//! have written to the store lately, the thread holds a file up to [`HOLD_WHILE_WRITTEN`]
//! for others to arrive and adds them in one call. A receiving job keeps receiving its next
//! file meanwhile, so the hold costs it nothing unless it fills that file first. With no
//! writes (an idle join, one under reads) a file is added as soon as it arrives.

use super::writer::Writer;
use super::{column_family, compressibility, io_error, RocksEngine, DATA_FAMILY};
use crate::{Result, StorageError};
use rocksdb::DB;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Files waiting for the ingestion thread at most; their builders wait beyond that.
const QUEUED_FILES: usize = 16;
/// Files added in one call at most.
const FILES_PER_ADDITION: usize = QUEUED_FILES;
/// How long a file may wait for others to be added with it, while clients write.
const HOLD_WHILE_WRITTEN: Duration = Duration::from_millis(100);
/// Clients that wrote within this long are taken to be writing still.
const RECENT_WRITES: Duration = Duration::from_millis(100);

/// Whether the ingestion thread waits for more files before adding the `collected` ones,
/// having held the first for `held`.
fn keep_collecting(collected: usize, held: Duration, clients_writing: bool) -> bool {
    clients_writing && collected < FILES_PER_ADDITION && held < HOLD_WHILE_WRITTEN
}

/// A sorted file of streamed entries, written batch by batch as they arrive
/// ([`crate::StreamedFile`]), then added to the store by the [`Ingester`].
///
/// Entries are written as merge operands like every write: the stored cell reconciles with
/// the ingested one by last-write-wins, whichever is newer in RocksDB's order. Whether the
/// file is compressed is decided on its first batch ([`compressibility`]): a stream's
/// batches are a couple of MiB of one table's range, alike enough to judge the file by.
/// The file is created at the first batch (a file of none adds nothing) and removed if it
/// is not added.
pub(super) struct FileBuilder<'a> {
    engine: &'a RocksEngine,
    path: PathBuf,
    file: Option<rocksdb::SstFileWriter<'a>>,
}

impl<'a> FileBuilder<'a> {
    pub(super) fn new(engine: &'a RocksEngine, path: PathBuf) -> FileBuilder<'a> {
        FileBuilder {
            engine,
            path,
            file: None,
        }
    }

    /// The file, created on the first call with the options `entries` call for.
    fn file(&mut self, entries: &[(&[u8], &[u8])]) -> Result<&mut rocksdb::SstFileWriter<'a>> {
        if self.file.is_none() {
            let engine = self.engine;
            std::fs::create_dir_all(&engine.ingest_dir).map_err(|e| {
                StorageError::Io(format!("cannot create the ingest directory: {e}"))
            })?;
            let options = if compressibility::worth_compressing(entries) {
                &engine.data_options
            } else {
                &engine.uncompressed_data_options
            };
            let file = rocksdb::SstFileWriter::create(options);
            // Kept before it is opened, so that a failed open removes what it left.
            let opened = file.open(&self.path);
            self.file = Some(file);
            opened.map_err(io_error)?;
        }
        Ok(self.file.as_mut().expect("created above"))
    }
}

impl crate::StreamedFile for FileBuilder<'_> {
    fn add(&mut self, entries: &[(&[u8], &[u8])]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let file = self.file(entries)?;
        for (key, value) in entries {
            file.merge(key, value).map_err(io_error)?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let Some(mut file) = self.file.take() else {
            return Ok(());
        };
        if let Err(error) = file.finish() {
            let _ = std::fs::remove_file(&self.path);
            return Err(io_error(error));
        }
        self.engine.ingester.add(self.path.clone())
    }
}

impl Drop for FileBuilder<'_> {
    /// A file not handed to the [`Ingester`] (dropped unfinished, or failed) is removed.
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
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
                while let Ok(first) = received.recv() {
                    let mut requests = vec![first];
                    collect_more(&received, &writer, &mut requests);
                    add_requests(&db, &writer, requests);
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

/// Adds to `requests` the files that arrive while [`keep_collecting`] says to wait.
fn collect_more(received: &mpsc::Receiver<Request>, writer: &Writer, requests: &mut Vec<Request>) {
    let held = Instant::now();
    loop {
        while requests.len() < FILES_PER_ADDITION {
            match received.try_recv() {
                Ok(request) => requests.push(request),
                Err(_) => break,
            }
        }
        let clients_writing = writer.written_within(RECENT_WRITES);
        if !keep_collecting(requests.len(), held.elapsed(), clients_writing) {
            return;
        }
        match received.recv_timeout(HOLD_WHILE_WRITTEN.saturating_sub(held.elapsed())) {
            Ok(request) => requests.push(request),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            // The store is closing: add what is here.
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Adds the files of `requests` in one call, removes them and answers each. If that fails
/// with several files, each is tried alone, so that one bad file fails only its stream.
fn add_requests(db: &DB, writer: &Writer, requests: Vec<Request>) {
    let paths: Vec<&Path> = requests.iter().map(|r| r.path.as_path()).collect();
    let together = add_files(db, writer, &paths);
    let outcomes: Vec<Result<()>> = match together {
        Err(_) if requests.len() > 1 => requests
            .iter()
            .map(|request| add_files(db, writer, &[request.path.as_path()]))
            .collect(),
        together => vec![together; requests.len()],
    };
    for (request, added) in requests.into_iter().zip(outcomes) {
        let _ = std::fs::remove_file(&request.path);
        let _ = request.answer.send(added);
    }
}

/// Adds files in one call. An ingestion whose file overlaps the memtable flushes it first,
/// stopping every write to the store meanwhile. The writes a receiving node takes for the
/// range are staged elsewhere (`staging`), so the memtable normally holds none of its keys
/// and the file goes in as it is. If it does hold some (staging began late: the node restarted
/// while receiving), the memtable is flushed — which does not stop writes — and the
/// ingestion tried again; if writes landed in the range meanwhile, once more, letting it
/// flush.
fn add_files(db: &DB, writer: &Writer, paths: &[&Path]) -> Result<()> {
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
            db.ingest_external_file_cf_opts(data, &options, paths.to_vec())
        };
        tracing::debug!(
            files = paths.len(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_wait_for_others_only_while_clients_write_and_only_so_long() {
        let moment = Duration::from_millis(1);
        // Nobody writing: a file is added as soon as it arrives.
        assert!(!keep_collecting(1, Duration::ZERO, false));
        // Clients writing: it waits for others, up to the hold and the most added at once.
        assert!(keep_collecting(1, Duration::ZERO, true));
        assert!(keep_collecting(3, HOLD_WHILE_WRITTEN - moment, true));
        assert!(!keep_collecting(3, HOLD_WHILE_WRITTEN, true));
        assert!(!keep_collecting(FILES_PER_ADDITION, Duration::ZERO, true));
    }
}
