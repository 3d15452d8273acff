//! Which runs a checkpoint writes (docs/0003, "Compaction"), so that no checkpoint's work grows
//! with the bucket:
//!
//! - **Deltas in size tiers.** The interval's changes become a delta run. When the newest
//!   `Tuning::delta_runs_per_merge` deltas together outweigh the next older one, they are merged
//!   with it into one delta (range deletions kept), up to `Tuning::run_part_bytes`: deltas stay
//!   few, and each entry is rewritten a few times, not once per checkpoint.
//! - **The bottom in slices.** The bottom run is parts with disjoint key ranges, all of one id.
//!   Once the deltas weigh `Tuning::sweep_after_delta_percent` of the bottom (or number half of `RUNS_PER_MANIFEST_MAX`), a sweep
//!   begins: each checkpoint merges every delta into the next parts in key order, about
//!   `Tuning::run_merge_bytes_per_checkpoint` of them, and replaces those parts with new parts of
//!   the same id. A delta is dropped once a sweep that began after it was written has passed
//!   over every key. A lookup stays right meanwhile: a delta above a merged part holds the
//!   same or an older decision than the part, and the deltas newer than it decide first.

use super::*;
use crate::lsm::merge::Source;
use crate::lsm::{Entry, RangeSet};
use crate::meta::BottomSweep;

/// Part numbers share a run's seal id with its id (`logobj::run_seal_id`, below 2^24): past
/// this one the bottom is rewritten under a new id.
const RUN_PARTS_REWRITE_AT: u32 = 1 << 20;

/// What `merge_parts` writes: parts of the bottom (`only`: the bottom has no other parts, so
/// one is written even if empty), or of a delta with these range deletions.
#[derive(Clone, Copy)]
enum Parts<'a> {
    Bottom { only: bool },
    Delta(&'a RangeSet),
}

/// A part of the bottom run, with its first key (none: the part is empty).
struct BottomPart {
    first: Option<Vec<u8>>,
    info: RunInfo,
    run: Arc<RunReader>,
}

/// The runs a checkpoint's manifest names, and what it took to write them.
pub(super) struct RunLayout {
    /// As the manifest lists them: the bottom's parts, then the deltas, by (id, part).
    pub(super) infos: Vec<RunInfo>,
    /// Newest first (the manifest's order reversed).
    pub(super) runs: Vec<Arc<RunReader>>,
    pub(super) bytes_written: u64,
    /// The bottom run was (partly) rewritten.
    pub(super) merged: bool,
    /// The sweep to go on with at the next checkpoint, once this one's manifest is stored.
    pub(super) sweep: Option<BottomSweep>,
}

/// How many of `older` (existing deltas' sizes, newest first) to merge with a new delta of
/// `new` bytes: the most such that each merged run weighs no more than the newer ones together,
/// at least `fanout - 1` of them, and the whole within `cap`.
pub(super) fn deltas_to_merge(new: u64, older: &[u64], fanout: usize, cap: u64) -> usize {
    let (mut take, mut weight) = (0, new);
    for (i, &size) in older.iter().enumerate() {
        if weight < size || weight + size > cap {
            break;
        }
        weight += size;
        if i + 2 >= fanout {
            take = i + 1;
        }
    }
    take
}

/// Where a sweep's step that begins at `from` ends (none: at the last key): at the first key
/// past `budget` stored bytes of blocks, counting the bottom's parts and every delta's blocks
/// from `from` on, where no part of the bottom straddles it (a part is merged whole or not at
/// all). Counting the deltas too bounds a step where they hold far more than the bottom.
fn step_end(
    from: &[u8],
    parts: &[&BottomPart],
    deltas: &[Arc<RunReader>],
    budget: u64,
) -> Option<Vec<u8>> {
    let mut marks: Vec<(&[u8], u64)> = Vec::new();
    for run in parts.iter().map(|p| &p.run).chain(deltas) {
        for block in run.block_from(from)..run.block_count() {
            let first = run.block_first_key(block);
            if first >= from {
                marks.push((first, run.block_bytes(block)));
            }
        }
    }
    marks.sort_unstable();
    let straddled = |key: &[u8]| {
        parts.iter().any(|p| {
            p.first.as_deref().is_some_and(|first| first < key)
                && p.run.last_key().is_some_and(|last| key <= last)
        })
    };
    let mut bytes = 0;
    for (key, size) in marks {
        if bytes >= budget && key > from && !straddled(key) {
            return Some(key.to_vec());
        }
        bytes += size;
    }
    None
}

