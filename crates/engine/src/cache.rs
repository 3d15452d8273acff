//! The local-disk cache tier: stored bytes (compressed and sealed, as in the bucket) of log
//! objects this process wrote and of frames it fetched, and of metadata runs it wrote and of
//! run blocks it fetched. Everything in it is also in the bucket, so it is emptied at every
//! start and may be deleted at any time; what is read from it is authenticated like what is
//! read from the bucket. One thread writes and removes the files, so neither a cold read nor
//! an upload waits for the local disk; a piece is served from memory until its file exists.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

/// Bytes put but not yet written to a file, at most: a put beyond it is not cached (the disk
/// lags behind the reads and uploads that feed it, and the bucket still has everything).
const QUEUED_BYTES_MAX: u64 = 64 << 20;

pub struct DiskCache {
    /// Held (locked) while this cache uses the directory: a second process given the same
    /// directory would otherwise empty it under the first (`open` clears it).
    _lock: std::fs::File,
    shared: Arc<Shared>,
    /// To the writer thread, which does every file write and removal: a cold read or an upload
    /// that feeds the cache never waits for the local disk on an async worker.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    dir: PathBuf,
    bytes_max: u64,
    index: Mutex<Index>,
    next_ticket: AtomicU64,
}

enum Job {
    /// Write the queued bytes of the key, if the ticket is still theirs.
    Write(Key, u64),
    Remove(Key),
    /// Answers once every job before it is done (tests).
    #[cfg(test)]
    Settle(mpsc::Sender<()>),
}

/// The kinds of object cached, each with its own numbers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Space {
    /// Log objects, by sequence number; pieces are frames.
    Log,
    /// Metadata run objects (parts), by seal id; pieces are blocks.
    Run,
}

/// A cached piece: a whole object, or a piece of it (at its offset).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    space: Space,
    id: u64,
    piece_offset: Option<u64>,
}

impl Key {
    fn object(space: Space, id: u64) -> Key {
        Key {
            space,
            id,
            piece_offset: None,
        }
    }

    fn piece(space: Space, id: u64, offset: u64) -> Key {
        Key {
            space,
            id,
            piece_offset: Some(offset),
        }
    }

    fn file_name(&self) -> String {
        let prefix = match self.space {
            Space::Log => "",
            Space::Run => "run-",
        };
        match self.piece_offset {
            None => format!("{prefix}{:020}", self.id),
            Some(offset) => format!("{prefix}{:020}-{offset}", self.id),
        }
    }
}

struct Index {
    /// Size in bytes of every piece in a file, least recently used first.
    lru: lru::LruCache<Key, u64>,
    /// The same keys in order, so that a deleted object's pieces are found without a scan of
    /// the whole cache (the collector deletes thousands of objects a second under pgbench).
    keys: BTreeSet<Key>,
    bytes: u64,
    /// Pieces put and not yet in a file, served from memory meanwhile, with their ticket (a
    /// piece forgotten or put again while its write is queued gets a new one, or none).
    queued: BTreeMap<Key, (u64, Bytes)>,
    queued_bytes: u64,
}

impl Index {
    fn remove(&mut self, key: &Key) -> bool {
        let queued = match self.queued.remove(key) {
            Some((_, b)) => {
                self.queued_bytes -= b.len() as u64;
                true
            }
            None => false,
        };
        self.keys.remove(key);
        match self.lru.pop(key) {
            Some(size) => {
                self.bytes -= size;
                true
            }
            None => queued,
        }
    }

    /// The piece of `space`'s object `id` that holds `offset..offset + length`, and where in
    /// it: the whole object, or the piece that starts nearest at or before `offset`.
    fn find(&mut self, space: Space, id: u64, offset: u64, length: u32) -> Option<Found> {
        let whole = Key::object(space, id);
        if let Some((_, b)) = self.queued.get(&whole) {
            return Some(Found::Queued(b.clone(), offset));
        }
        if self.lru.get(&whole).is_some() {
            return Some(Found::File(whole, offset));
        }
        let range = Key::piece(space, id, 0)..=Key::piece(space, id, offset);
        let in_file = self.keys.range(range.clone()).next_back().copied();
        let in_memory = self.queued.range(range).next_back().map(|(k, _)| *k);
        let key = in_file.max(in_memory)?;
        let start = key.piece_offset.expect("the range holds pieces only");
        let end = offset + u64::from(length);
        if Some(key) == in_memory {
            let (_, b) = &self.queued[&key];
            return (start + b.len() as u64 >= end)
                .then(|| Found::Queued(b.clone(), offset - start));
        }
        match self.lru.get(&key) {
            Some(&size) if start + size >= end => Some(Found::File(key, offset - start)),
            _ => None,
        }
    }
}

