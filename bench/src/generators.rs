//! YCSB's number generators, reproduced from its `site.ycsb.generator` package so that a
//! workload here asks for the same keys, in the same skew, as YCSB would.
//!
//! - [`Uniform`] — every key equally likely.
//! - [`Zipfian`] — Gray et al.'s algorithm ("Quickly generating billion-record synthetic
//!   databases"), constant 0.99; item 0 is the most popular.
//! - [`ScrambledZipfian`] — zipfian popularity spread over the key space by hashing, so
//!   popular keys are not neighbours (YCSB's default "zipfian" request distribution).
//! - [`SkewedLatest`] — zipfian over recency: the newest inserted keys are the hottest.
//! - [`Hotspot`] — a hot set (a fraction of keys) receiving a fraction of the operations.
//! - [`fnv_hash64`] — YCSB's key hash (`Utils.fnvhash64`), used for key names and scrambling.

use rand::Rng;

/// YCSB's FNV-1 64-bit hash of a long, made non-negative as `Math.abs` does.
pub fn fnv_hash64(mut value: i64) -> i64 {
    const OFFSET_BASIS: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
    const PRIME: i64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    for _ in 0..8 {
        let octet = value & 0xff;
        value >>= 8;
        hash ^= octet;
        hash = hash.wrapping_mul(PRIME);
    }
    hash.wrapping_abs()
}

/// YCSB's key name for key number `number` (`user` + hashed number, not ordered).
pub fn key_name(number: u64) -> String {
    format!("user{}", fnv_hash64(number as i64))
}

/// A source of key numbers.
pub trait KeyChooser: Send {
    fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64;
}

/// Uniform over `[lower, upper]`.
#[derive(Debug, Clone)]
pub struct Uniform {
    pub lower: u64,
    pub upper: u64,
}

impl KeyChooser for Uniform {
    fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64 {
        rng.random_range(self.lower..=self.upper)
    }
}

/// YCSB's default zipfian constant.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;

fn zeta(from: u64, to: u64, theta: f64, initial: f64) -> f64 {
    (from..to).fold(initial, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// Zipfian over `[base, base + items)`; smaller numbers are more popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    base: u64,
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2theta: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(base: u64, items: u64) -> Zipfian {
        Zipfian::with_zetan(base, items, zeta(0, items, ZIPFIAN_CONSTANT, 0.0))
    }

    /// With a precomputed zeta(items) (YCSB does this for 10^10 items).
    pub fn with_zetan(base: u64, items: u64, zetan: f64) -> Zipfian {
        let theta = ZIPFIAN_CONSTANT;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        let mut generator = Zipfian {
            base,
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2theta,
            zetan,
            eta: 0.0,
        };
        generator.eta = generator.eta_for(items);
        generator
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan)
    }

    /// Grows the item count, updating zeta incrementally (for [`SkewedLatest`]).
    pub fn grow_to(&mut self, items: u64) {
        if items > self.items {
            self.zetan = zeta(self.items, items, self.theta, self.zetan);
            self.items = items;
            self.eta = self.eta_for(items);
        }
    }

    pub fn next_value(&self, rng: &mut dyn rand::RngCore) -> u64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        let offset = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        self.base + offset.min(self.items - 1)
    }
}

impl KeyChooser for Zipfian {
    fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64 {
        self.next_value(rng)
    }
}

/// Zipfian popularity, scattered over `[lower, upper]` by hashing (YCSB's default).
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    lower: u64,
    item_count: u64,
    zipfian: Zipfian,
}

/// YCSB draws from a zipfian over 10^10 items and hashes; zeta(10^10, 0.99) precomputed.
const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

impl ScrambledZipfian {
    pub fn new(lower: u64, upper: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            lower,
            item_count: upper - lower + 1,
            zipfian: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, SCRAMBLED_ZETAN),
        }
    }
}

impl KeyChooser for ScrambledZipfian {
    fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64 {
        let value = self.zipfian.next_value(rng);
        self.lower + (fnv_hash64(value as i64) as u64) % self.item_count
    }
}

/// The newest keys are the most popular: `latest - zipfian(latest)`.
#[derive(Debug, Clone)]
pub struct SkewedLatest {
    zipfian: Zipfian,
}

impl SkewedLatest {
    pub fn new(initial_items: u64) -> SkewedLatest {
        SkewedLatest {
            zipfian: Zipfian::new(0, initial_items.max(1)),
        }
    }

