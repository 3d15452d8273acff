//! Scoped barriers (docs/0006, "Durability"): an fsync of one file that does not wait for
//! other files' writes on their way to the bucket.
//!
//! The log is one order for the whole bucket, so a full barrier makes durable everything
//! written before it, including another client's bulk writes. A scoped barrier names one scope
//! (an inode: its extents and its keys) and, when much else is on its way, stores what the
//! unflushed batches hold of that scope as a side record, `side/<number>-<id>`, where `number` is
//! the number the pending batch will get when it is frozen. At open, after the log and the
//! journal's records, every side record numbered above the bucket's `COVERED_KEY` is applied
//! in order: the bucket lacks batch `number`, so the scope's changes it recorded are not all
//! there, and applying the scope's state on top of the prefix is as if the other scopes'
//! changes after the prefix had not been made. That holds because scopes commute: the scoped
//! barrier refuses the side path (and takes the full barrier) while any unflushed transaction
//! changed the scope together with anything else (`Txn::shared_by`), such as a rename.
//! A side record the bucket's log has caught up with is deleted.
//!
//! A side record holds only the extents that changed since the scope's newest stored record
//! the log has not caught up with (its base), so that a file fsynced again and again beside a
//! long upload does not rewrite all its unflushed data each time. An open applies the base
//! before it, or finds its extents in the prefix. A scope with a cut among its unflushed
//! changes gets a whole record, since a cut applied again would remove what the base holds.

use super::*;

pub(super) const SIDE_PREFIX: &str = "side/";
/// A side record is sealed as a log object whose sequence number has this bit set (and not
/// the journal records' bit 63), so it can be opened as nothing else.
const SIDE_SEQ_BIT: u64 = 1 << 62;
/// Side records per batch number (the id's range within `SIDE_SEQ_BIT`'s sequence numbers).
const SIDE_IDS_PER_NUMBER: u64 = 1 << 20;
/// Entries of `State::shared` beyond which those the bucket holds are pruned.
const SHARED_PRUNE_AT: usize = 4096;

fn side_key(number: u64, id: u64) -> String {
    format!("{SIDE_PREFIX}{number:020}-{id:07}")
}

fn side_seq(number: u64, id: u64) -> u64 {
    SIDE_SEQ_BIT | number << 20 | id
}

fn parse_side_key(key: &str) -> Option<(u64, u64)> {
    let (number, id) = key.strip_prefix(SIDE_PREFIX)?.split_once('-')?;
    let (number, id) = (number.parse().ok()?, id.parse().ok()?);
    (number < 1 << 40 && id < SIDE_IDS_PER_NUMBER).then_some((number, id))
}

