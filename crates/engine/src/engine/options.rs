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
    pub disk_cache_dir: Option<PathBuf>,
    pub disk_cache_bytes_max: u64,
    pub read_only: bool,
    /// A checkpoint is written after this long without a commit, when enough log objects
    /// await one (limits.rs, QUIET_CHECKPOINT_AFTER_MS); `None`: only the regular ones.
    pub quiet_checkpoint_after: Option<Duration>,
    /// lz4 frames are re-sealed with zstd once a checkpoint at least this old covers them
    /// (limits.rs, RESEAL_AFTER_S).
    pub reseal_after: Duration,
}

impl EngineOptions {
    pub fn for_tests(password: &str) -> EngineOptions {
        EngineOptions {
            password: password.to_string(),
            codec: Codec::Zstd,
            flush_interval: Duration::from_secs(3600),
            memory_cache_bytes_max: 64 << 20,
            disk_cache_dir: None,
            disk_cache_bytes_max: 0,
            read_only: false,
            quiet_checkpoint_after: None,
            reseal_after: Duration::ZERO,
        }
    }
}
