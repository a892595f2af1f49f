//! Workload definitions: YCSB's core workloads A–F with their standard parameters, and the
//! point/range mix of seed 002.

use crate::generators::{Hotspot, KeyChooser, ScrambledZipfian, SkewedLatest, Uniform, Zipfian};

/// One kind of operation a workload issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum OperationKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
    /// Seed 002's point read (a single key).
    Point,
    /// Seed 002's range read (a token range with a row limit).
    Range,
}

impl OperationKind {
    pub fn name(self) -> &'static str {
        match self {
            OperationKind::Read => "READ",
            OperationKind::Update => "UPDATE",
            OperationKind::Insert => "INSERT",
            OperationKind::Scan => "SCAN",
            OperationKind::ReadModifyWrite => "READ-MODIFY-WRITE",
            OperationKind::Point => "POINT",
            OperationKind::Range => "RANGE",
        }
    }
}

/// How keys are picked for reads, updates and scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum RequestDistribution {
    Uniform,
    Zipfian,
    Latest,
    Hotspot,
}

/// How long scans are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum ScanLengthDistribution {
    Uniform,
    Zipfian,
}

/// A workload: operation proportions and distributions (YCSB's CoreWorkload properties).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub proportions: Vec<(OperationKind, f64)>,
    pub request_distribution: RequestDistribution,
    pub max_scan_length: u64,
    pub scan_length_distribution: ScanLengthDistribution,
    pub field_count: usize,
    pub field_length: usize,
}

impl Workload {
    /// YCSB's `workloads/workload{a..f}` files, and `w`: updates only, keys uniform (seed
    /// 004's write load; YCSB has no such core workload).
    pub fn ycsb(letter: char) -> Option<Workload> {
        use OperationKind::*;
        let (proportions, request_distribution) = match letter.to_ascii_lowercase() {
            'a' => (
                vec![(Read, 0.5), (Update, 0.5)],
                RequestDistribution::Zipfian,
            ),
            'b' => (
                vec![(Read, 0.95), (Update, 0.05)],
                RequestDistribution::Zipfian,
            ),
            'c' => (vec![(Read, 1.0)], RequestDistribution::Zipfian),
            'd' => (
                vec![(Read, 0.95), (Insert, 0.05)],
                RequestDistribution::Latest,
            ),
            'e' => (
                vec![(Scan, 0.95), (Insert, 0.05)],
                RequestDistribution::Zipfian,
            ),
            'f' => (
                vec![(Read, 0.5), (ReadModifyWrite, 0.5)],
                RequestDistribution::Zipfian,
            ),
            'w' => (vec![(Update, 1.0)], RequestDistribution::Uniform),
            _ => return None,
        };
        Some(Workload {
            name: format!("ycsb-{}", letter.to_ascii_lowercase()),
            proportions,
            request_distribution,
            max_scan_length: 100,
            scan_length_distribution: ScanLengthDistribution::Uniform,
            field_count: 10,
            field_length: 100,
        })
    }

    /// Seed 002: point reads and range reads in `point_share : 1 - point_share`, range
    /// limits uniform in `1..=max_range_rows`.
    pub fn point_range_mix(point_share: f64, max_range_rows: u64) -> Workload {
        Workload {
            name: format!(
                "point-range-{:.0}-{:.0}",
                point_share * 10.0,
                (1.0 - point_share) * 10.0
            ),
            proportions: vec![
                (OperationKind::Point, point_share),
                (OperationKind::Range, 1.0 - point_share),
            ],
            request_distribution: RequestDistribution::Uniform,
            max_scan_length: max_range_rows,
            scan_length_distribution: ScanLengthDistribution::Uniform,
            field_count: 10,
            field_length: 100,
        }
    }
}

/// Picks operations by proportion (YCSB's DiscreteGenerator).
#[derive(Debug, Clone)]
pub struct OperationChooser {
    cumulative: Vec<(OperationKind, f64)>,
}

impl OperationChooser {
    pub fn new(proportions: &[(OperationKind, f64)]) -> OperationChooser {
        let total: f64 = proportions.iter().map(|(_, p)| p).sum();
        let mut running = 0.0;
        let cumulative = proportions
            .iter()
            .filter(|(_, p)| *p > 0.0)
            .map(|(kind, p)| {
                running += p / total;
                (*kind, running)
            })
            .collect();
        OperationChooser { cumulative }
    }

