//! Helpers shared by the engine's integration tests.
// Each test binary uses some of them.
#![allow(dead_code)]

use bucketfs_engine::{Engine, Fill, Tuning};

fn log_objects_per_checkpoint_min() -> u64 {
    Tuning::default().log_objects_per_checkpoint_min
}

/// Writes and flushes one 4 KiB block per flush, cycling over `slots` blocks of inode 1, until
/// a checkpoint is due, then waits until the collector has deleted more than half of those
/// log objects (each is dead once its block is overwritten). Returns the number of flushes.
pub async fn flush_past_a_checkpoint(e: &Engine, slots: u64) -> u64 {
    let n = log_objects_per_checkpoint_min() + 10;
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

/// Writes and flushes one 4 KiB block per flush, cycling over 3 blocks of inode 1, until the
/// engine has written `n` checkpoints (whenever the flushes before made them due). A checkpoint
/// due while the last one is still collecting begins at the first commit after that one ends,
/// and in memory flushes outrun collections: after each interval's worth of flushes, a pause.
pub async fn flush_until_checkpoints(e: &Engine, n: u64) {
    let started = std::time::Instant::now();
    let mut i = 0u64;
    while e.stats().checkpoints_written < n {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{n} checkpoints not written: {:?}",
            e.stats()
        );
        if i > 0 && i.is_multiple_of(log_objects_per_checkpoint_min() + 10) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let block: Vec<u8> = (0..4096).map(|b| (i as usize * 5 + b) as u8).collect();
        e.write(1, (i % 3) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        e.flush().await.unwrap();
        i += 1;
    }
}
