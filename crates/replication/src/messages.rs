//! What a coordinator asks a replica and what the replica answers: the wire vocabulary of
//! replication, the same whether the replica is this node or another.

use serde::{Deserialize, Serialize};
use shoal_model::{TableId, TabletId, Token};

/// Cells as stored: `(key, encoded cell)`, in key order.
pub type Cells = Vec<(Vec<u8>, Vec<u8>)>;

/// [`Cells`] on the wire, for `#[serde(with = "...")]`: each key and cell as a byte
/// string. Serde's own `Vec<u8>` is a sequence of `u8`s, sent and read back one byte per
/// call — in a scan chunk of 10,000 1 KB rows, millions of calls, which `perf` showed as
/// 14% of a three-node cluster's CPU under seed 002's point/range mix. The bytes on the
/// wire are the same (bincode writes both as a length and the bytes), so nodes with and
/// without this understand each other.
pub mod cells_serde {
    use super::Cells;
    use serde::ser::SerializeSeq;
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(cells: &Cells, serializer: S) -> Result<S::Ok, S::Error> {
        let mut sequence = serializer.serialize_seq(Some(cells.len()))?;
        for (key, cell) in cells {
            sequence.serialize_element(&(Bytes::new(key), Bytes::new(cell)))?;
        }
        sequence.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Cells, D::Error> {
        let pairs = Vec::<(ByteBuf, ByteBuf)>::deserialize(deserializer)?;
        Ok(pairs
            .into_iter()
            .map(|(key, cell)| (key.into_vec(), cell.into_vec()))
            .collect())
    }
}

/// Cells packed in one buffer, `u32 key length | u32 value length | key | value` per
/// cell (lengths big-endian): one copy per cell on each side and no allocation per cell.
/// Bulk cells travel between nodes this way as the attachment of their reply frame
/// (`shoal_server::internode`), not inside its encoding: a streamed chunk's, and a scan
/// chunk's answered for another coordinator ([`ReplicaResponse::PackedScanCells`]), which
/// the replica packs on its read thread and the coordinator unpacks on its scan thread, so
/// the network tasks that also carry point reads never touch them cell by cell.
pub mod packed {
    use super::Cells;

    /// A packed cell: `(key, value)`, borrowed from its buffer.
    pub type PackedCell<'a> = (&'a [u8], &'a [u8]);

    /// Appends one cell to `buffer`.
    pub fn pack(buffer: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        buffer.reserve(8 + key.len() + value.len());
        buffer.extend_from_slice(&(key.len() as u32).to_be_bytes());
        buffer.extend_from_slice(&(value.len() as u32).to_be_bytes());
        buffer.extend_from_slice(key);
        buffer.extend_from_slice(value);
    }

    /// `cells` packed in one buffer.
    pub fn pack_all(cells: &Cells) -> Vec<u8> {
        let bytes = cells.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut buffer = Vec::with_capacity(bytes);
        for (key, value) in cells {
            pack(&mut buffer, key, value);
        }
        buffer
    }

    /// The cells packed in `buffer`; an error if it is malformed (it came from the
    /// network).
    pub fn entries(buffer: &[u8]) -> Result<Vec<PackedCell<'_>>, String> {
        let mut entries = Vec::new();
        let mut rest = buffer;
        while let Some(entry) = next(&mut rest)? {
            entries.push(entry);
        }
        Ok(entries)
    }

    /// The cells packed in `buffer`, owned; an error if it is malformed.
    pub fn unpack(buffer: &[u8]) -> Result<Cells, String> {
        let mut cells = Vec::new();
        let mut rest = buffer;
        while let Some((key, value)) = next(&mut rest)? {
            cells.push((key.to_vec(), value.to_vec()));
        }
        Ok(cells)
    }

