//! Reads and writes of file data and metadata key-value pairs, against the overlay.

use super::*;

/// What a mutation writes into a range.
#[derive(Clone, Copy)]
pub enum Fill<'a> {
    Data(&'a [u8]),
    /// Zeroes; whole extents are deallocated when `punch` is true.
    Zeroes {
        punch: bool,
    },
}

/// A key-value change of the filesystem core, applied atomically with the others of one call.
#[derive(Debug, Clone)]
pub enum KvChange {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Deletes every pair with a key in `start..end`: one op in the log, whatever their number.
    DeleteRange(Vec<u8>, Vec<u8>),
}

/// Extents by index, in order.
type Extents = Vec<(u64, Arc<Vec<u8>>)>;

/// What `read_pieces` answers for holes, as slices of this.
static ZEROES: [u8; EXTENT_SIZE_BYTES] = [0; EXTENT_SIZE_BYTES];

/// An extent as the owner of a `Bytes` (which wants its owner to be `AsRef<[u8]>`).
struct Shared(Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// `count` zero bytes, as pieces of `ZEROES`.
fn push_zeroes(out: &mut Vec<Bytes>, mut count: usize) {
    while count > 0 {
        let n = count.min(ZEROES.len());
        out.push(Bytes::from_static(&ZEROES[..n]));
        count -= n;
    }
}

/// The part of extent `index` that `offset..offset+length` covers, as a byte range in the extent.
pub(super) fn extent_span(index: u64, offset: u64, length: u64) -> (usize, usize) {
    let base = index * EXTENT_SIZE_BYTES_U64;
    let start = offset.max(base) - base;
    let end = (offset + length).min(base + EXTENT_SIZE_BYTES_U64) - base;
    (start as usize, end as usize)
}

impl Engine {
    /// Writes `fill` into `ino` at `offset` (`length` bytes), atomically.
    pub async fn write(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        fill: Fill<'_>,
    ) -> Result<(), EngineError> {
        self.check_writable()?;
        if length == 0 {
            return Ok(());
        }
        if let Fill::Data(d) = fill {
            assert_eq!(d.len() as u64, length, "data length matches the range");
        }
        self.make_room().await?;
        let mut whole_extents = self.copy_whole_extents(offset, length, fill).into_iter();
        loop {
            // Partial extents need their current content first; fetch those that are neither in
            // memory nor holes, outside the lock, then try again.
            let (missing, commit_gen, base) = {
                let mut st = self.inner.state.write();
                let mut missing = Vec::new();
                stored_bases(&mut st, ino, offset, length, &mut missing);
                if missing.is_empty() {
                    self.apply_write(&mut st, ino, offset, length, fill, &mut whole_extents);
                    st.write_gen += 1;
                    let pending_bytes = st.pending.data_bytes();
                    drop(st);
                    self.write_behind(pending_bytes);
                    return Ok(());
                }
                (missing, st.commit_gen, st.committed.base().clone())
            };
            self.ride_out_reads(|| self.fetch_bases(&missing, commit_gen, &base))
                .await?;
        }
    }

    /// Copies of the whole extents of new data that a write covers, in order. Made before the
    /// state lock is taken: copying (and, in fresh memory, faulting in) a large write's pages
    /// under the lock stalled every other request (perf, 1 MiB sequential writes).
    pub(super) fn copy_whole_extents(
        &self,
        offset: u64,
        length: u64,
        fill: Fill<'_>,
    ) -> Vec<Arc<Vec<u8>>> {
        let Fill::Data(d) = fill else {
            return Vec::new();
        };
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        (first..=last)
            .filter_map(|index| {
                let (start, end) = extent_span(index, offset, length);
                (start == 0 && end == EXTENT_SIZE_BYTES).then(|| {
                    // A whole extent starts at or after `offset`.
                    let at = (index * EXTENT_SIZE_BYTES_U64 - offset) as usize;
                    self.inner
                        .extent_buffers
                        .copy_of(&d[at..at + EXTENT_SIZE_BYTES])
                })
            })
            .collect()
    }

    /// Fetches the stored bases of partial writes (as (inode, index, pointer), the pointer
    /// `None` where the committed `base` must be asked for it) into the memory tier, unless the
    /// committed state changed meanwhile (the caller then looks again).
    pub(super) async fn fetch_bases(
        &self,
        missing: &[(u64, u64, Option<ExtentPtr>)],
        commit_gen: u64,
        base: &Arc<Base>,
    ) -> Result<(), EngineError> {
        let mut by_ino: BTreeMap<u64, Vec<(u64, ExtentPtr)>> = BTreeMap::new();
        let mut zeroes = Vec::new();
        for &(ino, index, ptr) in missing {
            let ptr = match ptr {
                Some(p) => Some(p),
                None => match base.extent(ino, index).await {
                    Ok(p) => p,
                    // The base was replaced and its runs collected meanwhile: look again.
                    Err(crate::lsm::RunError::Store(StoreError::NotFound(_))) => return Ok(()),
                    Err(e) => return Err(e.into()),
                },
            };
            match ptr {
                Some(p) => by_ino.entry(ino).or_default().push((index, p)),
                None => zeroes.push((ino, index)),
            }
        }
        if !zeroes.is_empty() {
            let st = self.inner.state.read();
            if st.commit_gen != commit_gen {
                return Ok(());
            }
            for key in zeroes {
                st.clean.put(key, Arc::new(vec![0; EXTENT_SIZE_BYTES]));
            }
        }
        for (ino, wanted) in by_ino {
            let fetched = self.fetch(ino, &wanted).await?;
            let st = self.inner.state.read();
            if st.commit_gen != commit_gen {
                return Ok(());
            }
            let evicted = self.keep_clean(&st, ino, fetched);
            drop(st);
            self.inner.extent_buffers.give_back(evicted);
        }
        Ok(())
    }

    /// Applies a write to the pending batch; `whole_extents` holds the copies of the whole
    /// extents of `Fill::Data`, in order.
    pub(super) fn apply_write(
        &self,
        st: &mut State,
        ino: u64,
        offset: u64,
        length: u64,
        fill: Fill<'_>,
        whole_extents: &mut impl Iterator<Item = Arc<Vec<u8>>>,
    ) {
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        for index in first..=last {
            let (start, end) = extent_span(index, offset, length);
            let whole = start == 0 && end == EXTENT_SIZE_BYTES;
            let src_at = (index * EXTENT_SIZE_BYTES_U64 + start as u64 - offset) as usize;
            if whole {
                match fill {
                    Fill::Zeroes { punch: true } => {
                        st.punch(ino, index);
                        continue;
                    }
                    Fill::Zeroes { punch: false } => {
                        st.pending.extents.insert(
                            (ino, index),
                            Dirty::Data(Arc::new(vec![0; EXTENT_SIZE_BYTES])),
                        );
                        continue;
                    }
                    Fill::Data(_) => {
                        let data = whole_extents
                            .next()
                            .expect("every whole extent was copied beforehand");
                        st.pending.extents.insert((ino, index), Dirty::Data(data));
                        continue;
                    }
                }
            }
            let mut buf = match st.pending.extents.remove(&(ino, index)) {
                Some(Dirty::Data(d) | Dirty::Moved(d)) => d,
                Some(Dirty::Hole) => Arc::new(vec![0; EXTENT_SIZE_BYTES]),
                None => match st.find(ino, index) {
                    Found::Data(d) => d,
                    Found::Zero => Arc::new(vec![0; EXTENT_SIZE_BYTES]),
                    Found::Stored(_) | Found::InBase => {
                        unreachable!("write() fetched every partial extent's base first")
                    }
                },
            };
            let target = &mut Arc::make_mut(&mut buf)[start..end];
            match fill {
                Fill::Data(d) => target.copy_from_slice(&d[src_at..src_at + (end - start)]),
                Fill::Zeroes { .. } => target.fill(0),
            }
            st.pending.extents.insert((ino, index), Dirty::Data(buf));
        }
        assert!(
            whole_extents.next().is_none(),
            "no copied extent is left over"
        );
    }

    pub async fn read(&self, ino: u64, offset: u64, length: usize) -> Result<Vec<u8>, EngineError> {
        let extents = self.read_extents(ino, offset, length).await?;
        // Each byte of the answer is written once, in order: the extents' bytes, and zeroes
        // for the holes between them (a zero-filled buffer overwritten would write it twice).
        let mut out = Vec::with_capacity(length);
        for (index, data) in extents {
            let (start, end) = extent_span(index, offset, length as u64);
            let dst = (index * EXTENT_SIZE_BYTES_U64 + start as u64 - offset) as usize;
            out.resize(dst, 0);
            out.extend_from_slice(&data[start..end]);
        }
        out.resize(length, 0);
        Ok(out)
    }

    /// `read`'s bytes as pieces in order, which together are `length` long: slices of the
    /// extents themselves, and zeroes for holes. A reply written with `writev` then sends the
    /// extents without first copying them into one buffer.
    pub async fn read_pieces(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Vec<Bytes>, EngineError> {
        let extents = self.read_extents(ino, offset, length).await?;
        let mut out = Vec::with_capacity(extents.len() + 1);
        let mut at = 0;
        for (index, data) in extents {
            let (start, end) = extent_span(index, offset, length as u64);
            let dst = (index * EXTENT_SIZE_BYTES_U64 + start as u64 - offset) as usize;
            push_zeroes(&mut out, dst - at);
            out.push(Bytes::from_owner(Shared(data)).slice(start..end));
            at = dst + (end - start);
        }
        push_zeroes(&mut out, length - at);
        Ok(out)
    }

    /// The extents that hold data in `offset..offset+length`, in order (holes left out),
    /// with readahead when the reads of `ino` are sequential.
    async fn read_extents(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Extents, EngineError> {
        use futures::FutureExt;
        let ahead = self.inner.tuning.readahead_bytes;
        if ahead > 0 && length > 0 {
            let end = offset.saturating_add(length as u64);
            let plan = self.inner.readahead.plan(ino, offset, end, ahead);
            for (from, to) in plan.fetch {
                // Each piece is a task of its own, so it goes on when this read is dropped; its
                // failure is not this read's (the read below fetches what it lacks itself).
                let engine = self.clone();
                let task = self.inner.tasks.start(async move {
                    let length = (to - from) as usize;
                    let _ = engine
                        .ride_out_reads(|| engine.read_current(ino, from, length))
                        .await;
                });
                let done = async move {
                    let _ = task.await;
                }
                .boxed();
                self.inner.readahead.started(ino, from, to, done);
            }
            for fetch in plan.wait {
                fetch.await;
            }
        }
        self.ride_out_reads(|| self.read_current(ino, offset, length))
            .await
    }

    /// The extents of the range, in order; brings those it fetches into the memory cache.
    async fn read_current(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Extents, EngineError> {
        loop {
            match self.read_once(ino, offset, length).await {
                // The log object was collected after its extents were overwritten while this read
                // was under way: look the extents up again.
                Err((EngineError::Store(StoreError::NotFound(_)), commit_gen))
                    if commit_gen != self.inner.state.read().commit_gen => {}
                other => return other.map_err(|(e, _)| e),
            }
        }
    }

    pub(super) async fn read_once(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Extents, (EngineError, u64)> {
        if length == 0 {
            return Ok(Vec::new());
        }
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length as u64 - 1) / EXTENT_SIZE_BYTES_U64;
        let mut found = Vec::with_capacity((last - first + 1) as usize);
        let mut missing = Vec::new();
        let mut in_base = Vec::new();
        let (commit_gen, base) = {
            let st = self.inner.state.read();
            for index in first..=last {
                match st.find(ino, index) {
                    Found::Data(d) => found.push((index, d)),
                    Found::Zero => {}
                    Found::Stored(ptr) => missing.push((index, ptr)),
                    Found::InBase => in_base.push(index),
                }
            }
            (st.commit_gen, st.committed.base().clone())
        };
        if !found.is_empty() {
            self.inner
                .counters
                .memory_cache_hits
                .fetch_add(found.len() as u64, Ordering::Relaxed);
        }
        for index in in_base {
            match base.extent(ino, index).await {
                Ok(Some(ptr)) => missing.push((index, ptr)),
                Ok(None) => {}
                Err(e) => return Err((e.into(), commit_gen)),
            }
        }
        if !missing.is_empty() {
            self.inner
                .counters
                .memory_cache_misses
                .fetch_add(missing.len() as u64, Ordering::Relaxed);
            let fetched = self
                .fetch(ino, &missing)
                .await
                .map_err(|e| (e, commit_gen))?;
            let st = self.inner.state.read();
            let evicted = if st.commit_gen == commit_gen {
                self.keep_clean(&st, ino, fetched.iter().cloned())
            } else {
                Vec::new()
            };
            drop(st);
            self.inner.extent_buffers.give_back(evicted);
            found.extend(fetched);
        }
        found.sort_unstable_by_key(|(index, _)| *index);
        Ok(found)
    }

    /// Puts extents of `ino` fetched from the bucket in the memory tier; answers the extents
    /// they pushed out, whose buffers the caller gives back to the pool once it has let go of
    /// the state lock.
    fn keep_clean(
        &self,
        st: &State,
        ino: u64,
        fetched: impl IntoIterator<Item = (u64, Arc<Vec<u8>>)>,
    ) -> Vec<Arc<Vec<u8>>> {
        fetched
            .into_iter()
            .filter_map(|(index, data)| st.clean.push((ino, index), data))
            .map(|(_, out)| out)
            .collect()
    }

    /// Fetches and decodes stored extents, coalescing neighbours in one log object into one GET.
    pub(super) async fn fetch(
        &self,
        ino: u64,
        wanted: &[(u64, ExtentPtr)],
    ) -> Result<Vec<(u64, Arc<Vec<u8>>)>, EngineError> {
        let mut sorted = wanted.to_vec();
        sorted.sort_by_key(|(_, p)| (p.seq, p.offset));
        let mut groups: Vec<Vec<(u64, ExtentPtr)>> = Vec::new();
        for item in sorted {
            match groups.last_mut() {
                Some(g)
                    if {
                        let prev = g.last().expect("groups are never empty").1;
                        prev.seq == item.1.seq
                            && u64::from(item.1.offset)
                                <= u64::from(prev.offset)
                                    + u64::from(prev.length)
                                    + self.inner.tuning.read_coalesce_gap_bytes
                    } =>
                {
                    g.push(item)
                }
                _ => groups.push(vec![item]),
            }
        }
        let results: Vec<Vec<(u64, Arc<Vec<u8>>)>> = futures::stream::iter(groups)
            .map(|g| self.fetch_group(ino, g))
            .buffer_unordered(READ_FETCH_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(results.into_iter().flatten().collect())
    }

    pub(super) async fn fetch_group(
        &self,
        ino: u64,
        group: Vec<(u64, ExtentPtr)>,
    ) -> Result<Vec<(u64, Arc<Vec<u8>>)>, EngineError> {
        let seq = group[0].1.seq;
        let key = logobj::log_key(seq);
        let mut frames: Vec<Option<Bytes>> = group
            .iter()
            .map(|(_, p)| {
                self.inner
                    .disk_cache
                    .as_ref()
                    .and_then(|c| c.get(Space::Log, p.seq, p.offset.into(), p.length))
                    .map(Bytes::from)
            })
            .collect();
        if self.inner.disk_cache.is_some() {
            let hits = frames.iter().filter(|f| f.is_some()).count() as u64;
            let c = &self.inner.counters;
            c.disk_cache_hits.fetch_add(hits, Ordering::Relaxed);
            c.disk_cache_misses
                .fetch_add(frames.len() as u64 - hits, Ordering::Relaxed);
        }
        if frames.iter().any(|f| f.is_none()) {
            let lo = group
                .iter()
                .zip(&frames)
                .filter(|(_, f)| f.is_none())
                .map(|((_, p), _)| u64::from(p.offset))
                .min()
                .expect("some missing");
            let hi = group
                .iter()
                .zip(&frames)
                .filter(|(_, f)| f.is_none())
                .map(|((_, p), _)| u64::from(p.offset) + u64::from(p.length))
                .max()
                .expect("some missing");
            let whole = self.whole_object_size(seq);
            let (lo, bytes) = match whole {
                Some(_) => {
                    let bytes = self.inner.bucket.get(&key).await?;
                    if (bytes.len() as u64) < hi {
                        return Err(EngineError::Corrupt(format!(
                            "{key}: {} bytes in the bucket, frames up to byte {hi} expected",
                            bytes.len()
                        )));
                    }
                    if let Some(c) = &self.inner.disk_cache {
                        c.put_object(Space::Log, seq, bytes.clone());
                    }
                    (0, bytes)
                }
                None => (lo, self.inner.bucket.get_range(&key, lo..hi).await?),
            };
            // One piece for the whole GET (a whole object is in the disk cache already).
            if let Some(c) = self.inner.disk_cache.as_ref().filter(|_| whole.is_none()) {
                c.put_piece(Space::Log, seq, lo, bytes.clone());
            }
            for ((_, p), slot) in group.iter().zip(frames.iter_mut()) {
                if slot.is_none() {
                    let at = (u64::from(p.offset) - lo) as usize;
                    *slot = Some(bytes.slice(at..at + p.length as usize));
                }
            }
        }
        let mut out = Vec::with_capacity(group.len());
        for ((index, _), frame) in group.iter().zip(frames) {
            let frame = frame.expect("every frame was filled above");
            let spare = || self.inner.extent_buffers.overwritable();
            match frame::decode_reusing(&self.inner.sealer, ino, *index, &frame, spare) {
                Ok(plain) => out.push((*index, Arc::new(plain))),
                Err(e) => {
                    tracing::error!(object = %key, error = %e, "stored data failed verification; answering EIO");
                    if let Some(c) = &self.inner.disk_cache {
                        c.drop_object(Space::Log, seq);
                    }
                    return Err(EngineError::Corrupt(format!("{key}: {e}")));
                }
            }
        }
        Ok(out)
    }

    /// The size of log object `seq` when a read that misses the caches should fetch all of it
    /// (`Tuning::cold_read_whole_object_bytes_max`, with a disk cache to keep it in). Sizes are
    /// under the upload lock: a read never waits for it, and fetches frames while it is held.
    fn whole_object_size(&self, seq: u64) -> Option<u64> {
        let max = self.inner.tuning.cold_read_whole_object_bytes_max;
        if max == 0 || self.inner.disk_cache.is_none() {
            return None;
        }
        let ctl = self.inner.upload.try_lock().ok()?;
        ctl.known_logs
            .get(&seq)
            .copied()
            .filter(|size| *size <= max)
    }

    /// Allocation map of `ino` over `offset..offset+length`: runs of (length, allocated).
    pub async fn allocation(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
    ) -> Result<Vec<(u64, bool)>, EngineError> {
        if length == 0 {
            return Ok(Vec::new());
        }
        let first = offset / EXTENT_SIZE_BYTES_U64;
        let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
        let (start, end) = (
            crate::meta::run_key::extent(ino, first),
            crate::meta::run_key::extent(ino, last + 1),
        );
        let found = self
            .ride_out_reads(|| self.scan_snapshot(&start, &end, usize::MAX))
            .await?;
        let allocated: BTreeSet<u64> = found
            .iter()
            .filter_map(|(k, _)| crate::meta::run_key::parse_extent(k).map(|(_, i)| i))
            .collect();
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let end = offset + length;
        let mut at = offset;
        while at < end {
            let index = at / EXTENT_SIZE_BYTES_U64;
            let next = ((index + 1) * EXTENT_SIZE_BYTES_U64).min(end);
            let a = allocated.contains(&index);
            match runs.last_mut() {
                Some((len, prev)) if *prev == a => *len += next - at,
                _ => runs.push((next - at, a)),
            }
            at = next;
        }
        Ok(runs)
    }

    /// Up to `limit` live entries of run keys `start..end` as one consistent view: memory's
    /// under the lock, then the base's runs outside it (again if the base was replaced and its
    /// runs collected meanwhile).
    async fn scan_snapshot(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, EngineError> {
        loop {
            let snapshot = self.inner.state.read().snapshot(start, end, limit);
            match snapshot.scan(limit).await {
                Err(crate::lsm::RunError::Store(StoreError::NotFound(_)))
                    if self.base_replaced(&snapshot.base) => {}
                other => return other.map_err(EngineError::from),
            }
        }
    }

    fn base_replaced(&self, base: &Arc<Base>) -> bool {
        !Arc::ptr_eq(base, self.inner.state.read().committed.base())
    }

    /// Deallocates every extent of `ino` at or beyond `from_index` (file deletion, truncation):
    /// one op in the log, whatever the number of extents.
    pub fn drop_extents_from(&self, ino: u64, from_index: u64) -> Result<(), EngineError> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        st.cut_extents(ino, from_index, u64::MAX);
        st.write_gen += 1;
        Ok(())
    }

    /// The keyed hash that stands for `name` in a metadata key (`Sealer::name_hash`): stable
    /// for the bucket's data key, unguessable without it.
    pub fn name_hash(&self, scope: u64, name: &[u8]) -> u64 {
        self.inner.sealer.name_hash(scope, name)
    }

    /// The keyed tag of a file handle (`Sealer::handle_tag`): stable for the bucket's data key.
    pub fn handle_tag(&self, handle: &[u8]) -> [u8; 16] {
        self.inner.sealer.handle_tag(handle)
    }

    pub async fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.ride_out_reads(|| self.kv_get_current(key)).await
    }

    async fn kv_get_current(&self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        loop {
            let base = {
                let st = self.inner.state.read();
                match st.kv_get(key) {
                    Here::Is(v) => return Ok(v),
                    Here::NotHere => st.committed.base().clone(),
                }
            };
            match base.kv_get(key).await {
                Err(crate::lsm::RunError::Store(StoreError::NotFound(_)))
                    if self.base_replaced(&base) => {}
                other => return other.map_err(EngineError::from),
            }
        }
    }

    /// Every pair whose key starts with `prefix`, in key order.
    pub async fn kv_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, EngineError> {
        let end = prefix_end(prefix);
        self.kv_range(prefix, end.as_deref(), usize::MAX).await
    }

    /// The pairs with a key in `start..end` (to the last key when `end` is None), in key order,
    /// at most `limit` of them, as one consistent snapshot.
    pub async fn kv_range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, EngineError> {
        if end.is_some_and(|e| e <= start) {
            return Ok(Vec::new());
        }
        let (s, e) = crate::meta::run_key::kv_bounds(start, end);
        // The engine's own pair (engine/journaled.rs) is not the caller's: one more is asked
        // for when it may be among them, and it is left out.
        let own = super::journaled::COVERED_KEY;
        let hides = start <= own && end.is_none_or(|e| own < e);
        let asked = if hides {
            limit.saturating_add(1)
        } else {
            limit
        };
        let found = self
            .ride_out_reads(|| self.scan_snapshot(&s, &e, asked))
            .await?;
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = found
            .into_iter()
            .map(|(k, v)| {
                let key = crate::meta::run_key::parse_kv(&k).expect("a key-value run key");
                (key.to_vec(), v)
            })
            .filter(|(k, _)| k.as_slice() != own)
            .collect();
        pairs.truncate(limit);
        Ok(pairs)
    }

    /// Applies the changes atomically (all of them are in the same flush).
    pub fn kv_commit(&self, changes: Vec<KvChange>) -> Result<(), EngineError> {
        self.check_writable()?;
        let mut st = self.inner.state.write();
        for c in changes {
            apply_kv(&mut st, c);
        }
        st.write_gen += 1;
        Ok(())
    }
}

/// Adds to `missing` the partial extents of a write whose current content is stored only in
/// the bucket, as (inode, index, pointer).
pub(super) fn stored_bases(
    st: &mut State,
    ino: u64,
    offset: u64,
    length: u64,
    missing: &mut Vec<(u64, u64, Option<ExtentPtr>)>,
) {
    let first = offset / EXTENT_SIZE_BYTES_U64;
    let last = (offset + length - 1) / EXTENT_SIZE_BYTES_U64;
    for index in [first, last] {
        let (start, end) = extent_span(index, offset, length);
        if start == 0 && end == EXTENT_SIZE_BYTES {
            continue;
        }
        let ptr = match st.find(ino, index) {
            Found::Stored(ptr) => Some(ptr),
            Found::InBase => None,
            Found::Data(_) | Found::Zero => continue,
        };
        if !missing.iter().any(|(i, x, _)| *i == ino && *x == index) {
            missing.push((ino, index, ptr));
        }
    }
}

/// Applies one key-value change to the pending batch.
pub(super) fn apply_kv(st: &mut State, change: KvChange) {
    match change {
        KvChange::Put(k, v) => {
            st.pending.kv.insert(k, Some(v));
        }
        KvChange::Delete(k) => {
            st.pending.kv.insert(k, None);
        }
        KvChange::DeleteRange(start, end) => st.cut_kv(start, end),
    }
}

/// The first key after every key that starts with `prefix`; None when there is none (the prefix
/// is empty or all 0xff).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
