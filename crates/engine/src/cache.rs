//! The local-disk cache tier: stored bytes (compressed and sealed, as in the bucket) of log
//! objects this process wrote and of frames it fetched. Everything in it is also in the bucket,
//! so it is emptied at every start and may be deleted at any time.

use parking_lot::Mutex;
use std::path::PathBuf;

pub struct DiskCache {
    dir: PathBuf,
    bytes_max: u64,
    index: Mutex<Index>,
}

struct Index {
    lru: lru::LruCache<String, u64>,
    bytes: u64,
}

impl DiskCache {
    pub fn open(dir: PathBuf, bytes_max: u64) -> std::io::Result<DiskCache> {
        let dir = dir.join("objects");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(DiskCache {
            dir,
            bytes_max,
            index: Mutex::new(Index {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
        })
    }

    fn object_name(seq: u64) -> String {
        format!("{seq:020}")
    }

    fn frame_name(seq: u64, offset: u32) -> String {
        format!("{seq:020}-{offset}")
    }

    /// Bytes `offset..offset+length` of log object `seq`, if cached (whole or as that frame).
    pub fn get(&self, seq: u64, offset: u32, length: u32) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let (name, at) = {
            let mut idx = self.index.lock();
            let whole = Self::object_name(seq);
            if idx.lru.get(&whole).is_some() {
                (whole, u64::from(offset))
            } else {
                let frame = Self::frame_name(seq, offset);
                match idx.lru.get(&frame) {
                    Some(&size) if size == u64::from(length) => (frame, 0),
                    _ => return None,
                }
            }
        };
        let file = std::fs::File::open(self.dir.join(&name)).ok()?;
        let mut buf = vec![0u8; length as usize];
        match file.read_exact_at(&mut buf, at) {
            Ok(()) => Some(buf),
            Err(_) => {
                self.forget(&name);
                None
            }
        }
    }

    pub fn put_object(&self, seq: u64, bytes: &[u8]) {
        self.insert(Self::object_name(seq), bytes);
    }

    pub fn put_frame(&self, seq: u64, offset: u32, bytes: &[u8]) {
        self.insert(Self::frame_name(seq, offset), bytes);
    }

    /// Forgets what a deleted log object left here.
    pub fn drop_object(&self, seq: u64) {
        let prefix = Self::object_name(seq);
        let names: Vec<String> = {
            let idx = self.index.lock();
            idx.lru
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for n in names {
            self.forget(&n);
        }
    }

    fn forget(&self, name: &str) {
        let mut idx = self.index.lock();
        if let Some(size) = idx.lru.pop(name) {
            idx.bytes -= size;
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }

    fn insert(&self, name: String, bytes: &[u8]) {
        let size = bytes.len() as u64;
        if size > self.bytes_max {
            return;
        }
        if let Err(e) = std::fs::write(self.dir.join(&name), bytes) {
            tracing::warn!(error = %e, "disk cache write failed; continuing without caching");
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut idx = self.index.lock();
            if let Some(old) = idx.lru.put(name, size) {
                idx.bytes -= old;
            }
            idx.bytes += size;
            while idx.bytes > self.bytes_max {
                match idx.lru.pop_lru() {
                    Some((n, s)) => {
                        idx.bytes -= s;
                        evicted.push(n);
                    }
                    None => break,
                }
            }
        }
        for n in evicted {
            let _ = std::fs::remove_file(self.dir.join(n));
        }
    }

    pub fn bytes(&self) -> u64 {
        self.index.lock().bytes
    }
}
