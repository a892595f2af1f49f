//! Hinted handoff: writes a replica missed, kept on the coordinator until it returns.
//!
//! A hint is the cells of one write for one replica, stored in the node's own engine
//! under an internal table id ([`HINTS_TABLE_ID`], sorting after every user table) as
//! `HINTS_TABLE_ID | target host id | time | sequence`. Hints ride the commit log like any
//! write (no sync of their own). Two bounds keep them from growing without limit: no hints
//! are kept for a replica down longer than the hint window (repair must heal it), and
//! none beyond `max_bytes` in all. [`Hints::replay`] sends a live replica its hints in
//! order and deletes each once acknowledged.

use crate::messages::{Cells, ReplicaRequest, ReplicaResponse};
use crate::transport::{Liveness, ReplicaTransport};
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

pub struct Hints {
    engine: Arc<dyn Engine>,
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
    /// Hints kept in `engine`; `liveness` says how long a replica has been down.
    pub fn new(
        engine: Arc<dyn Engine>,
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
            liveness,
            window,
            max_bytes,
            stored_bytes: AtomicU64::new(stored),
            sequence: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Keeps `cells` for `host`, unless it has been down past the hint window or the hints
    /// are full.
    pub fn store(&self, host: HostId, cells: &Cells) {
        let beyond_window = self
            .liveness
            .down_for(&host)
            .is_some_and(|down| down > self.window);
        let payload = match bincode::serialize(cells) {
            Ok(payload) => payload,
            Err(_) => return,
        };
        if beyond_window
            || self.stored_bytes.load(Ordering::Relaxed) + payload.len() as u64 > self.max_bytes
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(host = ?host, beyond_window, "not keeping a hint; repair will heal this replica");
            return;
        }
        let now = shoal_model::timestamp::now_micros();
        let mut key = host_prefix(&host);
        key.extend_from_slice(&(now as u64).to_be_bytes());
        key.extend_from_slice(&self.sequence.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        let value = Cell::live(shoal_model::timestamp::WriteTimestamp(now), payload).encode();
        self.stored_bytes
            .fetch_add(value.len() as u64, Ordering::Relaxed);
        let mut batch = WriteBatch::new();
        batch.merge(key, value);
        if let Err(error) = self.engine.write(&batch) {
            tracing::warn!(%error, "could not store a hint");
        }
    }

    /// Bytes of hints kept, and hints not kept (window passed or full).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.stored_bytes.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
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
                    let cell = Cell::decode(value).map_err(|e| format!("{e:?}"))?;
                    let hinted: Cells =
                        bincode::deserialize(&cell.value).map_err(|e| e.to_string())?;
                    cells.extend(hinted);
                    keys.push(key.to_vec());
                    cursor.advance();
                }
                (keys, cells, bytes)
            };
            let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
                return Ok(delivered);
            };
            match transport
                .send(
                    address,
                    ReplicaRequest::Apply(cells),
                    Duration::from_secs(10),
                )
                .await
            {
                Ok(ReplicaResponse::Applied) => {}
                Ok(other) => return Err(format!("replica answered {other:?}")),
                Err(error) => return Err(error),
            }
            let mut end = last.clone();
            end.push(0);
            self.engine
                .delete_range(first, &end)
                .map_err(|e| e.to_string())?;
            self.stored_bytes.fetch_sub(
                bytes.min(self.stored_bytes.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
            delivered += keys.len();
        }
    }
}