impl Engine {
    /// Writes the runs of `frozen`'s checkpoint over `base` (see the module's rules) and returns
    /// the layout its manifest names.
    pub(super) async fn write_runs(
        &self,
        frozen: &Arc<Frozen>,
        base: &Arc<Base>,
    ) -> Result<RunLayout, EngineError> {
        let seq = frozen.seq;
        let changes = frozen.mem.to_run(None);
        let Some(bottom_id) = base.infos.first().map(|r| r.id) else {
            // No runs yet: the changes are the whole map, and become the bottom.
            return self.rewrite_whole(&[Source::Mem(&changes)], seq).await;
        };
        // The base's runs by (id, part); the manifest lists them oldest first.
        let mut reader_of: HashMap<(u64, u32), Arc<RunReader>> = base
            .infos
            .iter()
            .zip(base.runs.iter().rev())
            .map(|(info, run)| ((info.id, info.part), run.clone()))
            .collect();
        let (bottom, deltas): (Vec<RunInfo>, Vec<RunInfo>) =
            base.infos.iter().partition(|r| r.id == bottom_id);
        let bottom_bytes: u64 = bottom.iter().map(|r| r.size_bytes).sum();
        let delta_bytes: u64 = deltas.iter().map(|r| r.size_bytes).sum();
        let mut sweep = base.sweep.clone();
        if sweep.is_none()
            && (delta_bytes * 100
                >= (bottom_bytes * self.inner.tuning.sweep_after_delta_percent).max(1)
                || deltas.len() >= RUNS_PER_MANIFEST_MAX / 2)
        {
            sweep = Some(BottomSweep {
                from: Vec::new(),
                first_seq: seq,
            });
        }
        let mut bytes_written = 0;

        // The sweep's step first: it merges every delta as the base holds them, and the changes.
        let mut new_bottom = bottom.clone();
        let mut merged = false;
        if let Some(s) = sweep.take() {
            let mut parts: Vec<BottomPart> = bottom
                .iter()
                .map(|info| {
                    let run = reader_of[&(info.id, info.part)].clone();
                    let first = (run.block_count() > 0).then(|| run.block_first_key(0).to_vec());
                    BottomPart {
                        first,
                        info: *info,
                        run,
                    }
                })
                .collect();
            // Empty parts own no keys: the first step takes them.
            parts.sort_by(|a, b| a.first.cmp(&b.first));
            let remaining: Vec<&BottomPart> = parts
                .iter()
                .filter(|p| match &p.first {
                    None => s.from.is_empty(),
                    Some(k) => *k >= s.from,
                })
                .collect();
            let remaining_bytes: u64 = remaining.iter().map(|p| p.info.size_bytes).sum();
            // Finish before the deltas reach the manifest's limit, whatever the budget.
            let steps_left = RUNS_PER_MANIFEST_MAX.saturating_sub(deltas.len() + 4) as u64;
            let budget = match steps_left {
                0 => u64::MAX,
                n => self
                    .inner
                    .tuning
                    .run_merge_bytes_per_checkpoint
                    .max(remaining_bytes.div_ceil(n)),
            };
            let delta_runs: Vec<Arc<RunReader>> = deltas
                .iter()
                .rev()
                .map(|d| reader_of[&(d.id, d.part)].clone())
                .collect();
            let end = step_end(&s.from, &remaining, &delta_runs, budget);
            let mut taken = Vec::new();
            for p in &remaining {
                let inside = match (&p.first, &end) {
                    (None, _) => true,
                    (Some(first), Some(end)) => first < end,
                    (Some(_), None) => true,
                };
                if inside {
                    taken.push((p.info, p.run.clone()));
                }
            }
            let mut sources = vec![Source::Mem(&changes)];
            sources.extend(delta_runs.iter().map(|r| Source::Run(r.as_ref())));
            sources.extend(taken.iter().map(|(_, r)| Source::Run(r.as_ref())));
            let first_part = self.next_part(bottom_id, &bottom).await?;
            if first_part >= RUN_PARTS_REWRITE_AT {
                // Part numbers would run out (they share the seal id with the run id): the
                // map is rewritten whole under a new id, once in a bucket's long life.
                let mut all = vec![Source::Mem(&changes)];
                all.extend(base.sources());
                return self.rewrite_whole(&all, seq).await;
            }
            let (infos, readers, bytes) = self
                .merge_parts(
                    &sources,
                    &s.from,
                    end.as_deref(),
                    bottom_id,
                    first_part,
                    Parts::Bottom {
                        only: taken.len() == bottom.len(),
                    },
                )
                .await?;
            bytes_written += bytes;
            new_bottom.retain(|b| !taken.iter().any(|(t, _)| t == b));
            new_bottom.extend(infos.iter().copied());
            for (info, reader) in infos.iter().zip(readers) {
                reader_of.insert((info.id, info.part), reader);
            }
            self.inner
                .counters
                .bottom_parts_merged
                .fetch_add(taken.len() as u64, Ordering::Relaxed);
            merged = true;
            sweep = match end {
                Some(from) => Some(BottomSweep { from, ..s }),
                None => {
                    self.inner
                        .counters
                        .bottom_sweeps_finished
                        .fetch_add(1, Ordering::Relaxed);
                    None
                }
            };
            if sweep.is_none() {
                // Every key has been merged with every delta as old as the sweep's start.
                let done = s.first_seq;
                let mut kept = deltas.clone();
                kept.retain(|d| d.id > done);
                return self
                    .finish_layout(
                        frozen,
                        &changes,
                        new_bottom,
                        kept,
                        reader_of,
                        None,
                        bytes_written,
                        merged,
                    )
                    .await;
            }
        }
        self.finish_layout(
            frozen,
            &changes,
            new_bottom,
            deltas,
            reader_of,
            sweep,
            bytes_written,
            merged,
        )
        .await
    }

