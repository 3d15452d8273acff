//! Checkpoints: the committed metadata written as of a log object, so that opening replays
//! only what follows it, and the collection of what it made unnecessary.

use super::*;

/// What a checkpoint covers: the log objects (the candidates for collection) with their sizes
/// in bytes, those among them old enough for re-sealing and for repacking when fragmented (up
/// to `aged_through`, covered by a checkpoint begun at least `reseal_after` earlier), and the
/// bytes of the log objects written since the checkpoint before.
pub(super) struct Covered {
    pub(super) logs: Vec<(u64, u64)>,
    pub(super) aged_through: u64,
    pub(super) log_bytes: u64,
}

impl Engine {
    /// Starts the interval of the checkpoint as of log object `seq` (the caller holds the
    /// committed map as of `seq` and has set `checkpoint_running`); returns what it covers.
    pub(super) fn begin_checkpoint(&self, ctl: &mut UploadCtl, seq: u64) -> Covered {
        self.inner
            .repacked_uncollected
            .store(false, Ordering::Release);
        ctl.checkpoint_seq = seq;
        let log_bytes = std::mem::take(&mut ctl.log_bytes_since_checkpoint);
        let last = ctl.known_logs.last_key_value().map_or(seq, |(s, _)| *s);
        self.inner
            .checkpoint_lag_objects
            .store(last.saturating_sub(seq), Ordering::Relaxed);
        self.inner.checkpoint_lag_bytes.store(0, Ordering::Relaxed);
        // The newest earlier checkpoint begun at least `reseal_after` ago: what it covered has
        // been live that long. Under fsync-heavy load checkpoints come every few seconds, so
        // their count says nothing of age.
        let now = tokio::time::Instant::now();
        let old_enough =
            |at: &tokio::time::Instant| now.duration_since(*at) >= self.inner.tuning.reseal_after();
        while ctl.checkpoints_begun.len() > 1 && old_enough(&ctl.checkpoints_begun[1].1) {
            ctl.checkpoints_begun.pop_front();
        }
        let aged_through = match ctl.checkpoints_begun.front() {
            Some((s, at)) if old_enough(at) => *s,
            _ => 0,
        };
        ctl.checkpoints_begun.push_back((seq, now));
        Covered {
            logs: ctl
                .known_logs
                .range(..=seq)
                .map(|(s, bytes)| (*s, *bytes))
                .collect(),
            aged_through,
            log_bytes,
        }
    }

    /// Checks a few times per `quiet` whether the engine has been quiet that long with enough
    /// log objects since the last checkpoint, and writes one then (`Tuning::quiet_checkpoint_after_ms`).
    pub(super) fn spawn_quiet_checkpoints(&self, quiet: Duration) {
        let weak = Arc::downgrade(&self.inner);
        self.inner.tasks.spawn(async move {
            let mut tick = tokio::time::interval(quiet / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if let Err(e) = engine.checkpoint_if_quiet(quiet).await {
                    tracing::error!(error = %e, "quiet checkpoint failed; the next regular one collects instead");
                }
            }
        });
    }

    /// When quiet: a checkpoint if enough log objects await one, repacking the sparse ones;
    /// then, if the last checkpoint (that one or a regular one) repacked extents, one more
    /// that only collects, so that the objects the extents were moved out of are deleted too
    /// (before they turn into files of a `file://` bucket). It does not repack, so after it
    /// nothing is due until the next commit: an idle engine makes no requests.
    pub(super) async fn checkpoint_if_quiet(&self, quiet: Duration) -> Result<(), EngineError> {
        let quiet_since = Duration::from_micros(self.inner.last_commit_us.load(Ordering::Acquire));
        if self.inner.epoch.elapsed().saturating_sub(quiet_since) < quiet
            || self.inner.poisoned.lock().is_some()
        {
            return Ok(());
        }
        let since_checkpoint = |ctl: &UploadCtl| {
            ctl.known_logs
                .last_key_value()
                .map_or(0, |(s, _)| s.saturating_sub(ctl.checkpoint_seq))
        };
        self.quiet_checkpoint(
            |ctl, st| {
                since_checkpoint(ctl) * self.inner.tuning.quiet_checkpoint_fraction
                    >= self
                        .inner
                        .tuning
                        .log_objects_per_checkpoint(st.committed.live().extent_count())
            },
            Repack::Yes,
        )
        .await?;
        self.quiet_checkpoint(
            |ctl, _| {
                since_checkpoint(ctl) > 0 && self.inner.repacked_uncollected.load(Ordering::Acquire)
            },
            Repack::No,
        )
        .await
    }