    /// The operations it can pick (those with a share above zero), in the order given.
    pub fn kinds(&self) -> impl Iterator<Item = OperationKind> + '_ {
        self.cumulative.iter().map(|(kind, _)| *kind)
    }

    pub fn next(&self, rng: &mut dyn rand::RngCore) -> OperationKind {
        let u: f64 = rand::Rng::random(rng);
        self.cumulative
            .iter()
            .find(|(_, bound)| u < *bound)
            .or(self.cumulative.last())
            .map(|(kind, _)| *kind)
            .unwrap_or(OperationKind::Read)
    }
}

/// Picks existing key numbers for one worker, following the request distribution.
pub enum KeyPicker {
    Fixed(Box<dyn KeyChooser>),
    Latest(SkewedLatest),
}

impl KeyPicker {
    pub fn new(distribution: RequestDistribution, record_count: u64) -> KeyPicker {
        let upper = record_count.max(1) - 1;
        match distribution {
            RequestDistribution::Uniform => KeyPicker::Fixed(Box::new(Uniform { lower: 0, upper })),
            RequestDistribution::Zipfian => {
                KeyPicker::Fixed(Box::new(ScrambledZipfian::new(0, upper)))
            }
            RequestDistribution::Hotspot => KeyPicker::Fixed(Box::new(Hotspot {
                lower: 0,
                upper,
                hot_set_fraction: 0.2,
                hot_operation_fraction: 0.8,
            })),
            RequestDistribution::Latest => {
                KeyPicker::Latest(SkewedLatest::new(record_count.max(1)))
            }
        }
    }

    /// A key number below `existing` (the keys inserted so far).
    pub fn next(&mut self, existing: u64, rng: &mut dyn rand::RngCore) -> u64 {
        match self {
            KeyPicker::Fixed(chooser) => chooser.next(rng).min(existing.saturating_sub(1)),
            KeyPicker::Latest(latest) => latest.next_below(existing, rng),
        }
    }
}

/// Scan lengths in `1..=max`.
pub enum ScanLength {
    Uniform(Uniform),
    Zipfian(Zipfian),
}

impl ScanLength {
    pub fn new(distribution: ScanLengthDistribution, max: u64) -> ScanLength {
        let max = max.max(1);
        match distribution {
            ScanLengthDistribution::Uniform => ScanLength::Uniform(Uniform {
                lower: 1,
                upper: max,
            }),
            ScanLengthDistribution::Zipfian => ScanLength::Zipfian(Zipfian::new(1, max)),
        }
    }

    pub fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64 {
        match self {
            ScanLength::Uniform(uniform) => uniform.next(rng),
            ScanLength::Zipfian(zipfian) => zipfian.next(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ycsb_workloads_have_ycsbs_proportions() {
        let a = Workload::ycsb('a').unwrap();
        assert_eq!(
            a.proportions,
            vec![(OperationKind::Read, 0.5), (OperationKind::Update, 0.5)]
        );
        assert_eq!(
            Workload::ycsb('d').unwrap().request_distribution,
            RequestDistribution::Latest
        );
        assert_eq!(Workload::ycsb('e').unwrap().max_scan_length, 100);
        assert!(Workload::ycsb('g').is_none());
    }

    #[test]
    fn the_chooser_follows_the_proportions() {
        let chooser = OperationChooser::new(&Workload::ycsb('b').unwrap().proportions);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let updates = (0..100_000)
            .filter(|_| chooser.next(&mut rng) == OperationKind::Update)
            .count();
        assert!((4_500..5_500).contains(&updates), "{updates}");
        let only_reads = OperationChooser::new(&Workload::ycsb('c').unwrap().proportions);
        assert!((0..1000).all(|_| only_reads.next(&mut rng) == OperationKind::Read));
        let only_points = OperationChooser::new(&Workload::point_range_mix(1.0, 10).proportions);
        assert_eq!(
            only_points.kinds().collect::<Vec<_>>(),
            vec![OperationKind::Point],
            "an operation without a share is never picked"
        );
    }

    #[test]
    fn picked_keys_always_exist_and_scan_lengths_stay_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for distribution in [
            RequestDistribution::Uniform,
            RequestDistribution::Zipfian,
            RequestDistribution::Latest,
            RequestDistribution::Hotspot,
        ] {
            let mut picker = KeyPicker::new(distribution, 1000);
            for existing in [1000, 1500] {
                for _ in 0..2000 {
                    assert!(picker.next(existing, &mut rng) < existing);
                }
            }
        }
        let mut lengths = ScanLength::new(ScanLengthDistribution::Uniform, 100);
        assert!((0..1000)
            .map(|_| lengths.next(&mut rng))
            .all(|l| (1..=100).contains(&l)));
    }
}
