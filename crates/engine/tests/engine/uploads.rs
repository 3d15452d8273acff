//! The upload queue: a flush returns once everything queued before it is in the bucket,
//! whatever order the PUTs of the queued objects finish in.

use async_trait::async_trait;
use bucketfs_engine::bucket::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use bucketfs_engine::{Engine, EngineOptions, Fill};
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{pattern, world};

/// Log objects whose sequence number is 1 more than a multiple of 4 take 300 ms to store, the
/// others 20 ms: the object at the front of a window of uploads is the last of it to land.
struct FrontLast {
    inner: SharedBucket,
}

#[async_trait]
impl Bucket for FrontLast {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        if let Some(seq) = key.strip_prefix("log/").and_then(|s| s.parse::<u64>().ok()) {
            let ms = if seq % 4 == 1 { 300 } else { 20 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        self.inner.put(key, data, mode).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.inner.get_range(key, range).await
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.inner.delete(key, mode).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }
}

/// Many objects queued at once (a bulk write sealed in pieces), the first of each window of
/// uploads landing last: once a window is all stored and committed, the objects behind it are
/// started. A flush that waited for a wake-up instead would never return (found by
/// bench/coldread's fill, where one `nbdcopy --flush` in about ten hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_returns_whatever_order_the_queued_uploads_land_in() {
    let w = world();
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.dirty_bytes_flush_start = 256 << 10;
    let (bucket, opts) = w.writer(opts);
    let e = Engine::open(Arc::new(FrontLast { inner: bucket }), opts)
        .await
        .unwrap();
    for round in 0..5u64 {
        for i in 0..24u64 {
            let data = pattern((round * 24 + i) as u8, 256 << 10);
            e.write(1, i * (256 << 10), data.len() as u64, Fill::Data(&data))
                .await
                .unwrap();
        }
        tokio::time::timeout(Duration::from_secs(30), e.flush())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the flush never returned: {:?}", e.stats()))
            .unwrap();
        assert_eq!(e.stats().upload_queue_objects, 0, "{:?}", e.stats());
    }
    let data = pattern(4 * 24 + 23, 256 << 10);
    assert!(e.read(1, 23 * (256 << 10), 256 << 10).await.unwrap() == data);
}
