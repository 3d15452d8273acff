//! The journal tier (bucket/tier.rs, docs/0009-journal-tier.md): a flush returns once its log
//! object is in a local journal (or in two of three object-store targets), even while the bucket
//! refuses every PUT; a crash loses nothing so acknowledged; and a writer that cannot read the
//! journal the bucket names (enough of its targets) refuses to start unless told to accept the
//! loss.

use bucketfs_engine::bucket::{
    open_url, Bucket, Fault, FaultyBucket, JournalTier, JournaledBucket, SharedBucket, TargetSpec,
    JOURNAL_MARKER_KEY,
};
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{crash, pattern, world, World};

/// A fresh journal directory, removed when the test ends (passed or panicked).
fn journal_dir(name: &str) -> crate::common::ScratchDir {
    crate::common::ScratchDir::new(&format!("tier-{name}"))
}

fn tier(dir: Option<&Path>, accept_loss: bool) -> JournalTier {
    JournalTier {
        targets: dir
            .map(|d| vec![TargetSpec::Dir(d.to_path_buf())])
            .unwrap_or_default(),
        write_quorum: 1,
        accept_loss,
        bucket_url: "memory://tier-test".into(),
        ring_bytes: None,
        stop_wait: None,
    }
}

/// A writer over the world's bucket through a journal tier.
async fn open_tier(w: &World, tier: JournalTier) -> Result<Engine, EngineError> {
    let (bucket, opts) = w.writer(EngineOptions::for_tests("pw"));
    let bucket: SharedBucket = Arc::new(JournaledBucket::new(bucket, tier));
    Engine::open(bucket, opts).await
}