    /// The first cell of `rest`, which then starts after it; `None` at its end.
    fn next<'a>(rest: &mut &'a [u8]) -> Result<Option<PackedCell<'a>>, String> {
        if rest.is_empty() {
            return Ok(None);
        }
        let length = |bytes: &[u8]| -> Option<usize> {
            Some(u32::from_be_bytes(bytes.try_into().ok()?) as usize)
        };
        let malformed = || "malformed packed cells".to_string();
        let key_length = rest.get(..4).and_then(length).ok_or_else(malformed)?;
        let value_length = rest.get(4..8).and_then(length).ok_or_else(malformed)?;
        let end = 8 + key_length + value_length;
        let key = rest.get(8..8 + key_length).ok_or_else(malformed)?;
        let value = rest.get(8 + key_length..end).ok_or_else(malformed)?;
        *rest = &rest[end..];
        Ok(Some((key, value)))
    }
}

/// A logged batch in a batchlog ([`crate::batchlog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchId {
    /// When it was logged, in microseconds since the epoch.
    pub written: i64,
    /// Random, so batches logged in the same microsecond differ.
    pub id: [u8; 16],
}

/// Cells read backwards in a chunk, and the key they start at (`None`: the chunk reached
/// the lower bound asked for).
pub type CellsFrom = (Cells, Option<Vec<u8>>);

/// A partition by token and serialized partition key.
pub type PartitionRef = (Token, Vec<u8>);

/// What a coordinator asks of a replica. Messages are versioned by variant: a new kind is
/// a new variant at the end.
#[derive(Debug, Serialize, Deserialize)]
pub enum ReplicaRequest {
    /// Apply these cells (a write, a read repair or a replayed hint).
    Apply(#[serde(with = "cells_serde")] Cells),
    /// The visible cells stored in `[lower, upper)`, at most `limit` of them.
    Read {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
    },
    /// Remove every cell of a table (TRUNCATE).
    Truncate(TableId),
    /// A digest of the cells `Read` would return (reads at CL > ONE ask one replica for
    /// data and the others for digests).
    Digest {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
    },
    /// A hash of the visible cells in each of the consecutive key ranges `[bounds[i],
    /// bounds[i+1])` (anti-entropy repair compares them between replicas).
    RangeHashes { bounds: Vec<Vec<u8>> },
    /// Keep a logged batch (its cells, serialized) in this node's batchlog until it is
    /// removed or replayed.
    StoreBatch {
        batch: BatchId,
        #[serde(with = "serde_bytes")]
        cells: Vec<u8>,
    },
    /// The batch was applied: drop it from the batchlog.
    RemoveBatch(BatchId),
    /// The last visible cells of `[lower, upper)`, at most `limit`, in key order (reverse
    /// scans walk a partition backwards in such chunks).
    ReadBefore {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
    },
    /// Lead these counter increments: add them to this node's shards and write the new
    /// shards to the replicas ([`crate::counter`]).
    Increment(CounterUpdate),
    /// Base partitions with an entry in a local secondary index, up to token `upto`
    /// ([`crate::index`]).
    IndexLookup {
        lookup: crate::index::IndexLookup,
        upto: Token,
    },
    /// The partitions nearest to a vector, from a local vector index ([`crate::index`]).
    VectorSearch(crate::index::VectorSearch),
    /// Promise `ballot` for the partition ([`crate::paxos`]); with `read`, answer with
    /// the partition's cells too, read under the promise.
    PaxosPrepare {
        key: crate::paxos::PaxosKey,
        ballot: crate::paxos::Ballot,
        read: bool,
    },
    /// Accept the proposal unless a higher ballot was promised.
    PaxosPropose {
        key: crate::paxos::PaxosKey,
        proposal: crate::paxos::Proposal,
    },
    /// Apply the decided update and remember it as the latest commit.
    PaxosCommit {
        key: crate::paxos::PaxosKey,
        proposal: crate::paxos::Proposal,
    },
    /// Lead a step of another coordinator's lightweight transaction on a partition this
    /// node is the first replica of ([`crate::paxos_lead`]).
    PaxosLead(crate::paxos_lead::LeadRequest),
    /// One chunk of a scan: what `Read` answers, served in the scan's turn
    /// ([`ScanTicket`]) rather than at once.
    ScanChunk {
        lower: Vec<u8>,
        upper: Vec<u8>,
        limit: u32,
        scan: ScanTicket,
    },
}

/// Which scan a chunk belongs to. Every node serves the chunks of scans by their tickets,
/// not by when each chunk arrived, so that all nodes give the same scan its turn and scans
/// finish one after another instead of all progressing together (seed 002; the read
/// scheduler, `shoal_coordinator::schedule`, orders them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScanTicket {
    /// When the coordinator began the scan, in microseconds since the epoch.
    pub started_micros: u64,
    /// Random: scans begun in the same microsecond are still ordered alike everywhere.
    pub id: u64,
    /// The share of the token ring the scan may cover, in 64ths (1 to 64): a scan over
    /// fewer tablets is narrower.
    pub width: u32,
    /// The rows it may return.
    pub limit: u64,
}

