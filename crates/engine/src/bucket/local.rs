//! A bucket in a local directory (`file://`), the embedded default.
//!
//! object_store's LocalFileSystem moves every request to a blocking thread and reopens the file
//! each time; for 4 KiB random reads the context switches cost more than the read. Here ranged
//! reads are `pread`s on cached file handles, done in place when the page cache holds them and
//! on a blocking thread when it does not (`pread`), while writes, which fsync, run on blocking
//! threads. Every PUT is durable when it returns: the file and its directory are fsynced. Large
//! objects are written with direct I/O: copying them into the page cache cost more CPU than
//! sealing them, and the engine's own cache, not the kernel's, keeps what is worth keeping.

use super::journal::{self, Journal, Ticket};
use super::pread;
use super::{Bucket, DeleteMode, ObjectInfo, PutMode, StoreError};
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Open read handles kept; beyond this the cache is emptied (objects are many, reads cluster).
const OPEN_FILES_MAX: usize = 512;
/// PUTs up to this size run on the calling task (see `put`).
const INLINE_PUT_BYTES_MAX: usize = 256 * 1024;
/// Objects at least this large are written with direct I/O (see the module comment); smaller
/// ones (fsync-driven flushes) gain nothing from it.
const DIRECT_WRITE_BYTES_MIN: usize = 1024 * 1024;
/// Direct writes are issued in pieces of this size, through an aligned bounce buffer where the
/// object's memory is not aligned.
const DIRECT_WRITE_CHUNK_BYTES: usize = 1024 * 1024;
/// Buffer address, length and file offset alignment that direct I/O asks for.
const DIRECT_ALIGN_BYTES: usize = 4096;
const _: () = assert!(DIRECT_WRITE_CHUNK_BYTES.is_multiple_of(DIRECT_ALIGN_BYTES));
/// Staging files live here until they are linked into place; never listed.
const STAGING_DIR: &str = ".staging";
/// How long a DELETE waits for a journaled object that is being appended or stored as a file
/// before answering a transient error.
const JOURNALED_DELETE_WAIT_MS: u32 = 10_000;
/// A journaled object becomes a file after this long: log objects of an fsync-heavy load are
/// mostly collected within seconds (one checkpoint per 1024 flushes), and one collected while
/// still journaled never costs a file. Bounds how stale the files are (what read-only openers
/// see, docs/0002) and how many objects a restart after a crash has to write.
const JOURNAL_STORE_AFTER_S: u64 = 30;
/// Above this much of the ring in use, the oldest objects become files at once, so appends
/// keep finding room; the eighth left lasts seconds under fsync-heavy load, and a batch of
/// files takes well under one. Not half: under pgbench rw-sync half the ring filled before the
/// age limit, so every object still live then became a file (docs/0002, "Alternatives considered").
const JOURNAL_STORE_ABOVE_BYTES: u64 = journal::JOURNAL_BYTES / 8 * 7;
/// The records of garbage are zeroed this long after the first of them is deleted, so that
/// a checkpoint's collection (thousands of deletions within milliseconds under pgbench) is
/// zeroed by a few long writes rather than many short ones.
const JOURNAL_ERASE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
/// Objects the storer writes as files in one batch (one pass of fsyncs).
const STORE_BATCH_OBJECTS_MAX: usize = 256;
/// The write-ahead journal of small objects (journal.rs); never listed.
const JOURNAL_FILE: &str = ".journal";

#[derive(Debug)]
pub struct LocalBucket {
    root: PathBuf,
    open_files: Mutex<HashMap<String, Arc<File>>>,
    /// Set while this process is the bucket's writer (`begin_writing`).
    journaling: OnceLock<Journaling>,
    /// In a process that is not the writer: objects found in the writer's journal by `list`
    /// (docs/0002, "Readers"). Objects are immutable, so an entry never goes stale; one the
    /// writer has deleted since is at worst listed again.
    journal_seen: Mutex<HashMap<String, Bytes>>,
}

/// The journal of a writer, and the objects recorded in it that are not files yet
/// (journal.rs): reads find them here.
#[derive(Debug)]
struct Journaling {
    shared: Arc<JournalShared>,
    storer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Debug)]
struct JournalShared {
    root: PathBuf,
    journal: Journal,
    held: Mutex<Held>,
    /// Wakes the storer: the first object after a quiet spell, journal pressure, or `stop`.
    wake: Condvar,
}

