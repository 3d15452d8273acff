//! Retries transient object-store failures with exponential backoff.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use crate::limits::{STORE_ATTEMPTS_MAX, STORE_REQUEST_TIMEOUT_MS, STORE_RETRY_BASE_DELAY_MS};
use async_trait::async_trait;
use bytes::Bytes;
use std::future::Future;
use std::ops::Range;
use std::time::Duration;

pub struct RetryingBucket {
    inner: SharedBucket,
    attempts_max: u32,
}

impl RetryingBucket {
    pub fn new(inner: SharedBucket) -> Self {
        Self {
            inner,
            attempts_max: STORE_ATTEMPTS_MAX,
        }
    }

    async fn run<T, F, Fut>(&self, what: &str, key: &str, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut delay_ms = STORE_RETRY_BASE_DELAY_MS;
        let mut attempt = 1;
        loop {
            let result =
                match tokio::time::timeout(Duration::from_millis(STORE_REQUEST_TIMEOUT_MS), op())
                    .await
                {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Transient(format!("{what} {key}: timed out"))),
                };
            match result {
                Err(StoreError::Transient(msg)) if attempt < self.attempts_max => {
                    tracing::warn!(%what, %key, attempt, delay_ms, error = %msg, "object-store request failed; retrying");
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    delay_ms *= 2;
                    attempt += 1;
                }
                Err(StoreError::Transient(msg)) => {
                    return Err(StoreError::Transient(format!(
                        "{msg} (gave up after {attempt} attempts)"
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
        self.run("PUT", key, || self.inner.put(key, data.clone(), mode))
            .await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.run("GET", key, || self.inner.get(key)).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.run("GET", key, || self.inner.get_range(key, range.clone()))
            .await
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.run("DELETE", key, || self.inner.delete(key, mode))
            .await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.run("LIST", prefix, || self.inner.list(prefix)).await
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        self.inner.begin_writing().await
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        self.inner.end_writing().await
    }
}
