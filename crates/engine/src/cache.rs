//! The local-disk cache tier: stored bytes (compressed and sealed, as in the bucket) of log
//! objects this process wrote and of frames it fetched, and of metadata runs it wrote and of
//! run blocks it fetched. Everything in it is also in the bucket, so it is emptied at every
//! start and may be deleted at any time; what is read from it is authenticated like what is
//! read from the bucket.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::path::PathBuf;

pub struct DiskCache {
    /// Held (locked) while this cache uses the directory: a second process given the same
    /// directory would otherwise empty it under the first (`open` clears it).
    _lock: std::fs::File,
    dir: PathBuf,
    bytes_max: u64,
    index: Mutex<Index>,
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
    /// Size in bytes of every cached piece, least recently used first.
    lru: lru::LruCache<Key, u64>,
    /// The same keys in order, so that a deleted object's pieces are found without a scan of
    /// the whole cache (the collector deletes thousands of objects a second under pgbench).
    keys: BTreeSet<Key>,
    bytes: u64,
}

impl Index {
    fn remove(&mut self, key: &Key) -> bool {
        self.keys.remove(key);
        match self.lru.pop(key) {
            Some(size) => {
                self.bytes -= size;
                true
            }
            None => false,
        }
    }
}

impl DiskCache {
    /// Takes the directory for this process (an error of kind `WouldBlock` if another process
    /// holds it) and empties it: what an earlier run left is not trusted.
    pub fn open(dir: PathBuf, bytes_max: u64) -> std::io::Result<DiskCache> {
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
        let dir = dir.join("objects");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(DiskCache {
            _lock: lock,
            dir,
            bytes_max,
            index: Mutex::new(Index {
                lru: lru::LruCache::unbounded(),
                keys: BTreeSet::new(),
                bytes: 0,
            }),
        })
    }

    /// Bytes `offset..offset+length` of object `id` of `space`, if cached: in the whole
    /// object, or in the piece that starts nearest at or before `offset`, if it reaches
    /// `offset + length` (pieces are byte ranges of the object, such as one GET's).
    pub fn get(&self, space: Space, id: u64, offset: u64, length: u32) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let (key, at) = {
            let mut idx = self.index.lock();
            let whole = Key::object(space, id);
            if idx.lru.get(&whole).is_some() {
                (whole, offset)
            } else {
                let piece = *idx
                    .keys
                    .range(Key::piece(space, id, 0)..=Key::piece(space, id, offset))
                    .next_back()?;
                let start = piece.piece_offset.expect("the range holds pieces only");
                match idx.lru.get(&piece) {
                    Some(&size) if start + size >= offset + u64::from(length) => {
                        (piece, offset - start)
                    }
                    _ => return None,
                }
            }
        };
        let file = std::fs::File::open(self.dir.join(key.file_name())).ok()?;
        let mut buf = vec![0u8; length as usize];
        match file.read_exact_at(&mut buf, at) {
            Ok(()) => Some(buf),
            Err(_) => {
                self.forget(&key);
                None
            }
        }
    }

    pub fn put_object(&self, space: Space, id: u64, bytes: &[u8]) {
        self.insert(Key::object(space, id), bytes);
    }

    /// Bytes `offset..offset + bytes.len()` of the object: one file, however many frames or
    /// blocks it holds (a file per frame made a cold sequential read create thousands a
    /// second, which ext4 serves slowly).
    pub fn put_piece(&self, space: Space, id: u64, offset: u64, bytes: &[u8]) {
        self.insert(Key::piece(space, id, offset), bytes);
    }

    /// Forgets what a deleted object left here.
    pub fn drop_object(&self, space: Space, id: u64) {
        let keys: Vec<Key> = {
            let idx = self.index.lock();
            idx.keys
                .range(Key::object(space, id)..=Key::piece(space, id, u64::MAX))
                .copied()
                .collect()
        };
        for key in keys {
            self.forget(&key);
        }
    }

    fn forget(&self, key: &Key) {
        if self.index.lock().remove(key) {
            let _ = std::fs::remove_file(self.dir.join(key.file_name()));
        }
    }

    fn insert(&self, key: Key, bytes: &[u8]) {
        let size = bytes.len() as u64;
        if size > self.bytes_max {
            return;
        }
        if let Err(e) = std::fs::write(self.dir.join(key.file_name()), bytes) {
            tracing::warn!(error = %e, "disk cache write failed; continuing without caching");
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut idx = self.index.lock();
            idx.remove(&key);
            idx.lru.put(key, size);
            idx.keys.insert(key);
            idx.bytes += size;
            while idx.bytes > self.bytes_max {
                let Some((k, _)) = idx.lru.peek_lru().map(|(k, s)| (*k, *s)) else {
                    break;
                };
                idx.remove(&k);
                evicted.push(k);
            }
        }
        for k in evicted {
            let _ = std::fs::remove_file(self.dir.join(k.file_name()));
        }
    }

    pub fn bytes(&self) -> u64 {
        self.index.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(cache: &DiskCache) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&cache.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn dropping_an_object_forgets_its_pieces_only_and_size_stays_bounded() {
        let dir = std::env::temp_dir().join(format!("bucketfs-diskcache-{}", std::process::id()));
        let cache = DiskCache::open(dir.clone(), 100).unwrap();
        cache.put_object(Space::Log, 7, &[7; 30]);
        cache.put_piece(Space::Log, 7, 4, &[1; 10]);
        cache.put_piece(Space::Log, 8, 0, &[8; 10]);
        cache.put_object(Space::Log, 70, &[70; 10]);
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

        cache.put_piece(Space::Run, 7, 4, &[5; 10]);
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
        cache.put_object(Space::Log, 9, &[9; 85]);
        assert!(cache.bytes() <= 100);
        assert_eq!(
            files(&cache),
            ["00000000000000000008-0", "00000000000000000009"]
        );
        cache.put_object(Space::Log, 9, &[9; 5]);
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
        std::fs::remove_dir_all(dir).unwrap();
    }
}
