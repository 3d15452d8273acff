//! How an engine is opened: what the caller chooses.

use super::*;

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub password: String,
    pub codec: Codec,
    /// Unflushed writes older than this are flushed anyway: the loss window for data nobody
    /// fsynced.
    pub flush_interval: Duration,
    pub memory_cache_bytes_max: u64,
    /// Decoded blocks of metadata runs kept in memory (`[cache] metadata_bytes_max`).
    pub metadata_cache_bytes_max: u64,
    pub disk_cache_dir: Option<PathBuf>,
    pub disk_cache_bytes_max: u64,
    pub read_only: bool,
    /// How long barriers wait and retry while the object store fails before they answer the
    /// error (`[storage] outage_timeout_s`).
    pub outage_timeout: Duration,
    /// Serve this named checkpoint (read-only) instead of the newest state.
    pub checkpoint: Option<String>,
    /// The password's key-derivation cost, for a bucket this open creates (tests lower it).
    pub kdf_cost: KdfCost,
    /// Values fitted to a workload (tuning.rs).
    pub tuning: Tuning,
    /// Every task the engine starts; stopping them all is how a crash test kills an engine.
    pub tasks: TaskSet,
    /// The bucket journals create-only PUTs of `jrec/` keys (a journal tier is configured):
    /// a client's barrier then writes its batch there as a record and returns, and the batches
    /// reach the bucket together, a few log objects a second (engine/journaled.rs).
    pub journaled_barriers: bool,
}

impl EngineOptions {
    pub fn for_tests(password: &str) -> EngineOptions {
        EngineOptions {
            password: password.to_string(),
            codec: Codec::Zstd,
            flush_interval: Duration::from_secs(3600),
            memory_cache_bytes_max: 64 << 20,
            // Small, so that tests read runs through misses as well as hits.
            metadata_cache_bytes_max: 4 << 20,
            disk_cache_dir: None,
            disk_cache_bytes_max: 0,
            read_only: false,
            // A failed upload fails its barrier at once (after the bucket's own retries).
            outage_timeout: Duration::ZERO,
            checkpoint: None,
            // Tests ask for checkpoints themselves, and age nothing by default.
            tuning: Tuning {
                quiet_checkpoint_after_ms: 0,
                reseal_after_s: 0,
                // Merges of a few hundred extents already span several parts.
                run_part_bytes: 8 << 10,
                ..Tuning::default()
            },
            kdf_cost: KdfCost::default(),
            tasks: TaskSet::default(),
            journaled_barriers: false,
        }
    }
}
