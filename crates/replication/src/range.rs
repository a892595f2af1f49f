//! Scans across the cluster: [`ReplicatedView`], an [`Engine`] whose cursors walk a
//! table's tablets in token order, fetching chunks of cells from the replicas the
//! consistency level needs and reconciling them like any read, so the storage reader,
//! paging and LIMIT work unchanged across nodes.
//!
//! Reverse reads of a partition walk it backwards in chunks (`ReplicaRequest::ReadBefore`),
//! so `ORDER BY … DESC LIMIT n` on a large partition fetches only its end.
//!
//! Scans run on blocking threads (the coordinator's scan stage); a cursor waits for each
//! chunk on the runtime handle it was given.

use crate::messages::Cells;
use crate::proxy::StorageProxy;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId, Token};
use shoal_storage::{Cursor, Engine, GarbageReport, WriteBatch};
use std::collections::VecDeque;
use std::sync::Arc;

/// Cells per chunk when a scan fetches from a replica.
pub const SCAN_CHUNK_CELLS: u32 = 4096;

/// A read-only [`Engine`] view of one table across its replicas.
pub struct ReplicatedView {
    proxy: Arc<StorageProxy>,
    table: TableId,
    consistency: Consistency,
    runtime: tokio::runtime::Handle,
    /// The first error a cursor met (Unavailable, ReadTimeout...), for the client: the
    /// reader only sees a storage error.
    error: parking_lot::Mutex<Option<CqlError>>,
}

impl ReplicatedView {
    pub fn new(
        proxy: Arc<StorageProxy>,
        table: TableId,
        consistency: Consistency,
        runtime: tokio::runtime::Handle,
    ) -> ReplicatedView {
        ReplicatedView {
            proxy,
            table,
            consistency,
            runtime,
            error: Default::default(),
        }
    }

    /// The error that stopped a scan, if one did.
    pub fn take_error(&self) -> Option<CqlError> {
        self.error.lock().take()
    }
}

struct ReplicatedCursor<'v> {
    view: &'v ReplicatedView,
    /// Next key to fetch from; `None` when the range is exhausted.
    next: Option<Vec<u8>>,
    upper: Vec<u8>,
    buffer: VecDeque<(Vec<u8>, Vec<u8>)>,
    error: Option<String>,
}

impl ReplicatedCursor<'_> {
    fn fill(&mut self) {
        while self.buffer.is_empty() && self.error.is_none() {
            let Some(start) = self.next.take() else {
                return;
            };
            if start >= self.upper {
                return;
            }
            match self.fetch(&start) {
                Ok((cells, next)) => {
                    self.buffer.extend(cells);
                    self.next = next;
                }
                Err(error) => {
                    self.error = Some(error.message.clone());
                    self.view.error.lock().get_or_insert(error);
                }
            }
        }
    }

    /// One chunk from `start`: the cells, and where the next chunk starts.
    fn fetch(&self, start: &[u8]) -> Result<(Cells, Option<Vec<u8>>), CqlError> {
        let proxy = &self.view.proxy;
        let table = &self.view.table;
        let _in_flight = proxy.enter();
        let state = proxy.topology.state();
        let token = keys::split_partition(start)
            .map(|(t, _, _)| t)
            .or_else(|| {
                start
                    .get(keys::TABLE_ID_LENGTH..keys::TOKEN_PREFIX_LENGTH)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(Token::from_sortable_bytes)
            })
            .unwrap_or(Token::MIN);
        let placement = state
            .tables
            .get(table)
            .ok_or_else(|| CqlError::invalid("the table was dropped during the scan"))?;
        let tablet = placement.tablets.tablet_for(token);
        // The tablet ends after its last token: the next tablet starts at last + 1.
        let tablet_end = if tablet.last_token == Token::MAX {
            keys::table_end(table)
        } else {
            keys::token_prefix(table, Token(tablet.last_token.0 + 1))
        };
        let chunk_upper = std::cmp::min(tablet_end, self.upper.clone());
        let replicas = proxy.replicas_of(&state, table, token);
        let reconciled = self.view.runtime.block_on(proxy.read_replicas(
            &replicas,
            self.view.consistency,
            start,
            &chunk_upper,
            SCAN_CHUNK_CELLS,
        ))?;
        let next = match reconciled.covered_until {
            Some(covered) => Some(covered),
            None => Some(chunk_upper),
        };
        Ok((reconciled.cells, next))
    }
}

/// Walks `[lower, upper)` within one token backwards: chunks of the last cells before
/// where the previous chunk started, so a reverse read holds one chunk at a time and a
/// `LIMIT` fetches only what it returns.
struct ReverseReplicatedCursor<'v> {
    view: &'v ReplicatedView,
    lower: Vec<u8>,
    /// Where the next chunk ends; `None` once `lower` has been reached.
    next_upper: Option<Vec<u8>>,
    /// The current chunk, greatest key first.
    buffer: VecDeque<(Vec<u8>, Vec<u8>)>,
    error: Option<String>,
}

