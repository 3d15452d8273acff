//! The journal tier's targets and its write quorum (docs/0009-journal-tier.md).
//!
//! A journal is one or more targets, each a local directory (a preallocated ring written with
//! direct synchronous I/O, journal.rs) or an object store (a record is an object of its own). A
//! record is acknowledged once `write_quorum` (W) of the N targets hold it, so it survives the
//! loss of any W - 1 of them; an open must read N - W + 1 targets holding the journal the
//! bucket names, and then every acknowledged record is on at least one of those it read.
//!
//! Each start is a new epoch: once the bucket has what the journal held, every target is
//! emptied and its identity (`journal.id`) records the new epoch. A target whose identity is
//! older than the bucket's marker (unreachable at the last start, or left out during a run) is
//! not read: it may hold stale records.

use super::journal::{Journal, Record, Ticket};
use super::{DeleteMode, PutMode, SharedBucket, StoreError};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Where an object-store target keeps its records and its identity.
const STORE_RECORDS: &str = "journal/records/";
const STORE_IDENTITY: &str = "journal/journal.id";
const STORE_RECORD_MAGIC: &[u8; 8] = b"BFSJOBJ1";
/// Requests at once when an object-store target is read or emptied.
const STORE_REQUESTS_IN_FLIGHT: usize = 32;
/// Attempts to delete released records from an object-store target before the target counts
/// as holding a stale record.
const RELEASE_ATTEMPTS: u32 = 3;
/// Released records one delete request takes from an object-store target (S3's DeleteObjects
/// takes at most 1,000 keys).
const RELEASE_BATCH_MAX: usize = 1000;
/// A record an object-store target has not taken within this long counts as failed there.
const STORE_APPEND_TIMEOUT: Duration = Duration::from_secs(10);
/// An object-store target that has not been read within this long at a start is unreachable.
const STORE_OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Records in flight to one target: beyond this it counts as failed for new records, so that a
/// target that hangs does not gather every barrier's data in memory.
const APPENDS_IN_FLIGHT_MAX: usize = 64;
/// How long a durable delete waits for the targets to drop released records before it leaves
/// out of the journal those that have not.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// A journal target as configured.
#[derive(Clone)]
pub enum TargetSpec {
    /// A directory on a fast local disk.
    Dir(PathBuf),
    /// An object store: its URL (for messages) and the bucket it opens.
    Store { url: String, bucket: SharedBucket },
}

impl TargetSpec {
    pub fn name(&self) -> String {
        match self {
            TargetSpec::Dir(p) => p.display().to_string(),
            TargetSpec::Store { url, .. } => url.clone(),
        }
    }
}

impl std::fmt::Debug for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

fn one() -> usize {
    1
}

/// The journal's identity: in the bucket as its marker, and in each target.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub journal_id: String,
    pub bucket: String,
    pub host: String,
    /// The targets' names, for messages.
    pub dir: String,
    pub uploads_in_flight: usize,
    /// Starts (and targets left out) so far; a target is read only if its epoch is at least the
    /// marker's.
    #[serde(default)]
    pub epoch: u64,
    #[serde(default = "one")]
    pub targets: usize,
    #[serde(default = "one")]
    pub write_quorum: usize,
}

impl Identity {
    /// Targets an open must read: every acknowledged record is on at least one of any this many.
    pub fn read_quorum(&self) -> usize {
        (self.targets.max(1) + 1)
            .saturating_sub(self.write_quorum.max(1))
            .max(1)
    }
}

/// What opening a target found.
pub(super) struct Opened {
    pub name: String,
    /// Its identity and records, or why it could not be read.
    pub found: Result<(Option<Identity>, Vec<Record>), String>,
}

enum Kind {
    Ring {
        dir: PathBuf,
        journal: Arc<Journal>,
        /// Emptying writes the whole ring: done only when it held records.
        had_records: AtomicBool,
    },
    Store(SharedBucket),
}

