//! Counts requests and bytes per kind, for `bucketfs status`, the cost figures of the benchmarks
//! and the idle test.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Debug, Default)]
struct Counters {
    get: AtomicU64,
    put: AtomicU64,
    list: AtomicU64,
    delete: AtomicU64,
    errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct RequestCounts {
    pub get: u64,
    pub put: u64,
    pub list: u64,
    pub delete: u64,
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

pub struct CountingBucket {
    inner: SharedBucket,
    counters: Arc<Counters>,
}

impl CountingBucket {
    pub fn new(inner: SharedBucket) -> Self {
        Self {
            inner,
            counters: Arc::default(),
        }
    }

    pub fn counts(&self) -> RequestCounts {
        let c = &self.counters;
        RequestCounts {
            get: c.get.load(Relaxed),
            put: c.put.load(Relaxed),
            list: c.list.load(Relaxed),
            delete: c.delete.load(Relaxed),
            errors: c.errors.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
        }
    }

    /// Counts failures; a missing object is an answer, not a failure.
    fn note<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(r, Err(ref e) if !matches!(e, StoreError::NotFound(_))) {
            self.counters.errors.fetch_add(1, Relaxed);
        }
        r
    }
}

#[async_trait]
impl Bucket for CountingBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        self.counters.put.fetch_add(1, Relaxed);
        self.counters
            .bytes_written
            .fetch_add(data.len() as u64, Relaxed);
        self.note(self.inner.put(key, data, mode).await)
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.counters.get.fetch_add(1, Relaxed);
        let r = self.note(self.inner.get(key).await)?;
        self.counters.bytes_read.fetch_add(r.len() as u64, Relaxed);
        Ok(r)
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.counters.get.fetch_add(1, Relaxed);
        let r = self.note(self.inner.get_range(key, range).await)?;
        self.counters.bytes_read.fetch_add(r.len() as u64, Relaxed);
        Ok(r)
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.counters.delete.fetch_add(1, Relaxed);
        self.note(self.inner.delete(key, mode).await)
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.counters.list.fetch_add(1, Relaxed);
        self.note(self.inner.list(prefix).await)
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        self.inner.begin_writing().await
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        self.inner.end_writing().await
    }
}
