//! Counts requests, failures and bytes and times every request, per operation, for `bucketfs
//! status`, the metrics endpoint (docs/0008-metrics.md), the cost figures of the benchmarks and
//! the idle test. It sits below the retries, so every attempt counts.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use crate::histogram::{Histogram, HistogramSnapshot};
use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::time::Instant;

/// The operations of [`Bucket`] that reach the object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Get,
    GetRange,
    Put,
    List,
    Delete,
}

impl StoreOp {
    pub const ALL: [StoreOp; 5] = [
        StoreOp::Get,
        StoreOp::GetRange,
        StoreOp::Put,
        StoreOp::List,
        StoreOp::Delete,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::GetRange => "get_range",
            StoreOp::Put => "put",
            StoreOp::List => "list",
            StoreOp::Delete => "delete",
        }
    }
}

#[derive(Debug, Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    /// Sent for a PUT, received for a GET.
    bytes: AtomicU64,
    latency: Histogram,
}

/// What one operation has done since the process started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    pub op: StoreOp,
    pub requests: u64,
    /// Failed requests; a missing object is an answer, not a failure.
    pub errors: u64,
    /// Bytes sent (PUT) or received (GET, ranged GET).
    pub bytes: u64,
    /// From the request to its answer, failures included.
    pub latency: HistogramSnapshot,
}

/// The totals `bucketfs status` shows (GET counts ranged GETs too).
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
    ops: [OpCounters; StoreOp::ALL.len()],
}

impl CountingBucket {
    pub fn new(inner: SharedBucket) -> Self {
        Self {
            inner,
            ops: Default::default(),
        }
    }

    pub fn op_stats(&self) -> [OpStats; StoreOp::ALL.len()] {
        StoreOp::ALL.map(|op| {
            let c = &self.ops[op as usize];
            OpStats {
                op,
                requests: c.requests.load(Relaxed),
                errors: c.errors.load(Relaxed),
                bytes: c.bytes.load(Relaxed),
                latency: c.latency.snapshot(),
            }
        })
    }

    pub fn counts(&self) -> RequestCounts {
        let ops = self.op_stats();
        let of = |op: StoreOp| ops[op as usize];
        RequestCounts {
            get: of(StoreOp::Get).requests + of(StoreOp::GetRange).requests,
            put: of(StoreOp::Put).requests,
            list: of(StoreOp::List).requests,
            delete: of(StoreOp::Delete).requests,
            errors: ops.iter().map(|o| o.errors).sum(),
            bytes_read: of(StoreOp::Get).bytes + of(StoreOp::GetRange).bytes,
            bytes_written: of(StoreOp::Put).bytes,
        }
    }

    /// Counts a request as it starts.
    fn start(&self, op: StoreOp) -> (&OpCounters, Instant) {
        let c = &self.ops[op as usize];
        c.requests.fetch_add(1, Relaxed);
        (c, Instant::now())
    }

    /// Times a request that has answered and counts a failure.
    fn note<T>(
        (c, started): (&OpCounters, Instant),
        r: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        c.latency.record(started.elapsed());
        if matches!(r, Err(ref e) if !matches!(e, StoreError::NotFound(_))) {
            c.errors.fetch_add(1, Relaxed);
        }
        r
    }
}

#[async_trait]
impl Bucket for CountingBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        let started = self.start(StoreOp::Put);
        started.0.bytes.fetch_add(data.len() as u64, Relaxed);
        Self::note(started, self.inner.put(key, data, mode).await)
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let started = self.start(StoreOp::Get);
        let c = started.0;
        let r = Self::note(started, self.inner.get(key).await)?;
        c.bytes.fetch_add(r.len() as u64, Relaxed);
        Ok(r)
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        let started = self.start(StoreOp::GetRange);
        let c = started.0;
        let r = Self::note(started, self.inner.get_range(key, range).await)?;
        c.bytes.fetch_add(r.len() as u64, Relaxed);
        Ok(r)
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        let started = self.start(StoreOp::Delete);
        Self::note(started, self.inner.delete(key, mode).await)
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let started = self.start(StoreOp::List);
        Self::note(started, self.inner.list(prefix).await)
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
    use crate::bucket::LocalBucket;
    use std::sync::Arc;

    #[tokio::test]
    async fn every_operation_is_counted_timed_and_sized() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-counting-").unwrap();
        let local: SharedBucket = Arc::new(LocalBucket::open(scratch.path()).unwrap());
        let b = CountingBucket::new(local);
        b.put("a", Bytes::from_static(b"hello"), PutMode::Create)
            .await
            .unwrap();
        b.put("a", Bytes::from_static(b"again"), PutMode::Create)
            .await
            .expect_err("create-only");
        assert_eq!(b.get("a").await.unwrap(), "hello");
        assert_eq!(b.get_range("a", 1..3).await.unwrap(), "el");
        b.get("missing").await.expect_err("missing");
        assert_eq!(b.list("").await.unwrap().len(), 1);
        b.delete("a", DeleteMode::Durable).await.unwrap();
        let ops = b.op_stats();
        let of = |op: StoreOp| ops[op as usize];
        assert_eq!(of(StoreOp::Put).requests, 2);
        assert_eq!(of(StoreOp::Put).errors, 1, "already exists is a failure");
        assert_eq!(of(StoreOp::Put).bytes, 10, "bytes sent, failed or not");
        assert_eq!(of(StoreOp::Get).requests, 2);
        assert_eq!(of(StoreOp::Get).errors, 0, "not found is an answer");
        assert_eq!(of(StoreOp::Get).bytes, 5);
        assert_eq!(of(StoreOp::GetRange).bytes, 2);
        for op in StoreOp::ALL {
            assert_eq!(of(op).op, op);
            assert_eq!(
                of(op).latency.count(),
                of(op).requests,
                "{} timed",
                op.name()
            );
        }
        assert_eq!(
            b.counts(),
            RequestCounts {
                get: 3,
                put: 2,
                list: 1,
                delete: 1,
                errors: 1,
                bytes_read: 7,
                bytes_written: 10,
            }
        );
    }
}
