//! Retries transient object-store failures with exponential backoff, abandoning an attempt that
//! does not answer in time and giving up once a request has used its budget.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use crate::limits::{
    STORE_ATTEMPTS_MAX, STORE_ATTEMPT_MS_PER_MIB, STORE_ATTEMPT_TIMEOUT_MS, STORE_GET_TIMEOUT_MS,
    STORE_REQUEST_BUDGET_MS, STORE_RETRY_BASE_DELAY_MS,
};
use async_trait::async_trait;
use bytes::Bytes;
use std::future::Future;
use std::ops::Range;
use std::time::Duration;

pub struct RetryingBucket {
    inner: SharedBucket,
    limits: RetryLimits,
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
}

impl Default for RetryLimits {
    fn default() -> Self {
        Self {
            attempts_max: STORE_ATTEMPTS_MAX,
            attempt: Duration::from_millis(STORE_ATTEMPT_TIMEOUT_MS),
            per_mib: Duration::from_millis(STORE_ATTEMPT_MS_PER_MIB),
            get: Duration::from_millis(STORE_GET_TIMEOUT_MS),
            budget: Duration::from_millis(STORE_REQUEST_BUDGET_MS),
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
        Self { inner, limits }
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
        self.run("GET", key, self.limits.get, || self.inner.get(key))
            .await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
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
