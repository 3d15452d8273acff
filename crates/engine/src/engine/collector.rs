//! The collector's moves: extents rewritten, unchanged, out of log objects it wants dead
//! (sparse, fragmented, or holding long-lived lz4 frames).

use super::*;

/// Of `objects` (sequence number, live bytes, size in bytes), the fragmented ones (at most
/// `live_percent_max` percent live), least live first, as many as `budget` live bytes
/// allow (but at least one): moving their live bytes gives back the most space per byte moved.
pub(super) fn fragmented_objects(
    objects: &[(u64, u64, u64)],
    budget: u64,
    live_percent_max: u64,
) -> HashSet<u64> {
    let mut fragmented: Vec<(u64, u64, u64)> = objects
        .iter()
        .copied()
        .filter(|&(_, live, size)| live * 100 <= size * live_percent_max)
        .collect();
    // By live / size, compared without division.
    fragmented.sort_unstable_by(|a, b| {
        (u128::from(a.1) * u128::from(b.2)).cmp(&(u128::from(b.1) * u128::from(a.2)))
    });
    let mut moved = 0;
    let mut chosen = HashSet::new();
    for (seq, live, _) in fragmented {
        if !chosen.is_empty() && moved + live > budget {
            break;
        }
        moved += live;
        chosen.insert(seq);
    }
    chosen
}

/// The leading `extents` (sorted by object) of whole objects, as many objects as fit in `max`
/// extents (but at least one): moving part of an object would not let it die.
pub(super) fn whole_objects_up_to(
    extents: impl Iterator<Item = (u64, u64, ExtentPtr)>,
    max: usize,
) -> Vec<(u64, u64, ExtentPtr)> {
    let mut taken: Vec<(u64, u64, ExtentPtr)> = Vec::new();
    let mut object_start = 0;
    for extent in extents {
        if taken.last().is_some_and(|(_, _, p)| p.seq != extent.2.seq) {
            if taken.len() >= max {
                break;
            }
            object_start = taken.len();
        }
        taken.push(extent);
    }
    // The last object taken went past `max`: leave it, unless it is the only one.
    if taken.len() > max && object_start > 0 {
        taken.truncate(object_start);
    }
    taken
}

/// Whether a checkpoint's collection also moves extents out of objects (`Engine::repack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repack {
    Yes,
    No,
}

