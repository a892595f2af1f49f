//! Query tracing, as Cassandra's `TRACING ON` and `nodetool settraceprobability` give it.
//!
//! A request is traced when its client asks (the frame's tracing flag) or when the node
//! samples it ([`Sampler`], the probability `shoal admin settraceprobability` sets). The
//! server then runs the request inside [`Trace::scope`]; anything below — the
//! coordinator's plan, the storage proxy sending a message to a replica, this node's
//! replica applying cells — calls [`event`] and, only when the running request is traced,
//! an event is recorded with the time since the request started. Untraced requests pay
//! one task-local lookup per event site and build no text: `event` takes a closure.
//!
//! A finished [`Trace`] is written by the coordinator to `system_traces.sessions` and
//! `system_traces.events`, where drivers and cqlsh read it.
//!
//! ```
//! # tokio_test_block_on(async {
//! let trace = shoal_trace::Trace::start();
//! let answer = trace.clone().scope(async {
//!     shoal_trace::event(|| "Reading the partition".to_string());
//!     42
//! }).await;
//! assert_eq!(answer, 42);
//! assert_eq!(trace.events()[0].activity, "Reading the partition");
//! shoal_trace::event(|| unreachable!("not traced here"));
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

#![cfg_attr(test, allow(clippy::unwrap_used))]

use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Events one trace keeps at most: a runaway request cannot grow its trace without bound.
pub const MAX_EVENTS: usize = 1_000;

tokio::task_local! {
    static CURRENT: Arc<Trace>;
}

/// One traced request: its id (the `session_id` of `system_traces`), when it started and
/// the events recorded while it ran.
#[derive(Debug)]
pub struct Trace {
    id: [u8; 16],
    started: Instant,
    started_at_micros: i64,
    events: Mutex<Vec<TraceEvent>>,
}

/// Something a traced request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    pub activity: String,
    /// Microseconds since the request started (`source_elapsed`).
    pub elapsed_micros: i64,
    /// Microseconds since the epoch (the time in the event's timeuuid).
    pub at_micros: i64,
    /// The thread that recorded it.
    pub thread: String,
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl Trace {
    /// A trace starting now, with a random id.
    pub fn start() -> Arc<Trace> {
        let mut id: [u8; 16] = rand::random();
        id[6] = (id[6] & 0x0f) | 0x40; // version 4
        id[8] = (id[8] & 0x3f) | 0x80; // variant
        Arc::new(Trace {
            id,
            started: Instant::now(),
            started_at_micros: now_micros(),
            events: Mutex::new(Vec::new()),
        })
    }

    /// The trace's id, a version 4 UUID.
    pub fn id(&self) -> [u8; 16] {
        self.id
    }

    /// When the request started, in microseconds since the epoch.
    pub fn started_at_micros(&self) -> i64 {
        self.started_at_micros
    }

    /// Microseconds since the request started.
    pub fn elapsed_micros(&self) -> i64 {
        self.started.elapsed().as_micros() as i64
    }

    /// Records `activity` now.
    pub fn record(&self, activity: String) {
        let event = TraceEvent {
            activity,
            elapsed_micros: self.elapsed_micros(),
            at_micros: now_micros(),
            thread: std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string(),
        };
        let mut events = self.events.lock();
        if events.len() < MAX_EVENTS {
            events.push(event);
        }
    }

    /// The events recorded so far, in the order they were recorded.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.events.lock().clone()
    }

    /// Runs `future` as this trace's request: [`event`] calls inside it record here.
    pub async fn scope<F: Future>(self: Arc<Self>, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }
}

/// The trace of the request running on this task, if it is traced. A future that outlives
/// the call (a message to a replica) takes it along with this.
pub fn current() -> Option<Arc<Trace>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// Records `activity` on the running request's trace; does nothing (and does not call
/// `activity`) when the request is not traced.
pub fn event(activity: impl FnOnce() -> String) {
    let _ = CURRENT.try_with(|trace| trace.record(activity()));
}

/// Which untraced requests a node traces anyway: each with the probability
/// `settraceprobability` set (0 by default, as Cassandra).
#[derive(Debug, Default)]
pub struct Sampler {
    /// The probability's `f64` bits.
    probability: AtomicU64,
}

impl Sampler {
    /// Sets the probability, a number in [0, 1].
    pub fn set_probability(&self, probability: f64) -> Result<(), String> {
        if !(0.0..=1.0).contains(&probability) {
            return Err(format!(
                "the trace probability must be between 0 and 1 (got {probability})"
            ));
        }
        self.probability
            .store(probability.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    pub fn probability(&self) -> f64 {
        f64::from_bits(self.probability.load(Ordering::Relaxed))
    }

    /// Whether to trace the next request (one atomic load when the probability is 0).
    pub fn sample(&self) -> bool {
        let bits = self.probability.load(Ordering::Relaxed);
        bits != 0 && rand::random::<f64>() < f64::from_bits(bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_reach_the_trace_of_the_task_that_runs_the_request() {
        let trace = Trace::start();
        trace
            .clone()
            .scope(async {
                event(|| "first".into());
                tokio::task::yield_now().await;
                event(|| "second".into());
            })
            .await;
        let activities: Vec<String> = trace.events().into_iter().map(|e| e.activity).collect();
        assert_eq!(activities, ["first", "second"]);
        let events = trace.events();
        assert!(events[0].elapsed_micros <= events[1].elapsed_micros);
    }

    #[tokio::test]
    async fn untraced_requests_record_nothing_and_build_no_text() {
        event(|| panic!("an untraced request must not build its event's text"));
        assert!(current().is_none());
    }

    #[tokio::test]
    async fn a_trace_keeps_a_bounded_number_of_events() {
        let trace = Trace::start();
        trace
            .clone()
            .scope(async {
                for i in 0..MAX_EVENTS + 10 {
                    event(|| format!("event {i}"));
                }
            })
            .await;
        assert_eq!(trace.events().len(), MAX_EVENTS);
    }

    #[test]
    fn trace_ids_are_version_4_uuids() {
        let id = Trace::start().id();
        assert_eq!(id[6] >> 4, 4);
        assert_eq!(id[8] >> 6, 0b10);
        assert_ne!(id, Trace::start().id());
    }

    #[test]
    fn the_sampler_follows_its_probability() {
        let sampler = Sampler::default();
        assert!(!(0..1000).any(|_| sampler.sample()));
        sampler.set_probability(1.0).unwrap();
        assert!((0..1000).all(|_| sampler.sample()));
        assert!(sampler.set_probability(1.5).is_err());
        assert!(sampler.set_probability(-0.1).is_err());
        assert_eq!(sampler.probability(), 1.0);
    }
}