    /// Writes a checkpoint as of the last committed log object, and collects, if `due` says
    /// so and none is running. Commits wait meanwhile only for the changes to be frozen.
    pub(super) async fn quiet_checkpoint(
        &self,
        due: impl Fn(&UploadCtl, &State) -> bool,
        repack: Repack,
    ) -> Result<(), EngineError> {
        // Commits happen under `upload`: holding it, the changes are exactly as of the last one.
        let (frozen, covered) = {
            let mut ctl = self.inner.upload.lock().await;
            let frozen = {
                let mut st = self.inner.state.write();
                (due(&ctl, &st) && !self.inner.checkpoint_running.swap(true, Ordering::AcqRel))
                    .then(|| {
                        let seq = *ctl
                            .known_logs
                            .last_key_value()
                            .expect("a due checkpoint follows a committed log object")
                            .0;
                        st.committed.freeze(seq)
                    })
            };
            let Some(frozen) = frozen else {
                return Ok(());
            };
            let covered = self.begin_checkpoint(&mut ctl, frozen.seq);
            (frozen, covered)
        };
        let _running = ClearOnDrop(&self.inner.checkpoint_running);
        tracing::debug!(seq = frozen.seq, "quiet: writing a checkpoint");
        self.checkpoint_and_collect(frozen, covered, repack).await
    }

    /// Writes the checkpoint of `frozen` (`write_checkpoint`), then deletes what that made
    /// unnecessary: older manifests, runs no manifest names, and log objects up to its log
    /// object that hold no live extent; then repacks those that hold few live extents, and
    /// re-seals long-lived lz4 frames, so that the next checkpoint can delete the objects they
    /// leave.
    pub(super) async fn checkpoint_and_collect(
        &self,
        frozen: Arc<Frozen>,
        covered: Covered,
        repack: Repack,
    ) -> Result<(), EngineError> {
        let seq = frozen.seq;
        let base = self.write_checkpoint(&frozen).await?;
        let collected = async {
            let live = self.collect(seq, &base.infos, &covered).await?;
            tracing::info!(seq, "checkpoint written");
            if repack == Repack::Yes {
                if let Err(e) = self
                    .repack(&base, &live.into_iter().collect(), &covered)
                    .await
                {
                    tracing::warn!(seq, error = %e, "moving extents out of log objects failed; they stay until a later checkpoint tries again");
                }
            }
            Ok(())
        }
        .await;
        self.inner
            .counters
            .checkpoints_collected
            .fetch_add(1, Ordering::Relaxed);
        collected
    }
}