struct Target {
    name: String,
    kind: Kind,
    /// The epoch its identity records this run (0: not yet written; an object-store target
    /// unreachable at the start gets it, and is emptied, before its first record).
    epoch: AtomicU64,
    identify: tokio::sync::Mutex<()>,
    /// Left out for the rest of the run: it kept a record a durable delete needed gone.
    dropped: AtomicBool,
    /// It failed to drop a released record (the record may come back from it).
    stale: AtomicBool,
    /// Releases not finished.
    releasing: AtomicUsize,
    /// An object store's released records waiting for the next batched delete.
    releases: Mutex<ReleaseQueue>,
    /// Appends not finished.
    appending: AtomicUsize,
    /// The last append failed (logged once per failure streak).
    failing: AtomicBool,
}

enum Held {
    Ring(Ticket),
    Store(String),
}

/// Records an object-store target must delete. One task at a time deletes them, each request
/// taking all that gathered while the last one was under way: a burst of releases (the bucket
/// took a merged batch) costs one request, not one per record.
#[derive(Default)]
struct ReleaseQueue {
    names: Vec<String>,
    draining: bool,
}

/// A record on the targets that took it.
pub(super) struct QuorumTicket(Arc<TicketSlots>);

struct TicketSlots {
    slots: Mutex<Vec<Option<Held>>>,
    released: AtomicBool,
}

pub(super) struct Quorum {
    targets: Vec<Arc<Target>>,
    write: usize,
    identity: Mutex<Identity>,
    next_record: AtomicU64,
    released: Notify,
    /// The runtime the journal was opened on: appends and releases outlive the request that
    /// started them, so they run there, not on the caller's runtime (a 9P connection's own,
    /// which ends with the connection).
    home: Option<tokio::runtime::Handle>,
}

