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
///
/// A range deletion (a cut) removes the batch's own entries in its range when it is made, so
/// what the batch still holds in a cut range is newer than the cut: its cuts apply to older
/// batches and the committed state only, and are sealed before its entries.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) extents: HashMap<(u64, u64), Dirty>,
    pub(super) kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Extent index ranges `from..to` cut, per inode.
    pub(super) extent_cuts: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Key ranges `start..end` cut.
    pub(super) kv_cuts: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) gen: u64,
}

impl Batch {
    pub(super) fn is_empty(&self) -> bool {
        self.extents.is_empty()
            && self.kv.is_empty()
            && self.extent_cuts.is_empty()
            && self.kv_cuts.is_empty()
    }

    /// Whether a cut of this batch hides the extent in what is older.
    pub(super) fn cuts_extent(&self, ino: u64, index: u64) -> bool {
        self.extent_cuts
            .get(&ino)
            .is_some_and(|cuts| cuts.iter().any(|&(from, to)| from <= index && index < to))
    }

    pub(super) fn cuts_key(&self, key: &[u8]) -> bool {
        self.kv_cuts
            .iter()
            .any(|(start, end)| start.as_slice() <= key && key < end.as_slice())
    }

    /// Whether the batch changes the extent, by an entry or a cut.
    pub(super) fn touches_extent(&self, ino: u64, index: u64) -> bool {
        self.extents.contains_key(&(ino, index)) || self.cuts_extent(ino, index)
    }

    /// The batch's cuts as ops, in the order they are sealed (before its entries).
    pub(super) fn cut_ops(&self) -> impl Iterator<Item = MetaOp> + '_ {
        let kv = self
            .kv_cuts
            .iter()
            .map(|(start, end)| MetaOp::KvDeleteRange {
                start: start.clone(),
                end: end.clone(),
            });
        let extents = self.extent_cuts.iter().flat_map(|(ino, cuts)| {
            cuts.iter()
                .map(move |&(from, to)| MetaOp::ExtentClearRange {
                    ino: *ino,
                    from,
                    to,
                })
        });
        kv.chain(extents)
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
                None if batch.cuts_extent(ino, index) => return Found::Zero,
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
        let older = self
            .flushing
            .iter()
            .rev()
            .find_map(|f| match f.extents.get(&key) {
                Some(Dirty::Data(_) | Dirty::Moved(_)) => Some(true),
                Some(Dirty::Hole) => Some(false),
                None => f.cuts_extent(ino, index).then_some(false),
            });
        let older = older.unwrap_or_else(|| self.committed.extent(ino, index).is_some());
        if older {
            self.pending.extents.insert(key, Dirty::Hole);
        } else {
            self.pending.extents.remove(&key);
        }
    }

    /// Deallocates the extents of `ino` with an index in `from..to`, in one op whatever
    /// their number.
    pub(super) fn cut_extents(&mut self, ino: u64, from: u64, to: u64) {
        if from >= to {
            return;
        }
        self.pending
            .extents
            .retain(|&(i, x), _| i != ino || x < from || x >= to);
        self.pending
            .extent_cuts
            .entry(ino)
            .or_default()
            .push((from, to));
    }

    /// Deletes the pairs with a key in `start..end`, in one op whatever their number.
    pub(super) fn cut_kv(&mut self, start: Vec<u8>, end: Vec<u8>) {
        if start >= end {
            return;
        }
        let doomed: Vec<Vec<u8>> = self
            .pending
            .kv
            .range(start.clone()..end.clone())
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.pending.kv.remove(&k);
        }
        self.pending.kv_cuts.push((start, end));
    }

    pub(super) fn kv_get(&self, key: &[u8]) -> Option<Vec<u8>> {
        for batch in self.newest_first() {
            if let Some(v) = batch.kv.get(key) {
                return v.clone();
            }
            if batch.cuts_key(key) {
                return None;
            }
        }
        self.committed.kv_get(key).cloned()
    }

    /// The pairs with a key in `start..end` (to the last key when `end` is None), in key
    /// order, at most `limit` of them: one consistent view, as the caller holds the lock.
    pub(super) fn kv_range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        use std::ops::Bound;
        let upper = match end {
            Some(e) => Bound::Excluded(e.to_vec()),
            None => Bound::Unbounded,
        };
        let bounds = (Bound::Included(start.to_vec()), upper);
        // What the unflushed batches say in the range, oldest first so that newer wins; small
        // next to the committed map, which is walked lazily below.
        let mut overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut cuts: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for batch in self.oldest_first() {
            for (s, e) in &batch.kv_cuts {
                overlay.retain(|k, _| !(s <= k && k < e));
                cuts.push((s.clone(), e.clone()));
            }
            for (k, v) in batch.kv.range::<Vec<u8>, _>(bounds.clone()) {
                overlay.insert(k.clone(), v.clone());
            }
        }
        let cut = |k: &Vec<u8>| cuts.iter().any(|(s, e)| s <= k && k < e);
        let mut committed = self
            .committed
            .kv_bounds(bounds)
            .filter(|(k, _)| !cut(k))
            .peekable();
        let mut overlay = overlay.into_iter().peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let take_overlay = match (committed.peek(), overlay.peek()) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((ck, _)), Some((ok, _))) => ok <= *ck,
            };
            if take_overlay {
                let (k, v) = overlay.next().expect("peeked");
                if committed.peek().is_some_and(|(ck, _)| **ck == k) {
                    committed.next();
                }
                if let Some(v) = v {
                    out.push((k, v));
                }
            } else {
                let (k, v) = committed.next().expect("peeked");
                out.push((k.clone(), v.clone()));
            }
        }
        out
    }
}