impl ScanTicket {
    /// A ticket for a scan beginning now.
    pub fn now(width: u32, limit: u64) -> ScanTicket {
        let started_micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        ScanTicket {
            started_micros,
            id: rand::random(),
            width: width.clamp(1, 64),
            limit: limit.max(1),
        }
    }
}

/// Counter increments of one partition, for its leader: each a delta cell's key (the
/// counter column's key with an empty cell path) and the delta, and the consistency level
/// (its protocol code) the leader must meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterUpdate {
    pub deltas: Vec<(Vec<u8>, i64)>,
    pub consistency: u16,
}

impl ReplicaRequest {
    /// The request as a trace event names it.
    pub fn describe(&self) -> String {
        match self {
            ReplicaRequest::Apply(cells) => format!("MUTATION of {} cells", cells.len()),
            ReplicaRequest::Read { limit, .. } => format!("READ of up to {limit} cells"),
            ReplicaRequest::Truncate(_) => "TRUNCATE".into(),
            ReplicaRequest::Digest { limit, .. } => format!("DIGEST READ of up to {limit} cells"),
            ReplicaRequest::RangeHashes { bounds } => {
                format!("REPAIR HASHES of {} ranges", bounds.len().saturating_sub(1))
            }
            ReplicaRequest::StoreBatch { .. } => "BATCH_STORE".into(),
            ReplicaRequest::RemoveBatch(_) => "BATCH_REMOVE".into(),
            ReplicaRequest::ReadBefore { limit, .. } => {
                format!("REVERSED READ of up to {limit} cells")
            }
            ReplicaRequest::Increment(update) => {
                format!("COUNTER_MUTATION of {} counters", update.deltas.len())
            }
            ReplicaRequest::IndexLookup { lookup, .. } => {
                format!("INDEX LOOKUP of up to {} partitions", lookup.limit)
            }
            ReplicaRequest::VectorSearch(search) => {
                format!("VECTOR SEARCH of up to {} partitions", search.limit)
            }
            ReplicaRequest::PaxosPrepare { .. } => "PAXOS_PREPARE".into(),
            ReplicaRequest::PaxosPropose { .. } => "PAXOS_PROPOSE".into(),
            ReplicaRequest::PaxosCommit { proposal, .. } => {
                format!("PAXOS_COMMIT of {} cells", proposal.update.len())
            }
            ReplicaRequest::PaxosLead(lead) => match lead {
                crate::paxos_lead::LeadRequest::Prepare { .. } => "PAXOS_LEAD_PREPARE".into(),
                crate::paxos_lead::LeadRequest::Propose { .. } => "PAXOS_LEAD_PROPOSE".into(),
                crate::paxos_lead::LeadRequest::Release { .. } => "PAXOS_LEAD_RELEASE".into(),
            },
            ReplicaRequest::ScanChunk { limit, .. } => {
                format!("RANGE READ of up to {limit} cells")
            }
        }
    }
}

impl ReplicaResponse {
    /// A scan chunk's answer as it leaves for another coordinator: its cells [`packed`]
    /// (`PackedScanCells`). Any other answer is left as it is.
    pub fn into_packed_chunk(self) -> ReplicaResponse {
        let (cells, complete, estimates) = match self {
            ReplicaResponse::ScanCells {
                cells,
                complete,
                estimates,
            } => (cells, complete, Some(estimates)),
            ReplicaResponse::Cells { cells, complete } => (cells, complete, None),
            other => return other,
        };
        ReplicaResponse::PackedScanCells {
            cells: packed::pack_all(&cells).into(),
            complete,
            estimates,
        }
    }

