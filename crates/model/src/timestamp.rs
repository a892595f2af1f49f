//! Write timestamps: microseconds since the Unix epoch, chosen by the coordinator (or the
//! client, with `USING TIMESTAMP` or the protocol's default timestamp). Last write wins.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteTimestamp(pub i64);

static LAST_ISSUED_MICROS: AtomicI64 = AtomicI64::new(0);

impl WriteTimestamp {
    /// The current time, strictly greater than any timestamp this process issued before,
    /// so that two writes from one coordinator never tie (as Cassandra's
    /// `ClientState.getTimestamp` guarantees).
    pub fn now() -> WriteTimestamp {
        WriteTimestamp::issue(now_micros())
    }

    /// [`WriteTimestamp::now`] for a wall clock the caller has just read (`wall`
    /// microseconds since the epoch), so that one statement reads the clock once.
    pub fn issue(wall: i64) -> WriteTimestamp {
        let mut last = LAST_ISSUED_MICROS.load(Ordering::Relaxed);
        loop {
            let next = if wall > last { wall } else { last + 1 };
            match LAST_ISSUED_MICROS.compare_exchange_weak(
                last,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return WriteTimestamp(next),
                Err(actual) => last = actual,
            }
        }
    }
}

/// Wall-clock microseconds since the epoch.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Wall-clock seconds since the epoch: the unit of TTL expiry and tombstone deletion times.
pub fn now_seconds() -> i64 {
    now_micros() / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_strictly_increase() {
        let mut previous = WriteTimestamp::now();
        for _ in 0..10_000 {
            let next = WriteTimestamp::now();
            assert!(next > previous);
            previous = next;
        }
    }
}
