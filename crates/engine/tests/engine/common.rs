//! Helpers shared by the engine's integration tests.
// Each test binary uses some of them.
#![allow(dead_code)]

use bucketfs_engine::bucket::{
    open_url, CrashableBucket, FaultyBucket, RetryLimits, RetryingBucket, SharedBucket,
};
use bucketfs_engine::{Engine, EngineOptions, Fill, TaskSet, Tuning};
use std::sync::Arc;

fn log_objects_per_checkpoint_min() -> u64 {
    Tuning::default().log_objects_per_checkpoint_min
}

/// Writes and flushes one 4 KiB block per flush, cycling over `slots` blocks of inode 1, until
/// a checkpoint is due, then waits until the collector has deleted more than half of those
/// log objects (each is dead once its block is overwritten) and every checkpoint written has
/// ended its collection and repacking. Returns the number of flushes.
pub async fn flush_past_a_checkpoint(e: &Engine, slots: u64) -> u64 {
    let n = log_objects_per_checkpoint_min() + 10;
    for i in 0..n {
        let block: Vec<u8> = (0..4096).map(|b| (i as usize * 7 + b) as u8).collect();
        e.write(1, (i % slots) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    let done = |s: &bucketfs_engine::EngineStats| {
        s.log_objects_deleted > n / 2 && s.checkpoints_collected == s.checkpoints_written
    };
    for _ in 0..200 {
        if done(&e.stats()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(done(&e.stats()), "{:?}", e.stats());
    n
}

/// Writes and flushes one 4 KiB block per flush, cycling over 3 blocks of inode 1, until the
/// engine has written `n` checkpoints (whenever the flushes before made them due). A checkpoint
/// due while the last one is still collecting begins at the first commit after that one ends,
/// and in memory flushes outrun collections: after each interval's worth of flushes, a pause.
pub async fn flush_until_checkpoints(e: &Engine, n: u64) {
    let started = std::time::Instant::now();
    let mut i = 0u64;
    while e.stats().checkpoints_written < n {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{n} checkpoints not written: {:?}",
            e.stats()
        );
        if i > 0 && i.is_multiple_of(log_objects_per_checkpoint_min() + 10) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let block: Vec<u8> = (0..4096).map(|b| (i as usize * 5 + b) as u8).collect();
        e.write(1, (i % 3) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        e.flush().await.unwrap();
        i += 1;
    }
}

/// One bucket, and the writer process of the moment: its view of the bucket (frozen when it
/// crashes) and its tasks (stopped when it crashes).
pub struct World {
    pub faults: Arc<FaultyBucket>,
    /// The bucket as the test sees it (not the writer's view): for inspecting and tampering.
    pub bucket: SharedBucket,
    writer: parking_lot::Mutex<Option<(TaskSet, Arc<CrashableBucket>)>>,
}

pub fn world() -> World {
    let store: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
    let faults = Arc::new(FaultyBucket::new(store));
    let bucket: SharedBucket = Arc::new(RetryingBucket::new(faults.clone()));
    World {
        faults,
        bucket,
        writer: parking_lot::Mutex::new(None),
    }
}

impl World {
    /// The bucket and options of a new writer process (its own view of the store, its own tasks).
    pub fn writer(&self, opts: EngineOptions) -> (SharedBucket, EngineOptions) {
        self.writer_with_limits(opts, RetryLimits::default())
    }

    /// A writer whose bucket retries within `limits` (short ones make hangs quick to test).
    pub fn writer_with_limits(
        &self,
        mut opts: EngineOptions,
        limits: RetryLimits,
    ) -> (SharedBucket, EngineOptions) {
        let view = Arc::new(CrashableBucket::new(self.faults.clone(), None));
        opts.tasks = TaskSet::default();
        *self.writer.lock() = Some((opts.tasks.clone(), view.clone()));
        (Arc::new(RetryingBucket::with_limits(view, limits)), opts)
    }
}

pub async fn open(w: &World) -> Engine {
    let (bucket, opts) = w.writer(EngineOptions::for_tests("pw"));
    Engine::open(bucket, opts).await.unwrap()
}

/// Kills the writer as `kill -9` would: nothing more reaches the bucket, none of its tasks runs
/// on, and its writer lock is left behind (stale, as the process is gone).
pub async fn crash(w: &World, e: Engine) {
    let (tasks, view) = w.writer.lock().take().expect("a writer is open");
    view.freeze();
    drop(e);
    tasks.stop_all().await;
}

pub async fn log_keys(w: &World) -> Vec<String> {
    let objects = w.bucket.list("log/").await.unwrap();
    objects.into_iter().map(|o| o.key).collect()
}

/// Incompressible bytes (xorshift64), so that stored sizes are those of real data.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

/// Waits up to 10 s for the collector to delete the log objects `keys`; returns those still
/// stored.
pub async fn wait_until_deleted(w: &World, mut keys: Vec<String>) -> Vec<String> {
    for _ in 0..200 {
        let now = log_keys(w).await;
        keys.retain(|k| now.contains(k));
        if keys.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    keys
}

/// A fresh directory under the system's temporary directory, removed with all it holds when
/// dropped, so a test leaves nothing behind whether it passes or panics. Declared before the
/// engine that uses it, it outlives that engine. It derefs to its path, so `&dir` goes where a
/// `&Path` (or an `AsRef<Path>`) is wanted.
pub struct ScratchDir(tempfile::TempDir);

impl ScratchDir {
    /// `name` says which test a directory belongs to, should a killed run leave it behind.
    pub fn new(name: &str) -> ScratchDir {
        let dir = tempfile::TempDir::with_prefix(format!("bucketfs-{name}-"))
            .expect("the temporary directory is writable");
        ScratchDir(dir)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        self.0.path()
    }
}

impl AsRef<std::path::Path> for ScratchDir {
    fn as_ref(&self) -> &std::path::Path {
        self.0.path()
    }
}
