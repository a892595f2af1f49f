//! How fast streaming may go, decided from measurements only (seed 004: foreground and
//! streaming I/O share the node by an explicit, adjustable priority, not by accident).
//!
//! Every [`POLICY_INTERVAL`] the node measures the requests it served (how many, their
//! 99th-percentile latency) and the bytes it streamed, and [`StreamPolicy::decide`] turns
//! that into the rate for the next interval (an idle node does not wait for the interval's
//! end: the first requests it serves bring the decision forward, so a joining node is held
//! to the limit under load before its tablets start streaming in):
//!
//! - no requests at all: full speed (the cap);
//! - requests slower than the target: half of what streaming actually did, down to a floor
//!   (so a stream always progresses);
//! - requests well under the target (at most [`RELAXED_SHARE`] of it): a quarter faster
//!   plus a step, up to the cap;
//! - otherwise: hold;
//! - and while requests are served, never above `stream_throughput_under_load_mib_per_s`
//!   (`StreamPolicy::under_load_bytes_per_s`, off by default): a fixed limit, for
//!   what the latency cannot show (below).
//!
//! The requests are the client requests the node coordinated and the replica requests it
//! answered for other coordinators' clients. A node taking over tablets coordinates
//! nothing, but every write to those tablets waits for its answer: counting only its own
//! clients, it would stream at full speed while those writes queue behind its ingestion.
//!
//! The target is an absolute one (`stream_target_p99_ms`) or, when `stream_p99_growth` is
//! set, the lower of that and `stream_p99_growth` times the p99 this node's clients saw
//! while nothing streamed ([`Baseline`]) — for operators who would rather a join took
//! longer than let 2 ms requests reach 20 ms. Off by default: on the 2-core machine of
//! `bench/results/2026-11-25-elastic-relative` it made a join under load 3–4.5× longer
//! for a client p99 that was not reliably lower.
//!
//! What the policy cannot see: the latency it measures is the node's, from a request read
//! to its answer written. On a machine whose every core is busy, requests also wait to be
//! scheduled before that — and a virtual machine that keeps all its cores busy has them
//! taken away by its host (*steal*) in slices of tens of milliseconds, whatever the
//! threads' priorities. On the 2-core virtual machines Shoal is built on, joins of
//! `bench/elastic`'s fourth node under its read load showed it: about 20% steal over the
//! first 0.6 s (50 ms samples up to 40%), and in one join the sources measured a client
//! p99 of 0.4–0.8 ms over the first 250 ms while the clients' p99 over that second was
//! 41 ms. So the machine's CPU use (steal included) is logged with each decision
//! ([`super::cpu`]), for the operator to read next to the clients' latency.
//!
//! Hence the limit under load. What hurt clients was streaming's peaks: uncapped, the
//! fourth node of `bench/elastic` took in 408–480 MiB/s over a join's first quarter
//! second, and the clients' p99 over that second reached 34–54 ms against 4–6 ms steady.
//! A rate fixed below the peaks keeps the machine from saturating while it barely slows
//! the join, whose average rate is well under them. With each source held at 80 MiB/s
//! while it serves clients (`bench/results/2026-11-29-elastic-under-load-limit`), joins
//! under the read load had a client p99 2.1–2.2× steady and took 1.10–1.15× an idle
//! join; uncapped, the same day, 3.9–4.9× and 0.96×
//! (`bench/results/2026-11-29-elastic-rate-uncapped`). An idle node streams at full
//! speed, so joins into idle clusters keep all the bandwidth. A limit that adapts to the
//! machine's CPU use instead (back off above a busy share, steal included) was tried: the
//! sources, each following the same machine-wide figure, swung it between 40% and 100%
//! and did no better.
//!
//! Additive-increase/multiplicative-decrease, as congestion control does: it backs off
//! fast when clients suffer and probes upward slowly. The decisions are data (the new
//! rate and why), logged when they change and shown by `shoal admin streams`.

use std::time::Duration;

