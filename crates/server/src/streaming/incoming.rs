//! The destination side of streaming: a job per migration that pulls a tablet's range from
//! its sources, chunk by chunk over the streaming lane, and ingests it as files.
//!
//! Each chunk goes to a file being built on a thread of its own as it arrives, and is
//! dropped once written there; at a file's worth ([`FILE_BYTES`]) the file is added to the
//! store while the next one fills (one being added at a time). So a job holds a few chunks
//! in memory, not files' worth of them, and the chunks' buffers are reused
//! (`large_buffers`) rather than freed and faulted in afresh.
//!
//! The migration driver asks for the job again and again (`Receive`); each time it starts
//! the job if there is none, or waits a while for the one running, and answers how far it
//! got. A failed job is forgotten, so the next ask starts over — ingesting a range twice
//! is harmless (every cell reconciles by last-write-wins).

use super::throttle::Throttle;
use super::{Chunk, StreamReply, StreamRequest, TabletKeys};
use crate::internode::{Message, Peers, Reply};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use shoal_model::{TableId, TabletId};
use shoal_placement::MigrationId;
use shoal_replication::index::LocalIndexes;
use shoal_replication::messages::packed;
use shoal_replication::LocalReplica;
use shoal_storage::Engine;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bytes ingested as one file: each file added costs the store a pause of its writes
/// (`shoal_storage::rocks` adds files together while clients write).
pub const FILE_BYTES: usize = 16 << 20;
/// How long one request for a chunk may take.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a `Receive` waits for the job before answering its progress.
const RECEIVE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
enum JobState {
    Running,
    Done,
    Failed(String),
}

/// One tablet being received.
struct Job {
    table: TableId,
    tablet: TabletId,
    sources: Vec<SocketAddr>,
    started: Instant,
    received_bytes: AtomicU64,
    estimated_bytes: AtomicU64,
    state: watch::Sender<JobState>,
}

impl Job {
    /// A job that has just started: running, nothing received yet.
    fn new(table: TableId, tablet: TabletId, sources: Vec<SocketAddr>) -> Job {
        let (state, _) = watch::channel(JobState::Running);
        Job {
            table,
            tablet,
            sources,
            started: Instant::now(),
            received_bytes: AtomicU64::new(0),
            estimated_bytes: AtomicU64::new(0),
            state,
        }
    }

    /// Records how the job ended. Stored whether or not a `Receive` is waiting right now:
    /// a job often ends between two of them — while the metadata leader that asks is being
    /// replaced, for one — and the next ask must find it ended (a `send` to a watch channel
    /// nobody listens to keeps nothing, and the job would read "receiving" forever).
    fn finish(&self, outcome: Result<(), String>) {
        self.state.send_replace(match outcome {
            Ok(()) => JobState::Done,
            Err(error) => JobState::Failed(error),
        });
    }
}

/// One job as `shoal admin streams` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IncomingStatus {
    pub migration: u64,
    pub table: String,
    pub tablet: u64,
    pub sources: Vec<String>,
    pub bytes_received: u64,
    pub bytes_estimated: u64,
    pub seconds: f64,
    pub state: String,
}

/// What to receive.
pub struct Receive {
    pub migration: MigrationId,
    pub tablet: TabletId,
    pub keys: TabletKeys,
    pub sources: Vec<SocketAddr>,
}

/// Partitions' Paxos states joined into this node's at once.
const ABSORB_CONCURRENCY: usize = 32;

/// The node's incoming streams.
pub struct Incoming {
    /// This node as a replica: its engine, and the Paxos state streamed tablets bring.
    replica: Arc<LocalReplica>,
    throttle: Arc<Throttle>,
    /// The streaming lane: connections of their own, so chunks never queue in front of
    /// client requests' messages.
    lane: Arc<Peers>,
    jobs: Mutex<HashMap<MigrationId, Arc<Job>>>,
    /// Niceness of the threads building and ingesting files.
    nice: u8,
    /// The streaming lane's runtime ([`super::lane`]): jobs run there, and with them the
    /// lane's connections they open.
    runtime: tokio::runtime::Handle,
    /// This node's secondary indexes: what is ingested is indexed before the stream
    /// completes (reads move here only after that).
    indexes: Arc<std::sync::OnceLock<Arc<dyn LocalIndexes>>>,
}

