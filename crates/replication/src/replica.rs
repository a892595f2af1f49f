//! The replica side: what this node does when a coordinator — itself or another node —
//! asks it to apply cells, read them, digest them or hash them for repair.
//!
//! Reads, digests and repair hashes all see the *visible* cells of a range (neither
//! shadowed by a deletion nor past their grace period: [`shoal_storage::shadow`]), so two
//! replicas that purged at different moments still answer alike. Writes go through the
//! node's [`WriteLog`], which acknowledges them once they are as durable as the node's
//! commit policy promises.

use crate::barrier::Fence;
use crate::index::LocalIndexes;
use crate::messages::{Cells, ReplicaRequest, ReplicaResponse, ScanTicket};
use futures::future::BoxFuture;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId};
use shoal_storage::{Engine, WriteBatch};
use std::hash::Hasher;
use std::sync::Arc;

/// Where this node's writes go. The server implements it with its commit policy (periodic
/// sync or epoch group commit); the future resolves when the batch may be acknowledged.
pub trait WriteLog: Send + Sync {
    fn append(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>>;
}

/// A [`WriteLog`] that applies writes to the engine and acknowledges at once (tests).
pub struct ImmediateWriteLog(pub Arc<dyn Engine>);

impl WriteLog for ImmediateWriteLog {
    fn append(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        let result = self
            .0
            .write(&batch)
            .map_err(|e| CqlError::server(e.to_string()));
        Box::pin(async move { result })
    }
}

/// Where this node serves the chunks of scans in their turn, by their [`ScanTicket`]s: the
/// read scheduler (`shoal_coordinator::schedule`), set once as the node starts.
pub trait ScanStage: Send + Sync {
    /// Runs `read` on a read thread in the turn of `scan`.
    fn run(
        &self,
        scan: ScanTicket,
        read: Box<dyn FnOnce() -> ReplicaResponse + Send>,
    ) -> BoxFuture<'static, ReplicaResponse>;
}

/// This node as a replica: its engine, its write log, and the fence that keeps out
/// requests routed by a tablet map a topology barrier has retired ([`crate::barrier`]).
pub struct LocalReplica {
    pub engine: Arc<dyn Engine>,
    pub log: Arc<dyn WriteLog>,
    pub fence: Fence,
    /// Requests refused by the fence so far (the metrics).
    pub fenced: std::sync::atomic::AtomicU64,
    /// This node's secondary indexes, kept in step with every write ([`crate::index`]);
    /// set once as the node starts.
    indexes: std::sync::OnceLock<Arc<dyn LocalIndexes>>,
    /// This node's side of Paxos rounds ([`crate::paxos`]).
    paxos: crate::paxos::PaxosReplica,
    /// Where scan chunks wait for their turn; set once as the node starts (without one,
    /// in tests, they are served at once).
    scan_stage: std::sync::OnceLock<Arc<dyn ScanStage>>,
    /// The cells this node holds per tablet, told with every scan chunk it serves.
    pub tablet_cells: crate::estimates::TabletCellEstimator,
}

impl LocalReplica {
    pub fn new(engine: Arc<dyn Engine>, log: Arc<dyn WriteLog>) -> LocalReplica {
        // Removed batchlog entries may be purged at once (see `crate::batchlog`).
        engine.set_gc_grace_seconds(crate::batchlog::BATCHLOG_TABLE_ID, 0);
        // Expired Paxos state (see `crate::paxos`) too.
        engine.set_gc_grace_seconds(crate::paxos::PAXOS_TABLE_ID, 0);
        LocalReplica {
            engine,
            log,
            fence: Fence::default(),
            fenced: std::sync::atomic::AtomicU64::new(0),
            indexes: std::sync::OnceLock::new(),
            paxos: crate::paxos::PaxosReplica::default(),
            scan_stage: std::sync::OnceLock::new(),
            tablet_cells: Default::default(),
        }
    }