/// How often the policy looks at the measurements.
pub const POLICY_INTERVAL: Duration = Duration::from_millis(250);
/// Requests faster than this share of the target let streaming speed up.
pub const RELAXED_SHARE: f64 = 0.5;
/// The slowest streaming is throttled to (bytes per second).
pub const FLOOR_BYTES_PER_S: u64 = 4 << 20;
/// What an increase adds on top of the quarter (bytes per second).
pub const STEP_BYTES_PER_S: u64 = 8 << 20;
/// "No cap": the throttle does not hold streaming back at all.
pub const UNLIMITED: u64 = u64::MAX;

/// A configured limit in MiB per second as bytes per second, 0 meaning none
/// ([`UNLIMITED`]).
pub fn limit_from_mib(mib_per_s: u64) -> u64 {
    match mib_per_s {
        0 => UNLIMITED,
        mib => mib << 20,
    }
}

/// The weight of a new interval in the [`Baseline`] (an exponential moving average).
pub const BASELINE_WEIGHT: f64 = 0.2;

/// The node's streaming policy (from its configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamPolicy {
    /// The client p99 streaming backs off to keep, whatever the baseline.
    pub target_p99: Duration,
    /// How much higher than the [`Baseline`] client p99 may go while streaming (`None`:
    /// only the absolute target counts).
    pub p99_growth: Option<f64>,
    /// The hard cap in bytes per second ([`UNLIMITED`]: none).
    pub cap_bytes_per_s: u64,
    /// The most while the node serves clients, in bytes per second ([`UNLIMITED`]:
    /// only the cap).
    pub under_load_bytes_per_s: u64,
}

/// The client p99 of intervals in which nothing streamed: what requests take here when
/// streaming is not competing with them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Baseline {
    seconds: Option<f64>,
}

impl Baseline {
    /// Takes an interval into account: only one with requests and without streaming.
    pub fn observe(&mut self, measured: &Measurement) {
        let Some(p99) = measured.p99.filter(|_| measured.requests > 0) else {
            return;
        };
        if measured.streamed_bytes_per_s > 0 {
            return;
        }
        let now = p99.as_secs_f64();
        self.seconds = Some(match self.seconds {
            Some(before) => before + BASELINE_WEIGHT * (now - before),
            None => now,
        });
    }

    pub fn p99(&self) -> Option<Duration> {
        self.seconds.map(Duration::from_secs_f64)
    }
}

/// What the node saw during one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measurement {
    /// Client requests served.
    pub requests: u64,
    /// Their 99th-percentile latency (`None` without requests).
    pub p99: Option<Duration>,
    /// Bytes streamed per second (sent and received).
    pub streamed_bytes_per_s: u64,
}

/// Why the rate is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Idle,
    BackingOff,
    UnderLoadLimit,
    SpeedingUp,
    Holding,
}

impl Reason {
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Idle => "no requests served: full speed",
            Reason::BackingOff => "client p99 above target: backing off",
            Reason::UnderLoadLimit => "requests served: at the limit under load",
            Reason::SpeedingUp => "client p99 well under target: speeding up",
            Reason::Holding => "client p99 near target: holding",
        }
    }
}

/// The rate for the next interval, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub bytes_per_s: u64,
    pub reason: Reason,
}

impl StreamPolicy {
    /// The client p99 streaming keeps to, given the baseline.
    pub fn target(&self, baseline: &Baseline) -> Duration {
        match (baseline.p99(), self.p99_growth) {
            (Some(p99), Some(growth)) => self.target_p99.min(p99.mul_f64(growth)),
            _ => self.target_p99,
        }
    }

    /// The rate to stream at next, given the current one, what the last interval
    /// measured and the baseline before it.
    pub fn decide(
        &self,
        current_bytes_per_s: u64,
        measured: &Measurement,
        baseline: &Baseline,
    ) -> Decision {
        let Some(p99) = measured.p99.filter(|_| measured.requests > 0) else {
            return Decision {
                bytes_per_s: self.cap_bytes_per_s,
                reason: Reason::Idle,
            };
        };
        // Clients are served: never above the limit under load, then as their latency says.
        let limit = self.cap_bytes_per_s.min(self.under_load_bytes_per_s);
        let decision = self.follow_latency(
            current_bytes_per_s.min(limit),
            p99,
            measured,
            baseline,
            limit,
        );
        if decision.reason == Reason::SpeedingUp
            && decision.bytes_per_s == limit
            && limit < self.cap_bytes_per_s
        {
            return Decision {
                bytes_per_s: limit,
                reason: Reason::UnderLoadLimit,
            };
        }
        decision
    }

