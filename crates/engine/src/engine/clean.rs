//! The memory tier: decoded committed extents, least recently used out. It is cut into shards
//! with a lock each, so that readers, who share the state lock, do not queue on one cache lock
//! (consecutive extents of a file fall in different shards).

use lru::LruCache;
use parking_lot::Mutex;
use std::num::NonZeroUsize;
use std::sync::Arc;

const SHARDS: usize = 16;

type Key = (u64, u64);
type Data = Arc<Vec<u8>>;

pub(super) struct CleanCache {
    shards: Vec<Mutex<LruCache<Key, Data>>>,
}

impl CleanCache {
    /// A cache of about `extents` extents in all.
    pub(super) fn new(extents: usize) -> CleanCache {
        let per = NonZeroUsize::new(extents.div_ceil(SHARDS).max(1)).expect("at least one");
        CleanCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per)))
                .collect(),
        }
    }

    fn shard(&self, (ino, index): Key) -> &Mutex<LruCache<Key, Data>> {
        let mixed = ino.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(index);
        &self.shards[(mixed % SHARDS as u64) as usize]
    }

    /// The extent, made the most recently used.
    pub(super) fn get(&self, key: Key) -> Option<Data> {
        self.shard(key).lock().get(&key).cloned()
    }

    /// The extent, its place in the order unchanged (the collector's reads must not keep cold
    /// extents in).
    pub(super) fn peek(&self, key: Key) -> Option<Data> {
        self.shard(key).lock().peek(&key).cloned()
    }

    pub(super) fn put(&self, key: Key, data: Data) {
        self.shard(key).lock().put(key, data);
    }

    /// Puts the extent in; returns what it replaced or pushed out, to be dropped outside the
    /// caller's locks.
    pub(super) fn push(&self, key: Key, data: Data) -> Option<(Key, Data)> {
        self.shard(key).lock().push(key, data)
    }

    pub(super) fn pop(&self, key: Key) {
        self.shard(key).lock().pop(&key);
    }

    /// Drops every extent `doomed` says (one pass over the cache, for range deletions).
    pub(super) fn drop_where(&self, doomed: impl Fn(Key) -> bool) {
        for shard in &self.shards {
            let mut shard = shard.lock();
            let keys: Vec<Key> = shard
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| doomed(*k))
                .collect();
            for k in keys {
                shard.pop(&k);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_about_its_capacity_and_drops_what_is_doomed() {
        let cache = CleanCache::new(64);
        for i in 0..1000 {
            cache.put((1, i), Arc::new(vec![i as u8]));
        }
        assert!(cache.len() <= 64 + SHARDS, "{}", cache.len());
        assert_eq!(cache.get((1, 999)).as_deref(), Some(&vec![999u16 as u8]));
        cache.drop_where(|(_, i)| i >= 990);
        assert!(cache.peek((1, 999)).is_none());
        assert!(cache.len() > 0);
    }
}
