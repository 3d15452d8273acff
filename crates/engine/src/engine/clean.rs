//! The memory tier: decoded committed extents, least recently used out. It is cut into shards
//! with a lock each, so that readers, who share the state lock, do not queue on one cache lock
//! (consecutive extents of a file fall in different shards).

use lru::LruCache;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

const SHARDS: usize = 16;

type Key = (u64, u64);
type Data = Arc<Vec<u8>>;

pub(super) struct CleanCache {
    shards: Vec<Mutex<Shard>>,
}

/// The extents in key order beside the LRU order, so that a range deletion (unlinking or
/// truncating a file) finds its extents without a pass over the whole cache: with a cache of
/// a 1 GiB file's 16,384 extents, that pass made every NFS REMOVE's commit several times slower.
struct Shard {
    lru: LruCache<Key, Data>,
    keys: BTreeSet<Key>,
}

impl Shard {
    fn push(&mut self, key: Key, data: Data) -> Option<(Key, Data)> {
        let out = self.lru.push(key, data);
        if let Some((old, _)) = &out {
            if *old != key {
                self.keys.remove(old);
            }
        }
        self.keys.insert(key);
        out
    }

    fn pop(&mut self, key: &Key) {
        if self.lru.pop(key).is_some() {
            self.keys.remove(key);
        }
    }
}

impl CleanCache {
    /// A cache of about `extents` extents in all.
    pub(super) fn new(extents: usize) -> CleanCache {
        let per = NonZeroUsize::new(extents.div_ceil(SHARDS).max(1)).expect("at least one");
        CleanCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        lru: LruCache::new(per),
                        keys: BTreeSet::new(),
                    })
                })
                .collect(),
        }
    }

    fn shard(&self, (ino, index): Key) -> &Mutex<Shard> {
        let mixed = ino.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(index);
        &self.shards[(mixed % SHARDS as u64) as usize]
    }

    /// The extent, made the most recently used.
    pub(super) fn get(&self, key: Key) -> Option<Data> {
        self.shard(key).lock().lru.get(&key).cloned()
    }

    /// The extent, its place in the order unchanged (the collector's reads must not keep cold
    /// extents in).
    pub(super) fn peek(&self, key: Key) -> Option<Data> {
        self.shard(key).lock().lru.peek(&key).cloned()
    }

    pub(super) fn put(&self, key: Key, data: Data) {
        self.shard(key).lock().push(key, data);
    }

    /// Puts the extent in; returns what it replaced or pushed out, to be dropped outside the
    /// caller's locks.
    pub(super) fn push(&self, key: Key, data: Data) -> Option<(Key, Data)> {
        self.shard(key).lock().push(key, data)
    }

    pub(super) fn pop(&self, key: Key) {
        self.shard(key).lock().pop(&key);
    }

    /// Drops the extents `from..to` of file `ino`.
    pub(super) fn drop_range(&self, ino: u64, from: u64, to: u64) {
        if from >= to {
            return;
        }
        for shard in &self.shards {
            let mut shard = shard.lock();
            let doomed: Vec<Key> = shard.keys.range((ino, from)..(ino, to)).copied().collect();
            for k in doomed {
                shard.pop(&k);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().lru.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_about_its_capacity_and_drops_a_files_range() {
        let cache = CleanCache::new(64);
        for i in 0..1000 {
            cache.put((1, i), Arc::new(vec![i as u8]));
        }
        assert!(cache.len() <= 64 + SHARDS, "{}", cache.len());
        assert_eq!(cache.get((1, 999)).as_deref(), Some(&vec![999u16 as u8]));
        cache.put((2, 995), Arc::new(vec![7]));
        cache.drop_range(1, 990, u64::MAX);
        assert!(cache.peek((1, 999)).is_none() && cache.peek((1, 990)).is_none());
        assert!(
            cache.peek((2, 995)).is_some(),
            "another file's extent was dropped"
        );
        let left = cache.len();
        assert!(left > 0);
        // The key index follows evictions: what the LRU pushed out is not found again.
        for i in 0..1000 {
            cache.put((3, i), Arc::new(vec![1]));
        }
        cache.drop_range(1, 0, u64::MAX);
        cache.drop_range(3, 0, 500);
        assert!(cache.len() <= 64 + SHARDS);
        assert!(cache.peek((3, 999)).is_some());
        let shards_keys: usize = cache.shards.iter().map(|s| s.lock().keys.len()).sum();
        assert_eq!(
            shards_keys,
            cache.len(),
            "the key index and the LRU disagree"
        );
    }
}
