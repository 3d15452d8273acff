//! The metadata block cache: decoded run blocks, least recently used first out, within a byte
//! budget (`[cache] metadata_bytes`). Together with the unflushed tail it is all the memory
//! metadata takes, whatever the bucket holds (docs/0003-metadata-lsm.md).

use super::Entry;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A decoded block: its entries in key order.
pub type Block = Arc<Vec<(Vec<u8>, Entry)>>;

/// What one entry costs in memory beyond its key and value: two vectors and the entry's tag.
const ENTRY_OVERHEAD_BYTES: usize = 56;

/// Every open run gets its own number, so that a run id written twice (a checkpoint retried)
/// can never be served from blocks of the other object.
static NEXT_READER: AtomicU64 = AtomicU64::new(1);

pub(super) fn next_reader_id() -> u64 {
    NEXT_READER.fetch_add(1, Ordering::Relaxed)
}

pub fn block_bytes(block: &[(Vec<u8>, Entry)]) -> usize {
    block
        .iter()
        .map(|(k, e)| {
            ENTRY_OVERHEAD_BYTES
                + k.len()
                + match e {
                    Entry::Put(v) => v.len(),
                    Entry::Delete => 0,
                }
        })
        .sum()
}

struct Inner {
    blocks: lru::LruCache<(u64, usize), (Block, usize)>,
    bytes: usize,
}

pub struct BlockCache {
    inner: Mutex<Inner>,
    bytes_max: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl BlockCache {
    pub fn new(bytes_max: u64) -> Arc<BlockCache> {
        Arc::new(BlockCache {
            inner: Mutex::new(Inner {
                blocks: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            bytes_max: usize::try_from(bytes_max).unwrap_or(usize::MAX),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    pub(super) fn get(&self, reader: u64, block: usize) -> Option<Block> {
        let found = self
            .inner
            .lock()
            .blocks
            .get(&(reader, block))
            .map(|(b, _)| b.clone());
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps `block`, evicting the least recently used ones beyond the budget (the new one
    /// stays even if it alone is over: the caller is about to use it).
    pub(super) fn put(&self, reader: u64, block: usize, data: Block) {
        let size = block_bytes(&data);
        let mut inner = self.inner.lock();
        if let Some((_, old)) = inner.blocks.put((reader, block), (data, size)) {
            inner.bytes -= old;
        }
        inner.bytes += size;
        while inner.bytes > self.bytes_max && inner.blocks.len() > 1 {
            let (_, (_, evicted)) = inner.blocks.pop_lru().expect("more than one block");
            inner.bytes -= evicted;
        }
    }

    /// Forgets the blocks of a run that is no longer read.
    pub fn drop_reader(&self, reader: u64) {
        let mut inner = self.inner.lock();
        let doomed: Vec<(u64, usize)> = inner
            .blocks
            .iter()
            .filter(|((r, _), _)| *r == reader)
            .map(|(k, _)| *k)
            .collect();
        for key in doomed {
            if let Some((_, size)) = inner.blocks.pop(&key) {
                inner.bytes -= size;
            }
        }
    }

    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes as u64
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Block {
        Arc::new(
            (0..n)
                .map(|i| (format!("{i:04}").into_bytes(), Entry::Put(vec![0; 40])))
                .collect(),
        )
    }

    #[test]
    fn the_cache_stays_within_its_budget_and_keeps_what_is_used() {
        let one = block_bytes(&block(10));
        let cache = BlockCache::new(3 * one as u64);
        for b in 0..3 {
            cache.put(1, b, block(10));
        }
        assert!(cache.get(1, 0).is_some(), "block 0 is now the most recent");
        cache.put(1, 3, block(10));
        assert!(cache.get(1, 1).is_none(), "the least recently used went");
        assert!(cache.get(1, 0).is_some() && cache.get(1, 3).is_some());
        assert!(cache.bytes() <= 3 * one as u64);
        // One block over the whole budget still stays until the next comes.
        cache.put(2, 0, block(100));
        assert!(cache.get(2, 0).is_some());
        cache.drop_reader(2);
        assert!(cache.get(2, 0).is_none());
        assert_eq!(cache.bytes(), 0);
    }
}
