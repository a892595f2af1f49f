//! When level 0 is compacted: late under heavy writes, at once when writes go quiet.
//!
//! Every memtable flush adds a file to level 0, and every level-0 file is one more place a
//! point read must look (a prefix filter probe, an index seek, often a data block). While
//! writes are heavy, compacting level 0 late pays: with keys spread over the whole table,
//! each level-0 compaction rewrites nearly all of level 1, so compacting sixteen files at
//! a time instead of four quarters that rewriting (`LEVEL0_FILES_BEFORE_COMPACTION`). But
//! once writes slow down, nothing fills level 0 up to that trigger: up to fifteen files stay for
//! as long as writes stay light — minutes at a few thousand writes a second — and every
//! read pays for them. Measured on a three-node cluster (RF=3, QUORUM reads, 200k keys):
//! 30k reads/s with four level-0 files against 45k/s with none.
//!
//! So the trigger follows the writes. [`Level0Policy`] watches the active memtable: a
//! memtable that shrank was switched (flushed). While a switch happened within
//! [`QUIET_AFTER`], writes are heavy and the trigger is the batching one; after
//! [`QUIET_AFTER`] without a switch, the trigger drops to one file, and RocksDB compacts
//! what level 0 holds into level 1 right away (RocksDB applies a changed trigger at once).
//! The next switch restores the batching trigger. The policy is a pure function of what it
//! is shown, so its tests give it the clock.

use std::time::{Duration, Instant};

/// How long without a memtable switch makes writes count as quiet. With the default
/// 16 MiB memtable, writes under about 1.6 MiB/s (some eight thousand 200-byte writes a
/// second) never switch memtables this often.
pub const QUIET_AFTER: Duration = Duration::from_secs(10);

/// The level-0 compaction trigger while writes are quiet: every file is compacted.
pub const QUIET_TRIGGER: i32 = 1;

/// Decides the level-0 compaction trigger from what it observes of the memtable.
#[derive(Debug)]
pub struct Level0Policy {
    /// The trigger while writes are heavy.
    busy_trigger: i32,
    /// The trigger in force.
    trigger: i32,
    /// The active memtable's bytes at the last observation.
    last_memtable_bytes: u64,
    /// When a memtable was last seen switched (or the policy started).
    last_switch: Instant,
}

impl Level0Policy {
    /// A policy starting with `busy_trigger` in force, as if a switch had just happened.
    pub fn new(busy_trigger: i32, now: Instant) -> Level0Policy {
        Level0Policy {
            busy_trigger,
            trigger: busy_trigger,
            last_memtable_bytes: 0,
            last_switch: now,
        }
    }

    /// The trigger in force.
    #[cfg(test)]
    pub fn trigger(&self) -> i32 {
        self.trigger
    }

    /// Observes the active memtable's size at `now`; returns the trigger to set when it
    /// changes, `None` when it stays.
    pub fn observe(&mut self, now: Instant, active_memtable_bytes: u64) -> Option<i32> {
        if active_memtable_bytes < self.last_memtable_bytes {
            self.last_switch = now;
        }
        self.last_memtable_bytes = active_memtable_bytes;
        let wanted = if now.duration_since(self.last_switch) >= QUIET_AFTER {
            QUIET_TRIGGER
        } else {
            self.busy_trigger
        };
        (wanted != self.trigger).then(|| {
            self.trigger = wanted;
            wanted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUSY: i32 = 8;

    #[test]
    fn the_batching_trigger_holds_while_memtables_keep_switching() {
        let start = Instant::now();
        let mut policy = Level0Policy::new(BUSY, start);
        let mut bytes = 0;
        for second in 1..=60u64 {
            // A memtable fills in 3 s and is switched.
            bytes = if second % 3 == 0 {
                1_000
            } else {
                bytes + 5_000_000
            };
            let now = start + Duration::from_secs(second);
            assert_eq!(policy.observe(now, bytes), None, "second {second}");
        }
        assert_eq!(policy.trigger(), BUSY);
    }

    #[test]
    fn quiet_writes_lower_the_trigger_once_and_a_switch_restores_it() {
        let start = Instant::now();
        let mut policy = Level0Policy::new(BUSY, start);
        // A memtable growing slowly, never switched.
        let quiet = QUIET_AFTER.as_secs();
        for second in 1..quiet {
            let now = start + Duration::from_secs(second);
            assert_eq!(policy.observe(now, second * 1_000), None);
        }
        let now = start + QUIET_AFTER;
        assert_eq!(policy.observe(now, quiet * 1_000), Some(QUIET_TRIGGER));
        // Said once, not on every observation.
        assert_eq!(
            policy.observe(now + Duration::from_secs(1), quiet * 1_000),
            None
        );
        assert_eq!(policy.trigger(), QUIET_TRIGGER);
        // The memtable is switched: writes are busy again.
        assert_eq!(policy.observe(now + Duration::from_secs(2), 10), Some(BUSY));
        // And quiet again only a full QUIET_AFTER later.
        let switched = now + Duration::from_secs(2);
        assert_eq!(
            policy.observe(switched + QUIET_AFTER - Duration::from_secs(1), 20),
            None
        );
        assert_eq!(
            policy.observe(switched + QUIET_AFTER, 30),
            Some(QUIET_TRIGGER)
        );
    }
}
