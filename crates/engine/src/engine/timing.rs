//! Where a client's flush barrier spends its time: the whole barrier and each part of it, as
//! latency histograms (docs/0008-metrics.md). The parts are the stages `barrier.rs` already has;
//! a barrier adds up its time per part on its own stack and records it once, when it returns.

use super::*;
use crate::histogram::{Histogram, HistogramSnapshot};
use tokio::time::Instant;

/// A part of a client's barrier. The parts follow one another within a barrier, so their times
/// add up to about the whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierPart {
    /// Held while a checkpoint catches up (`Engine::wait_for_checkpoint`).
    CheckpointHold,
    /// Waiting to seal, while another batch is being sealed (a write-behind's, a background
    /// flush's, a concurrent barrier's).
    SealWait,
    /// Freezing the pending batch and sealing it (compressing and encrypting its extents and
    /// records) into a log object. Near zero when a batch sealed before covers the barrier.
    Seal,
    /// Waiting for uploads that run elsewhere (a write-behind's, an earlier barrier's, or this
    /// barrier's own object when a task uploads it beside an earlier one), and for the lock
    /// under which stored objects commit.
    UploadWait,
    /// PUTs this barrier ran itself: when no upload was in flight, the first queued object.
    Put,
    /// Committing stored objects, in sequence order (`Engine::commit_sealed`).
    Commit,
    /// Waiting out an object-store outage between retries (docs/0004-outages.md).
    OutageWait,
}

impl BarrierPart {
    pub const ALL: [BarrierPart; 7] = [
        BarrierPart::CheckpointHold,
        BarrierPart::SealWait,
        BarrierPart::Seal,
        BarrierPart::UploadWait,
        BarrierPart::Put,
        BarrierPart::Commit,
        BarrierPart::OutageWait,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BarrierPart::CheckpointHold => "checkpoint_hold",
            BarrierPart::SealWait => "seal_wait",
            BarrierPart::Seal => "seal",
            BarrierPart::UploadWait => "upload_wait",
            BarrierPart::Put => "put",
            BarrierPart::Commit => "commit",
            BarrierPart::OutageWait => "outage_wait",
        }
    }
}

/// One barrier's time per part, in microseconds, added up as it goes.
#[derive(Default)]
pub(super) struct PartTimes {
    us: [u64; BarrierPart::ALL.len()],
}

impl PartTimes {
    /// Adds the time since `since` to `part`, and returns now: where the next part starts.
    pub(super) fn add(&mut self, part: BarrierPart, since: Instant) -> Instant {
        let now = Instant::now();
        let us = u64::try_from((now - since).as_micros()).unwrap_or(u64::MAX);
        self.us[part as usize] = self.us[part as usize].saturating_add(us);
        now
    }
}

/// The histograms of client barriers.
#[derive(Default)]
pub(super) struct BarrierTimes {
    whole: Histogram,
    parts: [Histogram; BarrierPart::ALL.len()],
}

impl BarrierTimes {
    /// Records a barrier: every part, those it did not go through as zero, so each part has
    /// one observation per barrier and its quantiles read as "a barrier spends this long here".
    pub(super) fn record(&self, whole: Duration, parts: &PartTimes) {
        self.whole.record(whole);
        for (histogram, us) in self.parts.iter().zip(parts.us) {
            histogram.record_us(us);
        }
    }
}

/// Snapshots of the barrier histograms (`Engine::barrier_latency`).
#[derive(Debug, Clone)]
pub struct BarrierLatency {
    /// From the client's call to its return.
    pub whole: HistogramSnapshot,
    pub parts: [(BarrierPart, HistogramSnapshot); BarrierPart::ALL.len()],
}

impl Engine {
    /// The latency of the barriers clients asked for (`Engine::flush`), whole and per part; the
    /// engine's own barriers (periodic, memory pressure, closing) are not in it.
    pub fn barrier_latency(&self) -> BarrierLatency {
        let t = &self.inner.counters.barrier_times;
        BarrierLatency {
            whole: t.whole.snapshot(),
            parts: BarrierPart::ALL.map(|part| (part, t.parts[part as usize].snapshot())),
        }
    }
}
