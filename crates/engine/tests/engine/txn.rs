//! Transactions and range deletions: whole or absent after a crash, refused under a failed
//! condition, one op in the log whatever a range covers, and the same after checkpoints.

use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{EngineError, Expect, Fill, KvChange, Txn};

use crate::common::{
    crash, flush_until_checkpoints, log_keys, open, pattern, wait_until_deleted, world,
};

const EXTENT: u64 = EXTENT_SIZE_BYTES as u64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_deletion_is_one_small_op_whatever_it_covers() {
    let w = world();
    let e = open(&w).await;
    // 2,000 extents of inode 7, then one of inode 8 that must survive.
    let big = pattern(3, 2000 * EXTENT_SIZE_BYTES);
    e.write(7, 0, big.len() as u64, Fill::Data(&big))
        .await
        .unwrap();
    e.write(8, 0, 100, Fill::Data(&pattern(4, 100)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    let doomed = log_keys(&w).await;
    let before = e.stats().log_bytes_written;
    e.drop_extents_from(7, 0).unwrap();
    e.flush().await.unwrap();
    let cost = e.stats().log_bytes_written - before;
    assert!(
        cost < 512,
        "deleting 2,000 extents wrote a {cost}-byte log object"
    );
    assert_eq!(
        e.allocation(7, 0, 2000 * EXTENT).await.unwrap(),
        vec![(2000 * EXTENT, false)]
    );
    assert!(e.read(7, 0, 3 * EXTENT_SIZE_BYTES).await.unwrap() == vec![0; 3 * EXTENT_SIZE_BYTES]);
    // From the log after a crash, and from the runs after checkpoints.
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(
        e.allocation(7, 0, 2000 * EXTENT).await.unwrap(),
        vec![(2000 * EXTENT, false)]
    );
    assert_eq!(e.read(8, 0, 100).await.unwrap(), pattern(4, 100));
    flush_until_checkpoints(&e, 2).await;
    // Nothing points into the object that held inode 7 any more: the collector deletes it.
    let left = wait_until_deleted(&w, doomed).await;
    assert!(left.is_empty(), "still stored: {left:?}");
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(
        e.allocation(7, 0, 2000 * EXTENT).await.unwrap(),
        vec![(2000 * EXTENT, false)]
    );
    assert_eq!(e.read(8, 0, 100).await.unwrap(), pattern(4, 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_after_a_range_deletion_in_the_same_batch_survive_it() {
    let w = world();
    let e = open(&w).await;
    e.write(
        7,
        0,
        10 * EXTENT,
        Fill::Data(&pattern(1, 10 * EXTENT_SIZE_BYTES)),
    )
    .await
    .unwrap();
    e.flush().await.unwrap();
    e.write(7, 2 * EXTENT, 10, Fill::Data(&pattern(2, 10)))
        .await
        .unwrap();
    e.drop_extents_from(7, 1).unwrap();
    e.write(7, 5 * EXTENT + 3, 10, Fill::Data(&pattern(5, 10)))
        .await
        .unwrap();
    let mut expect = pattern(1, EXTENT_SIZE_BYTES);
    expect.resize(10 * EXTENT_SIZE_BYTES, 0);
    expect[5 * EXTENT_SIZE_BYTES + 3..5 * EXTENT_SIZE_BYTES + 13].copy_from_slice(&pattern(5, 10));
    assert!(e.read(7, 0, 10 * EXTENT_SIZE_BYTES).await.unwrap() == expect);
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert!(e.read(7, 0, 10 * EXTENT_SIZE_BYTES).await.unwrap() == expect);
    flush_until_checkpoints(&e, 2).await;
    crash(&w, e).await;
    let e = open(&w).await;
    assert!(e.read(7, 0, 10 * EXTENT_SIZE_BYTES).await.unwrap() == expect);
}

/// What a filesystem's create does: the directory entry must not exist yet, and the entry, the
/// inode and the file's first bytes are committed together.
fn create(name: &str, ino: u64, data: &[u8]) -> Txn {
    let mut txn = Txn::new();
    txn.expect(format!("d/{name}").into_bytes(), Expect::Absent)
        .put(format!("d/{name}").into_bytes(), ino.to_be_bytes().to_vec())
        .put(format!("i/{ino}").into_bytes(), b"inode".to_vec())
        .write(ino, 0, data.to_vec());
    txn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_applies_whole_under_its_conditions_or_not_at_all() {
    let w = world();
    let e = open(&w).await;
    e.commit(&create("a", 10, &pattern(1, 5000))).await.unwrap();
    // The same name again: refused, and its write did not happen either.
    let err = e
        .commit(&create("a", 11, &pattern(2, 5000)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Conflict { key, .. } if key == "d/a"),
        "{err}"
    );
    assert!(err.to_string().contains("d/a"), "{err}");
    assert_eq!(e.kv_get(b"i/11").await.unwrap(), None);
    assert_eq!(
        e.allocation(11, 0, EXTENT).await.unwrap(),
        vec![(EXTENT, false)]
    );
    // An expected value: matches, then no longer does.
    let mut bump = Txn::new();
    bump.expect(b"i/10".to_vec(), Expect::Value(b"inode".to_vec()))
        .put(b"i/10".to_vec(), b"inode2".to_vec());
    e.commit(&bump).await.unwrap();
    assert!(matches!(
        e.commit(&bump).await,
        Err(EngineError::Conflict { .. })
    ));
    e.flush().await.unwrap();
    // Unflushed when the process dies: gone whole, the entry with its data.
    e.commit(&create("b", 12, &pattern(3, 3 * EXTENT_SIZE_BYTES)))
        .await
        .unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(
        e.kv_get(b"d/a").await.unwrap(),
        Some(10u64.to_be_bytes().to_vec())
    );
    assert_eq!(e.kv_get(b"i/10").await.unwrap(), Some(b"inode2".to_vec()));
    assert_eq!(e.read(10, 0, 5000).await.unwrap(), pattern(1, 5000));
    assert_eq!(e.kv_get(b"d/b").await.unwrap(), None);
    assert_eq!(
        e.allocation(12, 0, 3 * EXTENT).await.unwrap(),
        vec![(3 * EXTENT, false)]
    );
    // Flushed: there whole.
    e.commit(&create("b", 12, &pattern(3, 3 * EXTENT_SIZE_BYTES)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(
        e.kv_get(b"d/b").await.unwrap(),
        Some(12u64.to_be_bytes().to_vec())
    );
    assert!(
        e.read(12, 0, 3 * EXTENT_SIZE_BYTES).await.unwrap() == pattern(3, 3 * EXTENT_SIZE_BYTES)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncation_is_one_transaction_of_size_tail_and_range() {
    let w = world();
    let e = open(&w).await;
    e.write(
        3,
        0,
        6 * EXTENT,
        Fill::Data(&pattern(9, 6 * EXTENT_SIZE_BYTES)),
    )
    .await
    .unwrap();
    e.kv_commit(vec![KvChange::Put(b"size3".to_vec(), b"6".to_vec())])
        .unwrap();
    e.flush().await.unwrap();
    // Truncate to 2.5 extents: the partial tail is read from the bucket, zeroed, and dropped
    // beyond, together with the size record.
    let size = 2 * EXTENT + EXTENT / 2;
    let mut txn = Txn::new();
    txn.expect(b"size3".to_vec(), Expect::Value(b"6".to_vec()))
        .zero(3, size, 3 * EXTENT - size, false)
        .drop_extents(3, 3, u64::MAX)
        .put(b"size3".to_vec(), b"2.5".to_vec());
    e.commit(&txn).await.unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    let mut expect = pattern(9, 6 * EXTENT_SIZE_BYTES);
    expect[size as usize..].fill(0);
    assert!(e.read(3, 0, 6 * EXTENT_SIZE_BYTES).await.unwrap() == expect);
    assert_eq!(
        e.allocation(3, 0, 6 * EXTENT).await.unwrap(),
        vec![(3 * EXTENT, true), (3 * EXTENT, false)]
    );
    assert_eq!(e.kv_get(b"size3").await.unwrap(), Some(b"2.5".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_take_a_range_and_a_limit_over_unflushed_range_deletions() {
    let w = world();
    let e = open(&w).await;
    let keys: Vec<Vec<u8>> = (b'a'..=b'j').map(|c| vec![b'd', c]).collect();
    e.kv_commit(
        keys.iter()
            .map(|k| KvChange::Put(k.clone(), k.clone()))
            .collect(),
    )
    .unwrap();
    e.flush().await.unwrap();
    e.kv_commit(vec![
        KvChange::DeleteRange(b"dc".to_vec(), b"df".to_vec()),
        KvChange::Put(b"dd2".to_vec(), b"new".to_vec()),
    ])
    .unwrap();
    fn names(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<String> {
        pairs
            .into_iter()
            .map(|(k, _)| String::from_utf8(k).unwrap())
            .collect()
    }
    async fn check(e: &bucketfs_engine::Engine) {
        assert_eq!(
            names(e.kv_range(b"db", Some(b"dh"), 3).await.unwrap()),
            ["db", "dd2", "df"]
        );
        assert_eq!(
            names(e.kv_range(b"db", Some(b"dh"), 100).await.unwrap()),
            ["db", "dd2", "df", "dg"]
        );
        assert_eq!(
            names(e.kv_range(b"dg", None, 100).await.unwrap()),
            ["dg", "dh", "di", "dj"]
        );
        assert_eq!(e.kv_scan(b"d").await.unwrap().len(), 8);
        assert_eq!(e.kv_get(b"dc").await.unwrap(), None);
    }
    check(&e).await;
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    check(&e).await;
    flush_until_checkpoints(&e, 2).await;
    crash(&w, e).await;
    let e = open(&w).await;
    check(&e).await;
}

/// Scans with limits read as the ordered map of the same changes, whichever layer holds them:
/// the batch not yet flushed, the interval since the last checkpoint, or runs in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_with_limits_match_a_model_in_every_layer() {
    use std::collections::BTreeMap;
    let w = world();
    let mut e = open(&w).await;
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = 0x2545f4914f6cdd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let key = |k: u64| format!("d{:02}/{:04}", k % 7, k).into_bytes();
    for round in 0..6 {
        for _ in 0..400 {
            let k = next(3000);
            match next(10) {
                0..=6 => {
                    let v = format!("v{round}-{k}").into_bytes();
                    model.insert(key(k), v.clone());
                    e.kv_commit(vec![KvChange::Put(key(k), v)]).unwrap();
                }
                7 | 8 => {
                    model.remove(&key(k));
                    e.kv_commit(vec![KvChange::Delete(key(k))]).unwrap();
                }
                _ => {
                    let (s, t) = (key(k), key(k + 7 * next(30)));
                    model.retain(|m, _| !(s <= *m && *m < t));
                    e.kv_commit(vec![KvChange::DeleteRange(s, t)]).unwrap();
                }
            }
        }
        for _ in 0..60 {
            let (a, b) = (key(next(3300)), key(next(3300)));
            let (s, t) = (a.clone().min(b.clone()), a.max(b));
            let limit = 1 + next(40) as usize;
            let want: Vec<(Vec<u8>, Vec<u8>)> = model
                .range(s.clone()..t.clone())
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(
                e.kv_range(&s, Some(&t), limit).await.unwrap(),
                want,
                "round {round}: {}..{} limit {limit}",
                String::from_utf8_lossy(&s),
                String::from_utf8_lossy(&t)
            );
        }
        // Alternately: flushed only, through checkpoints into runs, and reopened.
        match round % 3 {
            0 => e.flush().await.unwrap(),
            1 => flush_until_checkpoints(&e, e.stats().checkpoints_written + 2).await,
            _ => {
                e.flush().await.unwrap();
                crash(&w, e).await;
                e = open(&w).await;
            }
        }
    }
}

/// Commits that outrun checkpoints wait for them: the log since the newest checkpoint (what an
/// open replays, and what is held in memory) stays within twice the checkpoint interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_wait_for_a_checkpoint_that_falls_behind() {
    let w = world();
    let mut opts = bucketfs_engine::EngineOptions::for_tests("pw");
    opts.tuning.log_objects_per_checkpoint_min = 4;
    opts.tuning.log_objects_per_checkpoint_max = 4;
    let (bucket, opts) = w.writer(opts);
    let e = bucketfs_engine::Engine::open(bucket, opts).await.unwrap();
    // A large map, so that every merge of the runs takes a while.
    for chunk in 0..40u64 {
        let changes = (0..5000u64)
            .map(|i| {
                let k = chunk * 5000 + i;
                KvChange::Put(
                    format!("big/{k:08}").into_bytes(),
                    vec![(k % 251) as u8; 40],
                )
            })
            .collect();
        e.kv_commit(changes).unwrap();
        e.flush().await.unwrap();
    }
    let mut worst = 0;
    for i in 0..300u64 {
        e.kv_commit(vec![KvChange::Put(
            format!("small/{i}").into_bytes(),
            b"x".to_vec(),
        )])
        .unwrap();
        e.flush().await.unwrap();
        worst = worst.max(e.stats().log_objects_since_checkpoint);
    }
    let s = e.stats();
    assert!(
        worst <= 2 * 4 + 1,
        "{worst} log objects since the checkpoint; held {} times; {s:?}",
        s.barriers_held_for_checkpoint
    );
    e.close().await.unwrap();
}