#[derive(Debug, Default)]
struct Held {
    objects: HashMap<String, HeldObject>,
    /// Journaled objects the storer has not taken yet, by record number: oldest first.
    waiting: BTreeMap<u64, String>,
    /// Set by `stop`: the storer stores everything and exits; PUTs write files.
    stopping: bool,
    /// When the storer zeroes the records of garbage deleted since it last did
    /// (`Journal::erase_forgotten`); set by the first such deletion.
    erase_after: Option<Instant>,
}

#[derive(Debug)]
struct HeldObject {
    data: Bytes,
    state: HeldState,
}

#[derive(Debug)]
enum HeldState {
    /// The PUT is writing the record.
    Appending,
    /// Durable in the journal since `since`; not a file.
    Journaled { ticket: Ticket, since: Instant },
    /// The storer is writing the file.
    Storing,
}

fn io_error(key: &str, e: std::io::Error) -> StoreError {
    match e.kind() {
        ErrorKind::NotFound => StoreError::NotFound(key.to_string()),
        ErrorKind::AlreadyExists => StoreError::AlreadyExists(key.to_string()),
        // A full disk or a transient I/O error may pass; permissions and the like will not,
        // but retrying those costs only a few hundred milliseconds before the error is shown.
        _ => StoreError::Transient(format!("{key}: {e}")),
    }
}

fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.split('/').any(|c| {
            c.is_empty() || c == "." || c == ".." || c == STAGING_DIR || c == JOURNAL_FILE
        });
    if bad {
        return Err(StoreError::Permanent(format!("invalid object key `{key}`")));
    }
    Ok(())
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl LocalBucket {
    pub fn open(root: &Path) -> Result<LocalBucket, String> {
        std::fs::create_dir_all(root.join(STAGING_DIR))
            .map_err(|e| format!("cannot create bucket directory {}: {e}", root.display()))?;
        let root = root
            .canonicalize()
            .map_err(|e| format!("bucket directory {}: {e}", root.display()))?;
        Ok(LocalBucket {
            root,
            open_files: Mutex::default(),
            journaling: OnceLock::new(),
            journal_seen: Mutex::default(),
        })
    }

    /// The object, if it is held in memory because it is not a file yet (in the writer), or
    /// was found in the writer's journal (in a reader).
    fn held(&self, key: &str) -> Option<Bytes> {
        match self.journaling.get() {
            Some(j) => j
                .shared
                .held
                .lock()
                .objects
                .get(key)
                .map(|o| o.data.clone()),
            None => self.journal_seen.lock().get(key).cloned(),
        }
    }

    /// The objects of `prefix` only in the journal: from memory in the writer; in a reader,
    /// read from the journal file now (objects a writer journaled become files only after a
    /// while: without the journal a reader would see an old, possibly gapped log).
    async fn journaled(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        let info = |(key, data): (&String, &Bytes)| ObjectInfo {
            key: key.clone(),
            size_bytes: data.len() as u64,
        };
        if let Some(j) = self.journaling.get() {
            let held = j.shared.held.lock();
            return Ok(held
                .objects
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, o)| info((k, &o.data)))
                .collect());
        }
        let path = self.root.join(JOURNAL_FILE);
        let records =
            blocking(move || journal::read_records(&path).map_err(|e| io_error(JOURNAL_FILE, e)))
                .await?;
        let mut seen = self.journal_seen.lock();
        for r in records {
            seen.entry(r.key).or_insert_with(|| Bytes::from(r.data));
        }
        Ok(seen
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(info)
            .collect())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn handle(&self, key: &str) -> std::io::Result<Arc<File>> {
        if let Some(f) = self.open_files.lock().get(key) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(self.path(key))?);
        let mut files = self.open_files.lock();
        if files.len() >= OPEN_FILES_MAX {
            files.clear();
        }
        files.insert(key.to_string(), f.clone());
        Ok(f)
    }
}

/// Writes an object durably: staged, fsynced, published atomically, directory fsynced.
fn put_file(root: &Path, key: &str, data: &[u8], mode: PutMode) -> std::io::Result<()> {
    let path = root.join(key);
    let parent = path
        .parent()
        .expect("keys are checked to be relative and non-empty");
    std::fs::create_dir_all(parent)?;
    let staging = staging_path(root);
    let result = (|| {
        let f = write_new_file(&staging, data)?;
        f.sync_all()?;
        match mode {
            PutMode::Create => rename_no_replace(&staging, &path)?,
            PutMode::Overwrite => std::fs::rename(&staging, &path)?,
        }
        fsync_dir(parent)
    })();
    let _ = std::fs::remove_file(&staging);
    result
}

/// Creates (or truncates) `path` holding `data`, not yet synced.
fn write_new_file(path: &Path, data: &[u8]) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if data.len() >= DIRECT_WRITE_BYTES_MIN {
        match options.clone().custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => {
                write_direct(&f, data)?;
                return Ok(f);
            }
            // A file system without direct I/O (tmpfs): write through the page cache.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let mut f = options.open(path)?;
    f.write_all(data)?;
    Ok(f)
}

