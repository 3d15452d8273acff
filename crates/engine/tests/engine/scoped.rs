//! Scoped barriers (engine/scoped.rs): an fsync of one inode that does not wait for another
//! inode's data stuck on its way to the bucket, and what a crash leaves of both.

use crate::common::{crash, noise, pattern, world, World};
use bucketfs_engine::bucket::Fault;
use bucketfs_engine::{Engine, EngineOptions, Fill, Scope, Tuning, Txn};
use std::time::Duration;

const BULK: u64 = 1;
const SMALL: u64 = 2;

fn size_key(ino: u64) -> Vec<u8> {
    format!("size{ino}").into_bytes()
}

fn scope(ino: u64) -> Scope {
    Scope::with_keys(ino, [size_key(ino)])
}

async fn open_scoped(w: &World) -> Engine {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning = Tuning {
        scoped_barrier_ahead_bytes_min: 64 << 10,
        ..Tuning::default()
    };
    let (bucket, opts) = w.writer(opts);
    Engine::open(bucket, opts).await.unwrap()
}

async fn side_keys(w: &World) -> Vec<String> {
    let listed = w.bucket.list("side/").await.unwrap();
    listed.into_iter().map(|o| o.key).collect()
}

/// Writes 1 MiB to BULK and starts a full barrier that cannot finish while log PUTs hang.
async fn bulk_stuck(w: &World, e: &Engine) -> tokio::task::JoinHandle<()> {
    w.faults.set(Fault::HangPutsUnder("log/".into()));
    e.write(BULK, 0, 1 << 20, Fill::Data(&pattern(9, 1 << 20)))
        .await
        .unwrap();
    let stuck = e.clone();
    tokio::spawn(async move {
        // Fails once the writer is killed; nobody waits for its answer.
        let _ = stuck.flush().await;
    })
}

/// Ends `bulk_stuck`'s flush and waits until it is gone: its clone of the engine keeps the
/// killed writer's lock held in this process until dropped, and an open meanwhile is refused.
async fn end_stuck(stuck: tokio::task::JoinHandle<()>) {
    stuck.abort();
    let _ = stuck.await;
}