/// One scope: an inode's extents and the key ranges of its pairs.
#[derive(Debug, Clone)]
pub struct Scope {
    pub ino: u64,
    pub key_ranges: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Scope {
    /// The scope of inode `ino`'s extents and of exactly the pairs `keys`.
    pub fn with_keys(ino: u64, keys: impl IntoIterator<Item = Vec<u8>>) -> Scope {
        let key_ranges = keys
            .into_iter()
            .map(|key| {
                let mut end = key.clone();
                end.push(0);
                (key, end)
            })
            .collect();
        Scope { ino, key_ranges }
    }
}

/// Bases kept at most; a scope beyond them gets whole records. A base keeps alive at most
/// `Tuning::scoped_barrier_bytes_max` of buffers that later writes replaced (1 MiB by default),
/// so this bounds that memory (64 MiB by default, half of `DIRTY_BYTES_MAX`).
const SIDE_BASES_MAX: usize = 64;

/// Side records stored and not yet deleted, and the newest batch number the bucket holds.
#[derive(Default)]
pub(super) struct SideCtl {
    written: BTreeSet<(u64, u64)>,
    covered: u64,
    /// The last (number, id) handed out.
    last: (u64, u64),
    /// Per scope (inode), its newest stored side record the log has not caught up with.
    bases: HashMap<u64, SideBase>,
}

/// What an open rebuilds of a scope from the side records up to one stored record: the
/// scope's unflushed extents and pairs when that record was planned. Holding the extents'
/// buffers keeps them from being reused, so an unchanged extent is the same allocation.
pub(super) struct SideBase {
    at: (u64, u64),
    extents: HashMap<u64, Dirty>,
    kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl SideBase {
    fn of(at: (u64, u64), within: &Batch) -> SideBase {
        SideBase {
            at,
            extents: within
                .extents
                .iter()
                .map(|(&(_, index), d)| (index, d.clone()))
                .collect(),
            kv: within.kv.clone(),
        }
    }
}

/// Whether two entries of the same extent are the same write (the same buffer).
fn same_entry(a: &Dirty, b: &Dirty) -> bool {
    match (a, b) {
        (Dirty::Data(x), Dirty::Data(y)) | (Dirty::Moved(x), Dirty::Moved(y)) => Arc::ptr_eq(x, y),
        (Dirty::Hole, Dirty::Hole) => true,
        _ => false,
    }
}

/// What a scoped barrier found.
enum Plan {
    /// Nothing of the scope is unflushed, or nothing changed since a stored side record.
    Clean,
    /// Take the full barrier.
    Full,
    /// Store this batch as side record (number, id); the scope's base once it is stored.
    Side(u64, u64, Batch, Box<SideBase>),
}

impl Batch {
    /// What this batch holds of `scope`: its extents and cuts of them, its pairs in the
    /// scope's ranges, and its key cuts clipped to them.
    fn within(&self, scope: &Scope) -> Batch {
        let mut out = Batch {
            gen: self.gen,
            number: self.number,
            ..Batch::default()
        };
        out.extents = self
            .extents
            .range((scope.ino, 0)..=(scope.ino, u64::MAX))
            .map(|(k, d)| (*k, d.clone()))
            .collect();
        if let Some(cuts) = self.extent_cuts.get(&scope.ino) {
            out.extent_cuts.insert(scope.ino, cuts.clone());
        }
        for (start, end) in &scope.key_ranges {
            for (k, v) in self.kv.range(start.clone()..end.clone()) {
                out.kv.insert(k.clone(), v.clone());
            }
            for (cut_start, cut_end) in self.kv_cuts.overlapping(start, Some(end)) {
                let from = cut_start.max(start.as_slice());
                let to = cut_end.min(end.as_slice());
                out.kv_cuts.insert(from.to_vec(), to.to_vec());
            }
        }
        out
    }
}

impl Engine {
    /// A barrier for one scope: returns once every change to the scope acknowledged before it
    /// is durable, with everything else acknowledged before those changes that it depends on.
    /// Takes the full barrier (`flush`) when a journal tier is configured, when an unflushed
    /// transaction changed the scope with anything else, when the scope's own unflushed data
    /// passes `Tuning::scoped_barrier_bytes_max`, or when less than
    /// `Tuning::scoped_barrier_ahead_bytes_min` of other data is unflushed (the full barrier
    /// then costs as little, and takes no extra requests).
    pub async fn scoped_flush(&self, scope: &Scope) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Ok(());
        }
        self.check_writable()?;
        let started = tokio::time::Instant::now();
        let plan = if self.journaling() {
            Plan::Full
        } else {
            self.plan_scoped(scope)
        };
        let c = &self.inner.counters;
        match plan {
            Plan::Clean => {
                c.scoped_barriers_clean.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Plan::Full => {
                c.scoped_barriers_full.fetch_add(1, Ordering::Relaxed);
                self.flush().await
            }
            Plan::Side(number, id, batch, base) => {
                let key = side_key(number, id);
                let codec = self.codec_for(batch.extents.len(), Waiting::Client);
                let (record, _) = self
                    .encode(side_seq(number, id), Arc::new(batch), codec)
                    .await;
                let stored = self
                    .inner
                    .bucket
                    .put(&key, record.into_bytes(), PutMode::Create)
                    .await;
                match stored {
                    Ok(()) => {
                        self.side_record_written(scope.ino, *base);
                        c.scoped_barriers_side.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            ino = scope.ino,
                            number,
                            id,
                            wait_us = started.elapsed().as_micros() as u64,
                            "scoped barrier: side record"
                        );
                        Ok(())
                    }
                    Err(e) => {
                        // The full barrier waits out an outage, or answers its error.
                        tracing::warn!(ino = scope.ino, error = %e, "a side record could not be stored; taking the full barrier");
                        c.scoped_barriers_full.fetch_add(1, Ordering::Relaxed);
                        self.flush().await
                    }
                }
            }
        }
    }