    /// The answer as a trace event names it.
    pub fn describe(&self) -> String {
        match self {
            ReplicaResponse::Applied => "applied".into(),
            ReplicaResponse::Cells { cells, complete }
            | ReplicaResponse::ScanCells {
                cells, complete, ..
            } => format!(
                "{} cells{}",
                cells.len(),
                if *complete { "" } else { " (limit reached)" }
            ),
            ReplicaResponse::PackedScanCells {
                cells, complete, ..
            } => format!(
                "{} cells{}",
                packed::entries(cells).map_or(0, |entries| entries.len()),
                if *complete { "" } else { " (limit reached)" }
            ),
            ReplicaResponse::Hashes(hashes) => format!("{} hashes", hashes.len()),
            ReplicaResponse::Digest { .. } => "a digest".into(),
            ReplicaResponse::Error(error) => format!("an error: {error}"),
            ReplicaResponse::CellsFrom { cells, .. } => format!("{} cells", cells.len()),
            ReplicaResponse::Partitions(partitions) => format!("{} partitions", partitions.len()),
            ReplicaResponse::VectorHits(answer) => {
                format!("{} nearest partitions", answer.hits.len())
            }
            ReplicaResponse::PaxosPromise(promise) if promise.promised => "a promise".into(),
            ReplicaResponse::PaxosPromise(_) => "a refusal (a higher ballot came first)".into(),
            ReplicaResponse::PaxosAccepted { accepted: true, .. } => "accepted".into(),
            ReplicaResponse::PaxosAccepted { .. } => "refused (a higher ballot came first)".into(),
            ReplicaResponse::PaxosLed(led) => match led {
                crate::paxos_lead::LeadResponse::Prepared { round: Ok(_), .. } => {
                    "a prepared round".into()
                }
                crate::paxos_lead::LeadResponse::Proposed(Ok(outcome)) => {
                    format!("a proposal {outcome:?}")
                }
                crate::paxos_lead::LeadResponse::Prepared { round: Err(e), .. }
                | crate::paxos_lead::LeadResponse::Proposed(Err(e)) => {
                    format!("an error: {}", e.message)
                }
                crate::paxos_lead::LeadResponse::Released => "released".into(),
            },
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ReplicaResponse {
    Applied,
    /// The cells read; `complete` is false when `limit` cut the range short.
    Cells {
        #[serde(with = "cells_serde")]
        cells: Cells,
        complete: bool,
    },
    /// One hash per range asked for.
    Hashes(Vec<u64>),
    /// The digest of the cells read; `complete` as for `Cells`.
    Digest {
        hash: u64,
        complete: bool,
    },
    Error(String),
    /// The answer to `ReadBefore`: the cells of `[from, upper)` (`from: None`: of the
    /// whole `[lower, upper)`).
    CellsFrom {
        #[serde(with = "cells_serde")]
        cells: Cells,
        from: Option<Vec<u8>>,
    },
    /// Base partitions, in token order (the answer to `IndexLookup`).
    Partitions(Vec<PartitionRef>),
    /// The answer to `VectorSearch`: partitions best first, with their scores.
    VectorHits(crate::index::VectorAnswer),
    /// The answer to `PaxosPrepare`.
    PaxosPromise(Box<crate::paxos::Promise>),
    /// The answer to `PaxosPropose`: whether it was accepted, and the highest ballot
    /// the replica has promised.
    PaxosAccepted {
        accepted: bool,
        promised: crate::paxos::Ballot,
    },
    /// The answer to `PaxosLead`.
    PaxosLed(crate::paxos_lead::LeadResponse),
    /// The answer to `ScanChunk`: the cells read as for `Cells`, and what the replica
    /// holds of the table's tablets (seed 002's piggybacked estimates).
    ScanCells {
        #[serde(with = "cells_serde")]
        cells: Cells,
        complete: bool,
        estimates: std::sync::Arc<TabletCells>,
    },
    /// The answer to another coordinator's `ScanChunk`: `ScanCells` (or `Cells`, without
    /// `estimates`) with its cells [`packed`] by the replica's read thread. They are not
    /// part of the encoding: between nodes they travel as the reply's attachment.
    PackedScanCells {
        #[serde(skip)]
        cells: bytes::Bytes,
        complete: bool,
        estimates: Option<std::sync::Arc<TabletCells>>,
    },
}

/// A replica's estimate of the cells it holds in each of a table's tablets that it
/// replicates. A coordinator sizes a scan's parallel fetches by them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TabletCells {
    pub table: TableId,
    pub tablets: Vec<(TabletId, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_cells_round_trip_and_malformed_buffers_are_refused() {
        let cells: Cells = vec![
            (b"key-1".to_vec(), b"value".to_vec()),
            (b"k2".to_vec(), Vec::new()),
        ];
        let buffer = packed::pack_all(&cells);
        assert_eq!(packed::unpack(&buffer).unwrap(), cells);
        assert_eq!(
            packed::entries(&buffer).unwrap(),
            vec![(&b"key-1"[..], &b"value"[..]), (&b"k2"[..], &b""[..])]
        );
        for cut in 1..buffer.len() {
            if cut != 8 + 5 + 5 {
                assert!(packed::unpack(&buffer[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut huge = buffer.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(packed::entries(&huge).is_err());
    }

    #[test]
    fn a_scan_chunk_for_another_coordinator_is_packed_with_what_it_said() {
        let cells: Cells = vec![(b"k".to_vec(), b"v".to_vec())];
        let estimates = std::sync::Arc::new(TabletCells {
            table: TableId([3; 16]),
            tablets: vec![(TabletId(0), 7)],
        });
        let answer = ReplicaResponse::ScanCells {
            cells: cells.clone(),
            complete: false,
            estimates: std::sync::Arc::clone(&estimates),
        };
        let ReplicaResponse::PackedScanCells {
            cells: packed_cells,
            complete,
            estimates: packed_estimates,
        } = answer.into_packed_chunk()
        else {
            panic!("a scan chunk's answer is packed");
        };
        assert_eq!(packed::unpack(&packed_cells).unwrap(), cells);
        assert!(!complete);
        assert_eq!(packed_estimates.as_deref(), Some(&*estimates));
        let error = ReplicaResponse::Error("no".into()).into_packed_chunk();
        assert!(matches!(error, ReplicaResponse::Error(_)), "left as it is");
    }

    /// The plain encoding nodes without `cells_serde` used.
    #[derive(Serialize, Deserialize)]
    struct PlainCells(Cells);

    fn cells() -> Cells {
        vec![
            (b"key one".to_vec(), vec![0, 1, 2, 255]),
            (Vec::new(), b"an empty key".to_vec()),
            (vec![7; 300], Vec::new()),
        ]
    }

    #[test]
    fn cells_travel_as_the_same_bytes_as_before_and_come_back_whole() {
        let cells = cells();
        let response = ReplicaResponse::Cells {
            cells: cells.clone(),
            complete: true,
        };
        let encoded = bincode::serialize(&response).unwrap();
        // The variant tag (u32), then the cells exactly as plain serde wrote them.
        let plain = bincode::serialize(&PlainCells(cells.clone())).unwrap();
        assert_eq!(&encoded[4..4 + plain.len()], &plain[..]);
        match bincode::deserialize(&encoded).unwrap() {
            ReplicaResponse::Cells {
                cells: decoded,
                complete,
            } => {
                assert_eq!(decoded, cells);
                assert!(complete);
            }
            other => panic!("decoded as {other:?}"),
        }
        // And a node without `cells_serde` reads what this one sends.
        let request = bincode::serialize(&ReplicaRequest::Apply(cells.clone())).unwrap();
        let PlainCells(read) = bincode::deserialize(&request[4..]).unwrap();
        assert_eq!(read, cells);
    }

    #[test]
    fn truncated_cells_are_an_error_not_a_panic() {
        let encoded = bincode::serialize(&ReplicaRequest::Apply(cells())).unwrap();
        for cut in [5, 13, encoded.len() - 1] {
            assert!(bincode::deserialize::<ReplicaRequest>(&encoded[..cut]).is_err());
        }
    }
}