impl Engine {
    /// Deletes what manifest `seq` (naming `runs`) made unnecessary and no named checkpoint
    /// keeps: older manifests, runs no manifest names, and the covered log objects that hold no
    /// live extent. Returns the covered log objects still live that no named checkpoint keeps
    /// (those worth repacking), with their sizes.
    pub(super) async fn collect(
        &self,
        seq: u64,
        runs: &[RunInfo],
        covered: &Covered,
    ) -> Result<Vec<(u64, u64)>, EngineError> {
        self.collect_runs(seq, runs).await?;
        // Live bytes of a log object only ever fall (new pointers point at new objects), so an
        // object found dead here stays dead.
        type Logs = Vec<(u64, u64)>;
        let (dead, live): (Logs, Logs) = {
            let st = self.inner.state.read();
            let pins = self.inner.pins.lock();
            covered
                .logs
                .iter()
                .filter(|(s, _)| !pins.holds_object(*s))
                .partition(|(s, _)| st.committed.live().live_bytes(*s) == 0)
        };
        // What is stored falls as each deletion is acknowledged, so that `bucketfs status`
        // agrees with the bucket while a long collection is under way (the upload lock taken
        // below may wait for uploads in flight).
        let deleted: Vec<Result<u64, StoreError>> = futures::stream::iter(dead)
            .map(|(s, bytes)| async move {
                self.inner
                    .bucket
                    .delete(&logobj::log_key(s), DeleteMode::Garbage)
                    .await?;
                self.inner
                    .log_bytes_stored
                    .fetch_sub(bytes, Ordering::Relaxed);
                Ok::<u64, StoreError>(s)
            })
            .buffer_unordered(DELETE_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        // Every deletion that was acknowledged is forgotten, even when another one failed:
        // its bytes are already off `log_bytes_stored`.
        let (deleted, failed): (Vec<_>, Vec<_>) = deleted.into_iter().partition(Result::is_ok);
        let deleted: Vec<u64> = deleted.into_iter().flatten().collect();
        {
            // Not held any longer: the repack below flushes, and committing needs it.
            let mut ctl = self.inner.upload.lock().await;
            for s in &deleted {
                ctl.known_logs.remove(s);
                if let Some(c) = &self.inner.disk_cache {
                    c.drop_object(Space::Log, *s);
                }
            }
        }
        self.inner
            .counters
            .log_objects_deleted
            .fetch_add(deleted.len() as u64, Ordering::Relaxed);
        if let Some(Err(e)) = failed.into_iter().next() {
            return Err(e.into());
        }
        Ok(live)
    }

    /// Writes the checkpoint of `frozen`: its runs (engine/compaction.rs decides which) and a
    /// manifest naming them with the object table as of `frozen`'s log object. Returns the new
    /// base, installed.
    pub(super) async fn write_checkpoint(
        &self,
        frozen: &Arc<Frozen>,
    ) -> Result<Arc<Base>, EngineError> {
        let seq = frozen.seq;
        let base = self.inner.state.read().committed.base().clone();
        let debits = match frozen.resolved() {
            Some(d) => d,
            None => {
                let d = crate::meta::resolve(frozen, &base).await?;
                self.inner.state.write().committed.resolve(frozen, &d)
            }
        };
        let objects = crate::meta::table_after(&base, frozen, &debits);
        let layout = if frozen.mem.is_empty() {
            None
        } else {
            Some(self.write_runs(frozen, &base).await?)
        };
        let (infos, runs, run_bytes, whole, sweep) = match layout {
            None => (
                base.infos.clone(),
                base.runs.clone(),
                0,
                false,
                base.sweep.clone(),
            ),
            Some(l) => (l.infos, l.runs, l.bytes_written, l.merged, l.sweep),
        };
        let manifest = logobj::encode_manifest(
            &self.inner.sealer,
            seq,
            &infos,
            &objects,
            sweep.as_ref().map(|s| (s.first_seq, s.from.as_slice())),
        );
        let manifest_bytes = manifest.len() as u64;
        let key = logobj::manifest_key(seq);
        let manifest = Bytes::from(manifest);
        match self
            .inner
            .bucket
            .put(&key, manifest.clone(), PutMode::Create)
            .await
        {
            // A retried checkpoint whose first manifest was stored after all: this one names
            // runs of the same sizes and an equal table.
            Err(StoreError::AlreadyExists(_)) => {
                self.inner
                    .bucket
                    .put(&key, manifest, PutMode::Overwrite)
                    .await?
            }
            other => other?,
        }
        let new_base = Arc::new(Base {
            runs,
            infos: infos.clone(),
            objects,
            manifest_seq: seq,
            sweep,
        });
        {
            let mut st = self.inner.state.write();
            st.committed.install(frozen, new_base.clone());
            // Readers holding the old base retry if its runs are collected under them.
            st.commit_gen += 1;
        }
        if self.inner.superblock_format_1.swap(false, Ordering::AcqRel) {
            recovery::migrate_superblock(&self.inner.bucket).await?;
        }
        let c = &self.inner.counters;
        c.checkpoints_written.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_bytes_written
            .fetch_add(run_bytes + manifest_bytes, Ordering::Relaxed);
        tracing::debug!(
            seq,
            run_bytes,
            whole,
            runs = infos.len(),
            "checkpoint run stored"
        );
        Ok(new_base)
    }

    /// Stores a run (part) and opens it from the bytes at hand.
    pub(super) async fn store_run(
        &self,
        info: RunInfo,
        object: Vec<u8>,
    ) -> Result<RunReader, EngineError> {
        let run_key = info.key();
        let reader = RunReader::from_object(
            self.inner.bucket.clone(),
            self.inner.sealer.clone(),
            &run_key,
            info.seal_id(),
            &object,
        )?
        .with_cache(self.inner.block_cache.clone())
        .with_disk_cache(self.inner.disk_cache.clone());
        let object = Bytes::from(object);
        match self
            .inner
            .bucket
            .put(&run_key, object.clone(), PutMode::Create)
            .await
        {
            // A run stored by a process that crashed before its manifest, or by a checkpoint
            // that failed after it: no manifest names it, so it may be replaced.
            Err(StoreError::AlreadyExists(_)) => {
                tracing::warn!(run = %run_key, "replacing a run no manifest names (left by a crash or a failed checkpoint)");
                self.inner
                    .bucket
                    .put(&run_key, object.clone(), PutMode::Overwrite)
                    .await?
            }
            other => other?,
        }
        if let Some(d) = &self.inner.disk_cache {
            d.put_object(Space::Run, info.seal_id(), object.clone());
        }
        Ok(reader)
    }

    /// Deletes what manifest `seq` made unnecessary: older manifests, runs it does not name, and
    /// the whole-map checkpoints of format 1.
    async fn collect_runs(&self, seq: u64, runs: &[RunInfo]) -> Result<(), EngineError> {
        let bucket = &self.inner.bucket;
        let mut garbage = Vec::new();
        for old in bucket.list("manifest/").await? {
            if logobj::parse_seq(&old.key, "manifest")
                .is_some_and(|s| s < seq && !self.inner.pins.lock().holds_manifest(s))
            {
                garbage.push(old.key);
            }
        }
        for old in bucket.list("run/").await? {
            if let Some((id, part)) = logobj::parse_run_key(&old.key).filter(|&(id, part)| {
                id < seq
                    && !runs.iter().any(|r| r.id == id && r.part == part)
                    && !self.inner.pins.lock().holds_run(id, part)
            }) {
                if let Some(d) = &self.inner.disk_cache {
                    d.drop_object(Space::Run, logobj::run_seal_id(id, part));
                }
                garbage.push(old.key);
            }
        }
        for old in bucket.list("checkpoint/").await? {
            garbage.push(old.key);
        }
        for key in garbage {
            bucket.delete(&key, DeleteMode::Garbage).await?;
        }
        Ok(())
    }
}
