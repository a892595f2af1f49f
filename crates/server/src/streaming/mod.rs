//! Streaming: moving a tablet's data to the node taking it over, as files, at a rate that
//! yields to client requests (seed 004).
//!
//! - The **destination** ([`incoming`]) pulls the tablet's key range from its source(s)
//!   in chunks of a couple of MiB and ingests them as sorted files
//!   ([`shoal_storage::Engine::ingest`]): no memtable, no write-ahead log, no compaction
//!   of the data on the way in.
//! - The **source** ([`outgoing`]) reads the range from one consistent view, front to back
//!   (sequential reads, block cache left alone), a thread per session reading ahead of
//!   the destination.
//! - Both sides run on the **streaming lane**: internode connections of their own (a
//!   second [`Peers`]), so multi-MiB chunks never queue in front of the small messages
//!   client requests wait for, served on both nodes by a runtime of their own
//!   ([`lane`]) whose one thread has streaming's lower priority.
//! - Both sides take every chunk's bytes from the node's [`throttle::Throttle`], whose
//!   rate the [`policy`] sets every 250 ms (and, on an idle node, as soon as requests
//!   come) from the latency of the client requests the node serves: full speed when
//!   idle, backing off when clients slow down, never above
//!   `stream_throughput_mib_per_s` (nor, while clients are served,
//!   `stream_throughput_under_load_mib_per_s`).
//! - The CPU work of streaming — reading the source's range, building and ingesting the
//!   destination's files — runs on threads of its own at a lower operating-system priority
//!   (`stream_nice`, [`shoal_coordinator::schedule::lower_thread_priority`]): when client
//!   requests want the CPU they get it first, and streaming takes what is left.
//!
//! Writes that arrive while a tablet streams reach the destination through the normal
//! write path (the tablet is in `WriteBoth`), so nothing written after the source's view
//! was taken is missed; what is in both reconciles by last-write-wins.
//!
//! A tablet's **Paxos state** moves with its data: after the cells, the destination pulls
//! the state the source keeps of the tablet's partitions (promises, accepted proposals,
//! latest commits) and joins it into its own, partition by partition, under the Paxos
//! lock ([`shoal_replication::LocalReplica::absorb_paxos_state`]). Without it, a proposal
//! a quorum of the old replicas accepted but nobody committed would be invisible to a
//! quorum of the new ones, which could then decide something else.

mod cpu;
pub mod incoming;
pub mod lane;
pub mod outgoing;
pub mod policy;
pub mod throttle;

use crate::internode::Peers;
use bytes::Bytes;
use incoming::{Incoming, IncomingStatus, Receive};
use outgoing::{Outgoing, OutgoingStatus};
use policy::{Decision, Measurement, StreamPolicy, POLICY_INTERVAL};
use serde::{Deserialize, Serialize};
use shoal_model::{keys, TableId, TabletId, Token};
use shoal_placement::MigrationId;
use shoal_replication::{paxos, LocalReplica};
use std::net::SocketAddr;
use std::sync::Arc;
use throttle::Throttle;

/// Cells of a range, in key order, as stored, packed in one buffer
/// ([`shoal_replication::messages::packed`]).
///
/// Between nodes the cells travel as the attachment of their reply frame
/// ([`crate::internode`]), not inside its encoding: the source's buffer is written to the
/// socket as it is, and the destination's chunk is a slice of the frame it read. A chunk's
/// megabytes are never copied into or out of an encoding.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Chunk {
    #[serde(skip)]
    pub cells: Bytes,
    /// The last chunk of the range.
    pub done: bool,
}

impl Chunk {
    /// Bytes of the packed cells.
    pub fn bytes(&self) -> usize {
        self.cells.len()
    }
}

/// What a replica holds of one tablet: its table's cells in the tablet's token range
/// `(after, last]`, and the Paxos state of those partitions, which moves with them
/// ([`shoal_replication::paxos::state_range`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletKeys {
    pub table: TableId,
    pub after: Option<Token>,
    pub last: Token,
}

impl TabletKeys {
    /// The range of the tablet's cells.
    pub fn data(&self) -> (Vec<u8>, Vec<u8>) {
        keys::token_range(&self.table, self.after, self.last)
    }

    /// The range holding the Paxos state of the tablet's partitions (other tables' too:
    /// pick with [`shoal_replication::paxos::is_state_of`]).
    pub fn paxos_state(&self) -> (Vec<u8>, Vec<u8>) {
        paxos::state_range(self.after, self.last)
    }
}

