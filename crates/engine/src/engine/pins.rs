//! Named checkpoints: a manifest kept by name, with the runs it names and the log objects its
//! state points into, until the name is deleted. The collector leaves all of them alone;
//! `EngineOptions::checkpoint` opens one read-only (docs/0003, "Named checkpoints").
//!
//! A pin is the sealed object `pin/<random id>`; the name is inside it, so names never appear
//! in the bucket's listing.

use super::*;

const PIN_MAGIC: &[u8; 8] = b"BFSPIN01";
/// Format 4: runs named with their part.
const PIN_MAGIC_2: &[u8; 8] = b"BFSPIN02";
/// Longest checkpoint name.
const CHECKPOINT_NAME_BYTES_MAX: usize = 64;

/// One named checkpoint.
#[derive(Debug, Clone)]
pub(super) struct Pin {
    pub(super) name: String,
    /// The key suffix of its `pin/` object.
    pub(super) id: String,
    /// The manifest it keeps: the state as of this log object.
    pub(super) seq: u64,
    pub(super) created_unix_s: u64,
    pub(super) runs: Vec<RunInfo>,
    /// The log objects its state points into, sorted.
    pub(super) objects: Vec<u64>,
}

/// What `bucketfs checkpoint list` shows of a named checkpoint.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub name: String,
    /// The log object the checkpoint's state is as of.
    pub seq: u64,
    pub created_unix_s: u64,
    /// Log objects it keeps from collection.
    pub log_objects: usize,
}

impl Pin {
    pub(super) fn info(&self) -> CheckpointInfo {
        CheckpointInfo {
            name: self.name.clone(),
            seq: self.seq,
            created_unix_s: self.created_unix_s,
            log_objects: self.objects.len(),
        }
    }

    fn key(&self) -> String {
        format!("pin/{}", self.id)
    }

    fn encode(&self, sealer: &Sealer) -> Vec<u8> {
        let mut plain = Vec::with_capacity(64 + self.objects.len() * 8);
        plain.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        plain.extend_from_slice(self.name.as_bytes());
        plain.extend_from_slice(&self.seq.to_le_bytes());
        plain.extend_from_slice(&self.created_unix_s.to_le_bytes());
        plain.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for r in &self.runs {
            plain.extend_from_slice(&r.id.to_le_bytes());
            plain.extend_from_slice(&r.part.to_le_bytes());
            plain.extend_from_slice(&r.size_bytes.to_le_bytes());
        }
        plain.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for s in &self.objects {
            plain.extend_from_slice(&s.to_le_bytes());
        }
        let packed = zstd::bulk::compress(&plain, 3).expect("compressing to memory cannot fail");
        let mut buf = PIN_MAGIC_2.to_vec();
        buf.extend_from_slice(&(plain.len() as u64).to_le_bytes());
        sealer.seal_into(&mut buf, &pin_aad(&self.id), &packed);
        buf
    }

    fn decode(sealer: &Sealer, id: &str, buf: &[u8]) -> Result<Pin, EngineError> {
        let key = format!("pin/{id}");
        let bad = |why: &str| EngineError::Corrupt(format!("{key}: {why}"));
        // Version 1 (format 3) names whole runs; version 2 names run parts.
        let version_2 = buf.len() >= 16 && &buf[..8] == PIN_MAGIC_2;
        if buf.len() < 16 || (&buf[..8] != PIN_MAGIC && !version_2) {
            return Err(bad("not a checkpoint pin (bad magic or length)"));
        }
        let plain_len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
        let packed = sealer
            .open(&pin_aad(id), &buf[16..])
            .map_err(|_| bad("failed authentication (corrupted, or sealed with another key)"))?;
        // Sealed, so the length is ours; bounded anyway, as a lie must not be an allocation.
        if plain_len > 64 * packed.len() as u64 + 1024 {
            return Err(bad("implausible length"));
        }
        let plain = zstd::bulk::decompress(&packed, plain_len as usize)
            .map_err(|_| bad("does not decompress"))?;
        let mut r = Cursor { buf: &plain, at: 0 };
        let name_len = r.u32()? as usize;
        let name = String::from_utf8(r.take(name_len)?.to_vec()).map_err(|_| bad("bad name"))?;
        let seq = r.u64()?;
        let created_unix_s = r.u64()?;
        let run_count = r.u32()? as usize;
        let mut runs = Vec::with_capacity(run_count.min(RUNS_PER_MANIFEST_MAX));
        for _ in 0..run_count {
            let id = r.u64()?;
            let part = if version_2 { r.u32()? } else { 0 };
            runs.push(RunInfo {
                id,
                part,
                size_bytes: r.u64()?,
            });
        }
        let object_count = r.u64()? as usize;
        let mut objects = Vec::with_capacity(object_count.min(plain.len() / 8));
        for _ in 0..object_count {
            objects.push(r.u64()?);
        }
        if r.at != plain.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(Pin {
            name,
            id: id.to_string(),
            seq,
            created_unix_s,
            runs,
            objects,
        })
    }
}