enum Found {
    Queued(Bytes, u64),
    File(Key, u64),
}

impl DiskCache {
    /// Takes the directory for this process (an error of kind `WouldBlock` if another process
    /// holds it) and starts empty: what an earlier run left is not trusted. The old files are
    /// moved aside at once and deleted by a thread of their own, so opening does not take
    /// longer with a larger cache.
    pub fn open(dir: PathBuf, bytes_max: u64) -> std::io::Result<DiskCache> {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&dir)?;
        let lock = std::fs::File::create(dir.join("lock"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "in use by another bucketfs process",
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        // Each open writes into a directory of its own name: a writer thread of an earlier
        // cache in this process that is still draining finds its directory gone, and never
        // writes where this one reads.
        let opened = OPENED.fetch_add(1, Ordering::Relaxed);
        let name = format!("objects.{}.{opened}", std::process::id());
        let mut old = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with("objects") {
                let trash = dir.join(format!("trash.{name}.{}", old.len()));
                std::fs::rename(entry.path(), &trash)?;
                old.push(trash);
            } else if file_name.starts_with("trash.") {
                old.push(entry.path());
            }
        }
        if !old.is_empty() {
            std::thread::Builder::new()
                .name("cache-trash".into())
                .spawn(move || {
                    for path in old {
                        if let Err(e) = std::fs::remove_dir_all(&path) {
                            tracing::warn!(path = %path.display(), error = %e, "could not delete an old disk cache directory");
                        }
                    }
                })?;
        }
        let objects = dir.join(name);
        std::fs::create_dir_all(&objects)?;
        let shared = Arc::new(Shared {
            dir: objects,
            bytes_max,
            index: Mutex::new(Index {
                lru: lru::LruCache::unbounded(),
                keys: BTreeSet::new(),
                bytes: 0,
                queued: BTreeMap::new(),
                queued_bytes: 0,
            }),
            next_ticket: AtomicU64::new(0),
        });
        let (jobs, rx) = mpsc::channel();
        let writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("cache-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(DiskCache {
            _lock: lock,
            shared,
            jobs: Mutex::new(Some(jobs)),
            writer: Some(writer),
        })
    }

    /// Bytes `offset..offset+length` of object `id` of `space`, if cached: in the whole
    /// object, or in the piece that starts nearest at or before `offset`, if it reaches
    /// `offset + length` (pieces are byte ranges of the object, such as one GET's).
    pub fn get(&self, space: Space, id: u64, offset: u64, length: u32) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let found = self.shared.index.lock().find(space, id, offset, length)?;
        let (key, at) = match found {
            Found::Queued(bytes, at) => {
                let at = at as usize;
                return Some(bytes[at..at + length as usize].to_vec());
            }
            Found::File(key, at) => (key, at),
        };
        let file = std::fs::File::open(self.shared.path(&key)).ok()?;
        let mut buf = vec![0u8; length as usize];
        match file.read_exact_at(&mut buf, at) {
            Ok(()) => Some(buf),
            Err(_) => {
                self.forget(&key);
                None
            }
        }
    }

    pub fn put_object(&self, space: Space, id: u64, bytes: Bytes) {
        self.insert(Key::object(space, id), bytes);
    }

    /// Bytes `offset..offset + bytes.len()` of the object: one file, however many frames or
    /// blocks it holds (a file per frame made a cold sequential read create thousands a
    /// second, which ext4 serves slowly).
    pub fn put_piece(&self, space: Space, id: u64, offset: u64, bytes: Bytes) {
        self.insert(Key::piece(space, id, offset), bytes);
    }

    /// Forgets what a deleted object left here.
    pub fn drop_object(&self, space: Space, id: u64) {
        let range = Key::object(space, id)..=Key::piece(space, id, u64::MAX);
        let keys: Vec<Key> = {
            let idx = self.shared.index.lock();
            let mut keys: BTreeSet<Key> = idx.keys.range(range.clone()).copied().collect();
            keys.extend(idx.queued.range(range).map(|(k, _)| *k));
            keys.into_iter().collect()
        };
        for key in keys {
            self.forget(&key);
        }
    }

    fn forget(&self, key: &Key) {
        if self.shared.index.lock().remove(key) {
            self.send(Job::Remove(*key));
        }
    }

    fn insert(&self, key: Key, bytes: Bytes) {
        let size = bytes.len() as u64;
        if size > self.shared.bytes_max {
            return;
        }
        let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
        {
            let mut idx = self.shared.index.lock();
            let replaced = idx.queued.get(&key).map_or(0, |(_, b)| b.len() as u64);
            if idx.queued_bytes - replaced + size > QUEUED_BYTES_MAX {
                return;
            }
            if let Some((_, b)) = idx.queued.insert(key, (ticket, bytes)) {
                idx.queued_bytes -= b.len() as u64;
            }
            idx.queued_bytes += size;
        }
        self.send(Job::Write(key, ticket));
    }

    fn send(&self, job: Job) {
        if let Some(jobs) = &*self.jobs.lock() {
            let _ = jobs.send(job);
        }
    }

    pub fn bytes(&self) -> u64 {
        let idx = self.shared.index.lock();
        idx.bytes + idx.queued_bytes
    }

    /// Returns once every write and removal asked before is done.
    #[cfg(test)]
    fn settle(&self) {
        let (tx, rx) = mpsc::channel();
        self.send(Job::Settle(tx));
        let _ = rx.recv();
    }
}

