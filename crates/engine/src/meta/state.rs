//! The committed metadata: the runs of the newest manifest (the base, read on demand through
//! the block cache), under the changes of the interval being checkpointed (frozen) and of the
//! interval since (mem), both in memory and bounded by the checkpoint interval.
//!
//! Memory is therefore the block cache, the runs' indexes, the object table and two intervals
//! of changes, whatever the bucket holds (docs/0003-metadata-lsm.md).

use super::mem::{Here, MemTable};
use super::objects::{Deltas, ObjectTable};
use super::{run_key, ExtentPtr, MetaOp};
use crate::logobj::RunInfo;
use crate::lsm::merge::{self, Source};
use crate::lsm::run::RunReader;
use crate::lsm::{MemRun, RunError};
use parking_lot::Mutex;
use std::sync::Arc;

/// The runs one manifest names and the object table as of it. Immutable: a checkpoint makes a
/// new one.
#[derive(Default)]
pub struct Base {
    /// Newest first.
    pub runs: Vec<Arc<RunReader>>,
    /// Oldest first, as the manifest names them.
    pub infos: Vec<RunInfo>,
    pub objects: ObjectTable,
    /// The log object the manifest covers (0: none yet).
    pub manifest_seq: u64,
    /// The sweep of the bottom run under way (engine/compaction.rs), as the manifest records it.
    pub sweep: Option<BottomSweep>,
}

/// A sweep of the bottom run: the checkpoint that began it (every delta of that id or older is
/// in what has been merged) and the next key to merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BottomSweep {
    pub first_seq: u64,
    pub from: Vec<u8>,
}

impl Base {
    pub fn sources(&self) -> Vec<Source<'_>> {
        self.runs.iter().map(|r| Source::Run(r.as_ref())).collect()
    }

    pub async fn extent(&self, ino: u64, index: u64) -> Result<Option<ExtentPtr>, RunError> {
        let value = merge::get_in(&self.sources(), &run_key::extent(ino, index)).await?;
        Ok(value.as_deref().and_then(run_key::parse_ptr))
    }

    pub async fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, RunError> {
        merge::get_in(&self.sources(), &run_key::kv(key)).await
    }

    /// Reads the blocks that lookups of `keys` (sorted) will need into the block cache,
    /// `RUN_PREFETCH_CONCURRENCY` at a time.
    pub async fn prefetch(&self, keys: &[Vec<u8>]) -> Result<(), RunError> {
        let mut wanted: Vec<(&RunReader, usize)> = Vec::new();
        for run in &self.runs {
            let mut last = None;
            for key in keys {
                let block = run.block_from(key);
                if block < run.block_count()
                    && run.block_first_key(block) <= key.as_slice()
                    && last != Some(block)
                {
                    wanted.push((run, block));
                    last = Some(block);
                }
            }
        }
        for group in wanted.chunks(crate::limits::RUN_PREFETCH_CONCURRENCY) {
            let reads = group.iter().map(|&(run, block)| run.block(block));
            futures::future::try_join_all(reads).await?;
        }
        Ok(())
    }

    /// Memory the open runs keep (their indexes).
    pub fn index_bytes(&self) -> usize {
        self.runs.iter().map(|r| r.index_bytes()).sum()
    }
}

/// One layer's key-value pairs (a deletion is `None`) and its cuts.
pub type KvLayer<'a> = (
    &'a std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    &'a crate::lsm::RangeSet,
);

/// An interval of changes being checkpointed, as of log object `seq`.
pub struct Frozen {
    pub seq: u64,
    pub mem: MemTable,
    /// What the interval's shadowed pointers debit, once looked up (`resolve`).
    resolved: Mutex<Option<Deltas>>,
}

impl Frozen {
    pub fn resolved(&self) -> Option<Deltas> {
        self.resolved.lock().clone()
    }
}

pub struct MetaState {
    mem: MemTable,
    frozen: Option<Arc<Frozen>>,
    base: Arc<Base>,
    /// Live bytes and extents per object now (what the collector goes by): the base's table
    /// with every interval's credits and debits applied, except the debits of pointers still
    /// to be looked up, so an object is never thought dead too early.
    live: ObjectTable,
}

impl Default for MetaState {
    fn default() -> Self {
        MetaState::new(Arc::new(Base::default()))
    }
}

impl MetaState {
    pub fn new(base: Arc<Base>) -> MetaState {
        MetaState {
            mem: MemTable::default(),
            frozen: None,
            live: base.objects.clone(),
            base,
        }
    }

