//! The storage engine: file data in extents, metadata in a replayed log, one flush barrier.
//!
//! Every mutation is applied to the in-memory `pending` batch under one lock, so a batch holds
//! the effect of a prefix of the acknowledged mutations. A flush freezes the batch, seals its
//! extents into one log object together with its metadata ops, uploads it with a conditional
//! create, and only then makes it the committed state. After a crash, the bucket holds exactly
//! the flushed batches: a prefix of the acknowledged order, every mutation whole or absent.
//! (docs/0001-bucket-layout-and-flush.md)

use crate::bucket::{DeleteMode, PutMode, SharedBucket, StoreError};
use crate::cache::DiskCache;
use crate::cadence::{BarrierCadence, WriteBehind};
use crate::crypto::{KeyError, Sealer, Superblock};
use crate::extent_buffers::ExtentBuffers;
use crate::frame::{self, Codec, FRAME_BYTES_MAX};
use crate::lease::{self, LeaseError, LockHolder};
use crate::limits::*;
use crate::logobj::{self, ObjectError, LOG_HEADER_BYTES};
use crate::meta::{ExtentPtr, MetaOp, MetaState};
use crate::object_buffer::{ObjectBuffer, ObjectBuffers};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const SUPERBLOCK_KEY: &str = "superblock.json";

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub password: String,
    pub codec: Codec,
    /// Unflushed writes older than this are flushed anyway: the loss window for data nobody
    /// fsynced.
    pub flush_interval: Duration,
    pub memory_cache_bytes_max: u64,
    pub disk_cache_dir: Option<PathBuf>,
    pub disk_cache_bytes_max: u64,
    pub read_only: bool,
    /// A checkpoint is written after this long without a commit, when enough log objects
    /// await one (limits.rs, QUIET_CHECKPOINT_AFTER_MS); `None`: only the regular ones.
    pub quiet_checkpoint_after: Option<Duration>,
    /// lz4 frames are re-sealed with zstd once a checkpoint at least this old covers them
    /// (limits.rs, RESEAL_AFTER_S).
    pub reseal_after: Duration,
}

impl EngineOptions {
    pub fn for_tests(password: &str) -> EngineOptions {
        EngineOptions {
            password: password.to_string(),
            codec: Codec::Zstd,
            flush_interval: Duration::from_secs(3600),
            memory_cache_bytes_max: 64 << 20,
            disk_cache_dir: None,
            disk_cache_bytes_max: 0,
            read_only: false,
            quiet_checkpoint_after: None,
            reseal_after: Duration::ZERO,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("corrupted object: {0}")]
    Corrupt(String),
    #[error("the bucket is open read-only")]
    ReadOnly,
    #[error("the bucket has no bucketfs filesystem yet; start a writer once to create it")]
    NotInitialised,
    #[error("writes are refused after a failure on the durable path: {0}; restart bucketfs")]
    Poisoned(String),
}

impl From<ObjectError> for EngineError {
    fn from(e: ObjectError) -> Self {
        EngineError::Corrupt(e.to_string())
    }
}

#[derive(Debug, Clone)]
enum Dirty {
    Data(Arc<Vec<u8>>),
    /// Committed data the collector moves, unchanged, out of an object it wants dead
    /// (`Engine::repack`): sealed with the configured codec, whichever codec seals the rest of
    /// its batch, so that it is not moved again for being lz4.
    Moved(Arc<Vec<u8>>),
    Hole,
}

/// Mutations not yet durable. `gen` is the write generation the batch covers once frozen.
#[derive(Default)]
struct Batch {
    extents: HashMap<(u64, u64), Dirty>,
    kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    gen: u64,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.extents.is_empty() && self.kv.is_empty()
    }
    fn data_bytes(&self) -> usize {
        self.extents.len() * EXTENT_SIZE_BYTES
    }
}

struct State {
    /// Bumped by every mutation, under this lock.
    write_gen: u64,
    pending: Batch,
    /// Frozen batches not yet committed, oldest first: being sealed, queued, being uploaded,
    /// or waiting to be uploaded again after a failure.
    flushing: VecDeque<Arc<Batch>>,
    committed: MetaState,
    /// Bumped whenever `committed` changes, so a reader that fetched an older frame does not put
    /// it in the cache over a newer one.
    commit_gen: u64,
    /// Decoded committed extents (the memory tier).
    clean: lru::LruCache<(u64, u64), Arc<Vec<u8>>>,
}

enum Found {
    Data(Arc<Vec<u8>>),
    Zero,
    Stored(ExtentPtr),
}

impl State {
    /// Unflushed batches, newest (the one that wins) first.
    fn newest_first(&self) -> impl Iterator<Item = &Batch> {
        std::iter::once(&self.pending).chain(self.flushing.iter().rev().map(|b| b.as_ref()))
    }

    /// Unflushed batches, oldest first (apply in this order).
    fn oldest_first(&self) -> impl Iterator<Item = &Batch> {
        self.flushing
            .iter()
            .map(|b| b.as_ref())
            .chain(std::iter::once(&self.pending))
    }

    fn unflushed_bytes(&self) -> usize {
        self.oldest_first().map(Batch::data_bytes).sum()
    }

    /// The current content of an extent, as far as memory knows it.
    fn find(&mut self, ino: u64, index: u64) -> Found {
        let key = (ino, index);
        for batch in self.newest_first() {
            match batch.extents.get(&key) {
                Some(Dirty::Data(d) | Dirty::Moved(d)) => return Found::Data(d.clone()),
                Some(Dirty::Hole) => return Found::Zero,
                None => {}
            }
        }
        if let Some(d) = self.clean.get(&key) {
            return Found::Data(d.clone());
        }
        match self.committed.extent(ino, index) {
            Some(ptr) => Found::Stored(ptr),
            None => Found::Zero,
        }
    }

    /// Deallocates an extent: a hole entry if something older than `pending` would otherwise
    /// show through, else just forget the pending entry.
    fn punch(&mut self, ino: u64, index: u64) {
        let key = (ino, index);
        let older = match self.flushing.iter().rev().find_map(|f| f.extents.get(&key)) {
            Some(Dirty::Data(_) | Dirty::Moved(_)) => true,
            Some(Dirty::Hole) => false,
            None => self.committed.extent(ino, index).is_some(),
        };
        if older {
            self.pending.extents.insert(key, Dirty::Hole);
        } else {
            self.pending.extents.remove(&key);
        }
    }

    fn kv_get(&self, key: &[u8]) -> Option<Vec<u8>> {
        for batch in self.newest_first() {
            if let Some(v) = batch.kv.get(key) {
                return v.clone();
            }
        }
        self.committed.kv_get(key).cloned()
    }
}

/// What a mutation writes into a range.
#[derive(Clone, Copy)]
pub enum Fill<'a> {
    Data(&'a [u8]),
    /// Zeroes; whole extents are deallocated when `punch` is true.
    Zeroes {
        punch: bool,
    },
}