/// A small write and its size pair, as one transaction of SMALL's scope.
async fn small_write(e: &Engine, seed: u8) {
    let mut txn = Txn::new();
    txn.write(SMALL, 0, pattern(seed, 4096))
        .put(size_key(SMALL), 4096u64.to_le_bytes().to_vec());
    e.commit(&txn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_barrier_skips_another_inodes_stuck_upload_and_its_data_survives_a_crash() {
    let w = world();
    let e = open_scoped(&w).await;
    let stuck = bulk_stuck(&w, &e).await;
    small_write(&e, 3).await;
    tokio::time::timeout(Duration::from_secs(5), e.scoped_flush(&scope(SMALL)))
        .await
        .expect("the scoped barrier does not wait for the stuck log object")
        .unwrap();
    let stats = e.stats();
    assert_eq!(
        (stats.scoped_barriers_side, stats.scoped_barriers_full),
        (1, 0),
        "{stats:?}"
    );
    assert_eq!(side_keys(&w).await.len(), 1);
    // Nothing of the scope is unflushed that the side record does not hold: the next fsync
    // stores another (the engine cannot know the first is enough) but never waits.
    crash(&w, e).await;
    w.faults.set(Fault::None);
    end_stuck(stuck).await;

    let e = open_scoped(&w).await;
    assert_eq!(e.read(SMALL, 0, 4096).await.unwrap(), pattern(3, 4096));
    assert_eq!(
        e.kv_get(&size_key(SMALL)).await.unwrap(),
        Some(4096u64.to_le_bytes().to_vec())
    );
    // Never acknowledged by a barrier of its own: lost with the crash, as the scope allows.
    assert_eq!(e.read(BULK, 0, 8192).await.unwrap(), vec![0; 8192]);
    assert!(
        side_keys(&w).await.is_empty(),
        "replayed side records are deleted"
    );
    // The replay went to the bucket's log: it survives a crash with no side record left.
    crash(&w, e).await;
    let e = open_scoped(&w).await;
    assert_eq!(e.read(SMALL, 0, 4096).await.unwrap(), pattern(3, 4096));
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_changed_together_with_another_takes_the_full_barrier() {
    let w = world();
    let e = open_scoped(&w).await;
    let stuck = bulk_stuck(&w, &e).await;
    let mut txn = Txn::new();
    txn.write(SMALL, 0, pattern(4, 4096))
        .write(3, 0, pattern(5, 4096))
        .shared_by([SMALL, 3]);
    e.commit(&txn).await.unwrap();
    let scoped = e.clone();
    let barrier = tokio::spawn(async move { scoped.scoped_flush(&scope(SMALL)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !barrier.is_finished(),
        "a side record would keep half of the transaction after a crash"
    );
    assert!(side_keys(&w).await.is_empty());
    w.faults.set(Fault::None);
    tokio::time::timeout(Duration::from_secs(30), barrier)
        .await
        .expect("the full barrier ends once the log is stored")
        .unwrap()
        .unwrap();
    stuck.await.unwrap();
    assert_eq!(e.stats().scoped_barriers_full, 1);
    // Once the shared transaction is in the bucket, the scope is clean.
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    assert_eq!(e.stats().scoped_barriers_clean, 1);
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_record_the_log_caught_up_with_is_never_applied_again() {
    let w = world();
    let e = open_scoped(&w).await;
    let stuck = bulk_stuck(&w, &e).await;
    small_write(&e, 6).await;
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    let keys = side_keys(&w).await;
    assert_eq!(keys.len(), 1);
    let kept = w.bucket.get(&keys[0]).await.unwrap();
    w.faults.set(Fault::None);
    stuck.await.unwrap();
    // Newer content, durable in the log.
    small_write(&e, 7).await;
    e.flush().await.unwrap();
    crash(&w, e).await;
    // As if the side record's DELETE had never reached the store.
    w.bucket
        .put(&keys[0], kept, bucketfs_engine::bucket::PutMode::Overwrite)
        .await
        .unwrap();
    let e = open_scoped(&w).await;
    assert_eq!(e.read(SMALL, 0, 4096).await.unwrap(), pattern(7, 4096));
    assert_eq!(e.read(BULK, 0, 1 << 20).await.unwrap(), pattern(9, 1 << 20));
    assert!(side_keys(&w).await.is_empty());
    e.close().await.unwrap();
}

/// The sizes of the side records stored, in the order of their keys.
async fn side_sizes(w: &World) -> Vec<usize> {
    let mut sizes = Vec::new();
    for key in side_keys(w).await {
        sizes.push(w.bucket.get(&key).await.unwrap().len());
    }
    sizes
}

/// SMALL's extent `index` rewritten whole, with its size pair, as one transaction.
async fn write_extent(e: &Engine, index: u64, data: &[u8], size: u64) {
    let mut txn = Txn::new();
    txn.write(SMALL, index * EXTENT as u64, data.to_vec())
        .put(size_key(SMALL), size.to_le_bytes().to_vec());
    e.commit(&txn).await.unwrap();
}

const EXTENT: usize = bucketfs_engine::limits::EXTENT_SIZE_BYTES;

/// Compares without printing megabytes: names the first extent that differs.
fn assert_bytes(got: &[u8], expected: &[u8]) {
    assert_eq!(got.len(), expected.len());
    if let Some(at) = (0..got.len()).find(|&i| got[i] != expected[i]) {
        panic!("bytes differ from offset {at} (extent {})", at / EXTENT);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_records_after_the_first_hold_what_changed_and_an_open_rebuilds_the_whole() {
    let w = world();
    let e = open_scoped(&w).await;
    let stuck = bulk_stuck(&w, &e).await;
    let mut expected = noise(1, 16 * EXTENT);
    write_extent(&e, 0, &expected, expected.len() as u64).await;
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    for (i, index) in [3u64, 7, 3, 12].into_iter().enumerate() {
        let data = noise(10 + i as u64, EXTENT);
        let at = index as usize * EXTENT;
        expected[at..at + EXTENT].copy_from_slice(&data);
        write_extent(&e, index, &data, expected.len() as u64).await;
        e.scoped_flush(&scope(SMALL)).await.unwrap();
    }
    // Nothing changed since the last record: nothing to store.
    let clean = e.stats().scoped_barriers_clean;
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    assert_eq!(e.stats().scoped_barriers_clean, clean + 1);
    let sizes = side_sizes(&w).await;
    assert_eq!(sizes.len(), 5, "{sizes:?}");
    assert!(sizes[0] > 16 * EXTENT, "{sizes:?}");
    assert!(
        sizes[1..].iter().all(|&s| s > EXTENT && s < 2 * EXTENT),
        "each later record holds the one extent that changed: {sizes:?}"
    );
    crash(&w, e).await;
    w.faults.set(Fault::None);
    end_stuck(stuck).await;

    let e = open_scoped(&w).await;
    assert_bytes(&e.read(SMALL, 0, 16 * EXTENT).await.unwrap(), &expected);
    assert!(side_keys(&w).await.is_empty());
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_among_a_scopes_unflushed_changes_makes_its_next_side_record_whole() {
    let w = world();
    let e = open_scoped(&w).await;
    let stuck = bulk_stuck(&w, &e).await;
    // Written, truncated to 4 extents, then written again up to 12: the first record holds
    // the cut and the 12 extents written after it.
    let mut expected = noise(2, 16 * EXTENT);
    write_extent(&e, 0, &expected, expected.len() as u64).await;
    e.drop_extents_from(SMALL, 4).unwrap();
    expected.truncate(4 * EXTENT);
    let tail = noise(4, 8 * EXTENT);
    expected.extend_from_slice(&tail);
    write_extent(&e, 4, &tail, expected.len() as u64).await;
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    // Had the second record held only the extent rewritten here, the cut it carries too
    // would remove, at open, the 8 extents the first record wrote after that cut.
    let data = noise(3, EXTENT);
    expected[2 * EXTENT..3 * EXTENT].copy_from_slice(&data);
    write_extent(&e, 2, &data, expected.len() as u64).await;
    e.scoped_flush(&scope(SMALL)).await.unwrap();
    let sizes = side_sizes(&w).await;
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(sizes[1] > 12 * EXTENT, "{sizes:?}");
    crash(&w, e).await;
    w.faults.set(Fault::None);
    end_stuck(stuck).await;

    let e = open_scoped(&w).await;
    assert_bytes(&e.read(SMALL, 0, 12 * EXTENT).await.unwrap(), &expected);
    assert_bytes(
        &e.read(SMALL, 12 * EXTENT as u64, 4 * EXTENT).await.unwrap(),
        &[0; 4 * EXTENT],
    );
    e.close().await.unwrap();
}