impl Incoming {
    pub fn new(
        replica: Arc<LocalReplica>,
        throttle: Arc<Throttle>,
        lane: Arc<Peers>,
        nice: u8,
        runtime: tokio::runtime::Handle,
    ) -> Incoming {
        Incoming {
            replica,
            throttle,
            lane,
            jobs: Mutex::new(HashMap::new()),
            nice,
            runtime,
            indexes: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Indexes what is ingested from now on with `indexes`.
    pub fn set_indexes(&self, indexes: Arc<dyn LocalIndexes>) {
        let _ = self.indexes.set(indexes);
    }

    /// Starts (or finds) the job for `receive.migration` and waits a while for it:
    /// `Ok(true)` once it is done, `Ok(false)` while it runs.
    pub async fn receive(self: &Arc<Self>, receive: Receive) -> Result<(bool, u64), String> {
        let job = {
            let mut jobs = self.jobs.lock();
            let job = jobs.entry(receive.migration).or_insert_with(|| {
                let job = Arc::new(Job::new(
                    receive.keys.table,
                    receive.tablet,
                    receive.sources.clone(),
                ));
                let incoming = Arc::clone(self);
                let running = Arc::clone(&job);
                let keys = receive.keys.clone();
                self.runtime.spawn(async move {
                    let outcome = incoming.run(&running, &keys).await;
                    let released = incoming.release_staged_writes(&keys).await;
                    running.finish(outcome.and(released));
                });
                job
            });
            Arc::clone(job)
        };
        let mut state = job.state.subscribe();
        let _ =
            tokio::time::timeout(RECEIVE_WAIT, state.wait_for(|s| *s != JobState::Running)).await;
        let bytes = job.received_bytes.load(Ordering::Relaxed);
        let outcome = state.borrow().clone();
        match outcome {
            JobState::Running => Ok((false, bytes)),
            JobState::Done => {
                self.jobs.lock().remove(&receive.migration);
                Ok((true, bytes))
            }
            JobState::Failed(error) => {
                self.jobs.lock().remove(&receive.migration);
                Err(error)
            }
        }
    }

    async fn call(
        &self,
        source: SocketAddr,
        request: StreamRequest,
    ) -> Result<StreamReply, String> {
        match self
            .lane
            .call(source, &Message::Stream(request), CHUNK_TIMEOUT)
            .await?
        {
            Reply::Stream(reply) => Ok(reply),
            Reply::Error(error) => Err(format!("{source}: {error}")),
            other => Err(format!("{source} answered {other:?}")),
        }
    }

    /// Pulls the tablet's cells from each source in turn and ingests them, then its Paxos
    /// state from each and joins it into this node's.
    async fn run(&self, job: &Job, keys: &TabletKeys) -> Result<(), String> {
        let (lower, upper) = keys.data();
        for source in &job.sources {
            let session = self
                .open(job, *source, lower.clone(), upper.clone(), None)
                .await?;
            let pulled = self.pull(job, *source, session).await;
            if pulled.is_err() {
                let _ = self.call(*source, StreamRequest::Close { session }).await;
            }
            pulled?;
        }
        let (lower, upper) = keys.paxos_state();
        for source in &job.sources {
            let session = self
                .open(job, *source, lower.clone(), upper.clone(), Some(keys.table))
                .await?;
            let absorbed = self.absorb_paxos_state(job, *source, session).await;
            if absorbed.is_err() {
                let _ = self.call(*source, StreamRequest::Close { session }).await;
            }
            let partitions = absorbed?;
            if partitions > 0 {
                tracing::info!(table = %keys.table, tablet = job.tablet.0, partitions, %source, "took over the Paxos state of a streamed tablet");
            }
        }
        Ok(())
    }

    /// Adds the writes set aside while the tablet streamed in (`StreamRequest::Prepare`)
    /// to its data, however the stream ended: a stream tried again streams into the data
    /// directly.
    async fn release_staged_writes(&self, keys: &TabletKeys) -> Result<(), String> {
        let engine = Arc::clone(&self.replica.engine);
        let (lower, upper) = keys.data();
        let moved =
            tokio::task::spawn_blocking(move || engine.release_staged_writes(&lower, &upper))
                .await
                .map_err(|e| format!("releasing the writes set aside failed: {e}"))?
                .map_err(|e| format!("releasing the writes set aside failed: {e}"))?;
        tracing::debug!(table = %keys.table, entries = moved, "released the writes set aside while the tablet streamed in");
        Ok(())
    }

    /// Opens a session on `source` over `[lower, upper)`; answers its id.
    async fn open(
        &self,
        job: &Job,
        source: SocketAddr,
        lower: Vec<u8>,
        upper: Vec<u8>,
        paxos_of: Option<TableId>,
    ) -> Result<u64, String> {
        let open = StreamRequest::Open {
            lower,
            upper,
            paxos_of,
        };
        match self.call(source, open).await? {
            StreamReply::Opened { session, estimate } => {
                job.estimated_bytes.fetch_add(estimate, Ordering::Relaxed);
                Ok(session)
            }
            other => Err(format!("{source} answered {other:?} to Open")),
        }
    }

    /// The next chunk of `session`, counted and paid for with the throttle.
    async fn next_chunk(
        &self,
        job: &Job,
        source: SocketAddr,
        session: u64,
    ) -> Result<Chunk, String> {
        let chunk = match self.call(source, StreamRequest::Next { session }).await? {
            StreamReply::Chunk(chunk) => chunk,
            other => return Err(format!("{source} answered {other:?} to Next")),
        };
        let bytes = chunk.bytes() as u64;
        job.received_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.throttle.acquire(bytes).await;
        Ok(chunk)
    }

    /// Joins the Paxos states `session` sends into this node's; answers how many
    /// partitions' state changed.
    async fn absorb_paxos_state(
        &self,
        job: &Job,
        source: SocketAddr,
        session: u64,
    ) -> Result<usize, String> {
        let mut changed = 0;
        loop {
            let chunk = self.next_chunk(job, source, session).await?;
            let entries = packed::entries(&chunk.cells)?;
            let replica = &self.replica;
            let absorbs: Vec<_> = entries
                .into_iter()
                .map(|(key, stored)| replica.absorb_paxos_state(key, stored))
                .collect();
            let outcomes: Vec<bool> = futures::stream::iter(absorbs)
                .buffer_unordered(ABSORB_CONCURRENCY)
                .try_collect()
                .await?;
            changed += outcomes.into_iter().filter(|changed| *changed).count();
            if chunk.done {
                return Ok(changed);
            }
        }
    }

    /// Receives `session`'s chunks into files of about [`FILE_BYTES`], each built as its
    /// chunks arrive and added to the store while the next one fills.
    async fn pull(&self, job: &Job, source: SocketAddr, session: u64) -> Result<(), String> {
        let mut filling: Option<FileInBuilding> = None;
        let mut adding: Option<FileOutcome> = None;
        loop {
            let chunk = self.next_chunk(job, source, session).await?;
            let done = chunk.done;
            let file = match filling.as_mut() {
                Some(file) => file,
                None => filling.insert(self.start_file(job.table)?),
            };
            file.add(chunk).await?;
            if file.bytes >= FILE_BYTES || done {
                // One file is added at a time: the previous one must be in before this
                // one goes.
                if let Some(mut previous) = adding.take() {
                    outcome_of(&mut previous).await?;
                }
                let whole = filling.take().expect("the file filled above");
                adding = Some(whole.finish().await);
            }
            if done {
                break;
            }
        }
        if let Some(mut last) = adding {
            outcome_of(&mut last).await?;
        }
        Ok(())
    }

    /// Starts building a file of `table`'s streamed cells on a thread of its own, at
    /// streaming's lower priority.
    fn start_file(&self, table: TableId) -> Result<FileInBuilding, String> {
        let (parts, mut received) = tokio::sync::mpsc::channel(CHUNKS_QUEUED_PER_FILE);
        let (done, outcome) = tokio::sync::oneshot::channel();
        let engine = Arc::clone(&self.replica.engine);
        let indexes = self
            .indexes
            .get()
            .filter(|indexes| indexes.indexes_table(&table))
            .cloned();
        let nice = self.nice;
        std::thread::Builder::new()
            .name("shoal-ingest".into())
            .spawn(move || {
                shoal_coordinator::schedule::lower_thread_priority(nice);
                let built = build_file(engine.as_ref(), indexes.as_deref(), || {
                    received.blocking_recv()
                });
                let _ = done.send(built);
            })
            .map_err(|e| format!("cannot start an ingestion thread: {e}"))?;
        Ok(FileInBuilding {
            parts,
            outcome,
            bytes: 0,
        })
    }

    pub fn status(&self) -> Vec<IncomingStatus> {
        let mut status: Vec<IncomingStatus> = self
            .jobs
            .lock()
            .iter()
            .map(|(migration, job)| IncomingStatus {
                migration: migration.0,
                table: job.table.to_string(),
                tablet: job.tablet.0,
                sources: job.sources.iter().map(|s| s.ip().to_string()).collect(),
                bytes_received: job.received_bytes.load(Ordering::Relaxed),
                bytes_estimated: job.estimated_bytes.load(Ordering::Relaxed),
                seconds: job.started.elapsed().as_secs_f64(),
                state: match &*job.state.borrow() {
                    JobState::Running => "receiving".into(),
                    JobState::Done => "done".into(),
                    JobState::Failed(error) => format!("failed: {error}"),
                },
            })
            .collect();
        status.sort_by_key(|s| s.migration);
        status
    }
}

/// Chunks waiting for a file's thread at most; the receiving job waits beyond that.
const CHUNKS_QUEUED_PER_FILE: usize = 2;

/// What a file's thread is sent: a chunk of its cells, then word that it is whole.
enum FilePart {
    Chunk(Bytes),
    End,
}

/// A file being built on its own thread ([`Incoming::start_file`]) from the chunks sent
/// to it, each dropped (and its buffer reused, `large_buffers`) once it is in the file:
/// a receiving job holds a few chunks, not a file's worth of them.
struct FileInBuilding {
    parts: tokio::sync::mpsc::Sender<FilePart>,
    outcome: FileOutcome,
    /// Bytes of cells sent so far.
    bytes: usize,
}

impl FileInBuilding {
    /// Sends `chunk` to the file, waiting while the thread is [`CHUNKS_QUEUED_PER_FILE`]
    /// behind.
    async fn add(&mut self, chunk: Chunk) -> Result<(), String> {
        self.bytes += chunk.bytes();
        if self.parts.send(FilePart::Chunk(chunk.cells)).await.is_ok() {
            return Ok(());
        }
        // The thread stopped early: it failed, and says why.
        outcome_of(&mut self.outcome).await
    }

    /// Tells the thread the file is whole; the receiver gets the outcome of adding it to
    /// the store.
    async fn finish(self) -> FileOutcome {
        // A thread that stopped early has sent its error to the receiver already.
        let _ = self.parts.send(FilePart::End).await;
        self.outcome
    }
}

/// Where a file's thread answers how building and adding the file went.
type FileOutcome = tokio::sync::oneshot::Receiver<Result<(), String>>;

/// What a file's thread answered.
async fn outcome_of(outcome: &mut FileOutcome) -> Result<(), String> {
    outcome
        .await
        .map_err(|_| "ingestion stopped unexpectedly".to_string())?
}

/// A file's thread: builds a file of the chunks `next_part` gives until it says the file
/// is whole, adds it to the store, then indexes its cells with `indexes` (ingestion
/// bypasses the write path that indexes everything else). Parts that end without saying
/// so (the job failed) add nothing. A table without an index here keeps no chunk past its
/// being built into the file.
fn build_file(
    engine: &dyn Engine,
    indexes: Option<&dyn LocalIndexes>,
    mut next_part: impl FnMut() -> Option<FilePart>,
) -> Result<(), String> {
    let mut file = engine.streamed_file();
    let mut to_index: Vec<Bytes> = Vec::new();
    loop {
        match next_part() {
            Some(FilePart::Chunk(chunk)) => {
                file.add(&packed::entries(&chunk)?)
                    .map_err(|e| e.to_string())?;
                if indexes.is_some() {
                    to_index.push(chunk);
                }
            }
            Some(FilePart::End) => break,
            None => return Err("the stream ended before its file".into()),
        }
    }
    file.finish().map_err(|e| e.to_string())?;
    let Some(indexes) = indexes else {
        return Ok(());
    };
    for chunk in &to_index {
        index_ingested(engine, indexes, &packed::entries(chunk)?)?;
    }
    engine.sync().map_err(|e| e.to_string())
}

/// Writes the secondary index entries of `entries`, cells of an indexed table just
/// ingested.
fn index_ingested(
    engine: &dyn Engine,
    indexes: &dyn LocalIndexes,
    entries: &[(&[u8], &[u8])],
) -> Result<(), String> {
    for chunk in entries.chunks(4096) {
        // Ingested entries are as stored: a row fragment's cells are indexed one by one
        // (decision 0018).
        let mut cells: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(chunk.len());
        for (key, value) in chunk {
            let stored = shoal_model::fragment::expand(key, value).map_err(|e| e.to_string())?;
            cells.extend(stored.into_iter().map(|(key, cell)| (key, cell.to_vec())));
        }
        let mut index_entries = Vec::new();
        indexes.entries(&cells, &mut index_entries);
        if !index_entries.is_empty() {
            engine
                .write(&shoal_storage::WriteBatch::from(index_entries))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job::new(TableId::default(), TabletId(1), Vec::new())
    }

    #[test]
    fn a_job_that_ends_while_nobody_asks_is_found_ended_by_the_next_ask() {
        // Nobody is subscribed when these jobs end (no `Receive` waiting on them).
        let done = job();
        done.finish(Ok(()));
        assert_eq!(*done.state.subscribe().borrow(), JobState::Done);
        let failed = job();
        failed.finish(Err("the source went away".into()));
        assert_eq!(
            *failed.state.subscribe().borrow(),
            JobState::Failed("the source went away".into())
        );
    }
}