    /// Merges `sources` (newest first: the changes and every run) into a new bottom run `seq`,
    /// the only run of the layout.
    async fn rewrite_whole(
        &self,
        sources: &[Source<'_>],
        seq: u64,
    ) -> Result<RunLayout, EngineError> {
        let (infos, readers, bytes) = self
            .merge_parts(sources, &[], None, seq, 0, Parts::Bottom { only: true })
            .await?;
        Ok(RunLayout {
            runs: readers.into_iter().rev().collect(),
            infos,
            bytes_written: bytes,
            merged: true,
            sweep: None,
        })
    }

    /// Writes the interval's delta (merged with the newest deltas when their tier is full) and
    /// puts the layout together.
    #[allow(clippy::too_many_arguments)]
    async fn finish_layout(
        &self,
        frozen: &Arc<Frozen>,
        changes: &MemRun,
        bottom: Vec<RunInfo>,
        mut deltas: Vec<RunInfo>,
        mut reader_of: HashMap<(u64, u32), Arc<RunReader>>,
        sweep: Option<BottomSweep>,
        mut bytes_written: u64,
        merged: bool,
    ) -> Result<RunLayout, EngineError> {
        let seq = frozen.seq;
        let (sealer, changes_) = (self.inner.sealer.clone(), changes.clone());
        let seal_id = logobj::run_seal_id(seq, 0);
        let object = self
            .inner
            .tasks
            .spawn_blocking(move || {
                let _bulk = crate::bulk::enter();
                crate::lsm::run::encode(&sealer, seal_id, changes_.points, &changes_.ranges)
            })
            .await;
        // The deltas by id (a merged delta has parts), oldest first. Those a sweep under way
        // has merged part of are left to it.
        let mut groups: Vec<(u64, u64)> = Vec::new();
        for d in &deltas {
            match groups.last_mut() {
                Some((id, bytes)) if *id == d.id => *bytes += d.size_bytes,
                _ => groups.push((d.id, d.size_bytes)),
            }
        }
        let mergeable: Vec<u64> = groups
            .iter()
            .rev()
            .take_while(|(id, _)| sweep.as_ref().is_none_or(|s| *id > s.first_seq))
            .map(|(_, bytes)| *bytes)
            .collect();
        let tuning = &self.inner.tuning;
        let take = deltas_to_merge(
            object.len() as u64,
            &mergeable,
            tuning.delta_runs_per_merge.max(2) as usize,
            tuning.run_merge_bytes_per_checkpoint,
        );
        if take > 0 {
            let first_merged = groups[groups.len() - take].0;
            let older = deltas.split_off(deltas.partition_point(|d| d.id < first_merged));
            let readers: Vec<Arc<RunReader>> = older
                .iter()
                .rev()
                .map(|d| reader_of[&(d.id, d.part)].clone())
                .collect();
            let mut sources = vec![Source::Mem(changes)];
            sources.extend(readers.iter().map(|r| Source::Run(r.as_ref())));
            // A range deletion of any merged run hides the runs below them all; the merged
            // run's points are newer than every one of them (the merge leaves out the hidden).
            let mut ranges = RangeSet::new();
            for s in &sources {
                ranges.extend_from(s.range_deletes());
            }
            let (infos, readers, bytes) = self
                .merge_parts(&sources, &[], None, seq, 0, Parts::Delta(&ranges))
                .await?;
            bytes_written += bytes;
            for (info, reader) in infos.iter().zip(readers) {
                reader_of.insert((info.id, info.part), reader);
            }
            deltas.extend(infos);
            self.inner
                .counters
                .delta_runs_merged
                .fetch_add(take as u64, Ordering::Relaxed);
        } else {
            let info = RunInfo {
                id: seq,
                part: 0,
                size_bytes: object.len() as u64,
            };
            bytes_written += info.size_bytes;
            let reader = Arc::new(self.store_run(info, object).await?);
            reader_of.insert((seq, 0), reader);
            deltas.push(info);
        }
        let mut infos = bottom;
        infos.sort_by_key(|r| (r.id, r.part));
        infos.extend(deltas);
        let runs = infos
            .iter()
            .rev()
            .map(|i| reader_of[&(i.id, i.part)].clone())
            .collect();
        Ok(RunLayout {
            infos,
            runs,
            bytes_written,
            merged,
            sweep,
        })
    }

    /// The first part number free for run `id`: above every part the base names and every part
    /// stored in the bucket (a part left by a failed checkpoint may be named by a pin).
    async fn next_part(&self, id: u64, named: &[RunInfo]) -> Result<u32, EngineError> {
        let mut next = named.iter().map(|r| r.part + 1).max().unwrap_or(0);
        for object in self.inner.bucket.list("run/").await? {
            if let Some((i, part)) = logobj::parse_run_key(&object.key) {
                if i == id {
                    next = next.max(part + 1);
                }
            }
        }
        Ok(next)
    }

    /// Merges `sources` (newest first) over `from..end` into parts `id.first_part`,
    /// `id.first_part + 1`, ... of about `Tuning::run_part_bytes` each, in key order, holding one
    /// part in memory at a time. In the bottom, deletions have nothing left to hide and are
    /// dropped, as are the lz4 marks of formats 2 and 3 (the object table keeps them now). A
    /// delta keeps its deletions, and its range deletions go in part 0, which readers ask after
    /// the others (the manifest's order reversed): they hide only older runs. Returns the parts
    /// (none when the range holds nothing, unless the bottom would have none) and their bytes.
    async fn merge_parts(
        &self,
        sources: &[Source<'_>],
        from: &[u8],
        end: Option<&[u8]>,
        id: u64,
        first_part: u32,
        parts: Parts<'_>,
    ) -> Result<(Vec<RunInfo>, Vec<Arc<RunReader>>, u64), EngineError> {
        let (keep_empty, bottom, ranges) = match parts {
            Parts::Bottom { only } => (only, true, &crate::lsm::ranges::EMPTY),
            Parts::Delta(ranges) => (true, false, ranges),
        };
        let part_bytes = self.inner.tuning.run_part_bytes;
        let (mut infos, mut readers, mut written) = (Vec::new(), Vec::new(), 0);
        let mut start: Vec<u8> = from.to_vec();
        for part in first_part.. {
            // Entries go straight into the sealed blocks of the part: a merge holds the part's
            // compressed object, not its entries.
            let mut w =
                crate::lsm::run::RunWriter::new(&self.inner.sealer, logobj::run_seal_id(id, part));
            let mut last: Option<Vec<u8>> = None;
            let mut full = false;
            crate::lsm::merge::merge_between(sources, &start, end, |key, entry| {
                if bottom
                    && (entry == Entry::Delete
                        || crate::meta::run_key::parse_lz4_object(&key).is_some())
                {
                    return true;
                }
                w.push(&key, &entry);
                last = Some(key);
                full = w.entry_bytes() >= part_bytes;
                !full
            })
            .await?;
            // An empty part is stored only when the bottom would otherwise have none.
            if w.count() == 0 && (part > first_part || !keep_empty) {
                break;
            }
            if let Some(mut last) = last {
                last.push(0);
                start = last;
            }
            let object = w.finish(if part == first_part {
                ranges
            } else {
                &crate::lsm::ranges::EMPTY
            });
            let info = RunInfo {
                id,
                part,
                size_bytes: object.len() as u64,
            };
            written += info.size_bytes;
            readers.push(Arc::new(self.store_run(info, object).await?));
            infos.push(info);
            if !full {
                break;
            }
        }
        Ok((infos, readers, written))
    }
}

#[cfg(test)]
mod tests {
    use super::deltas_to_merge;

    #[test]
    fn deltas_merge_in_tiers() {
        // Three equal deltas wait for a fourth; four merge; a heavier run waits for its weight.
        assert_eq!(deltas_to_merge(4, &[4, 4], 4, 1000), 0);
        assert_eq!(deltas_to_merge(4, &[4, 4, 4], 4, 1000), 3);
        assert_eq!(deltas_to_merge(4, &[4, 4, 16], 4, 1000), 0);
        assert_eq!(deltas_to_merge(4, &[4, 4, 4, 16], 4, 1000), 4);
        assert_eq!(deltas_to_merge(4, &[4, 4, 4, 32], 4, 1000), 3);
        // Never past the cap.
        assert_eq!(deltas_to_merge(4, &[4, 4, 4, 16], 4, 30), 3);
        assert_eq!(deltas_to_merge(4, &[4, 4, 4], 4, 15), 0);
    }
}