    /// The key for the current `latest` key count (keys `0..latest` exist).
    pub fn next_below(&mut self, latest: u64, rng: &mut dyn rand::RngCore) -> u64 {
        self.zipfian.grow_to(latest.max(1));
        let offset = self.zipfian.next_value(rng);
        latest.saturating_sub(1).saturating_sub(offset)
    }
}

/// A hot set of `hot_set_fraction` of the keys gets `hot_operation_fraction` of the picks.
#[derive(Debug, Clone)]
pub struct Hotspot {
    pub lower: u64,
    pub upper: u64,
    pub hot_set_fraction: f64,
    pub hot_operation_fraction: f64,
}

impl KeyChooser for Hotspot {
    fn next(&mut self, rng: &mut dyn rand::RngCore) -> u64 {
        let interval = self.upper - self.lower + 1;
        let hot = ((interval as f64 * self.hot_set_fraction) as u64).clamp(1, interval);
        let cold = interval - hot;
        if cold == 0 || rng.random::<f64>() < self.hot_operation_fraction {
            self.lower + rng.random_range(0..hot)
        } else {
            self.lower + hot + rng.random_range(0..cold)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    fn fnv_hash_matches_ycsb() {
        // FNV-1 over the 8 little-endian bytes, then |x|, computed independently.
        assert_eq!(fnv_hash64(0), 6_284_781_860_667_377_211);
        assert_eq!(key_name(42), "user55488592825689361");
        assert!(fnv_hash64(-1) >= 0);
    }

    #[test]
    fn uniform_stays_in_bounds_and_covers_them() {
        let mut chooser = Uniform {
            lower: 10,
            upper: 19,
        };
        let mut rng = rng();
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let value = chooser.next(&mut rng);
            assert!((10..=19).contains(&value));
            seen[(value - 10) as usize] += 1;
        }
        assert!(
            seen.iter().all(|&count| (800..1200).contains(&count)),
            "{seen:?}"
        );
    }

    #[test]
    fn zipfian_favours_small_numbers_like_theory() {
        let mut chooser = Zipfian::new(0, 1000);
        let mut rng = rng();
        let draws = 200_000;
        let mut first = 0;
        for _ in 0..draws {
            let value = chooser.next(&mut rng);
            assert!(value < 1000);
            if value == 0 {
                first += 1;
            }
        }
        // P(0) = 1 / zeta(1000, 0.99) ~= 0.134.
        let expected = 1.0 / zeta(0, 1000, ZIPFIAN_CONSTANT, 0.0);
        let observed = first as f64 / draws as f64;
        assert!(
            (observed - expected).abs() < 0.01,
            "observed {observed}, expected {expected}"
        );
    }

    #[test]
    fn scrambled_zipfian_is_skewed_but_spread() {
        let mut chooser = ScrambledZipfian::new(0, 9_999);
        let mut rng = rng();
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let value = chooser.next(&mut rng);
            assert!(value < 10_000);
            *counts.entry(value).or_insert(0u32) += 1;
        }
        let mut by_popularity: Vec<u32> = counts.values().copied().collect();
        by_popularity.sort_unstable_by(|a, b| b.cmp(a));
        let top_ten: u32 = by_popularity.iter().take(10).sum();
        assert!(
            top_ten > 10_000,
            "the ten hottest keys take a large share ({top_ten})"
        );
        let hottest = counts
            .iter()
            .max_by_key(|(_, c)| **c)
            .map(|(k, _)| *k)
            .unwrap_or(0);
        assert_ne!(
            hottest, 0,
            "popularity is scattered, not at the start of the range"
        );
    }

    #[test]
    fn skewed_latest_prefers_recent_keys() {
        let mut chooser = SkewedLatest::new(100);
        let mut rng = rng();
        let latest = 5_000;
        let mut recent = 0;
        for _ in 0..10_000 {
            let value = chooser.next_below(latest, &mut rng);
            assert!(value < latest);
            if value >= latest - 100 {
                recent += 1;
            }
        }
        assert!(
            recent > 5_000,
            "most picks are among the newest 100 keys ({recent})"
        );
    }

    #[test]
    fn hotspot_sends_the_hot_fraction_to_the_hot_set() {
        let mut chooser = Hotspot {
            lower: 0,
            upper: 999,
            hot_set_fraction: 0.2,
            hot_operation_fraction: 0.8,
        };
        let mut rng = rng();
        let hot = (0..20_000).filter(|_| chooser.next(&mut rng) < 200).count();
        assert!((15_400..16_600).contains(&hot), "{hot}");
    }
}
