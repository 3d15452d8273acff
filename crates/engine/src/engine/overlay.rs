//! The overlay of unflushed writes: the pending batch and the frozen batches on their way to
//! the bucket, over the committed metadata and the memory tier.

use super::*;

#[derive(Debug, Clone)]
pub(super) enum Dirty {
    Data(Arc<Vec<u8>>),
    /// Committed data the collector moves, unchanged, out of an object it wants dead
    /// (`Engine::repack`): sealed with the configured codec, whichever codec seals the rest of
    /// its batch, so that it is not moved again for being lz4.
    Moved(Arc<Vec<u8>>),
    Hole,
}

/// Mutations not yet durable. `gen` is the write generation the batch covers once frozen.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) extents: HashMap<(u64, u64), Dirty>,
    pub(super) kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    pub(super) gen: u64,
}

impl Batch {
    pub(super) fn is_empty(&self) -> bool {
        self.extents.is_empty() && self.kv.is_empty()
    }
    pub(super) fn data_bytes(&self) -> usize {
        self.extents.len() * EXTENT_SIZE_BYTES
    }
}

pub(super) struct State {
    /// Bumped by every mutation, under this lock.
    pub(super) write_gen: u64,
    pub(super) pending: Batch,
    /// Frozen batches not yet committed, oldest first: being sealed, queued, being uploaded,
    /// or waiting to be uploaded again after a failure.
    pub(super) flushing: VecDeque<Arc<Batch>>,
    pub(super) committed: MetaState,
    /// Bumped whenever `committed` changes, so a reader that fetched an older frame does not put
    /// it in the cache over a newer one.
    pub(super) commit_gen: u64,
    /// Decoded committed extents (the memory tier).
    pub(super) clean: lru::LruCache<(u64, u64), Arc<Vec<u8>>>,
}

pub(super) enum Found {
    Data(Arc<Vec<u8>>),
    Zero,
    Stored(ExtentPtr),
}

impl State {
    /// Unflushed batches, newest (the one that wins) first.
    pub(super) fn newest_first(&self) -> impl Iterator<Item = &Batch> {
        std::iter::once(&self.pending).chain(self.flushing.iter().rev().map(|b| b.as_ref()))
    }

    /// Unflushed batches, oldest first (apply in this order).
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = &Batch> {
        self.flushing
            .iter()
            .map(|b| b.as_ref())
            .chain(std::iter::once(&self.pending))
    }

    pub(super) fn unflushed_bytes(&self) -> usize {
        self.oldest_first().map(Batch::data_bytes).sum()
    }

    /// The current content of an extent, as far as memory knows it.
    pub(super) fn find(&mut self, ino: u64, index: u64) -> Found {
        let key = (ino, index);
        for batch in self.newest_first() {
            match batch.extents.get(&key) {
                Some(Dirty::Data(d) | Dirty::Moved(d)) => return Found::Data(d.clone()),
                Some(Dirty::Hole) => return Found::Zero,
                None => {}
            }
        }
        if let Some(d) = self.clean.get(&key) {
            return Found::Data(d.clone());
        }
        match self.committed.extent(ino, index) {
            Some(ptr) => Found::Stored(ptr),
            None => Found::Zero,
        }
    }

    /// Deallocates an extent: a hole entry if something older than `pending` would otherwise
    /// show through, else just forget the pending entry.
    pub(super) fn punch(&mut self, ino: u64, index: u64) {
        let key = (ino, index);
        let older = match self.flushing.iter().rev().find_map(|f| f.extents.get(&key)) {
            Some(Dirty::Data(_) | Dirty::Moved(_)) => true,
            Some(Dirty::Hole) => false,
            None => self.committed.extent(ino, index).is_some(),
        };
        if older {
            self.pending.extents.insert(key, Dirty::Hole);
        } else {
            self.pending.extents.remove(&key);
        }
    }

    pub(super) fn kv_get(&self, key: &[u8]) -> Option<Vec<u8>> {
        for batch in self.newest_first() {
            if let Some(v) = batch.kv.get(key) {
                return v.clone();
            }
        }
        self.committed.kv_get(key).cloned()
    }
}
