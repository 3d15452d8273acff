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
#[derive(Default, Clone)]
pub(super) struct Batch {
    /// In (inode, index) order, so that one file's entries are a range: a scoped barrier or a
    /// cut reads its own file's entries, not every file's unflushed data.
    pub(super) extents: BTreeMap<(u64, u64), Dirty>,
    pub(super) kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Extent index ranges `from..to` cut, per inode.
    pub(super) extent_cuts: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Key ranges `start..end` cut, as the keys they cover.
    pub(super) kv_cuts: crate::lsm::RangeSet,
    pub(super) gen: u64,
    /// With journaled barriers (engine/journaled.rs): the number of the newest frozen batch
    /// this one holds, 0 for none.
    pub(super) number: u64,
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
        self.kv_cuts.covers(key)
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
                start: start.to_vec(),
                end: end.to_vec(),
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

    /// Applies a batch frozen after this one on top of it, so that the result holds both, as
    /// one: `later`'s cuts remove what this one holds in their ranges (as `State::cut_kv` and
    /// `State::cut_extents` do in `pending`), then its entries replace this one's.
    pub(super) fn absorb(&mut self, later: Batch) {
        for (start, end) in later.kv_cuts.iter() {
            self.cut_kv(start.to_vec(), end.to_vec());
        }
        for (ino, cuts) in later.extent_cuts {
            for (from, to) in cuts {
                self.cut_extents(ino, from, to);
            }
        }
        self.kv.extend(later.kv);
        self.extents.extend(later.extents);
        self.gen = later.gen;
        self.number = self.number.max(later.number);
    }

    /// Deallocates the extents of `ino` with an index in `from..to`, in one op whatever
    /// their number: the batch's own entries in the range go, and the cut hides older ones.
    pub(super) fn cut_extents(&mut self, ino: u64, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let doomed: Vec<(u64, u64)> = self
            .extents
            .range((ino, from)..(ino, to))
            .map(|(k, _)| *k)
            .collect();
        for k in doomed {
            self.extents.remove(&k);
        }
        self.extent_cuts.entry(ino).or_default().push((from, to));
    }

    /// Deletes the pairs with a key in `start..end`, in one op whatever their number.
    pub(super) fn cut_kv(&mut self, start: Vec<u8>, end: Vec<u8>) {
        if start >= end {
            return;
        }
        let doomed: Vec<Vec<u8>> = self
            .kv
            .range(start.clone()..end.clone())
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.kv.remove(&k);
        }
        self.kv_cuts.insert(start, end);
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
    pub(super) clean: super::clean::CleanCache,
    /// The number the next non-empty frozen batch gets; the bucket's `COVERED_KEY` says the
    /// newest it holds (engine/journaled.rs, engine/scoped.rs).
    pub(super) next_batch: u64,
    /// Per scope (inode), the write generation of the newest transaction that changed it
    /// together with other scopes (`Txn::shared_by`); entries the bucket holds are pruned.
    pub(super) shared: HashMap<u64, u64>,
}