    pub fn apply(&mut self, op: &MetaOp) {
        match op {
            MetaOp::KvPut { key, value } => {
                self.mem.kv.insert(key.clone(), Some(value.clone()));
            }
            MetaOp::KvDelete { key } => {
                self.mem.kv.insert(key.clone(), None);
            }
            MetaOp::ExtentSet { ino, index, ptr } => {
                self.credit(*ptr);
                self.replace(*ino, *index, Some(*ptr));
            }
            MetaOp::ExtentClear { ino, index } => self.replace(*ino, *index, None),
            MetaOp::ExtentClearRange { ino, from, to } => {
                if from >= to {
                    return;
                }
                let doomed: Vec<((u64, u64), Option<ExtentPtr>)> = self
                    .mem
                    .extents
                    .range((*ino, *from)..(*ino, *to))
                    .map(|(k, v)| (*k, *v))
                    .collect();
                for (key, ptr) in doomed {
                    self.mem.extents.remove(&key);
                    if let Some(ptr) = ptr {
                        self.debit(ptr);
                    }
                }
                // The cut's own lookup finds their older pointers.
                let shadowed: Vec<(u64, u64)> = self
                    .mem
                    .shadowed
                    .range((*ino, *from)..(*ino, *to))
                    .copied()
                    .collect();
                for key in shadowed {
                    self.mem.shadowed.remove(&key);
                }
                self.mem
                    .extent_cuts
                    .entry(*ino)
                    .or_default()
                    .push((*from, *to));
            }
            MetaOp::KvDeleteRange { start, end } => {
                if start >= end {
                    return;
                }
                let doomed: Vec<Vec<u8>> = self
                    .mem
                    .kv
                    .range(start.clone()..end.clone())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in doomed {
                    self.mem.kv.remove(&k);
                }
                self.mem.kv_cuts.insert(start.clone(), end.clone());
            }
            MetaOp::HoldsLz4 { seq } => {
                // Only a live object is worth re-sealing (its frames may all have been
                // overwritten within the very batch that wrote them).
                self.live.mark_lz4(*seq);
                self.mem.lz4.insert(*seq);
            }
        }
    }

    /// Sets or clears one extent's pointer in `mem`, debiting the pointer it replaces there, or
    /// noting that an older layer's is to be debited once looked up.
    fn replace(&mut self, ino: u64, index: u64, new: Option<ExtentPtr>) {
        match self.mem.extents.insert((ino, index), new) {
            Some(Some(old)) => self.debit(old),
            // Cleared in this interval: what was older is accounted for already.
            Some(None) => {}
            None => {
                if !self.mem.cuts_extent(ino, index) {
                    self.mem.shadowed.insert((ino, index));
                }
            }
        }
    }

    fn credit(&mut self, ptr: ExtentPtr) {
        self.live.credit(ptr);
        let d = self.mem.deltas.entry(ptr.seq).or_default();
        d.0 += i64::from(ptr.length);
        d.1 += 1;
    }

    fn debit(&mut self, ptr: ExtentPtr) {
        self.live.debit(ptr);
        let d = self.mem.deltas.entry(ptr.seq).or_default();
        d.0 -= i64::from(ptr.length);
        d.1 -= 1;
    }

    /// What the layers in memory say of an extent; `NotHere`: ask the base.
    pub fn extent(&self, ino: u64, index: u64) -> Here<ExtentPtr> {
        for layer in self.memory_layers() {
            if let Here::Is(v) = layer.extent(ino, index) {
                return Here::Is(v);
            }
        }
        Here::NotHere
    }

    /// What the layers in memory say of a key; `NotHere`: ask the base.
    pub fn kv(&self, key: &[u8]) -> Here<Vec<u8>> {
        for layer in self.memory_layers() {
            if let Here::Is(v) = layer.kv(key) {
                return Here::Is(v.cloned());
            }
        }
        Here::NotHere
    }

    /// The layers in memory, newest first.
    pub fn memory_layers(&self) -> impl Iterator<Item = &MemTable> {
        std::iter::once(&self.mem).chain(self.frozen.as_deref().map(|f| &f.mem))
    }