    /// Keeps `indexes` in step with every write this replica applies from now on.
    pub fn set_indexes(&self, indexes: Arc<dyn LocalIndexes>) {
        let _ = self.indexes.set(indexes);
    }

    /// Serves the chunks of scans in their turn on `stage` from now on.
    pub fn set_scan_stage(&self, stage: Arc<dyn ScanStage>) {
        let _ = self.scan_stage.set(stage);
    }

    /// Serves a chunk of a scan (`ReplicaRequest::ScanChunk`) in the scan's turn: for
    /// another coordinator when `topology_version` says by which tablet map it was routed
    /// (refused if the fence has moved past it), for this node's own scans otherwise.
    pub fn serve_scan_chunk(
        self: &Arc<Self>,
        scan: ScanTicket,
        request: ReplicaRequest,
        topology_version: Option<u64>,
    ) -> BoxFuture<'static, ReplicaResponse> {
        let local = Arc::clone(self);
        let read = move || match topology_version {
            // Packed here, on the read thread, so the connection's task only writes it.
            Some(version) => local
                .serve_read_routed(request, version)
                .into_packed_chunk(),
            None => local.serve_read(&request),
        };
        match self.scan_stage.get() {
            Some(stage) => stage.run(scan, Box::new(read)),
            None => Box::pin(async move { read() }),
        }
    }

    /// Takes in one partition's Paxos state as another replica of a tablet moving here
    /// stored it (see [`crate::paxos::state_range`]): joined into this node's state, the
    /// commit it brings applied. Answers whether anything changed.
    pub async fn absorb_paxos_state(&self, key: &[u8], stored: &[u8]) -> Result<bool, String> {
        self.paxos.absorb(self, key, stored).await
    }

    /// Appends `cells` and the index entries they add to the write log, in one batch.
    async fn append_cells(&self, mut cells: Cells) -> Result<(), CqlError> {
        if let Some(indexes) = self.indexes.get() {
            let mut entries = Vec::new();
            indexes.entries(&cells, &mut entries);
            cells.extend(entries);
        }
        self.log.append(WriteBatch::from(cells)).await
    }

    /// Answers a request another node routed by the tablet map of `topology_version`:
    /// refused if the fence has moved past it (requests that do not depend on which
    /// replicas hold a tablet — TRUNCATE, the batchlog — are always served).
    pub async fn serve_routed(
        &self,
        request: ReplicaRequest,
        topology_version: u64,
    ) -> ReplicaResponse {
        let routed = !matches!(
            request,
            ReplicaRequest::Truncate(_)
                | ReplicaRequest::StoreBatch { .. }
                | ReplicaRequest::RemoveBatch(_)
        );
        if routed {
            if let Some(refused) = self.refuse_stale(topology_version) {
                return refused;
            }
        }
        self.serve(request).await
    }

    /// [`LocalReplica::serve_routed`] for the reads (`Read`, `ScanChunk`, `Digest`,
    /// `ReadBefore`),
    /// which need no runtime: what a read thread runs. Other requests are refused.
    pub fn serve_read_routed(
        &self,
        request: ReplicaRequest,
        topology_version: u64,
    ) -> ReplicaResponse {
        if let Some(refused) = self.refuse_stale(topology_version) {
            return refused;
        }
        self.serve_read(&request)
    }

    /// [`LocalReplica::serve_read_routed`] from what this node holds in memory, for a read
    /// served where it must not wait for a disk ([`shoal_storage::InMemory`]): `None` when
    /// it needs the disk, to be served by [`LocalReplica::serve_read_routed`] where it may.
    pub fn serve_read_in_memory(
        &self,
        request: &ReplicaRequest,
        topology_version: u64,
    ) -> Option<ReplicaResponse> {
        if let Some(refused) = self.refuse_stale(topology_version) {
            return Some(refused);
        }
        shoal_storage::InMemory::read(&self.engine, |memory| self.serve_read_from(memory, request))
    }

