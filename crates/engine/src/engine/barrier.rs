//! The flush barrier and the upload pipeline: freeze, seal, upload with a conditional create,
//! commit in sequence order. Also the engine's own flushes (memory filling up, the periodic one).

use super::*;

/// Who waits for a flush: the codec follows (`Engine::codec_for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiting {
    /// A client's barrier, or write-behind ahead of the one that will come.
    Client,
    /// The engine's own: memory filling up, the periodic flush, repacking, closing.
    Engine,
}

/// A sealed log object waiting for (or retrying) its upload.
#[derive(Clone)]
pub(super) struct Sealed {
    pub(super) seq: u64,
    pub(super) object: Bytes,
    pub(super) ops: Arc<Vec<MetaOp>>,
    /// The write generation that is durable once this object is.
    pub(super) gen: u64,
    pub(super) upload: UploadState,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum UploadState {
    Waiting,
    InFlight,
    Stored,
}

/// Flushes run in two stages so that sealing one batch overlaps with uploading the previous
/// one: stage one (under `seal`) freezes the pending batch, seals it and queues it; stage two
/// (under `upload`) uploads up to UPLOADS_IN_FLIGHT_MAX queued objects at once and commits
/// them strictly in sequence order as they are stored.
pub(super) struct SealCtl {
    pub(super) next_seq: u64,
    /// With journaled barriers: how many batches at the back of `flushing` are frozen but not
    /// yet sealed for the bucket.
    pub(super) unsealed: usize,
}

pub(super) struct UploadCtl {
    pub(super) checkpoint_seq: u64,
    /// Checkpoints of this process (the one it opened first) and when they were begun, oldest
    /// first; only the newest older than `reseal_after` and those after it are kept.
    pub(super) checkpoints_begun: VecDeque<(u64, tokio::time::Instant)>,
    pub(super) log_bytes_since_checkpoint: u64,
    /// Log objects in the bucket and their sizes in bytes (for the garbage collector, and
    /// `Inner::log_bytes_stored`).
    pub(super) known_logs: BTreeMap<u64, u64>,
}

impl Engine {
    pub(super) fn spawn_periodic_flush(&self, interval: Duration) {
        let weak = Arc::downgrade(&self.inner);
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine.has_unflushed() {
                    if let Err(e) = engine.barrier(Waiting::Engine).await {
                        tracing::error!(error = %e, "periodic flush failed; unflushed writes stay in memory and are retried");
                    }
                }
            }
        });
    }

    /// Starts a background flush once enough data is pending; writers wait only while there is
    /// more than PENDING_BYTES_MAX pending or DIRTY_BYTES_MAX unflushed.
    pub(super) async fn make_room(&self) -> Result<(), EngineError> {
        loop {
            // Registered before looking, so that a commit in between is not missed.
            let committed = self.inner.committed_notify.notified();
            tokio::pin!(committed);
            committed.as_mut().enable();
            let (pending, unflushed) = {
                let st = self.inner.state.read();
                (st.pending.data_bytes(), st.unflushed_bytes())
            };
            if pending as u64 >= self.inner.tuning.dirty_bytes_flush_start {
                self.kick_background_flush();
            }
            if pending < PENDING_BYTES_MAX && unflushed < DIRTY_BYTES_MAX {
                return Ok(());
            }
            if self.inner.upload_failing.load(Ordering::Acquire) {
                // The store is refusing uploads: retry in the foreground so this writer gets
                // the error instead of waiting without end.
                self.barrier(Waiting::Engine).await?;
                continue;
            }
            // Wait for an upload to commit (or a moment, in case a kick was missed).
            let _ = tokio::time::timeout(Duration::from_millis(50), committed).await;
        }
    }

    /// Seals the pending batch on a background task. Once its batch is sealed, the task lets the
    /// next kick seal another, and kicks it itself if enough is pending by then, so sealing
    /// overlaps with the upload before it. Writers held at DIRTY_BYTES_MAX wait for a commit
    /// and kick only after it, so without this every seal would wait for the upload before it
    /// (docs/benchmarks/2026-11-26-pipelined-bulk-writes.md).
    pub(super) fn kick_background_flush(&self) {
        if self.inner.background_flush.swap(true, Ordering::AcqRel) {
            return;
        }
        let engine = self.clone();
        self.inner.tasks.spawn(async move {
            engine.wait_for_checkpoint().await;
            let target = engine.inner.state.read().write_gen;
            let mut untimed = PartTimes::default();
            engine.seal_pending(target, Waiting::Engine, &mut untimed).await;
            engine
                .inner
                .background_flush
                .store(false, Ordering::Release);
            let pending = engine.inner.state.read().pending.data_bytes();
            if pending as u64 >= engine.inner.tuning.dirty_bytes_flush_start {
                engine.kick_background_flush();
            }
            if let Err(e) = engine.upload_queued(target, &mut untimed).await {
                tracing::error!(error = %e, "background flush failed; unflushed writes stay in memory and are retried");
            }
        });
    }

    /// Returns once every mutation applied before the call is durable in the bucket.
    /// Concurrent callers share uploads (group commit). A client's barrier (NBD FLUSH, FUA, an
    /// admin change): it counts towards the cadence that turns write-behind on.
    pub async fn flush(&self) -> Result<(), EngineError> {
        let started = tokio::time::Instant::now();
        self.inner.barrier_cadence.note();
        self.wait_for_checkpoint().await;
        let mut parts = PartTimes::default();
        parts.add(BarrierPart::CheckpointHold, started);
        let result = self.timed_barrier(Waiting::Client, &mut parts).await;
        self.inner
            .counters
            .barrier_times
            .record(started.elapsed(), &parts);
        result
    }

    /// Holds a client's barrier, or write-behind, while a checkpoint runs and the log since the
    /// last one has grown to twice the checkpoint interval: commits that outran checkpoints
    /// would otherwise grow the changes held in memory, and the log replayed at open, without
    /// bound. The engine's own barriers (a checkpoint's repacking among them) never wait here.
    pub(super) async fn wait_for_checkpoint(&self) {
        let mut held = false;
        while self.inner.checkpoint_running.load(Ordering::Acquire) && self.checkpoint_lags() {
            if !held {
                held = true;
                self.inner
                    .counters
                    .barriers_held_for_checkpoint
                    .fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn checkpoint_lags(&self) -> bool {
        let t = &self.inner.tuning;
        let extents = self.inner.state.read().committed.live().extent_count();
        self.inner.checkpoint_lag_objects.load(Ordering::Relaxed)
            >= 2 * t.log_objects_per_checkpoint(extents)
            || self.inner.checkpoint_lag_bytes.load(Ordering::Relaxed)
                >= 2 * t.log_bytes_per_checkpoint
    }

    /// The barrier itself: a client's (through `flush`, which also counts it towards the
    /// cadence) or the engine's own; `waiting` says whose, and so which codec seals it.
    pub(super) async fn barrier(&self, waiting: Waiting) -> Result<(), EngineError> {
        self.timed_barrier(waiting, &mut PartTimes::default()).await
    }

    /// `barrier`, adding the time of each of its parts to `parts`.
    pub(super) async fn timed_barrier(
        &self,
        waiting: Waiting,
        parts: &mut PartTimes,
    ) -> Result<(), EngineError> {
        if self.inner.read_only {
            return Ok(());
        }
        let started = tokio::time::Instant::now();
        let (target, pending_bytes) = {
            let st = self.inner.state.read();
            (st.write_gen, st.pending.data_bytes())
        };
        let result = if waiting == Waiting::Client && self.journaling() {
            self.journaled_barrier(target, parts).await
        } else {
            self.bucket_barrier(target, waiting, parts).await
        };
        let wait_us = started.elapsed().as_micros() as u64;
        tracing::debug!(target, pending_bytes, wait_us, ?waiting, "barrier");
        let c = &self.inner.counters;
        c.barriers.fetch_add(1, Ordering::Relaxed);
        c.barrier_wait_us.fetch_add(wait_us, Ordering::Relaxed);
        result
    }

    /// The write generation durable for whoever waits: with journaled barriers a client's
    /// writes are durable once in the journal, the engine's own barriers (closing, a named
    /// checkpoint, repacking) wait for the bucket.
    fn durable_for(&self, waiting: Waiting) -> u64 {
        match waiting {
            Waiting::Client => self.inner.durable_gen.load(Ordering::Acquire),
            Waiting::Engine => self.inner.bucket_gen.load(Ordering::Acquire),
        }
    }

    /// Seals what is pending and uploads it, retrying through an outage as long as allowed,
    /// until `target` is durable for `waiting`.
    pub(super) async fn bucket_barrier(
        &self,
        target: u64,
        waiting: Waiting,
        parts: &mut PartTimes,
    ) -> Result<(), EngineError> {
        let mut retries = 0;
        loop {
            if self.durable_for(waiting) >= target {
                break Ok(());
            }
            if let Some(why) = &*self.inner.poisoned.lock() {
                break Err(EngineError::Poisoned(why.clone()));
            }
            let attempt_started = tokio::time::Instant::now();
            self.seal_pending(target, waiting, parts).await;
            match self.upload_queued(target, parts).await {
                Ok(()) => {}
                Err(EngineError::Store(StoreError::Transient(why))) => {
                    match self.outage_wait(OutageSide::Uploads, attempt_started, &why, retries) {
                        Some(wait) => {
                            retries += 1;
                            let sleeping = tokio::time::Instant::now();
                            tokio::time::sleep(wait).await;
                            parts.add(BarrierPart::OutageWait, sleeping);
                        }
                        None => break Err(EngineError::Store(StoreError::Transient(why))),
                    }
                }
                Err(e) => break Err(e),
            }
        }
    }

    /// Stage one: unless a queued batch already covers `target`, freeze the pending batch, seal
    /// it and queue it. `parts` gets the time waited for the seal lock and the time sealing.
    pub(super) async fn seal_pending(&self, target: u64, waiting: Waiting, parts: &mut PartTimes) {
        let locking = tokio::time::Instant::now();
        let mut ctl = self.inner.seal.lock().await;
        let freezing = parts.add(BarrierPart::SealWait, locking);
        let frozen_gen = self.inner.queue.lock().back().map(|s| s.gen);
        if frozen_gen.is_some_and(|g| g >= target)
            || self.inner.bucket_gen.load(Ordering::Acquire) >= target
        {
            return;
        }
        let batch = {
            let mut st = self.inner.state.write();
            let mut batch = std::mem::take(&mut st.pending);
            batch.gen = st.write_gen;
            if batch.is_empty() && ctl.unsealed == 0 {
                // Nothing new since the last freeze: the queued batches (if any) cover it all.
                drop(st);
                if frozen_gen.is_none() {
                    self.inner
                        .durable_gen
                        .fetch_max(batch.gen, Ordering::AcqRel);
                    self.inner.bucket_gen.fetch_max(batch.gen, Ordering::AcqRel);
                }
                return;
            }
            if !batch.is_empty() {
                batch.number = st.next_batch;
                st.next_batch += 1;
                if self.journaling() {
                    self.frozen_for_bucket(batch.number, batch.gen);
                }
            }
            // With journaled barriers, the batches frozen since the last seal (their records
            // in the journal) go to the bucket together, as one.
            let batch = if ctl.unsealed > 0 {
                let from = st.flushing.len() - ctl.unsealed;
                let mut earlier = st.flushing.drain(from..);
                let mut merged = earlier
                    .next()
                    .map(|b| Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone()))
                    .expect("unsealed batches are flushing");
                for b in earlier {
                    merged.absorb(Arc::try_unwrap(b).unwrap_or_else(|b| (*b).clone()));
                }
                if !batch.is_empty() {
                    merged.absorb(batch);
                }
                ctl.unsealed = 0;
                self.sealing_unsealed();
                merged
            } else {
                batch
            };
            let mut batch = batch;
            if batch.number > 0 {
                batch.kv.insert(
                    journaled::COVERED_KEY.to_vec(),
                    Some(batch.number.to_be_bytes().to_vec()),
                );
            }
            let batch = Arc::new(batch);
            st.flushing.push_back(batch.clone());
            batch
        };
        let seq = ctl.next_seq;
        ctl.next_seq += 1;
        let started = tokio::time::Instant::now();
        let gen = batch.gen;
        let extents = batch.extents.len();
        let codec = self.codec_for(extents, waiting);
        let (object, ops) = self.encode(seq, batch, codec).await;
        tracing::debug!(
            seq,
            bytes = object.as_ref().len(),
            extents,
            seal_us = started.elapsed().as_micros() as u64,
            ?codec,
            "sealed"
        );
        self.inner.queue.lock().push_back(Sealed {
            upload: UploadState::Waiting,
            seq,
            object: object.into_bytes(),
            ops: Arc::new(ops),
            gen,
        });
        let c = &self.inner.counters;
        c.flushes.fetch_add(1, Ordering::Relaxed);
        if codec == Codec::Lz4 {
            c.flushes_lz4.fetch_add(1, Ordering::Relaxed);
        }
        parts.add(BarrierPart::Seal, freezing);
    }

    /// Stage two: upload and commit queued objects in order until `target` is durable.
    /// Every caller waiting when an upload fails gets the error (and decides, in `barrier`,
    /// whether to wait out an outage): were it handed to one of them only, a barrier could wait
    /// without end behind others that keep retrying (the engine's periodic flush does).
    /// `parts` gets the time of the PUTs run here, of the commits, and of the waits between.
    pub(super) async fn upload_queued(
        &self,
        target: u64,
        parts: &mut PartTimes,
    ) -> Result<(), EngineError> {
        let failures = self.inner.upload_failures.load(Ordering::Acquire);
        loop {
            if self.inner.bucket_gen.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            let stored = self.inner.stored_notify.notified();
            tokio::pin!(stored);
            stored.as_mut().enable();
            if let Some((seq, object)) = self.start_uploads() {
                let putting = tokio::time::Instant::now();
                self.run_upload(seq, object).await;
                parts.add(BarrierPart::Put, putting);
            }
            let mut committed_any = false;
            {
                let locking = tokio::time::Instant::now();
                let mut ctl = self.inner.upload.lock().await;
                let committing = parts.add(BarrierPart::UploadWait, locking);
                loop {
                    let front = self.inner.queue.lock().front().map(|s| s.upload.clone());
                    match front {
                        Some(UploadState::Stored) => {
                            let sealed = self
                                .inner
                                .queue
                                .lock()
                                .front()
                                .cloned()
                                .expect("the front was just seen");
                            // Commit before dequeuing: whoever finds the queue empty may rely on
                            // it being durable.
                            self.commit_sealed(&mut ctl, &sealed);
                            self.inner.queue.lock().pop_front();
                            self.inner.committed_notify.notify_waiters();
                            committed_any = true;
                        }
                        Some(_) => break,
                        None => {
                            parts.add(BarrierPart::Commit, committing);
                            return Ok(());
                        }
                    }
                }
                parts.add(BarrierPart::Commit, committing);
            }
            if self.inner.bucket_gen.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            if self.inner.upload_failures.load(Ordering::Acquire) != failures {
                let why = self.inner.upload_error.lock().clone();
                return Err(EngineError::Store(StoreError::Transient(why)));
            }
            if let Some(why) = &*self.inner.poisoned.lock() {
                return Err(EngineError::Poisoned(why.clone()));
            }
            // Only the end of an upload under way wakes this wait. Uploads start within the
            // first UPLOADS_IN_FLIGHT_MAX queued objects, so once committed ones (by this task
            // or another) leave the front, the ones behind are started here first; with none
            // in flight, nothing would ever wake it.
            let in_flight = self
                .inner
                .queue
                .lock()
                .iter()
                .any(|s| s.upload == UploadState::InFlight);
            if committed_any || !in_flight {
                continue;
            }
            let waiting = tokio::time::Instant::now();
            stored.await;
            parts.add(BarrierPart::UploadWait, waiting);
        }
    }

    /// Starts the uploads of queued objects, at most UPLOADS_IN_FLIGHT_MAX at a time. When none
    /// was in flight, the first is returned for the caller to run itself (`run_upload`): on
    /// the fsync path, handing it to a task of its own cost a wake-up of another worker thread
    /// (~60 us on the test VM) before and after the write.
    pub(super) fn start_uploads(&self) -> Option<(u64, Bytes)> {
        let mut queue = self.inner.queue.lock();
        let mut in_flight = queue
            .iter()
            .filter(|s| s.upload == UploadState::InFlight)
            .count();
        let mut run_here = None;
        for sealed in queue.iter_mut().take(UPLOADS_IN_FLIGHT_MAX) {
            if in_flight >= UPLOADS_IN_FLIGHT_MAX {
                break;
            }
            if sealed.upload != UploadState::Waiting {
                continue;
            }
            sealed.upload = UploadState::InFlight;
            let upload = (sealed.seq, sealed.object.clone());
            if in_flight == 0 && run_here.is_none() {
                run_here = Some(upload);
            } else {
                let engine = self.clone();
                self.inner
                    .tasks
                    .spawn(async move { engine.run_upload(upload.0, upload.1).await });
            }
            in_flight += 1;
        }
        run_here
    }

    /// Uploads a queued object and records the outcome in the queue. If the caller gives up
    /// half way (its request was cancelled), the object goes back to waiting, and the next
    /// flush uploads it (an upload that did land is recognised then).
    pub(super) async fn run_upload(&self, seq: u64, object: Bytes) {
        struct Unfinished<'a>(Option<&'a Engine>, u64);
        impl Drop for Unfinished<'_> {
            fn drop(&mut self) {
                if let Some(engine) = self.0 {
                    engine.set_upload_state(self.1, UploadState::Waiting);
                }
            }
        }
        let mut unfinished = Unfinished(Some(self), seq);
        let started = tokio::time::Instant::now();
        let result = self.upload(seq, object).await;
        unfinished.0 = None;
        tracing::debug!(
            seq,
            upload_us = started.elapsed().as_micros() as u64,
            ok = result.is_ok(),
            "uploaded"
        );
        match result {
            Ok(()) => {
                self.inner.upload_failing.store(false, Ordering::Release);
                self.outage_over(OutageSide::Uploads);
                self.set_upload_state(seq, UploadState::Stored);
            }
            Err(e) => {
                // Retried, byte for byte, by the next flush; every waiter hears of the failure.
                tracing::error!(seq, error = %e, "upload failed; the sealed object stays queued and is uploaded again by the next flush");
                *self.inner.upload_error.lock() = match e {
                    EngineError::Store(StoreError::Transient(why)) => why,
                    other => other.to_string(),
                };
                self.inner.upload_failing.store(true, Ordering::Release);
                self.inner.upload_failures.fetch_add(1, Ordering::AcqRel);
                self.set_upload_state(seq, UploadState::Waiting);
            }
        }
    }

    pub(super) fn set_upload_state(&self, seq: u64, state: UploadState) {
        if let Some(s) = self.inner.queue.lock().iter_mut().find(|s| s.seq == seq) {
            s.upload = state;
        }
        self.inner.stored_notify.notify_waiters();
    }

    pub(super) async fn upload(&self, seq: u64, object: Bytes) -> Result<(), EngineError> {
        let key = logobj::log_key(seq);
        match self
            .inner
            .bucket
            .put(&key, object.clone(), PutMode::Create)
            .await
        {
            Ok(()) => Ok(()),
            // An earlier attempt that reported failure (a timeout) may have stored it after all.
            Err(StoreError::AlreadyExists(_))
                if self
                    .inner
                    .bucket
                    .get(&key)
                    .await
                    .is_ok_and(|stored| stored == object) =>
            {
                Ok(())
            }
            Err(StoreError::AlreadyExists(_)) => {
                let why = format!(
                    "{key} was written by another process: a second writer is using this bucket"
                );
                tracing::error!("{why}");
                *self.inner.poisoned.lock() = Some(why.clone());
                Err(EngineError::Poisoned(why))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Makes an uploaded log object the committed state.
    pub(super) fn commit_sealed(&self, ctl: &mut UploadCtl, sealed: &Sealed) {
        let (seq, object) = (sealed.seq, &sealed.object);
        let mut evicted = Vec::new();
        let covered_records;
        let snapshot = {
            let mut st = self.inner.state.write();
            let batch = st
                .flushing
                .pop_front()
                .expect("a committed batch was flushing");
            assert_eq!(
                batch.gen, sealed.gen,
                "batches commit in the order they were frozen"
            );
            for op in sealed.ops.iter() {
                st.committed.apply(op);
            }
            // A cut names a range (often to the end of a file), not the extents it covered.
            for (ino, cuts) in &batch.extent_cuts {
                for &(from, to) in cuts {
                    st.clean.drop_range(*ino, from, to);
                }
            }
            for ((ino, index), d) in &batch.extents {
                match d {
                    Dirty::Data(buf) => {
                        if let Some((_, old)) = st.clean.push((*ino, *index), buf.clone()) {
                            evicted.push(old);
                        }
                    }
                    // Unchanged contents: what the memory tier holds of it is still right, and
                    // leaving it out keeps the collector's cold extents from evicting hot ones.
                    Dirty::Moved(_) => {}
                    Dirty::Hole => {
                        st.clean.pop((*ino, *index));
                    }
                }
            }
            st.commit_gen += 1;
            // Counted before the flushes waiting for it can return: a caller that reads the
            // counters after its flush sees its object in them.
            let c = &self.inner.counters;
            c.log_objects_written.fetch_add(1, Ordering::Relaxed);
            c.log_bytes_written
                .fetch_add(object.len() as u64, Ordering::Relaxed);
            self.inner
                .durable_gen
                .fetch_max(batch.gen, Ordering::AcqRel);
            self.inner.bucket_gen.fetch_max(batch.gen, Ordering::AcqRel);
            covered_records = batch.number;
            ctl.log_bytes_since_checkpoint += object.len() as u64;
            let due = seq
                >= ctl.checkpoint_seq
                    + self
                        .inner
                        .tuning
                        .log_objects_per_checkpoint(st.committed.live().extent_count())
                || ctl.log_bytes_since_checkpoint >= self.inner.tuning.log_bytes_per_checkpoint;
            (due && !self.inner.checkpoint_running.swap(true, Ordering::AcqRel))
                .then(|| st.committed.freeze(seq))
        };
        // Outside the lock, and after the batch is gone (it may hold some of the same extents).
        self.inner.extent_buffers.give_back(evicted);
        if self.journaling() {
            self.advance_durable();
            self.records_covered(covered_records);
        }
        self.side_records_covered(covered_records);
        ctl.known_logs.insert(seq, object.len() as u64);
        self.inner
            .checkpoint_lag_objects
            .store(seq.saturating_sub(ctl.checkpoint_seq), Ordering::Relaxed);
        self.inner
            .checkpoint_lag_bytes
            .store(ctl.log_bytes_since_checkpoint, Ordering::Relaxed);
        self.inner
            .log_bytes_stored
            .fetch_add(object.len() as u64, Ordering::Relaxed);
        if let Some(c) = &self.inner.disk_cache {
            c.put_object(Space::Log, seq, object.clone());
        }
        self.inner.last_commit_us.store(
            self.inner.epoch.elapsed().as_micros() as u64,
            Ordering::Release,
        );
        if let Some(frozen) = snapshot {
            let covered = self.begin_checkpoint(ctl, frozen.seq);
            let engine = self.clone();
            self.inner.tasks.spawn(async move {
                // Cleared however the task ends (a panic included), so the next one can run.
                let _running = ClearOnDrop(&engine.inner.checkpoint_running);
                let seq = frozen.seq;
                if let Err(e) = engine
                    .checkpoint_and_collect(frozen, covered, Repack::Yes)
                    .await
                {
                    tracing::error!(seq, error = %e, "checkpoint failed; the log keeps growing until the next one");
                }
            });
        }
    }
}
