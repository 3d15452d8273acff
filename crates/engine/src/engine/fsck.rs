//! Verification of a whole bucket (`bucketfs fsck`): the manifest and its runs, every named
//! checkpoint, every log object's metadata, and every frame an extent pointer names, each
//! authenticated and decoded; then what the collector may delete (garbage), deleted only with
//! `repair` (the one safe repair: nothing live is touched).
//!
//! Opening the engine already reads and authenticates the newest manifest and the indexes of
//! its runs, and replays the log after it, so a bucket that does not open is reported as such.
//! Every block of every run is then read and authenticated, and each log object is read whole
//! once and its frames checked in place: the cost is one pass over the bucket's bytes. The
//! grouping of pointers by log object is a list of every live extent (about 32 bytes each, so
//! some 4 GB at 1 TiB): fsck is the one command whose memory grows with the bucket.

use super::*;

/// Problems listed in full; beyond this, counted.
const PROBLEMS_LISTED_MAX: usize = 1000;

/// One thing found wrong: the object, what is wrong, and the extents it costs (inode, byte
/// offset), at most a few of them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FsckProblem {
    pub object: String,
    pub what: String,
    pub extents_damaged: u64,
    pub first_extents: Vec<(u64, u64)>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FsckReport {
    pub manifest_seq: u64,
    pub runs: usize,
    pub named_checkpoints: usize,
    pub log_objects: usize,
    pub log_bytes: u64,
    pub log_objects_read: usize,
    pub extents_checked: u64,
    pub extents_damaged: u64,
    pub problems: Vec<FsckProblem>,
    pub problems_not_listed: u64,
    /// Objects nothing needs (the collector would delete them), by key.
    pub garbage: Vec<String>,
    pub garbage_deleted: usize,
}

impl FsckReport {
    fn problem(&mut self, object: &str, what: String, extents: &[(u64, u64)]) {
        self.extents_damaged += extents.len() as u64;
        if self.problems.len() >= PROBLEMS_LISTED_MAX {
            self.problems_not_listed += 1;
            return;
        }
        self.problems.push(FsckProblem {
            object: object.to_string(),
            what,
            extents_damaged: extents.len() as u64,
            first_extents: extents
                .iter()
                .take(8)
                .map(|(ino, index)| (*ino, index * EXTENT_SIZE_BYTES_U64))
                .collect(),
        });
    }

    pub fn is_clean(&self) -> bool {
        self.problems.is_empty() && self.problems_not_listed == 0
    }
}