#[cfg(feature = "fuzzing")]
pub(super) fn fuzz_decode(sealer: &Sealer, plain: &[u8]) {
    let packed = zstd::bulk::compress(plain, 1).expect("compressing to memory cannot fail");
    let mut buf = PIN_MAGIC.to_vec();
    buf.extend_from_slice(&(plain.len() as u64).to_le_bytes());
    sealer.seal_into(&mut buf, &pin_aad("x"), &packed);
    let _ = Pin::decode(sealer, "x", &buf);
}

fn pin_aad(id: &str) -> Vec<u8> {
    let mut a = b"bfs-pin".to_vec();
    a.extend_from_slice(id.as_bytes());
    a
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EngineError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| EngineError::Corrupt("a checkpoint pin is truncated".into()))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, EngineError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, EngineError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// The named checkpoints of a bucket, by name.
#[derive(Debug, Default)]
pub(super) struct Pins {
    pub(super) by_name: BTreeMap<String, Pin>,
}

impl Pins {
    pub(super) fn holds_object(&self, seq: u64) -> bool {
        self.by_name
            .values()
            .any(|p| p.objects.binary_search(&seq).is_ok())
    }

    pub(super) fn holds_run(&self, id: u64, part: u32) -> bool {
        self.by_name
            .values()
            .any(|p| p.runs.iter().any(|r| r.id == id && r.part == part))
    }

    pub(super) fn holds_manifest(&self, seq: u64) -> bool {
        self.by_name.values().any(|p| p.seq == seq)
    }
}

/// Names are what a shell and a URL carry without quoting: letters, digits, `.`, `_`, `-`,
/// not starting with `.` or `-`.
pub fn check_checkpoint_name(name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name.len() <= CHECKPOINT_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(EngineError::BadCheckpointName(name.to_string()))
    }
}

