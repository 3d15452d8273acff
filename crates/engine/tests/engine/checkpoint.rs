//! Named checkpoints: kept by name while writes go on, served read-only, surviving a crash of
//! the writer, and reclaimed by the collector once deleted.

use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill};

use crate::common::{
    crash, flush_until_checkpoints, log_keys, open, pattern, wait_until_deleted, world, World,
};

const LEN: usize = 64 * EXTENT_SIZE_BYTES;

async fn open_checkpoint(w: &World, name: &str) -> Result<Engine, EngineError> {
    let mut opts = EngineOptions::for_tests("pw");
    opts.read_only = true;
    opts.checkpoint = Some(name.to_string());
    Engine::open(w.bucket.clone(), opts).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_checkpoint_keeps_its_state_until_deleted() {
    let w = world();
    let e = open(&w).await;
    e.write(5, 0, LEN as u64, Fill::Data(&pattern(1, LEN)))
        .await
        .unwrap();
    e.kv_commit(vec![bucketfs_engine::KvChange::Put(
        b"k".to_vec(),
        b"v1".to_vec(),
    )])
    .unwrap();
    // Not flushed by the caller: the checkpoint covers everything acknowledged before it.
    let info = e.create_checkpoint("before-upgrade").await.unwrap();
    assert_eq!(info.name, "before-upgrade");
    assert!(info.log_objects >= 1, "{info:?}");
    let kept = log_keys(&w).await;
    // Overwritten, and checkpointed past: without the pin the collector would delete them.
    e.write(5, 0, LEN as u64, Fill::Data(&pattern(2, LEN)))
        .await
        .unwrap();
    e.kv_commit(vec![bucketfs_engine::KvChange::Put(
        b"k".to_vec(),
        b"v2".to_vec(),
    )])
    .unwrap();
    flush_until_checkpoints(&e, 3).await;
    let now = log_keys(&w).await;
    let missing: Vec<_> = kept.iter().filter(|k| !now.contains(k)).collect();
    assert!(missing.is_empty(), "collected while pinned: {missing:?}");

    let snap = open_checkpoint(&w, "before-upgrade").await.unwrap();
    assert!(snap.read(5, 0, LEN).await.unwrap() == pattern(1, LEN));
    assert_eq!(snap.kv_get(b"k").await.unwrap(), Some(b"v1".to_vec()));
    assert!(e.read(5, 0, LEN).await.unwrap() == pattern(2, LEN));

    // Refusals, each with its own error.
    assert!(matches!(
        e.create_checkpoint("before-upgrade").await,
        Err(EngineError::CheckpointExists(_))
    ));
    for bad in ["", "-x", ".x", "a/b", "a b", &"x".repeat(65)] {
        assert!(
            matches!(
                e.create_checkpoint(bad).await,
                Err(EngineError::BadCheckpointName(_))
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        open_checkpoint(&w, "nope").await,
        Err(EngineError::NoSuchCheckpoint(_))
    ));

    // The pin outlives the writer.
    crash(&w, e).await;
    let e = open(&w).await;
    let names: Vec<String> = e.checkpoints().into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["before-upgrade"]);
    assert!(matches!(
        {
            let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
            opts.checkpoint = Some("before-upgrade".into());
            Engine::open(bucket, opts).await
        },
        Err(EngineError::CheckpointIsReadOnly(_)) | Err(EngineError::Lease(_))
    ));

    // Deleted: what only it kept is collected.
    e.delete_checkpoint("before-upgrade").await.unwrap();
    assert!(e.checkpoints().is_empty());
    let left = wait_until_deleted(&w, kept).await;
    assert!(left.is_empty(), "still stored after the pin went: {left:?}");
    assert!(w.bucket.list("pin/").await.unwrap().is_empty());
    assert_eq!(w.bucket.list("manifest/").await.unwrap().len(), 1);
    assert!(matches!(
        e.delete_checkpoint("before-upgrade").await,
        Err(EngineError::NoSuchCheckpoint(_))
    ));
    assert!(matches!(
        open_checkpoint(&w, "before-upgrade").await,
        Err(EngineError::NoSuchCheckpoint(_))
    ));
    assert!(e.read(5, 0, LEN).await.unwrap() == pattern(2, LEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_checkpoints_of_one_state_share_it_and_each_stands_alone() {
    let w = world();
    let e = open(&w).await;
    e.write(5, 0, LEN as u64, Fill::Data(&pattern(3, LEN)))
        .await
        .unwrap();
    let a = e.create_checkpoint("a").await.unwrap();
    // Nothing written between: the second keeps the same manifest.
    let b = e.create_checkpoint("b").await.unwrap();
    assert_eq!(a.seq, b.seq);
    e.write(5, 0, LEN as u64, Fill::Data(&pattern(4, LEN)))
        .await
        .unwrap();
    flush_until_checkpoints(&e, 3).await;
    e.delete_checkpoint("a").await.unwrap();
    flush_until_checkpoints(&e, 5).await;
    let snap = open_checkpoint(&w, "b").await.unwrap();
    assert!(snap.read(5, 0, LEN).await.unwrap() == pattern(3, LEN));
    let names: Vec<String> = e.checkpoints().into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["b"]);
}
