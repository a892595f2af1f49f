//! What nodes say to one another about strong tablets: the requests a node makes of a
//! tablet group's leader (or of one member), and the replies. They travel inside the
//! internode messages ([`crate::internode::Message`]), serialized with serde.

use serde::{Deserialize, Serialize};
use shoal_consensus::runtime;
use shoal_model::HostId;
use shoal_replication::Cells;

/// A request one node makes of the leader of a strong tablet's group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StrongRequest {
    /// Propose this entry ([`machine::encode_entry`]) and answer once it is applied.
    Propose {
        group: u64,
        #[serde(with = "serde_bytes")]
        entry: Vec<u8>,
    },
    /// Read `[lower, upper)` (at most `limit` cells; with `reverse`, the last ones) once
    /// the read index is applied.
    Read {
        group: u64,
        #[serde(with = "serde_bytes")]
        lower: Vec<u8>,
        #[serde(with = "serde_bytes")]
        upper: Vec<u8>,
        limit: u32,
        reverse: bool,
    },
    /// The group's members and progress as this node sees them; with `leader_only`,
    /// answered only by the leader.
    Status { group: u64, leader_only: bool },
    /// At the leader: add or remove one member (answered once committed, or `Unknown`
    /// while the change is still committing).
    ChangeMembers {
        group: u64,
        add: Option<[u8; 16]>,
        remove: Option<[u8; 16]>,
    },
    /// Where this node's state machine stands: data read from it afterwards holds
    /// everything up to the answer's index.
    SnapshotPoint { group: u64 },
    /// Install a snapshot at `point` (the tablet's data is in place already).
    Install { group: u64, point: WireSnapshot },
    /// At the leader: lock the partition (`[lower, upper)`, of `table` at `token`) for a
    /// conditional statement, and answer with its cells and a lease ([`conditional`]).
    Lock {
        group: u64,
        table: [u8; 16],
        token: i64,
        #[serde(with = "serde_bytes")]
        lower: Vec<u8>,
        #[serde(with = "serde_bytes")]
        upper: Vec<u8>,
    },
    /// At the leader: append this entry under `lease` and answer once it is applied.
    ProposeLocked {
        group: u64,
        lease: u64,
        #[serde(with = "serde_bytes")]
        entry: Vec<u8>,
    },
    /// At the leader: end `lease` without proposing anything.
    Unlock { lease: u64 },
}

/// A [`runtime::SnapshotPoint`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireSnapshot {
    pub index: u64,
    pub term: u64,
    pub members: Vec<[u8; 16]>,
    #[serde(with = "serde_bytes")]
    pub state: Vec<u8>,
}

impl WireSnapshot {
    pub(super) fn from_point(point: runtime::SnapshotPoint) -> WireSnapshot {
        WireSnapshot {
            index: point.index.0,
            term: point.term.0,
            members: point.members.iter().map(|m| m.0).collect(),
            state: point.state.to_vec(),
        }
    }

    pub(super) fn into_point(self) -> runtime::SnapshotPoint {
        runtime::SnapshotPoint {
            index: shoal_consensus::LogIndex(self.index),
            term: shoal_consensus::Term(self.term),
            members: self.members.into_iter().map(HostId).collect(),
            state: bytes::Bytes::from(self.state),
        }
    }
}

/// One replica's view of a group, as [`StrongRequest::Status`] answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireStatus {
    pub members: Vec<[u8; 16]>,
    /// The node that answered.
    pub replica: [u8; 16],
    pub is_leader: bool,
    pub applied: u64,
    /// The last membership change is committed.
    pub members_settled: bool,
    /// On the leader: each other member and the last index it holds.
    pub matched: Vec<([u8; 16], u64)>,
    /// The split plan this member's fence serves and the group's clock where it stopped,
    /// once this member applied one.
    pub fenced: Option<(u64, i64)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum StrongReply {
    Applied,
    Cells {
        #[serde(with = "shoal_replication::messages::cells_serde")]
        cells: Cells,
        complete: bool,
    },
    /// A reverse read's cells, and where they start when cut short.
    CellsBefore {
        #[serde(with = "shoal_replication::messages::cells_serde")]
        cells: Cells,
        from: Option<Vec<u8>>,
    },
    /// This node does not lead the group (`leader`: the one it knows of); nothing was
    /// proposed, so asking again is safe.
    NotLeader {
        leader: Option<[u8; 16]>,
    },
    /// The entry was appended but the leader lost office before it committed: it may
    /// still commit under the next leader, or not.
    Unknown,
    Status(WireStatus),
    Snapshot(WireSnapshot),
    /// The request could not be served here now (no replica of the group, an earlier
    /// membership change still committing): ask again later.
    Refused(String),
    /// [`StrongRequest::Lock`]'s answer: the partition's visible cells, the lease on its
    /// lock, the leader holding it, and the write timestamp for the update.
    Locked {
        lease: u64,
        leader: [u8; 16],
        micros: i64,
        #[serde(with = "shoal_replication::messages::cells_serde")]
        cells: Cells,
    },
    /// The partition's lock did not come in time (other conditional statements hold it,
    /// or the group's entries do not commit): nothing was done.
    Busy,
    /// The lease named is not held (it expired): nothing was proposed.
    LeaseLost,
    /// The group is fenced for a split or merge: nothing was done. Asked again, the
    /// request reaches the new tablet holding it once the tablet map has it (or the group
    /// again, if the plan is abandoned).
    Fenced,
}
