//! The collector at scale: repacking finds the extents of the objects it moves out of by a
//! sweep over the extent map in bounded slices, one per checkpoint, never the whole map at once.

use bucketfs_engine::{Engine, EngineOptions, Fill};

use crate::common::{crash, flush_past_a_checkpoint, log_keys, open, pattern, world};

const EXTENT: u64 = 8192;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repacking_sweeps_the_map_in_slices_and_still_empties_every_sparse_object() {
    let w = world();
    let mut opts = EngineOptions::for_tests("pw");
    let slice = 16;
    opts.tuning.repack_scan_extents_max = slice;
    let (bucket, opts) = w.writer(opts);
    let e = Engine::open(bucket, opts).await.unwrap();
    // 100 objects, each kept alive by one extent of inode 2 that is never written again.
    let kept = 100u64;
    for i in 0..kept {
        e.write(
            2,
            i * EXTENT,
            EXTENT,
            Fill::Data(&pattern(i as u8, EXTENT as usize)),
        )
        .await
        .unwrap();
        e.flush().await.unwrap();
    }
    let kept_objects = log_keys(&w).await;
    assert_eq!(kept_objects.len() as u64, kept);

    // The first checkpoint that repacks reads one slice: at most `slice` pointers, and so
    // moves at most that many extents.
    flush_past_a_checkpoint(&e, 3).await;
    let first = e.stats();
    assert!(first.extents_repacked >= 1, "{first:?}");
    assert!(
        first.extents_repacked <= slice,
        "one checkpoint moved more extents than its slice holds: {first:?}"
    );

    // Later checkpoints go on from there and empty every one of those objects.
    let mut checkpoints = 1;
    loop {
        let now = log_keys(&w).await;
        let left = kept_objects.iter().filter(|k| now.contains(k)).count();
        if left == 0 {
            break;
        }
        checkpoints += 1;
        assert!(
            checkpoints <= 30,
            "{left} objects still kept alive after {checkpoints} checkpoints: {:?}",
            e.stats()
        );
        flush_past_a_checkpoint(&e, 3).await;
    }
    let stats = e.stats();
    assert!(stats.extents_repacked >= kept, "{stats:?}");
    // Each checkpoint moved one slice's worth at most, so it took that many of them.
    assert!(
        stats.checkpoints_written >= kept.div_ceil(slice),
        "{kept} extents moved in fewer checkpoints than slices of {slice}: {stats:?}"
    );
    assert!(stats.repack_sweeps_started >= 1, "{stats:?}");
    crash(&w, e).await;
    let e = open(&w).await;
    for i in 0..kept {
        assert_eq!(
            e.read(2, i * EXTENT, EXTENT as usize).await.unwrap(),
            pattern(i as u8, EXTENT as usize)
        );
    }
}
