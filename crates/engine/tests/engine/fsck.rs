//! `Engine::fsck`: a clean bucket is clean; a flipped byte names its object and the extents it
//! costs (and only those fail to read); a missing object is found; garbage is listed, and
//! deleted with `repair` only.

use bucketfs_engine::bucket::PutMode;
use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill};

use crate::common::{flush_until_checkpoints, open, pattern, world, World};

async fn read_only(w: &World) -> Engine {
    let mut opts = EngineOptions::for_tests("pw");
    opts.read_only = true;
    Engine::open(w.bucket.clone(), opts).await.unwrap()
}

/// Inode 5 in three log objects of 16 extents each, then checkpoints (which write inode 1);
/// closed cleanly. Objects of a few extents are not repacked, but the collector may still move
/// inode 5's extents, with inode 1's, into one object.
async fn filled(w: &World) {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.repack_live_extents_max = 0;
    let (bucket, opts) = w.writer(opts);
    let e = Engine::open(bucket, opts).await.unwrap();
    for part in 0..3u64 {
        let len = 16 * EXTENT_SIZE_BYTES;
        e.write(
            5,
            part * len as u64,
            len as u64,
            Fill::Data(&pattern(part as u8, len)),
        )
        .await
        .unwrap();
        e.flush().await.unwrap();
    }
    flush_until_checkpoints(&e, 2).await;
    e.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsck_finds_damage_and_garbage_and_repairs_only_garbage() {
    let w = world();
    filled(&w).await;
    let report = read_only(&w).await.fsck(false).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert!(report.extents_checked >= 48, "{report:?}");
    assert!(report.garbage.is_empty(), "{report:?}");

    // Garbage: a run no manifest names.
    let runs = w.bucket.list("run/").await.unwrap();
    let run = w.bucket.get(&runs[0].key).await.unwrap();
    w.bucket
        .put("run/00000000000000000000", run, PutMode::Create)
        .await
        .unwrap();
    // Damage: one byte of the first frame of the first log object of file data. Which extent
    // that frame holds depends on how the collector repacked: one of inode 5's, or one of the
    // inode 1 that `flush_until_checkpoints` writes.
    let logs = w.bucket.list("log/").await.unwrap();
    let victim = logs
        .iter()
        .find(|o| o.size_bytes > 16 * 1024)
        .expect("an object of file data")
        .key
        .clone();
    let mut bytes = w.bucket.get(&victim).await.unwrap().to_vec();
    bytes[200] ^= 0x01;
    w.bucket
        .put(&victim, bytes.into(), PutMode::Overwrite)
        .await
        .unwrap();

    let e = read_only(&w).await;
    let report = e.fsck(false).await.unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    let p = &report.problems[0];
    assert_eq!(p.object, victim);
    assert_eq!(p.extents_damaged, 1, "{report:?}");
    let damaged = p.first_extents[0];
    assert!([1, 5].contains(&damaged.0), "{report:?}");
    assert_eq!(report.garbage, vec!["run/00000000000000000000".to_string()]);
    // The damaged extent reads as an error, every other extent of both files as data.
    let extents =
        |ino: u64, count: u64| (0..count).map(move |i| (ino, i * EXTENT_SIZE_BYTES as u64));
    for (ino, offset) in extents(5, 48).chain(extents(1, 2)) {
        let read = e.read(ino, offset, 10).await;
        if (ino, offset) == damaged {
            assert!(matches!(read, Err(EngineError::Corrupt(_))), "{read:?}");
        } else {
            assert!(read.is_ok(), "inode {ino} at {offset}: {read:?}");
        }
    }
    assert!(matches!(e.fsck(true).await, Err(EngineError::ReadOnly)));

    // Repair deletes the garbage, and nothing else.
    let writer = open(&w).await;
    let report = writer.fsck(true).await.unwrap();
    assert_eq!(report.garbage_deleted, 1);
    assert!(w.bucket.get("run/00000000000000000000").await.is_err());
    assert!(w.bucket.get(&victim).await.is_ok());
    assert_eq!(report.problems.len(), 1);
    writer.close().await.unwrap();

    // A live object gone.
    w.bucket
        .delete(&victim, bucketfs_engine::bucket::DeleteMode::Durable)
        .await
        .unwrap();
    let report = read_only(&w).await.fsck(false).await.unwrap();
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(report.problems[0].what.contains("missing"), "{report:?}");
    // The collector may have moved all 48 extents into it.
    assert!(report.problems[0].extents_damaged >= 16, "{report:?}");
    assert!(
        report.problems[0]
            .first_extents
            .iter()
            .any(|(ino, _)| *ino == 5),
        "{report:?}"
    );
}