    /// Under the state lock, so that no transaction slips between the checks and the copy.
    fn plan_scoped(&self, scope: &Scope) -> Plan {
        let tuning = &self.inner.tuning;
        let st = self.inner.state.read();
        let in_bucket = self.inner.bucket_gen.load(Ordering::Acquire);
        if st.shared.get(&scope.ino).is_some_and(|&g| g > in_bucket) {
            return Plan::Full;
        }
        let mut within = Batch::default();
        for batch in st.oldest_first() {
            within.absorb(batch.within(scope));
        }
        if within.is_empty() {
            return Plan::Clean;
        }
        let own = within.data_bytes() as u64;
        let ahead = (st.unflushed_bytes() as u64).saturating_sub(own);
        if own > tuning.scoped_barrier_bytes_max || ahead < tuning.scoped_barrier_ahead_bytes_min {
            return Plan::Full;
        }
        let number = st.next_batch;
        let mut side = self.inner.side.lock();
        let id = if side.last.0 == number {
            side.last.1 + 1
        } else {
            0
        };
        if id >= SIDE_IDS_PER_NUMBER {
            return Plan::Full;
        }
        let base = Box::new(SideBase::of((number, id), &within));
        let prior = side.bases.get(&scope.ino).filter(|b| b.at.0 > side.covered);
        if let Some(prior) = prior.filter(|_| !within.extent_cuts.contains_key(&scope.ino)) {
            let all = within.extents.len();
            within.extents.retain(|&(_, index), d| {
                !prior.extents.get(&index).is_some_and(|p| same_entry(p, d))
            });
            if within.extents.is_empty() && within.kv == prior.kv && within.kv_cuts.is_empty() {
                return Plan::Clean;
            }
            self.inner
                .counters
                .side_record_extents_left_out
                .fetch_add((all - within.extents.len()) as u64, Ordering::Relaxed);
        }
        side.last = (number, id);
        within.gen = st.write_gen;
        Plan::Side(number, id, within, base)
    }

    /// Notes a transaction that changed several scopes together (under the state lock, with
    /// its write generation).
    pub(super) fn note_shared(&self, st: &mut State, scopes: &[u64]) {
        if scopes.is_empty() {
            return;
        }
        if st.shared.len() >= SHARED_PRUNE_AT {
            let in_bucket = self.inner.bucket_gen.load(Ordering::Acquire);
            st.shared.retain(|_, g| *g > in_bucket);
        }
        let gen = st.write_gen;
        for &s in scopes {
            st.shared.insert(s, gen);
        }
    }

    fn side_record_written(&self, ino: u64, base: SideBase) {
        let (number, id) = base.at;
        let mut side = self.inner.side.lock();
        if number <= side.covered {
            // The bucket caught up while the record was stored: its DELETE follows its PUT.
            drop(side);
            self.spawn_side_deletes(vec![side_key(number, id)]);
            return;
        }
        side.written.insert((number, id));
        // Records of one scope may land out of order; the newest planned is the base.
        let newer = side.bases.get(&ino).is_none_or(|b| b.at < base.at);
        if newer && (side.bases.len() < SIDE_BASES_MAX || side.bases.contains_key(&ino)) {
            side.bases.insert(ino, base);
        }
    }

    /// The bucket now holds every batch numbered up to `covered`: their side records go.
    pub(super) fn side_records_covered(&self, covered: u64) {
        let doomed: Vec<String> = {
            let mut side = self.inner.side.lock();
            side.covered = side.covered.max(covered);
            let covered = side.covered;
            side.bases.retain(|_, b| b.at.0 > covered);
            let keep = side.written.split_off(&(covered + 1, 0));
            std::mem::replace(&mut side.written, keep)
                .into_iter()
                .map(|(n, id)| side_key(n, id))
                .collect()
        };
        if !doomed.is_empty() {
            self.spawn_side_deletes(doomed);
        }
    }

    fn spawn_side_deletes(&self, keys: Vec<String>) {
        let bucket = self.inner.bucket.clone();
        self.inner.tasks.spawn(async move {
            delete_side_records(&bucket, keys).await;
        });
    }

