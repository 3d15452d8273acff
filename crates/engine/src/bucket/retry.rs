//! Retries transient object-store failures with exponential backoff, abandoning an attempt that
//! does not answer in time and giving up once a request has used its budget; bounds the GETs in
//! flight, so that a store slower than its clients' demand queues them here instead of timing
//! every one of them out.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use crate::limits::{
    STORE_ATTEMPTS_MAX, STORE_ATTEMPT_MS_PER_MIB, STORE_ATTEMPT_TIMEOUT_MS,
    STORE_GETS_IN_FLIGHT_MAX, STORE_GET_TIMEOUT_MS, STORE_REQUEST_BUDGET_MS,
    STORE_RETRY_BASE_DELAY_MS,
};
use async_trait::async_trait;
use bytes::Bytes;
use std::future::Future;
use std::ops::Range;
use std::time::Duration;
use tokio::sync::Semaphore;

pub struct RetryingBucket {
    inner: SharedBucket,
    limits: RetryLimits,
    /// A permit per GET in flight (STORE_GETS_IN_FLIGHT_MAX), held across its attempts.
    gets: Semaphore,
}

/// How long one request may take: per attempt, and over all its attempts.
#[derive(Debug, Clone, Copy)]
pub struct RetryLimits {
    pub attempts_max: u32,
    /// An attempt's timeout before its size is counted.
    pub attempt: Duration,
    /// Added to an attempt's timeout per MiB of body or range.
    pub per_mib: Duration,
    /// The timeout of a whole-object GET, whose size is not known up front.
    pub get: Duration,
    /// No new attempt starts once the request has taken this long.
    pub budget: Duration,
    /// GETs in flight at once; more wait before their first attempt.
    pub gets_in_flight: usize,
}

impl Default for RetryLimits {
    fn default() -> Self {
        Self {
            attempts_max: STORE_ATTEMPTS_MAX,
            attempt: Duration::from_millis(STORE_ATTEMPT_TIMEOUT_MS),
            per_mib: Duration::from_millis(STORE_ATTEMPT_MS_PER_MIB),
            get: Duration::from_millis(STORE_GET_TIMEOUT_MS),
            budget: Duration::from_millis(STORE_REQUEST_BUDGET_MS),
            gets_in_flight: STORE_GETS_IN_FLIGHT_MAX,
        }
    }
}

impl RetryLimits {
    fn sized(&self, bytes: u64) -> Duration {
        self.attempt + self.per_mib.mul_f64(bytes as f64 / (1u64 << 20) as f64)
    }
}

impl RetryingBucket {
    pub fn new(inner: SharedBucket) -> Self {
        Self::with_limits(inner, RetryLimits::default())
    }

    pub fn with_limits(inner: SharedBucket, limits: RetryLimits) -> Self {
        Self {
            inner,
            gets: Semaphore::new(limits.gets_in_flight.max(1)),
            limits,
        }
    }

    async fn run<T, F, Fut>(
        &self,
        what: &str,
        key: &str,
        timeout: Duration,
        mut op: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let started = tokio::time::Instant::now();
        let mut delay_ms = STORE_RETRY_BASE_DELAY_MS;
        let mut attempt = 1;
        loop {
            // A hung attempt is dropped (its connection closed) and counts as a transient
            // failure, so that it never holds its caller longer than the timeout.
            let result = match tokio::time::timeout(timeout, op()).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Transient(format!(
                    "{what} {key}: no answer within {:.1} s",
                    timeout.as_secs_f64()
                ))),
            };
            let delay = Duration::from_millis(delay_ms);
            match result {
                Err(StoreError::Transient(msg))
                    if attempt < self.limits.attempts_max
                        && started.elapsed() + delay < self.limits.budget =>
                {
                    tracing::warn!(%what, %key, attempt, delay_ms, error = %msg, "object-store request failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay_ms *= 2;
                    attempt += 1;
                }
                Err(StoreError::Transient(msg)) => {
                    return Err(StoreError::Transient(format!(
                        "{msg} (gave up after {attempt} attempts in {:.1} s)",
                        started.elapsed().as_secs_f64()
                    )))
                }
                other => return other,
            }
        }
    }
}

#[async_trait]
impl Bucket for RetryingBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        let timeout = self.limits.sized(data.len() as u64);
        self.run("PUT", key, timeout, || {
            self.inner.put(key, data.clone(), mode)
        })
        .await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let _turn = self.gets.acquire().await.expect("never closed");
        self.run("GET", key, self.limits.get, || self.inner.get(key))
            .await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        let _turn = self.gets.acquire().await.expect("never closed");
        let timeout = self.limits.sized(range.end.saturating_sub(range.start));
        self.run("GET", key, timeout, || {
            self.inner.get_range(key, range.clone())
        })
        .await
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.run("DELETE", key, self.limits.attempt, || {
            self.inner.delete(key, mode)
        })
        .await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.run("LIST", prefix, self.limits.get, || self.inner.list(prefix))
            .await
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        self.inner.begin_writing().await
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        self.inner.end_writing().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{open_url, Fault, FaultyBucket};
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gets_past_the_bound_wait_their_turn_without_timing_out() {
        let store = open_url("memory://", &Vec::new()).unwrap();
        store
            .put("log/1", Bytes::from(vec![7u8; 4096]), PutMode::Create)
            .await
            .unwrap();
        let faults = Arc::new(FaultyBucket::new(store));
        faults.set(Fault::Delay(Duration::from_millis(100)));
        // One attempt of 300 ms each, 4 at a time: the 40th GET waits 900 ms for its turn,
        // which must not count against its attempt.
        let b = Arc::new(RetryingBucket::with_limits(
            faults,
            RetryLimits {
                attempts_max: 1,
                attempt: Duration::from_millis(300),
                per_mib: Duration::ZERO,
                gets_in_flight: 4,
                ..RetryLimits::default()
            },
        ));
        let started = tokio::time::Instant::now();
        let gets: Vec<_> = (0..40)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.get_range("log/1", i..i + 100).await })
            })
            .collect();
        for g in gets {
            assert_eq!(g.await.unwrap().unwrap().len(), 100);
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900),
            "40 GETs of 100 ms, 4 at a time, took {took:?}"
        );
    }
}
