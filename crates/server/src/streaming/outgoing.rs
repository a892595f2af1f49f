//! The source side of streaming: sessions that read one key range from one consistent view
//! of the engine, front to back, and hand it out in chunks.
//!
//! Each session is a thread of its own (at most [`MAX_SESSIONS`] at once) holding one
//! [`Engine::stream_range`] cursor — one snapshot, read sequentially, without filling the
//! block cache — and filling a small bounded queue of chunks ([`QUEUED_CHUNKS`]) ahead of
//! the destination's requests. The destination asks for the next chunk; a session nobody
//! asks for within [`SESSION_IDLE`] is dropped, which ends its thread.

use super::throttle::Throttle;
use super::Chunk;
use parking_lot::Mutex;
use shoal_model::TableId;
use shoal_replication::messages::packed;
use shoal_replication::paxos;
use shoal_storage::Engine;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Bytes of cells in one chunk (one internode frame).
pub const CHUNK_BYTES: usize = 2 << 20;
/// Chunks a session reads ahead of the destination.
const QUEUED_CHUNKS: usize = 4;
/// Sessions (reading threads) at once; more are refused and retried.
pub const MAX_SESSIONS: usize = 8;
/// A session not asked for its next chunk this long is dropped.
const SESSION_IDLE: Duration = Duration::from_secs(60);
/// How long one request for the next chunk waits for it.
const NEXT_WAIT: Duration = Duration::from_secs(30);

struct Session {
    chunks: Arc<tokio::sync::Mutex<mpsc::Receiver<Result<Chunk, String>>>>,
    last_asked: Instant,
    /// Bytes handed out so far (for `shoal admin streams`).
    sent: Arc<AtomicU64>,
    lower: Vec<u8>,
}

/// One session as `shoal admin streams` shows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OutgoingStatus {
    pub session: u64,
    pub bytes_sent: u64,
    pub range_start: String,
}

/// The node's outgoing streaming sessions.
pub struct Outgoing {
    engine: Arc<dyn Engine>,
    throttle: Arc<Throttle>,
    nice: u8,
    sessions: Mutex<HashMap<u64, Session>>,
    next_session: AtomicU64,
}

impl Outgoing {
    pub fn new(engine: Arc<dyn Engine>, throttle: Arc<Throttle>, nice: u8) -> Outgoing {
        Outgoing {
            engine,
            throttle,
            nice,
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
        }
    }

    fn sweep(&self) {
        self.sessions
            .lock()
            .retain(|_, session| session.last_asked.elapsed() < SESSION_IDLE);
    }

    /// Opens a session over `[lower, upper)` (with `paxos_of`, only the Paxos state of
    /// that table's partitions in it); answers its id and the range's estimated size.
    pub fn open(
        &self,
        lower: Vec<u8>,
        upper: Vec<u8>,
        paxos_of: Option<TableId>,
    ) -> Result<(u64, u64), String> {
        self.sweep();
        if self.sessions.lock().len() >= MAX_SESSIONS {
            return Err(format!(
                "this node already streams {MAX_SESSIONS} ranges; try again"
            ));
        }
        let estimate = self
            .engine
            .approximate_range_bytes(&lower, &upper)
            .unwrap_or(0);
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel(QUEUED_CHUNKS);
        let engine = Arc::clone(&self.engine);
        let throttle = Arc::clone(&self.throttle);
        let start = lower.clone();
        let nice = self.nice;
        std::thread::Builder::new()
            .name("shoal-stream-out".into())
            .spawn(move || {
                shoal_coordinator::schedule::lower_thread_priority(nice);
                let keep =
                    |key: &[u8]| paxos_of.is_none_or(|table| paxos::is_state_of(key, &table));
                read_range(engine.as_ref(), &throttle, &start, &upper, keep, &sender)
            })
            .map_err(|e| format!("cannot start a streaming thread: {e}"))?;
        self.sessions.lock().insert(
            id,
            Session {
                chunks: Arc::new(tokio::sync::Mutex::new(receiver)),
                last_asked: Instant::now(),
                sent: Arc::default(),
                lower,
            },
        );
        Ok((id, estimate))
    }

    /// The next chunk of `session`; the last one says `done` and ends the session.
    pub async fn next(&self, session: u64) -> Result<Chunk, String> {
        let (chunks, sent) = {
            let mut sessions = self.sessions.lock();
            let found = sessions
                .get_mut(&session)
                .ok_or_else(|| format!("no streaming session {session} (expired?)"))?;
            found.last_asked = Instant::now();
            (Arc::clone(&found.chunks), Arc::clone(&found.sent))
        };
        let received = {
            let mut chunks = chunks.lock().await;
            tokio::time::timeout(NEXT_WAIT, chunks.recv()).await
        };
        let chunk = match received {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(Some(Err(error))) => {
                self.close(session);
                return Err(error);
            }
            Ok(None) => {
                self.close(session);
                return Err("the streaming session ended unexpectedly".into());
            }
            Err(_) => return Err("reading the range is taking too long; ask again".into()),
        };
        sent.fetch_add(chunk.bytes() as u64, Ordering::Relaxed);
        if chunk.done {
            self.close(session);
        }
        Ok(chunk)
    }

    /// Ends `session` (its thread stops at its next chunk).
    pub fn close(&self, session: u64) {
        self.sessions.lock().remove(&session);
    }

    pub fn status(&self) -> Vec<OutgoingStatus> {
        self.sweep();
        let mut status: Vec<OutgoingStatus> = self
            .sessions
            .lock()
            .iter()
            .map(|(id, session)| OutgoingStatus {
                session: *id,
                bytes_sent: session.sent.load(Ordering::Relaxed),
                range_start: super::hex_prefix(&session.lower),
            })
            .collect();
        status.sort_by_key(|s| s.session);
        status
    }
}

/// A session's thread: reads the cells of `[lower, upper)` that `keep` wants through one
/// cursor into chunks until the end, an error, or nobody wants them any more.
fn read_range(
    engine: &dyn Engine,
    throttle: &Throttle,
    lower: &[u8],
    upper: &[u8],
    keep: impl Fn(&[u8]) -> bool,
    chunks: &mpsc::Sender<Result<Chunk, String>>,
) {
    let mut cursor = match engine.stream_range(lower, upper) {
        Ok(cursor) => cursor,
        Err(error) => {
            let _ = chunks.blocking_send(Err(error.to_string()));
            return;
        }
    };
    loop {
        let mut cells = crate::large_buffers::take(CHUNK_BYTES + CHUNK_BYTES / 8);
        while cells.len() < CHUNK_BYTES {
            let Some((key, value)) = cursor.current() else {
                break;
            };
            if keep(key) {
                packed::pack(&mut cells, key, value);
            }
            cursor.advance();
        }
        if let Err(error) = cursor.status() {
            let _ = chunks.blocking_send(Err(error.to_string()));
            return;
        }
        let done = cursor.current().is_none();
        let chunk = Chunk {
            cells: crate::large_buffers::into_bytes(cells),
            done,
        };
        throttle.acquire_blocking(chunk.bytes() as u64);
        if chunks.blocking_send(Ok(chunk)).is_err() || done {
            return;
        }
    }
}
