//! Counters and the stats snapshot (`bucketfs status`).

use super::*;

#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    /// The cipher that seals this bucket's objects, chosen when it was created (docs/format.md).
    pub cipher: crate::crypto::Cipher,
    /// Flush barriers asked for (NBD FLUSH and FUA, admin changes, the periodic flush).
    pub barriers: u64,
    /// Time callers spent waiting in flush barriers, summed: divided by `barriers`, the mean
    /// fsync latency a client sees.
    pub barrier_wait_us: u64,
    pub flushes: u64,
    /// Flushes sealed with lz4: all of them if lz4 is configured; with zstd, those a client
    /// waited on at a steady cadence (`Engine::codec_for`).
    pub flushes_lz4: u64,
    /// Flushes started by write-behind (`Engine::write`), no barrier waiting on them yet.
    pub write_behind_flushes: u64,
    pub log_objects_written: u64,
    pub log_bytes_written: u64,
    /// Bytes of the log objects now in the bucket: what the data costs to store (checkpoints
    /// and the superblock aside).
    pub log_bytes_stored: u64,
    /// Live bytes of those log objects (frames the extent map points at): what the data would
    /// take without garbage. `log_bytes_stored` over this is the bucket's space amplification.
    pub log_bytes_live: u64,
    pub checkpoints_written: u64,
    /// Checkpoints written whose collection (and repacking, if they repack) has ended, well or
    /// not: while this is below `checkpoints_written`, one is still deleting or moving extents.
    pub checkpoints_collected: u64,
    /// Bytes of the checkpoints written: what keeping the metadata costs in uploads.
    pub checkpoint_bytes_written: u64,
    pub log_objects_deleted: u64,
    /// Extents rewritten out of sparse log objects (`Engine::repack`).
    pub extents_repacked: u64,
    /// The CPU priority of bulk work in this process (bulk.rs, docs/0010).
    pub bulk_priority: crate::bulk::BulkPriority,
    /// Times the watchdog raised starved bulk work to normal priority (for a second each).
    pub bulk_boosts: u64,
    /// Extents moved out of fragmented log objects (at most half live; `Engine::repack`).
    pub extents_defragmented: u64,
    /// Extents moved out of objects that hold lz4 frames, to be sealed with zstd
    /// (`Engine::repack`).
    pub extents_resealed: u64,
    /// Sweeps over the extent map begun by repacking (one slice of
    /// `Tuning::repack_scan_extents_max` pointers per checkpoint that repacks).
    pub repack_sweeps_started: u64,
    /// Live bytes of the log objects that hold lz4 frames (`ObjectTable::live_bytes_in_lz4_objects`):
    /// what re-sealing has yet to reach, at most.
    pub live_bytes_in_lz4_objects: u64,
    pub pending_bytes: u64,
    /// Sealed log objects not yet stored in the bucket (waiting for, or in, their upload),
    /// and their bytes: with `pending_bytes`, what a crash now would lose of the writes no
    /// barrier has returned for.
    pub upload_queue_objects: u64,
    pub upload_queue_bytes: u64,
    pub extents: u64,
    pub memory_cache_extents: u64,
    /// Extents that reads found in memory (written and not yet flushed, or in the memory
    /// tier), and those they had to fetch (from the disk tier or the bucket).
    pub memory_cache_hits: u64,
    pub memory_cache_misses: u64,
    pub disk_cache_bytes: u64,
    /// Frames that fetches found in the disk tier, and those they had to GET from the bucket
    /// (both zero without a disk tier: over `file://`).
    pub disk_cache_hits: u64,
    pub disk_cache_misses: u64,
    /// Decoded run blocks held by the metadata cache (`[cache] metadata_bytes_max`).
    pub metadata_cache_bytes: u64,
    pub metadata_cache_hits: u64,
    pub metadata_cache_misses: u64,
    /// Metadata held in memory beside that cache: the changes not yet in a run and the runs'
    /// indexes (bounded by the checkpoint interval, not by the bucket).
    pub metadata_memory_bytes: u64,
    /// Runs (bottom parts and deltas) the newest manifest names, and the deltas among them.
    pub metadata_runs: u64,
    pub metadata_delta_runs: u64,
    /// Log objects committed since the newest checkpoint began: what an open would replay.
    pub log_objects_since_checkpoint: u64,
    /// Client barriers and write-behind flushes held while a checkpoint caught up
    /// (`Engine::wait_for_checkpoint`).
    pub barriers_held_for_checkpoint: u64,
    /// Journal records written by client barriers (engine/journaled.rs).
    pub journal_records: u64,
    /// Scoped barriers (engine/scoped.rs): served by a side record, by the full barrier, and
    /// with nothing of their scope unflushed.
    pub scoped_barriers_side: u64,
    pub scoped_barriers_full: u64,
    pub scoped_barriers_clean: u64,
    /// Extents a side record left out because the inode's earlier side record holds them.
    pub side_record_extents_left_out: u64,
    /// Bottom parts merged with the deltas by sweeps (engine/compaction.rs), and sweeps that
    /// passed over every key.
    pub bottom_parts_merged: u64,
    pub bottom_sweeps_finished: u64,
    /// Delta runs merged into a newer one (size tiers).
    pub delta_runs_merged: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) barriers: AtomicU64,
    pub(super) barrier_wait_us: AtomicU64,
    pub(super) flushes: AtomicU64,
    pub(super) flushes_lz4: AtomicU64,
    pub(super) write_behind_flushes: AtomicU64,
    pub(super) log_objects_written: AtomicU64,
    pub(super) log_bytes_written: AtomicU64,
    pub(super) checkpoints_written: AtomicU64,
    pub(super) checkpoints_collected: AtomicU64,
    pub(super) checkpoint_bytes_written: AtomicU64,
    pub(super) log_objects_deleted: AtomicU64,
    pub(super) extents_repacked: AtomicU64,
    pub(super) extents_defragmented: AtomicU64,
    pub(super) extents_resealed: AtomicU64,
    pub(super) repack_sweeps_started: AtomicU64,
    pub(super) barriers_held_for_checkpoint: AtomicU64,
    pub(super) journal_records: AtomicU64,
    pub(super) scoped_barriers_side: AtomicU64,
    pub(super) scoped_barriers_full: AtomicU64,
    pub(super) scoped_barriers_clean: AtomicU64,
    pub(super) side_record_extents_left_out: AtomicU64,
    pub(super) bottom_parts_merged: AtomicU64,
    pub(super) bottom_sweeps_finished: AtomicU64,
    pub(super) delta_runs_merged: AtomicU64,
    pub(super) memory_cache_hits: AtomicU64,
    pub(super) memory_cache_misses: AtomicU64,
    pub(super) disk_cache_hits: AtomicU64,
    pub(super) disk_cache_misses: AtomicU64,
    pub(super) barrier_times: BarrierTimes,
}

