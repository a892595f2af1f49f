//! Scans across the cluster: [`ReplicatedView`], an [`Engine`](shoal_storage::Engine)
//! whose cursors walk a table's tablets in token order, fetching chunks of cells from the
//! replicas the consistency level needs and reconciling them like any read, so the
//! storage reader, paging and LIMIT work unchanged across nodes.
//!
//! Reverse reads of a partition walk it backwards in chunks (`ReplicaRequest::ReadBefore`),
//! so `ORDER BY … DESC LIMIT n` on a large partition fetches only its end.
//!
//! A forward scan is one round trip per chunk of one tablet — one per tablet when tablets
//! hold few cells. So once the cells per tablet are known ([`crate::estimates`]: what the
//! replicas piggyback on their replies), the cursor fetches the tablet it is in and as
//! many following ones at once as the scan's LIMIT needs, at most one chunk's worth
//! ([`tablets_to_fetch`]), and passes their cells on in key order (a tablet cut short by
//! the chunk limit is continued first); it asks for more only when the rows fall short.
//!
//! Scans run on blocking threads (the coordinator's scan stage); a cursor waits for each
//! chunk (or batch of chunks) on the runtime handle it was given.
//!
//! A table replicated otherwise (a strongly consistent keyspace's, by its tablets' Raft
//! groups) gives the view a [`ChunkReader`]: the walk is the same, each chunk is read
//! where that replication says.

use crate::estimates::tablets_to_fetch;
use crate::messages::{Cells, ScanTicket};
use crate::proxy::StorageProxy;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId, TabletId, Token};
use shoal_storage::{Cursor, ReadView};
use std::collections::VecDeque;
use std::sync::Arc;

/// Cells per chunk when a scan fetches from a replica, unless configured otherwise
/// (`scan_chunk_cells`): small enough that a replica's read thread turns to other work
/// every few hundred rows.
pub const SCAN_CHUNK_CELLS: u32 = 4096;

/// A read-only [`Engine`](shoal_storage::Engine) view of one table across its replicas.
pub struct ReplicatedView {
    proxy: Arc<StorageProxy>,
    table: TableId,
    consistency: Consistency,
    runtime: tokio::runtime::Handle,
    /// Where chunks are read when not from the replicas the consistency level needs.
    reader: Option<Arc<dyn ChunkReader>>,
    /// The scan's ticket: its chunks are served in its turn on every replica.
    turn: Option<ScanTicket>,
    /// The cells the scan wants first (its LIMIT in cells, at most one chunk): how many
    /// tablets it fetches at once, and how many cells it asks of each.
    wanted_cells: u32,
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
        let wanted_cells = proxy.chunk_cells;
        ReplicatedView {
            proxy,
            table,
            consistency,
            runtime,
            reader: None,
            turn: None,
            wanted_cells,
            error: Default::default(),
        }
    }

    /// The view for `scan`: its chunks served in its turn on every replica (the read
    /// scheduler orders the chunks of scans by their tickets), and as many tablets fetched
    /// at once as its limit of rows of about `cells_per_row` cells needs.
    pub fn in_turn_of(mut self, scan: ScanTicket, cells_per_row: u32) -> ReplicatedView {
        self.turn = Some(scan);
        self.wanted_cells = scan
            .limit
            .saturating_mul(u64::from(cells_per_row.max(1)))
            .min(u64::from(self.proxy.chunk_cells)) as u32;
        self
    }

    /// The view with its chunks read by `reader`.
    pub fn reading_with(mut self, reader: Arc<dyn ChunkReader>) -> ReplicatedView {
        self.reader = Some(reader);
        self
    }

    /// The error that stopped a scan, if one did.
    pub fn take_error(&self) -> Option<CqlError> {
        self.error.lock().take()
    }
}

/// A chunk's cells, and where the next chunk starts (forward) or where this one starts
/// (backward) when it was cut short.
pub type ChunkAnswer = Result<(Cells, Option<Vec<u8>>), CqlError>;

/// Reads the chunks of a scan of a table whose replicas are not read at a consistency
/// level (a strongly consistent table: at its tablet's leader).
pub trait ChunkReader: Send + Sync {
    /// The visible cells of `[lower, upper)` (within the tablet holding `token`), at
    /// most `limit`, and where the next chunk starts when cut short.
    fn read_chunk(
        &self,
        table: TableId,
        token: Token,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
        consistency: Consistency,
    ) -> futures::future::BoxFuture<'_, ChunkAnswer>;

    /// The last visible cells of `[lower, upper)` (at most `limit`), and where they start
    /// when cut short (the next chunk ends there).
    fn read_chunk_before(
        &self,
        table: TableId,
        token: Token,
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
        consistency: Consistency,
    ) -> futures::future::BoxFuture<'_, ChunkAnswer>;
}

/// One tablet's part of a forward scan: its cells fetched so far, where the next chunk
/// starts when the reply was cut short, and where the part ends.
struct Segment {
    cells: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// `None`: everything up to `end` has been fetched.
    resume: Option<Vec<u8>>,
    end: Vec<u8>,
    /// The part is a whole tablet (its count teaches the table's estimate).
    whole_tablet: bool,
    /// Cells fetched for it so far.
    fetched: u64,
}