/// A key-value change of the filesystem core, applied atomically with the others of one call.
#[derive(Debug, Clone)]
pub enum KvChange {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Who waits for a flush: the codec follows (`Engine::codec_for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// A client's barrier, or write-behind ahead of the one that will come.
    Client,
    /// The engine's own: memory filling up, the periodic flush, repacking, closing.
    Engine,
}

/// A sealed log object waiting for (or retrying) its upload.
#[derive(Clone)]
struct Sealed {
    seq: u64,
    object: Bytes,
    ops: Arc<Vec<MetaOp>>,
    /// The write generation that is durable once this object is.
    gen: u64,
    upload: UploadState,
}

#[derive(Clone, PartialEq, Eq)]
enum UploadState {
    Waiting,
    InFlight,
    Stored,
    Failed(String),
}

/// Flushes run in two stages so that sealing one batch overlaps with uploading the previous
/// one: stage one (under `seal`) freezes the pending batch, seals it and queues it; stage two
/// (under `upload`) uploads up to UPLOADS_IN_FLIGHT_MAX queued objects at once and commits
/// them strictly in sequence order as they are stored.
struct SealCtl {
    next_seq: u64,
}

struct UploadCtl {
    checkpoint_seq: u64,
    /// Checkpoints of this process (the one it opened first) and when they were begun, oldest
    /// first; only the newest older than `reseal_after` and those after it are kept.
    checkpoints_begun: VecDeque<(u64, std::time::Instant)>,
    log_bytes_since_checkpoint: u64,
    /// Log objects in the bucket and their sizes in bytes (for the garbage collector, and
    /// `Inner::log_bytes_stored`).
    known_logs: BTreeMap<u64, u64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    /// Flush barriers asked for (NBD FLUSH and FUA, admin changes, the periodic flush).
    pub barriers: u64,
    /// Time callers spent waiting in flush barriers, summed: divided by `barriers`, the mean
    /// fsync latency a client sees.
    pub barrier_wait_us: u64,
    pub flushes: u64,
    /// Flushes sealed with lz4: all of them if lz4 is configured; with zstd, those a client
    /// waited on at a steady cadence (`Engine::codec_for`).
    pub flushes_lz4: u64,
    /// Flushes started by write-behind (`Engine::write`), no barrier waiting on them yet.
    pub write_behind_flushes: u64,
    pub log_objects_written: u64,
    pub log_bytes_written: u64,
    /// Bytes of the log objects now in the bucket: what the data costs to store (checkpoints
    /// and the superblock aside).
    pub log_bytes_stored: u64,
    /// Live bytes of those log objects (frames the extent map points at): what the data would
    /// take without garbage. `log_bytes_stored` over this is the bucket's space amplification.
    pub log_bytes_live: u64,
    pub checkpoints_written: u64,
    pub log_objects_deleted: u64,
    /// Extents rewritten out of sparse log objects (`Engine::repack`).
    pub extents_repacked: u64,
    /// Extents moved out of fragmented log objects (at most half live; `Engine::repack`).
    pub extents_defragmented: u64,
    /// Extents moved out of objects that hold lz4 frames, to be sealed with zstd
    /// (`Engine::repack`).
    pub extents_resealed: u64,
    /// Live bytes of the log objects that hold lz4 frames (`MetaState::live_bytes_in_lz4_objects`):
    /// what re-sealing has yet to reach, at most.
    pub live_bytes_in_lz4_objects: u64,
    pub pending_bytes: u64,
    pub extents: u64,
    pub memory_cache_extents: u64,
    pub disk_cache_bytes: u64,
}

#[derive(Default)]
struct Counters {
    barriers: AtomicU64,
    barrier_wait_us: AtomicU64,
    flushes: AtomicU64,
    flushes_lz4: AtomicU64,
    write_behind_flushes: AtomicU64,
    log_objects_written: AtomicU64,
    log_bytes_written: AtomicU64,
    checkpoints_written: AtomicU64,
    log_objects_deleted: AtomicU64,
    extents_repacked: AtomicU64,
    extents_defragmented: AtomicU64,
    extents_resealed: AtomicU64,
}

struct Inner {
    bucket: SharedBucket,
    sealer: Arc<Sealer>,
    codec: Codec,
    reseal_after: Duration,
    read_only: bool,
    state: Mutex<State>,
    seal: tokio::sync::Mutex<SealCtl>,
    upload: tokio::sync::Mutex<UploadCtl>,
    /// Sealed objects not yet uploaded, in sequence order. A failed upload stays at the front
    /// and is retried byte for byte (a PUT that secretly succeeded is then recognised).
    queue: Mutex<VecDeque<Sealed>>,
    durable_gen: AtomicU64,
    poisoned: Mutex<Option<String>>,
    disk_cache: Option<DiskCache>,
    lock_holder: Option<LockHolder>,
    checkpoint_running: AtomicBool,
    /// When the last log object was committed (`Inner::epoch` + this many microseconds).
    last_commit_us: AtomicU64,
    /// The last checkpoint's collection repacked extents: the objects they left are dead,
    /// but only the next checkpoint deletes them.
    repacked_uncollected: AtomicBool,
    /// When the engine was opened: the origin of `last_commit_us`.
    epoch: std::time::Instant,
    /// Buffers of the checkpoint being encoded (one at a time: see `checkpoint_running`).
    checkpoint_scratch: Mutex<logobj::CheckpointScratch>,
    object_buffers: Arc<ObjectBuffers>,
    extent_buffers: ExtentBuffers,
    background_flush: AtomicBool,
    /// How often clients ask for barriers; write-behind runs while they are frequent enough.
    barrier_cadence: BarrierCadence,
    /// A write-behind flush is sealing or uploading (one at a time).
    write_behind_running: AtomicBool,
    /// Bytes of the log objects in the bucket (`UploadCtl::known_logs`), readable without
    /// its lock.
    log_bytes_stored: AtomicU64,
    /// The last upload failed (its object is still queued).
    upload_failing: AtomicBool,
    /// Wakes writers waiting for room when an upload commits.
    committed_notify: tokio::sync::Notify,
    /// Wakes flushes waiting for an upload to finish (stored or failed).
    stored_notify: tokio::sync::Notify,
    counters: Counters,
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Opens (creating it on first use) the superblock and returns the unlocked sealer.
async fn unlock(
    bucket: &SharedBucket,
    password: &str,
    create: bool,
) -> Result<Sealer, EngineError> {
    match bucket.get(SUPERBLOCK_KEY).await {
        Ok(bytes) => Ok(Sealer::new(
            &Superblock::from_json(&bytes)?.unlock(password)?,
        )),
        Err(StoreError::NotFound(_)) if create => {
            let (sb, key) = Superblock::create(password)?;
            match bucket
                .put(SUPERBLOCK_KEY, Bytes::from(sb.to_json()), PutMode::Create)
                .await
            {
                Ok(()) => {
                    tracing::info!("created a new bucketfs bucket");
                    Ok(Sealer::new(&key))
                }
                // Another process created it first: use theirs.
                Err(StoreError::AlreadyExists(_)) => {
                    Box::pin(unlock(bucket, password, false)).await
                }
                // Creating an object can only find nothing when the bucket itself is missing.
                Err(StoreError::NotFound(_)) => Err(EngineError::Store(StoreError::Permanent(
                    "the bucket does not exist; create it first (or check the bucket name in storage.url)".into(),
                ))),
                Err(e) => Err(e.into()),
            }
        }
        Err(StoreError::NotFound(_)) => Err(EngineError::NotInitialised),
        Err(e) => Err(e.into()),
    }
}

/// Rewraps the data key under a new password; data is not touched.
pub async fn change_password(
    bucket: &SharedBucket,
    old: &str,
    new: &str,
) -> Result<(), EngineError> {
    let bytes = match bucket.get(SUPERBLOCK_KEY).await {
        Err(StoreError::NotFound(_)) => return Err(EngineError::NotInitialised),
        other => other?,
    };
    let sb = Superblock::from_json(&bytes)?.rewrap(old, new)?;
    bucket
        .put(
            SUPERBLOCK_KEY,
            Bytes::from(sb.to_json()),
            PutMode::Overwrite,
        )
        .await?;
    Ok(())
}

impl Engine {
    pub async fn open(bucket: SharedBucket, opts: EngineOptions) -> Result<Engine, EngineError> {
        // Check the password before anything is written: a wrong password changes nothing.
        let sealer = unlock(&bucket, &opts.password, !opts.read_only).await?;
        let lock_holder = if opts.read_only {
            None
        } else {
            Some(lease::acquire(&bucket).await?)
        };
        let sealer = Arc::new(sealer);
        let opened = async {
            if lock_holder.is_some() {
                bucket.begin_writing().await?;
            }
            let mut attempt = 1;
            loop {
                let loaded =
                    Self::load(bucket.clone(), sealer.clone(), &opts, lock_holder.clone()).await;
                match loaded {
                    // A reader beside a running writer lists the bucket while the writer
                    // changes it (a checkpoint replaced, log objects collected), so what it
                    // read may not fit together: it reads again before it calls the bucket
                    // damaged.
                    Err(
                        e @ (EngineError::Corrupt(_)
                        | EngineError::Store(StoreError::NotFound(_))),
                    ) if opts.read_only && attempt < READ_ONLY_OPEN_ATTEMPTS => {
                        tracing::warn!(attempt, error = %e, "the bucket changed while it was read (a writer is running?); reading it again");
                        let pause_ms = 100 * u64::from(attempt);
                        tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
                        attempt += 1;
                    }
                    result => break result,
                }
            }
        }
        .await;
        if let (Err(_), Some(me)) = (&opened, &lock_holder) {
            let _ = lease::release(&bucket, me).await;
        }
        opened
    }

    async fn load(
        bucket: SharedBucket,
        sealer: Arc<Sealer>,
        opts: &EngineOptions,
        lock_holder: Option<LockHolder>,
    ) -> Result<Engine, EngineError> {
        let mut committed = MetaState::default();
        let checkpoints: Vec<u64> = bucket
            .list("checkpoint/")
            .await?
            .iter()
            .filter_map(|o| logobj::parse_seq(&o.key, "checkpoint"))
            .collect();
        let checkpoint_seq = checkpoints.iter().copied().max().unwrap_or(0);
        if checkpoint_seq > 0 {
            let key = logobj::checkpoint_key(checkpoint_seq);
            let bytes = bucket.get(&key).await?;
            for op in logobj::decode_checkpoint(&sealer, &key, checkpoint_seq, &bytes)? {
                committed.apply(&op);
            }
        }
        let logs: Vec<(u64, u64)> = bucket
            .list("log/")
            .await?
            .iter()
            .filter_map(|o| logobj::parse_seq(&o.key, "log").map(|s| (s, o.size_bytes)))
            .collect();
        let known_logs: BTreeMap<u64, u64> = logs.iter().copied().collect();
        let to_replay: Vec<(u64, u64)> = logs
            .into_iter()
            .filter(|(s, _)| *s > checkpoint_seq)
            .collect();
        // Up to UPLOADS_IN_FLIGHT_MAX objects are uploaded at once but committed in order, so a
        // crash can leave a few stored objects after a missing one. None of them was ever
        // acknowledged; they are dropped. A longer run after a gap means acknowledged data is
        // gone: refuse to guess.
        let mut to_replay = to_replay;
        let mut known_logs = known_logs;
        if let Some(gap) = to_replay
            .iter()
            .enumerate()
            .position(|(i, (seq, _))| *seq != checkpoint_seq + 1 + i as u64)
        {
            let orphans = to_replay.split_off(gap);
            let missing = checkpoint_seq + 1 + gap as u64;
            // Uploads in flight are the oldest uncommitted objects, so a crash leaves stored
            // objects only within UPLOADS_IN_FLIGHT_MAX of the first missing one.
            let beyond = orphans
                .iter()
                .filter(|(seq, _)| *seq >= missing + UPLOADS_IN_FLIGHT_MAX as u64)
                .count();
            if beyond > 0 {
                return Err(EngineError::Corrupt(format!(
                    "log object {} is missing but {} later ones exist; the bucket is damaged",
                    logobj::log_key(missing),
                    orphans.len()
                )));
            }
            for (seq, _) in &orphans {
                tracing::warn!(object = %logobj::log_key(*seq), "dropping a log object stored after a crash but never committed");
                known_logs.remove(seq);
                if !opts.read_only {
                    // Durably: its sequence number is used again from here on.
                    bucket
                        .delete(&logobj::log_key(*seq), DeleteMode::Durable)
                        .await?;
                }
            }
        }
        let records = futures::stream::iter(to_replay.iter().copied())
            .map(|(seq, size)| {
                let bucket = bucket.clone();
                let sealer = sealer.clone();
                async move {
                    let key = logobj::log_key(seq);
                    if size < logobj::LOG_HEADER_BYTES as u64 + logobj::LOG_TRAILER_BYTES {
                        return Err(EngineError::Corrupt(format!("{key}: too short")));
                    }
                    let trailer = bucket
                        .get_range(&key, size - logobj::LOG_TRAILER_BYTES..size)
                        .await?;
                    let range = logobj::parse_trailer(&key, size, &trailer)?;
                    let sealed = bucket.get_range(&key, range).await?;
                    Ok::<_, EngineError>(logobj::open_log_meta(&sealer, &key, seq, &sealed)?)
                }
            })
            .buffered(REPLAY_CONCURRENCY);
        let records: Vec<Vec<MetaOp>> = records.try_collect().await?;
        for ops in &records {
            for op in ops {
                committed.apply(op);
            }
        }
        let last_seq = known_logs
            .last_key_value()
            .map_or(0, |(s, _)| *s)
            .max(checkpoint_seq);
        let log_bytes_stored = known_logs.values().sum();
        tracing::info!(
            checkpoint_seq,
            replayed = records.len(),
            last_seq,
            extents = committed.extent_count(),
            "opened bucket"
        );
        let disk_cache = match &opts.disk_cache_dir {
            Some(dir) if opts.disk_cache_bytes_max > 0 => Some(
                DiskCache::open(dir.clone(), opts.disk_cache_bytes_max).map_err(|e| {
                    EngineError::Store(StoreError::Permanent(format!(
                        "cache directory {}: {e}",
                        dir.display()
                    )))
                })?,
            ),
            _ => None,
        };
        // Writes retry against the memory tier until their base is there: never let it be tiny.
        let clean_extents = (opts.memory_cache_bytes_max as usize / EXTENT_SIZE_BYTES).max(1024);
        let engine = Engine {
            inner: Arc::new(Inner {
                bucket,
                sealer,
                codec: opts.codec,
                reseal_after: opts.reseal_after,
                read_only: opts.read_only,
                state: Mutex::new(State {
                    write_gen: 0,
                    pending: Batch::default(),
                    flushing: VecDeque::new(),
                    committed,
                    commit_gen: 0,
                    clean: lru::LruCache::new(
                        NonZeroUsize::new(clean_extents).expect("at least 1024"),
                    ),
                }),
                seal: tokio::sync::Mutex::new(SealCtl {
                    next_seq: last_seq + 1,
                }),
                upload: tokio::sync::Mutex::new(UploadCtl {
                    checkpoint_seq,
                    checkpoints_begun: VecDeque::from([(
                        checkpoint_seq,
                        std::time::Instant::now(),
                    )]),
                    log_bytes_since_checkpoint: 0,
                    known_logs,
                }),
                durable_gen: AtomicU64::new(0),
                poisoned: Mutex::new(None),
                disk_cache,
                lock_holder,
                checkpoint_running: AtomicBool::new(false),
                last_commit_us: AtomicU64::new(0),
                repacked_uncollected: AtomicBool::new(false),
                epoch: std::time::Instant::now(),
                checkpoint_scratch: Mutex::default(),
                object_buffers: Arc::default(),
                extent_buffers: ExtentBuffers::default(),
                background_flush: AtomicBool::new(false),
                barrier_cadence: BarrierCadence::default(),
                write_behind_running: AtomicBool::new(false),
                log_bytes_stored: AtomicU64::new(log_bytes_stored),
                upload_failing: AtomicBool::new(false),
                committed_notify: tokio::sync::Notify::new(),
                stored_notify: tokio::sync::Notify::new(),
                queue: Mutex::new(VecDeque::new()),
                counters: Counters::default(),
            }),
        };
        if !opts.read_only {
            engine.spawn_periodic_flush(opts.flush_interval);
            if let Some(quiet) = opts.quiet_checkpoint_after {
                engine.spawn_quiet_checkpoints(quiet);
            }
        }
        Ok(engine)
    }

    fn spawn_periodic_flush(&self, interval: Duration) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine.has_unflushed() {
                    if let Err(e) = engine.barrier(Waiting::Engine).await {
                        tracing::error!(error = %e, "periodic flush failed; unflushed writes stay in memory and are retried");
                    }
                }
            }
        });
    }

    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }

    fn has_unflushed(&self) -> bool {
        let st = self.inner.state.lock();
        st.write_gen > self.inner.durable_gen.load(Ordering::Acquire) || !st.flushing.is_empty()
    }

    fn check_writable(&self) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Err(EngineError::ReadOnly);
        }
        if let Some(why) = &*self.inner.poisoned.lock() {
            return Err(EngineError::Poisoned(why.clone()));
        }
        Ok(())
    }

    /// Starts a background flush once enough data is pending; writers wait only while there is
    /// more than PENDING_BYTES_MAX pending or DIRTY_BYTES_MAX unflushed.
    async fn make_room(&self) -> Result<(), EngineError> {
        loop {
            // Registered before looking, so that a commit in between is not missed.
            let committed = self.inner.committed_notify.notified();
            tokio::pin!(committed);
            committed.as_mut().enable();
            let (pending, unflushed) = {
                let st = self.inner.state.lock();
                (st.pending.data_bytes(), st.unflushed_bytes())
            };
            if pending >= DIRTY_BYTES_FLUSH_START {
                self.kick_background_flush();
            }
            if pending < PENDING_BYTES_MAX && unflushed < DIRTY_BYTES_MAX {
                return Ok(());
            }
            if self.inner.upload_failing.load(Ordering::Acquire) {
                // The store is refusing uploads: retry in the foreground so this writer gets
                // the error instead of waiting without end.
                self.barrier(Waiting::Engine).await?;
                continue;
            }
            // Wait for an upload to commit (or a moment, in case a kick was missed).
            let _ = tokio::time::timeout(Duration::from_millis(50), committed).await;
        }
    }

    /// Seals the pending batch on a background task. Once its batch is sealed, the task lets the
    /// next kick seal another, and kicks it itself if enough is pending by then, so sealing
    /// overlaps with the upload before it. Writers held at DIRTY_BYTES_MAX wait for a commit
    /// and kick only after it: under 1 MiB sequential writes every seal then waited for the
    /// upload before it, and the machine idled a quarter of the time (docs/benchmarks.md,
    /// "Sealing the next batch during an upload").
    fn kick_background_flush(&self) {
        if self.inner.background_flush.swap(true, Ordering::AcqRel) {
            return;
        }
        let engine = self.clone();
        tokio::spawn(async move {
            let target = engine.inner.state.lock().write_gen;
            engine.seal_pending(target, Waiting::Engine).await;
            engine
                .inner
                .background_flush
                .store(false, Ordering::Release);
            let pending = engine.inner.state.lock().pending.data_bytes();
            if pending >= DIRTY_BYTES_FLUSH_START {
                engine.kick_background_flush();
            }
            if let Err(e) = engine.upload_queued(target).await {
                tracing::error!(error = %e, "background flush failed; unflushed writes stay in memory and are retried");
            }
        });
    }

    /// While clients ask for a barrier every few milliseconds (an fsync per transaction), a
    /// write is sealed and uploaded as soon as it is applied, so the barrier that follows finds
    /// it on its way: the upload overlaps the client's own round trip from the write's reply to
    /// its flush, instead of starting after it. While they ask every few hundred milliseconds,
    /// writes are sealed and uploaded once `WRITE_BEHIND_GATHERED_BYTES` have gathered, so a
    /// barrier seals at most about that much itself. One write-behind at a time: writes applied
    /// meanwhile go together in its next object, so a burst of writes is not cut into an object
    /// each. The task starts when the writer's task next waits, so a caller that answers its
    /// client from that task (the NBD server does) sends the reply first. Yielding here instead
    /// put the task at the back of the run queue and woke the other worker to steal it: 10 %
    /// more server CPU per transaction under pgbench rw-sync (docs/benchmarks.md).
    fn write_behind(&self, pending_bytes: usize) {
        if !self.write_behind_due(pending_bytes)
            || self.inner.write_behind_running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let engine = self.clone();
        tokio::spawn(async move {
            let covered = {
                let _running = ClearOnDrop(&engine.inner.write_behind_running);
                engine.write_behind_until_caught_up().await
            };
            // A write applied after the last look found the flag still set and started nothing.
            if let Some(gen) = covered {
                let pending_bytes = {
                    let st = engine.inner.state.lock();
                    (st.write_gen > gen).then(|| st.pending.data_bytes())
                };
                if let Some(pending_bytes) = pending_bytes {
                    engine.write_behind(pending_bytes);
                }
            }
        });
    }

    /// Whether the barriers' cadence calls for a write-behind with this much pending.
    fn write_behind_due(&self, pending_bytes: usize) -> bool {
        match self.inner.barrier_cadence.write_behind() {
            WriteBehind::EveryWrite => true,
            WriteBehind::Gathered => pending_bytes >= WRITE_BEHIND_GATHERED_BYTES,
            WriteBehind::Off => false,
        }
    }

    /// Seals and uploads what is pending until nothing more is due, or an upload fails (`None`:
    /// the next barrier retries it). Returns the write generation it made durable.
    async fn write_behind_until_caught_up(&self) -> Option<u64> {
        loop {
            let target = self.inner.state.lock().write_gen;
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                return Some(target);
            }
            self.inner
                .counters
                .write_behind_flushes
                .fetch_add(1, Ordering::Relaxed);
            self.seal_pending(target, Waiting::Client).await;
            if let Err(e) = self.upload_queued(target).await {
                tracing::error!(error = %e, "write-behind flush failed; the writes stay in memory and the next flush retries");
                return None;
            }
            let pending_bytes = self.inner.state.lock().pending.data_bytes();
            if !self.write_behind_due(pending_bytes) {
                return Some(target);
            }
        }
    }

    // ---- data -------------------------------------------------------------------------------

    /// Writes `fill` into `ino` at `offset` (`length` bytes), atomically.
    pub async fn write(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        fill: Fill<'_>,
    ) -> Result<(), EngineError> {
        self.check_writable()?;
        if length == 0 {
            return Ok(());
        }
        if let Fill::Data(d) = fill {
            assert_eq!(d.len() as u64, length, "data length matches the range");
        }
        self.make_room().await?;
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        // Whole extents of new data are copied out before the state lock is taken: copying (and,
        // in fresh memory, faulting in) a large write's pages under the lock stalled every other
        // request (perf, 1 MiB sequential writes).
        let mut whole_extents = match fill {
            Fill::Data(d) => (first..=last)
                .filter_map(|index| {
                    let (start, end) = extent_span(index, offset, length);
                    let at = (index * EXTENT_SIZE_BYTES_U64 - offset) as usize;
                    (start == 0 && end == EXTENT_SIZE_BYTES).then(|| {
                        self.inner
                            .extent_buffers
                            .copy_of(&d[at..at + EXTENT_SIZE_BYTES])
                    })
                })
                .collect(),
            Fill::Zeroes { .. } => Vec::new(),
        }
        .into_iter();
        loop {
            // Partial extents need their current content first; fetch those that are neither in
            // memory nor holes, outside the lock, then try again.
            let (missing, commit_gen) = {
                let mut st = self.inner.state.lock();
                let mut missing = Vec::new();
                for index in [first, last] {
                    let (start, end) = extent_span(index, offset, length);
                    if start == 0 && end == EXTENT_SIZE_BYTES {
                        continue;
                    }
                    if let Found::Stored(ptr) = st.find(ino, index) {
                        if !missing.iter().any(|(i, _)| *i == index) {
                            missing.push((index, ptr));
                        }
                    }
                }
                if missing.is_empty() {
                    self.apply_write(&mut st, ino, offset, length, fill, &mut whole_extents);
                    st.write_gen += 1;
                    let pending_bytes = st.pending.data_bytes();
                    drop(st);
                    self.write_behind(pending_bytes);
                    return Ok(());
                }
                (missing, st.commit_gen)
            };
            let fetched = self.fetch(ino, &missing).await?;
            let mut st = self.inner.state.lock();
            if st.commit_gen == commit_gen {
                for (index, data) in fetched {
                    st.clean.put((ino, index), data);
                }
            }
        }
    }

    /// Applies a write to the pending batch; `whole_extents` holds the copies of the whole
    /// extents of `Fill::Data`, in order.
    fn apply_write(
        &self,
        st: &mut State,
        ino: u64,
        offset: u64,
        length: u64,
        fill: Fill<'_>,
        whole_extents: &mut impl Iterator<Item = Arc<Vec<u8>>>,
    ) {
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        for index in first..=last {
            let (start, end) = extent_span(index, offset, length);
            let whole = start == 0 && end == EXTENT_SIZE_BYTES;
            let src_at = (index * EXTENT_SIZE_BYTES_U64 + start as u64 - offset) as usize;
            if whole {
                match fill {
                    Fill::Zeroes { punch: true } => {
                        st.punch(ino, index);
                        continue;
                    }
                    Fill::Zeroes { punch: false } => {
                        st.pending.extents.insert(
                            (ino, index),
                            Dirty::Data(Arc::new(vec![0; EXTENT_SIZE_BYTES])),
                        );
                        continue;
                    }
                    Fill::Data(_) => {
                        let data = whole_extents
                            .next()
                            .expect("every whole extent was copied beforehand");
                        st.pending.extents.insert((ino, index), Dirty::Data(data));
                        continue;
                    }
                }
            }
            let mut buf = match st.pending.extents.remove(&(ino, index)) {
                Some(Dirty::Data(d) | Dirty::Moved(d)) => d,
                Some(Dirty::Hole) => Arc::new(vec![0; EXTENT_SIZE_BYTES]),
                None => match st.find(ino, index) {
                    Found::Data(d) => d,
                    Found::Zero => Arc::new(vec![0; EXTENT_SIZE_BYTES]),
                    Found::Stored(_) => {
                        unreachable!("write() fetched every partial extent's base first")
                    }
                },
            };
            let target = &mut Arc::make_mut(&mut buf)[start..end];
            match fill {
                Fill::Data(d) => target.copy_from_slice(&d[src_at..src_at + (end - start)]),
                Fill::Zeroes { .. } => target.fill(0),
            }
            st.pending.extents.insert((ino, index), Dirty::Data(buf));
        }
        assert!(
            whole_extents.next().is_none(),
            "no copied extent is left over"
        );
    }

    pub async fn read(&self, ino: u64, offset: u64, length: usize) -> Result<Vec<u8>, EngineError> {
        loop {
            match self.read_once(ino, offset, length).await {
                // The log object was collected after its extents were overwritten while this read
                // was under way: look the extents up again.
                Err((EngineError::Store(StoreError::NotFound(_)), commit_gen))
                    if commit_gen != self.inner.state.lock().commit_gen => {}
                other => return other.map_err(|(e, _)| e),
            }
        }
    }

    async fn read_once(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Vec<u8>, (EngineError, u64)> {
        let mut out = vec![0u8; length];
        if length == 0 {
            return Ok(out);
        }
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length as u64 - 1) / EXTENT_SIZE_BYTES_U64;
        let mut found = Vec::with_capacity((last - first + 1) as usize);
        let mut missing = Vec::new();
        let commit_gen = {
            let mut st = self.inner.state.lock();
            for index in first..=last {
                match st.find(ino, index) {
                    Found::Data(d) => found.push((index, d)),
                    Found::Zero => {}
                    Found::Stored(ptr) => missing.push((index, ptr)),
                }
            }
            st.commit_gen
        };
        if !missing.is_empty() {
            let fetched = self
                .fetch(ino, &missing)
                .await
                .map_err(|e| (e, commit_gen))?;
            let mut st = self.inner.state.lock();
            if st.commit_gen == commit_gen {
                for (index, data) in &fetched {
                    st.clean.put((ino, *index), data.clone());
                }
            }
            drop(st);
            found.extend(fetched);
        }
        for (index, data) in found {
            let (start, end) = extent_span(index, offset, length as u64);
            let dst = (index * EXTENT_SIZE_BYTES_U64 + start as u64 - offset) as usize;
            out[dst..dst + end - start].copy_from_slice(&data[start..end]);
        }
        Ok(out)
    }

    /// Fetches and decodes stored extents, coalescing neighbours in one log object into one GET.
    async fn fetch(
        &self,
        ino: u64,
        wanted: &[(u64, ExtentPtr)],
    ) -> Result<Vec<(u64, Arc<Vec<u8>>)>, EngineError> {
        let mut sorted = wanted.to_vec();
        sorted.sort_by_key(|(_, p)| (p.seq, p.offset));
        let mut groups: Vec<Vec<(u64, ExtentPtr)>> = Vec::new();
        for item in sorted {
            match groups.last_mut() {
                Some(g)
                    if {
                        let prev = g.last().expect("groups are never empty").1;
                        prev.seq == item.1.seq
                            && u64::from(item.1.offset)
                                <= u64::from(prev.offset)
                                    + u64::from(prev.length)
                                    + READ_COALESCE_GAP_BYTES
                    } =>
                {
                    g.push(item)
                }
                _ => groups.push(vec![item]),
            }
        }
        let results: Vec<Vec<(u64, Arc<Vec<u8>>)>> = futures::stream::iter(groups)
            .map(|g| self.fetch_group(ino, g))
            .buffer_unordered(READ_FETCH_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(results.into_iter().flatten().collect())
    }

    async fn fetch_group(
        &self,
        ino: u64,
        group: Vec<(u64, ExtentPtr)>,
    ) -> Result<Vec<(u64, Arc<Vec<u8>>)>, EngineError> {
        let seq = group[0].1.seq;
        let key = logobj::log_key(seq);
        let mut frames: Vec<Option<Bytes>> = group
            .iter()
            .map(|(_, p)| {
                self.inner
                    .disk_cache
                    .as_ref()
                    .and_then(|c| c.get(p.seq, p.offset, p.length))
                    .map(Bytes::from)
            })
            .collect();
        if frames.iter().any(|f| f.is_none()) {
            let lo = group
                .iter()
                .zip(&frames)
                .filter(|(_, f)| f.is_none())
                .map(|((_, p), _)| u64::from(p.offset))
                .min()
                .expect("some missing");
            let hi = group
                .iter()
                .zip(&frames)
                .filter(|(_, f)| f.is_none())
                .map(|((_, p), _)| u64::from(p.offset) + u64::from(p.length))
                .max()
                .expect("some missing");
            let bytes = self.inner.bucket.get_range(&key, lo..hi).await?;
            for ((_, p), slot) in group.iter().zip(frames.iter_mut()) {
                if slot.is_none() {
                    let at = (u64::from(p.offset) - lo) as usize;
                    let frame = bytes.slice(at..at + p.length as usize);
                    if let Some(c) = &self.inner.disk_cache {
                        c.put_frame(p.seq, p.offset, &frame);
                    }
                    *slot = Some(frame);
                }
            }
        }
        let mut out = Vec::with_capacity(group.len());
        for ((index, _), frame) in group.iter().zip(frames) {
            let frame = frame.expect("every frame was filled above");
            match frame::decode(&self.inner.sealer, ino, *index, &frame) {
                Ok(plain) => out.push((*index, Arc::new(plain))),
                Err(e) => {
                    tracing::error!(object = %key, error = %e, "stored data failed verification; answering EIO");
                    if let Some(c) = &self.inner.disk_cache {
                        c.drop_object(seq);
                    }
                    return Err(EngineError::Corrupt(format!("{key}: {e}")));
                }
            }
        }
        Ok(out)
    }

    /// Allocation map of `ino` over `offset..offset+length`: runs of (length, allocated).
    pub fn allocation(&self, ino: u64, offset: u64, length: u64) -> Vec<(u64, bool)> {
        if length == 0 {
            return Vec::new();
        }
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        let st = self.inner.state.lock();
        let mut allocated: BTreeSet<u64> = st
            .committed
            .extent_indexes(ino, first..last + 1)
            .into_iter()
            .collect();
        for batch in st.oldest_first() {
            for ((i, index), d) in &batch.extents {
                if *i == ino && (first..=last).contains(index) {
                    match d {
                        Dirty::Data(_) | Dirty::Moved(_) => allocated.insert(*index),
                        Dirty::Hole => allocated.remove(index),
                    };
                }
            }
        }
        drop(st);
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let end = offset + length;
        let mut at = offset;
        while at < end {
            let index = at / EXTENT_SIZE_BYTES_U64;
            let next = ((index + 1) * EXTENT_SIZE_BYTES_U64).min(end);
            let a = allocated.contains(&index);
            match runs.last_mut() {
                Some((len, prev)) if *prev == a => *len += next - at,
                _ => runs.push((next - at, a)),
            }
            at = next;
        }
        runs
    }

    /// Deallocates every extent of `ino` at or beyond `from_index` (file deletion, truncation).
    pub fn drop_extents_from(&self, ino: u64, from_index: u64) -> Result<(), EngineError> {
        self.check_writable()?;
        let mut st = self.inner.state.lock();
        let mut indexes: BTreeSet<u64> = st
            .committed
            .extent_indexes(ino, from_index..u64::MAX)
            .into_iter()
            .collect();
        for batch in st.oldest_first() {
            indexes.extend(
                batch
                    .extents
                    .keys()
                    .filter(|(i, x)| *i == ino && *x >= from_index)
                    .map(|(_, x)| *x),
            );
        }
        for index in indexes {
            st.punch(ino, index);
        }
        st.write_gen += 1;
        Ok(())
    }

    // ---- metadata key-value pairs -----------------------------------------------------------

    pub fn kv_get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.state.lock().kv_get(key)
    }

    /// Every pair whose key starts with `prefix`, in key order.
    pub fn kv_scan(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let st = self.inner.state.lock();
        let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = st
            .committed
            .kv_range(prefix)
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        for batch in st.oldest_first() {
            for (k, v) in batch
                .kv
                .range(prefix.to_vec()..)
                .take_while(|(k, _)| k.starts_with(prefix))
            {
                merged.insert(k.clone(), v.clone());
            }
        }
        merged
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }

    /// Applies the changes atomically (all of them are in the same flush).
    pub fn kv_commit(&self, changes: Vec<KvChange>) -> Result<(), EngineError> {
        self.check_writable()?;
        let mut st = self.inner.state.lock();
        for c in changes {
            match c {
                KvChange::Put(k, v) => st.pending.kv.insert(k, Some(v)),
                KvChange::Delete(k) => st.pending.kv.insert(k, None),
            };
        }
        st.write_gen += 1;
        Ok(())
    }

    // ---- the flush barrier ------------------------------------------------------------------

    /// Returns once every mutation applied before the call is durable in the bucket.
    /// Concurrent callers share uploads (group commit). A client's barrier (NBD FLUSH, FUA, an
    /// admin change): it counts towards the cadence that turns write-behind on.
    pub async fn flush(&self) -> Result<(), EngineError> {
        self.inner.barrier_cadence.note();
        self.barrier(Waiting::Client).await
    }

    /// The barrier itself: a client's (through `flush`, which also counts it towards the
    /// cadence) or the engine's own; `waiting` says whose, and so which codec seals it.
    async fn barrier(&self, waiting: Waiting) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let (target, pending_bytes) = {
            let st = self.inner.state.lock();
            (st.write_gen, st.pending.data_bytes())
        };
        let result = loop {
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                break Ok(());
            }
            if let Some(why) = &*self.inner.poisoned.lock() {
                break Err(EngineError::Poisoned(why.clone()));
            }
            self.seal_pending(target, waiting).await;
            if let Err(e) = self.upload_queued(target).await {
                break Err(e);
            }
        };
        let wait_us = started.elapsed().as_micros() as u64;
        tracing::debug!(target, pending_bytes, wait_us, ?waiting, "barrier");
        let c = &self.inner.counters;
        c.barriers.fetch_add(1, Ordering::Relaxed);
        c.barrier_wait_us.fetch_add(wait_us, Ordering::Relaxed);
        result
    }

    /// Stage one: unless a queued batch already covers `target`, freeze the pending batch, seal
    /// it and queue it.
    async fn seal_pending(&self, target: u64, waiting: Waiting) {
        let mut ctl = self.inner.seal.lock().await;
        let frozen_gen = self.inner.queue.lock().back().map(|s| s.gen);
        if frozen_gen.is_some_and(|g| g >= target)
            || self.inner.durable_gen.load(Ordering::Acquire) >= target
        {
            return;
        }
        let batch = {
            let mut st = self.inner.state.lock();
            let mut batch = std::mem::take(&mut st.pending);
            batch.gen = st.write_gen;
            if batch.is_empty() {
                // Nothing new since the last freeze: the queued batches (if any) cover it all.
                drop(st);
                if frozen_gen.is_none() {
                    self.inner
                        .durable_gen
                        .fetch_max(batch.gen, Ordering::AcqRel);
                }
                return;
            }
            let batch = Arc::new(batch);
            st.flushing.push_back(batch.clone());
            batch
        };
        let seq = ctl.next_seq;
        ctl.next_seq += 1;
        let started = std::time::Instant::now();
        let gen = batch.gen;
        let extents = batch.extents.len();
        let codec = self.codec_for(extents, waiting);
        let (object, ops) = self.encode(seq, batch, codec).await;
        tracing::debug!(
            seq,
            bytes = object.as_ref().len(),
            extents,
            seal_us = started.elapsed().as_micros() as u64,
            ?codec,
            "sealed"
        );
        self.inner.queue.lock().push_back(Sealed {
            upload: UploadState::Waiting,
            seq,
            object: object.into_bytes(),
            ops: Arc::new(ops),
            gen,
        });
        let c = &self.inner.counters;
        c.flushes.fetch_add(1, Ordering::Relaxed);
        if codec == Codec::Lz4 {
            c.flushes_lz4.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stage two: upload and commit queued objects in order until `target` is durable.
    async fn upload_queued(&self, target: u64) -> Result<(), EngineError> {
        loop {
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            let stored = self.inner.stored_notify.notified();
            tokio::pin!(stored);
            stored.as_mut().enable();
            if let Some((seq, object)) = self.start_uploads() {
                self.run_upload(seq, object).await;
            }
            {
                let mut ctl = self.inner.upload.lock().await;
                loop {
                    let front = self
                        .inner
                        .queue
                        .lock()
                        .front()
                        .map(|s| (s.upload.clone(), s.seq));
                    match front {
                        Some((UploadState::Stored, _)) => {
                            let sealed = self
                                .inner
                                .queue
                                .lock()
                                .front()
                                .cloned()
                                .expect("the front was just seen");
                            // Commit before dequeuing: whoever finds the queue empty may rely on
                            // it being durable.
                            self.commit(&mut ctl, &sealed);
                            self.inner.queue.lock().pop_front();
                            self.inner.committed_notify.notify_waiters();
                        }
                        Some((UploadState::Failed(why), seq)) => {
                            // Retried, byte for byte, by the next flush.
                            if let Some(f) = self.inner.queue.lock().front_mut() {
                                f.upload = UploadState::Waiting;
                            }
                            self.inner.upload_failing.store(true, Ordering::Release);
                            tracing::error!(seq, error = %why, "upload failed; the sealed object stays queued and is uploaded again by the next flush");
                            return Err(EngineError::Store(StoreError::Transient(why)));
                        }
                        Some(_) => break,
                        None => return Ok(()),
                    }
                }
            }
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if let Some(why) = &*self.inner.poisoned.lock() {
                return Err(EngineError::Poisoned(why.clone()));
            }
            stored.await;
        }
    }

    /// Starts the uploads of queued objects, at most UPLOADS_IN_FLIGHT_MAX at a time. When none
    /// was in flight, the first is returned for the caller to run itself (`run_upload`): on
    /// the fsync path, handing it to a task of its own cost a wake-up of another worker thread
    /// (~60 us on the test VM) before and after the write.
    fn start_uploads(&self) -> Option<(u64, Bytes)> {
        let mut queue = self.inner.queue.lock();
        let mut in_flight = queue
            .iter()
            .filter(|s| s.upload == UploadState::InFlight)
            .count();
        let mut run_here = None;
        for sealed in queue.iter_mut().take(UPLOADS_IN_FLIGHT_MAX) {
            if in_flight >= UPLOADS_IN_FLIGHT_MAX {
                break;
            }
            if sealed.upload != UploadState::Waiting {
                continue;
            }
            sealed.upload = UploadState::InFlight;
            let upload = (sealed.seq, sealed.object.clone());
            if in_flight == 0 && run_here.is_none() {
                run_here = Some(upload);
            } else {
                let engine = self.clone();
                tokio::spawn(async move { engine.run_upload(upload.0, upload.1).await });
            }
            in_flight += 1;
        }
        run_here
    }

    /// Uploads a queued object and records the outcome in the queue. If the caller gives up
    /// half way (its request was cancelled), the object goes back to waiting, and the next
    /// flush uploads it (an upload that did land is recognised then).
    async fn run_upload(&self, seq: u64, object: Bytes) {
        struct Unfinished<'a>(Option<&'a Engine>, u64);
        impl Drop for Unfinished<'_> {
            fn drop(&mut self) {
                if let Some(engine) = self.0 {
                    engine.set_upload_state(self.1, UploadState::Waiting);
                }
            }
        }
        let mut unfinished = Unfinished(Some(self), seq);
        let started = std::time::Instant::now();
        let result = self.upload(seq, object).await;
        unfinished.0 = None;
        tracing::debug!(
            seq,
            upload_us = started.elapsed().as_micros() as u64,
            ok = result.is_ok(),
            "uploaded"
        );
        if result.is_ok() {
            self.inner.upload_failing.store(false, Ordering::Release);
        }
        self.set_upload_state(
            seq,
            match result {
                Ok(()) => UploadState::Stored,
                Err(e) => UploadState::Failed(e.to_string()),
            },
        );
    }

    fn set_upload_state(&self, seq: u64, state: UploadState) {
        if let Some(s) = self.inner.queue.lock().iter_mut().find(|s| s.seq == seq) {
            s.upload = state;
        }
        self.inner.stored_notify.notify_waiters();
    }

    async fn upload(&self, seq: u64, object: Bytes) -> Result<(), EngineError> {
        let key = logobj::log_key(seq);
        match self
            .inner
            .bucket
            .put(&key, object.clone(), PutMode::Create)
            .await
        {
            Ok(()) => Ok(()),
            // An earlier attempt that reported failure (a timeout) may have stored it after all.
            Err(StoreError::AlreadyExists(_))
                if self
                    .inner
                    .bucket
                    .get(&key)
                    .await
                    .is_ok_and(|stored| stored == object) =>
            {
                Ok(())
            }
            Err(StoreError::AlreadyExists(_)) => {
                let why = format!(
                    "{key} was written by another process: a second writer is using this bucket"
                );
                tracing::error!("{why}");
                *self.inner.poisoned.lock() = Some(why.clone());
                Err(EngineError::Poisoned(why))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The codec a batch of `extents` is sealed with. With zstd configured, lz4 where a client
    /// waits on the seal at a steady cadence:
    /// - the small batches of fsync-driven flushes: zstd was most of their sealing, and with
    ///   lz4 bucketfs used ~5 % less CPU per pgbench rw-sync transaction (bench/ab), though it
    ///   uploads about a third more bytes;
    /// - any batch a client's barrier or write-behind seals while the barriers come less than
    ///   `WRITE_BEHIND_GATHERED_BARRIER_GAP_US` apart: under pgbench rw-async the barrier was
    ///   mostly the WAL writer's ~1 MiB being sealed with zstd on cores PostgreSQL keeps busy
    ///   (docs/benchmarks.md, "lz4 where a client waits").
    ///
    /// The engine's own flushes (memory filling up, the periodic flush, repacking) and the
    /// barriers of a client that flushes rarely (a bulk load, fio) use the configured codec. Most
    /// lz4 objects are garbage within seconds; the collector repacks the frames that stay live
    /// in small objects into large ones, with the configured codec.
    fn codec_for(&self, extents: usize, waiting: Waiting) -> Codec {
        match self.inner.codec {
            Codec::Zstd
                if extents <= INLINE_SEAL_EXTENTS_MAX
                    || (waiting == Waiting::Client
                        && self.inner.barrier_cadence.write_behind() != WriteBehind::Off) =>
            {
                Codec::Lz4
            }
            configured => configured,
        }
    }

    /// Seals the batch's extents (on blocking threads, in parallel) into a log object.
    async fn encode(
        &self,
        seq: u64,
        batch: Arc<Batch>,
        codec: Codec,
    ) -> (ObjectBuffer, Vec<MetaOp>) {
        // The fsync-heavy case (a few extents per flush) takes tens of microseconds to seal:
        // less than the hop to a blocking thread, which sits on the critical path of an fsync.
        if batch.extents.len() <= INLINE_SEAL_EXTENTS_MAX {
            return self.encode_blocking(seq, &batch, codec);
        }
        let engine = self.clone();
        tokio::task::spawn_blocking(move || engine.encode_blocking(seq, &batch, codec))
            .await
            .expect("encoding does not panic")
    }

    fn encode_blocking(
        &self,
        seq: u64,
        batch: &Batch,
        codec: Codec,
    ) -> (ObjectBuffer, Vec<MetaOp>) {
        let mut ops: Vec<MetaOp> = batch
            .kv
            .iter()
            .map(|(k, v)| match v {
                Some(v) => MetaOp::KvPut {
                    key: k.clone(),
                    value: v.clone(),
                },
                None => MetaOp::KvDelete { key: k.clone() },
            })
            .collect();
        let mut data: Vec<(u64, u64, &Arc<Vec<u8>>, Codec)> = Vec::new();
        for ((ino, index), d) in &batch.extents {
            match d {
                Dirty::Data(buf) => data.push((*ino, *index, buf, codec)),
                Dirty::Moved(buf) => data.push((*ino, *index, buf, self.inner.codec)),
                Dirty::Hole => ops.push(MetaOp::ExtentClear {
                    ino: *ino,
                    index: *index,
                }),
            }
        }
        data.sort_unstable_by_key(|(ino, index, _, _)| (*ino, *index));
        let threads = cpu_count()
            .min(data.len().div_ceil(PARALLEL_SEAL_EXTENTS_MIN))
            .max(1);
        let chunk = data.len().div_ceil(threads).max(1);
        let sealer = &self.inner.sealer;
        // Each part is sealed into its own stretch of the object buffer, sized for frames that
        // do not compress; the parts are then moved together.
        let stretch = chunk * FRAME_BYTES_MAX;
        let mut object = self
            .inner
            .object_buffers
            .take(LOG_HEADER_BYTES + data.len() * FRAME_BYTES_MAX);
        let room = object.room();
        room[..LOG_HEADER_BYTES].copy_from_slice(&logobj::log_header(seq));
        let seal_part = move |out: &mut [u8], part: &[(u64, u64, &Arc<Vec<u8>>, Codec)]| {
            let mut at = 0;
            part.iter()
                .map(|(ino, index, plain, codec)| {
                    let n = frame::encode(&mut out[at..], sealer, *codec, *ino, *index, plain);
                    at += n;
                    n
                })
                .collect::<Vec<usize>>()
        };
        let stretches = &mut room[LOG_HEADER_BYTES..];
        // Batches of up to a few hundred extents (the fsync-heavy case, PostgreSQL's WAL bursts,
        // repacks) are sealed by this thread alone: splitting them costs more than it saves
        // (PARALLEL_SEAL_EXTENTS_MIN). Larger ones on rayon's threads, which live as long as
        // the process: a thread started per batch would set up its zstd contexts and random
        // generator afresh, in freshly faulted memory (2 % of bucketfs's CPU under pgbench
        // rw-sync, where repacked objects were such batches; perf).
        let lens: Vec<Vec<usize>> = if threads == 1 {
            stretches
                .chunks_mut(stretch)
                .zip(data.chunks(chunk))
                .map(|(out, part)| seal_part(out, part))
                .collect()
        } else {
            use rayon::prelude::*;
            stretches
                .par_chunks_mut(stretch)
                .zip(data.par_chunks(chunk))
                .map(|(out, part)| seal_part(out, part))
                .collect()
        };
        let mut at = LOG_HEADER_BYTES;
        let mut lz4_frames = 0;
        for (i, (part_lens, part)) in lens.iter().zip(data.chunks(chunk)).enumerate() {
            let from = LOG_HEADER_BYTES + i * stretch;
            let used: usize = part_lens.iter().sum();
            if from != at {
                room.copy_within(from..from + used, at);
            }
            for (&n, (ino, index, _, _)) in part_lens.iter().zip(part) {
                lz4_frames += usize::from(frame::codec(&room[at..at + n]) == Some(Codec::Lz4));
                let ptr = ExtentPtr {
                    seq,
                    offset: u32::try_from(at).expect("log objects stay below 4 GiB"),
                    length: n as u32,
                };
                ops.push(MetaOp::ExtentSet {
                    ino: *ino,
                    index: *index,
                    ptr,
                });
                at += n;
            }
        }
        // Marked for re-sealing when mostly lz4. An object of extents the collector moved
        // (sealed with zstd) that a client's write-behind swept up with a few lz4 frames of
        // its own is not: re-sealing it would move the same extents again every interval
        // (docs/0001, "Re-sealing lz4 frames").
        if lz4_frames * 2 > data.len() {
            // After the extents it is about: applying it needs the object live.
            ops.push(MetaOp::HoldsLz4 { seq });
        }
        let tail = logobj::log_tail(sealer, seq, &ops, at);
        object.reserve(at + tail.len());
        object.room()[at..at + tail.len()].copy_from_slice(&tail);
        object.set_len(at + tail.len());
        (object, ops)
    }

    /// Makes an uploaded log object the committed state.
    fn commit(&self, ctl: &mut UploadCtl, sealed: &Sealed) {
        let (seq, object) = (sealed.seq, &sealed.object);
        let mut evicted = Vec::new();
        let snapshot = {
            let mut st = self.inner.state.lock();
            let batch = st
                .flushing
                .pop_front()
                .expect("a committed batch was flushing");
            assert_eq!(
                batch.gen, sealed.gen,
                "batches commit in the order they were frozen"
            );
            for op in sealed.ops.iter() {
                st.committed.apply(op);
            }
            for ((ino, index), d) in &batch.extents {
                match d {
                    Dirty::Data(buf) => {
                        if let Some((_, old)) = st.clean.push((*ino, *index), buf.clone()) {
                            evicted.push(old);
                        }
                    }
                    // Unchanged contents: what the memory tier holds of it is still right, and
                    // leaving it out keeps the collector's cold extents from evicting hot ones.
                    Dirty::Moved(_) => {}
                    Dirty::Hole => {
                        st.clean.pop(&(*ino, *index));
                    }
                }
            }
            st.commit_gen += 1;
            // Counted before the flushes waiting for it can return: a caller that reads the
            // counters after its flush sees its object in them.
            let c = &self.inner.counters;
            c.log_objects_written.fetch_add(1, Ordering::Relaxed);
            c.log_bytes_written
                .fetch_add(object.len() as u64, Ordering::Relaxed);
            self.inner
                .durable_gen
                .fetch_max(batch.gen, Ordering::AcqRel);
            ctl.log_bytes_since_checkpoint += object.len() as u64;
            let due = seq
                >= ctl.checkpoint_seq
                    + log_objects_per_checkpoint(st.committed.extent_count() as u64)
                || ctl.log_bytes_since_checkpoint >= LOG_BYTES_PER_CHECKPOINT;
            (due && !self.inner.checkpoint_running.swap(true, Ordering::AcqRel))
                .then(|| st.committed.clone())
        };
        // Outside the lock, and after the batch is gone (it may hold some of the same extents).
        self.inner.extent_buffers.give_back(evicted);
        ctl.known_logs.insert(seq, object.len() as u64);
        self.inner
            .log_bytes_stored
            .fetch_add(object.len() as u64, Ordering::Relaxed);
        if self.inner.disk_cache.is_some() {
            // Up to PENDING_BYTES_MAX of file writes: not on an async worker.
            let (engine, object) = (self.clone(), object.clone());
            tokio::task::spawn_blocking(move || {
                if let Some(c) = &engine.inner.disk_cache {
                    c.put_object(seq, &object);
                }
            });
        }
        self.inner.last_commit_us.store(
            self.inner.epoch.elapsed().as_micros() as u64,
            Ordering::Release,
        );
        if let Some(state) = snapshot {
            let covered = self.begin_checkpoint(ctl, seq);
            let engine = self.clone();
            tokio::spawn(async move {
                // Cleared however the task ends (a panic included), so the next one can run.
                let _running = ClearOnDrop(&engine.inner.checkpoint_running);
                if let Err(e) = engine
                    .checkpoint_and_collect(seq, state, covered, Repack::Yes)
                    .await
                {
                    tracing::error!(seq, error = %e, "checkpoint failed; the log keeps growing until the next one");
                }
            });
        }
    }

    /// Starts the interval of the checkpoint as of log object `seq` (the caller holds the
    /// committed map as of `seq` and has set `checkpoint_running`); returns what it covers.
    fn begin_checkpoint(&self, ctl: &mut UploadCtl, seq: u64) -> Covered {
        self.inner
            .repacked_uncollected
            .store(false, Ordering::Release);
        ctl.checkpoint_seq = seq;
        let log_bytes = std::mem::take(&mut ctl.log_bytes_since_checkpoint);
        // The newest earlier checkpoint begun at least `reseal_after` ago: what it covered has
        // been live that long. Under fsync-heavy load checkpoints come every few seconds, so
        // their count says nothing of age.
        let now = std::time::Instant::now();
        let old_enough =
            |at: &std::time::Instant| now.duration_since(*at) >= self.inner.reseal_after;
        while ctl.checkpoints_begun.len() > 1 && old_enough(&ctl.checkpoints_begun[1].1) {
            ctl.checkpoints_begun.pop_front();
        }
        let aged_through = match ctl.checkpoints_begun.front() {
            Some((s, at)) if old_enough(at) => *s,
            _ => 0,
        };
        ctl.checkpoints_begun.push_back((seq, now));
        Covered {
            logs: ctl
                .known_logs
                .range(..=seq)
                .map(|(s, bytes)| (*s, *bytes))
                .collect(),
            aged_through,
            log_bytes,
        }
    }

    /// Checks a few times per `quiet` whether the engine has been quiet that long with enough
    /// log objects since the last checkpoint, and writes one then (QUIET_CHECKPOINT_AFTER_MS).
    fn spawn_quiet_checkpoints(&self, quiet: Duration) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(quiet / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if let Err(e) = engine.checkpoint_if_quiet(quiet).await {
                    tracing::error!(error = %e, "quiet checkpoint failed; the next regular one collects instead");
                }
            }
        });
    }

    /// When quiet: a checkpoint if enough log objects await one, repacking the sparse ones;
    /// then, if the last checkpoint (that one or a regular one) repacked extents, one more
    /// that only collects, so that the objects the extents were moved out of are deleted too
    /// (before they turn into files of a `file://` bucket). It does not repack, so after it
    /// nothing is due until the next commit: an idle engine makes no requests.
    async fn checkpoint_if_quiet(&self, quiet: Duration) -> Result<(), EngineError> {
        let quiet_since = Duration::from_micros(self.inner.last_commit_us.load(Ordering::Acquire));
        if self.inner.epoch.elapsed().saturating_sub(quiet_since) < quiet
            || self.inner.poisoned.lock().is_some()
        {
            return Ok(());
        }
        let since_checkpoint = |ctl: &UploadCtl| {
            ctl.known_logs
                .last_key_value()
                .map_or(0, |(s, _)| s.saturating_sub(ctl.checkpoint_seq))
        };
        self.quiet_checkpoint(
            |ctl, st| {
                since_checkpoint(ctl) * QUIET_CHECKPOINT_FRACTION
                    >= log_objects_per_checkpoint(st.committed.extent_count() as u64)
            },
            Repack::Yes,
        )
        .await?;
        self.quiet_checkpoint(
            |ctl, _| {
                since_checkpoint(ctl) > 0 && self.inner.repacked_uncollected.load(Ordering::Acquire)
            },
            Repack::No,
        )
        .await
    }

    /// Writes a checkpoint as of the last committed log object, and collects, if `due` says
    /// so and none is running. Commits wait meanwhile only for the map's clone.
    async fn quiet_checkpoint(
        &self,
        due: impl Fn(&UploadCtl, &State) -> bool,
        repack: Repack,
    ) -> Result<(), EngineError> {
        // Commits happen under `upload`: holding it, the map is exactly as of the last one.
        let (seq, state, covered) = {
            let mut ctl = self.inner.upload.lock().await;
            let snapshot = {
                let st = self.inner.state.lock();
                (due(&ctl, &st) && !self.inner.checkpoint_running.swap(true, Ordering::AcqRel))
                    .then(|| st.committed.clone())
            };
            let Some(state) = snapshot else {
                return Ok(());
            };
            let seq = *ctl
                .known_logs
                .last_key_value()
                .expect("a due checkpoint follows a committed log object")
                .0;
            (seq, state, self.begin_checkpoint(&mut ctl, seq))
        };
        let _running = ClearOnDrop(&self.inner.checkpoint_running);
        tracing::debug!(seq, "quiet: writing a checkpoint");
        self.checkpoint_and_collect(seq, state, covered, repack)
            .await
    }

    /// Writes a checkpoint as of log object `seq`, then deletes what it made unnecessary: older
    /// checkpoints and log objects up to `seq` that hold no live extent; then repacks those
    /// that hold few live extents, and re-seals long-lived lz4 frames, so that the next
    /// checkpoint can delete the objects they leave.
    async fn checkpoint_and_collect(
        &self,
        seq: u64,
        state: MetaState,
        covered: Covered,
        repack: Repack,
    ) -> Result<(), EngineError> {
        let engine = self.clone();
        let (object, state) = tokio::task::spawn_blocking(move || {
            let mut scratch = engine.inner.checkpoint_scratch.lock();
            let object = logobj::encode_checkpoint(&engine.inner.sealer, seq, &state, &mut scratch);
            (object, state)
        })
        .await
        .expect("encoding does not panic");
        self.inner
            .bucket
            .put(
                &logobj::checkpoint_key(seq),
                Bytes::from(object),
                PutMode::Create,
            )
            .await?;
        self.inner
            .counters
            .checkpoints_written
            .fetch_add(1, Ordering::Relaxed);
        for old in self.inner.bucket.list("checkpoint/").await? {
            if logobj::parse_seq(&old.key, "checkpoint").is_some_and(|s| s < seq) {
                self.inner
                    .bucket
                    .delete(&old.key, DeleteMode::Garbage)
                    .await?;
            }
        }
        // Live bytes of a log object only ever fall (new pointers point at new objects), so an
        // object found dead here stays dead.
        let (dead, live): (Vec<(u64, u64)>, Vec<(u64, u64)>) = {
            let st = self.inner.state.lock();
            covered
                .logs
                .iter()
                .partition(|(s, _)| st.committed.live_bytes(*s) == 0)
        };
        let deleted: Vec<u64> = futures::stream::iter(dead)
            .map(|(s, _)| async move {
                self.inner
                    .bucket
                    .delete(&logobj::log_key(s), DeleteMode::Garbage)
                    .await
                    .map(|()| s)
            })
            .buffer_unordered(DELETE_CONCURRENCY)
            .try_collect()
            .await?;
        {
            // Not held any longer: the repack below flushes, and committing needs it.
            let mut ctl = self.inner.upload.lock().await;
            for s in &deleted {
                if let Some(bytes) = ctl.known_logs.remove(s) {
                    self.inner
                        .log_bytes_stored
                        .fetch_sub(bytes, Ordering::Relaxed);
                }
                if let Some(c) = &self.inner.disk_cache {
                    c.drop_object(*s);
                }
            }
        }
        self.inner
            .counters
            .log_objects_deleted
            .fetch_add(deleted.len() as u64, Ordering::Relaxed);
        tracing::info!(seq, "checkpoint written");
        if repack == Repack::No {
            return Ok(());
        }
        if let Err(e) = self
            .repack(&state, &live.into_iter().collect(), &covered)
            .await
        {
            tracing::warn!(seq, error = %e, "moving extents out of log objects failed; they stay until a later checkpoint tries again");
        }
        Ok(())
    }

    /// Moves extents, unchanged, out of log objects the checkpoint `state` covers, into new
    /// log objects, so that the old ones die and the next checkpoint deletes them:
    /// - the extents of those `live` objects (sequence number to size in bytes) that hold only
    ///   a few (REPACK_LIVE_EXTENTS_MAX): a few extents that are never overwritten would
    ///   otherwise keep each object alive;
    /// - of the `live` objects `covered` finds aged (covered by a checkpoint begun at least
    ///   `reseal_after` ago), the fragmented ones (`fragmented_objects`), up to as many live
    ///   bytes as the log objects of the interval took (at least REPACK_FRAGMENTED_BYTES_MIN,
    ///   at most LOG_BYTES_PER_CHECKPOINT, the most an interval writes while it keeps up):
    ///   overwritten in place, a device's large objects would otherwise keep their garbage for
    ///   as long as a few of their extents stay;
    /// - with zstd configured, the extents of whole aged objects that hold lz4 frames: they
    ///   have been live that long, so they are likely to stay, and zstd stores them in about
    ///   half the bytes.
    ///
    /// An extent written again meanwhile is left alone (the write kills its old frame anyway).
    /// Contents never change, so the atomic prefix a crash leaves is unaffected.
    async fn repack(
        &self,
        state: &MetaState,
        live: &HashMap<u64, u64>,
        covered: &Covered,
    ) -> Result<(), EngineError> {
        let live_seqs: HashSet<u64> = live.keys().copied().collect();
        let mut sparse = state.extents_of_sparse_objects(&live_seqs, REPACK_LIVE_EXTENTS_MAX);
        let sparse_seqs: HashSet<u64> = sparse.iter().map(|(_, _, p)| p.seq).collect();
        sparse.truncate(REPACK_EXTENTS_MAX);
        let aged: Vec<(u64, u64, u64)> = live
            .iter()
            .filter(|(seq, _)| **seq <= covered.aged_through && !sparse_seqs.contains(seq))
            .map(|(seq, size)| (*seq, state.live_bytes(*seq), *size))
            .collect();
        let budget = covered
            .log_bytes
            .clamp(REPACK_FRAGMENTED_BYTES_MIN, LOG_BYTES_PER_CHECKPOINT);
        let fragmented = state.extents_of_objects(&fragmented_objects(&aged, budget));
        // Sparse objects are repacking's, within its own budget: under fsync-heavy load they
        // are many, and re-sealing is for the dense ones.
        let lz4 = match self.inner.codec {
            Codec::Zstd => whole_objects_up_to(
                state
                    .extents_of_lz4_objects(covered.aged_through, REPACK_LIVE_EXTENTS_MAX)
                    .into_iter(),
                RESEAL_EXTENTS_MAX,
            ),
            Codec::Lz4 | Codec::None => Vec::new(),
        };
        tracing::debug!(
            sparse = sparse.len(),
            fragmented = fragmented.len(),
            lz4 = lz4.len(),
            aged_through = covered.aged_through,
            "moving extents out of covered log objects"
        );
        let c = &self.inner.counters;
        self.move_extents(&sparse, &c.extents_repacked).await?;
        self.move_extents(&fragmented, &c.extents_defragmented)
            .await?;
        // Extents of fragmented objects that held lz4 frames are moved already: the move skips
        // what no longer points where the checkpoint saw it.
        self.move_extents(&lz4, &c.extents_resealed).await
    }

    /// Moves `extents` (inode, index, pointer as the checkpoint has it) by flushes of up to
    /// REPACK_EXTENTS_PER_OBJECT, counting those moved in `moved_count`. Client flushes queued
    /// behind one wait for a few milliseconds of sealing, not for all of it (and in a `file://`
    /// bucket each object stays small enough for the journal).
    async fn move_extents(
        &self,
        extents: &[(u64, u64, ExtentPtr)],
        moved_count: &AtomicU64,
    ) -> Result<(), EngineError> {
        let unchanged = |st: &State, ino: u64, index: u64, ptr: ExtentPtr| {
            st.committed.extent(ino, index) == Some(ptr)
                && st
                    .newest_first()
                    .all(|b| !b.extents.contains_key(&(ino, index)))
        };
        for chunk in extents.chunks(REPACK_EXTENTS_PER_OBJECT) {
            // The plaintext: from the memory tier while it is there (it usually is for
            // extents written since the last checkpoint or so), else fetched.
            let mut found = Vec::with_capacity(chunk.len());
            let mut missing: BTreeMap<u64, Vec<(u64, ExtentPtr)>> = BTreeMap::new();
            {
                let st = self.inner.state.lock();
                for &(ino, index, ptr) in chunk {
                    if !unchanged(&st, ino, index, ptr) {
                        continue;
                    }
                    match st.clean.peek(&(ino, index)) {
                        Some(data) => found.push((ino, index, ptr, data.clone())),
                        None => missing.entry(ino).or_default().push((index, ptr)),
                    }
                }
            }
            for (ino, wanted) in missing {
                let ptrs: HashMap<u64, ExtentPtr> = wanted.iter().copied().collect();
                for (index, data) in self.fetch(ino, &wanted).await? {
                    found.push((ino, index, ptrs[&index], data));
                }
            }
            let moved = {
                let mut st = self.inner.state.lock();
                let mut moved = 0;
                for (ino, index, ptr, data) in found {
                    if unchanged(&st, ino, index, ptr) {
                        st.pending.extents.insert((ino, index), Dirty::Moved(data));
                        moved += 1;
                    }
                }
                if moved > 0 {
                    st.write_gen += 1;
                }
                moved
            };
            if moved == 0 {
                continue;
            }
            moved_count.fetch_add(moved, Ordering::Relaxed);
            tracing::debug!(
                extents = moved,
                "moving extents out of objects the collector wants dead"
            );
            self.barrier(Waiting::Engine).await?;
            self.inner
                .repacked_uncollected
                .store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Flushes, then gives up the writer lock. The engine refuses writes afterwards.
    pub async fn close(&self) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Ok(());
        }
        self.barrier(Waiting::Engine).await?;
        *self.inner.poisoned.lock() = Some("the engine is closed".into());
        self.inner.bucket.end_writing().await?;
        if let Some(me) = &self.inner.lock_holder {
            lease::release(&self.inner.bucket, me).await?;
        }
        Ok(())
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.inner.counters;
        let st = self.inner.state.lock();
        EngineStats {
            barriers: c.barriers.load(Ordering::Relaxed),
            barrier_wait_us: c.barrier_wait_us.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            flushes_lz4: c.flushes_lz4.load(Ordering::Relaxed),
            write_behind_flushes: c.write_behind_flushes.load(Ordering::Relaxed),
            log_objects_written: c.log_objects_written.load(Ordering::Relaxed),
            log_bytes_written: c.log_bytes_written.load(Ordering::Relaxed),
            log_bytes_stored: self.inner.log_bytes_stored.load(Ordering::Relaxed),
            log_bytes_live: st.committed.live_bytes_total(),
            checkpoints_written: c.checkpoints_written.load(Ordering::Relaxed),
            log_objects_deleted: c.log_objects_deleted.load(Ordering::Relaxed),
            extents_repacked: c.extents_repacked.load(Ordering::Relaxed),
            extents_defragmented: c.extents_defragmented.load(Ordering::Relaxed),
            extents_resealed: c.extents_resealed.load(Ordering::Relaxed),
            live_bytes_in_lz4_objects: st.committed.live_bytes_in_lz4_objects(),
            pending_bytes: st.pending.data_bytes() as u64,
            extents: st.committed.extent_count() as u64,
            memory_cache_extents: st.clean.len() as u64,
            disk_cache_bytes: self.inner.disk_cache.as_ref().map_or(0, |c| c.bytes()),
        }
    }
}

/// Cores to seal on. Asked once: available_parallelism reads cgroup files, which costs more
/// than sealing the one extent of a typical fsync.
fn cpu_count() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// The part of extent `index` that `offset..offset+length` covers, as a byte range in the extent.
fn extent_span(index: u64, offset: u64, length: u64) -> (usize, usize) {
    let base = index * EXTENT_SIZE_BYTES_U64;
    let start = offset.max(base) - base;
    let end = (offset + length).min(base + EXTENT_SIZE_BYTES_U64) - base;
    (start as usize, end as usize)
}

/// What a checkpoint covers: the log objects (the candidates for collection) with their sizes
/// in bytes, those among them old enough for re-sealing and for repacking when fragmented (up
/// to `aged_through`, covered by a checkpoint begun at least `reseal_after` earlier), and the
/// bytes of the log objects written since the checkpoint before.
struct Covered {
    logs: Vec<(u64, u64)>,
    aged_through: u64,
    log_bytes: u64,
}

/// Of `objects` (sequence number, live bytes, size in bytes), the fragmented ones (at most
/// REPACK_LIVE_PERCENT_MAX percent live), least live first, as many as `budget` live bytes
/// allow (but at least one): moving their live bytes gives back the most space per byte moved.
fn fragmented_objects(objects: &[(u64, u64, u64)], budget: u64) -> HashSet<u64> {
    let mut fragmented: Vec<(u64, u64, u64)> = objects
        .iter()
        .copied()
        .filter(|&(_, live, size)| live * 100 <= size * REPACK_LIVE_PERCENT_MAX)
        .collect();
    // By live / size, compared without division.
    fragmented.sort_unstable_by(|a, b| {
        (u128::from(a.1) * u128::from(b.2)).cmp(&(u128::from(b.1) * u128::from(a.2)))
    });
    let mut moved = 0;
    let mut chosen = HashSet::new();
    for (seq, live, _) in fragmented {
        if !chosen.is_empty() && moved + live > budget {
            break;
        }
        moved += live;
        chosen.insert(seq);
    }
    chosen
}

/// The leading `extents` (sorted by object) of whole objects, as many objects as fit in `max`
/// extents (but at least one): moving part of an object would not let it die.
fn whole_objects_up_to(
    extents: impl Iterator<Item = (u64, u64, ExtentPtr)>,
    max: usize,
) -> Vec<(u64, u64, ExtentPtr)> {
    let mut taken: Vec<(u64, u64, ExtentPtr)> = Vec::new();
    let mut object_start = 0;
    for extent in extents {
        if taken.last().is_some_and(|(_, _, p)| p.seq != extent.2.seq) {
            if taken.len() >= max {
                break;
            }
            object_start = taken.len();
        }
        taken.push(extent);
    }
    // The last object taken went past `max`: leave it, unless it is the only one.
    if taken.len() > max && object_start > 0 {
        taken.truncate(object_start);
    }
    taken
}

/// Whether a checkpoint's collection also moves extents out of objects (`Engine::repack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repack {
    Yes,
    No,
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmented_objects_are_the_least_live_within_the_budget_and_at_least_one() {
        // (seq, live bytes, size): 40 %, 10 %, 50 %, 51 % and 0.5 % live.
        let objects = [
            (1, 40, 100),
            (2, 10, 100),
            (3, 500, 1000),
            (4, 51, 100),
            (5, 5, 1000),
        ];
        let chosen = |budget| {
            let mut seqs: Vec<u64> = fragmented_objects(&objects, budget).into_iter().collect();
            seqs.sort_unstable();
            seqs
        };
        assert_eq!(chosen(1), vec![5], "one, though over the budget");
        assert_eq!(chosen(15), vec![2, 5]);
        assert_eq!(chosen(54), vec![2, 5]);
        assert_eq!(chosen(55), vec![1, 2, 5]);
        assert_eq!(
            chosen(10_000),
            vec![1, 2, 3, 5],
            "51 % live is not fragmented"
        );
        assert!(fragmented_objects(&[(1, 60, 100)], 1000).is_empty());
    }

    #[test]
    fn whole_objects_up_to_takes_whole_objects_and_at_least_one() {
        // Objects 1, 2 and 3 hold 3, 2 and 4 extents.
        let extents: Vec<(u64, u64, ExtentPtr)> = [1, 1, 1, 2, 2, 3, 3, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, &seq)| {
                let ptr = ExtentPtr {
                    seq,
                    offset: i as u32,
                    length: 1,
                };
                (7, i as u64, ptr)
            })
            .collect();
        let objects = |max| {
            let mut seqs: Vec<u64> = whole_objects_up_to(extents.iter().copied(), max)
                .iter()
                .map(|(_, _, p)| p.seq)
                .collect();
            seqs.dedup();
            seqs
        };
        assert_eq!(objects(1), vec![1], "one object, though larger than max");
        assert_eq!(objects(3), vec![1]);
        assert_eq!(objects(4), vec![1]);
        assert_eq!(objects(5), vec![1, 2]);
        assert_eq!(objects(8), vec![1, 2]);
        assert_eq!(objects(9), vec![1, 2, 3]);
        assert_eq!(objects(100), vec![1, 2, 3]);
        assert!(whole_objects_up_to(std::iter::empty(), 5).is_empty());
    }
}
