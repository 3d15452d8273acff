//! Latency histograms for the hot paths (the flush barrier, every object-store request): an
//! observation is two relaxed atomic adds, with no lock and no allocation, so timing costs the
//! paths it measures nothing they would notice. The metrics endpoint reads snapshots and writes
//! them as Prometheus histograms (crates/bucketfs/src/metrics.rs; docs/0008-metrics.md).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the buckets in microseconds (a bucket holds what is at most its bound):
/// 1, 1.5, 2, 3, 5 and 7 per decade, from 10 us to 10 s. Bounds this close apart (at most 1.5
/// times the one before) keep one, two and three round trips of 20 ms in different buckets
/// (20-30, 30-50 and 50-70 ms), which is what the per-barrier breakdown is for.
pub const BUCKET_BOUNDS_US: [u64; 37] = [
    10, 15, 20, 30, 50, 70, //
    100, 150, 200, 300, 500, 700, //
    1_000, 1_500, 2_000, 3_000, 5_000, 7_000, //
    10_000, 15_000, 20_000, 30_000, 50_000, 70_000, //
    100_000, 150_000, 200_000, 300_000, 500_000, 700_000, //
    1_000_000, 1_500_000, 2_000_000, 3_000_000, 5_000_000, 7_000_000, //
    10_000_000,
];

/// The buckets with a bound, and the last one for everything longer (Prometheus' `+Inf`).
pub const BUCKETS: usize = BUCKET_BOUNDS_US.len() + 1;

const _: () = {
    let mut i = 1;
    while i < BUCKET_BOUNDS_US.len() {
        assert!(BUCKET_BOUNDS_US[i - 1] < BUCKET_BOUNDS_US[i]);
        i += 1;
    }
};

#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn record(&self, elapsed: Duration) {
        self.record_us(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn record_us(&self, us: u64) {
        let bucket = BUCKET_BOUNDS_US.partition_point(|&bound| bound < us);
        self.counts[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// Read bucket by bucket while observations go on: the count is the buckets' total, so
    /// the two always agree; the sum may differ by the observations made meanwhile.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Relaxed)),
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Observations per bucket (not cumulative); the last is those above every bound.
    pub counts: [u64; BUCKETS],
    pub sum_us: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot {
            counts: [0; BUCKETS],
            sum_us: 0,
        }
    }
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_holds_it() {
        let h = Histogram::default();
        for us in [
            0,
            10,
            11,
            20_000,
            20_001,
            10_000_000,
            10_000_001,
            3_600_000_000,
        ] {
            h.record_us(us);
        }
        h.record(Duration::from_millis(45));
        let s = h.snapshot();
        assert_eq!(s.count(), 9);
        let at = |bound: u64| s.counts[BUCKET_BOUNDS_US.iter().position(|&b| b == bound).unwrap()];
        assert_eq!(at(10), 2, "0 and 10 us (a bound is inclusive)");
        assert_eq!(at(15), 1, "11 us");
        assert_eq!(at(20_000), 1);
        assert_eq!(at(30_000), 1, "20.001 ms");
        assert_eq!(at(50_000), 1, "45 ms");
        assert_eq!(at(10_000_000), 1);
        assert_eq!(s.counts[BUCKETS - 1], 2, "above every bound");
        assert_eq!(at(70), 0);
    }
}
