//! Riding out object-store outages. A barrier whose upload fails (after the bucket's own
//! retries) waits and retries, with capped backoff, for as long as the store has been failing
//! for less than `EngineOptions::outage_timeout`; only then does it answer the error. A
//! database treats a failed fsync as fatal, so a brownout of a few seconds must cost latency,
//! not a crash. Writers keep going until the unflushed bound, then wait with the barriers.

use super::*;

/// The first wait between barrier retries during an outage, doubled each time up to
/// OUTAGE_RETRY_WAIT_MAX_MS: a short brownout ends quickly, a long one costs few requests.
const OUTAGE_RETRY_WAIT_FIRST_MS: u64 = 200;
const OUTAGE_RETRY_WAIT_MAX_MS: u64 = 5_000;

/// An outage under way: since when uploads fail, and the last error.
pub(super) struct Outage {
    since: tokio::time::Instant,
    since_unix_s: u64,
    last_error: String,
}

/// What `bucketfs status` shows of an outage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StoreOutage {
    pub since_unix_s: u64,
    pub seconds: u64,
    pub last_error: String,
}

impl Engine {
    /// Records a failed upload. Returns how long the barrier waits before it retries, or None
    /// once the store has been failing for the outage timeout.
    pub(super) fn outage_wait(&self, error: &str, retries: u32) -> Option<Duration> {
        let timeout = self.inner.outage_timeout;
        let mut outage = self.inner.outage.lock();
        let o = outage.get_or_insert_with(|| {
            tracing::warn!(error, timeout_s = timeout.as_secs(), "the object store is failing: barriers wait and retry until it answers again or the outage timeout passes");
            Outage {
                since: tokio::time::Instant::now(),
                since_unix_s: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                last_error: String::new(),
            }
        });
        o.last_error = error.to_string();
        let left = timeout
            .checked_sub(o.since.elapsed())
            .filter(|l| !l.is_zero())?;
        let wait = OUTAGE_RETRY_WAIT_FIRST_MS
            .saturating_mul(1 << retries.min(16))
            .min(OUTAGE_RETRY_WAIT_MAX_MS);
        Some(Duration::from_millis(wait).min(left))
    }

    /// An upload was stored: the outage, if any, is over.
    pub(super) fn outage_over(&self) {
        if let Some(o) = self.inner.outage.lock().take() {
            tracing::warn!(
                seconds = o.since.elapsed().as_secs_f64(),
                "the object store answers again"
            );
        }
    }

    /// The outage under way, if uploads are failing.
    pub fn store_outage(&self) -> Option<StoreOutage> {
        self.inner.outage.lock().as_ref().map(|o| StoreOutage {
            since_unix_s: o.since_unix_s,
            seconds: o.since.elapsed().as_secs(),
            last_error: o.last_error.clone(),
        })
    }
}
