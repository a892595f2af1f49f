//! Measurements: latency histograms per operation kind (HDR, microseconds), error counts
//! by kind with the first message of each kind, and a per-second timeline that also names
//! each second's slowest operations (when each began, to the microsecond, and how long it
//! took), so that a latency spike can be lined up with events on the nodes. The workers
//! of a phase record into one [`Recorder`], whose histograms are made before any
//! operation is timed (an HDR histogram over ten minutes at three significant figures is
//! ~160 KB: made by each worker on its first answer, they cost a burst of many clients
//! its measurement), and which becomes a [`Summary`] at the end.

use crate::workload::OperationKind;
use hdrhistogram::Histogram;
use std::collections::BTreeMap;

/// Longest latency recorded exactly: ten minutes, in microseconds (a burst of wide scans
/// at a thousand clients keeps some waiting for more than a minute, and a clamped figure
/// would understate their mean and percentiles).
const MAX_LATENCY_MICROS: u64 = 600_000_000;

fn new_histogram(significant_figures: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_MICROS, significant_figures)
        .expect("valid histogram bounds")
}

#[derive(Debug, Clone)]
struct OperationRecord {
    latency_micros: Histogram<u64>,
    /// By kind of error ([`error_kind`]).
    errors: BTreeMap<&'static str, ErrorRecord>,
}

/// The errors of one kind: how many, and the first one's message (what a count of
/// "other" was).
#[derive(Debug, Clone)]
struct ErrorRecord {
    count: u64,
    first_message: String,
}

impl Default for OperationRecord {
    fn default() -> Self {
        OperationRecord {
            latency_micros: new_histogram(3),
            errors: BTreeMap::new(),
        }
    }
}

/// Operations of each second kept by [`SlowOperation`]: a little more than the 1% of a
/// thousand that make a second's p99.
pub const SLOWEST_PER_SECOND: usize = 16;

/// One second of the timeline.
#[derive(Debug, Clone)]
struct SecondRecord {
    operations: u64,
    latency_micros: Histogram<u64>,
    /// The slowest operations of the second, slowest first.
    slowest: Vec<SlowOperation>,
}

/// One of a second's slowest operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SlowOperation {
    /// When it began, in microseconds since the phase's measurement began.
    pub began_micros: u64,
    pub latency_micros: u64,
}

/// What one worker measured.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    operations: BTreeMap<OperationKind, OperationRecord>,
    timeline: Vec<SecondRecord>,
}

/// Groups a driver error message into a kind a person can act on.
pub fn error_kind(message: &str) -> &'static str {
    let lower = message.to_ascii_lowercase();
    if lower.contains("overloaded") {
        "overloaded"
    } else if lower.contains("unavailable") || lower.contains("not enough nodes are alive") {
        "unavailable"
    } else if lower.contains("timeout") || lower.contains("timed out") {
        "timeout"
    } else if lower.contains("connection") || lower.contains("broken") {
        "connection"
    } else if lower.contains("invalid") || lower.contains("syntax") {
        "invalid request"
    } else {
        "other"
    }
}

impl Recorder {
    /// A recorder with the histograms of `kinds` already made, so that recording the
    /// first operation of each allocates nothing.
    pub fn expecting(kinds: impl IntoIterator<Item = OperationKind>) -> Recorder {
        let mut recorder = Recorder::default();
        for kind in kinds {
            recorder.operations.entry(kind).or_default();
        }
        recorder
    }

    /// A successful operation that began `began_micros` into the phase and took
    /// `latency_micros`.
    pub fn success(&mut self, kind: OperationKind, latency_micros: u64, began_micros: u64) {
        let second = (began_micros / 1_000_000) as usize;
        let value = latency_micros.clamp(1, MAX_LATENCY_MICROS);
        let _ = self
            .operations
            .entry(kind)
            .or_default()
            .latency_micros
            .record(value);
        while self.timeline.len() <= second {
            self.timeline.push(SecondRecord {
                operations: 0,
                latency_micros: new_histogram(2),
                slowest: Vec::with_capacity(SLOWEST_PER_SECOND + 1),
            });
        }
        let slot = &mut self.timeline[second];
        slot.operations += 1;
        let _ = slot.latency_micros.record(value);
        keep_if_slowest(
            &mut slot.slowest,
            SlowOperation {
                began_micros,
                latency_micros,
            },
        );
    }