/// A part of a scan to fetch: `[lower, end)` within one tablet, and whether it is the
/// whole tablet.
struct Part {
    lower: Vec<u8>,
    end: Vec<u8>,
    whole_tablet: bool,
}

/// A forward scan over `[.., upper)`: tablet by tablet, in key order. The tablet it is in
/// and as many following ones as the cells it wants need, by their estimates
/// ([`crate::estimates`]), are fetched at once, instead of one round trip after another.
struct ReplicatedCursor<'v> {
    view: &'v ReplicatedView,
    /// Parts fetched and not yet passed, in key order.
    segments: VecDeque<Segment>,
    /// Where the next part starts; `None` when the range is exhausted.
    next: Option<Vec<u8>>,
    upper: Vec<u8>,
    /// Cells asked of a replica per chunk: first what the scan wants, then twice as many
    /// each round up to the proxy's chunk size ([`SCAN_CHUNK_CELLS`] unless configured)
    /// — a scan whose rows are filtered out, or wider than estimated, soon fetches whole
    /// chunks.
    chunk_cells: u32,
    error: Option<String>,
}

impl ReplicatedCursor<'_> {
    fn fill(&mut self) {
        while self.error.is_none() {
            let Some(front) = self.segments.front_mut() else {
                if !self.fetch_next_tablets() {
                    return;
                }
                continue;
            };
            if !front.cells.is_empty() {
                return;
            }
            match front.resume.take() {
                Some(resume) => {
                    let end = front.end.clone();
                    let fetched = self.fetch(&resume, &end);
                    self.grow_chunks();
                    match fetched {
                        Ok((cells, resume)) => {
                            let front = self.segments.front_mut().expect("the front segment");
                            front.fetched += cells.len() as u64;
                            front.cells.extend(cells);
                            front.resume = resume;
                        }
                        Err(error) => self.fail(error),
                    }
                }
                None => {
                    if let Some(done) = self.segments.pop_front() {
                        if done.whole_tablet {
                            self.view
                                .proxy
                                .scan_estimates
                                .observe(self.view.table, done.fetched);
                        }
                    }
                }
            }
        }
    }

    fn grow_chunks(&mut self) {
        self.chunk_cells = self
            .chunk_cells
            .saturating_mul(2)
            .min(self.view.proxy.chunk_cells);
    }

    fn fail(&mut self, error: CqlError) {
        self.error = Some(error.message.clone());
        self.view.error.lock().get_or_insert(error);
    }

    /// Fetches the next tablets' first chunks, at once; false when the range is over.
    fn fetch_next_tablets(&mut self) -> bool {
        let Some(start) = self.next.take() else {
            return false;
        };
        if start >= self.upper {
            return false;
        }
        let parts = match self.next_parts(&start) {
            Ok(parts) => parts,
            Err(error) => {
                self.fail(error);
                return false;
            }
        };
        self.next = parts
            .last()
            .map(|part| part.end.clone())
            .filter(|end| *end < self.upper);
        let fetches = parts
            .iter()
            .map(|part| self.fetch_async(part.lower.clone(), part.end.clone()));
        let fetched = self
            .view
            .runtime
            .block_on(futures::future::join_all(fetches));
        self.grow_chunks();
        for (part, answer) in parts.into_iter().zip(fetched) {
            match answer {
                Ok((cells, resume)) => self.segments.push_back(Segment {
                    fetched: cells.len() as u64,
                    cells: cells.into(),
                    resume,
                    end: part.end,
                    whole_tablet: part.whole_tablet,
                }),
                Err(error) => {
                    self.fail(error);
                    return false;
                }
            }
        }
        true
    }

    /// The parts to fetch next from `start`: its tablet's rest, then whole tablets after
    /// it, as many as [`tablets_to_fetch`] says.
    fn next_parts(&self, start: &[u8]) -> Result<Vec<Part>, CqlError> {
        let table = &self.view.table;
        let state = self.view.proxy.topology.state();
        let placement = state
            .tables
            .get(table)
            .ok_or_else(|| CqlError::invalid("the table was dropped during the scan"))?;
        let tablets = &placement.tablets;
        let mut token = token_of(start);
        let first_start = match tablets.bounds_of(tablets.tablet_for(token).id) {
            Some((Some(after), _)) => keys::token_prefix(table, Token(after.0 + 1)),
            _ => keys::table_prefix(table),
        };
        let mut parts = Vec::new();
        let mut lower = start.to_vec();
        // The first part is a whole tablet only when the scan starts where it does.
        let mut whole = lower == first_start;
        let following: Vec<TabletId> = tablets
            .tablets()
            .iter()
            .skip_while(|tablet| tablet.last_token < token)
            .skip(1)
            .take(self.view.proxy.parallel_tablets.saturating_sub(1))
            .map(|tablet| tablet.id)
            .collect();
        let estimates = self.view.proxy.scan_estimates.cells_in(table, &following);
        let wanted = tablets_to_fetch(
            &estimates,
            f64::from(self.chunk_cells),
            self.view.proxy.parallel_tablets,
        );
        loop {
            let tablet = tablets.tablet_for(token);
            let tablet_end = if tablet.last_token == Token::MAX {
                keys::table_end(table)
            } else {
                keys::token_prefix(table, Token(tablet.last_token.0 + 1))
            };
            let end = std::cmp::min(tablet_end, self.upper.clone());
            let reaches_upper = end >= self.upper;
            parts.push(Part {
                lower,
                end: end.clone(),
                whole_tablet: whole && !reaches_upper,
            });
            if reaches_upper || tablet.last_token == Token::MAX || parts.len() >= wanted {
                return Ok(parts);
            }
            token = Token(tablet.last_token.0 + 1);
            lower = end;
            whole = true;
        }
    }

    /// One chunk of `[start, end)` (within one tablet): the cells, and where the next
    /// chunk starts when the reply was cut short.
    fn fetch(&self, start: &[u8], end: &[u8]) -> Result<(Cells, Option<Vec<u8>>), CqlError> {
        self.view
            .runtime
            .block_on(self.fetch_async(start.to_vec(), end.to_vec()))
    }

    fn fetch_async(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
    ) -> impl std::future::Future<Output = Result<(Cells, Option<Vec<u8>>), CqlError>> + '_ {
        async move {
            let proxy = &self.view.proxy;
            let _in_flight = proxy.enter();
            if let Some(reader) = &self.view.reader {
                let (cells, resume) = reader
                    .read_chunk(
                        self.view.table,
                        token_of(&start),
                        start,
                        end.clone(),
                        self.chunk_cells,
                        self.view.consistency,
                    )
                    .await?;
                return Ok((cells, resume.filter(|resume| *resume < end)));
            }
            let state = proxy.topology.state();
            let replicas = proxy.replicas_of(&state, &self.view.table, token_of(&start));
            let reconciled = proxy
                .read_replicas_for(
                    &replicas,
                    self.view.consistency,
                    &start,
                    &end,
                    self.chunk_cells,
                    self.view.turn,
                )
                .await?;
            let resume = reconciled.covered_until.filter(|covered| *covered < end);
            Ok((reconciled.cells, resume))
        }
    }
}