/// What the migration driver and streaming destinations ask a node.
#[derive(Debug, Serialize, Deserialize)]
pub enum StreamRequest {
    /// Source: read `[lower, upper)` from one consistent view; with `paxos_of`, only the
    /// Paxos state of that table's partitions in it.
    Open {
        lower: Vec<u8>,
        upper: Vec<u8>,
        paxos_of: Option<TableId>,
    },
    /// Source: the next chunk of a session.
    Next { session: u64 },
    /// Source: end a session early.
    Close { session: u64 },
    /// Pending replica, before it receives writes: remove whatever an earlier stay left of
    /// the tablet; with `stage_writes`, set the writes it is about to receive aside until
    /// the tablet's data has streamed in (`Engine::stage_writes`): a tablet that arrives by
    /// [`StreamRequest::Receive`], whose end releases them.
    Prepare {
        tablet: TabletKeys,
        stage_writes: bool,
    },
    /// Pending replica: receive a tablet from `sources` (start or keep waiting for it).
    Receive {
        migration: MigrationId,
        tablet: TabletId,
        keys: TabletKeys,
        sources: Vec<SocketAddr>,
    },
    /// Leaving replica, once nobody reads or writes it: drop the tablet.
    Drop { tablet: TabletKeys },
}

#[derive(Debug, Serialize, Deserialize)]
pub enum StreamReply {
    Opened {
        session: u64,
        estimate: u64,
    },
    Chunk(Chunk),
    /// How far a `Receive` got.
    Received {
        done: bool,
        bytes: u64,
    },
    Done,
}

/// A node's streams, as `shoal admin streams` shows them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamsStatus {
    pub incoming: Vec<IncomingStatus>,
    pub outgoing: Vec<OutgoingStatus>,
    /// The throttle's rate now (bytes per second; `None`: unlimited).
    pub rate_bytes_per_s: Option<u64>,
    /// Why.
    pub policy: String,
    /// Bytes streamed through this node since it started.
    pub total_bytes: u64,
}

/// This node's streaming: both sides, the throttle and its policy.
pub struct Streaming {
    /// This node as a replica: its engine, and its Paxos state that moves with tablets.
    replica: Arc<LocalReplica>,
    pub incoming: Arc<Incoming>,
    pub outgoing: Outgoing,
    pub throttle: Arc<Throttle>,
    policy: StreamPolicy,
    /// Where the streaming lane's connections and the destination's jobs run.
    runtime: lane::LaneRuntime,
}

/// The first bytes of a key, as hex (to show where a range starts).
pub(crate) fn hex_prefix(key: &[u8]) -> String {
    key.iter().take(24).map(|b| format!("{b:02x}")).collect()
}

impl Streaming {
    /// This node's streaming over `lane` (a [`Peers::for_streaming_lane`]), its work at
    /// niceness `nice`.
    pub fn new(
        replica: Arc<LocalReplica>,
        lane: Arc<Peers>,
        policy: StreamPolicy,
        nice: u8,
    ) -> std::io::Result<Streaming> {
        let throttle = Arc::new(Throttle::new(policy.cap_bytes_per_s));
        let runtime = lane::LaneRuntime::start(nice)?;
        Ok(Streaming {
            incoming: Arc::new(Incoming::new(
                Arc::clone(&replica),
                Arc::clone(&throttle),
                lane,
                nice,
                runtime.handle().clone(),
            )),
            outgoing: Outgoing::new(Arc::clone(&replica.engine), Arc::clone(&throttle), nice),
            replica,
            throttle,
            policy,
            runtime,
        })
    }

