//! The storage engine: file data in extents, metadata in a replayed log, one flush barrier.
//!
//! Every mutation is applied to the in-memory `pending` batch under one lock, so a batch holds
//! the effect of a prefix of the acknowledged mutations. A flush freezes the batch, seals its
//! extents into one log object together with its metadata ops, uploads it with a conditional
//! create, and only then makes it the committed state. After a crash, the bucket holds exactly
//! the flushed batches: a prefix of the acknowledged order, every mutation whole or absent.
//! (docs/0001-bucket-layout-and-flush.md)
//!
//! The modules follow the life of a write: `io` applies it to the `overlay`; `write_behind` and
//! `barrier` freeze, `seal` and upload it and commit it; `checkpoint` and `collector` keep the
//! bucket small; `recovery` rebuilds the committed state at open.

mod barrier;
mod checkpoint;
mod clean;
mod collector;
mod compaction;
mod error;
mod fsck;
mod io;
mod journaled;
mod options;
mod outage;
mod overlay;
mod pins;
mod readahead;
mod recovery;
mod scoped;
mod seal;
mod stats;
mod timing;
mod txn;
mod write_behind;

pub use error::EngineError;
pub use fsck::{FsckProblem, FsckReport};
pub use io::prefix_end;
pub use io::{Fill, KvChange};
pub use options::EngineOptions;
pub use outage::{OutageSide, StoreOutage};
pub use pins::{check_checkpoint_name, CheckpointInfo};
pub use recovery::change_password;
pub use scoped::Scope;
pub use stats::EngineStats;
pub use timing::{BarrierLatency, BarrierPart};
pub use txn::{Expect, Txn};

use barrier::{SealCtl, Sealed, UploadCtl, Waiting};
use checkpoint::Covered;
use collector::Repack;
use overlay::{Batch, Dirty, Found, State};
use pins::Pins;
use stats::Counters;
use timing::{BarrierTimes, PartTimes};

use crate::bucket::{DeleteMode, PutMode, SharedBucket, StoreError};
use crate::cache::{DiskCache, Space};
use crate::cadence::{BarrierCadence, WriteBehind};
use crate::crypto::{Cipher, KdfCost, KeyError, Sealer, Superblock};
use crate::extent_buffers::ExtentBuffers;
use crate::frame::{self, Codec, FRAME_BYTES_MAX};
use crate::lease::{self, Lease, LeaseError};
use crate::limits::*;
use crate::logobj::{self, ObjectError, RunInfo, LOG_HEADER_BYTES};
use crate::lsm::cache::BlockCache;
use crate::lsm::run::RunReader;
use crate::lsm::MemRun;
use crate::meta::{Base, ExtentPtr, Frozen, Here, MetaOp, MetaState};
use crate::object_buffer::{ObjectBuffer, ObjectBuffers};
use crate::tasks::TaskSet;
use crate::tuning::Tuning;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::{Mutex, RwLock};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const SUPERBLOCK_KEY: &str = "superblock.json";

struct Inner {
    bucket: SharedBucket,
    sealer: Arc<Sealer>,
    codec: Codec,
    tuning: Tuning,
    tasks: TaskSet,
    read_only: bool,
    state: RwLock<State>,
    seal: tokio::sync::Mutex<SealCtl>,
    upload: tokio::sync::Mutex<UploadCtl>,
    /// Sealed objects not yet uploaded, in sequence order. A failed upload stays at the front
    /// and is retried byte for byte (a PUT that secretly succeeded is then recognised).
    queue: Mutex<VecDeque<Sealed>>,
    /// Every mutation up to this write generation is durable: in the bucket, or with journaled
    /// barriers in the journal (engine/journaled.rs).
    durable_gen: AtomicU64,
    /// Every mutation up to this write generation is in the bucket (committed).
    bucket_gen: AtomicU64,
    /// Journaled barriers' state; `None` without a journal.
    journal: Option<Mutex<journaled::JournalCtl>>,
    /// Wakes barriers waiting for a journal record.
    journal_notify: tokio::sync::Notify,
    /// Side records of scoped barriers (engine/scoped.rs).
    side: Mutex<scoped::SideCtl>,
    poisoned: Mutex<Option<String>>,
    disk_cache: Option<Arc<DiskCache>>,
    /// The writer lock (none when read-only); shared only with `Engine::open` while it loads.
    lock_holder: Option<Arc<Lease>>,
    checkpoint_running: AtomicBool,
    /// Log objects and bytes committed since the newest checkpoint began (`UploadCtl`),
    /// readable without its lock: how far checkpoints lag behind commits.
    checkpoint_lag_objects: AtomicU64,
    checkpoint_lag_bytes: AtomicU64,
    /// The superblock still says format 1: it is rewritten once a manifest is stored.
    superblock_format_1: AtomicBool,
    /// Decoded blocks of the metadata runs (`[cache] metadata_bytes_max`).
    block_cache: Arc<BlockCache>,
    /// Sequential readers, and the fetches under way ahead of them.
    readahead: readahead::Readahead,
    /// The named checkpoints, which the collector leaves alone.
    pins: Mutex<Pins>,
    /// When the last log object was committed (`Inner::epoch` + this many microseconds).
    last_commit_us: AtomicU64,
    /// The last checkpoint's collection repacked extents: the objects they left are dead,
    /// but only the next checkpoint deletes them.
    repacked_uncollected: AtomicBool,
    /// When the engine was opened: the origin of `last_commit_us`.
    epoch: tokio::time::Instant,
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
    /// Failed uploads so far, and the last one's error: see `upload_queued`.
    upload_failures: AtomicU64,
    upload_error: Mutex<String>,
    /// Where repacking's sweep over the extent map goes on (`Engine::repack`); empty: from the
    /// start. Not kept across restarts: a new process sweeps from the start.
    repack_sweep_from: Mutex<Vec<u8>>,
    /// Since when uploads fail, while they do; barriers wait this long at most.
    outage: Arc<Mutex<outage::Outages>>,
    outage_timeout: Duration,
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

impl Engine {
    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }

    fn has_unflushed(&self) -> bool {
        let st = self.inner.state.read();
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

    /// Flushes, then gives up the writer lock. The engine refuses writes afterwards.
    pub async fn close(&self) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Ok(());
        }
        self.barrier(Waiting::Engine).await?;
        self.records_deleted().await;
        {
            // A checkpoint of what changed since the newest one: a clean stop leaves nothing to
            // replay, and the debits still to look up are done, so its garbage is collected.
            let _slot = self.checkpoint_slot().await;
            self.checkpoint_to_last().await?;
        }
        *self.inner.poisoned.lock() = Some("the engine is closed".into());
        self.inner.bucket.end_writing().await?;
        if let Some(me) = &self.inner.lock_holder {
            lease::release(&self.inner.bucket, &me.holder).await?;
        }
        Ok(())
    }
}

/// Decodes a pin whose compressed body is `plain` (the fuzz target's entry; crate::fuzzing).
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_pin(sealer: &Sealer, plain: &[u8]) {
    pins::fuzz_decode(sealer, plain);
}

/// Clears a flag when dropped.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
