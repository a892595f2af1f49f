//! Hinted handoff: writes a replica missed, kept on the coordinator until it returns.
//!
//! A hint is the cells of one write for one replica, stored in the node's own engine
//! under an internal table id ([`HINTS_TABLE_ID`], sorting after every user table) as
//! `HINTS_TABLE_ID | target host id | time | sequence`. Hints are written through the
//! node's [`WriteLog`] like any write, so they are exactly as durable as the node's commit
//! policy promises (synced before [`Hints::store`] resolves in `group` mode). Two bounds
//! keep them from growing without limit: no hints are kept for a replica down longer than
//! the hint window (repair must heal it), and none beyond `max_bytes` in all. A hint that
//! is not kept is an error the caller sees ([`HintRefused`]): a write at `ANY` is only
//! acknowledged on a hint that was stored. [`Hints::replay`] sends a live replica its
//! hints in order and deletes each once acknowledged.

use crate::messages::{Cells, ReplicaRequest, ReplicaResponse};
use crate::replica::WriteLog;
use crate::transport::{Liveness, ReplicaTransport};
use futures::future::BoxFuture;
use shoal_model::{Cell, HostId, TableId};
use shoal_storage::{Engine, WriteBatch};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The internal table id hints are stored under.
pub const HINTS_TABLE_ID: TableId = TableId([0xff; 16]);

/// Hints replayed per message.
const REPLAY_BATCH: usize = 64;

/// Why a hint was not kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HintRefused {
    /// The replica has been down longer than the hint window: repair must heal it.
    BeyondWindow,
    /// The hints kept already fill `max_hints_mib`.
    Full,
    /// Writing the hint failed.
    Failed(String),
}

impl std::fmt::Display for HintRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HintRefused::BeyondWindow => write!(f, "the replica is down past the hint window"),
            HintRefused::Full => write!(f, "the hint store is full"),
            HintRefused::Failed(error) => write!(f, "storing the hint failed: {error}"),
        }
    }
}

pub struct Hints {
    /// Read for replay; written only through `log`.
    engine: Arc<dyn Engine>,
    log: Arc<dyn WriteLog>,
    liveness: Arc<dyn Liveness>,
    window: Duration,
    max_bytes: u64,
    stored_bytes: AtomicU64,
    sequence: AtomicU32,
    dropped: AtomicU64,
}

fn host_prefix(host: &HostId) -> Vec<u8> {
    let mut key = HINTS_TABLE_ID.0.to_vec();
    key.extend_from_slice(&host.0);
    key
}

impl Hints {
    /// Hints kept in `engine`, written through `log`; `liveness` says how long a replica
    /// has been down.
    pub fn new(
        engine: Arc<dyn Engine>,
        log: Arc<dyn WriteLog>,
        liveness: Arc<dyn Liveness>,
        window: Duration,
        max_bytes: u64,
    ) -> Hints {
        let stored = match engine.scan(&HINTS_TABLE_ID.0, &[0xff; 33], false) {
            Ok(mut cursor) => {
                let mut bytes = 0u64;
                while let Some((_, value)) = cursor.current() {
                    bytes += value.len() as u64;
                    cursor.advance();
                }
                bytes
            }
            Err(_) => 0,
        };
        Hints {
            engine,
            log,
            liveness,
            window,
            max_bytes,
            stored_bytes: AtomicU64::new(stored),
            sequence: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Keeps `cells` for `host`, unless it has been down past the hint window or the hints
    /// are full; resolves once the hint is as durable as any acknowledged write.
    pub fn store(
        self: &Arc<Self>,
        host: HostId,
        cells: &Cells,
    ) -> BoxFuture<'static, Result<(), HintRefused>> {
        let prepared = self.prepare(host, cells);
        let hints = Arc::clone(self);
        Box::pin(async move {
            let (batch, bytes) = match prepared {
                Ok(prepared) => prepared,
                Err(refused) => {
                    hints.refuse(&host, &refused);
                    return Err(refused);
                }
            };
            if let Err(error) = hints.log.append(batch).await {
                hints.stored_bytes.fetch_sub(bytes, Ordering::Relaxed);
                let refused = HintRefused::Failed(error.message);
                hints.refuse(&host, &refused);
                return Err(refused);
            }
            Ok(())
        })
    }

    /// The hint's key and value, with its bytes reserved against `max_bytes`.
    fn prepare(&self, host: HostId, cells: &Cells) -> Result<(WriteBatch, u64), HintRefused> {
        let beyond_window = self
            .liveness
            .down_for(&host)
            .is_some_and(|down| down > self.window);
        if beyond_window {
            return Err(HintRefused::BeyondWindow);
        }
        let payload = bincode::serialize(cells).map_err(|e| HintRefused::Failed(e.to_string()))?;
        let now = shoal_model::timestamp::now_micros();
        let mut key = host_prefix(&host);
        key.extend_from_slice(&(now as u64).to_be_bytes());
        key.extend_from_slice(&self.sequence.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        let value = Cell::live(shoal_model::timestamp::WriteTimestamp(now), payload).encode();
        let bytes = value.len() as u64;
        self.stored_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |stored| {
                (stored + bytes <= self.max_bytes).then_some(stored + bytes)
            })
            .map_err(|_| HintRefused::Full)?;
        let mut batch = WriteBatch::new();
        batch.merge(key, value);
        Ok((batch, bytes))
    }

    fn refuse(&self, host: &HostId, refused: &HintRefused) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(host = ?host, %refused, "not keeping a hint; repair will heal this replica");
    }