    /// At open, by a writer, after the journal's records: applies the side records the log
    /// has not caught up with, in order, sends them to the bucket in one batch whose number is
    /// above every side record's, then deletes every side record.
    pub(super) async fn replay_side_records(&self) -> Result<(), EngineError> {
        let mut listed: Vec<((u64, u64), String)> = Vec::new();
        for o in self.inner.bucket.list(SIDE_PREFIX).await? {
            match parse_side_key(&o.key) {
                Some(at) => listed.push((at, o.key)),
                None => {
                    tracing::warn!(key = %o.key, "ignoring an object that is not a side record")
                }
            }
        }
        if listed.is_empty() {
            return Ok(());
        }
        listed.sort();
        let covered = self.covered_number().await?;
        let newest = listed.last().map_or(0, |((n, _), _)| *n);
        {
            let mut st = self.inner.state.write();
            st.next_batch = st.next_batch.max(newest + 1);
        }
        let mut applied = 0;
        for ((number, id), key) in &listed {
            if *number <= covered {
                continue;
            }
            let object = self.inner.bucket.get(key).await?;
            self.replay_object(key, side_seq(*number, *id), &object)?;
            applied += 1;
        }
        if applied > 0 {
            self.barrier(Waiting::Engine).await?;
        }
        tracing::info!(
            applied,
            stale = listed.len() - applied,
            "side records of scoped barriers replayed into the bucket"
        );
        delete_side_records(
            &self.inner.bucket,
            listed.into_iter().map(|(_, k)| k).collect(),
        )
        .await;
        Ok(())
    }
}

/// Deletes side records; one that stays is numbered at most `COVERED_KEY`'s value, so no open
/// applies it, and the next open deletes it.
async fn delete_side_records(bucket: &SharedBucket, keys: Vec<String>) {
    super::journaled::delete_needless(bucket, keys, "side record").await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_keys_round_trip_and_sort_by_number_then_id() {
        assert_eq!(parse_side_key(&side_key(7, 3)), Some((7, 3)));
        assert!(side_key(9, 999) < side_key(10, 0));
        assert!(side_key(10, 2) < side_key(10, 11));
        assert_eq!(parse_side_key("side/x-1"), None);
        assert_eq!(parse_side_key("jrec/00000000000000000001"), None);
        assert_ne!(side_seq(1, 0), side_seq(0, 1));
    }

    #[test]
    fn a_cut_removes_its_own_inodes_entries_in_its_range_only() {
        let mut b = Batch::default();
        for ino in 1..=3 {
            for index in 0..10 {
                b.extents.insert((ino, index), Dirty::Hole);
            }
        }
        b.cut_extents(2, 3, 7);
        let left: Vec<u64> = b
            .extents
            .keys()
            .filter(|(ino, _)| *ino == 2)
            .map(|&(_, index)| index)
            .collect();
        assert_eq!(left, vec![0, 1, 2, 7, 8, 9]);
        assert_eq!(b.extents.len(), 26);
        assert_eq!(b.extent_cuts.get(&2), Some(&vec![(3, 7)]));
        b.cut_extents(2, 5, 5);
        assert_eq!(b.extents.len(), 26, "an empty cut removes nothing");
    }

    #[test]
    fn a_batch_within_a_scope_keeps_only_its_extents_pairs_and_clipped_cuts() {
        let mut b = Batch::default();
        b.extents.insert((1, 0), Dirty::Hole);
        b.extents.insert((1, u64::MAX), Dirty::Hole);
        b.extents.insert((2, 0), Dirty::Hole);
        b.extents.insert((2, u64::MAX), Dirty::Hole);
        b.extents.insert((3, 0), Dirty::Hole);
        b.extent_cuts.insert(2, vec![(3, 9)]);
        b.kv.insert(b"a1".to_vec(), Some(vec![1]));
        b.kv.insert(b"a2".to_vec(), None);
        b.kv_cuts.insert(b"a".to_vec(), b"b".to_vec());
        let scope = Scope {
            ino: 2,
            key_ranges: vec![(b"a2".to_vec(), b"a3".to_vec())],
        };
        let w = b.within(&scope);
        assert_eq!(
            w.extents.keys().copied().collect::<Vec<_>>(),
            vec![(2, 0), (2, u64::MAX)]
        );
        assert_eq!(w.extent_cuts.get(&2), Some(&vec![(3, 9)]));
        assert_eq!(
            w.kv.keys().cloned().collect::<Vec<_>>(),
            vec![b"a2".to_vec()]
        );
        assert_eq!(
            w.kv_cuts.iter().collect::<Vec<_>>(),
            vec![(&b"a2"[..], &b"a3"[..])]
        );
    }
}