    /// The key-value pairs and key cuts of the layers in memory, newest first.
    pub fn kv_layers(&self) -> impl Iterator<Item = KvLayer<'_>> {
        self.memory_layers().map(|m| (&m.kv, &m.kv_cuts))
    }

    /// The layers in memory as runs restricted to run keys `start..end`, newest first.
    pub fn layer_runs(&self, start: &[u8], end: &[u8]) -> Vec<MemRun> {
        self.memory_layers()
            .map(|m| m.to_run(Some((start, end))))
            .collect()
    }

    pub fn base(&self) -> &Arc<Base> {
        &self.base
    }

    pub fn live(&self) -> &ObjectTable {
        &self.live
    }

    pub fn frozen(&self) -> Option<&Arc<Frozen>> {
        self.frozen.as_ref()
    }

    /// Starts the checkpoint of the changes so far, as of log object `seq`; a checkpoint that
    /// failed is retried first, as of its own log object.
    pub fn freeze(&mut self, seq: u64) -> Arc<Frozen> {
        if let Some(f) = &self.frozen {
            return f.clone();
        }
        let frozen = Arc::new(Frozen {
            seq,
            mem: std::mem::take(&mut self.mem),
            resolved: Mutex::new(None),
        });
        self.frozen = Some(frozen.clone());
        frozen
    }

    /// Records what the lookups of `frozen`'s shadowed pointers debit, once.
    pub fn resolve(&mut self, frozen: &Frozen, debits: &Deltas) -> Deltas {
        let mut resolved = frozen.resolved.lock();
        if let Some(done) = &*resolved {
            return done.clone();
        }
        self.live.apply(debits);
        *resolved = Some(debits.clone());
        debits.clone()
    }

    /// Makes `base`, which holds `frozen`'s changes, the committed base.
    pub fn install(&mut self, frozen: &Arc<Frozen>, base: Arc<Base>) {
        assert!(
            self.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, frozen)),
            "the checkpoint installed is the one frozen"
        );
        self.frozen = None;
        self.base = base;
    }

    pub fn memory_bytes(&self) -> usize {
        self.memory_layers().map(MemTable::bytes).sum::<usize>() + self.base.index_bytes()
    }
}

/// Looks up the older pointers `frozen` replaced or cut, in `base` (the state before it), and
/// returns what they debit per object.
pub async fn resolve(frozen: &Frozen, base: &Base) -> Result<Deltas, RunError> {
    let mut debits = Deltas::new();
    let mut debit = |ptr: ExtentPtr| {
        let d = debits.entry(ptr.seq).or_default();
        d.0 -= i64::from(ptr.length);
        d.1 -= 1;
    };
    if base.runs.is_empty() {
        return Ok(debits);
    }
    let sources = base.sources();
    let shadowed: Vec<(u64, u64)> = frozen.mem.shadowed.iter().copied().collect();
    for chunk in shadowed.chunks(crate::limits::RUN_PREFETCH_KEYS) {
        let keys: Vec<Vec<u8>> = chunk
            .iter()
            .map(|&(ino, index)| run_key::extent(ino, index))
            .collect();
        base.prefetch(&keys).await?;
        for &(ino, index) in chunk {
            if let Some(ptr) = base.extent(ino, index).await? {
                debit(ptr);
            }
        }
    }
    for (ino, cuts) in &frozen.mem.extent_cuts {
        // Overlapping cuts are looked up once.
        let mut cuts = cuts.clone();
        cuts.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (from, to) in cuts {
            match merged.last_mut() {
                Some(last) if from <= last.1 => last.1 = last.1.max(to),
                _ => merged.push((from, to)),
            }
        }
        for (from, to) in merged {
            let (start, end) = (run_key::extent(*ino, from), run_key::extent(*ino, to));
            let mut bad = false;
            merge::for_each_live_in(&sources, &start, Some(&end), |_, value| {
                match run_key::parse_ptr(value) {
                    Some(ptr) => debit(ptr),
                    None => bad = true,
                }
                !bad
            })
            .await?;
            if bad {
                return Err(RunError::Block {
                    key: "run".into(),
                    block: u64::MAX,
                    why: "an extent pointer of the wrong length",
                });
            }
        }
    }
    Ok(debits)
}