    pub fn failure(&mut self, kind: OperationKind, message: &str) {
        self.operations
            .entry(kind)
            .or_default()
            .errors
            .entry(error_kind(message))
            .or_insert_with(|| ErrorRecord {
                count: 0,
                first_message: message.to_string(),
            })
            .count += 1;
    }

    pub fn summary(&self, workload: &str, phase: &str, elapsed_seconds: f64) -> Summary {
        let milliseconds = |micros: u64| micros as f64 / 1000.0;
        let operations: Vec<OperationSummary> = self
            .operations
            .iter()
            // A kind expected but never done is not reported, as if never expected.
            .filter(|(_, record)| !record.latency_micros.is_empty() || !record.errors.is_empty())
            .map(|(kind, record)| {
                let histogram = &record.latency_micros;
                OperationSummary {
                    name: kind.name().to_string(),
                    count: histogram.len(),
                    ops_per_second: histogram.len() as f64 / elapsed_seconds.max(1e-9),
                    mean_ms: histogram.mean() / 1000.0,
                    p50_ms: milliseconds(histogram.value_at_quantile(0.50)),
                    p90_ms: milliseconds(histogram.value_at_quantile(0.90)),
                    p99_ms: milliseconds(histogram.value_at_quantile(0.99)),
                    p999_ms: milliseconds(histogram.value_at_quantile(0.999)),
                    max_ms: milliseconds(histogram.max()),
                    errors: record
                        .errors
                        .iter()
                        .map(|(kind, error)| (kind.to_string(), error.count))
                        .collect(),
                    first_error_messages: record
                        .errors
                        .iter()
                        .map(|(kind, error)| (kind.to_string(), error.first_message.clone()))
                        .collect(),
                }
            })
            .collect();
        let total: u64 = operations.iter().map(|o| o.count).sum();
        Summary {
            workload: workload.to_string(),
            phase: phase.to_string(),
            measured_from_unix_ms: 0,
            elapsed_seconds,
            operations_total: total,
            throughput_ops_per_second: total as f64 / elapsed_seconds.max(1e-9),
            operations,
            timeline: self
                .timeline
                .iter()
                .enumerate()
                .map(|(second, record)| TimelinePoint {
                    second,
                    operations: record.operations,
                    p50_ms: milliseconds(record.latency_micros.value_at_quantile(0.50)),
                    p99_ms: milliseconds(record.latency_micros.value_at_quantile(0.99)),
                    slowest: record.slowest.clone(),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct OperationSummary {
    pub name: String,
    pub count: u64,
    pub ops_per_second: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub errors: BTreeMap<String, u64>,
    /// The first message of each kind of error counted in `errors`.
    pub first_error_messages: BTreeMap<String, String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TimelinePoint {
    pub second: usize,
    pub operations: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The second's slowest operations, slowest first (at most [`SLOWEST_PER_SECOND`]).
    pub slowest: Vec<SlowOperation>,
}

/// Keeps `operation` among `slowest` (slowest first) if it is one of the
/// [`SLOWEST_PER_SECOND`] slowest seen.
fn keep_if_slowest(slowest: &mut Vec<SlowOperation>, operation: SlowOperation) {
    if slowest.len() == SLOWEST_PER_SECOND
        && slowest
            .last()
            .is_some_and(|fastest| fastest.latency_micros >= operation.latency_micros)
    {
        return;
    }
    let at = slowest.partition_point(|kept| kept.latency_micros >= operation.latency_micros);
    slowest.insert(at, operation);
    slowest.truncate(SLOWEST_PER_SECOND);
}

/// The result of one phase, printed as a table and written as JSON.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub workload: String,
    pub phase: String,
    /// When second 0 of the timeline began (milliseconds since the Unix epoch), to line
    /// the timeline up with events outside the benchmark (a node joining, say).
    pub measured_from_unix_ms: u64,
    pub elapsed_seconds: f64,
    pub operations_total: u64,
    pub throughput_ops_per_second: f64,
    pub operations: Vec<OperationSummary>,
    pub timeline: Vec<TimelinePoint>,
}

impl Summary {
    pub fn print(&self) {
        println!(
            "[{} {}] {:.1}s, {} operations, {:.0} ops/s",
            self.workload,
            self.phase,
            self.elapsed_seconds,
            self.operations_total,
            self.throughput_ops_per_second
        );
        println!(
            "  {:<18} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}  errors",
            "operation", "count", "ops/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        for operation in &self.operations {
            let errors: Vec<String> = operation
                .errors
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            println!(
                "  {:<18} {:>10} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {}",
                operation.name,
                operation.count,
                operation.ops_per_second,
                operation.p50_ms,
                operation.p90_ms,
                operation.p99_ms,
                operation.p999_ms,
                operation.max_ms,
                if errors.is_empty() {
                    "-".to_string()
                } else {
                    errors.join(", ")
                }
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorder_reports_exact_counts_and_percentiles_and_only_kinds_that_happened() {
        let mut recorder = Recorder::expecting([
            OperationKind::Read,
            OperationKind::Update,
            OperationKind::Scan,
        ]);
        for micros in 1..=1000u64 {
            recorder.success(
                OperationKind::Read,
                micros * 1000,
                if micros > 500 {
                    1_000_000 + micros
                } else {
                    micros
                },
            );
        }
        recorder.failure(
            OperationKind::Update,
            "Database returned an error: Overloaded",
        );
        recorder.failure(OperationKind::Update, "Request timed out");
        recorder.failure(OperationKind::Update, "Operation timed out again");
        let summary = recorder.summary("test", "run", 2.0);
        let read = summary
            .operations
            .iter()
            .find(|o| o.name == "READ")
            .unwrap();
        assert_eq!(read.count, 1000);
        assert!((read.p50_ms - 500.0).abs() < 1.0, "{}", read.p50_ms);
        assert!((read.p99_ms - 990.0).abs() < 2.0, "{}", read.p99_ms);
        assert!((read.ops_per_second - 500.0).abs() < 1e-9);
        let update = summary
            .operations
            .iter()
            .find(|o| o.name == "UPDATE")
            .unwrap();
        assert_eq!(update.errors.get("overloaded"), Some(&1));
        assert_eq!(update.errors.get("timeout"), Some(&2));
        assert_eq!(
            update
                .first_error_messages
                .get("timeout")
                .map(String::as_str),
            Some("Request timed out"),
            "the first message of each kind is kept"
        );
        assert!(
            summary.operations.iter().all(|o| o.name != "SCAN"),
            "a kind expected but never done is not reported"
        );
        assert_eq!(summary.timeline.len(), 2);
        assert_eq!(summary.timeline[0].operations, 500);
        assert_eq!(summary.operations_total, 1000);
    }

    #[test]
    fn each_second_names_its_slowest_operations_slowest_first() {
        let mut recorder = Recorder::expecting([OperationKind::Update]);
        // 100 operations in second 0 taking 1..=100 ms, in a scrambled order; one in second 1.
        for n in 0..100u64 {
            let latency = (n * 37 % 100 + 1) * 1000;
            recorder.success(OperationKind::Update, latency, n * 10_000);
        }
        recorder.success(OperationKind::Update, 5, 1_500_000);
        let summary = recorder.summary("test", "run", 2.0);
        let first = &summary.timeline[0].slowest;
        assert_eq!(first.len(), SLOWEST_PER_SECOND);
        let latencies: Vec<u64> = first.iter().map(|s| s.latency_micros).collect();
        let expected: Vec<u64> = (0..SLOWEST_PER_SECOND as u64)
            .map(|i| (100 - i) * 1000)
            .collect();
        assert_eq!(latencies, expected);
        // The slowest (100 ms) began at the n with n * 37 % 100 == 99: n = 27.
        assert_eq!(first[0].began_micros, 270_000);
        assert_eq!(
            summary.timeline[1].slowest,
            vec![SlowOperation {
                began_micros: 1_500_000,
                latency_micros: 5
            }]
        );
    }

    #[test]
    fn errors_are_grouped_by_what_to_do() {
        assert_eq!(
            error_kind("Unavailable: 2 required, 1 alive"),
            "unavailable"
        );
        assert_eq!(
            error_kind(
                "Database returned an error: Not enough nodes are alive to satisfy required \
                 consistency level (consistency: One, required: 1, alive: 0)"
            ),
            "unavailable",
            "the scylla driver's words for an Unavailable answer"
        );
        assert_eq!(error_kind("connection broken"), "connection");
        assert_eq!(error_kind("Invalid query"), "invalid request");
        assert_eq!(error_kind("something odd"), "other");
    }
}
