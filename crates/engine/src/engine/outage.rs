//! Riding out object-store outages. A request that fails after the bucket's own retries (or
//! that hangs past their budget) is retried here, with capped backoff, for as long as the store
//! has been failing for less than `EngineOptions::outage_timeout`; only then is the error
//! answered. A database treats a failed fsync as fatal and a failed read as a failed query, so a
//! brownout of a few seconds must cost latency, not a crash. Writers keep going until the
//! unflushed bound, then wait with the barriers. docs/0004 has the contract.

use super::*;
use crate::bucket::{Bucket, ObjectInfo};
use std::future::Future;
use std::ops::Range;

/// The first wait between retries during an outage, doubled each time up to
/// OUTAGE_RETRY_WAIT_MAX_MS: a short brownout ends quickly, a long one costs few requests.
const OUTAGE_RETRY_WAIT_FIRST_MS: u64 = 200;
const OUTAGE_RETRY_WAIT_MAX_MS: u64 = 5_000;

/// Which requests fail. Each side has its own clock, ended only by a success of its own kind:
/// a store that serves reads but refuses writes is still down for barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutageSide {
    /// Uploads of log objects (barriers, write-behind).
    Uploads,
    /// Reads of extents and metadata that are not cached.
    Reads,
}

/// The engine's bucket, watched: any read the store answers ends an outage of reads, any
/// write it stores ends an outage of uploads. A read that gave up past the timeout must not
/// leave the outage reported after the store is back, and a read served from a cache says
/// nothing about the store, so the requests themselves are what ends an outage.
pub(super) struct StoreWatch {
    inner: SharedBucket,
    outages: Arc<Mutex<Outages>>,
}

impl StoreWatch {
    pub(super) fn new(inner: SharedBucket, outages: Arc<Mutex<Outages>>) -> StoreWatch {
        StoreWatch { inner, outages }
    }

    fn answered<T>(&self, side: OutageSide, result: &Result<T, StoreError>) {
        // NotFound and AlreadyExists are answers too: the store is there.
        if matches!(result, Err(StoreError::Transient(_))) {
            return;
        }
        let mut outages = self.outages.lock();
        if let Some(o) = outages.side(side).take() {
            tracing::warn!(
                ?side,
                seconds = o.since.elapsed().as_secs_f64(),
                "the object store answers again"
            );
        }
    }
}

#[async_trait::async_trait]
impl Bucket for StoreWatch {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        let r = self.inner.put(key, data, mode).await;
        self.answered(OutageSide::Uploads, &r);
        r
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let r = self.inner.get(key).await;
        self.answered(OutageSide::Reads, &r);
        r
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        let r = self.inner.get_range(key, range).await;
        self.answered(OutageSide::Reads, &r);
        r
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.inner.delete(key, mode).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let r = self.inner.list(prefix).await;
        self.answered(OutageSide::Reads, &r);
        r
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        self.inner.begin_writing().await
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        self.inner.end_writing().await
    }
}

/// An outage under way: since when requests of one side fail, and the last error.
pub(super) struct Outage {
    since: tokio::time::Instant,
    since_unix_s: u64,
    last_error: String,
}

/// The outages under way, by side.
#[derive(Default)]
pub(super) struct Outages {
    uploads: Option<Outage>,
    reads: Option<Outage>,
}

impl Outages {
    fn side(&mut self, side: OutageSide) -> &mut Option<Outage> {
        match side {
            OutageSide::Uploads => &mut self.uploads,
            OutageSide::Reads => &mut self.reads,
        }
    }
}

/// What `bucketfs status` shows of an outage.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StoreOutage {
    /// The requests that fail (the side failing longest when both do).
    pub requests: OutageSide,
    pub since_unix_s: u64,
    pub seconds: u64,
    pub last_error: String,
}

impl Engine {
    /// Records a request of `side` that started at `started` and failed with `error`. Returns
    /// how long its caller waits before it retries, or None once the store has been failing
    /// for the outage timeout. The outage starts when the first failing request did, so that
    /// a hang's own timeouts count against the outage timeout.
    pub(super) fn outage_wait(
        &self,
        side: OutageSide,
        started: tokio::time::Instant,
        error: &str,
        retries: u32,
    ) -> Option<Duration> {
        let timeout = self.inner.outage_timeout;
        let mut outages = self.inner.outage.lock();
        let o = outages.side(side).get_or_insert_with(|| {
            tracing::warn!(?side, error, timeout_s = timeout.as_secs(), "the object store is failing: requests wait and retry until it answers again or the outage timeout passes");
            let now_unix_s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            Outage {
                since: started,
                since_unix_s: now_unix_s.saturating_sub(started.elapsed().as_secs()),
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

    /// A request of `side` reached the store: the outage of that side, if any, is over.
    pub(super) fn outage_over(&self, side: OutageSide) {
        if let Some(o) = self.inner.outage.lock().side(side).take() {
            tracing::warn!(
                ?side,
                seconds = o.since.elapsed().as_secs_f64(),
                "the object store answers again"
            );
        }
    }

    /// Runs a read of the store (`op`, which may be retried whole) through an outage: while the
    /// store has failed reads for less than the outage timeout, a transient failure waits and
    /// tries again instead of answering the error.
    pub(super) async fn ride_out_reads<T, F, Fut>(&self, mut op: F) -> Result<T, EngineError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, EngineError>>,
    {
        let mut retries = 0;
        loop {
            let started = tokio::time::Instant::now();
            match op().await {
                Err(EngineError::Store(StoreError::Transient(why))) => {
                    match self.outage_wait(OutageSide::Reads, started, &why, retries) {
                        Some(wait) => {
                            retries += 1;
                            tokio::time::sleep(wait).await;
                        }
                        None => return Err(EngineError::Store(StoreError::Transient(why))),
                    }
                }
                // The outage, if any, ended when the store answered (`StoreWatch`).
                other => return other,
            }
        }
    }

    /// The outage under way, if requests are failing: the side failing longest.
    pub fn store_outage(&self) -> Option<StoreOutage> {
        let outages = self.inner.outage.lock();
        [
            (OutageSide::Uploads, &outages.uploads),
            (OutageSide::Reads, &outages.reads),
        ]
        .into_iter()
        .filter_map(|(side, o)| o.as_ref().map(|o| (side, o)))
        .min_by_key(|(_, o)| o.since)
        .map(|(side, o)| StoreOutage {
            requests: side,
            since_unix_s: o.since_unix_s,
            seconds: o.since.elapsed().as_secs(),
            last_error: o.last_error.clone(),
        })
    }
}