/// The token a scan position is in (a partition's key, or a bare `table | token` prefix).
fn token_of(position: &[u8]) -> Token {
    keys::token_of_key(position).unwrap_or(Token::MIN)
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
                Ok((cells, covered_from)) => {
                    self.buffer.extend(cells.into_iter().rev());
                    self.next_upper = covered_from;
                }
                Err(error) => {
                    self.error = Some(error.message.clone());
                    self.view.error.lock().get_or_insert(error);
                }
            }
        }
    }

    /// The chunk of cells before `end`, and where it starts when cut short.
    fn fetch_before(&self, end: &[u8]) -> Result<(Cells, Option<Vec<u8>>), CqlError> {
        let proxy = &self.view.proxy;
        let _in_flight = proxy.enter();
        let token = token_of(&self.lower);
        if let Some(reader) = &self.view.reader {
            return self.view.runtime.block_on(reader.read_chunk_before(
                self.view.table,
                token,
                self.lower.clone(),
                end.to_vec(),
                proxy.chunk_cells,
                self.view.consistency,
            ));
        }
        let state = proxy.topology.state();
        let replicas = proxy.replicas_of(&state, &self.view.table, token);
        let reconciled = self.view.runtime.block_on(proxy.read_replicas_before(
            &replicas,
            self.view.consistency,
            &self.lower,
            end,
            proxy.chunk_cells,
        ))?;
        Ok((reconciled.cells, reconciled.covered_from))
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
        self.segments
            .front()
            .and_then(|segment| front_of(&segment.cells))
    }

    fn advance(&mut self) {
        if let Some(front) = self.segments.front_mut() {
            front.cells.pop_front();
        }
        self.fill();
    }

    fn skip_to(&mut self, key: &[u8]) {
        while let Some(front) = self.segments.front_mut() {
            while front.cells.front().is_some_and(|(k, _)| k.as_slice() < key) {
                front.cells.pop_front();
            }
            if !front.cells.is_empty() {
                return;
            }
            match &front.resume {
                // The key is in this part, past what was fetched of it: go on from there.
                Some(resume) if front.end.as_slice() > key => {
                    if resume.as_slice() < key {
                        front.resume = Some(key.to_vec());
                    }
                    front.whole_tablet = false;
                    break;
                }
                // Nothing of this part is at or past the key.
                _ => {
                    self.segments.pop_front();
                }
            }
        }
        if self.segments.is_empty() && self.next.as_ref().is_some_and(|n| n.as_slice() < key) {
            self.next = Some(key.to_vec());
        }
        self.fill();
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

impl ReadView for ReplicatedView {
    fn description(&self) -> &'static str {
        "a replicated view"
    }

    fn cursor<'a>(
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
            segments: VecDeque::new(),
            next: Some(lower.to_vec()),
            upper: upper.to_vec(),
            chunk_cells: self.wanted_cells,
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
}
