//! Journaled barriers (docs/0009, "Journaled barriers"): with a journal tier, a client's
//! barrier freezes the pending batch and writes it to the journal as a record, `jrec/<number>`
//! (the tier keeps it in the journal only), and returns once the journal holds it. The frozen
//! batches wait in `flushing`; every `Tuning::journal_coalesce_ms` they are merged and sealed
//! into one log object for the bucket, whose pairs say the newest batch it holds
//! (`COVERED_KEY`), and their records are then deleted. The bucket thus takes a few log objects
//! a second however often clients flush.
//!
//! Every batch frozen while journaling gets the next number, journaled or not, so an open
//! replays the records numbered right after the bucket's `COVERED_KEY`, in order, and stops at
//! the first missing: a barrier returns only once every batch frozen before its own is in the
//! journal or the bucket, so nothing after a missing number was acknowledged.

use super::*;

use crate::bucket::JOURNAL_RECORD_PREFIX as RECORD_PREFIX;
/// The pair that says which frozen batches the bucket holds: every one numbered up to its
/// value (u64, big-endian). Starts with a byte no key of the filesystem core does.
pub(super) const COVERED_KEY: &[u8] = b"\0engine/journal-covered";
/// A record is sealed as a log object whose sequence number has this bit set: log sequence
/// numbers stay below 2^40, so a record can never be opened as a log object or the reverse.
const RECORD_SEQ_BIT: u64 = 1 << 63;

fn record_key(number: u64) -> String {
    format!("{RECORD_PREFIX}{number:020}")
}

fn record_seq(number: u64) -> u64 {
    RECORD_SEQ_BIT | number
}

/// Where a batch frozen while journaling stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    /// Its record is being written.
    Writing,
    /// The journal holds its record.
    Held,
    /// Frozen by the engine's own flush, or its record could not be written: durable once the
    /// bucket has it.
    Bucket,
}

struct FrozenBatch {
    number: u64,
    gen: u64,
    status: Status,
}

#[derive(Default)]
pub(super) struct JournalCtl {
    /// Batches frozen while journaling that are not yet durable, oldest first.
    frozen: VecDeque<FrozenBatch>,
    /// Numbers of the records written (or whose write failed) and not yet deleted.
    records: BTreeSet<u64>,
    /// The bucket holds every batch numbered up to this: a record written after its batch got
    /// there is deleted at once (its DELETE must not overtake its PUT).
    covered: u64,
    /// Tasks deleting records.
    deleting: usize,
    /// When the oldest batch not yet sealed for the bucket was frozen, and the data the
    /// unsealed batches hold.
    unsealed_since: Option<tokio::time::Instant>,
    unsealed_bytes: u64,
}

/// What a barrier does next.
enum Step {
    Write(u64, ObjectBuffer),
    Wait,
    Bucket,
}

impl Engine {
    pub(super) fn journaling(&self) -> bool {
        self.inner.journal.is_some()
    }

    /// A client's barrier with a journal: returns once every mutation applied before it is in
    /// the journal (or the bucket).
    pub(super) async fn journaled_barrier(
        &self,
        target: u64,
        parts: &mut PartTimes,
    ) -> Result<(), EngineError> {
        let journal = self.inner.journal.as_ref().expect("journaling");
        loop {
            if self.inner.durable_gen.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if let Some(why) = &*self.inner.poisoned.lock() {
                return Err(EngineError::Poisoned(why.clone()));
            }
            let notified = self.inner.journal_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let step = {
                let locking = tokio::time::Instant::now();
                let mut ctl = self.inner.seal.lock().await;
                let freezing = parts.add(BarrierPart::SealWait, locking);
                let step = self.freeze_for_journal(&mut ctl, journal, target);
                if let Step::Write(..) = step {
                    parts.add(BarrierPart::Seal, freezing);
                }
                step
            };
            match step {
                Step::Write(number, record) => {
                    let putting = tokio::time::Instant::now();
                    self.write_record(number, record).await;
                    parts.add(BarrierPart::Put, putting);
                }
                Step::Wait => {
                    let waiting = tokio::time::Instant::now();
                    let _ = tokio::time::timeout(Duration::from_millis(10), notified).await;
                    parts.add(BarrierPart::UploadWait, waiting);
                }
                Step::Bucket => return self.bucket_barrier(target, Waiting::Client, parts).await,
            }
        }
    }