thread_local! {
    /// One aligned bounce buffer per blocking thread (see write_direct).
    static BOUNCE: RefCell<Vec<u8>> = RefCell::new(vec![0; DIRECT_WRITE_CHUNK_BYTES + DIRECT_ALIGN_BYTES]);
}

/// Writes `data` to an empty file opened with O_DIRECT. Aligned whole pieces go straight from
/// `data`; others are copied into an aligned buffer, the last one padded with zeros, and the
/// padding is cut off again.
fn write_direct(file: &File, data: &[u8]) -> std::io::Result<()> {
    BOUNCE.with(|bounce| {
        let mut bounce = bounce.borrow_mut();
        let skew = bounce.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        assert!(
            skew < DIRECT_ALIGN_BYTES,
            "a byte pointer can always be aligned"
        );
        let bounce = &mut bounce[skew..skew + DIRECT_WRITE_CHUNK_BYTES];
        for (i, piece) in data.chunks(DIRECT_WRITE_CHUNK_BYTES).enumerate() {
            let offset = (i * DIRECT_WRITE_CHUNK_BYTES) as u64;
            let aligned = piece.len().is_multiple_of(DIRECT_ALIGN_BYTES)
                && piece.as_ptr().align_offset(DIRECT_ALIGN_BYTES) == 0;
            if aligned {
                file.write_all_at(piece, offset)?;
                continue;
            }
            let padded = piece.len().next_multiple_of(DIRECT_ALIGN_BYTES);
            bounce[..piece.len()].copy_from_slice(piece);
            bounce[piece.len()..padded].fill(0);
            file.write_all_at(&bounce[..padded], offset)?;
        }
        if !data.len().is_multiple_of(DIRECT_ALIGN_BYTES) {
            file.set_len(data.len() as u64)?;
        }
        Ok(())
    })
}

