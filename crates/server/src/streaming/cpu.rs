//! How busy the machine's CPUs were between two moments, from `/proc/stat` (Linux),
//! *steal* included: the time a virtual machine's host ran something else while the
//! machine had work. The streaming policy logs it with each decision (see
//! [`super::policy`] for why it matters: a saturated virtual machine delays requests before
//! the node can time them).

/// Cumulative CPU time of the whole machine, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    /// The machine's CPU times now (`None` where `/proc/stat` cannot be read).
    pub fn now() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        CpuTimes::parse(stat.lines().next()?)
    }

    /// Parses the `cpu` line of `/proc/stat`: user, nice, system, idle, iowait, irq,
    /// softirq, steal (later fields — guest time — are already counted in user and nice).
    fn parse(line: &str) -> Option<CpuTimes> {
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        Some(CpuTimes {
            busy: user + nice + system + irq + softirq + steal,
            total: user + nice + system + idle + iowait + irq + softirq + steal,
        })
    }

    /// The share of the time from `earlier` to `self` that the CPUs were busy (`None` if
    /// no time passed).
    pub fn busy_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let busy = self.busy.checked_sub(earlier.busy)?;
        (total > 0).then(|| busy as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_counts_steal_and_not_idle_or_iowait() {
        let before = CpuTimes::parse("cpu  100 10 50 800 20 5 5 10 0 0").unwrap();
        let after = CpuTimes::parse("cpu  160 10 70 820 30 5 5 40 0 0").unwrap();
        // Busy: 60 user + 20 system + 30 steal = 110 of 140 ticks.
        assert_eq!(after.busy_since(&before), Some(110.0 / 140.0));
        assert_eq!(after.busy_since(&after), None);
        assert_eq!(CpuTimes::parse("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(CpuTimes::parse("cpu 1 2 3"), None);
    }
}
