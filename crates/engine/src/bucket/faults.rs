//! Injects object-store failures and latency, for tests of retries, EIO paths and crashes.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The next `count` requests of any kind fail with a transient error (as a 503 would).
    FailNext {
        count: u32,
    },
    /// Every request fails until the fault is cleared.
    FailAll,
    /// Every PUT is refused until cleared (the store is "down" for writes), reads still work.
    FailPuts,
    /// Every request first waits this long (a slow link).
    Delay(Duration),
    /// Every request waits without an answer until the fault is changed, and then fails as a
    /// closed connection would (a store or link that hangs).
    Hang,
    /// PUTs of keys under this prefix wait, unanswered, until the fault is changed, and then
    /// fail as `Hang` does; every other request is served (uploads of one kind stuck).
    HangPutsUnder(String),
    None,
}

pub struct FaultyBucket {
    inner: SharedBucket,
    fault: Mutex<Fault>,
    /// Delete requests asked of it (a `delete_many` is one).
    deletes: AtomicU64,
}

impl FaultyBucket {
    pub fn new(inner: SharedBucket) -> Self {
        Self {
            inner,
            fault: Mutex::new(Fault::None),
            deletes: AtomicU64::new(0),
        }
    }

    /// Delete requests asked of it so far (a `delete_many` counts once).
    pub fn deletes(&self) -> u64 {
        self.deletes.load(Ordering::Relaxed)
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock() = fault;
    }

    async fn check(&self, is_put: bool) -> Result<(), StoreError> {
        self.check_key(is_put, "").await
    }

    async fn check_key(&self, is_put: bool, key: &str) -> Result<(), StoreError> {
        let stuck = |f: &Fault| match f {
            Fault::Hang => true,
            Fault::HangPutsUnder(prefix) => is_put && key.starts_with(prefix.as_str()),
            _ => false,
        };
        if stuck(&self.fault.lock()) {
            while stuck(&self.fault.lock()) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return Err(StoreError::Transient(
                "injected fault: connection closed after a hang".into(),
            ));
        }
        let delay = {
            let mut f = self.fault.lock();
            match &mut *f {
                Fault::FailNext { count } if *count > 0 => {
                    *count -= 1;
                    return Err(StoreError::Transient(
                        "injected fault: 503 Slow Down".into(),
                    ));
                }
                Fault::FailAll => {
                    return Err(StoreError::Transient(
                        "injected fault: 503 Service Unavailable".into(),
                    ))
                }
                Fault::FailPuts if is_put => {
                    return Err(StoreError::Transient("injected fault: PUT refused".into()))
                }
                Fault::Delay(d) => Some(*d),
                _ => None,
            }
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        Ok(())
    }
}

#[async_trait]
impl Bucket for FaultyBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        self.check_key(true, key).await?;
        self.inner.put(key, data, mode).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        self.check(false).await?;
        self.inner.get(key).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.check(false).await?;
        self.inner.get_range(key, range).await
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        self.deletes.fetch_add(1, Ordering::Relaxed);
        self.check(false).await?;
        self.inner.delete(key, mode).await
    }
    async fn delete_many(&self, keys: Vec<String>) -> Result<(), StoreError> {
        self.deletes.fetch_add(1, Ordering::Relaxed);
        self.check(false).await?;
        self.inner.delete_many(keys).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        self.check(false).await?;
        self.inner.list(prefix).await
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        self.inner.begin_writing().await
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        self.inner.end_writing().await
    }
}