/// The object table as of `frozen`'s log object: the base's, with the interval's credits and
/// debits (`debits` from `resolve`) and lz4 marks.
pub fn table_after(base: &Base, frozen: &Frozen, debits: &Deltas) -> ObjectTable {
    let mut table = base.objects.clone();
    table.apply(&frozen.mem.deltas);
    table.apply(debits);
    for seq in &frozen.mem.lz4 {
        table.mark_lz4(*seq);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{open_url, PutMode, SharedBucket};
    use crate::crypto::{Cipher, DataKey, Sealer};
    use crate::lsm::merge::compact_in;
    use std::collections::BTreeMap;

    type Model = BTreeMap<(u64, u64), ExtentPtr>;

    /// Live bytes and extents per object, lz4 marks aside.
    fn counts(t: &ObjectTable) -> Vec<(u64, u64, u64)> {
        t.iter()
            .map(|(s, i)| (s, i.live_bytes, i.live_extents))
            .collect()
    }

    fn recount(model: &Model) -> Vec<(u64, u64, u64)> {
        let mut t = ObjectTable::default();
        for p in model.values() {
            t.credit(*p);
        }
        counts(&t)
    }

    struct Ops {
        rng: u64,
        seq: u64,
        offset: u32,
    }

    impl Ops {
        fn next(&mut self, n: u64) -> u64 {
            self.rng = self
                .rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.rng >> 33) % n
        }

        /// One log object's worth of random ops, applied to the state and the model.
        fn object(&mut self, state: &mut MetaState, model: &mut Model) {
            self.seq += 1;
            self.offset = 0;
            for _ in 0..1 + self.next(12) {
                let (ino, index) = (1 + self.next(3), self.next(48));
                let op = match self.next(20) {
                    0..=13 => {
                        let ptr = ExtentPtr {
                            seq: self.seq,
                            offset: self.offset,
                            length: 100 + self.next(50) as u32,
                        };
                        self.offset += ptr.length;
                        model.insert((ino, index), ptr);
                        MetaOp::ExtentSet { ino, index, ptr }
                    }
                    14..=17 => {
                        model.remove(&(ino, index));
                        MetaOp::ExtentClear { ino, index }
                    }
                    18 => {
                        let to = index + self.next(20);
                        model.retain(|&(i, x), _| i != ino || x < index || x >= to);
                        MetaOp::ExtentClearRange {
                            ino,
                            from: index,
                            to,
                        }
                    }
                    _ => MetaOp::HoldsLz4 { seq: self.seq },
                };
                state.apply(&op);
            }
        }
    }

    /// Writes `frozen` as a run over `base` (merged with all of it when `whole`), as a
    /// checkpoint does, and returns the new base.
    async fn checkpoint(
        bucket: &SharedBucket,
        sealer: &Arc<Sealer>,
        state: &mut MetaState,
        frozen: &Arc<Frozen>,
        whole: bool,
    ) -> ObjectTable {
        let base = state.base().clone();
        let debits = resolve(frozen, &base).await.unwrap();
        let debits = state.resolve(frozen, &debits);
        let table = table_after(&base, frozen, &debits);
        let run = frozen.mem.to_run(None);
        let (points, ranges) = if whole {
            let mut sources = vec![Source::Mem(&run)];
            sources.extend(base.sources());
            compact_in(&sources, true, |_| true).await.unwrap()
        } else {
            (run.points.clone().into_iter().collect(), run.ranges.clone())
        };
        let id = frozen.seq;
        let key = format!("run/{id:020}");
        let bytes = crate::lsm::run::encode(sealer, id, points, &ranges);
        let reader =
            RunReader::from_object(bucket.clone(), sealer.clone(), &key, id, &bytes).unwrap();
        bucket
            .put(&key, bytes.into(), PutMode::Create)
            .await
            .unwrap();
        let mut runs = if whole { Vec::new() } else { base.runs.clone() };
        runs.insert(0, Arc::new(reader));
        state.install(
            frozen,
            Arc::new(Base {
                runs,
                infos: Vec::new(),
                objects: table.clone(),
                manifest_seq: id,
                sweep: None,
            }),
        );
        table
    }

    #[tokio::test]
    async fn live_counts_and_lookups_match_a_recount_across_checkpoints() {
        let bucket: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
        let sealer = Arc::new(Sealer::new(&DataKey::for_tests(3), Cipher::Aes256GcmBlake3));
        let mut state = MetaState::default();
        let mut model = Model::new();
        let mut ops = Ops {
            rng: 7,
            seq: 0,
            offset: 0,
        };
        for round in 0..16 {
            for _ in 0..40 {
                ops.object(&mut state, &mut model);
            }
            let frozen = state.freeze(ops.seq);
            let at_freeze = model.clone();
            // Commits go on while the checkpoint runs: they land in a new interval.
            for _ in 0..10 {
                ops.object(&mut state, &mut model);
            }
            let table = checkpoint(&bucket, &sealer, &mut state, &frozen, round % 5 == 4).await;
            assert_eq!(
                counts(&table),
                recount(&at_freeze),
                "the table as of round {round}"
            );
            for ino in 1..4 {
                for index in 0..48 {
                    let want = model.get(&(ino, index)).copied();
                    let got = match state.extent(ino, index) {
                        Here::Is(p) => p,
                        Here::NotHere => state.base().extent(ino, index).await.unwrap(),
                    };
                    assert_eq!(got, want, "extent {ino}/{index} after round {round}");
                }
            }
        }
        // With every interval checkpointed, what is live now is exact.
        let frozen = state.freeze(ops.seq);
        checkpoint(&bucket, &sealer, &mut state, &frozen, false).await;
        assert_eq!(counts(state.live()), recount(&model));
    }
}