impl Quorum {
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        match &self.home {
            Some(home) => drop(home.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    /// Opens every target: a local directory's problems are errors; an object store that does
    /// not answer is reported in its `Opened`.
    pub(super) async fn open(
        specs: &[TargetSpec],
        write: usize,
        ring_bytes: Option<u64>,
        bucket_url: &str,
        identity: Identity,
    ) -> Result<(Quorum, Vec<Opened>), StoreError> {
        let mut targets = Vec::new();
        let mut opened = Vec::new();
        for spec in specs {
            let (kind, found) = match spec {
                TargetSpec::Dir(dir) => {
                    let (journal, found) = open_dir(dir, ring_bytes).await?;
                    (
                        Kind::Ring {
                            dir: dir.clone(),
                            journal,
                            had_records: AtomicBool::new(!found.1.is_empty()),
                        },
                        Ok(found),
                    )
                }
                TargetSpec::Store { bucket, .. } => {
                    let read = tokio::time::timeout(STORE_OPEN_TIMEOUT, read_store(bucket)).await;
                    let found = read.unwrap_or_else(|_| {
                        Err(format!("no answer within {STORE_OPEN_TIMEOUT:?}"))
                    });
                    (Kind::Store(bucket.clone()), found)
                }
            };
            if let Ok((Some(id), _)) = &found {
                if id.bucket != bucket_url {
                    return Err(StoreError::Permanent(format!(
                        "journal {} belongs to the bucket {}, not {}: give each bucket a journal of its own",
                        spec.name(),
                        id.bucket,
                        bucket_url
                    )));
                }
            }
            targets.push(Arc::new(Target {
                name: spec.name(),
                kind,
                epoch: AtomicU64::new(0),
                identify: tokio::sync::Mutex::new(()),
                dropped: AtomicBool::new(false),
                stale: AtomicBool::new(false),
                releasing: AtomicUsize::new(0),
                releases: Mutex::new(ReleaseQueue::default()),
                appending: AtomicUsize::new(0),
                failing: AtomicBool::new(false),
            }));
            opened.push(Opened {
                name: spec.name(),
                found,
            });
        }
        let quorum = Quorum {
            targets,
            write: write.clamp(1, specs.len().max(1)),
            identity: Mutex::new(identity),
            next_record: AtomicU64::new(0),
            released: Notify::new(),
            home: tokio::runtime::Handle::try_current().ok(),
        };
        Ok((quorum, opened))
    }

    pub(super) fn identity(&self) -> Identity {
        self.identity.lock().clone()
    }

    /// Starts the new epoch `identity` (its records already in the bucket): empties every target
    /// and writes its identity. A local directory that fails is an error; an object store that
    /// fails is emptied before its first record instead.
    pub(super) async fn start_epoch(&self, identity: Identity) -> Result<(), StoreError> {
        *self.identity.lock() = identity;
        for t in &self.targets {
            let identified = tokio::time::timeout(STORE_OPEN_TIMEOUT, self.identify(t, true));
            let identified = identified
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {STORE_OPEN_TIMEOUT:?}")));
            if let Err(e) = identified {
                match &t.kind {
                    Kind::Ring { .. } => return Err(StoreError::Permanent(e)),
                    Kind::Store(_) => tracing::warn!(
                        target = %t.name,
                        error = %e,
                        "journal target unreachable; it joins once it answers"
                    ),
                }
            }
        }
        Ok(())
    }

    /// Empties the target (when `empty`) and writes the current identity to it.
    async fn identify(&self, t: &Target, empty: bool) -> Result<(), String> {
        let _one = t.identify.lock().await;
        let identity = self.identity();
        if t.epoch.load(Ordering::Acquire) == identity.epoch {
            return Ok(());
        }
        let body = serde_json::to_vec_pretty(&identity).expect("serialises");
        match &t.kind {
            Kind::Ring {
                dir,
                journal,
                had_records,
            } => {
                if empty && had_records.swap(false, Ordering::AcqRel) {
                    let j = journal.clone();
                    tokio::task::spawn_blocking(move || j.reset())
                        .await
                        .map_err(|e| format!("journal {}: emptying: {e}", dir.display()))?
                        .map_err(|e| format!("journal {}: emptying: {e}", dir.display()))?;
                }
                let path = dir.join("journal.id");
                tokio::task::spawn_blocking(move || write_durably(&path, &body))
                    .await
                    .map_err(|e| format!("journal {}: writing journal.id: {e}", dir.display()))?
                    .map_err(|e| format!("journal {}: writing journal.id: {e}", dir.display()))?;
            }
            Kind::Store(bucket) => {
                if empty {
                    let listed = bucket
                        .list(STORE_RECORDS)
                        .await
                        .map_err(|e| e.to_string())?;
                    futures::stream::iter(listed)
                        .map(|o| async move { bucket.delete(&o.key, DeleteMode::Durable).await })
                        .buffer_unordered(STORE_REQUESTS_IN_FLIGHT)
                        .try_collect::<()>()
                        .await
                        .map_err(|e| e.to_string())?;
                }
                bucket
                    .put(STORE_IDENTITY, Bytes::from(body), PutMode::Overwrite)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        t.epoch.store(identity.epoch, Ordering::Release);
        t.stale.store(false, Ordering::Release);
        Ok(())
    }

    /// Writes the record to every target not left out; returns once `write_quorum` hold it, or
    /// once too many failed for that (then `false`: the caller waits for the bucket). Either
    /// way the ticket releases whatever targets took it.
    pub(super) async fn append(self: &Arc<Self>, key: &str, data: &Bytes) -> (QuorumTicket, bool) {
        let slots = Arc::new(TicketSlots {
            slots: Mutex::new((0..self.targets.len()).map(|_| None).collect()),
            released: AtomicBool::new(false),
        });
        let number = self.next_record.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut live = 0;
        for (i, t) in self.targets.iter().enumerate() {
            if t.dropped.load(Ordering::Acquire) {
                continue;
            }
            live += 1;
            let (quorum, t, slots, tx) = (self.clone(), t.clone(), slots.clone(), tx.clone());
            let (key, data) = (key.to_string(), data.clone());
            self.spawn(async move {
                let result = quorum.append_to(&t, number, &key, &data).await;
                let ok = result.is_ok();
                match result {
                    Ok(held) => {
                        if t.failing.swap(false, Ordering::AcqRel) {
                            tracing::info!(target = %t.name, "journal target takes records again");
                        }
                        let late = {
                            let mut s = slots.slots.lock();
                            if slots.released.load(Ordering::Acquire) {
                                Some(held)
                            } else {
                                s[i] = Some(held);
                                None
                            }
                        };
                        if let Some(held) = late {
                            quorum.release_one(&t, held).await;
                        }
                    }
                    Err(e) => {
                        if !t.failing.swap(true, Ordering::AcqRel) {
                            tracing::warn!(target = %t.name, error = %e, "journal target failed a record; the others carry the quorum while they can");
                        }
                    }
                }
                let _ = tx.send(ok);
            });
        }
        drop(tx);
        let (mut ok, mut failed) = (0usize, 0usize);
        while ok < self.write && live - failed >= self.write {
            match rx.recv().await {
                Some(true) => ok += 1,
                Some(false) => failed += 1,
                None => break,
            }
        }
        (QuorumTicket(slots), ok >= self.write)
    }

    async fn append_to(
        &self,
        t: &Target,
        number: u64,
        key: &str,
        data: &Bytes,
    ) -> Result<Held, String> {
        if t.appending.fetch_add(1, Ordering::AcqRel) >= APPENDS_IN_FLIGHT_MAX {
            t.appending.fetch_sub(1, Ordering::AcqRel);
            return Err(format!(
                "{APPENDS_IN_FLIGHT_MAX} records are in flight to it"
            ));
        }
        let result = match &t.kind {
            Kind::Ring { .. } => self.append_now(t, number, key, data).await,
            Kind::Store(_) => {
                let append = self.append_now(t, number, key, data);
                match tokio::time::timeout(STORE_APPEND_TIMEOUT, append).await {
                    Ok(result) => result,
                    Err(_) => {
                        // The record may still land there, after any deletion of it.
                        t.stale.store(true, Ordering::Release);
                        Err(format!("no answer within {STORE_APPEND_TIMEOUT:?}"))
                    }
                }
            }
        };
        t.appending.fetch_sub(1, Ordering::AcqRel);
        result
    }

    async fn append_now(
        &self,
        t: &Target,
        number: u64,
        key: &str,
        data: &Bytes,
    ) -> Result<Held, String> {
        // A target not reachable at the start joins now: emptied of what an earlier epoch left
        // in it. (One moved to a new epoch meanwhile keeps its records: `advance_epoch`.)
        if t.epoch.load(Ordering::Acquire) == 0 {
            self.identify(t, true).await?;
        }
        match &t.kind {
            Kind::Ring { journal, .. } => {
                let (j, k, d) = (journal.clone(), key.to_string(), data.clone());
                match tokio::task::spawn_blocking(move || j.append(&k, &d)).await {
                    Ok(Ok(Some(ticket))) => Ok(Held::Ring(ticket)),
                    Ok(Ok(None)) => Err("the ring is full".into()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
            Kind::Store(bucket) => {
                let epoch = t.epoch.load(Ordering::Acquire);
                let name = format!("{STORE_RECORDS}{epoch:016x}-{number:016x}");
                let mut body = Vec::with_capacity(10 + key.len() + data.len());
                body.extend_from_slice(STORE_RECORD_MAGIC);
                body.extend_from_slice(&(key.len() as u16).to_le_bytes());
                body.extend_from_slice(key.as_bytes());
                body.extend_from_slice(data);
                bucket
                    .put(&name, Bytes::from(body), PutMode::Overwrite)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Held::Store(name))
            }
        }
    }

    /// The record's object is in the bucket (or deleted): the targets drop it, local rings at
    /// once, object stores in the background.
    pub(super) async fn release(self: &Arc<Self>, ticket: QuorumTicket) {
        let held: Vec<(usize, Held)> = {
            let mut s = ticket.0.slots.lock();
            ticket.0.released.store(true, Ordering::Release);
            s.iter_mut()
                .enumerate()
                .filter_map(|(i, h)| h.take().map(|h| (i, h)))
                .collect()
        };
        for (i, h) in held {
            let t = self.targets[i].clone();
            self.release_one(&t, h).await;
        }
    }

    /// A local ring clears the record at once; an object store queues it for a batched delete.
    async fn release_one(self: &Arc<Self>, t: &Arc<Target>, h: Held) {
        match (&t.kind, h) {
            (Kind::Ring { journal, .. }, Held::Ring(ticket)) => {
                let j = journal.clone();
                let released = tokio::task::spawn_blocking(move || j.release(vec![ticket])).await;
                if !matches!(released, Ok(Ok(()))) {
                    tracing::warn!(target = %t.name, "could not clear a journal record whose object is in the bucket; a restart uploads it again");
                }
            }
            (_, Held::Store(name)) => {
                t.releasing.fetch_add(1, Ordering::AcqRel);
                let start = {
                    let mut q = t.releases.lock();
                    q.names.push(name);
                    !std::mem::replace(&mut q.draining, true)
                };
                if start {
                    let (quorum, t) = (self.clone(), t.clone());
                    self.spawn(async move { quorum.drain_releases(&t).await });
                }
            }
            (_, Held::Ring(_)) => {}
        }
    }

    /// Deletes the target's queued records until none are left, each request taking all that
    /// gathered meanwhile (up to `RELEASE_BATCH_MAX`).
    async fn drain_releases(&self, t: &Target) {
        loop {
            let names: Vec<String> = {
                let mut q = t.releases.lock();
                if q.names.is_empty() {
                    q.draining = false;
                    return;
                }
                let n = q.names.len().min(RELEASE_BATCH_MAX);
                q.names.drain(..n).collect()
            };
            let n = names.len();
            self.release_store(t, names).await;
            t.releasing.fetch_sub(n, Ordering::AcqRel);
            self.released.notify_waiters();
        }
    }

    async fn release_store(&self, t: &Target, names: Vec<String>) {
        let Kind::Store(bucket) = &t.kind else {
            return;
        };
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=RELEASE_ATTEMPTS {
            match bucket.delete_many(names.clone()).await {
                Ok(()) => return,
                Err(e) if attempt == RELEASE_ATTEMPTS => {
                    tracing::warn!(target = %t.name, records = names.len(), first = %names[0], error = %e, "journal target kept released records");
                    t.stale.store(true, Ordering::Release);
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }

    /// Before a durable delete is acknowledged: the records released so far are gone from the
    /// targets for good (a local ring's cleared headers synced; an object store's deletions
    /// finished, waited for up to `RELEASE_WAIT`). Returns the names of the targets that could
    /// not, now left out of the journal: the caller must start a new epoch before it
    /// acknowledges, so that the next open does not read them.
    pub(super) async fn settle(&self) -> Vec<String> {
        self.sync().await;
        let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let busy = self
                .targets
                .iter()
                .any(|t| t.releasing.load(Ordering::Acquire) > 0);
            if !busy || tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        let mut dropped = Vec::new();
        for t in &self.targets {
            if t.dropped.load(Ordering::Acquire) {
                continue;
            }
            if t.stale.load(Ordering::Acquire) || t.releasing.load(Ordering::Acquire) > 0 {
                t.dropped.store(true, Ordering::Release);
                tracing::error!(target = %t.name, "journal target could not drop a deleted object's record; it is left out of the journal until the next start");
                dropped.push(t.name.clone());
            }
        }
        dropped
    }

    /// Moves the targets still in the journal to `identity`'s epoch (their records stay):
    /// targets left out keep the older epoch, which the next open does not read. A target
    /// that cannot take it is left out too.
    pub(super) async fn advance_epoch(&self, identity: Identity) {
        *self.identity.lock() = identity;
        for t in &self.targets {
            if t.dropped.load(Ordering::Acquire) || t.epoch.load(Ordering::Acquire) == 0 {
                continue;
            }
            if let Err(e) = self.identify(t, false).await {
                tracing::error!(target = %t.name, error = %e, "journal target left out: its identity could not be updated");
                t.dropped.store(true, Ordering::Release);
            }
        }
    }

    /// Each target and its state: `ok`, `failing` (its last record failed), `joining` (not yet
    /// reachable since the start) or `left out` (for the rest of the run).
    pub(super) fn states(&self) -> Vec<(String, &'static str)> {
        self.targets
            .iter()
            .map(|t| {
                let state = if t.dropped.load(Ordering::Acquire) {
                    "left out"
                } else if t.epoch.load(Ordering::Acquire) == 0 {
                    "joining"
                } else if t.failing.load(Ordering::Acquire) {
                    "failing"
                } else {
                    "ok"
                };
                (t.name.clone(), state)
            })
            .collect()
    }

    /// Makes the local rings' cleared records durable.
    pub(super) async fn sync(&self) {
        for t in &self.targets {
            if let Kind::Ring { journal, .. } = &t.kind {
                let j = journal.clone();
                let _ = tokio::task::spawn_blocking(move || j.sync()).await;
            }
        }
    }
}

/// Opens a local directory target: its identity and ring (blocking I/O off the runtime).
async fn open_dir(
    dir: &Path,
    ring_bytes: Option<u64>,
) -> Result<(Arc<Journal>, (Option<Identity>, Vec<Record>)), StoreError> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let io = |what: &str, e: std::io::Error| {
            StoreError::Permanent(format!("journal {}: {what}: {e}", dir.display()))
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating the directory", e))?;
        let id_path = dir.join("journal.id");
        let identity: Option<Identity> = match std::fs::read(&id_path) {
            Ok(body) => Some(serde_json::from_slice(&body).map_err(|e| {
                StoreError::Permanent(format!("{} is not valid: {e}", id_path.display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("reading journal.id", e)),
        };
        let path = dir.join("journal");
        let (journal, records) = match ring_bytes {
            Some(bytes) => Journal::open_sized(&path, bytes),
            None => Journal::open(&path),
        }
        .map_err(|e| io("opening", e))?;
        Ok((Arc::new(journal), (identity, records)))
    })
    .await
    .map_err(|e| StoreError::Permanent(format!("opening the journal: {e}")))?
}

/// Reads an object-store target: its identity and records.
async fn read_store(bucket: &SharedBucket) -> Result<(Option<Identity>, Vec<Record>), String> {
    let identity = match bucket.get(STORE_IDENTITY).await {
        Ok(body) => Some(
            serde_json::from_slice(&body)
                .map_err(|e| format!("{STORE_IDENTITY} is not valid: {e}"))?,
        ),
        Err(StoreError::NotFound(_)) => None,
        Err(e) => return Err(e.to_string()),
    };
    let listed = bucket
        .list(STORE_RECORDS)
        .await
        .map_err(|e| e.to_string())?;
    let records: Vec<Option<Record>> = futures::stream::iter(listed)
        .map(|o| async move {
            match bucket.get(&o.key).await {
                Ok(body) => Ok(parse_store_record(&body)),
                // Released meanwhile.
                Err(StoreError::NotFound(_)) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        })
        .buffered(STORE_REQUESTS_IN_FLIGHT)
        .try_collect()
        .await?;
    Ok((identity, records.into_iter().flatten().collect()))
}

fn parse_store_record(body: &[u8]) -> Option<Record> {
    let rest = body.strip_prefix(STORE_RECORD_MAGIC)?;
    let len = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(rest.get(2..2 + len)?).ok()?.to_string();
    let data = rest.get(2 + len..)?.to_vec();
    Some(Record { key, data })
}

/// The records of `usable` targets, each key once.
pub(super) fn union(opened: Vec<Opened>, usable: &[bool]) -> Vec<Record> {
    let mut by_key: HashMap<String, Vec<u8>> = HashMap::new();
    for (o, &use_it) in opened.into_iter().zip(usable) {
        if !use_it {
            continue;
        }
        if let Ok((_, records)) = o.found {
            for r in records {
                match by_key.get(&r.key) {
                    Some(d) if *d != r.data => tracing::warn!(
                        key = %r.key,
                        target = %o.name,
                        "journal targets hold different bytes for one object; keeping the first"
                    ),
                    Some(_) => {}
                    None => {
                        by_key.insert(r.key, r.data);
                    }
                }
            }
        }
    }
    by_key
        .into_iter()
        .map(|(key, data)| Record { key, data })
        .collect()
}

/// Writes a small file so that it survives a crash: a staging file, fsync, rename, directory
/// fsync.
pub(super) fn write_durably(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let staging = path.with_extension("new");
    let mut f = std::fs::File::create(&staging)?;
    f.write_all(body)?;
    f.sync_all()?;
    std::fs::rename(&staging, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
