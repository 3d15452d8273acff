//! Sealing a frozen batch into a log object, and the codec policy.

use super::*;

/// Cores to seal on. Asked once: available_parallelism reads cgroup files, which costs more
/// than sealing the one extent of a typical fsync.
pub(super) fn cpu_count() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// The threads that seal large batches in parallel: bulk threads for good (bulk.rs), which is
/// why they are not rayon's global pool.
fn seal_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(cpu_count())
            .thread_name(|i| format!("bucketfs-seal-{i}"))
            .start_handler(|_| crate::bulk::enter_for_good())
            .build()
            .expect("starting the sealing threads")
    })
}

impl Engine {
    /// The codec a batch of `extents` is sealed with. With zstd configured, lz4 where a client
    /// waits on the seal at a steady cadence:
    /// - the small batches of fsync-driven flushes: zstd was most of their sealing;
    /// - any batch a client's barrier or write-behind seals while the barriers come less than
    ///   `Tuning::write_behind_gathered_barrier_gap_us` apart: the barrier would wait for zstd
    ///   on cores the client keeps busy.
    ///
    /// lz4 uploads more bytes for it (docs/0001, "Codec where a client waits").
    ///
    /// The engine's own flushes (memory filling up, the periodic flush, repacking) and the
    /// barriers of a client that flushes rarely (a bulk load, fio) use the configured codec. Most
    /// lz4 objects are garbage within seconds; the collector repacks the frames that stay live
    /// in small objects into large ones, with the configured codec.
    pub(super) fn codec_for(&self, extents: usize, waiting: Waiting) -> Codec {
        match self.inner.codec {
            Codec::Zstd
                if extents as u64 <= self.inner.tuning.inline_seal_extents_max
                    || (waiting == Waiting::Client
                        && self.inner.barrier_cadence.write_behind() != WriteBehind::Off) =>
            {
                Codec::Lz4
            }
            configured => configured,
        }
    }

    /// Seals the batch's extents (on blocking threads, in parallel) into a log object.
    pub(super) async fn encode(
        &self,
        seq: u64,
        batch: Arc<Batch>,
        codec: Codec,
    ) -> (ObjectBuffer, Vec<MetaOp>) {
        // The fsync-heavy case (a few extents per flush) takes tens of microseconds to seal:
        // less than the hop to a blocking thread, which sits on the critical path of an fsync.
        if batch.extents.len() as u64 <= self.inner.tuning.inline_seal_extents_max {
            return self.encode_blocking(seq, &batch, codec);
        }
        let engine = self.clone();
        self.inner
            .tasks
            .spawn_blocking(move || {
                let _bulk = crate::bulk::enter();
                engine.encode_blocking(seq, &batch, codec)
            })
            .await
    }

