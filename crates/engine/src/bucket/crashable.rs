//! A bucket that can be frozen the way a crash freezes a process's view of its store: from the
//! freeze on, no request of this process is answered again, and none reaches the store, except
//! those the plan lets land (in flight when the process died: stored, never acknowledged).
//! Crash tests give each incarnation of a writer its own `CrashableBucket` over one shared store,
//! freeze it at a chosen PUT, stop the engine's tasks, and reopen over the store.

use super::{Bucket, DeleteMode, ObjectInfo, PutMode, SharedBucket, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use std::ops::Range;

/// When to freeze, and what of the requests from then on still lands in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreezePlan {
    /// The PUT (counting from 0, every kind of object) at which the process dies.
    pub at_put: u64,
    /// Of the PUTs and DELETEs issued from the freeze on (that PUT included), a random choice of
    /// at most `land_max` reaches the store: requests already in flight when a process dies may
    /// complete on the store's side. None is ever answered.
    pub land_max: u32,
    /// Chooses which of them land.
    pub seed: u64,
}

struct Freeze {
    plan: Option<FreezePlan>,
    puts: u64,
    frozen: bool,
    landed: u32,
    rng: u64,
}

pub struct CrashableBucket {
    inner: SharedBucket,
    freeze: Mutex<Freeze>,
    frozen_notify: tokio::sync::Notify,
}

enum Verdict {
    Answer,
    /// Performed on the store, never answered.
    Land,
    Drop,
}

impl CrashableBucket {
    pub fn new(inner: SharedBucket, plan: Option<FreezePlan>) -> Self {
        CrashableBucket {
            inner,
            freeze: Mutex::new(Freeze {
                plan,
                puts: 0,
                frozen: false,
                landed: 0,
                rng: plan.map_or(0, |p| p.seed | 1),
            }),
            frozen_notify: tokio::sync::Notify::new(),
        }
    }

    /// Freezes now (a crash at an arbitrary moment rather than at a PUT).
    pub fn freeze(&self) {
        self.freeze.lock().frozen = true;
        self.frozen_notify.notify_waiters();
    }

    pub fn is_frozen(&self) -> bool {
        self.freeze.lock().frozen
    }

    /// Returns once the bucket is frozen.
    pub async fn frozen(&self) {
        loop {
            let notified = self.frozen_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_frozen() {
                return;
            }
            notified.await;
        }
    }

    /// PUTs seen so far (answered or not).
    pub fn puts(&self) -> u64 {
        self.freeze.lock().puts
    }

    fn verdict(&self, is_put: bool, mutates: bool) -> Verdict {
        let mut f = self.freeze.lock();
        if is_put {
            f.puts += 1;
            if f.plan.is_some_and(|p| f.puts > p.at_put) && !f.frozen {
                f.frozen = true;
                self.frozen_notify.notify_waiters();
            }
        }
        if !f.frozen {
            return Verdict::Answer;
        }
        let Some(plan) = f.plan else {
            return Verdict::Drop;
        };
        if !mutates || f.landed >= plan.land_max {
            return Verdict::Drop;
        }
        // xorshift64: reproducible from the plan's seed.
        f.rng ^= f.rng << 13;
        f.rng ^= f.rng >> 7;
        f.rng ^= f.rng << 17;
        if f.rng.is_multiple_of(2) {
            f.landed += 1;
            Verdict::Land
        } else {
            Verdict::Drop
        }
    }
}

/// What a request of a dead process waits for: nothing, ever.
async fn never<T>() -> T {
    std::future::pending().await
}

#[async_trait]
impl Bucket for CrashableBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        match self.verdict(true, true) {
            Verdict::Answer => self.inner.put(key, data, mode).await,
            Verdict::Land => {
                let _ = self.inner.put(key, data, mode).await;
                never().await
            }
            Verdict::Drop => never().await,
        }
    }
    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        match self.verdict(false, false) {
            Verdict::Answer => self.inner.get(key).await,
            _ => never().await,
        }
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        match self.verdict(false, false) {
            Verdict::Answer => self.inner.get_range(key, range).await,
            _ => never().await,
        }
    }
    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        match self.verdict(false, true) {
            Verdict::Answer => self.inner.delete(key, mode).await,
            Verdict::Land => {
                let _ = self.inner.delete(key, mode).await;
                never().await
            }
            Verdict::Drop => never().await,
        }
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        match self.verdict(false, false) {
            Verdict::Answer => self.inner.list(prefix).await,
            _ => never().await,
        }
    }
    async fn begin_writing(&self) -> Result<(), StoreError> {
        match self.verdict(false, false) {
            Verdict::Answer => self.inner.begin_writing().await,
            _ => never().await,
        }
    }
    async fn end_writing(&self) -> Result<(), StoreError> {
        match self.verdict(false, false) {
            Verdict::Answer => self.inner.end_writing().await,
            _ => never().await,
        }
    }
}