async fn log_count(w: &World) -> usize {
    w.bucket.list("log/").await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_is_durable_in_the_journal_while_the_bucket_refuses_puts() {
    let w = world();
    let dir = journal_dir("durable");
    let e = open_tier(&w, tier(Some(&dir), false)).await.unwrap();
    assert!(
        w.bucket.get(JOURNAL_MARKER_KEY).await.is_ok(),
        "the bucket names its journal before anything is journaled"
    );
    let at_open = log_count(&w).await;
    e.write(1, 0, 8192, Fill::Data(&pattern(1, 8192)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    // The tier uploads that flush's object behind it: once it is in the bucket, nothing is on
    // its way there when the bucket starts refusing.
    for _ in 0..500 {
        if log_count(&w).await > at_open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    w.faults.set(Fault::FailPuts);
    let before = log_count(&w).await;
    e.write(1, 8192, 8192, Fill::Data(&pattern(2, 8192)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), e.flush())
        .await
        .expect("a flush returns once journaled, whatever the bucket does")
        .unwrap();
    assert_eq!(
        log_count(&w).await,
        before,
        "the bucket refused the object: only the journal holds it"
    );
    crash(&w, e).await;
    w.faults.set(Fault::None);

    // Without the journal, or with another one, the writer refuses and says why.
    for (what, t) in [
        ("no journal", tier(None, false)),
        ("another journal", tier(Some(&journal_dir("other")), false)),
    ] {
        let err = open_tier(&w, t).await.err().unwrap_or_else(|| {
            panic!("opened with {what} although the journal holds acknowledged writes")
        });
        assert!(
            err.to_string().contains("--accept-journal-loss"),
            "{what}: {err}"
        );
    }

    // With it, its objects reach the bucket first, and the flushed data is there.
    let e = open_tier(&w, tier(Some(&dir), false)).await.unwrap();
    assert!(
        log_count(&w).await > before,
        "the journal's object was uploaded at open"
    );
    let mut expect = pattern(1, 8192);
    expect.extend(pattern(2, 8192));
    assert!(e.read(1, 0, 16384).await.unwrap() == expect);

    // A clean stop empties the journal and drops the marker: the bucket alone is complete.
    e.close().await.unwrap();
    drop(e);
    assert!(matches!(
        w.bucket.get(JOURNAL_MARKER_KEY).await,
        Err(bucketfs_engine::bucket::StoreError::NotFound(_))
    ));
    let (bucket, opts) = w.writer(EngineOptions::for_tests("pw"));
    let e = Engine::open(bucket, opts).await.unwrap();
    assert!(e.read(1, 0, 16384).await.unwrap() == expect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_journal_is_refused_unless_the_loss_is_accepted() {
    let w = world();
    let dir = journal_dir("lost");
    let e = open_tier(&w, tier(Some(&dir), false)).await.unwrap();
    e.write(1, 0, 4096, Fill::Data(&pattern(1, 4096)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    // Wait until the bucket has it: what follows is then the only thing at risk.
    for _ in 0..100 {
        if log_count(&w).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.faults.set(Fault::FailPuts);
    e.write(1, 0, 4096, Fill::Data(&pattern(9, 4096)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;
    w.faults.set(Fault::None);
    std::fs::remove_dir_all(&dir).unwrap();

    let err = open_tier(&w, tier(Some(&dir), false))
        .await
        .err()
        .expect("a writer whose journal is gone must not serve the older state silently");
    let msg = err.to_string();
    assert!(
        msg.contains("--accept-journal-loss") && msg.contains("journal"),
        "{msg}"
    );

    // Accepted: the bucket's own state, whole (the write only the journal held is lost).
    let e = open_tier(&w, tier(Some(&dir), true)).await.unwrap();
    assert!(e.read(1, 0, 4096).await.unwrap() == pattern(1, 4096));
    e.close().await.unwrap();
    drop(e);
    // And the next start needs no flag.
    let e = open_tier(&w, tier(Some(&dir), false)).await.unwrap();
    assert!(e.read(1, 0, 4096).await.unwrap() == pattern(1, 4096));
    e.close().await.unwrap();
}

/// Three object-store journal targets, two of which must hold a write.
fn quorum_targets() -> Vec<Arc<FaultyBucket>> {
    (0..3)
        .map(|_| {
            Arc::new(FaultyBucket::new(
                open_url("memory://", &Vec::new()).unwrap(),
            ))
        })
        .collect()
}

fn quorum_tier(targets: &[Arc<FaultyBucket>]) -> JournalTier {
    JournalTier {
        targets: targets
            .iter()
            .enumerate()
            .map(|(i, b)| TargetSpec::Store {
                url: format!("memory://target-{i}"),
                bucket: b.clone(),
            })
            .collect(),
        write_quorum: 2,
        accept_loss: false,
        bucket_url: "memory://tier-test".into(),
        ring_bytes: None,
        stop_wait: None,
    }
}

/// A flush the bucket refused, acknowledged by the quorum: returns within 5 s.
async fn flush_into_journal_only(w: &World, e: &Engine, offset: u64, seed: u8) {
    w.faults.set(Fault::FailPuts);
    e.write(1, offset, 8192, Fill::Data(&pattern(seed, 8192)))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), e.flush())
        .await
        .expect("a flush returns once two of the three targets hold it")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_journal_answers_with_two_of_three_targets_and_opens_from_two() {
    let w = world();
    let targets = quorum_targets();
    // The third target is unreachable from the start.
    targets[2].set(Fault::FailAll);
    let e = open_tier(&w, quorum_tier(&targets)).await.unwrap();
    e.write(1, 0, 8192, Fill::Data(&pattern(1, 8192)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    // The journal acknowledged that flush; its upload to the bucket may still be under way.
    let mut before = 0;
    for _ in 0..500 {
        before = log_count(&w).await;
        if before > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(before > 0, "the first flush reached the bucket within 10 s");
    flush_into_journal_only(&w, &e, 8192, 2).await;
    assert_eq!(log_count(&w).await, before, "only the journal holds it");
    crash(&w, e).await;
    w.faults.set(Fault::None);

    // One target of the two that hold it is not enough to start from.
    targets[1].set(Fault::FailAll);
    let err = open_tier(&w, quorum_tier(&targets))
        .await
        .err()
        .expect("a start that cannot read two targets must refuse");
    let msg = err.to_string();
    assert!(
        msg.contains("--accept-journal-loss") && msg.contains("memory://target-1: unreachable"),
        "{msg}"
    );

    // Two: the acknowledged write is uploaded first and read back.
    targets[1].set(Fault::None);
    let e = open_tier(&w, quorum_tier(&targets)).await.unwrap();
    let mut expect = pattern(1, 8192);
    expect.extend(pattern(2, 8192));
    assert!(e.read(1, 0, 16384).await.unwrap() == expect);

    // The third target comes back and joins; the first then hangs: the quorum goes on
    // without it.
    targets[2].set(Fault::None);
    targets[0].set(Fault::Hang);
    flush_into_journal_only(&w, &e, 16384, 3).await;
    crash(&w, e).await;
    w.faults.set(Fault::None);
    targets[0].set(Fault::FailAll);
    let e = open_tier(&w, quorum_tier(&targets)).await.unwrap();
    expect.extend(pattern(3, 8192));
    assert!(
        e.read(1, 0, 24576).await.unwrap() == expect,
        "the write the second and third targets held is there"
    );
    targets[0].set(Fault::None);
    e.close().await.unwrap();
    drop(e);
    assert!(matches!(
        w.bucket.get(JOURNAL_MARKER_KEY).await,
        Err(bucketfs_engine::bucket::StoreError::NotFound(_))
    ));
}

/// A writer with journaled barriers (engine/journaled.rs) over the world's bucket through a
/// local journal in `dir`.
async fn open_journaled(w: &World, dir: &Path, coalesce_ms: u64) -> Engine {
    let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
    opts.journaled_barriers = true;
    opts.tuning.journal_coalesce_ms = coalesce_ms;
    let t = JournalTier {
        ring_bytes: Some(16 << 20),
        stop_wait: None,
        ..tier(Some(dir), false)
    };
    let bucket: SharedBucket = Arc::new(JournaledBucket::new(bucket, t));
    Engine::open(bucket, opts).await.unwrap()
}

async fn write_and_flush(e: &Engine, extents: std::ops::Range<u64>) {
    for i in extents {
        e.write(7, i * 8192, 8192, Fill::Data(&pattern(i as u8, 8192)))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
}

async fn check_extents(e: &Engine, extents: std::ops::Range<u64>) {
    for i in extents {
        assert!(
            e.read(7, i * 8192, 8192).await.unwrap() == pattern(i as u8, 8192),
            "extent {i} holds what its acknowledged barrier covered"
        );
    }
}

/// Whether a reader of the bucket alone (no journal) sees `extents` within `limit`.
async fn bucket_holds_within(w: &World, extents: std::ops::Range<u64>, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let mut opts = EngineOptions::for_tests("pw");
        opts.read_only = true;
        if let Ok(reader) = Engine::open(w.bucket.clone(), opts).await {
            let mut all = true;
            for i in extents.clone() {
                let got = reader.read(7, i * 8192, 8192).await;
                all &= got.is_ok_and(|d| d == pattern(i as u8, 8192));
            }
            if all {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_barriers_are_records_in_the_journal_replayed_after_a_crash() {
    let w = world();
    let dir = journal_dir("records");
    // Never sealed for the bucket by age: every barrier's batch stays a record.
    let e = open_journaled(&w, &dir, 3_600_000).await;
    let logs = log_count(&w).await;
    write_and_flush(&e, 0..60).await;
    assert_eq!(e.stats().journal_records, 60, "one record per barrier");
    assert_eq!(
        log_count(&w).await,
        logs,
        "no barrier sealed a log object for the bucket"
    );
    assert!(
        w.bucket.list("jrec/").await.unwrap().is_empty(),
        "records stay in the journal"
    );
    crash(&w, e).await;

    let e = open_journaled(&w, &dir, 3_600_000).await;
    check_extents(&e, 0..60).await;
    // The replayed batches reach the bucket through the tier's background upload, and a
    // checkpoint may collect their log objects after: a reader of the bucket alone is the check.
    assert!(
        bucket_holds_within(&w, 0..60, Duration::from_secs(10)).await,
        "the records' batches went to the bucket at open"
    );
    assert!(
        w.bucket.list("jrec/").await.unwrap().is_empty(),
        "the replayed records are deleted"
    );
    // Barriers of the new life, then a crash again: the records after the replayed ones.
    write_and_flush(&e, 60..70).await;
    crash(&w, e).await;
    let e = open_journaled(&w, &dir, 3_600_000).await;
    check_extents(&e, 0..70).await;
    e.close().await.unwrap();
    drop(e);
    assert!(
        w.bucket.list("jrec/").await.unwrap().is_empty(),
        "a clean stop leaves no record behind"
    );

    // A clean stop left everything in the bucket: a writer without a journal sees it all.
    let (bucket, opts) = w.writer(EngineOptions::for_tests("pw"));
    let e = Engine::open(bucket, opts).await.unwrap();
    check_extents(&e, 0..70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaled_barriers_reach_the_bucket_together() {
    let w = world();
    let dir = journal_dir("coalesce");
    let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
    opts.journaled_barriers = true;
    opts.tuning.journal_coalesce_ms = 20;
    let t = JournalTier {
        ring_bytes: Some(16 << 20),
        stop_wait: None,
        ..tier(Some(&dir), false)
    };
    let journaled = Arc::new(JournaledBucket::new(bucket, t));
    let e = Engine::open(journaled.clone(), opts).await.unwrap();
    let before = e.stats().log_objects_written;
    write_and_flush(&e, 0..200).await;
    // The last records age and go; then the bucket takes what the journal holds.
    let mut drained = false;
    for _ in 0..500 {
        let records = journaled.list("jrec/").await.unwrap();
        if records.is_empty() && journaled.backlog().objects == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        drained,
        "the records went to the bucket within 10 s: {} left, backlog {:?}, {:?}",
        journaled.list("jrec/").await.unwrap().len(),
        journaled.backlog(),
        e.stats()
    );
    let stats = e.stats();
    let objects = stats.log_objects_written - before;
    // A coalescing flush that starts between a write and its barrier takes that write for the
    // bucket; the barrier then waits for the upload instead of writing a record. That race is
    // rare, so nearly every barrier still has its own record.
    assert!(
        (180..=200).contains(&stats.journal_records),
        "200 barriers wrote {} journal records",
        stats.journal_records
    );
    assert!(
        (1..50).contains(&objects),
        "200 barriers went to the bucket as {objects} log objects"
    );
    crash(&w, e).await;
    // Nothing in the journal is needed now: the bucket alone holds every barrier.
    let (bucket, opts) = w.writer(EngineOptions::for_tests("pw"));
    let e = Engine::open(
        Arc::new(JournaledBucket::new(bucket, tier(None, true))),
        opts,
    )
    .await
    .unwrap();
    check_extents(&e, 0..200).await;
}

/// An object-store target deletes the records the bucket no longer needs in batches: one
/// request for what a merged batch covered, not one per record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_target_deletes_released_records_in_batches() {
    let w = world();
    let targets = quorum_targets();
    let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
    opts.journaled_barriers = true;
    opts.tuning.journal_coalesce_ms = 20;
    let journaled = Arc::new(JournaledBucket::new(bucket, quorum_tier(&targets)));
    let e = Engine::open(journaled.clone(), opts).await.unwrap();
    let before: Vec<u64> = targets.iter().map(|t| t.deletes()).collect();
    write_and_flush(&e, 0..200).await;
    let mut left = usize::MAX;
    for _ in 0..500 {
        left = 0;
        for t in &targets {
            left += t.list("journal/records/").await.unwrap().len();
        }
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "the targets dropped every record within 10 s");
    // As above, a barrier that races a coalescing flush may wait for the bucket instead.
    let records = e.stats().journal_records;
    assert!((180..=200).contains(&records), "{records} records");
    for (i, (t, before)) in targets.iter().zip(before).enumerate() {
        let requests = t.deletes() - before;
        assert!(
            (1..100).contains(&requests),
            "target {i} dropped 200 records with {requests} delete requests"
        );
    }
    check_extents(&e, 0..200).await;
    e.close().await.unwrap();
}

/// A clean stop while the bucket refuses every PUT does not wait without end: it fails within
/// `JournalTier::stop_wait`, saying so, with the journal left in place, and the next start
/// uploads what the journal holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_while_the_bucket_refuses_ends_with_the_journal_in_place() {
    let w = world();
    let dir = journal_dir("stop");
    let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
    opts.journaled_barriers = true;
    let t = JournalTier {
        stop_wait: Some(Duration::from_secs(1)),
        ..tier(Some(&dir), false)
    };
    let e = Engine::open(Arc::new(JournaledBucket::new(bucket, t)), opts)
        .await
        .unwrap();
    write_and_flush(&e, 0..5).await;
    w.faults.set(Fault::FailPuts);
    write_and_flush(&e, 5..10).await;
    let closed = tokio::time::timeout(Duration::from_secs(30), e.close())
        .await
        .expect("the stop ends while the bucket refuses");
    let err = closed.expect_err("the bucket lacks what the journal holds");
    assert!(
        err.to_string().contains("the next start uploads them"),
        "{err}"
    );
    crash(&w, e).await;
    w.faults.set(Fault::None);
    let e = open_journaled(&w, &dir, 200).await;
    check_extents(&e, 0..10).await;
    e.close().await.unwrap();
}
