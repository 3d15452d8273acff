//! The cache tiers under the metadata: run blocks evicted from the memory block cache are read
//! again from the local disk cache, not from the bucket.

use async_trait::async_trait;
use bucketfs_engine::bucket::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use bucketfs_engine::{Engine, EngineOptions, KvChange};
use bytes::Bytes;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::world;

/// Counts the ranged GETs of run objects (metadata blocks) that reach the bucket.
struct RunReads {
    inner: SharedBucket,
    gets: AtomicU64,
}

#[async_trait]
impl Bucket for RunReads {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        self.inner.put(key, data, mode).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        if key.starts_with("run/") {
            self.gets.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.get_range(key, range).await
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.inner.delete(key, mode).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.inner.list(prefix).await
    }
}

const KEYS: usize = 20_000;

fn key(i: usize) -> Vec<u8> {
    format!("k/{i:08}").into_bytes()
}

/// Writes KEYS pairs of 100 bytes, checkpoints them into runs (so that memory holds none),
/// then looks every 7th key up twice. Returns the run GETs of the lookups.
async fn run_gets_of_lookups(disk_cache: Option<std::path::PathBuf>) -> u64 {
    let w = world();
    let mut opts = EngineOptions::for_tests("pw");
    // Far smaller than the runs (about 2 MB of pairs): blocks are evicted as they are read.
    opts.metadata_cache_bytes_max = 32 << 10;
    opts.disk_cache_bytes_max = if disk_cache.is_some() { 1 << 30 } else { 0 };
    opts.disk_cache_dir = disk_cache;
    let (bucket, opts) = w.writer(opts);
    let counted = Arc::new(RunReads {
        inner: bucket,
        gets: AtomicU64::new(0),
    });
    let e = Engine::open(counted.clone(), opts).await.unwrap();
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let changes = chunk
            .iter()
            .map(|&i| KvChange::Put(key(i), vec![i as u8; 100]))
            .collect();
        e.kv_commit(changes).unwrap();
        e.flush().await.unwrap();
    }
    e.create_checkpoint("runs").await.unwrap();
    assert!(e.stats().metadata_runs >= 1, "{:?}", e.stats());
    let before = counted.gets.load(Ordering::Relaxed);
    for _ in 0..2 {
        for i in (0..KEYS).step_by(7) {
            assert_eq!(e.kv_get(&key(i)).await.unwrap(), Some(vec![i as u8; 100]));
        }
    }
    counted.gets.load(Ordering::Relaxed) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_blocks_evicted_from_memory_come_from_the_disk_cache_not_the_bucket() {
    let dir = std::env::temp_dir().join(format!("bucketfs-caches-{}", std::process::id()));
    let with_disk = run_gets_of_lookups(Some(dir.clone())).await;
    let without = run_gets_of_lookups(None).await;
    std::fs::remove_dir_all(&dir).unwrap();
    // The checkpoint put the runs it wrote on disk: no lookup needs the bucket.
    assert_eq!(with_disk, 0, "run GETs with the disk cache");
    // Without it, evicted blocks are fetched again (the test would see a broken disk tier).
    assert!(without > 100, "run GETs without the disk cache: {without}");
}