impl Engine {
    /// Checks the whole bucket as this engine opened it; with `repair` (a writer engine only),
    /// deletes the garbage it finds.
    pub async fn fsck(&self, repair: bool) -> Result<FsckReport, EngineError> {
        if repair {
            self.check_writable()?;
            // The collector must not run beside: hold its slot throughout.
        }
        let _slot = self.checkpoint_slot().await;
        let bucket = &self.inner.bucket;
        let mut report = FsckReport::default();
        let base = self.inner.state.read().committed.base().clone();
        let (manifest_seq, runs) = (base.manifest_seq, base.infos.clone());
        report.manifest_seq = manifest_seq;
        report.runs = runs.len();
        let mut runs_damaged = false;
        for run in &base.runs {
            for block in 0..run.block_count() {
                if let Err(e) = run.block(block).await {
                    report.problem(run.key(), format!("metadata run: {e}"), &[]);
                    runs_damaged = true;
                    break;
                }
            }
        }
        let logs: BTreeMap<u64, u64> = bucket
            .list("log/")
            .await?
            .iter()
            .filter_map(|o| logobj::parse_seq(&o.key, "log").map(|s| (s, o.size_bytes)))
            .collect();
        report.log_objects = logs.len();
        report.log_bytes = logs.values().sum();

        // Named checkpoints: their manifests, runs and log objects must all be there.
        let pins: Vec<pins::Pin> = self.inner.pins.lock().by_name.values().cloned().collect();
        report.named_checkpoints = pins.len();
        for pin in &pins {
            let key = logobj::manifest_key(pin.seq);
            match bucket.get(&key).await {
                Ok(bytes) => {
                    if let Err(e) =
                        logobj::decode_manifest(&self.inner.sealer, &key, pin.seq, &bytes)
                    {
                        report.problem(&key, format!("checkpoint {:?}: {e}", pin.name), &[]);
                    }
                }
                Err(e) => report.problem(&key, format!("checkpoint {:?}: {e}", pin.name), &[]),
            }
            for run in &pin.runs {
                let key = run.key();
                let opened = RunReader::open(
                    bucket.clone(),
                    self.inner.sealer.clone(),
                    &key,
                    run.seal_id(),
                    run.size_bytes,
                )
                .await;
                if let Err(e) = opened {
                    report.problem(&key, format!("checkpoint {:?}: {e}", pin.name), &[]);
                }
            }
            let missing = pin.objects.iter().filter(|s| !logs.contains_key(s)).count();
            if missing > 0 {
                report.problem(
                    &format!("pin of {:?}", pin.name),
                    format!("{missing} log objects it keeps are missing"),
                    &[],
                );
            }
        }

        // Every live extent, grouped by the log object that holds its frame.
        if runs_damaged {
            // The extent map cannot be read whole: what is live, and so what is garbage, is
            // unknown. Nothing more to check or to repair.
            return Ok(report);
        }
        // In passes over the extent map, each keeping only the pointers into a range of log
        // objects that the object table (counts too high, never too low) says hold at most
        // FSCK_EXTENTS_PER_PASS: memory stays bounded whatever the bucket holds.
        let passes = {
            let st = self.inner.state.read();
            fsck_passes(
                st.committed
                    .live()
                    .iter()
                    .map(|(seq, i)| (seq, i.live_extents)),
            )
        };
        let mut live: HashSet<u64> = HashSet::new();
        for (lo, hi) in passes {
            let mut extents = self.committed_extents_in(lo, hi).await?;
            extents.sort_unstable_by_key(|(_, _, p)| (p.seq, p.offset));
            let mut at = 0;
            while at < extents.len() {
                let seq = extents[at].2.seq;
                let end = at + extents[at..].partition_point(|(_, _, p)| p.seq == seq);
                self.fsck_object(seq, logs.get(&seq).copied(), &extents[at..end], &mut report)
                    .await?;
                live.insert(seq);
                at = end;
            }
        }
        // The metadata of log objects no extent points into (those after the manifest were
        // replayed at open; older ones are garbage).
        let pinned = |s: u64| pins.iter().any(|p| p.objects.binary_search(&s).is_ok());
        for (&seq, _) in logs.iter().filter(|(s, _)| !live.contains(s)) {
            if seq <= manifest_seq && !pinned(seq) {
                report.garbage.push(logobj::log_key(seq));
            }
        }

        // Runs, manifests and format-1 checkpoints nothing names.
        let kept_run = |id: u64, part: u32| {
            runs.iter().any(|r| r.id == id && r.part == part)
                || pins
                    .iter()
                    .any(|p| p.runs.iter().any(|r| r.id == id && r.part == part))
        };
        for o in bucket.list("run/").await? {
            if logobj::parse_run_key(&o.key)
                .is_some_and(|(id, part)| id < manifest_seq && !kept_run(id, part))
            {
                report.garbage.push(o.key);
            }
        }
        for o in bucket.list("manifest/").await? {
            if logobj::parse_seq(&o.key, "manifest")
                .is_some_and(|s| s < manifest_seq && !pins.iter().any(|p| p.seq == s))
            {
                report.garbage.push(o.key);
            }
        }
        if manifest_seq > 0 {
            for o in bucket.list("checkpoint/").await? {
                report.garbage.push(o.key);
            }
        }
        if repair {
            for key in &report.garbage {
                bucket.delete(key, DeleteMode::Garbage).await?;
            }
            report.garbage_deleted = report.garbage.len();
            let mut ctl = self.inner.upload.lock().await;
            for key in &report.garbage {
                if let Some(bytes) =
                    logobj::parse_seq(key, "log").and_then(|s| ctl.known_logs.remove(&s))
                {
                    self.inner
                        .log_bytes_stored
                        .fetch_sub(bytes, Ordering::Relaxed);
                }
            }
        }
        Ok(report)
    }

