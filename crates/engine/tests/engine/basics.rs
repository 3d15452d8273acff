//! Engine tests over `memory://`: round trips, crash-reopen at chosen points, faults, corruption.

use bucketfs_engine::bucket::{CountingBucket, Fault, PutMode};
use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill, KeyError, KvChange, Tuning};
use proptest::prelude::*;

use crate::common::{
    crash, flush_past_a_checkpoint, flush_until_checkpoints, log_keys, noise, open, pattern,
    wait_until_deleted, world, World,
};
use std::sync::Arc;

/// Barriers every 20 ms, each after a one-page write of inode 2: the cadence at which a
/// client's barrier seals with lz4.
async fn steady_barriers(e: &Engine) {
    for i in 0..16u64 {
        e.write(2, i * 4096, 4096, Fill::Data(&pattern(i as u8, 4096)))
            .await
            .unwrap();
        e.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_read_back_at_odd_offsets_and_holes_read_zero() {
    let w = world();
    let e = open(&w).await;
    let data = pattern(3, 77_777);
    e.write(1, 12_345, data.len() as u64, Fill::Data(&data))
        .await
        .unwrap();
    assert_eq!(e.read(1, 12_345, data.len()).await.unwrap(), data);
    assert_eq!(e.read(1, 0, 12_345).await.unwrap(), vec![0; 12_345]);
    assert_eq!(e.read(2, 0, 100).await.unwrap(), vec![0; 100]);
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e2 = open(&w).await;
    assert_eq!(e2.read(1, 12_345, data.len()).await.unwrap(), data);
    assert_eq!(e2.read(1, 12_340, 10).await.unwrap()[..5], [0; 5]);
}

/// `read_pieces` answers `read`'s bytes: from memory and from the bucket, across holes longer
/// than an extent and within extents, at offsets that cut extents anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_are_the_bytes_a_read_answers() {
    let w = world();
    let e = open(&w).await;
    let x = EXTENT_SIZE_BYTES as u64;
    let a = pattern(4, 2 * EXTENT_SIZE_BYTES + 300);
    e.write(1, 3 * x + 50, a.len() as u64, Fill::Data(&a))
        .await
        .unwrap();
    e.write(1, 9 * x + 7, 5, Fill::Data(b"fives"))
        .await
        .unwrap();
    let ranges = [
        (0, 12 * x),
        (3 * x + 49, 3),
        (100, 5 * x),
        (6 * x - 1, 4 * x),
        (20 * x, 10),
    ];
    async fn same(e: &Engine, ranges: &[(u64, u64)]) {
        for &(at, len) in ranges {
            let pieces = e.read_pieces(1, at, len as usize).await.unwrap();
            assert!(
                pieces.iter().all(|p| !p.is_empty()),
                "{at}+{len}: an empty piece"
            );
            assert_eq!(
                pieces.concat(),
                e.read(1, at, len as usize).await.unwrap(),
                "{at}+{len}"
            );
        }
    }
    same(&e, &ranges).await;
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e2 = open(&w).await;
    same(&e2, &ranges).await;
    assert!(e2.read_pieces(1, 5, 0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_without_flush_loses_only_unflushed_writes_whole() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(1, 3 * EXTENT_SIZE_BYTES + 100);
    e.write(5, 1000, a.len() as u64, Fill::Data(&a))
        .await
        .unwrap();
    e.flush().await.unwrap();
    let b = pattern(2, 5000);
    e.write(5, 2000, b.len() as u64, Fill::Data(&b))
        .await
        .unwrap();
    crash(&w, e).await; // the crash: nothing more reaches the bucket
    let e = open(&w).await;
    assert_eq!(
        e.read(5, 1000, a.len()).await.unwrap(),
        a,
        "flushed data survives, unflushed write is absent"
    );
}

/// While barriers come every few milliseconds (an fsync per transaction), writes are on their
/// way to the bucket before the barrier that asks for them; otherwise they wait for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_start_for_the_bucket_early_only_while_barriers_are_frequent() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(4, 5000);
    e.write(1, 0, a.len() as u64, Fill::Data(&a)).await.unwrap();
    e.flush().await.unwrap();
    e.write(1, 100_000, a.len() as u64, Fill::Data(&a))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stats = e.stats();
    assert_eq!(
        stats.write_behind_flushes, 0,
        "one barrier is not a cadence"
    );
    assert!(stats.pending_bytes > 0, "the write waits for a barrier");

    // Each attempt: a write and a barrier after it, many times over, then one more write and
    // no barrier. Attempts are repeated because a scheduling stall of milliseconds (a busy
    // machine) between the last barrier and the write rightly leaves the write waiting.
    let b = pattern(9, 12_345);
    let mut uploaded_early = false;
    for attempt in 0..5u64 {
        for i in 0..200u64 {
            let d = pattern(i as u8, 4096);
            e.write(2, i * 4096, 4096, Fill::Data(&d)).await.unwrap();
            e.flush().await.unwrap();
        }
        let written = e.stats().log_objects_written;
        e.write(3, 777 + attempt, b.len() as u64, Fill::Data(&b))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(1) {
            if e.stats().log_objects_written > written && e.stats().pending_bytes == 0 {
                uploaded_early = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        if uploaded_early {
            let b_at = 777 + attempt;
            crash(&w, e).await; // a crash before any barrier asked for the write
            let e = open(&w).await;
            assert_eq!(
                e.read(3, b_at, b.len()).await.unwrap(),
                b,
                "the write-behind object is durable and replayed"
            );
            assert_eq!(e.read(1, 0, a.len()).await.unwrap(), a);
            assert_eq!(
                e.read(1, 100_000, a.len()).await.unwrap(),
                a,
                "the earlier write went with the next barrier"
            );
            return;
        }
    }
    panic!("no write was uploaded without a barrier while barriers were frequent");
}

/// While barriers come every few hundred milliseconds (PostgreSQL's WAL writer under
/// `synchronous_commit = off`), writes go to the bucket early once enough of them have gathered
/// for an object, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_gather_for_the_bucket_early_while_barriers_come_every_few_hundred_ms() {
    let t = Tuning::default();
    let w = world();
    let e = open(&w).await;
    let gap = std::time::Duration::from_micros(5 * t.write_behind_barrier_gap_us);
    let small = pattern(3, 4 * EXTENT_SIZE_BYTES);
    let large = pattern(7, t.write_behind_gathered_bytes as usize);
    // Attempts are repeated because a stall of a few hundred milliseconds (a busy machine)
    // between the last barrier and the writes rightly leaves them waiting for a barrier.
    for attempt in 0..5u64 {
        for i in 0..24u64 {
            let d = pattern(i as u8, 4096);
            e.write(2, i * 4096, 4096, Fill::Data(&d)).await.unwrap();
            e.flush().await.unwrap();
            tokio::time::sleep(gap).await;
        }
        let written = e.stats().log_objects_written;
        let base = (attempt + 1) << 30;
        e.write(3, base, small.len() as u64, Fill::Data(&small))
            .await
            .unwrap();
        tokio::time::sleep(gap).await;
        let stats = e.stats();
        assert_eq!(
            stats.log_objects_written, written,
            "a few extents wait for the barrier"
        );
        assert!(stats.pending_bytes >= small.len() as u64);
        let at = base + small.len() as u64;
        e.write(3, at, large.len() as u64, Fill::Data(&large))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(200) {
            let stats = e.stats();
            if stats.log_objects_written > written && stats.pending_bytes == 0 {
                crash(&w, e).await; // a crash before any barrier asked for the writes
                let e = open(&w).await;
                assert_eq!(e.read(3, base, small.len()).await.unwrap(), small);
                assert_eq!(
                    e.read(3, at, large.len()).await.unwrap(),
                    large,
                    "the gathered write-behind object is durable and replayed"
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        e.flush().await.unwrap();
    }
    panic!("gathered writes were not uploaded without a barrier");
}

/// With zstd configured, what a client waits on while its barriers come often is sealed with
/// lz4; a barrier after rare ones, and the engine's own flushes, use zstd. Both read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_seals_what_a_client_waits_on_at_a_steady_cadence_and_zstd_the_rest() {
    let w = world();
    let e = open(&w).await;
    // More extents than a small fsync-driven batch (lz4 at any cadence), fewer than start a
    // gathered write-behind.
    let batch = |seed| pattern(seed, 24 * EXTENT_SIZE_BYTES);
    let len = batch(0).len() as u64;
    let counts = |e: &Engine| (e.stats().flushes, e.stats().flushes_lz4);

    // A fresh engine counts barriers as rare.
    e.write(1, 0, len, Fill::Data(&batch(1))).await.unwrap();
    e.flush().await.unwrap();
    assert_eq!(counts(&e), (1, 0), "a rare barrier seals with zstd");

    // Barriers every 20 ms, each after a one-page write (a small batch: lz4 anyway).
    steady_barriers(&e).await;
    let (flushes, lz4) = counts(&e);
    e.write(1, 1 << 20, len, Fill::Data(&batch(2)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    assert_eq!(
        counts(&e),
        (flushes + 1, lz4 + 1),
        "a client's barrier at a steady cadence seals with lz4"
    );

    // The engine's own flush (closing) at the same cadence.
    e.write(1, 2 << 20, len, Fill::Data(&batch(3)))
        .await
        .unwrap();
    e.close().await.unwrap();
    assert_eq!(
        counts(&e),
        (flushes + 2, lz4 + 1),
        "the engine's own flush seals with zstd"
    );

    let e = open(&w).await;
    for (seed, at) in [(1, 0), (2, 1 << 20), (3, 2 << 20)] {
        assert_eq!(e.read(1, at, len as usize).await.unwrap(), batch(seed));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn punch_and_zero_and_allocation_map() {
    let w = world();
    let e = open(&w).await;
    let n = 4 * EXTENT_SIZE_BYTES;
    let d = pattern(9, n);
    e.write(1, 0, n as u64, Fill::Data(&d)).await.unwrap();
    e.flush().await.unwrap();
    assert_eq!(
        e.allocation(1, 0, n as u64).await.unwrap(),
        vec![(n as u64, true)]
    );
    // Punch from the middle of extent 0 to the middle of extent 2: extent 1 becomes a hole.
    let (off, len) = (EXTENT_SIZE_BYTES as u64 / 2, 2 * EXTENT_SIZE_BYTES as u64);
    e.write(1, off, len, Fill::Zeroes { punch: true })
        .await
        .unwrap();
    let mut expect = d.clone();
    expect[off as usize..(off + len) as usize].fill(0);
    assert_eq!(e.read(1, 0, n).await.unwrap(), expect);
    let x = EXTENT_SIZE_BYTES as u64;
    assert_eq!(
        e.allocation(1, 0, n as u64).await.unwrap(),
        vec![(x, true), (x, false), (2 * x, true)]
    );
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, n).await.unwrap(), expect);
    assert_eq!(
        e.allocation(1, 0, n as u64).await.unwrap(),
        vec![(x, true), (x, false), (2 * x, true)]
    );
    // Zeroes without punching stay allocated.
    e.write(1, 0, x, Fill::Zeroes { punch: false })
        .await
        .unwrap();
    assert_eq!(e.allocation(1, 0, x).await.unwrap(), vec![(x, true)]);
    // A never-written range: nothing to do, no error.
    e.write(7, 0, 1 << 30, Fill::Zeroes { punch: true })
        .await
        .unwrap();
    assert_eq!(
        e.allocation(7, 0, 1 << 30).await.unwrap(),
        vec![(1 << 30, false)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_refused_and_writes_nothing() {
    let w = world();
    open(&w).await.close().await.unwrap();
    let before = w.bucket.list("").await.unwrap();
    let err = Engine::open(w.bucket.clone(), EngineOptions::for_tests("not-pw"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, EngineError::Key(KeyError::WrongPassword)),
        "{err}"
    );
    assert!(err.to_string().contains("password"));
    assert_eq!(w.bucket.list("").await.unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_elsewhere_is_refused() {
    let w = world();
    let holder = br#"{"host":"some-other-host","boot_id":"x","pid":1,"started_unix_s":5}"#;
    open(&w).await; // creates the superblock
    w.bucket
        .put(
            "writer.lock",
            bytes::Bytes::from_static(holder),
            PutMode::Overwrite,
        )
        .await
        .unwrap();
    let err = Engine::open(w.bucket.clone(), EngineOptions::for_tests("pw"))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("in use"), "{err}");
    assert!(err.to_string().contains("some-other-host"), "{err}");
}

/// Within one process too: an engine that is open holds the bucket; one that crashed does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_in_this_process_is_refused_until_the_first_is_gone() {
    let w = world();
    let first = open(&w).await;
    let err = Engine::open(w.bucket.clone(), EngineOptions::for_tests("pw"))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::Lease(_)), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    crash(&w, first).await;
    let second = open(&w).await;
    second.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_faults_are_retried_and_exhausted_retries_lose_nothing_acknowledged() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(4, 10_000);
    e.write(1, 0, a.len() as u64, Fill::Data(&a)).await.unwrap();
    w.faults.set(Fault::FailNext { count: 2 });
    e.flush().await.unwrap();
    // The store is down: the flush fails with an error, reads of cached data keep working.
    w.faults.set(Fault::FailAll);
    let b = pattern(5, 10_000);
    e.write(1, 50_000, b.len() as u64, Fill::Data(&b))
        .await
        .unwrap();
    let err = e.flush().await.err().unwrap();
    assert!(matches!(err, EngineError::Store(_)), "{err}");
    assert_eq!(e.read(1, 50_000, b.len()).await.unwrap(), b);
    assert_eq!(e.read(1, 0, a.len()).await.unwrap(), a);
    // The store is back: the stuck upload goes first, then everything is durable.
    w.faults.set(Fault::None);
    let c = pattern(6, 100);
    e.write(1, 90_000, 100, Fill::Data(&c)).await.unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, a.len()).await.unwrap(), a);
    assert_eq!(e.read(1, 50_000, b.len()).await.unwrap(), b);
    assert_eq!(e.read(1, 90_000, 100).await.unwrap(), c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_retrying_against_a_failing_store_does_not_stall_other_requests() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(8, 10_000);
    e.write(1, 0, a.len() as u64, Fill::Data(&a)).await.unwrap();
    e.flush().await.unwrap();
    e.write(1, 100_000, a.len() as u64, Fill::Data(&a))
        .await
        .unwrap();
    w.faults.set(Fault::FailAll);
    let flusher = {
        let e = e.clone();
        tokio::spawn(async move { e.flush().await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let started = std::time::Instant::now();
    assert_eq!(e.read(1, 0, a.len()).await.unwrap(), a);
    e.write(2, 0, 4096, Fill::Data(&[1; 4096])).await.unwrap();
    assert_eq!(e.read(2, 0, 4096).await.unwrap(), vec![1; 4096]);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(300),
        "requests waited {:?} behind retries",
        started.elapsed()
    );
    assert!(
        !flusher.is_finished(),
        "the flush is still retrying with backoff"
    );
    let err = flusher.await.unwrap().err().unwrap();
    assert!(err.to_string().contains("gave up after"), "{err}");
    w.faults.set(Fault::None);
    e.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_log_object_reads_as_an_error_never_as_wrong_data() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(7, 2 * EXTENT_SIZE_BYTES);
    e.write(1, 0, a.len() as u64, Fill::Data(&a)).await.unwrap();
    e.flush().await.unwrap();
    e.close().await.unwrap();
    let logs = w.bucket.list("log/").await.unwrap();
    let key = &logs.last().unwrap().key;
    let mut obj = w.bucket.get(key).await.unwrap().to_vec();
    obj[100] ^= 0x40;
    w.bucket
        .put(key, obj.into(), PutMode::Overwrite)
        .await
        .unwrap();
    let e = open(&w).await;
    let err = e.read(1, 0, 4096).await.err().unwrap();
    assert!(matches!(err, EngineError::Corrupt(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_value_changes_are_atomic_and_survive_reopen() {
    let w = world();
    let e = open(&w).await;
    e.kv_commit(vec![
        KvChange::Put(b"d/1/a".to_vec(), b"x".to_vec()),
        KvChange::Put(b"d/1/b".to_vec(), b"y".to_vec()),
    ])
    .unwrap();
    e.flush().await.unwrap();
    e.kv_commit(vec![
        KvChange::Delete(b"d/1/a".to_vec()),
        KvChange::Put(b"d/1/c".to_vec(), b"z".to_vec()),
    ])
    .unwrap();
    let scan = e.kv_scan(b"d/1/").await.unwrap();
    assert_eq!(
        scan,
        vec![
            (b"d/1/b".to_vec(), b"y".to_vec()),
            (b"d/1/c".to_vec(), b"z".to_vec())
        ]
    );
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(
        e.kv_scan(b"d/1/").await.unwrap().len(),
        2,
        "the unflushed change vanished whole"
    );
    assert_eq!(e.kv_get(b"d/1/a").await.unwrap(), Some(b"x".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_bound_replay_and_dead_log_objects_are_deleted() {
    let w = world();
    let e = open(&w).await;
    let n = flush_past_a_checkpoint(&e, 3).await;
    let stats = e.stats();
    assert_eq!(stats.checkpoints_written, 1);
    assert!(stats.log_objects_deleted > n / 2, "{stats:?}");
    assert_eq!(w.bucket.list("manifest/").await.unwrap().len(), 1);
    assert_eq!(w.bucket.list("run/").await.unwrap().len(), 1);
    assert!(w.bucket.list("checkpoint/").await.unwrap().is_empty());
    let expect = e.read(1, 0, 3 * 4096).await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, 3 * 4096).await.unwrap(), expect);
}

const QUIET: std::time::Duration = std::time::Duration::from_millis(400);

/// An engine whose quiet checkpoints come after QUIET, over a bucket that counts requests.
async fn open_quiet(w: &World) -> (Engine, Arc<CountingBucket>) {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.quiet_checkpoint_after_ms = QUIET.as_millis() as u64;
    let (bucket, opts) = w.writer(opts);
    let counting = Arc::new(CountingBucket::new(bucket));
    let e = Engine::open(counting.clone(), opts).await.unwrap();
    (e, counting)
}

/// Waits until `n` checkpoints are written and have ended their collection (and a few quiet
/// periods more), then checks that several quiet periods pass without a request.
async fn settle_at_checkpoints(e: &Engine, counting: &CountingBucket, n: u64) {
    let started = std::time::Instant::now();
    let settled = |s: &bucketfs_engine::EngineStats| {
        s.checkpoints_written >= n && s.checkpoints_collected == s.checkpoints_written
    };
    while !settled(&e.stats()) && started.elapsed() < QUIET * 20 {
        tokio::time::sleep(QUIET / 4).await;
    }
    tokio::time::sleep(QUIET * 2).await;
    assert_eq!(e.stats().checkpoints_written, n, "{:?}", e.stats());
    assert!(settled(&e.stats()), "{:?}", e.stats());
    let before = counting.counts();
    tokio::time::sleep(QUIET * 4).await;
    assert_eq!(counting.counts(), before, "an idle engine used the bucket");
}

/// A burst too short for a regular checkpoint, then quiet: one checkpoint collects the dead
/// objects and repacks the live extents of the others, a second collects those; then the idle
/// engine makes no request at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_engine_collects_what_a_burst_left_then_stays_idle() {
    let w = world();
    let (e, counting) = open_quiet(&w).await;
    // Every flush overwrites one of three blocks; every other one also writes a block of its
    // own that stays live, so that half of the objects die and half are kept by one extent.
    let flushes = 200u64;
    for i in 0..flushes {
        let block = pattern(i as u8, 4096);
        e.write(1, (i % 3) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        if i % 2 == 0 {
            e.write(1, (100 + i) * 4096, 4096, Fill::Data(&block))
                .await
                .unwrap();
        }
        e.flush().await.unwrap();
    }
    assert_eq!(
        e.stats().checkpoints_written,
        0,
        "the burst is below a regular interval"
    );
    settle_at_checkpoints(&e, &counting, 2).await;
    let stats = e.stats();
    assert!(stats.extents_repacked >= flushes / 2, "{stats:?}");
    assert!(stats.log_objects_deleted >= flushes, "{stats:?}");
    let left = log_keys(&w).await;
    assert!(
        left.len() <= 2,
        "only the repacked extents' objects stay: {left:?}"
    );
    let stored: u64 = w
        .bucket
        .list("log/")
        .await
        .unwrap()
        .iter()
        .map(|o| o.size_bytes)
        .sum();
    assert_eq!(stats.log_bytes_stored, stored, "what status says is stored");
    let expect = e.read(1, 0, 400 * 4096).await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, 400 * 4096).await.unwrap(), expect);
}

/// A burst that ends just after a regular checkpoint: too few objects since for a quiet
/// checkpoint of their own, but the regular one repacked extents, so one more collects the
/// objects it emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_engine_collects_what_the_last_repack_emptied() {
    let w = world();
    let (e, counting) = open_quiet(&w).await;
    // One extent of its own per flush, never overwritten: every object stays live with one
    // extent, and the regular checkpoint (after Tuning::default().log_objects_per_checkpoint_min) repacks them.
    let flushes = Tuning::default().log_objects_per_checkpoint_min + 10;
    for i in 0..flushes {
        let extent = pattern(i as u8, EXTENT_SIZE_BYTES);
        let at = i * EXTENT_SIZE_BYTES as u64;
        e.write(1, at, extent.len() as u64, Fill::Data(&extent))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    settle_at_checkpoints(&e, &counting, 2).await;
    let stats = e.stats();
    assert!(
        stats.extents_repacked >= Tuning::default().log_objects_per_checkpoint_min,
        "{stats:?}"
    );
    assert!(
        stats.log_objects_deleted >= Tuning::default().log_objects_per_checkpoint_min,
        "{stats:?}"
    );
    let left = log_keys(&w).await.len() as u64;
    assert!(
        left < 30,
        "{left} log objects stay after {flushes} flushes: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_objects_kept_alive_by_a_few_extents_are_repacked_then_deleted() {
    let w = world();
    let e = open(&w).await;
    // Flushes that each leave one extent that is never written again...
    let kept = 100u64;
    let extent = EXTENT_SIZE_BYTES as u64;
    for i in 0..kept {
        let data = pattern(i as u8, EXTENT_SIZE_BYTES);
        e.write(2, i * extent, extent, Fill::Data(&data))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    let kept_objects = log_keys(&w).await;
    assert_eq!(kept_objects.len() as u64, kept);
    // ...then enough flushes for two checkpoints: the first repacks those objects' extents into
    // one, the second deletes them.
    flush_past_a_checkpoint(&e, 3).await;
    flush_past_a_checkpoint(&e, 3).await;
    let left = wait_until_deleted(&w, kept_objects).await;
    let stats = e.stats();
    assert!(stats.extents_repacked >= kept, "{stats:?}");
    assert!(left.is_empty(), "{} kept alive: {stats:?}", left.len());
    // A crash now loses none of them.
    crash(&w, e).await;
    let e = open(&w).await;
    for i in 0..kept {
        let got = e.read(2, i * extent, EXTENT_SIZE_BYTES).await.unwrap();
        assert!(got == pattern(i as u8, EXTENT_SIZE_BYTES), "extent {i}");
    }
}

/// Frames sealed with lz4 (what a client waited on) that outlive a checkpoint interval are
/// re-sealed with zstd (`EngineOptions::for_tests` sets `reseal_after_s` to zero, so one interval
/// is old enough), whole objects at a time, so their objects die and are deleted; the
/// objects are known as lz4 across a restart (the checkpoint says so), and frames re-sealed once
/// are not moved again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_frames_that_outlive_a_checkpoint_interval_are_resealed_with_zstd() {
    let w = world();
    let e = open(&w).await;
    // Barriers every 20 ms (one-page writes), so that a client's barrier seals with lz4.
    steady_barriers(&e).await;
    // Three objects of 24 extents each: too many live extents to count as sparse.
    let objects = 3u64;
    let per_object = 24 * EXTENT_SIZE_BYTES;
    let data = |i: u64| pattern(100 + i as u8, per_object);
    let before = log_keys(&w).await;
    let lz4_before = e.stats().flushes_lz4;
    for i in 0..objects {
        let at = i * per_object as u64;
        e.write(3, at, per_object as u64, Fill::Data(&data(i)))
            .await
            .unwrap();
        e.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(e.stats().flushes_lz4, lz4_before + objects);
    let lz4_objects: Vec<String> = log_keys(&w)
        .await
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    assert_eq!(lz4_objects.len() as u64, objects);

    // The first checkpoint covers them; a restart then forgets everything but the bucket.
    flush_past_a_checkpoint(&e, 3).await;
    assert_eq!(
        e.stats().extents_resealed,
        0,
        "not yet a checkpoint interval old"
    );
    crash(&w, e).await;
    let e = open(&w).await;
    let in_lz4 = e.stats().live_bytes_in_lz4_objects;
    assert!(in_lz4 > 0, "the checkpoint names the lz4 objects");

    // The next checkpoint finds them a whole interval old: their extents are re-sealed
    // (fetched from the bucket: the memory tier is empty after the restart)...
    flush_past_a_checkpoint(&e, 3).await;
    let resealed = objects * 24;
    for _ in 0..200 {
        if e.stats().extents_resealed >= resealed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(e.stats().extents_resealed, resealed, "{:?}", e.stats());
    // ...and the one after deletes the objects they left.
    flush_past_a_checkpoint(&e, 3).await;
    let left = wait_until_deleted(&w, lz4_objects).await;
    assert!(left.is_empty(), "{left:?} still stored: {:?}", e.stats());
    // (What stays in lz4 is the last few one-page flushes' frames.)
    let stats = e.stats();
    assert!(
        stats.live_bytes_in_lz4_objects < in_lz4 / 4,
        "{in_lz4} bytes in lz4 objects before: {stats:?}"
    );

    // A crash loses nothing; two more checkpoints (the first covers the re-sealed frames and
    // has finished collecting once the second is written) move none of them again.
    crash(&w, e).await;
    let e = open(&w).await;
    for i in 0..objects {
        let at = i * per_object as u64;
        assert!(
            e.read(3, at, per_object).await.unwrap() == data(i),
            "object {i}"
        );
    }
    flush_past_a_checkpoint(&e, 3).await;
    flush_past_a_checkpoint(&e, 3).await;
    assert_eq!(e.stats().extents_resealed, 0, "{:?}", e.stats());
}

/// An engine whose collector finds nothing old enough to re-seal or to move out of fragmented
/// objects for an hour (`Tuning::reseal_after_s`).
async fn open_aging_for_an_hour(w: &World) -> Engine {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.reseal_after_s = 3600;
    let (bucket, opts) = w.writer(opts);
    Engine::open(bucket, opts).await.unwrap()
}

/// Re-sealing waits for `reseal_after`: lz4 frames covered by checkpoints younger than that
/// stay as they are, however many checkpoints pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_frames_younger_than_reseal_after_are_left_alone() {
    let w = world();
    let e = open_aging_for_an_hour(&w).await;
    steady_barriers(&e).await;
    let len = 24 * EXTENT_SIZE_BYTES;
    let lz4_before = e.stats().flushes_lz4;
    e.write(3, 0, len as u64, Fill::Data(&pattern(7, len)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    assert_eq!(e.stats().flushes_lz4, lz4_before + 1);
    for _ in 0..3 {
        flush_past_a_checkpoint(&e, 3).await;
    }
    assert_eq!(e.stats().extents_resealed, 0, "{:?}", e.stats());
    assert!(e.read(3, 0, len).await.unwrap() == pattern(7, len));
}

/// Writes 2048 extents of inode 4 in one flush (one or two large objects), then overwrites three
/// quarters of them, eight per flush: too many live extents stay in the large objects for them
/// to count as sparse, but most of them is garbage. Returns the extents' contents now and the
/// keys of the large objects.
async fn overwrite_three_quarters(w: &World, e: &Engine) -> (Vec<Vec<u8>>, Vec<String>) {
    let extents = 2048u64;
    let extent = EXTENT_SIZE_BYTES as u64;
    let mut model: Vec<Vec<u8>> = (0..extents).map(|i| noise(i, EXTENT_SIZE_BYTES)).collect();
    let before = log_keys(w).await;
    for (i, data) in model.iter().enumerate() {
        e.write(4, i as u64 * extent, extent, Fill::Data(data))
            .await
            .unwrap();
    }
    e.flush().await.unwrap();
    let large: Vec<String> = log_keys(w)
        .await
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    assert!(large.len() <= 2, "{large:?}");
    let overwritten: Vec<u64> = (0..extents).filter(|i| i % 4 != 0).collect();
    for (n, chunk) in overwritten.chunks(8).enumerate() {
        for &i in chunk {
            model[i as usize] = noise(extents + n as u64 * 8 + i, EXTENT_SIZE_BYTES);
            e.write(4, i * extent, extent, Fill::Data(&model[i as usize]))
                .await
                .unwrap();
        }
        e.flush().await.unwrap();
    }
    let stats = e.stats();
    assert!(
        stats.log_bytes_stored > stats.log_bytes_live * 3 / 2,
        "the large objects are mostly garbage now: {stats:?}"
    );
    (model, large)
}

/// Once a checkpoint old enough covers the large objects `overwrite_three_quarters` leaves, the
/// collector moves their live extents out and deletes them, and the bucket holds about the
/// live data again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_mostly_overwritten_in_place_is_not_stored_twice() {
    let w = world();
    let (e, _) = open_quiet(&w).await;
    let (model, large) = overwrite_three_quarters(&w, &e).await;
    // The first checkpoint covers the large objects; the next finds them an interval old
    // (`for_tests`: `reseal_after_s` is zero) and moves their live extents; the one after
    // deletes them.
    flush_until_checkpoints(&e, 3).await;
    // Then quiet checkpoints collect what the last collection moved extents out of.
    let left = wait_until_deleted(&w, large).await;
    for _ in 0..100 {
        let stats = e.stats();
        if stats.log_bytes_stored < stats.log_bytes_live * 5 / 4 {
            break;
        }
        tokio::time::sleep(QUIET / 4).await;
    }
    let stats = e.stats();
    assert!(left.is_empty(), "{left:?} still stored: {stats:?}");
    assert!(stats.extents_defragmented >= 512, "{stats:?}");
    assert!(
        stats.log_bytes_stored < stats.log_bytes_live * 5 / 4,
        "garbage left: {stats:?}"
    );
    crash(&w, e).await;
    let e = open(&w).await;
    let extent = EXTENT_SIZE_BYTES as u64;
    for (i, data) in model.iter().enumerate() {
        let got = e
            .read(4, i as u64 * extent, EXTENT_SIZE_BYTES)
            .await
            .unwrap();
        assert!(got == *data, "extent {i}");
    }
}

/// Fragmented objects younger than `reseal_after` stay as they are, however many checkpoints
/// pass: most of what PostgreSQL writes dies within minutes without help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragmented_objects_younger_than_reseal_after_are_left_alone() {
    let w = world();
    let e = open_aging_for_an_hour(&w).await;
    let (_, large) = overwrite_three_quarters(&w, &e).await;
    flush_until_checkpoints(&e, 4).await;
    let now = log_keys(&w).await;
    let stats = e.stats();
    assert!(large.iter().all(|k| now.contains(k)), "{stats:?}");
    assert_eq!(stats.extents_defragmented, 0, "{stats:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        ino: u64,
        offset: u64,
        len: usize,
        seed: u8,
    },
    Zero {
        ino: u64,
        offset: u64,
        len: u64,
    },
    Flush,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    // Byte ranges independent of the extent size; writes up to 70 KB cross several extents.
    let span = 192 * 1024u64;
    prop_oneof![
        4 => (1u64..3, 0..span, 1usize..70_000, any::<u8>()).prop_map(|(ino, offset, len, seed)| Op::Write { ino, offset, len, seed }),
        1 => (1u64..3, 0..span, 1u64..100_000).prop_map(|(ino, offset, len)| Op::Zero { ino, offset, len }),
        2 => Just(Op::Flush),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Against a model of byte arrays: reads always match the live model; after a crash the
    /// state is exactly the model as of the last flush. (Fewer than 40 operations are too few
    /// barriers to turn write-behind on, which could make later writes durable too.)
    #[test]
    fn engine_matches_a_model_across_crashes(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let w = world();
            let mut e = open(&w).await;
            let size = 320 * 1024;
            let mut live = vec![vec![0u8; size]; 3];
            let mut durable = live.clone();
            for op in ops {
                match op {
                    Op::Write { ino, offset, len, seed } => {
                        let d = pattern(seed, len);
                        e.write(ino, offset, len as u64, Fill::Data(&d)).await.unwrap();
                        live[ino as usize][offset as usize..offset as usize + len].copy_from_slice(&d);
                    }
                    Op::Zero { ino, offset, len } => {
                        e.write(ino, offset, len, Fill::Zeroes { punch: true }).await.unwrap();
                        live[ino as usize][offset as usize..(offset + len) as usize].fill(0);
                    }
                    Op::Flush => {
                        e.flush().await.unwrap();
                        durable = live.clone();
                    }
                    Op::Crash => {
                        crash(&w, e).await;
                        e = open(&w).await;
                        live = durable.clone();
                    }
                }
                for ino in 1..3 {
                    assert_eq!(e.read(ino, 0, size).await.unwrap(), live[ino as usize]);
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_and_flushes_agree_with_what_reopens() {
    let w = world();
    let e = open(&w).await;
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..60u64 {
                // Overlapping, unaligned writes spanning extent boundaries.
                let offset = (t * 7919 + i * 104_729) % (40 * EXTENT_SIZE_BYTES as u64);
                let d = pattern((t * 31 + i) as u8, 5000 + (i as usize * 997) % 60_000);
                e.write(1, offset, d.len() as u64, Fill::Data(&d))
                    .await
                    .unwrap();
                if i % 7 == t % 7 {
                    e.flush().await.unwrap();
                }
                if i % 13 == 0 {
                    e.write(
                        1,
                        offset / 2,
                        3 * EXTENT_SIZE_BYTES as u64,
                        Fill::Zeroes { punch: true },
                    )
                    .await
                    .unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    e.flush().await.unwrap();
    let size = 48 * EXTENT_SIZE_BYTES;
    let expect = e.read(1, 0, size).await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, size).await.unwrap(), expect);
}

/// Uploads run concurrently and commit in order: a crash may leave stored objects after a missing
/// one. Opening drops them (never acknowledged); a longer run after a gap is damage, refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_stored_after_a_gap_are_dropped_at_open_and_a_long_run_is_refused() {
    let w = world();
    let e = open(&w).await;
    let a = pattern(3, 20_000);
    e.write(1, 0, a.len() as u64, Fill::Data(&a)).await.unwrap();
    e.flush().await.unwrap();
    let logs = w.bucket.list("log/").await.unwrap();
    let last: u64 = logs.last().unwrap().key["log/".len()..].parse().unwrap();
    let some_object = w.bucket.get(&logs.last().unwrap().key).await.unwrap();
    crash(&w, e).await;
    // The object after `last` never arrived; the one after it did.
    let orphan = format!("log/{:020}", last + 2);
    w.bucket
        .put(&orphan, some_object.clone(), PutMode::Create)
        .await
        .unwrap();
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, a.len()).await.unwrap(), a);
    assert!(
        w.bucket.get(&orphan).await.is_err(),
        "the orphan was deleted"
    );
    let b = pattern(4, 10_000);
    e.write(1, 0, b.len() as u64, Fill::Data(&b)).await.unwrap();
    e.flush().await.unwrap();
    e.write(1, 50_000, b.len() as u64, Fill::Data(&b))
        .await
        .unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, b.len()).await.unwrap(), b);
    crash(&w, e).await;
    // More stored objects after a gap than can ever be in flight: acknowledged data is missing.
    let logs = w.bucket.list("log/").await.unwrap();
    let last: u64 = logs.last().unwrap().key["log/".len()..].parse().unwrap();
    for i in 0..(bucketfs_engine::limits::UPLOADS_IN_FLIGHT_MAX as u64 + 1) {
        w.bucket
            .put(
                &format!("log/{:020}", last + 2 + i),
                some_object.clone(),
                PutMode::Create,
            )
            .await
            .unwrap();
    }
    let err = Engine::open(w.bucket.clone(), EngineOptions::for_tests("pw"))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::Corrupt(_)), "{err}");
}

/// Checkpoints upload runs of what changed, not the whole map; once the change runs would
/// outgrow the whole-map run, one checkpoint writes the whole map again (docs/0003).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_uploads_follow_the_change_not_the_map() {
    let w = world();
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.log_objects_per_checkpoint_min = 4;
    opts.tuning.log_objects_per_checkpoint_max = 4;
    let (bucket, opts) = w.writer(opts);
    let e = Engine::open(bucket, opts).await.unwrap();
    let checkpoints = |n: u64| {
        let e = e.clone();
        async move {
            for _ in 0..200 {
                if e.stats().checkpoints_written >= n {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            panic!("{n} checkpoints not written: {:?}", e.stats());
        }
    };
    // 4,000 extents in four flushes: the first checkpoint writes them all.
    let extent = EXTENT_SIZE_BYTES as u64;
    for i in 0..4u64 {
        let d = noise(i, 1000 * EXTENT_SIZE_BYTES);
        e.write(1, i * 1000 * extent, d.len() as u64, Fill::Data(&d))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    checkpoints(1).await;
    let whole = e.stats().checkpoint_bytes_written;
    // Four flushes of one extent each: the next checkpoint's run holds four extents.
    for i in 0..4u64 {
        let d = noise(100 + i, EXTENT_SIZE_BYTES);
        e.write(1, i * 7 * extent, extent, Fill::Data(&d))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    checkpoints(2).await;
    let delta = e.stats().checkpoint_bytes_written - whole;
    assert!(
        delta * 20 < whole,
        "a checkpoint of 4 changed extents uploaded {delta} bytes; the whole map took {whole}"
    );
    // Two runs: the merged one, in parts (`run/<id>.<part>` beyond the first), and the delta.
    let runs = w.bucket.list("run/").await.unwrap();
    assert_eq!(runs.iter().filter(|o| !o.key.contains('.')).count(), 2);
    assert!(runs.len() > 2, "tests cut merges into small parts");
    let expect = e.read(1, 0, 4000 * EXTENT_SIZE_BYTES).await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert!(e.read(1, 0, 4000 * EXTENT_SIZE_BYTES).await.unwrap() == expect);
    e.close().await.unwrap();
}
