//! The object store as the engine sees it: five operations on named immutable objects.
//!
//! Everything the engine does to a bucket goes through [`Bucket`], so decorators (retries,
//! request counting, fault injection) compose around any backend and tests can observe them.

mod counting;
mod crashable;
mod faults;
pub(crate) mod journal;
mod local;
mod pread;
mod quorum;
mod retry;
mod store;
mod tier;

pub use counting::{CountingBucket, OpStats, RequestCounts, StoreOp};
pub use crashable::{CrashableBucket, FreezePlan};
pub use faults::{Fault, FaultyBucket};
pub use local::LocalBucket;
pub use quorum::TargetSpec;
pub use retry::{RetryLimits, RetryingBucket};
pub use store::{open_object_store, ObjectStoreBucket, StoreOptions};
pub use tier::{
    JournalBacklog, JournalTier, JournaledBucket, JOURNAL_MARKER_KEY, JOURNAL_UPLOADS_IN_FLIGHT,
};

use async_trait::async_trait;
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("object {0} already exists")]
    AlreadyExists(String),
    /// Worth retrying: timeouts, throttling, 5xx, connection resets.
    #[error("transient object-store error: {0}")]
    Transient(String),
    #[error("object-store error: {0}")]
    Permanent(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    Overwrite,
    /// Fails with [`StoreError::AlreadyExists`] if the object exists (conditional create).
    Create,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteMode {
    /// Gone for good once acknowledged, a crash included.
    Durable,
    /// Garbage: gone for every later request once acknowledged, but a crash of this process or
    /// machine may bring it back (the store need not make the deletion durable, now or ever).
    /// Only for objects whose return is harmless and whose key is never used again: the engine
    /// collects them again (docs/0002, "Deleting garbage").
    Garbage,
}

/// The folder of the engine's journal records (engine/journaled.rs): a journal tier keeps a
/// create-only PUT under it in the journal only, and a DELETE drops it there; without a
/// journal they are objects like any other.
pub const JOURNAL_RECORD_PREFIX: &str = "jrec/";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size_bytes: u64,
}

#[async_trait]
pub trait Bucket: Send + Sync + 'static {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError>;
    async fn get(&self, key: &str) -> Result<Bytes, StoreError>;
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError>;
    /// Deleting a missing object succeeds.
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError>;
    /// Deletes every key durably, in as few requests as the store allows (S3's DeleteObjects
    /// takes up to 1,000). On an error some of them may be deleted; deleting again is safe.
    async fn delete_many(&self, keys: Vec<String>) -> Result<(), StoreError> {
        for key in keys {
            self.delete(&key, DeleteMode::Durable).await?;
        }
        Ok(())
    }
    /// Every object whose key starts with `prefix` (a folder such as `log/`), in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError>;
    /// Called once by the writer, holding the writer lock, before it reads the bucket. A bucket
    /// with a write-ahead journal (a local directory) first stores what the journal holds, then
    /// journals small create-only PUTs from here on.
    async fn begin_writing(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Called by the writer before it gives up the writer lock: afterwards every object is
    /// stored where readers that do not replay a journal find it.
    async fn end_writing(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

pub type SharedBucket = Arc<dyn Bucket>;

/// Opens the bucket a URL names. `file://` paths may be relative (`file://./data`, resolved
/// against the working directory); the directory is created if missing.
pub fn open_url(url: &str, options: &StoreOptions) -> Result<SharedBucket, String> {
    match url.strip_prefix("file://") {
        Some(path) => Ok(Arc::new(LocalBucket::open(std::path::Path::new(path))?)),
        None => Ok(Arc::new(open_object_store(url, options)?)),
    }
}