    /// The runtime the streaming lane's connections are served on.
    pub fn lane_runtime(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// Ends every stream and connection of the lane (the node is stopping).
    pub fn stop(&self) {
        self.runtime.stop();
    }

    /// Indexes tablets streamed in with this node's secondary indexes.
    pub fn set_indexes(&self, indexes: Arc<dyn shoal_replication::index::LocalIndexes>) {
        self.incoming.set_indexes(indexes);
    }

    /// Answers a streaming request from a peer.
    pub async fn handle(&self, request: StreamRequest) -> Result<StreamReply, String> {
        match request {
            StreamRequest::Open {
                lower,
                upper,
                paxos_of,
            } => {
                let (session, estimate) = self.outgoing.open(lower, upper, paxos_of)?;
                Ok(StreamReply::Opened { session, estimate })
            }
            StreamRequest::Next { session } => {
                Ok(StreamReply::Chunk(self.outgoing.next(session).await?))
            }
            StreamRequest::Close { session } => {
                self.outgoing.close(session);
                Ok(StreamReply::Done)
            }
            StreamRequest::Prepare {
                tablet,
                stage_writes,
            } => self.clear(tablet, stage_writes).await,
            StreamRequest::Drop { tablet } => self.clear(tablet, false).await,
            StreamRequest::Receive {
                migration,
                tablet,
                keys,
                sources,
            } => {
                let (done, bytes) = self
                    .incoming
                    .receive(Receive {
                        migration,
                        tablet,
                        keys,
                        sources,
                    })
                    .await?;
                Ok(StreamReply::Received { done, bytes })
            }
        }
    }

    /// Removes the tablet's cells and Paxos state from this node (`Prepare`, `Drop`); with
    /// `stage_writes`, then stages the writes to its range.
    async fn clear(&self, tablet: TabletKeys, stage_writes: bool) -> Result<StreamReply, String> {
        let engine = Arc::clone(&self.replica.engine);
        let (lower, upper) = tablet.data();
        tokio::task::spawn_blocking(move || {
            engine.delete_range(&lower, &upper)?;
            if stage_writes {
                engine.stage_writes(&lower, &upper)?;
            }
            Ok::<_, shoal_storage::StorageError>(())
        })
        .await
        .map_err(|e| format!("removing the range failed: {e}"))?
        .map_err(|e| e.to_string())?;
        paxos::forget_state(&self.replica, tablet.table, tablet.after, tablet.last).await?;
        Ok(StreamReply::Done)
    }

    pub fn status(&self) -> StreamsStatus {
        let decision = self.throttle.last_decision();
        StreamsStatus {
            incoming: self.incoming.status(),
            outgoing: self.outgoing.status(),
            rate_bytes_per_s: (decision.bytes_per_s != policy::UNLIMITED)
                .then_some(decision.bytes_per_s),
            policy: decision.reason.describe().to_string(),
            total_bytes: self.throttle.total_bytes(),
        }
    }

    /// Sets the throttle's rate from the client latency every [`POLICY_INTERVAL`], for as
    /// long as the node runs. `foreground` gives the cumulative count of client requests
    /// per latency bucket `(upper bound in seconds, count)`.
    pub async fn run_policy(self: Arc<Self>, foreground: impl Fn() -> Vec<(f64, u64)>) {
        let mut previous = foreground();
        let mut previous_bytes = self.throttle.total_bytes();
        let mut previous_cpu = cpu::CpuTimes::now();
        let mut previous_at = tokio::time::Instant::now();
        let mut last_logged: Option<Decision> = None;
        let mut baseline = policy::Baseline::default();
        loop {
            let idle = self.throttle.last_decision().reason == policy::Reason::Idle;
            next_decision_due(idle, previous_at, &previous, &foreground).await;
            let now = foreground();
            let bytes = self.throttle.total_bytes();
            let measured = measure(
                &previous,
                &now,
                bytes - previous_bytes,
                previous_at.elapsed(),
            );
            previous_at = tokio::time::Instant::now();
            let cpu = cpu::CpuTimes::now();
            let cpu_busy = cpu
                .zip(previous_cpu)
                .and_then(|(now, then)| now.busy_since(&then));
            previous = now;
            previous_bytes = bytes;
            previous_cpu = cpu;
            let decision = self
                .policy
                .decide(self.throttle.rate(), &measured, &baseline);
            baseline.observe(&measured);
            self.throttle.set(decision);
            let streaming = measured.streamed_bytes_per_s > 0;
            if streaming && last_logged.map(|d| d.reason) != Some(decision.reason) {
                tracing::info!(
                    rate_mib_per_s = (decision.bytes_per_s != policy::UNLIMITED)
                        .then_some(decision.bytes_per_s >> 20),
                    client_p99_ms = measured.p99.map(|p| p.as_secs_f64() * 1000.0),
                    target_p99_ms = self.policy.target(&baseline).as_secs_f64() * 1000.0,
                    streamed_mib_per_s = measured.streamed_bytes_per_s >> 20,
                    cpu_busy_percent = cpu_busy.map(|busy| (busy * 100.0).round()),
                    "streaming rate: {}",
                    decision.reason.describe()
                );
                last_logged = Some(decision);
            }
        }
    }
}

/// Waits until the policy should decide again: [`POLICY_INTERVAL`] after the last
/// decision (`since`) — or, while the node is `idle` and streaming may go at full speed,
/// as soon as a request comes (looked for every [`IDLE_CHECK`]). A node that has just
/// started is idle, and the first requests it serves are often a join's: the writes it
/// takes as a pending replica, right before its tablets start streaming in. Seen only at the end
/// of the interval, they left it pulling from all its sources at full speed for up to a
/// quarter second under load: 280 MiB/s over a join's first interval against a limit
/// under load of 80 (`bench/results/2026-11-29-idle-check-1`).
async fn next_decision_due(
    idle: bool,
    since: tokio::time::Instant,
    before: &[(f64, u64)],
    foreground: &impl Fn() -> Vec<(f64, u64)>,
) {
    let due = since + POLICY_INTERVAL;
    if !idle {
        tokio::time::sleep_until(due).await;
        return;
    }
    while tokio::time::Instant::now() < due {
        tokio::time::sleep(IDLE_CHECK.min(due - tokio::time::Instant::now())).await;
        if requests_between(before, &foreground()) > 0 {
            return;
        }
    }
}

/// How often an idle node looks for requests between decisions.
const IDLE_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Requests counted in `after`'s cumulative buckets but not yet in `before`'s.
fn requests_between(before: &[(f64, u64)], after: &[(f64, u64)]) -> u64 {
    let before: u64 = before.iter().map(|(_, count)| count).sum();
    let after: u64 = after.iter().map(|(_, count)| count).sum();
    after.saturating_sub(before)
}

/// What one interval of `elapsed` saw, from the cumulative latency buckets before and
/// after it.
fn measure(
    before: &[(f64, u64)],
    after: &[(f64, u64)],
    streamed_bytes: u64,
    elapsed: std::time::Duration,
) -> Measurement {
    let counts: Vec<(f64, u64)> = after
        .iter()
        .zip(before.iter().map(|(_, c)| *c).chain(std::iter::repeat(0)))
        .map(|((bound, now), then)| (*bound, now.saturating_sub(then)))
        .collect();
    let requests: u64 = counts.iter().map(|(_, c)| c).sum();
    let p99 = (requests > 0).then(|| {
        let wanted = (requests as f64 * 0.99).ceil() as u64;
        let mut seen = 0;
        let bound = counts
            .iter()
            .find_map(|(bound, count)| {
                seen += count;
                (seen >= wanted).then_some(*bound)
            })
            .unwrap_or(f64::MAX);
        std::time::Duration::from_secs_f64(bound.min(3600.0))
    });
    // Never less than a millisecond: a rate from a sliver of time would be noise.
    let seconds = elapsed.as_secs_f64().max(0.001);
    Measurement {
        requests,
        p99,
        streamed_bytes_per_s: (streamed_bytes as f64 / seconds) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_measured_from_the_difference_of_cumulative_buckets() {
        let before = vec![(0.001, 100), (0.01, 10), (1.0, 0)];
        let after = vec![(0.001, 190), (0.01, 19), (1.0, 1)];
        let measured = measure(&before, &after, 1 << 20, POLICY_INTERVAL);
        assert_eq!(measured.requests, 100);
        assert_eq!(measured.p99, Some(std::time::Duration::from_secs_f64(0.01)));
        assert_eq!(measured.streamed_bytes_per_s, 4 << 20);
        // A shorter interval (an idle node deciding early) counts its bytes per second.
        let early = measure(&before, &after, 1 << 20, POLICY_INTERVAL / 5);
        assert_eq!(early.streamed_bytes_per_s, 20 << 20);
        let idle = measure(&after, &after, 0, POLICY_INTERVAL);
        assert_eq!((idle.requests, idle.p99), (0, None));
    }

    /// Cumulative buckets that count `requests` once the clock passes `from`.
    fn requests_from(from: tokio::time::Instant, requests: u64) -> impl Fn() -> Vec<(f64, u64)> {
        move || {
            let counted = if tokio::time::Instant::now() >= from {
                requests
            } else {
                0
            };
            vec![(0.001, counted), (1.0, 0)]
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_node_decides_as_soon_as_requests_come_and_a_busy_one_every_interval() {
        let start = tokio::time::Instant::now();
        let nothing = vec![(0.001, 0), (1.0, 0)];
        // Idle, and the first requests come 30 ms in: decided within a check of them.
        let first_requests = start + std::time::Duration::from_millis(30);
        next_decision_due(true, start, &nothing, &requests_from(first_requests, 3)).await;
        let waited = start.elapsed();
        assert!(
            waited >= std::time::Duration::from_millis(30)
                && waited <= std::time::Duration::from_millis(30) + IDLE_CHECK,
            "{waited:?}"
        );
        // Idle and nothing comes: the whole interval.
        let start = tokio::time::Instant::now();
        next_decision_due(
            true,
            start,
            &nothing,
            &requests_from(start + POLICY_INTERVAL * 4, 3),
        )
        .await;
        assert_eq!(start.elapsed(), POLICY_INTERVAL);
        // Busy: the whole interval, however many requests come meanwhile.
        let start = tokio::time::Instant::now();
        next_decision_due(false, start, &nothing, &requests_from(start, 3)).await;
        assert_eq!(start.elapsed(), POLICY_INTERVAL);
    }
}