    /// Bytes of hints kept, and hints not kept (window passed or full).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.stored_bytes.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// Removes every hint none of whose cells is still due (tables dropped or truncated
    /// since, or older than their gc_grace_seconds), whether or not its replica ever
    /// returns; returns how many were removed. Runs on the caller's thread: call it from a
    /// blocking one.
    pub fn sweep(&self) -> Result<usize, String> {
        let lower = HINTS_TABLE_ID.0.to_vec();
        let upper = vec![0xff; HINTS_TABLE_ID.0.len() + 1];
        let mut expired: Vec<(Vec<u8>, u64)> = Vec::new();
        {
            let mut cursor = self
                .engine
                .scan(&lower, &upper, false)
                .map_err(|e| e.to_string())?;
            while let Some((key, value)) = cursor.current() {
                if self.due_cells(value)?.is_empty() {
                    expired.push((key.to_vec(), value.len() as u64));
                }
                cursor.advance();
            }
        }
        for (key, bytes) in &expired {
            let mut end = key.clone();
            end.push(0);
            self.engine
                .delete_range(key, &end)
                .map_err(|e| e.to_string())?;
            self.stored_bytes.fetch_sub(
                (*bytes).min(self.stored_bytes.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
        }
        Ok(expired.len())
    }

    /// True when hints are waiting for `host`.
    pub fn pending_for(&self, host: &HostId) -> bool {
        let prefix = host_prefix(host);
        let upper = shoal_model::keys::increment_prefix(&prefix).unwrap_or_default();
        self.engine
            .scan(&prefix, &upper, false)
            .map(|cursor| cursor.current().is_some())
            .unwrap_or(false)
    }

    /// The cells of a stored hint that are still worth delivering.
    fn due_cells(&self, stored: &[u8]) -> Result<Cells, String> {
        let cell = Cell::decode(stored).map_err(|e| format!("{e:?}"))?;
        let hinted: Cells = bincode::deserialize(&cell.value).map_err(|e| e.to_string())?;
        let hinted_at = cell.timestamp.0 / 1_000_000;
        Ok(hinted
            .into_iter()
            .filter(|(key, value)| self.still_due(key, value, hinted_at))
            .collect())
    }

    /// Whether a hinted cell (hinted at `hinted_at`, seconds) is still worth delivering:
    /// not of a dropped table, not hidden by a TRUNCATE since, and not older than its
    /// table's gc_grace_seconds (past that, deletions it might resurrect may be purged,
    /// and repair is what heals the replica — Cassandra's hint TTL).
    fn still_due(&self, key: &[u8], value: &[u8], hinted_at: i64) -> bool {
        let (Some(table), Ok(cell)) = (TableId::of_key(key), Cell::decode(value)) else {
            return false;
        };
        if self
            .engine
            .truncated_at(&table)
            .is_some_and(|truncated| cell.timestamp <= truncated)
        {
            return false;
        }
        match self.engine.gc_grace_seconds(&table) {
            Some(grace) => shoal_model::timestamp::now_seconds() - hinted_at <= grace as i64,
            None => false,
        }
    }

    /// Sends `host` (at `address`) its hints, oldest first, deleting each batch once the
    /// replica acknowledged it. Returns how many hints were delivered.
    pub async fn replay(
        &self,
        host: HostId,
        address: SocketAddr,
        transport: &dyn ReplicaTransport,
    ) -> Result<usize, String> {
        let prefix = host_prefix(&host);
        let upper = shoal_model::keys::increment_prefix(&prefix).unwrap_or_default();
        let mut delivered = 0;
        loop {
            let (keys, cells, bytes) = {
                let mut cursor = self
                    .engine
                    .scan(&prefix, &upper, false)
                    .map_err(|e| e.to_string())?;
                let mut keys = Vec::new();
                let mut cells: Cells = Vec::new();
                let mut bytes = 0u64;
                while let Some((key, value)) = cursor.current() {
                    if keys.len() == REPLAY_BATCH {
                        break;
                    }
                    bytes += value.len() as u64;
                    cells.extend(self.due_cells(value)?);
                    keys.push(key.to_vec());
                    cursor.advance();
                }
                (keys, cells, bytes)
            };
            let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
                return Ok(delivered);
            };
            let reply = if cells.is_empty() {
                Ok(ReplicaResponse::Applied)
            } else {
                transport
                    .send(
                        address,
                        ReplicaRequest::Apply(cells),
                        // Not routed by a tablet map: a hint is for this node whatever
                        // the map says now, so no fence refuses it.
                        u64::MAX,
                        Duration::from_secs(10),
                    )
                    .await
            };
            match reply {
                Ok(ReplicaResponse::Applied) => {}
                Ok(other) => return Err(format!("replica answered {other:?}")),
                Err(error) => return Err(error),
            }
            let mut end = last.clone();
            end.push(0);
            let (engine, first) = (Arc::clone(&self.engine), first.clone());
            tokio::task::spawn_blocking(move || engine.delete_range(&first, &end))
                .await
                .map_err(|_| "removing delivered hints failed unexpectedly".to_string())?
                .map_err(|e| e.to_string())?;
            self.stored_bytes.fetch_sub(
                bytes.min(self.stored_bytes.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
            delivered += keys.len();
        }
    }
}