    /// Under the seal lock: whether a batch already frozen covers `target` (then wait for it,
    /// or for the bucket if its record failed), else freeze the pending batch and seal its
    /// record.
    fn freeze_for_journal(
        &self,
        ctl: &mut SealCtl,
        journal: &Mutex<JournalCtl>,
        target: u64,
    ) -> Step {
        let mut st = self.inner.state.write();
        let mut j = journal.lock();
        if self.inner.durable_gen.load(Ordering::Acquire) >= target {
            return Step::Wait;
        }
        if let Some(f) = j.frozen.iter().find(|f| f.gen >= target) {
            return match f.status {
                Status::Writing | Status::Held => Step::Wait,
                Status::Bucket => Step::Bucket,
            };
        }
        if st.pending.is_empty() {
            // Frozen and queued for the bucket before this engine journaled (or committed
            // meanwhile): the bucket's barrier finds it.
            return Step::Bucket;
        }
        if st.pending.data_bytes() as u64 > self.inner.tuning.journal_record_bytes_max {
            return Step::Bucket;
        }
        let mut batch = std::mem::take(&mut st.pending);
        batch.gen = st.write_gen;
        let number = st.next_batch;
        st.next_batch += 1;
        batch.number = number;
        let batch = Arc::new(batch);
        st.flushing.push_back(batch.clone());
        ctl.unsealed += 1;
        drop(st);
        j.frozen.push_back(FrozenBatch {
            number,
            gen: batch.gen,
            status: Status::Writing,
        });
        j.unsealed_since
            .get_or_insert_with(tokio::time::Instant::now);
        j.unsealed_bytes += batch.data_bytes() as u64;
        drop(j);
        let codec = self.codec_for(batch.extents.len(), Waiting::Client);
        let (record, _) = self.encode_blocking(record_seq(number), &batch, codec);
        Step::Write(number, record)
    }

    /// Writes a record and notes the outcome; a record whose writer is cancelled half way
    /// counts as failed, so nobody waits for it without end.
    async fn write_record(&self, number: u64, record: ObjectBuffer) {
        struct Unfinished<'a>(Option<&'a Engine>, u64);
        impl Drop for Unfinished<'_> {
            fn drop(&mut self) {
                if let Some(engine) = self.0 {
                    engine.record_written(self.1, false);
                }
            }
        }
        let mut unfinished = Unfinished(Some(self), number);
        let result = self
            .inner
            .bucket
            .put(&record_key(number), record.into_bytes(), PutMode::Create)
            .await;
        unfinished.0 = None;
        if let Err(e) = &result {
            tracing::warn!(number, error = %e, "a journal record could not be written; the barrier waits for the bucket instead");
        }
        self.record_written(number, result.is_ok());
        let c = &self.inner.counters;
        c.journal_records.fetch_add(1, Ordering::Relaxed);
    }

    fn record_written(&self, number: u64, held: bool) {
        let Some(journal) = &self.inner.journal else {
            return;
        };
        let (due, covered) = {
            let mut j = journal.lock();
            if let Some(f) = j.frozen.iter_mut().find(|f| f.number == number) {
                if f.status == Status::Writing {
                    f.status = if held { Status::Held } else { Status::Bucket };
                }
            }
            let covered = number <= j.covered;
            if !covered {
                j.records.insert(number);
            }
            (self.coalesce_due(&j), covered)
        };
        if covered {
            self.spawn_record_deletes(vec![number]);
        }
        self.advance_durable();
        if due {
            self.kick_background_flush();
        }
    }

    /// Whether the unsealed batches are old or large enough to go to the bucket.
    fn coalesce_due(&self, j: &JournalCtl) -> bool {
        let t = &self.inner.tuning;
        j.unsealed_bytes >= t.journal_coalesce_bytes
            || j.unsealed_since.is_some_and(|since| {
                since.elapsed() >= Duration::from_millis(t.journal_coalesce_ms)
            })
    }

    /// Makes durable, in order, every frozen batch that the journal holds or the bucket has
    /// committed, and wakes the barriers waiting.
    pub(super) fn advance_durable(&self) {
        let Some(journal) = &self.inner.journal else {
            return;
        };
        {
            let mut j = journal.lock();
            let committed = self.inner.bucket_gen.load(Ordering::Acquire);
            while let Some(f) = j.frozen.front() {
                if f.gen <= committed {
                    j.frozen.pop_front();
                } else if f.status == Status::Held {
                    self.inner.durable_gen.fetch_max(f.gen, Ordering::AcqRel);
                    j.frozen.pop_front();
                } else {
                    break;
                }
            }
        }
        self.inner.journal_notify.notify_waiters();
    }
}

