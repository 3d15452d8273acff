//! How often clients ask for flush barriers: the engine starts writes on their way to the
//! bucket early (write-behind) only while barriers come often: every write while they come
//! every few milliseconds, gathered writes while they come every few hundred.

use crate::tuning::Tuning;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// A running mean of the gaps between barriers (weight 1/8 for the newest), and the time of the
/// last one. Updated without a lock: concurrent barriers may each miss the other's update,
/// which only blurs a mean that is a heuristic anyway.
pub struct BarrierCadence {
    epoch: Instant,
    last_us: AtomicU64,
    mean_gap_us: AtomicU64,
    every_write_gap_us: u64,
    gathered_gap_us: u64,
    counted_gap_max_us: u64,
}

impl BarrierCadence {
    pub fn new(tuning: &Tuning) -> Self {
        BarrierCadence {
            epoch: Instant::now(),
            last_us: AtomicU64::new(0),
            // Starts as if barriers were rare.
            mean_gap_us: AtomicU64::new(tuning.barrier_gap_counted_max_us),
            every_write_gap_us: tuning.write_behind_barrier_gap_us,
            gathered_gap_us: tuning.write_behind_gathered_barrier_gap_us,
            counted_gap_max_us: tuning.barrier_gap_counted_max_us,
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A client asked for a barrier.
    pub fn note(&self) {
        self.note_at(self.now_us());
    }

    /// Which write-behind the barriers' cadence, on average and lately, calls for.
    pub fn write_behind(&self) -> WriteBehind {
        self.write_behind_at(self.now_us())
    }

    fn note_at(&self, now_us: u64) {
        let last = self.last_us.swap(now_us, Ordering::Relaxed);
        let gap = now_us.saturating_sub(last).min(self.counted_gap_max_us) as i64;
        let mean = self.mean_gap_us.load(Ordering::Relaxed) as i64;
        self.mean_gap_us
            .store((mean + (gap - mean) / 8) as u64, Ordering::Relaxed);
    }

    fn write_behind_at(&self, now_us: u64) -> WriteBehind {
        let since_last = now_us.saturating_sub(self.last_us.load(Ordering::Relaxed));
        let gap = since_last.max(self.mean_gap_us.load(Ordering::Relaxed));
        if gap <= self.every_write_gap_us {
            WriteBehind::EveryWrite
        } else if gap <= self.gathered_gap_us {
            WriteBehind::Gathered
        } else {
            WriteBehind::Off
        }
    }

    #[cfg(test)]
    fn frequent_at(&self, now_us: u64) -> bool {
        self.write_behind_at(now_us) == WriteBehind::EveryWrite
    }
}

/// When writes start on their way to the bucket ahead of the barrier that will need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBehind {
    /// Barriers are rare (bulk writes, an idle client): writes gather until a barrier or until
    /// enough are in memory for a large object.
    Off,
    /// A barrier every few hundred milliseconds (PostgreSQL with `synchronous_commit = off`,
    /// whose WAL writer flushes several times a second): once
    /// `Tuning::write_behind_gathered_bytes` have gathered, so a barrier seals at most about that
    /// much while the client waits.
    Gathered,
    /// A barrier every few milliseconds (an fsync per transaction): every write.
    EveryWrite,
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITE_BEHIND_BARRIER_GAP_US: u64 = 4_000;
    const WRITE_BEHIND_GATHERED_BARRIER_GAP_US: u64 = 250_000;

    /// Barriers every `gap_us` from `start_us`, `count` of them; returns the time of the last.
    fn barriers(c: &BarrierCadence, start_us: u64, gap_us: u64, count: u64) -> u64 {
        let mut t = start_us;
        for _ in 0..count {
            t += gap_us;
            c.note_at(t);
        }
        t
    }

    #[test]
    fn an_fsync_per_transaction_turns_write_behind_on_within_dozens_of_barriers() {
        let c = BarrierCadence::new(&Tuning::default());
        assert!(!c.frequent_at(0), "a fresh engine has seen no barriers");
        let t = barriers(&c, 0, 1_000, 10);
        assert!(
            !c.frequent_at(t),
            "ten barriers do not yet outweigh the start"
        );
        let t = barriers(&c, t, 1_000, 40);
        assert!(c.frequent_at(t));
        assert!(c.frequent_at(t + WRITE_BEHIND_BARRIER_GAP_US));
    }

    #[test]
    fn barriers_that_stop_or_slow_down_turn_it_off() {
        let c = BarrierCadence::new(&Tuning::default());
        let t = barriers(&c, 0, 1_000, 100);
        assert!(c.frequent_at(t));
        assert!(
            !c.frequent_at(t + WRITE_BEHIND_BARRIER_GAP_US + 1),
            "no barrier lately"
        );
        let t = barriers(&c, t, 100_000, 3);
        assert!(!c.frequent_at(t), "barriers 100 ms apart are not frequent");
    }

    #[test]
    fn barriers_a_tenth_of_a_second_apart_gather_writes() {
        let c = BarrierCadence::new(&Tuning::default());
        assert_eq!(c.write_behind_at(0), WriteBehind::Off);
        let t = barriers(&c, 0, 100_000, 40);
        assert_eq!(c.write_behind_at(t), WriteBehind::Gathered);
        assert_eq!(
            c.write_behind_at(t + WRITE_BEHIND_GATHERED_BARRIER_GAP_US + 1),
            WriteBehind::Off,
            "no barrier lately"
        );
        let t = barriers(&c, t, 5_000_000, 20);
        assert_eq!(
            c.write_behind_at(t),
            WriteBehind::Off,
            "a file system's journal commits every 5 s"
        );
    }

    #[test]
    fn occasional_bursts_among_rare_barriers_do_not_turn_it_on() {
        // A file system's journal commit can send two flushes back to back every few seconds.
        let c = BarrierCadence::new(&Tuning::default());
        let mut t = 0;
        for _ in 0..20 {
            t = barriers(&c, t, 100_000, 1);
            t = barriers(&c, t, 100, 1);
            assert!(!c.frequent_at(t));
        }
    }
}
