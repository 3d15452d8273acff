//! The cache tiers: run blocks evicted from the memory block cache are read again from the
//! local disk cache, not from the bucket; sequential reads are fetched ahead once; a cold read
//! fetches a small log object whole.

use async_trait::async_trait;
use bucketfs_engine::bucket::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use bucketfs_engine::{Engine, EngineOptions, KvChange};
use bytes::Bytes;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::{world, ScratchDir};

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
    let dir = ScratchDir::new("caches");
    let with_disk = run_gets_of_lookups(Some(dir.to_path_buf())).await;
    let without = run_gets_of_lookups(None).await;
    // The checkpoint put the runs it wrote on disk: no lookup needs the bucket.
    assert_eq!(with_disk, 0, "run GETs with the disk cache");
    // Without it, evicted blocks are fetched again (the test would see a broken disk tier).
    assert!(without > 100, "run GETs without the disk cache: {without}");
}

/// Counts the bytes of log objects (extent data) that reach the bucket.
struct LogReads {
    inner: SharedBucket,
    bytes: AtomicU64,
    requests: AtomicU64,
}

#[async_trait]
impl Bucket for LogReads {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        self.inner.put(key, data, mode).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        let data = self.inner.get(key).await?;
        if key.starts_with("log/") {
            self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
        Ok(data)
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        if key.starts_with("log/") {
            self.bytes
                .fetch_add(range.end - range.start, Ordering::Relaxed);
            self.requests.fetch_add(1, Ordering::Relaxed);
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

/// A reader that goes front to back a piece at a time finds the pieces after the one it reads
/// already on their way: after two reads, more than two pieces have been fetched, before it
/// asks for the third. Nothing is fetched twice, and every byte reads back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_reads_are_fetched_ahead_once() {
    const PIECE: usize = 256 << 10;
    const PIECES: usize = 16;
    let w = world();
    // Incompressible, so bytes fetched stand for bytes of file.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..PIECE * PIECES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    // Written and flushed by one engine; read by another, whose memory holds none of it.
    let e = crate::common::open(&w).await;
    e.write(3, 0, data.len() as u64, bucketfs_engine::Fill::Data(&data))
        .await
        .unwrap();
    e.close().await.unwrap();
    let mut opts = EngineOptions::for_tests("pw");
    opts.disk_cache_bytes_max = 0;
    opts.tuning.readahead_bytes = (2 * PIECE) as u64;
    let (bucket, opts) = w.writer(opts);
    let counted = Arc::new(LogReads {
        inner: bucket,
        bytes: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    });
    let e = Engine::open(counted.clone(), opts).await.unwrap();
    let fetched = || counted.bytes.load(Ordering::Relaxed);
    let mut read = Vec::new();
    for i in 0..2 {
        read.extend(e.read(3, (i * PIECE) as u64, PIECE).await.unwrap());
    }
    // The second read was sequential: the third and fourth pieces are fetched without a read.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fetched() < (3 * PIECE) as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing fetched ahead of two sequential reads: {} bytes for {} read",
            fetched(),
            2 * PIECE
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for i in 2..PIECES {
        read.extend(e.read(3, (i * PIECE) as u64, PIECE).await.unwrap());
    }
    assert!(read == data, "what was read differs from what was written");
    // Pieces fetched ahead are not fetched again by the reads that wanted them (at most the
    // readahead past the end, which reads nothing, and the frames' own bytes on top).
    let most = (data.len() + data.len() / 10) as u64;
    assert!(
        fetched() <= most,
        "{} bytes fetched to read {}",
        fetched(),
        data.len()
    );
}

/// Writes 32 blocks of 4 KiB far apart in one log object, then reads them back in another
/// order from an engine whose caches are empty (a restart): returns the GETs of log objects.
async fn log_gets_of_cold_scattered_reads(whole_object_bytes_max: u64) -> u64 {
    const BLOCKS: u64 = 32;
    let w = world();
    let e = crate::common::open(&w).await;
    for i in 0..BLOCKS {
        let block = crate::common::pattern(i as u8, 4096);
        e.write(5, i * (1 << 20), 4096, bucketfs_engine::Fill::Data(&block))
            .await
            .unwrap();
    }
    e.close().await.unwrap();
    let dir = ScratchDir::new(&format!("cold-read-{whole_object_bytes_max}"));
    let mut opts = EngineOptions::for_tests("pw");
    opts.disk_cache_dir = Some(dir.to_path_buf());
    opts.disk_cache_bytes_max = 1 << 30;
    opts.tuning.readahead_bytes = 0;
    opts.tuning.cold_read_whole_object_bytes_max = whole_object_bytes_max;
    let (bucket, opts) = w.writer(opts);
    let counted = Arc::new(LogReads {
        inner: bucket,
        bytes: AtomicU64::new(0),
        requests: AtomicU64::new(0),
    });
    let e = Engine::open(counted.clone(), opts).await.unwrap();
    for i in (0..BLOCKS).rev() {
        let read = e.read(5, i * (1 << 20), 4096).await.unwrap();
        assert!(read == crate::common::pattern(i as u8, 4096), "block {i}");
    }
    e.close().await.unwrap();
    counted.requests.load(Ordering::Relaxed)
}

/// A read that misses the caches fetches a small log object whole into the disk cache: the
/// blocks written with it are then read without a request each (a database's crash recovery
/// after a restart reads what it wrote before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_fetches_a_small_log_object_whole() {
    assert_eq!(log_gets_of_cold_scattered_reads(4 << 20).await, 1);
    assert_eq!(log_gets_of_cold_scattered_reads(0).await, 32);
}
