//! Every size, count and budget of the engine, in one place, each with the reason for its value.

/// Files are cut into extents of this size (recorded in the superblock). PostgreSQL's page: a
/// random 4 KiB write seals and stores 8 KiB rather than 32, at the price of 4x more extent
/// pointers (docs/0001-bucket-layout-and-flush.md, "Costs").
pub const EXTENT_SIZE_BYTES: usize = 8 * 1024;
pub const EXTENT_SIZE_BYTES_U64: u64 = EXTENT_SIZE_BYTES as u64;

/// Data not yet frozen for a flush before writers wait for one. Bounds the size of one log
/// object (a flush seals everything pending as one object).
pub const PENDING_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Unflushed data held in memory (pending, and sealed but not yet committed) before writers wait
/// for a commit. Twice PENDING_BYTES_MAX, so writers fill the next batch while the last one
/// uploads instead of stopping during every upload (docs/0001, "When flushes happen"; fio:
/// docs/benchmarks/2026-11-26-pipelined-bulk-writes.md).
pub const DIRTY_BYTES_MAX: usize = 2 * PENDING_BYTES_MAX;

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

/// Buffers of evicted extents kept for reuse by writes and reads (extent_buffers.rs): 32 MiB,
/// more than one log object of a write-heavy flush evicts at once.
pub const EXTENT_BUFFERS_KEPT: usize = 4096;

/// Plaintext bytes of point entries gathered into one block of a sorted run before it is sealed:
/// a cold lookup reads one block with one ranged GET, and at 32 KiB that GET stays small while
/// the run's index (one line per block, kept in memory while the run is open) stays about a
/// thousandth of the run.
pub const RUN_BLOCK_BYTES_TARGET: usize = 32 * 1024;

/// Largest value one run entry may hold (inode records and directory entries are far smaller).
pub const RUN_VALUE_BYTES_MAX: usize = 1024 * 1024;

/// Most plaintext one block decodes to: the target plus one entry of the largest key and value.
/// A block claiming more is damaged, not an allocation.
pub const RUN_BLOCK_PLAIN_BYTES_MAX: usize =
    RUN_BLOCK_BYTES_TARGET + 2 + u16::MAX as usize + 1 + 4 + RUN_VALUE_BYTES_MAX;

/// Most plaintext one run's index decodes to: ~7 MB for the run of a fully written 1 TiB device.
pub const RUN_INDEX_PLAIN_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Most runs one manifest names; the next checkpoint then writes the whole map as one run. Each
/// run costs a tail and an index read when the bucket is opened.
pub const RUNS_PER_MANIFEST_MAX: usize = 64;
/// Run blocks a checkpoint reads at once when it looks up the pointers an interval replaced:
/// one at a time, a remote bucket's round trip per block made the lookups take seconds.
pub const RUN_PREFETCH_CONCURRENCY: usize = 16;
/// Most extent pointers fsck holds at once (about 32 bytes each): it checks the log objects in
/// ranges whose live extents add up to this, one pass over the extent map per range.
pub const FSCK_EXTENTS_PER_PASS: u64 = 4 << 20;
/// Run parts opened at once (a tail and an index read each) when a manifest is loaded.
pub const RUN_OPEN_CONCURRENCY: usize = 16;
/// Replaced pointers looked up per round of prefetching: their blocks fit the block cache.
pub const RUN_PREFETCH_KEYS: usize = 4096;

/// Log objects whose metadata records are read concurrently when opening a bucket.
pub const REPLAY_CONCURRENCY: usize = 32;

/// Ranged GETs in flight for one read request.
pub const READ_FETCH_CONCURRENCY: usize = 16;

/// DELETEs in flight while collecting dead log objects.
pub const DELETE_CONCURRENCY: usize = 16;

/// Attempts of one object-store request before the error is reported (transient errors only).
pub const STORE_ATTEMPTS_MAX: u32 = 5;
/// First retry delay; doubled on every attempt.
pub const STORE_RETRY_BASE_DELAY_MS: u64 = 50;
/// One attempt of an object-store request is abandoned (a transient failure, retried) after
/// this long plus STORE_ATTEMPT_MS_PER_MIB for each MiB it carries: a store that hangs must not
/// hold the barrier pipeline, and a big PUT on a slow link must still get through.
pub const STORE_ATTEMPT_TIMEOUT_MS: u64 = 10_000;
/// The time allowed per MiB of an attempt's body or range: a link of at least 1 MiB/s.
pub const STORE_ATTEMPT_MS_PER_MIB: u64 = 1_000;
/// A GET of a whole object, whose size is not known up front, is abandoned after this long.
pub const STORE_GET_TIMEOUT_MS: u64 = 30_000;
/// GETs of one bucket in flight at once; more wait their turn before their first attempt (and
/// before its timeout starts). Without a bound, clients reading in parallel (nbdcopy's 4 x 64
/// requests, each with readahead) can ask more of a slow store than it answers within an
/// attempt's timeout: every attempt then times out, and each retry, on top of the abandoned
/// request the store is still serving, makes it slower (a GET of 64 MiB objects on moto, seen
/// in CI). 64 GETs of 256 KiB 20 ms away keep 800 MB/s in flight.
pub const STORE_GETS_IN_FLIGHT_MAX: usize = 64;
/// No new attempt starts once a request has been retried for this long: past it the caller
/// decides (a barrier waits out an outage with its own clock, docs/0004), so that a hanging
/// store costs a caller one budget, not STORE_ATTEMPTS_MAX timeouts.
pub const STORE_REQUEST_BUDGET_MS: u64 = 20_000;

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
