//! Values fitted to a workload on a machine, with their defaults: settable in the config's
//! `[tuning]` table (`bucketfs init` lists them), unlike the structural limits of limits.rs.
//! Each says what it was fitted to; the measurements are dated files under docs/benchmarks/,
//! listed in docs/benchmarks.md.

use crate::limits::{EXTENT_SIZE_BYTES, PENDING_BYTES_MAX};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Tuning {
    /// A flush starts in the background once this much data is pending, so sealing and
    /// uploading overlap with writers filling the next batch.
    pub dirty_bytes_flush_start: u64,
    /// Flushes of at most this many extents are sealed on the calling task: below the cost of
    /// the hop to a blocking thread (about 10 us per extent on the 2-core test VM).
    pub inline_seal_extents_max: u64,
    /// A batch is split between threads for sealing only when each gets at least this many
    /// extents; smaller splits made rayon spin on a machine PostgreSQL keeps busy.
    pub parallel_seal_extents_min: u64,
    /// Every write starts on its way to the bucket as soon as it is applied while barriers
    /// come at least this often (an fsync per transaction), on average and lately.
    pub write_behind_barrier_gap_us: u64,
    /// While barriers come at least this often (PostgreSQL with `synchronous_commit = off`),
    /// writes start on their way once `write_behind_gathered_bytes` have gathered.
    pub write_behind_gathered_barrier_gap_us: u64,
    /// See `write_behind_gathered_barrier_gap_us`.
    pub write_behind_gathered_bytes: u64,
    /// Longer gaps between barriers count as this long in their running mean, so a client that
    /// resumes fsyncing turns write-behind on within a few dozen barriers.
    pub barrier_gap_counted_max_us: u64,
    /// A checkpoint is due after this many bytes of log objects, so overwritten data does not
    /// pile up under write-heavy load.
    pub log_bytes_per_checkpoint: u64,
    /// A checkpoint is due once the log objects after the last one number the map's extents /
    /// this, within the two bounds below: a checkpoint may merge every run, so this bounds
    /// that cost per log object written.
    pub checkpoint_extents_per_log_object: u64,
    /// Fewest log objects between checkpoints.
    pub log_objects_per_checkpoint_min: u64,
    /// Most log objects between checkpoints: an open never replays more than this many.
    pub log_objects_per_checkpoint_max: u64,
    /// After this long without a commit (0: never), a checkpoint is written if the log objects
    /// since the last one number at least 1/`quiet_checkpoint_fraction` of the regular interval,
    /// so a burst's garbage is collected before the next burst.
    pub quiet_checkpoint_after_ms: u64,
    /// See `quiet_checkpoint_after_ms`.
    pub quiet_checkpoint_fraction: u64,
    /// A log object a checkpoint covers that keeps between 1 and this many live extents has
    /// them moved ("repacked") so it can die: under fsync-heavy load a quarter of the small
    /// objects keep one long-lived WAL page.
    pub repack_live_extents_max: u64,
    /// Most extents one checkpoint repacks.
    pub repack_extents_max: u64,
    /// Most extent pointers one checkpoint reads to find the extents of the objects repacking
    /// moves out of; the next checkpoint goes on from there. At 8 KiB an extent, the default
    /// sweeps 16 GiB of device per checkpoint (about 50 MB of pointers read) and a 1 TiB device
    /// in 64 checkpoints.
    pub repack_scan_extents_max: u64,
    /// A log object at most this percent live is fragmented: once aged (`reseal_after_s`), the
    /// collector moves its live extents out, least live first, so the bucket holds at most
    /// about twice the live data.
    pub repack_live_percent_max: u64,
    /// Live bytes one checkpoint moves out of fragmented objects: as many as its interval's log
    /// objects took, at least this many, at most `log_bytes_per_checkpoint`.
    pub repack_fragmented_bytes_min: u64,
    /// Extents live this long (counted from the checkpoint that covered them) are aged: lz4
    /// frames among them are re-sealed with zstd, fragmented objects among them repacked.
    pub reseal_after_s: u64,
    /// Most extents one checkpoint re-seals out of objects holding lz4 frames.
    pub reseal_extents_max: u64,
    /// Most extents in one object of moved extents: a client flush queued behind it waits a few
    /// milliseconds of sealing, not tens; and it fits a `file://` bucket's journal (docs/0002).
    pub repack_extents_per_object: u64,
    /// Adjacent frames of one log object are fetched with one ranged GET while the gap between
    /// them is at most this many bytes.
    pub read_coalesce_gap_bytes: u64,
    /// A read that misses both caches fetches the whole log object when it is at most this
    /// many bytes and a disk cache is configured, and caches it: the blocks written with the
    /// one asked for are usually read soon after (a database's crash recovery reads what it
    /// wrote before the crash, after a restart emptied the caches), and an object-store GET
    /// costs about the same for 1 MiB as for 1 KiB. 0 fetches only the frames asked for.
    pub cold_read_whole_object_bytes_max: u64,
    /// A read that starts where the last read of the same inode ended has the next this many
    /// bytes fetched while its client handles it (engine/readahead.rs); 0 turns readahead off.
    /// 16 MiB keeps one client's sequential 1 MiB reads from waiting on the store: over a
    /// link of 20 ms and 100 MB/s 4 MiB (twice its bandwidth-delay product) already reached
    /// 0.82-0.89 of the link where 2 MiB reached 0.64-0.72, and over a local directory, once
    /// AES made decryption cheap, 16 MiB let a cold NFS copy out reach 800-926 MB/s where
    /// 4 MiB reached 717-784 (docs/benchmarks/2026-11-28-cold-reads.md, 2026-11-30-aes.md).
    pub readahead_bytes: u64,
    /// A merge of the metadata runs is cut into parts of about this many bytes of entries: what
    /// a merge holds in memory at once, and what one part's upload carries.
    pub run_part_bytes: u64,
    /// Bytes of the bottom run's parts one checkpoint merges with the deltas while a sweep is
    /// under way (engine/compaction.rs): what bounds a checkpoint's merge, whatever the bucket.
    pub run_merge_bytes_per_checkpoint: u64,
    /// Delta runs merged into one once together they outweigh the next older one (size tiers).
    pub delta_runs_per_merge: u64,
    /// A sweep of the bottom run begins once the deltas weigh this percent of it: lower means
    /// fewer runs for a lookup to ask and more bytes rewritten.
    pub sweep_after_delta_percent: u64,
    /// With a journal tier (docs/0009, "Journaled barriers"): the batches that client barriers
    /// wrote to the journal are sealed together into one log object for the bucket once the
    /// oldest is this old, so the bucket takes a few objects a second however often clients
    /// flush.
    pub journal_coalesce_ms: u64,
    /// ... or once they hold this many bytes of data.
    pub journal_coalesce_bytes: u64,
    /// A client barrier that finds more data than this pending seals it for the bucket and
    /// waits for the bucket, as without a journal: the journal takes records of up to 1 MiB,
    /// and a bulk writer gains nothing from writing its data twice.
    pub journal_record_bytes_max: u64,
    /// A scoped barrier (an fsync of one file, engine/scoped.rs) stores the file's unflushed
    /// changes as a side record only while at least this much other data is unflushed: below
    /// it, the full barrier waits about as long and takes no extra PUT and DELETE.
    pub scoped_barrier_ahead_bytes_min: u64,
    /// ... and only when the file's own unflushed data is at most this: a bulk writer's fsync
    /// gains nothing from writing its data twice.
    pub scoped_barrier_bytes_max: u64,
    /// 1: bulk work (sealing large batches, writing their objects into a local bucket, merging
    /// runs, filling the disk cache) runs under `SCHED_IDLE`, raised back while starved, so a
    /// small request's threads do not wait behind it for a core (docs/0010); 0: at normal
    /// priority. Needs `CAP_SYS_NICE`: without it bulk work runs at normal priority.
    pub bulk_idle_priority: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            dirty_bytes_flush_start: PENDING_BYTES_MAX as u64 / 4,
            inline_seal_extents_max: 16,
            parallel_seal_extents_min: 128,
            write_behind_barrier_gap_us: 4_000,
            write_behind_gathered_barrier_gap_us: 250_000,
            write_behind_gathered_bytes: 256 * 1024,
            barrier_gap_counted_max_us: 1_000_000,
            log_bytes_per_checkpoint: 1 << 30,
            checkpoint_extents_per_log_object: 16,
            log_objects_per_checkpoint_min: 1024,
            log_objects_per_checkpoint_max: 8192,
            quiet_checkpoint_after_ms: 5_000,
            quiet_checkpoint_fraction: 8,
            repack_live_extents_max: 16,
            repack_extents_max: 2048,
            repack_scan_extents_max: 2 << 20,
            repack_live_percent_max: 50,
            repack_fragmented_bytes_min: 64 << 20,
            reseal_after_s: 600,
            reseal_extents_max: 65536,
            repack_extents_per_object: 112,
            read_coalesce_gap_bytes: 64 * 1024,
            cold_read_whole_object_bytes_max: 4 << 20,
            readahead_bytes: 16 << 20,
            run_part_bytes: 64 << 20,
            run_merge_bytes_per_checkpoint: 256 << 20,
            delta_runs_per_merge: 4,
            sweep_after_delta_percent: 100,
            journal_coalesce_ms: 200,
            journal_coalesce_bytes: 8 << 20,
            journal_record_bytes_max: 768 << 10,
            scoped_barrier_ahead_bytes_min: 256 << 10,
            scoped_barrier_bytes_max: 1 << 20,
            bulk_idle_priority: 1,
        }
    }
}