    /// The refusal of a request routed by a tablet map older than the fence, if it is.
    fn refuse_stale(&self, topology_version: u64) -> Option<ReplicaResponse> {
        let refusal = self.fence.check(topology_version).err()?;
        self.fenced
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(%refusal, "refused a request routed by a stale tablet map");
        Some(ReplicaResponse::Error(refusal))
    }

    /// Answers `Read`, `ScanChunk`, `Digest` and `ReadBefore` from this node's engine.
    fn serve_read(&self, request: &ReplicaRequest) -> ReplicaResponse {
        self.serve_read_from(self.engine.as_ref(), request)
    }

    /// [`LocalReplica::serve_read`] from `engine`: this node's engine or a view of it.
    fn serve_read_from(&self, engine: &dyn Engine, request: &ReplicaRequest) -> ReplicaResponse {
        match request {
            ReplicaRequest::Read {
                lower,
                upper,
                limit,
            } => match read_visible(engine, lower, upper, *limit) {
                Ok((cells, complete)) => ReplicaResponse::Cells { cells, complete },
                Err(error) => ReplicaResponse::Error(error),
            },
            // A scan's chunk, and what this node holds of the table's tablets.
            ReplicaRequest::ScanChunk {
                lower,
                upper,
                limit,
                ..
            } => match read_visible(engine, lower, upper, *limit) {
                Ok((cells, complete)) => {
                    let estimates = keys::table_and_token(lower)
                        .and_then(|(table, _)| self.tablet_cells.estimates(engine, table));
                    match estimates {
                        Some(estimates) => ReplicaResponse::ScanCells {
                            cells,
                            complete,
                            estimates,
                        },
                        None => ReplicaResponse::Cells { cells, complete },
                    }
                }
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::Digest {
                lower,
                upper,
                limit,
            } => match digest_visible(engine, lower, upper, *limit) {
                Ok((hash, complete)) => ReplicaResponse::Digest { hash, complete },
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::ReadBefore {
                lower,
                upper,
                limit,
            } => match read_visible_before(engine, lower, upper, *limit) {
                Ok((cells, from)) => ReplicaResponse::CellsFrom { cells, from },
                Err(error) => ReplicaResponse::Error(error),
            },
            other => ReplicaResponse::Error(format!(
                "{} is not a read a read thread serves",
                other.describe()
            )),
        }
    }

    /// Candidates from this node's index, once it covers everything stored here.
    pub fn lookup(
        &self,
        lookup: &crate::index::IndexLookup,
        upto: shoal_model::Token,
    ) -> Result<Vec<crate::messages::PartitionRef>, String> {
        match self.indexes.get() {
            Some(indexes) => indexes.candidates(self.engine.as_ref(), lookup, upto),
            None => Err("this node keeps no secondary indexes yet".into()),
        }
    }

    /// The partitions stored here nearest to a vector, from this node's vector index.
    pub fn vector_search(
        &self,
        search: &crate::index::VectorSearch,
    ) -> Result<crate::index::VectorAnswer, String> {
        match self.indexes.get() {
            Some(indexes) => indexes.vector_search(self.engine.as_ref(), search),
            None => Err("this node keeps no secondary indexes yet".into()),
        }
    }

    /// Removes every cell of `table` stored here, and tells this node's indexes.
    pub async fn truncate(&self, table: TableId) -> Result<(), String> {
        remove_table_data(Arc::clone(&self.engine), table).await?;
        if let Some(indexes) = self.indexes.get() {
            indexes.truncated(table);
        }
        Ok(())
    }

    /// Applies cells (and the index entries they add) through the write log.
    pub async fn apply(&self, cells: Cells) -> Result<(), CqlError> {
        self.append_cells(cells).await
    }

    /// Answers one request.
    pub async fn serve(&self, request: ReplicaRequest) -> ReplicaResponse {
        match request {
            ReplicaRequest::Apply(cells) => match self.append_cells(cells).await {
                Ok(()) => ReplicaResponse::Applied,
                Err(error) => ReplicaResponse::Error(error.message),
            },
            read @ (ReplicaRequest::Read { .. }
            | ReplicaRequest::ScanChunk { .. }
            | ReplicaRequest::Digest { .. }
            | ReplicaRequest::ReadBefore { .. }) => self.serve_read(&read),
            ReplicaRequest::RangeHashes { bounds } => {
                match range_hashes(self.engine.as_ref(), &bounds) {
                    Ok(hashes) => ReplicaResponse::Hashes(hashes),
                    Err(error) => ReplicaResponse::Error(error),
                }
            }
            ReplicaRequest::StoreBatch { batch, cells } => {
                match self.log.append(crate::batchlog::entry(batch, cells)).await {
                    Ok(()) => ReplicaResponse::Applied,
                    Err(error) => ReplicaResponse::Error(error.message),
                }
            }
            ReplicaRequest::RemoveBatch(batch) => {
                match self.log.append(crate::batchlog::removal(batch)).await {
                    Ok(()) => ReplicaResponse::Applied,
                    Err(error) => ReplicaResponse::Error(error.message),
                }
            }
            ReplicaRequest::Truncate(table_id) => match self.truncate(table_id).await {
                Ok(()) => ReplicaResponse::Applied,
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::IndexLookup { lookup, upto } => match self.lookup(&lookup, upto) {
                Ok(partitions) => ReplicaResponse::Partitions(partitions),
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::VectorSearch(search) => match self.vector_search(&search) {
                Ok(answer) => ReplicaResponse::VectorHits(answer),
                Err(error) => ReplicaResponse::Error(error),
            },
            ReplicaRequest::PaxosPrepare { key, ballot, read } => {
                match self.paxos.prepare(self, &key, ballot, read).await {
                    Ok(promise) => ReplicaResponse::PaxosPromise(Box::new(promise)),
                    Err(error) => ReplicaResponse::Error(error),
                }
            }
            ReplicaRequest::PaxosPropose { key, proposal } => {
                match self.paxos.propose(self, &key, proposal).await {
                    Ok((accepted, promised)) => {
                        ReplicaResponse::PaxosAccepted { accepted, promised }
                    }
                    Err(error) => ReplicaResponse::Error(error),
                }
            }
            ReplicaRequest::PaxosCommit { key, proposal } => {
                match self.paxos.commit(self, &key, proposal).await {
                    Ok(()) => ReplicaResponse::Applied,
                    Err(error) => ReplicaResponse::Error(error),
                }
            }
            // Led by the node's coordinator, which the server hands these to.
            ReplicaRequest::Increment(_) => {
                ReplicaResponse::Error("counter increments are led by the coordinator".into())
            }
            // Led by the node's storage proxy ([`crate::paxos_lead`]).
            ReplicaRequest::PaxosLead(_) => ReplicaResponse::Error(
                "lightweight transactions are led by the storage proxy".into(),
            ),
        }
    }
}

/// Removes every cell of `table` from `engine` — a synced range deletion — on a blocking
/// thread, not the runtime's.
pub(crate) async fn remove_table_data(
    engine: Arc<dyn Engine>,
    table: TableId,
) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        engine
            .delete_range(&keys::table_prefix(&table), &keys::table_end(&table))
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "removing the table's data failed unexpectedly".to_string())?
}

/// The bytes of cells one read or digest covers at most: a reply stays far below the
/// internode frame limit however large the cells, and the coordinator asks for the rest
/// in further reads (an answer cut short says so: `complete` is false).
pub const READ_REPLY_BYTES: usize = 8 << 20;

/// Visits the visible cells of `[lower, upper)` in the engine, at most `limit` of them and
/// [`READ_REPLY_BYTES`] (always at least one cell); `true` if that was all of them. Reads
/// and digests both walk this way, so a digest covers exactly the cells a read returns.
fn walk_visible(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
    visit: impl FnMut(&[u8], &[u8]),
) -> Result<bool, String> {
    walk_visible_within(engine, lower, upper, limit, READ_REPLY_BYTES, visit)
}

fn walk_visible_within(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
    max_bytes: usize,
    mut visit: impl FnMut(&[u8], &[u8]),
) -> Result<bool, String> {
    let mut visited = 0u64;
    let mut bytes = 0usize;
    shoal_storage::shadow::visit_visible(
        engine,
        lower,
        upper,
        shoal_model::timestamp::now_seconds(),
        |key, value| {
            if visited >= limit as u64 || (visited > 0 && bytes >= max_bytes) {
                return false;
            }
            visit(key, value);
            visited += 1;
            bytes += key.len() + value.len();
            true
        },
    )
    .map_err(|e| e.to_string())
}

/// The visible cells of `[lower, upper)`, at most `limit`; `true` if complete.
pub fn read_visible(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
) -> Result<(Cells, bool), String> {
    let mut cells = Vec::new();
    let complete = walk_visible(engine, lower, upper, limit, |key, value| {
        cells.push((key.to_vec(), value.to_vec()))
    })?;
    Ok((cells, complete))
}

/// The last visible cells of `[lower, upper)`: the window of the last `limit` stored keys
/// (and about [`READ_REPLY_BYTES`]) before `upper`, walked backwards, then read forwards
/// for what is visible in it (deletions before the window still count). Returns the cells
/// and where the window starts (`None`: it reached `lower`, the answer is complete).
pub fn read_visible_before(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
) -> Result<(Cells, Option<Vec<u8>>), String> {
    let mut cursor = engine.scan(lower, upper, true).map_err(|e| e.to_string())?;
    let (mut taken, mut bytes) = (0u32, 0usize);
    let mut first: Option<Vec<u8>> = None;
    let mut reached_lower = true;
    while let Some((key, value)) = cursor.current() {
        if taken >= limit.max(1) || (taken > 0 && bytes >= READ_REPLY_BYTES) {
            reached_lower = false;
            break;
        }
        first = Some(key.to_vec());
        taken += 1;
        bytes += key.len() + value.len();
        cursor.advance();
    }
    cursor.status().map_err(|e| e.to_string())?;
    drop(cursor);
    let from = match (reached_lower, first) {
        (true, _) | (false, None) => lower.to_vec(),
        (false, Some(first)) => first,
    };
    let mut cells = Vec::new();
    walk_visible_within(engine, &from, upper, u32::MAX, usize::MAX, |key, value| {
        cells.push((key.to_vec(), value.to_vec()))
    })?;
    Ok((cells, (!reached_lower).then_some(from)))
}

/// Adds one cell to a digest; every digest and repair hash is built this way. (The
/// standard library's hasher: every node runs the same binary.)
pub(crate) fn hash_cell(hasher: &mut std::hash::DefaultHasher, key: &[u8], value: &[u8]) {
    use std::hash::Hash;
    key.hash(hasher);
    value.hash(hasher);
}

/// The digest of `cells` (what a replica computes with [`digest_visible`]).
pub(crate) fn cells_digest(cells: &Cells) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    for (key, value) in cells {
        hash_cell(&mut hasher, key, value);
    }
    hasher.finish()
}

/// The digest of the visible cells of `[lower, upper)`, at most `limit`, hashed as they
/// are read (nothing copied); `true` if complete.
pub fn digest_visible(
    engine: &dyn Engine,
    lower: &[u8],
    upper: &[u8],
    limit: u32,
) -> Result<(u64, bool), String> {
    let mut hasher = std::hash::DefaultHasher::new();
    let complete = walk_visible(engine, lower, upper, limit, |key, value| {
        hash_cell(&mut hasher, key, value)
    })?;
    Ok((hasher.finish(), complete))
}

/// One hash per range `[bounds[i], bounds[i+1])` over its visible cells.
pub fn range_hashes(engine: &dyn Engine, bounds: &[Vec<u8>]) -> Result<Vec<u64>, String> {
    let mut hashes = Vec::with_capacity(bounds.len().saturating_sub(1));
    for range in bounds.windows(2) {
        let mut hasher = std::hash::DefaultHasher::new();
        walk_visible(engine, &range[0], &range[1], u32::MAX, |key, value| {
            hash_cell(&mut hasher, key, value)
        })?;
        hashes.push(hasher.finish());
    }
    Ok(hashes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_model::{Cell, WriteTimestamp};
    use shoal_storage::MemoryEngine;

    fn cell(timestamp: i64, value: &[u8]) -> Vec<u8> {
        Cell::live(WriteTimestamp(timestamp), value.to_vec()).encode()
    }

    #[test]
    fn a_read_stops_at_the_reply_byte_bound_and_its_digest_covers_the_same_cells() {
        let engine = MemoryEngine::new();
        let large = vec![7u8; READ_REPLY_BYTES / 2 + 1];
        let mut batch = WriteBatch::new();
        for key in [b"a", b"b", b"c"] {
            batch.merge(key.to_vec(), cell(1, &large));
        }
        engine.write(&batch).unwrap();
        let (cells, complete) = read_visible(&engine, b"a", b"z", u32::MAX).unwrap();
        assert_eq!(cells.len(), 2, "the reply stops once past the byte bound");
        assert!(!complete, "and says it was cut short");
        assert_eq!(
            digest_visible(&engine, b"a", b"z", u32::MAX).unwrap(),
            (cells_digest(&cells), false)
        );
        // A single cell larger than the bound still comes back: progress is guaranteed.
        let (first, _) = read_visible(&engine, b"a", b"b", u32::MAX).unwrap();
        assert_eq!(first.len(), 1);
    }

    #[test]
    fn a_replica_digest_matches_the_digest_of_the_same_cells_read_as_data() {
        let engine = MemoryEngine::new();
        let mut batch = WriteBatch::new();
        for (key, value) in [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")] {
            batch.merge(key.to_vec(), cell(1, value));
        }
        engine.write(&batch).unwrap();
        let (cells, complete) = read_visible(&engine, b"a", b"z", u32::MAX).unwrap();
        assert!(complete);
        assert_eq!(
            digest_visible(&engine, b"a", b"z", u32::MAX).unwrap(),
            (cells_digest(&cells), true)
        );
        // A newer cell on one replica changes its digest.
        let mut newer = WriteBatch::new();
        newer.merge(b"b".to_vec(), cell(2, b"2"));
        engine.write(&newer).unwrap();
        assert_ne!(
            digest_visible(&engine, b"a", b"z", u32::MAX).unwrap().0,
            cells_digest(&cells)
        );
        // A limit cuts the digest short and says so.
        assert!(!digest_visible(&engine, b"a", b"z", 2).unwrap().1);
    }

    #[test]
    fn equal_data_hashes_equal_and_a_difference_shows() {
        let a = MemoryEngine::new();
        let b = MemoryEngine::new();
        let mut batch = WriteBatch::new();
        batch.merge(b"k1".to_vec(), cell(1, b"v1"));
        a.write(&batch).unwrap();
        b.write(&batch).unwrap();
        let bounds = vec![b"k".to_vec(), b"k5".to_vec(), b"l".to_vec()];
        assert_eq!(range_hashes(&a, &bounds), range_hashes(&b, &bounds));
        let mut more = WriteBatch::new();
        more.merge(b"k7".to_vec(), cell(1, b"v7"));
        b.write(&more).unwrap();
        let (ha, hb) = (
            range_hashes(&a, &bounds).unwrap(),
            range_hashes(&b, &bounds).unwrap(),
        );
        assert_eq!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1]);
    }
}