pub(super) enum Found {
    Data(Arc<Vec<u8>>),
    Zero,
    Stored(ExtentPtr),
    /// Not in memory: the committed base's runs say (`Base::extent`).
    InBase,
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
    pub(super) fn find(&self, ino: u64, index: u64) -> Found {
        let key = (ino, index);
        for batch in self.newest_first() {
            match batch.extents.get(&key) {
                Some(Dirty::Data(d) | Dirty::Moved(d)) => return Found::Data(d.clone()),
                Some(Dirty::Hole) => return Found::Zero,
                None if batch.cuts_extent(ino, index) => return Found::Zero,
                None => {}
            }
        }
        if let Some(d) = self.clean.get(key) {
            return Found::Data(d);
        }
        match self.committed.extent(ino, index) {
            Here::Is(Some(ptr)) => Found::Stored(ptr),
            Here::Is(None) => Found::Zero,
            Here::NotHere => Found::InBase,
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
        // Unknown without a lookup in the base's runs: a hole entry clears whatever is there.
        let older =
            older.unwrap_or_else(|| !matches!(self.committed.extent(ino, index), Here::Is(None)));
        if older {
            self.pending.extents.insert(key, Dirty::Hole);
        } else {
            self.pending.extents.remove(&key);
        }
    }

    /// Deallocates the extents of `ino` with an index in `from..to` (`Batch::cut_extents`).
    pub(super) fn cut_extents(&mut self, ino: u64, from: u64, to: u64) {
        self.pending.cut_extents(ino, from, to);
    }

    /// Deletes the pairs with a key in `start..end` (`Batch::cut_kv`).
    pub(super) fn cut_kv(&mut self, start: Vec<u8>, end: Vec<u8>) {
        self.pending.cut_kv(start, end);
    }

    /// What memory says of a key; `NotHere`: the committed base's runs say.
    pub(super) fn kv_get(&self, key: &[u8]) -> Here<Vec<u8>> {
        for batch in self.newest_first() {
            if let Some(v) = batch.kv.get(key) {
                return Here::Is(v.clone());
            }
            if batch.cuts_key(key) {
                return Here::Is(None);
            }
        }
        self.committed.kv(key)
    }

    /// Everything memory holds of run keys `start..end` (all of one kind: key-value pairs or
    /// the extents of one inode) that a scan of at most `limit` entries may need, as layers
    /// newest first, with the base under them: one consistent view to read outside the lock.
    pub(super) fn snapshot(&self, start: &[u8], end: &[u8], limit: usize) -> Snapshot {
        let end = &self.kv_scan_end(start, end, limit);
        let mut layers: Vec<MemRun> = self
            .newest_first()
            .map(|b| batch_run(b, start, end))
            .collect();
        layers.extend(self.committed.layer_runs(start, end));
        Snapshot {
            layers,
            base: self.committed.base().clone(),
            start: start.to_vec(),
            end: end.to_vec(),
        }
    }

    /// For a scan of key-value run keys `start..end`: the key just past the `limit`-th key that
    /// memory holds live in the range, or `end` when it holds fewer. Those keys are in the
    /// scan's answer whatever the base holds, so nothing beyond them can be: a page of a large
    /// directory created since the last checkpoint copies a page's worth, not the directory.
    fn kv_scan_end(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<u8> {
        use crate::meta::run_key;
        use std::ops::Bound;
        let Some(raw_start) = run_key::parse_kv(start).filter(|_| limit < usize::MAX) else {
            return end.to_vec();
        };
        let upper = run_key::parse_kv(end).map_or(Bound::Unbounded, Bound::Excluded);
        let mut layers: Vec<crate::meta::KvLayer<'_>> =
            self.newest_first().map(|b| (&b.kv, &b.kv_cuts)).collect();
        layers.extend(self.committed.kv_layers());
        let mut heads: Vec<_> = layers
            .iter()
            .map(|(kv, _)| {
                kv.range::<[u8], _>((Bound::Included(raw_start), upper))
                    .map(|(k, _)| k)
                    .peekable()
            })
            .collect();
        let mut live = 0;
        loop {
            let Some(key) = heads.iter_mut().filter_map(|h| h.peek().copied()).min() else {
                return end.to_vec();
            };
            // The newest layer that has the key, or cuts it, decides.
            let is_live = layers.iter().find_map(|(kv, cuts)| match kv.get(key) {
                Some(v) => Some(v.is_some()),
                None => cuts.covers(key).then_some(false),
            });
            if is_live == Some(true) {
                live += 1;
                if live == limit {
                    let mut past = run_key::kv(key);
                    past.push(0);
                    return past;
                }
            }
            for h in &mut heads {
                if h.peek() == Some(&key) {
                    h.next();
                }
            }
        }
    }
}

/// A batch's entries among run keys `start..end`. Extents hold no pointer yet: a written one
/// is a put with an empty value.
fn batch_run(batch: &Batch, start: &[u8], end: &[u8]) -> MemRun {
    use crate::lsm::Entry;
    use crate::meta::run_key;
    let inside = |k: &[u8]| start <= k && k < end;
    let mut run = MemRun::default();
    let mut range = |s: Vec<u8>, e: Vec<u8>| {
        if s.as_slice() < end && start < e.as_slice() {
            run.ranges.insert(s, e);
        }
    };
    for (ino, cuts) in &batch.extent_cuts {
        for &(from, to) in cuts {
            range(run_key::extent(*ino, from), run_key::extent(*ino, to));
        }
    }
    for (s, e) in batch.kv_cuts.iter() {
        range(run_key::kv(s), run_key::kv(e));
    }
    match (run_key::parse_extent(start), run_key::parse_kv(start)) {
        (Some(_), _) => {
            for (&(ino, index), d) in &batch.extents {
                let key = run_key::extent(ino, index);
                if inside(&key) {
                    let entry = match d {
                        Dirty::Data(_) | Dirty::Moved(_) => Entry::Put(Vec::new()),
                        Dirty::Hole => Entry::Delete,
                    };
                    run.points.insert(key, entry);
                }
            }
        }
        (None, Some(raw_start)) => {
            // `end` is a key-value key, or the first key after them all.
            let upper = match run_key::parse_kv(end) {
                Some(e) => std::ops::Bound::Excluded(e),
                None => std::ops::Bound::Unbounded,
            };
            for (k, v) in batch
                .kv
                .range::<[u8], _>((std::ops::Bound::Included(raw_start), upper))
            {
                let entry = v.clone().map_or(Entry::Delete, Entry::Put);
                run.points.insert(run_key::kv(k), entry);
            }
        }
        (None, None) => {}
    }
    run
}

/// What `State::snapshot` took: read it with `scan`, outside the lock.
pub(super) struct Snapshot {
    layers: Vec<MemRun>,
    pub(super) base: Arc<Base>,
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Snapshot {
    /// Up to `limit` live entries (run keys and values), in key order.
    pub(super) async fn scan(
        &self,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, crate::lsm::RunError> {
        use crate::lsm::merge::{scan_in, Source};
        let mut sources: Vec<Source<'_>> = self.layers.iter().map(Source::Mem).collect();
        sources.extend(self.base.sources());
        scan_in(&sources, &self.start, Some(&self.end), limit, |_| false).await
    }
}
