//! The streaming lane's rate limit: a token bucket whose rate the policy sets.
//!
//! Every chunk a node sends or receives takes its bytes from the bucket first; the bucket
//! refills at the current rate and holds at most [`BURST`] worth, so a stream that paused
//! does not then burst past the rate. The bucket also counts the bytes that went through
//! it, which is what the policy measures streaming by.

use super::policy::{Decision, Reason, UNLIMITED};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The longest a bucket saves up for.
const BURST: Duration = Duration::from_millis(50);

/// A node's streaming rate limit.
pub struct Throttle {
    /// Bytes per second; [`UNLIMITED`]: no limit.
    rate: AtomicU64,
    /// When the bytes taken so far will have been paid for at the current rate.
    paid_until: Mutex<Instant>,
    /// Bytes that went through, ever.
    total_bytes: AtomicU64,
    /// The policy's last decision, for `shoal admin streams`.
    last_decision: Mutex<Decision>,
}

impl Throttle {
    pub fn new(rate_bytes_per_s: u64) -> Throttle {
        Throttle {
            rate: AtomicU64::new(rate_bytes_per_s),
            paid_until: Mutex::new(Instant::now()),
            total_bytes: AtomicU64::new(0),
            last_decision: Mutex::new(Decision {
                bytes_per_s: rate_bytes_per_s,
                reason: Reason::Idle,
            }),
        }
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Ordering::Relaxed)
    }

    pub fn set(&self, decision: Decision) {
        self.rate.store(decision.bytes_per_s, Ordering::Relaxed);
        *self.last_decision.lock() = decision;
    }

    pub fn last_decision(&self) -> Decision {
        *self.last_decision.lock()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// Takes `bytes` from the bucket; returns how long the caller must wait first.
    fn take(&self, bytes: u64) -> Duration {
        self.total_bytes.fetch_add(bytes, Ordering::Relaxed);
        let rate = self.rate();
        if rate == UNLIMITED || rate == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let mut paid_until = self.paid_until.lock();
        // Savings beyond the burst are forfeited.
        let start = match now.checked_sub(BURST) {
            Some(earliest) => (*paid_until).max(earliest),
            None => *paid_until,
        };
        let cost = Duration::from_secs_f64(bytes as f64 / rate as f64);
        *paid_until = start + cost;
        paid_until.saturating_duration_since(now + BURST)
    }

    /// Waits until `bytes` may go (async callers).
    pub async fn acquire(&self, bytes: u64) {
        let wait = self.take(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until `bytes` may go (a streaming thread).
    pub fn acquire_blocking(&self, bytes: u64) {
        let wait = self.take(bytes);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_paces_bytes_at_its_rate_after_a_burst() {
        let throttle = Throttle::new(1_000_000);
        // Savings of up to 50 ms: the first 50 kB go at once.
        assert_eq!(throttle.take(10_000), Duration::ZERO);
        // Then a second's worth must wait about a second (less the saved burst).
        let wait = throttle.take(1_000_000);
        assert!(
            wait > Duration::from_millis(900) && wait <= Duration::from_millis(1010),
            "{wait:?}"
        );
        assert_eq!(throttle.total_bytes(), 1_010_000);
    }

    #[test]
    fn an_unlimited_throttle_never_waits() {
        let throttle = Throttle::new(UNLIMITED);
        assert_eq!(throttle.take(u64::MAX / 2), Duration::ZERO);
    }
}
