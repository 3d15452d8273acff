//! Every size, count and budget of the engine, in one place, each with the reason for its value.

/// Files are cut into extents of this size (recorded in the superblock). Measured on 2 cores
/// with fio 4k random writes at queue depth 16: 32 KiB extents sealed and stored ~20 KB per
/// 4 KiB write (12k IOPS, bound by sealing and writing those bytes); 8 KiB extents match
/// PostgreSQL's page, cut that to ~4 KB and reached 20k+ IOPS, at the price of 4x more extent
/// pointers (docs/0001-bucket-layout-and-flush.md, "Costs").
pub const EXTENT_SIZE_BYTES: usize = 8 * 1024;
pub const EXTENT_SIZE_BYTES_U64: u64 = EXTENT_SIZE_BYTES as u64;

/// Data not yet frozen for a flush before writers wait for one. Bounds the size of one log
/// object (a flush seals everything pending as one object).
pub const PENDING_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Unflushed data held in memory (pending, and sealed but not yet committed) before writers wait
/// for a commit. Twice PENDING_BYTES_MAX, so writers fill the next batch while the last one
/// uploads: with one bound for both, 1 MiB sequential writes stopped during every upload of a
/// 40-50 MB object, and the machine idled a fifth of the time; with this one they ran 1.11 times
/// as fast (fio, docs/benchmarks.md, "Sealing the next batch during an upload").
pub const DIRTY_BYTES_MAX: usize = 2 * PENDING_BYTES_MAX;

/// Once this much data is pending, a flush starts in the background, so sealing and uploading
/// overlap with writers filling the next batch.
pub const DIRTY_BYTES_FLUSH_START: usize = PENDING_BYTES_MAX / 4;

/// Log objects uploaded at once. They commit strictly in order, so after a crash the bucket may
/// hold up to this many uncommitted objects after a gap; opening deletes them (they were never
/// acknowledged). Concurrency hides the object store's latency from back-to-back fsyncs.
pub const UPLOADS_IN_FLIGHT_MAX: usize = 4;

/// A read-only open reads the bucket this many times before it reports what it found
/// inconsistent as damage: a writer running beside it may have changed the bucket meanwhile.
pub const READ_ONLY_OPEN_ATTEMPTS: u32 = 5;

/// Log-object buffers kept for reuse (object_buffer.rs): one per upload in flight, one being
/// sealed and one queued. Each is as large as the largest object it held (at most about
/// PENDING_BYTES_MAX), so this bounds the memory kept idle.
pub const OBJECT_BUFFERS_KEPT: usize = UPLOADS_IN_FLIGHT_MAX + 2;

/// Log objects up to this size are copied out of their pooled buffer when they are handed to
/// the store (object_buffer.rs); larger ones are uploaded from the buffer itself. As large as
/// the objects a `file://` bucket's journal holds in memory for up to 30 s: a buffer is sized
/// for the batch before compression, several times its object, and held buffers drain the pool.
pub const COPIED_OBJECT_BYTES_MAX: usize = crate::bucket::journal::JOURNAL_OBJECT_BYTES_MAX;

/// Buffers of evicted extents kept for reuse by writes (extent_buffers.rs): 32 MiB, more than
/// one log object of a write-heavy flush evicts at once.
pub const EXTENT_BUFFERS_KEPT: usize = 4096;

/// Flushes of at most this many extents are sealed on the calling task rather than on a
/// blocking thread (about 10 microseconds per extent, below the cost of the thread hop).
pub const INLINE_SEAL_EXTENTS_MAX: usize = 16;

/// A batch is split between threads for sealing only when each thread gets at least this many
/// extents (1 MiB). Under pgbench with `synchronous_commit = off` the WAL writer's bursts are
/// batches of ~100 extents, ~1 ms of lz4 on one core; split across rayon's two threads on a
/// machine PostgreSQL keeps busy, each half waited for a core anyway, and rayon's threads then
/// spun on `sched_yield` looking for more work (12 % of bucketfs's samples, perf). Sealed on
/// one thread: 6 % less server CPU per transaction, TPS and rw-sync unchanged within the
/// noise (docs/benchmarks.md, "One sealing thread for batches under 1 MiB"). Bulk writes
/// (fio's 1 MiB writes, loads) flush batches of many MiB and keep both threads.
pub const PARALLEL_SEAL_EXTENTS_MIN: usize = 128;

/// Writes start on their way to the bucket as soon as they are applied (write-behind, see
/// `Engine::write`) while clients ask for flush barriers at least this often, on average and
/// lately. An fsync per transaction (pgbench with `synchronous_commit = on`: a barrier every
/// ~1 ms on the 2-core VM) is well inside; PostgreSQL with `synchronous_commit = off` (~100 ms
/// apart), bulk loads and fio's write jobs (a flush at the end) are well outside, and their
/// writes keep gathering into large log objects.
pub const WRITE_BEHIND_BARRIER_GAP_US: u64 = 4_000;

