//! Replication: how a table's cells reach its replicas and come back, at the consistency
//! level each request asks for (seed 000). The coordinator's statement code reaches all of
//! it through one trait, [`Replication`]; what is below it is Cassandra's storage proxy,
//! named as in Scylla's `service/storage_proxy`, `replica/`, `db/hints` and `repair/`:
//!
//! - [`strategy`] — the [`Replication`] trait and its strategies: [`StorageProxy`]
//!   (leaderless, every real node) and [`LocalReplication`] (one node, no cluster).
//! - [`consistency`] — consistency levels as arithmetic ([`Requirement`]), timeouts and
//!   the errors clients get (`Unavailable`, `WriteTimeout`, `ReadTimeout`).
//! - [`topology`] — which replicas hold a key ([`Topology`]: the cluster as applied here;
//!   [`Replica`], with the failure detector's view).
//! - [`proxy`] — [`StorageProxy`] and the one path to a replica, local or remote
//!   ([`StorageProxy::call`]); [`write`] fans writes out, [`read`] does digest and full
//!   reads with read repair, [`reconcile`] merges answers, [`range`] scans across
//!   tablets (as many at once as [`estimates`] of their cells say the LIMIT needs),
//!   [`truncate`] clears a table everywhere.
//! - [`barrier`] — topology barriers: the epochs of requests under way and the fence
//!   that keeps stale coordinators out while tablets move.
//! - [`replica`] — the replica side: [`LocalReplica`] answers [`messages`] from any
//!   coordinator, through the node's [`WriteLog`] for writes.
//! - [`hints`] — writes kept for replicas that are down, replayed when they return.
//! - [`paxos`] — lightweight transactions: Paxos rounds over a partition's replicas
//!   (`IF` conditions, `SERIAL` reads).
//! - [`counter`] — which replica leads a counter increment, and forwarding it there.
//! - [`index`] — local secondary indexes: entries written with the cells they index,
//!   candidates looked up across tablets.
//! - [`batchlog`] — logged batches kept on other nodes until applied, so a batch over
//!   several replica sets is applied everywhere or nowhere.
//! - [`repair`] — anti-entropy repair by segment hashes.
//! - [`transport`] — how peers are reached ([`ReplicaTransport`]) and which are up
//!   ([`Liveness`]): the server implements them over internode messaging.
//!
//! Nothing here owns a socket or a thread: I/O happens behind the transport and the write
//! log, so the whole layer runs in tests against an in-memory transport and a paused clock:
//! the golden scripts in `src/testscripts/`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod barrier;
pub mod batchlog;
pub mod consistency;
pub mod counter;
pub mod estimates;
pub mod hints;
pub mod index;
pub mod messages;
pub mod paxos;
pub mod paxos_lead;
pub mod proxy;
pub mod range;
pub mod read;
pub mod reconcile;
pub mod repair;
pub mod replica;
pub mod strategy;
pub mod topology;
pub mod transport;
pub mod truncate;
pub mod write;

#[cfg(test)]
mod tests;

pub use barrier::TopologyGuard;
pub use consistency::{Requirement, WriteType, RANGE_READ_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT};
pub use hints::{HintRefused, Hints};
pub use messages::{
    BatchId, Cells, CounterUpdate, PartitionRef, ReplicaRequest, ReplicaResponse, ScanTicket,
};
pub use proxy::StorageProxy;
pub use read::PartitionSource;
pub use repair::RepairReport;
pub use replica::{ImmediateWriteLog, LocalReplica, ScanStage, WriteLog};
pub use strategy::{LocalReplication, Replication, ScanSource};
pub use topology::{Replica, Topology};
pub use transport::{Liveness, ReplicaTransport};