/// Reads every pin of the bucket.
pub(super) async fn load_pins(bucket: &SharedBucket, sealer: &Sealer) -> Result<Pins, EngineError> {
    let mut pins = Pins::default();
    for o in bucket.list("pin/").await? {
        let Some(id) = o.key.strip_prefix("pin/") else {
            continue;
        };
        let bytes = bucket.get(&o.key).await?;
        let pin = Pin::decode(sealer, id, &bytes)?;
        pins.by_name.insert(pin.name.clone(), pin);
    }
    Ok(pins)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Engine {
    /// Creates the named checkpoint of everything acknowledged before this call: a barrier,
    /// then a checkpoint (unless the newest one is already as of the last log object), kept
    /// under `name` until [`Engine::delete_checkpoint`]. Writes go on meanwhile.
    pub async fn create_checkpoint(&self, name: &str) -> Result<CheckpointInfo, EngineError> {
        self.check_writable()?;
        check_checkpoint_name(name)?;
        if self.inner.pins.lock().by_name.contains_key(name) {
            return Err(EngineError::CheckpointExists(name.to_string()));
        }
        self.flush().await?;
        if self.journaling() {
            // The checkpoint is of what the bucket holds.
            self.barrier(Waiting::Engine).await?;
        }
        let _slot = self.checkpoint_slot().await;
        let Some(base) = self.checkpoint_to_last().await? else {
            return Err(EngineError::NothingToCheckpoint);
        };
        let (seq, runs, objects) = (
            base.manifest_seq,
            base.infos.clone(),
            base.objects.live_objects(),
        );
        let mut id = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut id);
        let pin = Pin {
            name: name.to_string(),
            id: id.iter().map(|b| format!("{b:02x}")).collect(),
            seq,
            created_unix_s: unix_now(),
            runs,
            objects,
        };
        self.inner
            .bucket
            .put(
                &pin.key(),
                Bytes::from(pin.encode(&self.inner.sealer)),
                PutMode::Create,
            )
            .await?;
        let info = pin.info();
        self.inner.pins.lock().by_name.insert(name.to_string(), pin);
        tracing::info!(
            name,
            seq,
            log_objects = info.log_objects,
            "named checkpoint created"
        );
        Ok(info)
    }

    /// The named checkpoints, by name.
    pub fn checkpoints(&self) -> Vec<CheckpointInfo> {
        self.inner
            .pins
            .lock()
            .by_name
            .values()
            .map(Pin::info)
            .collect()
    }

    /// Deletes a named checkpoint; the collector then reclaims what only it kept (at once, as
    /// far as the newest checkpoint allows).
    pub async fn delete_checkpoint(&self, name: &str) -> Result<(), EngineError> {
        self.check_writable()?;
        let _slot = self.checkpoint_slot().await;
        let Some(pin) = self.inner.pins.lock().by_name.get(name).cloned() else {
            return Err(EngineError::NoSuchCheckpoint(name.to_string()));
        };
        self.inner
            .bucket
            .delete(&pin.key(), DeleteMode::Durable)
            .await?;
        self.inner.pins.lock().by_name.remove(name);
        tracing::info!(name, seq = pin.seq, "named checkpoint deleted");
        // What only the pin kept is dead once the changes since the newest checkpoint are
        // looked up: write one first.
        let Some(base) = self.checkpoint_to_last().await? else {
            return Ok(());
        };
        let seq = base.manifest_seq;
        let covered = {
            let ctl = self.inner.upload.lock().await;
            Covered {
                logs: ctl
                    .known_logs
                    .range(..=seq)
                    .map(|(s, b)| (*s, *b))
                    .collect(),
                aged_through: 0,
                log_bytes: 0,
            }
        };
        self.collect(seq, &base.infos, &covered).await.map(|_| ())
    }

    /// Writes checkpoints until the newest covers the log object committed last when this is
    /// called (one that failed earlier first, so usually one, at most two, whatever commits
    /// meanwhile), collecting after each, and returns the newest base (None: nothing was ever
    /// committed). Every debit up to that object is then looked up. The caller holds the
    /// checkpoint slot.
    pub(super) async fn checkpoint_to_last(&self) -> Result<Option<Arc<Base>>, EngineError> {
        let mut target = None;
        loop {
            let (frozen, covered) = {
                let mut ctl = self.inner.upload.lock().await;
                // The newest log objects may be gone already: once a checkpoint covers them,
                // those holding no live extent (only key-value pairs, say) are collected.
                let last_log = ctl.known_logs.last_key_value().map(|(s, _)| *s);
                let target = *target.get_or_insert(last_log);
                let mut st = self.inner.state.write();
                let base = st.committed.base().clone();
                if st.committed.frozen().is_none()
                    && base.manifest_seq > 0
                    && target.is_none_or(|l| l <= base.manifest_seq)
                {
                    return Ok(Some(base));
                }
                let Some(seq) = last_log else {
                    return Ok(None);
                };
                let frozen = st.committed.freeze(seq);
                drop(st);
                let covered = self.begin_checkpoint(&mut ctl, frozen.seq);
                (frozen, covered)
            };
            let base = self.write_checkpoint(&frozen).await?;
            let collected = self.collect(frozen.seq, &base.infos, &covered).await;
            self.inner
                .counters
                .checkpoints_collected
                .fetch_add(1, Ordering::Relaxed);
            collected?;
        }
    }

    /// Waits until no checkpoint or collection runs, then holds that off until the guard drops.
    pub(super) async fn checkpoint_slot(&self) -> ClearOnDrop<'_> {
        while self.inner.checkpoint_running.swap(true, Ordering::AcqRel) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ClearOnDrop(&self.inner.checkpoint_running)
    }
}