    /// The committed extent pointers into log objects `lo..=hi`, as (inode, index, pointer),
    /// in key order.
    async fn committed_extents_in(
        &self,
        lo: u64,
        hi: u64,
    ) -> Result<Vec<(u64, u64, ExtentPtr)>, EngineError> {
        use crate::lsm::merge::Source;
        use crate::meta::run_key;
        let (start, end) = (run_key::extent(0, 0), run_key::extents_end());
        let (layers, base) = {
            let st = self.inner.state.read();
            (
                st.committed.layer_runs(&start, &end),
                st.committed.base().clone(),
            )
        };
        let mut sources: Vec<Source<'_>> = layers.iter().map(Source::Mem).collect();
        sources.extend(base.sources());
        let keep = |p: &ExtentPtr| (lo..=hi).contains(&p.seq);
        Ok(collector::extents_slice(&sources, &[], u64::MAX, keep)
            .await?
            .0)
    }

    /// Reads log object `seq` whole and checks its metadata and the frames of `extents`.
    async fn fsck_object(
        &self,
        seq: u64,
        size: Option<u64>,
        extents: &[(u64, u64, ExtentPtr)],
        report: &mut FsckReport,
    ) -> Result<(), EngineError> {
        let key = logobj::log_key(seq);
        let all: Vec<(u64, u64)> = extents.iter().map(|(i, x, _)| (*i, *x)).collect();
        let Some(size) = size else {
            report.problem(&key, "missing: live extents point into it".into(), &all);
            return Ok(());
        };
        let bytes = match self.inner.bucket.get(&key).await {
            Ok(b) => b,
            Err(StoreError::NotFound(_)) => {
                report.problem(&key, "missing: live extents point into it".into(), &all);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        report.log_objects_read += 1;
        if bytes.len() as u64 != size {
            report.problem(
                &key,
                format!("{} bytes, listed as {size}", bytes.len()),
                &[],
            );
        }
        let tail_at = (bytes.len() as u64).saturating_sub(logobj::LOG_TRAILER_BYTES);
        let meta = logobj::parse_trailer(&key, bytes.len() as u64, &bytes[tail_at as usize..])
            .map_err(EngineError::from)
            .and_then(|range| {
                let range = range.start as usize..range.end as usize;
                bytes
                    .get(range)
                    .ok_or_else(|| EngineError::Corrupt(format!("{key}: metadata out of bounds")))
                    .and_then(|sealed| {
                        logobj::open_log_meta(&self.inner.sealer, &key, seq, sealed)
                            .map_err(Into::into)
                    })
            });
        if let Err(e) = meta {
            report.problem(&key, format!("metadata: {e}"), &[]);
        }
        let mut damaged = Vec::new();
        let mut first_error = None;
        for &(ino, index, ptr) in extents {
            report.extents_checked += 1;
            let start = ptr.offset as usize;
            let frame = bytes.get(start..start + ptr.length as usize);
            let result = match frame {
                Some(f) => frame::decode(&self.inner.sealer, ino, index, f)
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                None => Err("frame out of bounds".to_string()),
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
                damaged.push((ino, index));
            }
        }
        if let Some(e) = first_error {
            report.problem(
                &key,
                format!("{} frames fail verification ({e})", damaged.len()),
                &damaged,
            );
        }
        Ok(())
    }
}

/// Ranges of log objects (inclusive, covering every sequence number) whose live extents, by the
/// object table's `(seq, live extents)` in increasing order, add up to at most
/// `FSCK_EXTENTS_PER_PASS` each (an object with more gets a range of its own).
fn fsck_passes(objects: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, u64)> {
    let mut passes = Vec::new();
    let (mut lo, mut count) = (0u64, 0u64);
    for (seq, extents) in objects {
        if count > 0 && count + extents > FSCK_EXTENTS_PER_PASS {
            passes.push((lo, seq - 1));
            (lo, count) = (seq, 0);
        }
        count += extents;
    }
    passes.push((lo, u64::MAX));
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_cover_every_object_within_the_bound() {
        let n = FSCK_EXTENTS_PER_PASS;
        assert_eq!(fsck_passes(std::iter::empty()), vec![(0, u64::MAX)]);
        assert_eq!(
            fsck_passes([(3, n / 2), (5, n / 2), (9, 1), (12, n + 5), (20, 1)].into_iter()),
            vec![(0, 8), (9, 11), (12, 19), (20, u64::MAX)]
        );
    }
}
