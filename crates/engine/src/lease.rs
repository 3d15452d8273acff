//! One writer per bucket (docs/0001-bucket-layout-and-flush.md, "Fencing").
//!
//! The writer holds the object `writer.lock`, naming its host, boot and process. A second
//! writer finds it and refuses to start, without any periodic request (an idle server must not
//! cost object-store requests). A lock left by a process that died on this same machine is taken
//! over, so a restart after `kill -9` needs nobody's help. Within one process each open engine
//! has an instance number of its own: a lock of an engine that is still open is in use like any
//! other, one of an engine that is gone (a crash test stopped it) is stale. As a second line of
//! defence, log objects are created with conditional PUTs: two writers can never both append
//! `log/<seq>`.

use crate::bucket::{DeleteMode, PutMode, SharedBucket, StoreError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

pub const LOCK_KEY: &str = "writer.lock";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LockHolder {
    pub host: String,
    pub boot_id: String,
    pub pid: u32,
    pub started_unix_s: u64,
    /// Which engine of process `pid` holds the lock (0 in locks of older versions).
    #[serde(default)]
    pub instance: u64,
}

/// The instance numbers of this process's engines that hold a writer lock.
static LIVE_INSTANCES: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// The writer lock of one engine of this process: its instance counts as live until this is
/// dropped (when the engine and every task it started are gone).
#[derive(Debug)]
pub struct Lease {
    pub holder: LockHolder,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(live) = LIVE_INSTANCES.lock().as_mut() {
            live.remove(&self.holder.instance);
        }
    }
}

fn instance_is_live(instance: u64) -> bool {
    LIVE_INSTANCES
        .lock()
        .as_ref()
        .is_some_and(|live| live.contains(&instance))
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("bucket is in use by another writer: bucketfs pid {pid} on host {host} since unix time {since}. Stop that process first; if that host is gone for good, delete the object `writer.lock` from the bucket.", pid = .0.pid, host = .0.host, since = .0.started_unix_s)]
    InUse(LockHolder),
    #[error("writer lock: {0}")]
    Store(#[from] StoreError),
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl LockHolder {
    pub fn this_process() -> LockHolder {
        LockHolder {
            host: read_trimmed("/proc/sys/kernel/hostname"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            pid: std::process::id(),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            instance: rand::random::<u64>() | 1,
        }
    }

    /// Whether this lock certainly belongs to no running process: same host and boot, and
    /// its process is gone (or is no longer bucketfs).
    fn is_stale_here(&self, me: &LockHolder) -> bool {
        if self.host != me.host {
            return false;
        }
        if self.boot_id != me.boot_id {
            return true;
        }
        if self.pid == me.pid {
            return !instance_is_live(self.instance);
        }
        match std::fs::read(format!("/proc/{}/cmdline", self.pid)) {
            Ok(cmdline) => !String::from_utf8_lossy(&cmdline).contains("bucketfs"),
            Err(_) => true,
        }
    }
}

pub async fn acquire(bucket: &SharedBucket) -> Result<Lease, LeaseError> {
    let me = LockHolder::this_process();
    // Live from before the lock is written: once stored, another open must find it in use.
    LIVE_INSTANCES
        .lock()
        .get_or_insert_with(HashSet::new)
        .insert(me.instance);
    let lease = Lease { holder: me };
    let me = &lease.holder;
    let body = bytes::Bytes::from(serde_json::to_vec_pretty(me).expect("plain struct serialises"));
    match bucket.get(LOCK_KEY).await {
        Ok(existing) => {
            let holder: Option<LockHolder> = serde_json::from_slice(&existing).ok();
            match holder {
                Some(h) if !h.is_stale_here(me) => return Err(LeaseError::InUse(h)),
                Some(h) => {
                    tracing::warn!(pid = h.pid, host = %h.host, "taking over the writer lock of a bucketfs process that is no longer running")
                }
                None => tracing::warn!("writer lock is unreadable; taking it over"),
            }
            bucket.put(LOCK_KEY, body, PutMode::Overwrite).await?;
        }
        Err(StoreError::NotFound(_)) => match bucket.put(LOCK_KEY, body, PutMode::Create).await {
            Ok(()) => {}
            Err(StoreError::AlreadyExists(_)) => {
                let existing = bucket.get(LOCK_KEY).await?;
                let h = serde_json::from_slice(&existing).unwrap_or(LockHolder {
                    host: "?".into(),
                    boot_id: String::new(),
                    pid: 0,
                    started_unix_s: 0,
                    instance: 0,
                });
                return Err(LeaseError::InUse(h));
            }
            Err(e) => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    }
    Ok(lease)
}

/// Removes the lock if it is still ours.
pub async fn release(bucket: &SharedBucket, me: &LockHolder) -> Result<(), StoreError> {
    match bucket.get(LOCK_KEY).await {
        Ok(existing)
            if serde_json::from_slice::<LockHolder>(&existing)
                .ok()
                .as_ref()
                == Some(me) =>
        {
            bucket.delete(LOCK_KEY, DeleteMode::Durable).await
        }
        Ok(_) | Err(StoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}