/// While barriers come at least this often (but less often than `WRITE_BEHIND_BARRIER_GAP_US`),
/// writes start on their way to the bucket once `WRITE_BEHIND_GATHERED_BYTES` of them have
/// gathered. PostgreSQL with `synchronous_commit = off` flushes its WAL several times a second
/// (~10 barriers a second under pgbench, ~1 MiB of writes each); without this every barrier
/// sealed its whole megabyte while the WAL writer waited, ~10 ms on two busy cores.
pub const WRITE_BEHIND_GATHERED_BARRIER_GAP_US: u64 = 250_000;

/// See `WRITE_BEHIND_GATHERED_BARRIER_GAP_US`: the least a gathered write-behind object holds
/// (before compression), so it costs at most ~4 PUTs where one would do.
pub const WRITE_BEHIND_GATHERED_BYTES: usize = 256 * 1024;

/// Longer gaps between barriers count as this long in their running mean, so that a client
/// that resumes fsyncing after a pause turns write-behind on within a few dozen barriers.
pub const BARRIER_GAP_COUNTED_MAX_US: u64 = 1_000_000;

/// A checkpoint (which lets the collector delete dead log objects) is also due after this many
/// bytes of log objects, so overwritten data does not pile up under write-heavy load.
pub const LOG_BYTES_PER_CHECKPOINT: u64 = 1 << 30;

/// A checkpoint is written once the log objects that follow the previous one number the map's
/// extents / CHECKPOINT_EXTENTS_PER_LOG_OBJECT, within the bounds below. A checkpoint encodes the
/// whole map, so this bounds its cost to about that many extent records per log object written
/// (under fsync-heavy pgbench on a 45,000-extent map, checkpoints every 1024 objects were 12 % of
/// bucketfs's CPU).
pub const CHECKPOINT_EXTENTS_PER_LOG_OBJECT: u64 = 16;

/// Fewest log objects between checkpoints (small maps).
pub const LOG_OBJECTS_PER_CHECKPOINT_MIN: u64 = 1024;

/// Most log objects between checkpoints: opening a bucket never replays more than this many
/// objects' metadata records.
pub const LOG_OBJECTS_PER_CHECKPOINT_MAX: u64 = 8192;

/// A checkpoint is also written once no log object has been committed for this long, if the
/// log objects since the previous one number at least 1/QUIET_CHECKPOINT_FRACTION of the
/// regular interval (`log_objects_per_checkpoint`). Without it the objects of a burst's last
/// interval stay uncollected until the next burst: in a `file://` bucket those still only in
/// the journal become files at 30 s (local.rs, JOURNAL_STORE_AFTER_S), to be deleted by that next
/// checkpoint (up to 3,275 files at once between slices of `bench/versus` rw-sync,
/// docs/benchmarks.md).
/// Shorter than that age with room to spare for the checkpoint itself.
pub const QUIET_CHECKPOINT_AFTER_MS: u64 = 5_000;

/// See QUIET_CHECKPOINT_AFTER_MS: a burst of fewer log objects than the regular interval / 8
/// waits for the next regular checkpoint (a checkpoint encodes the whole map, so one per short
/// burst would cost a large map more than its garbage).
pub const QUIET_CHECKPOINT_FRACTION: u64 = 8;

/// After a checkpoint, a log object it covers that still holds at least one and at most this
/// many live extents has them rewritten into a new log object ("repacked"), so that it dies and
/// the next collection deletes it. Under fsync-heavy load each flush is a small object, and a
/// quarter keep an extent that stays live for minutes (the last version of a WAL page):
/// unrepacked, each stays an object of its own (in a `file://` bucket a file, whose creation
/// cost ext4 10-12 % of the machine under pgbench). Counting extents, not bytes, keeps a repacked object (many
/// extents, however well they compress) from being repacked again until most of it is dead.
pub const REPACK_LIVE_EXTENTS_MAX: usize = 16;

/// Most extents one checkpoint repacks (the rest wait for the next one): bounds the memory
/// and the work one checkpoint adds.
pub const REPACK_EXTENTS_MAX: usize = 2048;

/// A log object whose live bytes are at most this percentage of its size is fragmented: once a
/// checkpoint begun at least `reseal_after` (RESEAL_AFTER_S) earlier covers it, the collector
/// moves its live extents out, least live objects first, so that the bucket holds at most
/// about twice the live data (plus what was written within `reseal_after`) however a device is
/// overwritten. Younger objects are left alone: under PostgreSQL most of an object dies within
/// minutes (WAL segments are recycled), and moving it earlier would be wasted work.
pub const REPACK_LIVE_PERCENT_MAX: u64 = 50;

