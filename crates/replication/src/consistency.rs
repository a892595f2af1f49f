//! Consistency levels as arithmetic: how many acknowledgements a level needs, overall or
//! per datacenter, and the errors a client gets when they do not come.

use shoal_cql::request::Consistency;
use shoal_cql::{CqlError, ErrorCode};
use smallvec::{smallvec, SmallVec};
use std::time::Duration;

/// How long a write waits for the replicas its consistency level needs.
pub const WRITE_TIMEOUT: Duration = Duration::from_millis(2000);
/// How long a read waits for the replicas its consistency level needs.
pub const READ_TIMEOUT: Duration = Duration::from_millis(5000);
/// How long a chunk of a scan waits for its replicas, its turn in their read queues
/// included (Cassandra's `range_request_timeout`); a chunk still queued after this long is
/// answered with an error instead of being read, since its coordinator gave up on it.
pub const RANGE_READ_TIMEOUT: Duration = Duration::from_millis(10_000);

/// What kind of write timed out, as drivers' retry policies read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteType {
    /// One statement (one partition).
    Simple,
    /// A logged batch whose batchlog was written: it will be applied everywhere.
    Batch,
    /// An unlogged batch (or a logged one touching one partition).
    UnloggedBatch,
    /// A logged batch whose batchlog write itself timed out.
    BatchLog,
    /// A counter increment: the leader has its shard, the other replicas may not.
    Counter,
    /// A lightweight transaction's Paxos phase: its outcome is unknown.
    Cas,
}

impl WriteType {
    /// The protocol's name for it.
    pub fn name(self) -> &'static str {
        match self {
            WriteType::Simple => "SIMPLE",
            WriteType::Batch => "BATCH",
            WriteType::UnloggedBatch => "UNLOGGED_BATCH",
            WriteType::BatchLog => "BATCH_LOG",
            WriteType::Counter => "COUNTER",
            WriteType::Cas => "CAS",
        }
    }
}

/// How many acknowledgements a consistency level needs, overall or per datacenter.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    /// `(datacenter, count)`; `None` counts replicas anywhere. One entry but at
    /// `EACH_QUORUM`, kept inline: every request works one out.
    pub(crate) needs: SmallVec<[(Option<String>, usize); 1]>,
}

impl Requirement {
    /// What `consistency` needs of replicas in `datacenters` (one entry per replica the
    /// replication factor calls for), seen from `local_datacenter`.
    pub fn of(consistency: Consistency, datacenters: &[&str], local_datacenter: &str) -> Self {
        let total = datacenters.len();
        let in_dc = |dc: &str| datacenters.iter().filter(|d| **d == dc).count();
        let needs = match consistency {
            Consistency::Any | Consistency::One => smallvec![(None, 1)],
            Consistency::Two => smallvec![(None, 2)],
            Consistency::Three => smallvec![(None, 3)],
            Consistency::Quorum | Consistency::Serial => smallvec![(None, total / 2 + 1)],
            Consistency::All => smallvec![(None, total)],
            Consistency::LocalOne => smallvec![(Some(local_datacenter.to_string()), 1)],
            Consistency::LocalQuorum | Consistency::LocalSerial => smallvec![(
                Some(local_datacenter.to_string()),
                in_dc(local_datacenter) / 2 + 1,
            )],
            Consistency::EachQuorum => {
                let mut dcs: Vec<&str> = datacenters.to_vec();
                dcs.sort_unstable();
                dcs.dedup();
                dcs.into_iter()
                    .map(|dc| (Some(dc.to_string()), in_dc(dc) / 2 + 1))
                    .collect()
            }
        };
        Requirement { needs }
    }

    /// Acknowledgements needed in all.
    pub fn block_for(&self) -> usize {
        self.needs.iter().map(|(_, n)| n).sum()
    }

    /// True when acknowledgements from replicas in `datacenters` meet it.
    pub fn met_by<'a>(&self, datacenters: impl Iterator<Item = &'a str> + Clone) -> bool {
        self.needs.iter().all(|(dc, needed)| {
            let count = match dc {
                Some(dc) => datacenters.clone().filter(|d| d == dc).count(),
                None => datacenters.clone().count(),
            };
            count >= *needed
        })
    }

    /// True when a replica in `datacenter` counts towards it.
    pub fn counts(&self, datacenter: &str) -> bool {
        self.needs
            .iter()
            .any(|(dc, _)| dc.as_deref().is_none_or(|dc| dc == datacenter))
    }
}

/// `Unavailable`: fewer live replicas than `consistency` needs.
pub fn unavailable(consistency: Consistency, required: usize, alive: usize) -> CqlError {
    CqlError::new(
        ErrorCode::Unavailable {
            consistency: consistency.code(),
            required: required as i32,
            alive: alive as i32,
        },
        format!(
            "Cannot achieve consistency level {}: {required} replicas required but only {alive} alive",
            consistency.name()
        ),
    )
}

/// `WriteTimeout` with the acknowledgements received.
pub fn write_timeout(
    consistency: Consistency,
    received: usize,
    block_for: usize,
    write_type: WriteType,
) -> CqlError {
    CqlError::new(
        ErrorCode::WriteTimeout {
            consistency: consistency.code(),
            received: received as i32,
            block_for: block_for as i32,
            write_type: write_type.name().to_string(),
        },
        format!("Operation timed out - received only {received} responses."),
    )
}

/// `ReadTimeout` with the answers received.
pub fn read_timeout(
    consistency: Consistency,
    received: usize,
    block_for: usize,
    data_present: bool,
) -> CqlError {
    CqlError::new(
        ErrorCode::ReadTimeout {
            consistency: consistency.code(),
            received: received as i32,
            block_for: block_for as i32,
            data_present,
        },
        format!("Operation timed out - received only {received} responses."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_follow_the_consistency_level() {
        let three = ["dc1", "dc1", "dc1"];
        assert_eq!(
            Requirement::of(Consistency::Quorum, &three, "dc1").block_for(),
            2
        );
        assert_eq!(
            Requirement::of(Consistency::All, &three, "dc1").block_for(),
            3
        );
        assert_eq!(
            Requirement::of(Consistency::One, &three, "dc1").block_for(),
            1
        );
        let two_dcs = ["dc1", "dc1", "dc1", "dc2", "dc2"];
        let local = Requirement::of(Consistency::LocalQuorum, &two_dcs, "dc2");
        assert_eq!(local.block_for(), 2);
        assert!(!local.met_by(["dc1", "dc1", "dc1"].into_iter()));
        assert!(local.met_by(["dc2", "dc2"].into_iter()));
        let each = Requirement::of(Consistency::EachQuorum, &two_dcs, "dc1");
        assert_eq!(each.block_for(), 4);
        assert!(!each.met_by(["dc1", "dc1", "dc2"].into_iter()));
        assert!(each.met_by(["dc1", "dc1", "dc2", "dc2"].into_iter()));
    }
}