impl Engine {
    /// Bytes in use by file data, for quotas and statfs: the live extents as of the last upload
    /// (whole 8 KiB extents, before compression) plus the data written since and not yet
    /// uploaded, which may overwrite some of them. Never below the truth, and O(1).
    pub fn allocated_bytes(&self) -> u64 {
        let st = self.inner.state.read();
        let unuploaded: u64 = st.flushing.iter().map(|b| b.data_bytes() as u64).sum();
        st.committed.live().extent_count() * crate::limits::EXTENT_SIZE_BYTES_U64
            + st.pending.data_bytes() as u64
            + unuploaded
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.inner.counters;
        let (upload_queue_objects, upload_queue_bytes) = {
            let queue = self.inner.queue.lock();
            let bytes = queue.iter().map(|s| s.object.len() as u64).sum();
            (queue.len() as u64, bytes)
        };
        let st = self.inner.state.read();
        EngineStats {
            cipher: self.inner.sealer.cipher(),
            barriers: c.barriers.load(Ordering::Relaxed),
            barrier_wait_us: c.barrier_wait_us.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            flushes_lz4: c.flushes_lz4.load(Ordering::Relaxed),
            write_behind_flushes: c.write_behind_flushes.load(Ordering::Relaxed),
            log_objects_written: c.log_objects_written.load(Ordering::Relaxed),
            log_bytes_written: c.log_bytes_written.load(Ordering::Relaxed),
            log_bytes_stored: self.inner.log_bytes_stored.load(Ordering::Relaxed),
            log_bytes_live: st.committed.live().live_bytes_total(),
            checkpoints_written: c.checkpoints_written.load(Ordering::Relaxed),
            checkpoints_collected: c.checkpoints_collected.load(Ordering::Relaxed),
            checkpoint_bytes_written: c.checkpoint_bytes_written.load(Ordering::Relaxed),
            log_objects_deleted: c.log_objects_deleted.load(Ordering::Relaxed),
            extents_repacked: c.extents_repacked.load(Ordering::Relaxed),
            bulk_priority: crate::bulk::status().0,
            bulk_boosts: crate::bulk::status().1,
            extents_defragmented: c.extents_defragmented.load(Ordering::Relaxed),
            extents_resealed: c.extents_resealed.load(Ordering::Relaxed),
            repack_sweeps_started: c.repack_sweeps_started.load(Ordering::Relaxed),
            live_bytes_in_lz4_objects: st.committed.live().live_bytes_in_lz4_objects(),
            pending_bytes: st.pending.data_bytes() as u64,
            upload_queue_objects,
            upload_queue_bytes,
            extents: st.committed.live().extent_count(),
            memory_cache_extents: st.clean.len() as u64,
            memory_cache_hits: c.memory_cache_hits.load(Ordering::Relaxed),
            memory_cache_misses: c.memory_cache_misses.load(Ordering::Relaxed),
            disk_cache_bytes: self.inner.disk_cache.as_ref().map_or(0, |c| c.bytes()),
            disk_cache_hits: c.disk_cache_hits.load(Ordering::Relaxed),
            disk_cache_misses: c.disk_cache_misses.load(Ordering::Relaxed),
            metadata_cache_bytes: self.inner.block_cache.bytes(),
            metadata_cache_hits: self.inner.block_cache.hits(),
            metadata_cache_misses: self.inner.block_cache.misses(),
            metadata_memory_bytes: st.committed.memory_bytes() as u64,
            metadata_runs: st.committed.base().runs.len() as u64,
            metadata_delta_runs: {
                let infos = &st.committed.base().infos;
                let bottom = infos.first().map(|r| r.id);
                infos.iter().filter(|r| Some(r.id) != bottom).count() as u64
            },
            log_objects_since_checkpoint: self.inner.checkpoint_lag_objects.load(Ordering::Relaxed),
            barriers_held_for_checkpoint: c.barriers_held_for_checkpoint.load(Ordering::Relaxed),
            journal_records: c.journal_records.load(Ordering::Relaxed),
            scoped_barriers_side: c.scoped_barriers_side.load(Ordering::Relaxed),
            scoped_barriers_full: c.scoped_barriers_full.load(Ordering::Relaxed),
            scoped_barriers_clean: c.scoped_barriers_clean.load(Ordering::Relaxed),
            side_record_extents_left_out: c.side_record_extents_left_out.load(Ordering::Relaxed),
            bottom_parts_merged: c.bottom_parts_merged.load(Ordering::Relaxed),
            bottom_sweeps_finished: c.bottom_sweeps_finished.load(Ordering::Relaxed),
            delta_runs_merged: c.delta_runs_merged.load(Ordering::Relaxed),
        }
    }
}