    /// The rate from the clients' p99 (AIMD), between the floor and `cap`.
    fn follow_latency(
        &self,
        current_bytes_per_s: u64,
        p99: Duration,
        measured: &Measurement,
        baseline: &Baseline,
        cap: u64,
    ) -> Decision {
        let floor = FLOOR_BYTES_PER_S.min(cap);
        let target = self.target(baseline);
        if p99 > target {
            // Half of what streaming actually did: the current rate may be far above it
            // (the cap, "unlimited") and halving that would change nothing.
            let basis = current_bytes_per_s.min(measured.streamed_bytes_per_s.max(floor));
            return Decision {
                bytes_per_s: (basis / 2).clamp(floor, cap),
                reason: Reason::BackingOff,
            };
        }
        if p99.as_secs_f64() <= target.as_secs_f64() * RELAXED_SHARE {
            if current_bytes_per_s >= cap {
                return Decision {
                    bytes_per_s: cap,
                    reason: Reason::SpeedingUp,
                };
            }
            let faster = current_bytes_per_s
                .saturating_add(current_bytes_per_s / 4)
                .saturating_add(STEP_BYTES_PER_S);
            return Decision {
                bytes_per_s: faster.min(cap),
                reason: Reason::SpeedingUp,
            };
        }
        Decision {
            bytes_per_s: current_bytes_per_s.clamp(floor, cap),
            reason: Reason::Holding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn policy(cap: u64) -> StreamPolicy {
        StreamPolicy {
            target_p99: Duration::from_millis(20),
            p99_growth: Some(2.0),
            cap_bytes_per_s: cap,
            under_load_bytes_per_s: UNLIMITED,
        }
    }

    fn load(requests: u64, p99_ms: u64, streamed: u64) -> Measurement {
        Measurement {
            requests,
            p99: Some(Duration::from_millis(p99_ms)),
            streamed_bytes_per_s: streamed,
        }
    }

    #[test]
    fn an_idle_node_streams_at_the_cap() {
        let idle = Measurement {
            requests: 0,
            p99: None,
            streamed_bytes_per_s: 0,
        };
        assert_eq!(
            policy(100 * MIB).decide(10 * MIB, &idle, &Baseline::default()),
            Decision {
                bytes_per_s: 100 * MIB,
                reason: Reason::Idle
            }
        );
        assert_eq!(
            policy(UNLIMITED)
                .decide(10 * MIB, &idle, &Baseline::default())
                .bytes_per_s,
            UNLIMITED
        );
    }

    #[test]
    fn slow_requests_halve_what_streaming_actually_did_down_to_the_floor() {
        // Unlimited, streaming did 200 MiB/s: next 100 MiB/s, not half of "unlimited".
        let decision =
            policy(UNLIMITED).decide(UNLIMITED, &load(1000, 50, 200 * MIB), &Baseline::default());
        assert_eq!(decision.bytes_per_s, 100 * MIB);
        assert_eq!(decision.reason, Reason::BackingOff);
        // Repeated, it settles at the floor and never stops a stream.
        let mut rate = 100 * MIB;
        for _ in 0..20 {
            rate = policy(UNLIMITED)
                .decide(rate, &load(1000, 50, rate), &Baseline::default())
                .bytes_per_s;
        }
        assert_eq!(rate, FLOOR_BYTES_PER_S);
    }

    #[test]
    fn fast_requests_let_streaming_climb_back_to_the_cap() {
        let mut rate = FLOOR_BYTES_PER_S;
        let mut steps = 0;
        while rate < 64 * MIB {
            let decision =
                policy(64 * MIB).decide(rate, &load(1000, 2, rate), &Baseline::default());
            assert_eq!(decision.reason, Reason::SpeedingUp);
            assert!(decision.bytes_per_s > rate);
            rate = decision.bytes_per_s;
            steps += 1;
        }
        assert_eq!(rate, 64 * MIB, "never above the cap");
        assert!(
            steps <= 8,
            "back to full speed within two seconds ({steps} steps)"
        );
    }

    #[test]
    fn requests_near_the_target_hold_the_rate() {
        let decision =
            policy(UNLIMITED).decide(30 * MIB, &load(1000, 15, 30 * MIB), &Baseline::default());
        assert_eq!(
            decision,
            Decision {
                bytes_per_s: 30 * MIB,
                reason: Reason::Holding
            }
        );
    }

    #[test]
    fn the_target_is_a_multiple_of_the_latency_seen_without_streaming() {
        let mut baseline = Baseline::default();
        // Intervals that streamed do not count; those without requests neither.
        baseline.observe(&load(1000, 9, 50 * MIB));
        baseline.observe(&Measurement {
            requests: 0,
            p99: None,
            streamed_bytes_per_s: 0,
        });
        assert_eq!(baseline.p99(), None);
        assert_eq!(
            policy(UNLIMITED).target(&baseline),
            Duration::from_millis(20)
        );
        baseline.observe(&load(1000, 3, 0));
        assert_eq!(
            policy(UNLIMITED).target(&baseline),
            Duration::from_millis(6)
        );
        // 9 ms is under the absolute 20 ms but three times what clients saw: back off.
        let decision = policy(UNLIMITED).decide(UNLIMITED, &load(1000, 9, 100 * MIB), &baseline);
        assert_eq!(decision.reason, Reason::BackingOff);
        // Back at the baseline: climb again.
        let decision = policy(UNLIMITED).decide(50 * MIB, &load(1000, 3, 50 * MIB), &baseline);
        assert_eq!(decision.reason, Reason::SpeedingUp);
        // A slow baseline never lifts the absolute target.
        baseline.observe(&load(1000, 40, 0));
        assert!(policy(UNLIMITED).target(&baseline) <= Duration::from_millis(20));
    }

    #[test]
    fn while_clients_are_served_streaming_stays_under_the_limit_under_load() {
        let policy = StreamPolicy {
            under_load_bytes_per_s: 80 * MIB,
            ..policy(UNLIMITED)
        };
        let none = Baseline::default();
        // Fast clients: up to the limit, not to the cap — and the reason says so.
        assert_eq!(
            policy.decide(UNLIMITED, &load(1000, 2, 300 * MIB), &none),
            Decision {
                bytes_per_s: 80 * MIB,
                reason: Reason::UnderLoadLimit
            }
        );
        let climbing = policy.decide(40 * MIB, &load(1000, 2, 40 * MIB), &none);
        assert_eq!(climbing.reason, Reason::SpeedingUp);
        assert!(climbing.bytes_per_s > 40 * MIB && climbing.bytes_per_s <= 80 * MIB);
        // Slow clients still halve what streaming did.
        assert_eq!(
            policy.decide(80 * MIB, &load(1000, 50, 80 * MIB), &none),
            Decision {
                bytes_per_s: 40 * MIB,
                reason: Reason::BackingOff
            }
        );
        // Nobody served: full speed again.
        let idle = Measurement {
            requests: 0,
            p99: None,
            streamed_bytes_per_s: 80 * MIB,
        };
        assert_eq!(policy.decide(80 * MIB, &idle, &none).bytes_per_s, UNLIMITED);
        // A hard cap under the limit is the cap, reported as the latency policy's.
        let capped = StreamPolicy {
            cap_bytes_per_s: 50 * MIB,
            ..policy
        };
        assert_eq!(
            capped.decide(UNLIMITED, &load(1000, 2, 300 * MIB), &none),
            Decision {
                bytes_per_s: 50 * MIB,
                reason: Reason::SpeedingUp
            }
        );
    }
}
