//! Helpers shared by the engine's integration tests.

use bucketfs_engine::limits::LOG_OBJECTS_PER_CHECKPOINT_MIN;
use bucketfs_engine::{Engine, Fill};

/// Writes and flushes one 4 KiB block per flush, cycling over `slots` blocks of inode 1, until
/// a checkpoint is due, then waits until the collector has deleted more than half of those
/// log objects (each is dead once its block is overwritten). Returns the number of flushes.
pub async fn flush_past_a_checkpoint(e: &Engine, slots: u64) -> u64 {
    let n = LOG_OBJECTS_PER_CHECKPOINT_MIN + 10;
    for i in 0..n {
        let block: Vec<u8> = (0..4096).map(|b| (i as usize * 7 + b) as u8).collect();
        e.write(1, (i % slots) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    for _ in 0..200 {
        if e.stats().log_objects_deleted > n / 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(e.stats().log_objects_deleted > n / 2, "{:?}", e.stats());
    n
}