impl Engine {
    /// Under the seal and state locks: the engine's own flush froze batch `number`; it is
    /// durable once the bucket has it, and barriers after it wait for that.
    pub(super) fn frozen_for_bucket(&self, number: u64, gen: u64) {
        if let Some(journal) = &self.inner.journal {
            journal.lock().frozen.push_back(FrozenBatch {
                number,
                gen,
                status: Status::Bucket,
            });
        }
    }

    /// Under the seal lock: the unsealed batches are being sealed into one log object.
    pub(super) fn sealing_unsealed(&self) {
        if let Some(journal) = &self.inner.journal {
            let mut j = journal.lock();
            j.unsealed_since = None;
            j.unsealed_bytes = 0;
        }
    }

    /// The bucket now holds every batch numbered up to `covered`: their records go.
    pub(super) fn records_covered(&self, covered: u64) {
        let Some(journal) = &self.inner.journal else {
            return;
        };
        let doomed: Vec<u64> = {
            let mut j = journal.lock();
            j.covered = j.covered.max(covered);
            let kept = j.records.split_off(&(covered + 1));
            std::mem::replace(&mut j.records, kept)
                .into_iter()
                .collect()
        };
        if !doomed.is_empty() {
            self.spawn_record_deletes(doomed);
        }
    }

    /// Deletes records on a task of their own, counted so that a clean stop can wait for them
    /// (`records_deleted`): one still held by the journal then would be uploaded by the stop.
    fn spawn_record_deletes(&self, numbers: Vec<u64>) {
        let Some(journal) = &self.inner.journal else {
            return;
        };
        journal.lock().deleting += 1;
        let engine = self.clone();
        self.inner.tasks.spawn(async move {
            delete_records(&engine.inner.bucket, numbers).await;
            if let Some(journal) = &engine.inner.journal {
                journal.lock().deleting -= 1;
            }
        });
    }