impl Tuning {
    /// Log objects after which a checkpoint of a map of `extents` extents is due.
    pub fn log_objects_per_checkpoint(&self, extents: u64) -> u64 {
        (extents / self.checkpoint_extents_per_log_object).clamp(
            self.log_objects_per_checkpoint_min,
            self.log_objects_per_checkpoint_max,
        )
    }

    pub fn quiet_checkpoint_after(&self) -> Option<std::time::Duration> {
        (self.quiet_checkpoint_after_ms > 0)
            .then(|| std::time::Duration::from_millis(self.quiet_checkpoint_after_ms))
    }

    pub fn reseal_after(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.reseal_after_s)
    }

    /// Checks the values against each other and the engine's limits; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            (
                "checkpoint_extents_per_log_object",
                self.checkpoint_extents_per_log_object,
            ),
            (
                "log_objects_per_checkpoint_min",
                self.log_objects_per_checkpoint_min,
            ),
            ("quiet_checkpoint_fraction", self.quiet_checkpoint_fraction),
            ("repack_extents_per_object", self.repack_extents_per_object),
            ("parallel_seal_extents_min", self.parallel_seal_extents_min),
            ("run_part_bytes", self.run_part_bytes),
            (
                "run_merge_bytes_per_checkpoint",
                self.run_merge_bytes_per_checkpoint,
            ),
            ("delta_runs_per_merge", self.delta_runs_per_merge),
            ("sweep_after_delta_percent", self.sweep_after_delta_percent),
            (
                "barrier_gap_counted_max_us",
                self.barrier_gap_counted_max_us,
            ),
            ("journal_coalesce_ms", self.journal_coalesce_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("tuning.{key} must be at least 1"));
            }
        }
        if self.log_objects_per_checkpoint_max < self.log_objects_per_checkpoint_min {
            return Err("tuning.log_objects_per_checkpoint_max must be at least tuning.log_objects_per_checkpoint_min".into());
        }
        if self.dirty_bytes_flush_start > PENDING_BYTES_MAX as u64 {
            return Err(format!(
                "tuning.dirty_bytes_flush_start must be at most {PENDING_BYTES_MAX} (the most one log object holds)"
            ));
        }
        // A record holds the batch's frames (a few dozen bytes more than the data when
        // incompressible) and its metadata ops: a quarter of the journal's limit is room for them.
        let record_most = crate::bucket::journal::JOURNAL_OBJECT_BYTES_MAX as u64 * 3 / 4;
        if self.journal_record_bytes_max > record_most {
            return Err(format!(
                "tuning.journal_record_bytes_max must be at most {record_most} (a record fits the journal with its metadata)"
            ));
        }
        if self.journal_coalesce_bytes > PENDING_BYTES_MAX as u64 {
            return Err(format!(
                "tuning.journal_coalesce_bytes must be at most {PENDING_BYTES_MAX} (the most one log object holds)"
            ));
        }
        if self.repack_live_percent_max > 100 {
            return Err("tuning.repack_live_percent_max is a percentage: at most 100".into());
        }
        // An object of moved extents must fit a `file://` bucket's journal, with room for its
        // header and metadata record.
        let most = (crate::bucket::journal::JOURNAL_OBJECT_BYTES_MAX - 64 * 1024)
            / crate::frame::FRAME_BYTES_MAX;
        if self.repack_extents_per_object > most as u64 {
            return Err(format!(
                "tuning.repack_extents_per_object must be at most {most} (an object of moved extents fits the journal of a file:// bucket)"
            ));
        }
        if self.write_behind_gathered_bytes > PENDING_BYTES_MAX as u64
            || self.read_coalesce_gap_bytes > (PENDING_BYTES_MAX + EXTENT_SIZE_BYTES) as u64
            || self.readahead_bytes > PENDING_BYTES_MAX as u64
            || self.cold_read_whole_object_bytes_max > PENDING_BYTES_MAX as u64
        {
            return Err("tuning.write_behind_gathered_bytes, tuning.read_coalesce_gap_bytes, tuning.readahead_bytes and tuning.cold_read_whole_object_bytes_max must be at most 64 MiB".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_checkpoint_cadence_grows_with_the_map_within_bounds() {
        let t = Tuning::default();
        t.validate().expect("the defaults are valid");
        assert_eq!(t.log_objects_per_checkpoint(0), 1024);
        assert_eq!(t.log_objects_per_checkpoint(45_000), 45_000 / 16);
        assert_eq!(t.log_objects_per_checkpoint(u64::MAX), 8192);
    }

    #[test]
    fn invalid_values_name_their_key() {
        let t = Tuning {
            repack_extents_per_object: 100_000,
            ..Tuning::default()
        };
        assert!(t
            .validate()
            .unwrap_err()
            .contains("tuning.repack_extents_per_object"));
        let t = Tuning {
            log_objects_per_checkpoint_min: 0,
            ..Tuning::default()
        };
        assert!(t
            .validate()
            .unwrap_err()
            .contains("tuning.log_objects_per_checkpoint_min"));
    }
}
