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

/// The runs the newest manifest names, and how the next checkpoint writes its run.
#[derive(Debug, Clone)]
pub(super) struct RunSet {
    /// Oldest (the one whole-map run) first.
    pub(super) runs: Vec<RunInfo>,
    /// The next checkpoint writes the whole map as one run: the bucket has no manifest yet (a
    /// new or a format-1 bucket), or a checkpoint failed after taking its changes, so they are
    /// in no run.
    pub(super) full_next: bool,
    /// The superblock still says format 1: it is rewritten once a manifest is stored.
    pub(super) superblock_format_1: bool,
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
                        .log_objects_per_checkpoint(st.committed.extent_count() as u64)
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
    /// so and none is running. Commits wait meanwhile only for the map's clone.
    pub(super) async fn quiet_checkpoint(
        &self,
        due: impl Fn(&UploadCtl, &State) -> bool,
        repack: Repack,
    ) -> Result<(), EngineError> {
        // Commits happen under `upload`: holding it, the map is exactly as of the last one.
        let (seq, state, covered) = {
            let mut ctl = self.inner.upload.lock().await;
            let snapshot = {
                let mut st = self.inner.state.lock();
                (due(&ctl, &st) && !self.inner.checkpoint_running.swap(true, Ordering::AcqRel))
                    .then(|| {
                        let changes = st.committed.take_changes();
                        (st.committed.clone(), changes)
                    })
            };
            let Some((state, changes)) = snapshot else {
                return Ok(());
            };
            let seq = *ctl
                .known_logs
                .last_key_value()
                .expect("a due checkpoint follows a committed log object")
                .0;
            (seq, (state, changes), self.begin_checkpoint(&mut ctl, seq))
        };
        let _running = ClearOnDrop(&self.inner.checkpoint_running);
        tracing::debug!(seq, "quiet: writing a checkpoint");
        self.checkpoint_and_collect(seq, state.0, state.1, covered, repack)
            .await
    }

    /// Writes a checkpoint as of log object `seq`: a run of the `changes` since the last one
    /// (or of the whole `state`, see `RunSet`) and a manifest naming it with the runs before it.
    /// Then deletes what that made unnecessary: older manifests, runs no manifest names, and log
    /// objects up to `seq` that hold no live extent; then repacks those that hold few live
    /// extents, and re-seals long-lived lz4 frames, so that the next checkpoint can delete the
    /// objects they leave.
    pub(super) async fn checkpoint_and_collect(
        &self,
        seq: u64,
        state: MetaState,
        changes: MemRun,
        covered: Covered,
        repack: Repack,
    ) -> Result<(), EngineError> {
        let (manifest_runs, state) = self.write_runs(seq, state, changes).await?;
        let live = self.collect(seq, &manifest_runs, &covered).await?;
        tracing::info!(seq, "checkpoint written");
        if repack == Repack::No {
            return Ok(());
        }
        if let Err(e) = self
            .repack(&state, &live.into_iter().collect(), &covered)
            .await
        {
            tracing::warn!(seq, error = %e, "moving extents out of log objects failed; they stay until a later checkpoint tries again");
        }
        Ok(())
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
            let st = self.inner.state.lock();
            let pins = self.inner.pins.lock();
            covered
                .logs
                .iter()
                .filter(|(s, _)| !pins.holds_object(*s))
                .partition(|(s, _)| st.committed.live_bytes(*s) == 0)
        };
        let deleted: Vec<u64> = futures::stream::iter(dead)
            .map(|(s, _)| async move {
                self.inner
                    .bucket
                    .delete(&logobj::log_key(s), DeleteMode::Garbage)
                    .await
                    .map(|()| s)
            })
            .buffer_unordered(DELETE_CONCURRENCY)
            .try_collect()
            .await?;
        {
            // Not held any longer: the repack below flushes, and committing needs it.
            let mut ctl = self.inner.upload.lock().await;
            for s in &deleted {
                if let Some(bytes) = ctl.known_logs.remove(s) {
                    self.inner
                        .log_bytes_stored
                        .fetch_sub(bytes, Ordering::Relaxed);
                }
                if let Some(c) = &self.inner.disk_cache {
                    c.drop_object(*s);
                }
            }
        }
        self.inner
            .counters
            .log_objects_deleted
            .fetch_add(deleted.len() as u64, Ordering::Relaxed);
        Ok(live)
    }

    /// Stores the run of checkpoint `seq` and its manifest; returns the runs the manifest names
    /// and `state` (given back from the blocking thread that encoded it).
    pub(super) async fn write_runs(
        &self,
        seq: u64,
        state: MetaState,
        changes: MemRun,
    ) -> Result<(Vec<RunInfo>, MetaState), EngineError> {
        let before = {
            let mut runs = self.inner.runs.lock();
            let before = runs.clone();
            // Until the manifest is stored, these changes are in no run.
            runs.full_next = true;
            before
        };
        let engine = self.clone();
        let (run, state) = self
            .inner
            .tasks
            .spawn_blocking(move || {
                let sealer = &engine.inner.sealer;
                let deltas: u64 = before.runs.iter().skip(1).map(|r| r.size_bytes).sum();
                let base = before.runs.first().map_or(0, |r| r.size_bytes);
                let delta = (!before.full_next && !before.runs.is_empty())
                    .then(|| crate::lsm::run::encode(sealer, seq, changes.points, &changes.ranges));
                // The deltas together stay smaller than the whole map, so the runs hold at most
                // about twice the map and uploads stay proportional to the change.
                let run = match delta {
                    Some(d)
                        if deltas + d.len() as u64 <= base
                            && before.runs.len() < RUNS_PER_MANIFEST_MAX =>
                    {
                        (d, false)
                    }
                    _ => (
                        crate::lsm::run::encode(sealer, seq, state.entries(), &[]),
                        true,
                    ),
                };
                (run, state)
            })
            .await;
        let ((object, whole), run_bytes) = {
            let n = run.0.len() as u64;
            (run, n)
        };
        let run_key = logobj::run_key(seq);
        let object = Bytes::from(object);
        match self
            .inner
            .bucket
            .put(&run_key, object.clone(), PutMode::Create)
            .await
        {
            // A run stored by a process that crashed before its manifest: no manifest names it
            // (this one's newest is older than `seq`), so it is garbage and may be replaced.
            Err(StoreError::AlreadyExists(_)) => {
                tracing::warn!(run = %run_key, "replacing a run no manifest names (left by a crash)");
                self.inner
                    .bucket
                    .put(&run_key, object, PutMode::Overwrite)
                    .await?
            }
            other => other?,
        }
        let info = RunInfo {
            id: seq,
            size_bytes: run_bytes,
        };
        let mut runs = if whole {
            Vec::new()
        } else {
            self.inner.runs.lock().runs.clone()
        };
        runs.push(info);
        let manifest = logobj::encode_manifest(&self.inner.sealer, seq, &runs);
        let manifest_bytes = manifest.len() as u64;
        self.inner
            .bucket
            .put(
                &logobj::manifest_key(seq),
                Bytes::from(manifest),
                PutMode::Create,
            )
            .await?;
        let migrate = {
            let mut set = self.inner.runs.lock();
            set.runs = runs.clone();
            set.full_next = false;
            std::mem::take(&mut set.superblock_format_1)
        };
        if migrate {
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
            runs = runs.len(),
            "checkpoint run stored"
        );
        Ok((runs, state))
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
            if logobj::parse_seq(&old.key, "run").is_some_and(|id| {
                id < seq
                    && !runs.iter().any(|r| r.id == id)
                    && !self.inner.pins.lock().holds_run(id)
            }) {
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