/// Live bytes one checkpoint moves out of fragmented objects: as many as the log objects of its
/// interval took (at most LOG_BYTES_PER_CHECKPOINT, so that one collection stays short), and at
/// least this many (so a quiet device is cleaned up too). Moving at most about what clients
/// wrote bounds the collector's writes to about as many as theirs, and at under half live,
/// every byte moved gives back more than a byte of garbage, so it keeps up.
pub const REPACK_FRAGMENTED_BYTES_MIN: u64 = 64 << 20;

/// lz4 frames are re-sealed with zstd once they have been live this long (counted from the
/// checkpoint that covered them, or from when the process opened the bucket): what survives
/// ten minutes is likely to stay, while PostgreSQL's WAL and hot table pages are rewritten
/// sooner and are better left alone (re-sealing what outlived one checkpoint interval, which
/// under pgbench rw-sync is a few seconds, cost 7 % more server CPU).
pub const RESEAL_AFTER_S: u64 = 600;

/// Most extents one checkpoint re-seals out of objects that hold lz4 frames (whole objects,
/// oldest first; the rest wait for the next checkpoint): bounds the work one checkpoint adds.
/// 512 MiB of extents: under pgbench rw-async a checkpoint interval (1 GiB of log) holds ~1.8
/// GiB of lz4-sealed extents, so this keeps up while under ~28 % of them outlive an interval.
/// Sealing it with zstd level 1 takes ~1.5 s of one core on the 2-core VM (368 MB/s on WAL),
/// spread over flushes of REPACK_EXTENTS_PER_OBJECT extents.
pub const RESEAL_EXTENTS_MAX: usize = 65536;

/// Most extents in one object of repacked extents. Sealing 2048 extents at once took 17-38 ms
/// under pgbench (engine debug log), and every client flush queued behind it waited that long;
/// 112 take a few ms and, sealed raw at worst, stay under a `file://` bucket's 1 MiB journal
/// limit (docs/0002).
pub const REPACK_EXTENTS_PER_OBJECT: usize = 112;

/// Log objects after which a checkpoint of a map of `extents` extents is due.
pub fn log_objects_per_checkpoint(extents: u64) -> u64 {
    (extents / CHECKPOINT_EXTENTS_PER_LOG_OBJECT).clamp(
        LOG_OBJECTS_PER_CHECKPOINT_MIN,
        LOG_OBJECTS_PER_CHECKPOINT_MAX,
    )
}

/// Log objects whose metadata records are read concurrently when opening a bucket.
pub const REPLAY_CONCURRENCY: usize = 32;

/// Ranged GETs in flight for one read request.
pub const READ_FETCH_CONCURRENCY: usize = 16;

/// DELETEs in flight while collecting dead log objects.
pub const DELETE_CONCURRENCY: usize = 16;

/// Adjacent frames of one log object are fetched with one ranged GET while the gap between them is
/// at most this many bytes (reading a little waste is cheaper than another round trip).
pub const READ_COALESCE_GAP_BYTES: u64 = 64 * 1024;

/// Attempts of one object-store request before the error is reported (transient errors only).
pub const STORE_ATTEMPTS_MAX: u32 = 5;
/// First retry delay; doubled on every attempt.
pub const STORE_RETRY_BASE_DELAY_MS: u64 = 50;
/// A single object-store request taking longer than this counts as a transient failure.
pub const STORE_REQUEST_TIMEOUT_MS: u64 = 30_000;

/// Argon2id cost for deriving the key-wrapping key from the password: 64 MiB, 3 passes
/// (OWASP's recommended floor); paid once per open, never per request.
pub const ARGON2_MEMORY_KIB: u32 = 64 * 1024;
pub const ARGON2_PASSES: u32 = 3;

const _: () = assert!(EXTENT_SIZE_BYTES.is_multiple_of(4096));
// frame.rs samples two 512-byte probes, one per half of an extent.
const _: () = assert!(EXTENT_SIZE_BYTES >= 2 * 512);
const _: () = assert!(PENDING_BYTES_MAX >= 64 * EXTENT_SIZE_BYTES);
// Frame offsets inside a log object are u32.
const _: () = assert!((PENDING_BYTES_MAX as u64) * 2 < u32::MAX as u64);
// An object of repacked extents fits the journal, with room for its header and metadata record.
const _: () = assert!(
    REPACK_EXTENTS_PER_OBJECT * crate::frame::FRAME_BYTES_MAX + 64 * 1024
        <= crate::bucket::journal::JOURNAL_OBJECT_BYTES_MAX
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_cadence_grows_with_the_map_within_bounds() {
        assert_eq!(
            log_objects_per_checkpoint(0),
            LOG_OBJECTS_PER_CHECKPOINT_MIN
        );
        assert_eq!(log_objects_per_checkpoint(45_000), 45_000 / 16);
        assert_eq!(
            log_objects_per_checkpoint(u64::MAX),
            LOG_OBJECTS_PER_CHECKPOINT_MAX
        );
    }
}