    /// Waits (up to 5 s) until the records the bucket no longer needs are deleted.
    pub(super) async fn records_deleted(&self) {
        let Some(journal) = &self.inner.journal else {
            return;
        };
        for _ in 0..1000 {
            if journal.lock().deleting == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Seals the journaled batches for the bucket once they are due, should no barrier come
    /// to notice it (`record_written` does when one does).
    pub(super) fn spawn_coalescer(&self) {
        let weak = Arc::downgrade(&self.inner);
        let period = Duration::from_millis(self.inner.tuning.journal_coalesce_ms.max(10) / 2);
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                let due = engine
                    .inner
                    .journal
                    .as_ref()
                    .is_some_and(|j| engine.coalesce_due(&j.lock()));
                if due {
                    engine.kick_background_flush();
                }
            }
        });
    }

    /// At open, by a writer: the records a journal held that the bucket's log does not
    /// (the tier uploaded them to the bucket before the engine read it), replayed in order into
    /// the pending batch, which then goes to the bucket with `COVERED_KEY` past every record
    /// seen; then the records are deleted. Records after a missing number were never
    /// acknowledged (see the module's comment) and are dropped with the others.
    pub(super) async fn replay_records(&self) -> Result<(), EngineError> {
        let listed: Vec<u64> = self
            .inner
            .bucket
            .list(RECORD_PREFIX)
            .await?
            .iter()
            .filter_map(|o| o.key.strip_prefix(RECORD_PREFIX)?.parse().ok())
            .collect();
        let covered = self.covered_number().await?;
        let newest = listed.iter().copied().max().unwrap_or(0).max(covered);
        self.inner.state.write().next_batch = newest + 1;
        if listed.is_empty() {
            return Ok(());
        }
        let mut replayed = 0;
        let mut next = covered + 1;
        while listed.contains(&next) {
            self.replay_record(next).await?;
            replayed += 1;
            next += 1;
        }
        let dropped = listed.iter().filter(|n| **n >= next).count();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                missing = next,
                "dropping journal records stored after a missing one: never acknowledged"
            );
        }
        if replayed > 0 || dropped > 0 {
            self.inner
                .state
                .write()
                .pending
                .kv
                .insert(COVERED_KEY.to_vec(), Some(newest.to_be_bytes().to_vec()));
            self.inner.state.write().write_gen += 1;
            self.barrier(Waiting::Engine).await?;
        }
        tracing::info!(
            replayed,
            dropped,
            "journal records replayed into the bucket"
        );
        delete_records(&self.inner.bucket, listed).await;
        Ok(())
    }

    /// The number of the newest frozen batch the bucket holds (`COVERED_KEY`), 0 for none.
    pub(super) async fn covered_number(&self) -> Result<u64, EngineError> {
        Ok(match self.kv_get(COVERED_KEY).await? {
            Some(v) => u64::from_be_bytes(v.as_slice().try_into().map_err(|_| {
                EngineError::Corrupt(
                    "the pair that says which frozen batches the bucket holds is malformed".into(),
                )
            })?),
            None => 0,
        })
    }

    async fn replay_record(&self, number: u64) -> Result<(), EngineError> {
        let key = record_key(number);
        let object = self.inner.bucket.get(&key).await?;
        self.replay_object(&key, record_seq(number), &object)
    }

    /// Opens a record (a batch sealed as a log object numbered `seq`) and applies it to the
    /// pending batch, as one more mutation.
    pub(super) fn replay_object(
        &self,
        key: &str,
        seq: u64,
        object: &[u8],
    ) -> Result<(), EngineError> {
        let malformed = || EngineError::Corrupt(format!("{key}: not a journal record"));
        let size = object.len() as u64;
        if size < LOG_HEADER_BYTES as u64 + logobj::LOG_TRAILER_BYTES
            || object[..LOG_HEADER_BYTES] != logobj::log_header(seq)
        {
            return Err(malformed());
        }
        let trailer = &object[(size - logobj::LOG_TRAILER_BYTES) as usize..];
        let range = logobj::parse_trailer(key, size, trailer)?;
        let ops = logobj::open_log_meta(
            &self.inner.sealer,
            key,
            seq,
            &object[range.start as usize..range.end as usize],
        )?;
        let mut data = Vec::new();
        for op in &ops {
            if let MetaOp::ExtentSet { ino, index, ptr } = op {
                let at = ptr.offset as usize;
                let frame = object
                    .get(at..at + ptr.length as usize)
                    .ok_or_else(malformed)?;
                let plain = frame::decode(&self.inner.sealer, *ino, *index, frame)
                    .map_err(|e| EngineError::Corrupt(format!("{key}: {e}")))?;
                data.push(plain);
            }
        }
        let mut data = data.into_iter();
        let mut st = self.inner.state.write();
        for op in ops {
            match op {
                MetaOp::KvPut { key, value } => {
                    st.pending.kv.insert(key, Some(value));
                }
                MetaOp::KvDelete { key } => {
                    st.pending.kv.insert(key, None);
                }
                MetaOp::KvDeleteRange { start, end } => st.cut_kv(start, end),
                MetaOp::ExtentClearRange { ino, from, to } => st.cut_extents(ino, from, to),
                MetaOp::ExtentClear { ino, index } => {
                    st.pending.extents.insert((ino, index), Dirty::Hole);
                }
                MetaOp::ExtentSet { ino, index, .. } => {
                    let plain = data.next().expect("one per ExtentSet");
                    st.pending
                        .extents
                        .insert((ino, index), Dirty::Data(Arc::new(plain)));
                }
                MetaOp::HoldsLz4 { .. } => {}
            }
        }
        st.write_gen += 1;
        Ok(())
    }
}

/// Deletes records; one that stays (a failed delete, or a garbage delete a crash undoes) is
/// numbered at most `COVERED_KEY`'s value, so no open replays it, and the next open deletes it.
async fn delete_records(bucket: &SharedBucket, numbers: Vec<u64>) {
    let keys = numbers.into_iter().map(record_key).collect();
    delete_needless(bucket, keys, "journal record").await;
}

/// Deletes objects the bucket no longer needs (journal and side records), 16 at a time; one
/// that stays is ignored by every open and deleted by the next.
pub(super) async fn delete_needless(bucket: &SharedBucket, keys: Vec<String>, what: &'static str) {
    let deletes = futures::stream::iter(keys)
        .map(|key| {
            let bucket = bucket.clone();
            async move {
                if let Err(e) = bucket.delete(&key, DeleteMode::Garbage).await {
                    tracing::warn!(%key, error = %e, "could not delete a {what} the bucket no longer needs; the next open deletes it");
                }
            }
        })
        .buffer_unordered(16);
    deletes.collect::<Vec<()>>().await;
}