/// The writer finishes what was asked before the cache goes: no file is written into the
/// directory after its cache is gone (a test or a restart may then remove or reuse it).
impl Drop for DiskCache {
    fn drop(&mut self) {
        self.jobs.lock().take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Shared {
    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(key.file_name())
    }

    /// The writer thread: until the cache is dropped, writes queued pieces to files (then
    /// serves them from there) and removes the files of forgotten and evicted ones.
    fn run(&self, jobs: mpsc::Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Write(key, ticket) => self.write(key, ticket),
                Job::Remove(key) => {
                    if !self.index.lock().lru.contains(&key) {
                        remove_file(&self.path(&key));
                    }
                }
                #[cfg(test)]
                Job::Settle(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn write(&self, key: Key, ticket: u64) {
        let _bulk = crate::bulk::enter();
        let bytes = match self.index.lock().queued.get(&key) {
            Some((t, b)) if *t == ticket => b.clone(),
            // Forgotten, or put again (a later job writes that).
            _ => return,
        };
        // Written aside and renamed: a reader of the same piece's earlier file (a shorter GET
        // from the same offset) reads that file whole or this one, never half of each.
        let path = self.path(&key);
        let staged = self.dir.join(format!("{}.new", key.file_name()));
        let written =
            std::fs::write(&staged, &bytes).and_then(|()| std::fs::rename(&staged, &path));
        if written.is_err() {
            remove_file(&staged);
        }
        let mut evicted = Vec::new();
        {
            let mut idx = self.index.lock();
            if !matches!(idx.queued.get(&key), Some((t, _)) if *t == ticket) {
                // Forgotten while being written (the Remove job that follows deletes the
                // file), or put again (the Write job that follows replaces it).
                return;
            }
            idx.queued.remove(&key);
            idx.queued_bytes -= bytes.len() as u64;
            if let Err(e) = written {
                tracing::warn!(error = %e, "disk cache write failed; continuing without caching");
                return;
            }
            if let Some(size) = idx.lru.pop(&key) {
                idx.bytes -= size;
            }
            idx.lru.put(key, bytes.len() as u64);
            idx.keys.insert(key);
            idx.bytes += bytes.len() as u64;
            while idx.bytes > self.bytes_max {
                let Some((k, size)) = idx.lru.pop_lru() else {
                    break;
                };
                idx.keys.remove(&k);
                idx.bytes -= size;
                evicted.push(k);
            }
        }
        for k in evicted {
            remove_file(&self.path(&k));
        }
    }
}

fn remove_file(path: &Path) {
    let _ = std::fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(cache: &DiskCache) -> Vec<String> {
        cache.settle();
        let mut names: Vec<String> = std::fs::read_dir(&cache.shared.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn dropping_an_object_forgets_its_pieces_only_and_size_stays_bounded() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-diskcache-").unwrap();
        let dir = scratch.path().to_path_buf();
        let cache = DiskCache::open(dir.clone(), 100).unwrap();
        cache.put_object(Space::Log, 7, Bytes::from(vec![7; 30]));
        cache.put_piece(Space::Log, 7, 4, Bytes::from(vec![1; 10]));
        cache.put_piece(Space::Log, 8, 0, Bytes::from(vec![8; 10]));
        cache.put_object(Space::Log, 70, Bytes::from(vec![70; 10]));
        assert_eq!(cache.bytes(), 60);
        assert_eq!(
            cache.get(Space::Log, 7, 2, 3),
            Some(vec![7; 3]),
            "read from the whole object"
        );
        assert_eq!(cache.get(Space::Log, 8, 0, 10), Some(vec![8; 10]));
        assert_eq!(
            cache.get(Space::Log, 8, 2, 3),
            Some(vec![8; 3]),
            "a piece serves any range inside it"
        );
        assert_eq!(
            cache.get(Space::Log, 8, 5, 6),
            None,
            "not one that goes past its end"
        );
        assert_eq!(
            cache.get(Space::Log, 9, 0, 1),
            None,
            "nor another object's bytes"
        );

        cache.put_piece(Space::Run, 7, 4, Bytes::from(vec![5; 10]));
        assert_eq!(
            cache.get(Space::Run, 7, 4, 10),
            Some(vec![5; 10]),
            "run 7's block is not log object 7's frame"
        );
        cache.drop_object(Space::Log, 7);
        assert_eq!(cache.get(Space::Run, 7, 4, 10), Some(vec![5; 10]));
        cache.drop_object(Space::Run, 7);
        assert_eq!(cache.bytes(), 20);
        assert_eq!(cache.get(Space::Log, 7, 2, 3), None);
        assert_eq!(
            files(&cache),
            ["00000000000000000008-0", "00000000000000000070"],
            "only object 7's pieces are gone"
        );

        // Over the bound, the least recently used go first: 8's frame was read last.
        assert!(cache.get(Space::Log, 8, 0, 10).is_some());
        cache.put_object(Space::Log, 9, Bytes::from(vec![9; 85]));
        cache.settle();
        assert!(cache.bytes() <= 100);
        assert_eq!(
            files(&cache),
            ["00000000000000000008-0", "00000000000000000009"]
        );
        cache.put_object(Space::Log, 9, Bytes::from(vec![9; 5]));
        cache.settle();
        assert_eq!(cache.bytes(), 15, "a piece put again replaces its size");

        // A second process given the same directory is refused (and empties nothing).
        let err = DiskCache::open(dir.clone(), 100).err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!(cache.get(Space::Log, 9, 0, 5), Some(vec![9; 5]));
        drop(cache);
        assert!(
            DiskCache::open(dir.clone(), 100).is_ok(),
            "free once closed"
        );
    }

    #[test]
    fn a_piece_is_served_before_its_file_is_written_and_a_forgotten_one_leaves_no_file() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-diskcache-q-").unwrap();
        let dir = scratch.path().to_path_buf();
        let cache = DiskCache::open(dir.clone(), 1 << 20).unwrap();
        for id in 0..100u64 {
            cache.put_piece(Space::Log, id, 8, Bytes::from(vec![id as u8; 1000]));
            assert_eq!(
                cache.get(Space::Log, id, 10, 20),
                Some(vec![id as u8; 20]),
                "served at once, from memory or its file"
            );
            if id % 2 == 0 {
                cache.drop_object(Space::Log, id);
                assert_eq!(cache.get(Space::Log, id, 10, 20), None);
            }
        }
        assert_eq!(cache.bytes(), 50 * 1000);
        let names = files(&cache);
        assert_eq!(names.len(), 50, "{names:?}");
        assert!(names.iter().all(|n| n.ends_with("-8")), "{names:?}");
        assert_eq!(cache.get(Space::Log, 99, 8, 1000), Some(vec![99; 1000]));
    }

    #[test]
    fn opening_moves_an_earlier_run_s_files_aside_and_deletes_them_in_the_background() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-diskcache-o-").unwrap();
        let dir = scratch.path().to_path_buf();
        let cache = DiskCache::open(dir.clone(), 1 << 30).unwrap();
        for id in 0..2000u64 {
            cache.put_object(Space::Log, id, Bytes::from(vec![1; 100]));
        }
        cache.settle();
        drop(cache);
        // A directory an older build left, under the old name.
        std::fs::create_dir_all(dir.join("objects")).unwrap();
        std::fs::write(dir.join("objects").join("00000000000000000001"), b"old").unwrap();
        let cache = DiskCache::open(dir.clone(), 1 << 30).unwrap();
        assert!(files(&cache).is_empty(), "a new run starts empty");
        assert_eq!(cache.get(Space::Log, 1, 0, 3), None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let left: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "lock" && !cache.shared.dir.ends_with(n))
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still there: {left:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