impl Journaling {
    /// Stores the objects a crash left only in the journal as files, then starts journaling
    /// (unless the file system cannot do direct I/O: objects are then written as files).
    fn start(root: &Path) -> std::io::Result<Journaling> {
        remove_dead_staging_files(root);
        let path = root.join(JOURNAL_FILE);
        let (journal, records) = Journal::open(&path)?;
        if !records.is_empty() {
            for batch in records.chunks(STORE_BATCH_OBJECTS_MAX) {
                let objects: Vec<(&str, &[u8])> = batch
                    .iter()
                    .map(|r| (r.key.as_str(), &r.data[..]))
                    .collect();
                store_files(root, &objects)?;
            }
            tracing::info!(
                objects = records.len(),
                "stored the objects left in the journal of the local bucket"
            );
            journal.reset()?;
        }
        let shared = Arc::new(JournalShared {
            root: root.to_path_buf(),
            journal,
            held: Mutex::default(),
            wake: Condvar::new(),
        });
        let storer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("bucketfs-journal".into())
                .spawn(move || shared.store_journaled())?
        };
        Ok(Journaling {
            shared,
            storer: Mutex::new(Some(storer)),
        })
    }

    /// Journals a small create-only PUT. `None` if the object is not journaled (too large, the
    /// journal full, no direct I/O, journaling stopped): the caller writes it as a file.
    fn put(&self, key: &str, data: &Bytes) -> Option<Result<(), StoreError>> {
        if data.len() > journal::JOURNAL_OBJECT_BYTES_MAX {
            return None;
        }
        let shared = &self.shared;
        let exists = || Some(Err(StoreError::AlreadyExists(key.to_string())));
        {
            let mut held = shared.held.lock();
            if held.stopping {
                return None;
            }
            if held.objects.contains_key(key) {
                return exists();
            }
            let object = HeldObject {
                data: data.clone(),
                state: HeldState::Appending,
            };
            held.objects.insert(key.to_string(), object);
        }
        let unhold = || shared.held.lock().objects.remove(key);
        if shared.root.join(key).exists() {
            unhold();
            return exists();
        }
        match shared.journal.append(key, data) {
            Ok(Some(ticket)) => {
                let mut held = shared.held.lock();
                let first = held.waiting.is_empty();
                held.waiting.insert(ticket.number(), key.to_string());
                let object = held
                    .objects
                    .get_mut(key)
                    .expect("an appending object stays held");
                object.state = HeldState::Journaled {
                    ticket,
                    since: Instant::now(),
                };
                // The storer sleeps while there is nothing to do; it needs to hear of the
                // first object (to time its age) and of a filling ring.
                if first || shared.journal.used_bytes() > JOURNAL_STORE_ABOVE_BYTES {
                    shared.wake.notify_one();
                }
                Some(Ok(()))
            }
            Ok(None) => {
                unhold();
                None
            }
            Err(e) => {
                unhold();
                Some(Err(io_error(key, e)))
            }
        }
    }

    /// Deletes an object that is held in memory. `Some(Ok)` once a journaled object's record is
    /// durably cleared, or, for garbage, forgotten (it never becomes a file, though a crash may
    /// bring garbage back); `Some(Err)` if it is being written (appended or stored as a file)
    /// and stays so for too long; `None` if it is not held.
    async fn delete(&self, key: &str, mode: DeleteMode) -> Option<Result<(), StoreError>> {
        let shared = &self.shared;
        for _ in 0..JOURNALED_DELETE_WAIT_MS {
            let ticket = {
                let mut held = shared.held.lock();
                match held.objects.get(key).map(|o| &o.state) {
                    None => return None,
                    Some(HeldState::Journaled { .. }) => {
                        let Some(HeldObject {
                            state: HeldState::Journaled { ticket, .. },
                            ..
                        }) = held.objects.remove(key)
                        else {
                            unreachable!("matched just above under the same lock")
                        };
                        held.waiting.remove(&ticket.number());
                        if mode == DeleteMode::Garbage {
                            shared.journal.forget(ticket);
                            if held.erase_after.is_none() {
                                held.erase_after = Some(Instant::now() + JOURNAL_ERASE_AFTER);
                                shared.wake.notify_one();
                            }
                            return Some(Ok(()));
                        }
                        Some(ticket)
                    }
                    Some(HeldState::Appending | HeldState::Storing) => None,
                }
            };
            if let Some(ticket) = ticket {
                let (shared, owned_key) = (shared.clone(), key.to_string());
                return Some(
                    blocking(move || {
                        let cleared = shared.journal.release(vec![ticket]);
                        cleared
                            .and_then(|()| shared.journal.sync())
                            .map_err(|e| io_error(&owned_key, e))
                    })
                    .await,
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        Some(Err(StoreError::Transient(format!(
            "object {key} is still being written from the journal"
        ))))
    }

    /// Stops journaling once every journaled object is stored as a file and every forgotten
    /// record is zeroed.
    fn stop(&self) {
        self.shared.held.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(storer) = self.storer.lock().take() {
            let _ = storer.join();
        }
    }
}

impl Drop for LocalBucket {
    fn drop(&mut self) {
        if let Some(j) = self.journaling.get() {
            j.stop();
        }
    }
}

impl JournalShared {
    /// The storer thread: writes journaled objects as files, oldest first and a batch at a
    /// time, once they are `JOURNAL_STORE_AFTER_S` old or the ring is nearly full (or
    /// at `stop`), then releases their records. Until then an object lives only in the journal
    /// and in memory, so one deleted sooner (most log objects of an fsync-heavy load) never
    /// costs a file creation and deletion. A failing write is retried.
    fn store_journaled(&self) {
        let mut delay_ms = 10;
        loop {
            let batch = {
                let mut held = self.held.lock();
                loop {
                    let now = Instant::now();
                    if held.erase_after.is_some_and(|t| held.stopping || now >= t) {
                        held.erase_after = None;
                        let erased = parking_lot::MutexGuard::unlocked(&mut held, || {
                            self.journal.erase_forgotten()
                        });
                        if let Err(e) = erased {
                            // They stay forgotten and are tried again after the next deletion.
                            tracing::warn!(error = %e, "cannot zero the journal records of deleted garbage");
                        }
                        continue;
                    }
                    let due =
                        held.stopping || self.journal.used_bytes() > JOURNAL_STORE_ABOVE_BYTES;
                    let store_at = held.waiting.first_key_value().map(|(_, key)| {
                        match held.objects[key].state {
                            HeldState::Journaled { since, .. } => {
                                since + std::time::Duration::from_secs(JOURNAL_STORE_AFTER_S)
                            }
                            _ => unreachable!("waiting objects are journaled"),
                        }
                    });
                    match store_at {
                        None if held.stopping => return,
                        Some(at) if due || now >= at => break,
                        _ => {}
                    }
                    match store_at.into_iter().chain(held.erase_after).min() {
                        Some(at) => {
                            self.wake.wait_until(&mut held, at);
                        }
                        None => self.wake.wait(&mut held),
                    }
                }
                let mut batch = Vec::new();
                while batch.len() < STORE_BATCH_OBJECTS_MAX {
                    let Some((_, key)) = held.waiting.pop_first() else {
                        break;
                    };
                    let object = held
                        .objects
                        .get_mut(&key)
                        .expect("waiting objects are held");
                    let HeldState::Journaled { ticket, .. } =
                        std::mem::replace(&mut object.state, HeldState::Storing)
                    else {
                        unreachable!("waiting objects are journaled")
                    };
                    batch.push((key, object.data.clone(), ticket));
                }
                batch
            };
            let objects: Vec<(&str, &[u8])> = batch
                .iter()
                .map(|(key, data, _)| (key.as_str(), &data[..]))
                .collect();
            while let Err(e) = store_files(&self.root, &objects) {
                tracing::error!(error = %e, "cannot store journaled objects as files yet; retrying");
                std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                delay_ms = (delay_ms * 2).min(1000);
            }
            delay_ms = 10;
            let (keys, tickets): (Vec<String>, Vec<Ticket>) = batch
                .into_iter()
                .map(|(key, _, ticket)| (key, ticket))
                .unzip();
            let released = self.journal.release(tickets);
            if let Some(e) = released.err().or_else(|| self.journal.sync().err()) {
                // The records may stay valid: a restart stores those objects again.
                tracing::warn!(error = %e, "cannot clear released journal records");
            }
            let mut held = self.held.lock();
            for key in keys {
                held.objects.remove(&key);
            }
        }
    }
}

/// Stores a batch of journaled objects as files: each is written under a staging name, all are
/// fsynced, then each is renamed into place without replacing anything (`RENAME_NOREPLACE`),
/// and each directory is fsynced once.
///
/// Files are created in the staging directory, not under their own names, because creating a
/// file holds its directory's lock for the whole inode allocation, and the create-only check of
/// every PUT (`Journaling::put`) looks a name up in that directory: it waited behind those
/// creations, on the critical path of every fsync (docs/0002). A rename holds the lock only
/// briefly, and it is also atomic and create-only: a reader never sees a half-written object,
/// and an object that some other process stored under the same name is never overwritten.
fn store_files(root: &Path, objects: &[(&str, &[u8])]) -> std::io::Result<()> {
    let mut staged: Vec<(PathBuf, File)> = Vec::with_capacity(objects.len());
    let result = (|| {
        for (_, data) in objects {
            let staging = staging_path(root);
            let file = write_new_file(&staging, data);
            staged.push((staging, file?));
        }
        for (_, f) in &staged {
            // Starts every file's writeback at once, so the first fsync's file-system journal
            // commit carries them all. Only a hint: the fsync below makes each durable.
            // SAFETY: a plain system call on an open descriptor; no memory is passed.
            unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
        for (_, f) in &staged {
            f.sync_all()?;
        }
        let mut dirs = std::collections::BTreeSet::new();
        for ((staging, _), (key, data)) in staged.iter().zip(objects) {
            let path = root.join(key);
            let dir = path
                .parent()
                .expect("keys are checked to be relative and non-empty");
            if dirs.insert(dir.to_path_buf()) {
                std::fs::create_dir_all(dir)?;
            }
            match rename_no_replace(staging, &path) {
                Ok(()) => {}
                // Stored already (an earlier attempt of this batch, or of a replay, got this
                // far): the staged copy is not needed.
                Err(e) if e.kind() == ErrorKind::AlreadyExists
                    && std::fs::read(&path)? == *data =>
                {
                    std::fs::remove_file(staging)?
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    return Err(std::io::Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{key} exists in the bucket with other content: another process writes to this bucket"),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        for dir in dirs {
            fsync_dir(&dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        // Renamed files are gone from the staging directory; the others are left over.
        for (staging, _) in &staged {
            let _ = std::fs::remove_file(staging);
        }
    }
    result
}

/// Removes the staging files that processes which are gone left behind (a crash between
/// writing a file and publishing it); their objects are in the journal or were never
/// acknowledged. Files of live processes (named `<pid>-<n>`) are left alone.
fn remove_dead_staging_files(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root.join(STAGING_DIR)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.split('-').next());
        let alive = pid.is_some_and(|pid| Path::new("/proc").join(pid).exists());
        if !alive {
            if let Err(e) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove a leftover staging file");
            }
        }
    }
}

/// A fresh name in the staging directory, unique even with several buckets open on one
/// directory in one process.
fn staging_path(root: &Path) -> PathBuf {
    static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);
    root.join(STAGING_DIR).join(format!(
        "{}-{}",
        std::process::id(),
        STAGING_COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Moves `from` to `to` atomically, failing with `AlreadyExists` instead of replacing `to`: an
/// atomic create-only publish. File systems without `RENAME_NOREPLACE` (NFS, for one) get a
/// hard link, which is just as atomic and create-only, and the staging name is removed.
fn rename_no_replace(from_path: &Path, to_path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))
    };
    let (from, to) = (c(from_path)?, c(to_path)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            std::fs::hard_link(from_path, to_path)?;
            let _ = std::fs::remove_file(from_path);
            Ok(())
        }
        _ => Err(e),
    }
}

fn list_dir(root: &Path, prefix: &str) -> std::io::Result<Vec<ObjectInfo>> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(prefix.trim_end_matches('/'))];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound || e.kind() == ErrorKind::NotADirectory => {
                continue
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let meta = entry.metadata()?;
            let path = entry.path();
            let key = path
                .strip_prefix(root)
                .expect("walked below the root")
                .to_string_lossy()
                .to_string();
            if key.starts_with(STAGING_DIR) || key == JOURNAL_FILE {
                continue;
            }
            if meta.is_dir() {
                stack.push(path);
            } else if key.starts_with(prefix) {
                out.push(ObjectInfo {
                    key,
                    size_bytes: meta.len(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Transient(format!("blocking task failed: {e}")))?
}

#[async_trait]
impl Bucket for LocalBucket {
    async fn put(&self, key: &str, data: Bytes, mode: PutMode) -> Result<(), StoreError> {
        check_key(key)?;
        if let (PutMode::Create, Some(j)) = (mode, self.journaling.get()) {
            if let Some(result) = j.put(key, &data) {
                return result;
            }
        }
        // Small objects (an fsync-driven flush) are written right here: the write and fsync take
        // about as long as the round trip through the blocking pool would add to the fsync.
        if data.len() <= INLINE_PUT_BYTES_MAX {
            return put_file(&self.root, key, &data, mode).map_err(|e| io_error(key, e));
        }
        let root = self.root.clone();
        let key = key.to_string();
        blocking(move || {
            let _bulk = crate::bulk::enter();
            put_file(&root, &key, &data, mode).map_err(|e| io_error(&key, e))
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        check_key(key)?;
        if let Some(data) = self.held(key) {
            return Ok(data);
        }
        let path = self.path(key);
        let key = key.to_string();
        blocking(move || {
            std::fs::read(&path)
                .map(Bytes::from)
                .map_err(|e| io_error(&key, e))
        })
        .await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, StoreError> {
        check_key(key)?;
        let beyond = || {
            StoreError::Permanent(format!(
                "object {key}: ranged read {range:?} is beyond its end"
            ))
        };
        if let Some(data) = self.held(key) {
            if range.end > data.len() as u64 {
                return Err(beyond());
            }
            return Ok(data.slice(range.start as usize..range.end as usize));
        }
        let file = self.handle(key).map_err(|e| io_error(key, e))?;
        let len = (range.end - range.start) as usize;
        match pread::read_range(file, range.start, len).await {
            Ok(buf) => Ok(Bytes::from(buf)),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(beyond()),
            Err(e) => Err(io_error(key, e)),
        }
    }

    async fn delete(&self, key: &str, mode: DeleteMode) -> Result<(), StoreError> {
        check_key(key)?;
        if let Some(j) = self.journaling.get() {
            if let Some(result) = j.delete(key, mode).await {
                return result;
            }
        }
        self.open_files.lock().remove(key);
        let path = self.path(key);
        let key = key.to_string();
        blocking(move || {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_error(&key, e)),
            }
            // An unlink is durable once its directory is synced.
            if mode == DeleteMode::Durable {
                let dir = path.parent().expect("an object's path has a directory");
                fsync_dir(dir).map_err(|e| io_error(&key, e))?;
            }
            Ok(())
        })
        .await
    }

    async fn begin_writing(&self) -> Result<(), StoreError> {
        if self.journaling.get().is_some() {
            return Ok(());
        }
        let root = self.root.clone();
        let journaling =
            blocking(move || Journaling::start(&root).map_err(|e| io_error(JOURNAL_FILE, e)))
                .await?;
        let _ = self.journaling.set(journaling);
        // What this process read of the journal before it became the writer is now in files.
        self.journal_seen.lock().clear();
        Ok(())
    }

    async fn end_writing(&self) -> Result<(), StoreError> {
        if let Some(j) = self.journaling.get() {
            j.stop();
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        // Journaled objects are taken first: one whose file appears meanwhile (and whose record
        // is then cleared) is listed from the directory, never missed.
        let journaled = self.journaled(prefix).await?;
        let root = self.root.clone();
        let prefix = prefix.to_string();
        let mut listed = journaled;
        listed.extend(
            blocking(move || list_dir(&root, &prefix).map_err(|e| io_error(&prefix, e))).await?,
        );
        // Stable: where both have an object, the journaled entry (complete) comes first and
        // stays, not a file still being written.
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        listed.dedup_by(|a, b| a.key == b.key);
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_files_never_replace_another_object() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-store-").unwrap();
        let dir = scratch.path();
        let b = LocalBucket::open(dir).unwrap();
        store_files(&b.root, &[("log/1", b"one"), ("log/2", b"two")]).unwrap();
        assert_eq!(std::fs::read(dir.join("log/1")).unwrap(), b"one");
        // Storing the same object again (a retried batch) succeeds and changes nothing.
        store_files(&b.root, &[("log/2", b"two")]).unwrap();
        // Another object under a stored name is refused, and the stored one stays as it was.
        let e = store_files(&b.root, &[("log/3", b"three"), ("log/1", b"other")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("log/1"), "{e}");
        assert_eq!(std::fs::read(dir.join("log/1")).unwrap(), b"one");
        assert_eq!(
            std::fs::read_dir(dir.join(STAGING_DIR)).unwrap().count(),
            0,
            "no staging file is left behind"
        );
    }

    #[tokio::test]
    async fn objects_are_created_once_read_by_range_listed_and_deleted() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-local-").unwrap();
        let dir = scratch.path();
        let b = LocalBucket::open(dir).unwrap();
        b.put("log/1", Bytes::from_static(b"hello world"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(
            b.put("log/1", Bytes::from_static(b"x"), PutMode::Create)
                .await,
            Err(StoreError::AlreadyExists("log/1".into()))
        );
        assert_eq!(&b.get_range("log/1", 6..11).await.unwrap()[..], b"world");
        assert!(matches!(
            b.get_range("log/1", 6..12).await,
            Err(StoreError::Permanent(_))
        ));
        b.put("a.json", Bytes::from_static(b"1"), PutMode::Overwrite)
            .await
            .unwrap();
        b.put("a.json", Bytes::from_static(b"2"), PutMode::Overwrite)
            .await
            .unwrap();
        assert_eq!(&b.get("a.json").await.unwrap()[..], b"2");
        let keys: Vec<String> = b
            .list("")
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, vec!["a.json".to_string(), "log/1".to_string()]);
        assert_eq!(b.list("log/").await.unwrap().len(), 1);
        b.delete("log/1", DeleteMode::Durable).await.unwrap();
        b.delete("log/1", DeleteMode::Garbage).await.unwrap();
        assert_eq!(
            b.get("log/1").await,
            Err(StoreError::NotFound("log/1".into()))
        );
        assert!(matches!(
            b.get("../etc/passwd").await,
            Err(StoreError::Permanent(_))
        ));
    }

    #[tokio::test]
    async fn large_objects_round_trip_through_direct_writes_at_any_alignment() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-direct-").unwrap();
        let dir = scratch.path();
        let b = LocalBucket::open(dir).unwrap();
        let data: Vec<u8> = (0..3 * DIRECT_WRITE_CHUNK_BYTES + 5000)
            .map(|i| (i % 251) as u8)
            .collect();
        let whole = Bytes::from(data);
        // Unaligned starts and lengths, an exact multiple of the alignment, and a small object.
        for (n, (from, to)) in [
            (1, whole.len()),
            (0, 2 * DIRECT_WRITE_CHUNK_BYTES),
            (7, 4103),
        ]
        .into_iter()
        .enumerate()
        {
            let key = format!("log/{n}");
            let object = whole.slice(from..to);
            b.put(&key, object.clone(), PutMode::Create).await.unwrap();
            assert_eq!(b.get(&key).await.unwrap(), object);
            let mid = object.len() as u64 / 2;
            assert_eq!(
                b.get_range(&key, mid..mid + 10).await.unwrap(),
                object.slice(mid as usize..mid as usize + 10)
            );
        }
    }

    #[tokio::test]
    async fn a_journal_of_another_size_is_still_replayed() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-resize-").unwrap();
        let dir = scratch.path();
        drop(LocalBucket::open(dir).unwrap());
        let path = dir.join(JOURNAL_FILE);
        {
            let (j, _) = Journal::open(&path).unwrap();
            j.append("log/1", b"first")
                .unwrap()
                .expect("ext4 does direct I/O");
        }
        // What an older version, with a smaller journal, leaves after a crash.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1024 * 1024)
            .unwrap();
        let b = LocalBucket::open(dir).unwrap();
        b.begin_writing().await.unwrap();
        assert_eq!(std::fs::read(dir.join("log/1")).unwrap(), b"first");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            journal::JOURNAL_BYTES,
            "recreated at the current size"
        );
        b.end_writing().await.unwrap();
    }

    #[tokio::test]
    async fn journaled_objects_survive_a_crash_before_their_files_exist() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-journal-").unwrap();
        let dir = scratch.path();
        drop(LocalBucket::open(dir).unwrap());
        let path = dir.join(JOURNAL_FILE);
        {
            // What a crash leaves: three records, the third torn, and the second already stored
            // as a file (the crash came before its record was cleared).
            let (j, recovered) = Journal::open(&path).unwrap();
            assert!(recovered.is_empty());
            for (key, data) in [("log/1", "first"), ("log/2", "second"), ("log/3", "third")] {
                j.append(key, data.as_bytes())
                    .unwrap()
                    .expect("ext4 does direct I/O");
            }
            let raw = OpenOptions::new().write(true).open(&path).unwrap();
            raw.write_all_at(b"X", 2 * 4096 + 40).unwrap();
            std::fs::create_dir_all(dir.join("log")).unwrap();
            std::fs::write(dir.join("log/2"), "second").unwrap();
            // A staging file of a process that is gone (pids never reach u32::MAX), and one of
            // a live process (this one).
            std::fs::write(dir.join(STAGING_DIR).join(format!("{}-0", u32::MAX)), "x").unwrap();
            std::fs::write(
                dir.join(STAGING_DIR)
                    .join(format!("{}-999999", std::process::id())),
                "y",
            )
            .unwrap();
        }
        let b = LocalBucket::open(dir).unwrap();
        b.begin_writing().await.unwrap();
        let staged: Vec<String> = std::fs::read_dir(dir.join(STAGING_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(staged, [format!("{}-999999", std::process::id())]);
        assert_eq!(std::fs::read(dir.join("log/1")).unwrap(), b"first");
        assert_eq!(std::fs::read(dir.join("log/2")).unwrap(), b"second");
        assert_eq!(
            b.get("log/3").await,
            Err(StoreError::NotFound("log/3".into())),
            "a torn record was never acknowledged"
        );
        // Journaled from now on: readable and listed at once, refused a second time, not a file
        // while young, and a file by the time the writer ends.
        b.put("log/4", Bytes::from_static(b"fourth"), PutMode::Create)
            .await
            .unwrap();
        assert!(
            !dir.join("log/4").exists(),
            "young objects stay in the journal"
        );
        assert_eq!(&b.get("log/4").await.unwrap()[..], b"fourth");
        assert_eq!(&b.get_range("log/4", 1..3).await.unwrap()[..], b"ou");
        assert_eq!(
            b.put("log/4", Bytes::from_static(b"again"), PutMode::Create)
                .await,
            Err(StoreError::AlreadyExists("log/4".into()))
        );
        let keys: Vec<String> = b
            .list("log/")
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, ["log/1", "log/2", "log/4"]);
        // Deleted while only journaled: gone at once, and never a file, now or after a crash.
        b.put("log/5", Bytes::from_static(b"fifth"), PutMode::Create)
            .await
            .unwrap();
        b.delete("log/5", DeleteMode::Durable).await.unwrap();
        assert_eq!(
            b.get("log/5").await,
            Err(StoreError::NotFound("log/5".into()))
        );
        let (_, in_journal) = Journal::open(&path).unwrap();
        let keys: Vec<&str> = in_journal.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["log/4"], "a crash now brings back log/4, not log/5");
        // Deleted as garbage: gone at once, and its record zeroed soon after (until then a
        // crash may bring it back).
        b.put("log/6", Bytes::from_static(b"sixth"), PutMode::Create)
            .await
            .unwrap();
        b.delete("log/6", DeleteMode::Garbage).await.unwrap();
        assert_eq!(
            b.get("log/6").await,
            Err(StoreError::NotFound("log/6".into()))
        );
        assert_eq!(b.list("log/").await.unwrap().len(), 3, "log/1, 2 and 4");
        let mut keys = Vec::new();
        for _ in 0..100 {
            let (_, in_journal) = Journal::open(&path).unwrap();
            keys = in_journal.into_iter().map(|r| r.key).collect();
            if keys == ["log/4"] {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(keys, ["log/4"], "the garbage's record is zeroed");
        b.end_writing().await.unwrap();
        assert_eq!(std::fs::read(dir.join("log/4")).unwrap(), b"fourth");
        assert!(!dir.join("log/5").exists());
        assert!(!dir.join("log/6").exists());
        drop(b);
        let (_, left) = Journal::open(&path).unwrap();
        assert!(left.is_empty(), "every record was released");
    }
}