impl ReverseReplicatedCursor<'_> {
    fn fill(&mut self) {
        while self.buffer.is_empty() && self.error.is_none() {
            let Some(end) = self.next_upper.take() else {
                return;
            };
            if end <= self.lower {
                return;
            }
            match self.fetch_before(&end) {
                Ok(reconciled) => {
                    self.buffer.extend(reconciled.cells.into_iter().rev());
                    self.next_upper = reconciled.covered_from;
                }
                Err(error) => {
                    self.error = Some(error.message.clone());
                    self.view.error.lock().get_or_insert(error);
                }
            }
        }
    }

    fn fetch_before(&self, end: &[u8]) -> Result<crate::reconcile::Reconciled, CqlError> {
        let proxy = &self.view.proxy;
        let _in_flight = proxy.enter();
        let state = proxy.topology.state();
        let token = self
            .lower
            .get(keys::TABLE_ID_LENGTH..keys::TOKEN_PREFIX_LENGTH)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(Token::from_sortable_bytes)
            .unwrap_or(Token::MIN);
        let replicas = proxy.replicas_of(&state, &self.view.table, token);
        self.view.runtime.block_on(proxy.read_replicas_before(
            &replicas,
            self.view.consistency,
            &self.lower,
            end,
            SCAN_CHUNK_CELLS,
        ))
    }
}

impl Cursor for ReverseReplicatedCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        front_of(&self.buffer)
    }

    fn advance(&mut self) {
        self.buffer.pop_front();
        self.fill();
    }

    /// Backwards: to the first entry before `key`.
    fn skip_to(&mut self, key: &[u8]) {
        while self
            .buffer
            .front()
            .is_some_and(|(k, _)| k.as_slice() >= key)
        {
            self.buffer.pop_front();
        }
        if self.buffer.is_empty() {
            if self.next_upper.as_ref().is_some_and(|n| n.as_slice() > key) {
                self.next_upper = Some(key.to_vec());
            }
            self.fill();
        }
    }

    fn status(&self) -> shoal_storage::Result<()> {
        status_of(&self.error)
    }
}

impl Cursor for ReplicatedCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        front_of(&self.buffer)
    }

    fn advance(&mut self) {
        self.buffer.pop_front();
        self.fill();
    }

    fn skip_to(&mut self, key: &[u8]) {
        while self.buffer.front().is_some_and(|(k, _)| k.as_slice() < key) {
            self.buffer.pop_front();
        }
        if self.buffer.is_empty() {
            if self.next.as_ref().is_some_and(|n| n.as_slice() < key) {
                self.next = Some(key.to_vec());
            }
            self.fill();
        }
    }

    fn status(&self) -> shoal_storage::Result<()> {
        status_of(&self.error)
    }
}

/// The cell a chunked cursor is on: the front of its buffered chunk.
fn front_of(buffer: &VecDeque<(Vec<u8>, Vec<u8>)>) -> Option<(&[u8], &[u8])> {
    buffer.front().map(|(k, v)| (k.as_slice(), v.as_slice()))
}

/// A chunked cursor's status: the error that stopped it, if one did.
fn status_of(error: &Option<String>) -> shoal_storage::Result<()> {
    match error {
        Some(error) => Err(shoal_storage::StorageError::Io(error.clone())),
        None => Ok(()),
    }
}

fn read_only() -> shoal_storage::StorageError {
    shoal_storage::StorageError::Io("a replicated view is read-only".into())
}

impl Engine for ReplicatedView {
    fn write(&self, _batch: &WriteBatch) -> shoal_storage::Result<()> {
        Err(read_only())
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> shoal_storage::Result<Box<dyn Cursor + 'a>> {
        let within_one_token = lower.len() >= keys::TOKEN_PREFIX_LENGTH
            && lower.get(..keys::TOKEN_PREFIX_LENGTH) == upper.get(..keys::TOKEN_PREFIX_LENGTH);
        if reverse && within_one_token {
            let mut cursor = ReverseReplicatedCursor {
                view: self,
                lower: lower.to_vec(),
                next_upper: Some(upper.to_vec()),
                buffer: Default::default(),
                error: None,
            };
            cursor.fill();
            return Ok(Box::new(cursor));
        }
        let mut cursor = ReplicatedCursor {
            view: self,
            next: Some(lower.to_vec()),
            upper: upper.to_vec(),
            buffer: Default::default(),
            error: None,
        };
        cursor.fill();
        if !reverse {
            return Ok(Box::new(cursor));
        }
        let mut cells = Vec::new();
        while let Some((k, v)) = cursor.current() {
            cells.push((k.to_vec(), v.to_vec()));
            cursor.advance();
        }
        cursor.status()?;
        // Reverse scans happen within one partition (one token, above); a range over several
        // tokens read backwards is read forward, then reversed.
        cells.reverse();
        Ok(Box::new(shoal_storage::SnapshotCursor::new(cells, true)))
    }

    fn delete_range(&self, _lower: &[u8], _upper: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn sync(&self) -> shoal_storage::Result<()> {
        Ok(())
    }
    fn flush(&self) -> shoal_storage::Result<()> {
        Ok(())
    }
    fn compact_all(&self) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn put_metadata(&self, _key: &[u8], _value: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn delete_metadata(&self, _key: &[u8]) -> shoal_storage::Result<()> {
        Err(read_only())
    }
    fn metadata_with_prefix(&self, _prefix: &[u8]) -> shoal_storage::Result<Cells> {
        Ok(Vec::new())
    }
    fn set_gc_grace_seconds(&self, _table_id: TableId, _seconds: i32) {}
    fn gc_grace_seconds(&self, _table_id: &TableId) -> Option<i32> {
        None
    }
    fn collect_garbage(&self) -> shoal_storage::Result<GarbageReport> {
        Err(read_only())
    }
    fn approximate_size_bytes(&self) -> u64 {
        0
    }
}