/// The live extent pointers of `sources` (newest first) from run key `from` on (the first
/// extent key when empty), in key order: `scan_max` of them at most, of which those `keep`
/// accepts are returned. Also returns the key the next slice starts from, or an empty one
/// once the scan reached the last extent.
pub(super) async fn extents_slice(
    sources: &[crate::lsm::merge::Source<'_>],
    from: &[u8],
    scan_max: u64,
    mut keep: impl FnMut(&ExtentPtr) -> bool,
) -> Result<(Vec<(u64, u64, ExtentPtr)>, Vec<u8>), EngineError> {
    use crate::meta::run_key;
    let first = run_key::extent(0, 0);
    let start = if from.is_empty() { &first[..] } else { from };
    let end = run_key::extents_end();
    let mut extents = Vec::new();
    let mut scanned = 0u64;
    let mut next = Vec::new();
    let mut malformed = false;
    crate::lsm::merge::for_each_live_in(sources, start, Some(&end), |k, v| {
        if scanned == scan_max {
            next = k.to_vec();
            return false;
        }
        scanned += 1;
        match (run_key::parse_extent(k), run_key::parse_ptr(v)) {
            (Some((ino, index)), Some(ptr)) => {
                if keep(&ptr) {
                    extents.push((ino, index, ptr));
                }
            }
            _ => malformed = true,
        }
        !malformed
    })
    .await?;
    if malformed {
        return Err(EngineError::Corrupt(
            "a metadata run holds a malformed extent pointer".into(),
        ));
    }
    Ok((extents, next))
}

impl Engine {
    /// Moves extents, unchanged, out of log objects the checkpoint `base` covers, into new
    /// log objects, so that the old ones die and the next checkpoint deletes them:
    /// - the extents of those `live` objects (sequence number to size in bytes) that hold only
    ///   a few (`Tuning::repack_live_extents_max`): a few extents that are never overwritten would
    ///   otherwise keep each object alive;
    /// - of the `live` objects `covered` finds aged (covered by a checkpoint begun at least
    ///   `reseal_after` ago), the fragmented ones (`fragmented_objects`), up to as many live
    ///   bytes as the log objects of the interval took (at least `repack_fragmented_bytes_min`,
    ///   at most `log_bytes_per_checkpoint`, the most an interval writes while it keeps up):
    ///   overwritten in place, a device's large objects would otherwise keep their garbage for
    ///   as long as a few of their extents stay;
    /// - with zstd configured, the extents of whole aged objects that hold lz4 frames: they
    ///   have been live that long, so they are likely to stay, and zstd stores them in about
    ///   half the bytes.
    ///
    /// The object table says which objects qualify. Their extents are found by a sweep over the
    /// base's extent pointers, `Tuning::repack_scan_extents_max` of them per checkpoint from
    /// where the last one stopped, so that a checkpoint's cost and memory stay bounded however
    /// large the map (docs/0003); an object whose extents lie in several slices dies once the
    /// sweep has passed them all. An extent written again meanwhile is left alone (the write
    /// kills its old frame anyway). Contents never change, so the atomic prefix a crash leaves
    /// is unaffected.
    pub(super) async fn repack(
        &self,
        base: &Arc<Base>,
        live: &HashMap<u64, u64>,
        covered: &Covered,
    ) -> Result<(), EngineError> {
        let t = &self.inner.tuning;
        let table = &base.objects;
        let few = t.repack_live_extents_max;
        let sparse_seqs: HashSet<u64> = live
            .keys()
            .copied()
            .filter(|s| (1..=few).contains(&table.get(*s).live_extents))
            .collect();
        let aged: Vec<(u64, u64, u64)> = live
            .iter()
            .filter(|(seq, _)| **seq <= covered.aged_through && !sparse_seqs.contains(seq))
            .map(|(seq, size)| (*seq, table.live_bytes(*seq), *size))
            .collect();
        let budget = covered
            .log_bytes
            .clamp(t.repack_fragmented_bytes_min, t.log_bytes_per_checkpoint);
        let fragmented_seqs = fragmented_objects(&aged, budget, t.repack_live_percent_max);
        // Sparse objects are repacking's, within its own budget: under fsync-heavy load they
        // are many, and re-sealing is for the dense ones.
        let lz4_seqs: HashSet<u64> = match self.inner.codec {
            Codec::Zstd => table
                .iter()
                .filter(|(s, i)| i.lz4 && *s <= covered.aged_through && i.live_extents > few)
                .map(|(s, _)| s)
                .collect(),
            Codec::Lz4 | Codec::None => HashSet::new(),
        };
        if sparse_seqs.is_empty() && fragmented_seqs.is_empty() && lz4_seqs.is_empty() {
            return Ok(());
        }
        let from = self.inner.repack_sweep_from.lock().clone();
        let (mut extents, next) =
            extents_slice(&base.sources(), &from, t.repack_scan_extents_max, |p| {
                sparse_seqs.contains(&p.seq)
                    || fragmented_seqs.contains(&p.seq)
                    || lz4_seqs.contains(&p.seq)
            })
            .await?;
        *self.inner.repack_sweep_from.lock() = next;
        self.inner
            .counters
            .repack_sweeps_started
            .fetch_add(u64::from(from.is_empty()), Ordering::Relaxed);
        extents.sort_unstable_by_key(|(_, _, p)| (p.seq, p.offset));
        let of = |seqs: &HashSet<u64>| -> Vec<(u64, u64, ExtentPtr)> {
            extents
                .iter()
                .copied()
                .filter(|(_, _, p)| seqs.contains(&p.seq))
                .collect()
        };
        let mut sparse = of(&sparse_seqs);
        sparse.truncate(t.repack_extents_max as usize);
        let fragmented = of(&fragmented_seqs);
        let lz4 = whole_objects_up_to(of(&lz4_seqs).into_iter(), t.reseal_extents_max as usize);
        tracing::debug!(
            sparse = sparse.len(),
            fragmented = fragmented.len(),
            lz4 = lz4.len(),
            aged_through = covered.aged_through,
            "moving extents out of covered log objects"
        );
        let c = &self.inner.counters;
        self.move_extents(base, &sparse, &c.extents_repacked)
            .await?;
        self.move_extents(base, &fragmented, &c.extents_defragmented)
            .await?;
        // Extents of fragmented objects that held lz4 frames are moved already: the move skips
        // what no longer points where the checkpoint saw it.
        self.move_extents(base, &lz4, &c.extents_resealed).await
    }

    /// Moves `extents` (inode, index, pointer as the checkpoint has it) by flushes of up to
    /// `Tuning::repack_extents_per_object`, counting those moved in `moved_count`. Client flushes queued
    /// behind one wait for a few milliseconds of sealing, not for all of it (and in a `file://`
    /// bucket each object stays small enough for the journal).
    pub(super) async fn move_extents(
        &self,
        base: &Arc<Base>,
        extents: &[(u64, u64, ExtentPtr)],
        moved_count: &AtomicU64,
    ) -> Result<(), EngineError> {
        // The pointers come from `base`: one the layers in memory do not change is still
        // current while `base` is (the checkpoint slot keeps it so throughout).
        let unchanged = |st: &State, ino: u64, index: u64, ptr: ExtentPtr| {
            let committed = match st.committed.extent(ino, index) {
                Here::Is(p) => p == Some(ptr),
                Here::NotHere => Arc::ptr_eq(st.committed.base(), base),
            };
            committed && st.newest_first().all(|b| !b.touches_extent(ino, index))
        };
        for chunk in extents.chunks(self.inner.tuning.repack_extents_per_object as usize) {
            // The plaintext: from the memory tier while it is there (it usually is for
            // extents written since the last checkpoint or so), else fetched.
            let mut found = Vec::with_capacity(chunk.len());
            let mut missing: BTreeMap<u64, Vec<(u64, ExtentPtr)>> = BTreeMap::new();
            {
                let st = self.inner.state.read();
                for &(ino, index, ptr) in chunk {
                    if !unchanged(&st, ino, index, ptr) {
                        continue;
                    }
                    match st.clean.peek((ino, index)) {
                        Some(data) => found.push((ino, index, ptr, data)),
                        None => missing.entry(ino).or_default().push((index, ptr)),
                    }
                }
            }
            for (ino, wanted) in missing {
                let ptrs: HashMap<u64, ExtentPtr> = wanted.iter().copied().collect();
                for (index, data) in self.fetch(ino, &wanted).await? {
                    found.push((ino, index, ptrs[&index], data));
                }
            }
            let moved = {
                let mut st = self.inner.state.write();
                let mut moved = 0;
                for (ino, index, ptr, data) in found {
                    if unchanged(&st, ino, index, ptr) {
                        st.pending.extents.insert((ino, index), Dirty::Moved(data));
                        moved += 1;
                    }
                }
                if moved > 0 {
                    st.write_gen += 1;
                }
                moved
            };
            if moved == 0 {
                continue;
            }
            moved_count.fetch_add(moved, Ordering::Relaxed);
            tracing::debug!(
                extents = moved,
                "moving extents out of objects the collector wants dead"
            );
            self.barrier(Waiting::Engine).await?;
            self.inner
                .repacked_uncollected
                .store(true, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmented_objects_are_the_least_live_within_the_budget_and_at_least_one() {
        // (seq, live bytes, size): 40 %, 10 %, 50 %, 51 % and 0.5 % live.
        let objects = [
            (1, 40, 100),
            (2, 10, 100),
            (3, 500, 1000),
            (4, 51, 100),
            (5, 5, 1000),
        ];
        let chosen = |budget| {
            let mut seqs: Vec<u64> = fragmented_objects(&objects, budget, 50)
                .into_iter()
                .collect();
            seqs.sort_unstable();
            seqs
        };
        assert_eq!(chosen(1), vec![5], "one, though over the budget");
        assert_eq!(chosen(15), vec![2, 5]);
        assert_eq!(chosen(54), vec![2, 5]);
        assert_eq!(chosen(55), vec![1, 2, 5]);
        assert_eq!(
            chosen(10_000),
            vec![1, 2, 3, 5],
            "51 % live is not fragmented"
        );
        assert!(fragmented_objects(&[(1, 60, 100)], 1000, 50).is_empty());
    }

    #[test]
    fn whole_objects_up_to_takes_whole_objects_and_at_least_one() {
        // Objects 1, 2 and 3 hold 3, 2 and 4 extents.
        let extents: Vec<(u64, u64, ExtentPtr)> = [1, 1, 1, 2, 2, 3, 3, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, &seq)| {
                let ptr = ExtentPtr {
                    seq,
                    offset: i as u32,
                    length: 1,
                };
                (7, i as u64, ptr)
            })
            .collect();
        let objects = |max| {
            let mut seqs: Vec<u64> = whole_objects_up_to(extents.iter().copied(), max)
                .iter()
                .map(|(_, _, p)| p.seq)
                .collect();
            seqs.dedup();
            seqs
        };
        assert_eq!(objects(1), vec![1], "one object, though larger than max");
        assert_eq!(objects(3), vec![1]);
        assert_eq!(objects(4), vec![1]);
        assert_eq!(objects(5), vec![1, 2]);
        assert_eq!(objects(8), vec![1, 2]);
        assert_eq!(objects(9), vec![1, 2, 3]);
        assert_eq!(objects(100), vec![1, 2, 3]);
        assert!(whole_objects_up_to(std::iter::empty(), 5).is_empty());
    }
}