    pub(super) fn encode_blocking(
        &self,
        seq: u64,
        batch: &Batch,
        codec: Codec,
    ) -> (ObjectBuffer, Vec<MetaOp>) {
        let mut ops: Vec<MetaOp> = batch
            .kv
            .iter()
            .map(|(k, v)| match v {
                Some(v) => MetaOp::KvPut {
                    key: k.clone(),
                    value: v.clone(),
                },
                None => MetaOp::KvDelete { key: k.clone() },
            })
            .collect();
        // Key cuts before the batch's pairs, extent cuts before its extents: what the batch
        // holds in a cut range is newer than the cut.
        let kv_cuts = batch.kv_cuts.len();
        ops.splice(0..0, batch.cut_ops().take(kv_cuts));
        ops.extend(batch.cut_ops().skip(kv_cuts));
        // In (inode, index) order, as the batch keeps them: a file's neighbouring extents are
        // neighbours in the object.
        let mut data: Vec<(u64, u64, &Arc<Vec<u8>>, Codec)> = Vec::new();
        for ((ino, index), d) in &batch.extents {
            match d {
                Dirty::Data(buf) => data.push((*ino, *index, buf, codec)),
                Dirty::Moved(buf) => data.push((*ino, *index, buf, self.inner.codec)),
                Dirty::Hole => ops.push(MetaOp::ExtentClear {
                    ino: *ino,
                    index: *index,
                }),
            }
        }
        let threads = cpu_count()
            .min(
                data.len()
                    .div_ceil(self.inner.tuning.parallel_seal_extents_min as usize),
            )
            .max(1);
        let chunk = data.len().div_ceil(threads).max(1);
        let sealer = &self.inner.sealer;
        // Each part is sealed into its own stretch of the object buffer, sized for frames that
        // do not compress; the parts are then moved together.
        let stretch = chunk * FRAME_BYTES_MAX;
        let mut object = self
            .inner
            .object_buffers
            .take(LOG_HEADER_BYTES + data.len() * FRAME_BYTES_MAX);
        let room = object.room();
        room[..LOG_HEADER_BYTES].copy_from_slice(&logobj::log_header(seq));
        let seal_part = move |out: &mut [u8], part: &[(u64, u64, &Arc<Vec<u8>>, Codec)]| {
            let mut at = 0;
            part.iter()
                .map(|(ino, index, plain, codec)| {
                    let n = frame::encode(&mut out[at..], sealer, *codec, *ino, *index, plain);
                    at += n;
                    n
                })
                .collect::<Vec<usize>>()
        };
        let stretches = &mut room[LOG_HEADER_BYTES..];
        // Batches of up to a few hundred extents (the fsync-heavy case, PostgreSQL's WAL bursts,
        // repacks) are sealed by this thread alone: splitting them costs more than it saves
        // (`Tuning::parallel_seal_extents_min`). Larger ones on rayon's threads, which live as long as
        // the process: a thread started per batch would set up its zstd contexts and random
        // generator afresh, in freshly faulted memory.
        let lens: Vec<Vec<usize>> = if threads == 1 {
            stretches
                .chunks_mut(stretch)
                .zip(data.chunks(chunk))
                .map(|(out, part)| seal_part(out, part))
                .collect()
        } else {
            use rayon::prelude::*;
            seal_pool().install(|| {
                stretches
                    .par_chunks_mut(stretch)
                    .zip(data.par_chunks(chunk))
                    .map(|(out, part)| seal_part(out, part))
                    .collect()
            })
        };
        let mut at = LOG_HEADER_BYTES;
        let mut lz4_frames = 0;
        for (i, (part_lens, part)) in lens.iter().zip(data.chunks(chunk)).enumerate() {
            let from = LOG_HEADER_BYTES + i * stretch;
            let used: usize = part_lens.iter().sum();
            if from != at {
                room.copy_within(from..from + used, at);
            }
            for (&n, (ino, index, _, _)) in part_lens.iter().zip(part) {
                lz4_frames += usize::from(frame::codec(&room[at..at + n]) == Some(Codec::Lz4));
                let ptr = ExtentPtr {
                    seq,
                    offset: u32::try_from(at).expect("log objects stay below 4 GiB"),
                    length: n as u32,
                };
                ops.push(MetaOp::ExtentSet {
                    ino: *ino,
                    index: *index,
                    ptr,
                });
                at += n;
            }
        }
        // Marked for re-sealing when mostly lz4. An object of extents the collector moved
        // (sealed with zstd) that a client's write-behind swept up with a few lz4 frames of
        // its own is not: re-sealing it would move the same extents again every interval
        // (docs/0001, "Re-sealing lz4 frames").
        if lz4_frames * 2 > data.len() {
            // After the extents it is about: applying it needs the object live.
            ops.push(MetaOp::HoldsLz4 { seq });
        }
        let tail = logobj::log_tail(sealer, seq, &ops, at);
        object.reserve(at + tail.len());
        object.room()[at..at + tail.len()].copy_from_slice(&tail);
        object.set_len(at + tail.len());
        (object, ops)
    }
}
