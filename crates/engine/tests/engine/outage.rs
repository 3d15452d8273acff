//! Object-store outages: a barrier waits through one shorter than the outage timeout and then
//! returns with everything durable; past the timeout it answers the error, and nothing
//! acknowledged is lost either way.

use bucketfs_engine::bucket::{Fault, RetryLimits};
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill, KvChange, OutageSide};
use std::time::{Duration, Instant};

use crate::common::{crash, open, pattern, world, World};

async fn open_with_outage_timeout(w: &World, timeout: Duration) -> Engine {
    open_with_limits(w, timeout, RetryLimits::default()).await
}

async fn open_with_limits(w: &World, timeout: Duration, limits: RetryLimits) -> Engine {
    let mut opts = EngineOptions::for_tests("pw");
    opts.outage_timeout = timeout;
    // The engine's own periodic barrier runs beside the client's, as in a server: both must see
    // every failed upload.
    opts.flush_interval = Duration::from_millis(100);
    let (bucket, opts) = w.writer_with_limits(opts, limits);
    Engine::open(bucket, opts).await.unwrap()
}

/// Attempts abandoned after 300 ms and requests after 1 s: a hang is quick to see.
fn short_limits() -> RetryLimits {
    RetryLimits {
        attempt: Duration::from_millis(300),
        per_mib: Duration::from_millis(100),
        get: Duration::from_millis(300),
        budget: Duration::from_secs(1),
        ..RetryLimits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_waits_through_an_outage_shorter_than_the_timeout() {
    let w = world();
    let e = open_with_outage_timeout(&w, Duration::from_secs(60)).await;
    e.write(1, 0, 20_000, Fill::Data(&pattern(1, 20_000)))
        .await
        .unwrap();
    w.faults.set(Fault::FailPuts);
    let flush = tokio::spawn({
        let e = e.clone();
        async move { e.flush().await }
    });
    // Longer than the bucket's own retries (about 1.5 s): without the outage handling the
    // barrier would have failed by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !flush.is_finished(),
        "the barrier gave up during the outage"
    );
    let outage = e.store_outage().expect("the outage is reported");
    assert!(outage.seconds >= 2, "{outage:?}");
    assert!(!outage.last_error.is_empty());
    // Writes go on meanwhile, and reads of what is in memory are served.
    e.write(1, 20_000, 100, Fill::Data(&pattern(2, 100)))
        .await
        .unwrap();
    assert_eq!(e.read(1, 0, 20_000).await.unwrap(), pattern(1, 20_000));
    w.faults.set(Fault::None);
    let done = tokio::time::timeout(Duration::from_secs(20), flush)
        .await
        .expect("the barrier returned once the store answered")
        .unwrap();
    done.unwrap();
    assert_eq!(e.store_outage(), None);
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, 20_000).await.unwrap(), pattern(1, 20_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_outage_timeout_a_barrier_answers_the_error_and_loses_nothing() {
    let w = world();
    let e = open_with_outage_timeout(&w, Duration::from_secs(3)).await;
    let took = barrier_failing_under(&w, &e, Fault::FailPuts).await;
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(15),
        "the barrier failed after {took:?}"
    );
    store_back_nothing_lost(&w, e).await;
}

/// Writes and flushes a first version of 5000 bytes, writes a second, sets `fault` and times
/// the barrier, which must fail with the store's error.
async fn barrier_failing_under(w: &World, e: &Engine, fault: Fault) -> Duration {
    e.write(1, 0, 5000, Fill::Data(&pattern(1, 5000)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    e.write(1, 0, 5000, Fill::Data(&pattern(2, 5000)))
        .await
        .unwrap();
    w.faults.set(fault);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(60), e.flush())
        .await
        .expect("the barrier answered while the store failed")
        .unwrap_err();
    assert!(matches!(err, EngineError::Store(_)), "{err}");
    started.elapsed()
}

/// The store is back: the second version, never acknowledged, is still in memory and goes out
/// now, and survives a crash.
async fn store_back_nothing_lost(w: &World, e: Engine) {
    w.faults.set(Fault::None);
    e.flush().await.unwrap();
    assert_eq!(e.store_outage(), None);
    crash(w, e).await;
    let e = open(w).await;
    assert_eq!(e.read(1, 0, 5000).await.unwrap(), pattern(2, 5000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_store_fails_a_barrier_at_the_outage_timeout_not_after_every_attempts_timeout() {
    let w = world();
    // Attempts of 2 s within a budget of 4 s, and an outage timeout of 2 s: the barrier fails
    // when its first request gives up (about 4 s). Were the outage clock started only then, or
    // every attempt allowed its timeout, it would take 8 s or more. (Seconds, not fractions:
    // on a loaded machine timers fire a second or more late.)
    let limits = RetryLimits {
        attempt: Duration::from_secs(2),
        budget: Duration::from_secs(4),
        ..short_limits()
    };
    let e = open_with_limits(&w, Duration::from_secs(2), limits).await;
    let took = barrier_failing_under(&w, &e, Fault::Hang).await;
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(7),
        "the barrier failed after {took:?}"
    );
    let outage = e.store_outage().expect("the outage is reported");
    assert_eq!(outage.requests, OutageSide::Uploads);
    assert!(outage.last_error.contains("no answer"), "{outage:?}");
    store_back_nothing_lost(&w, e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_waits_through_a_hang_shorter_than_the_timeout() {
    let w = world();
    let e = open_with_limits(&w, Duration::from_secs(30), short_limits()).await;
    e.write(1, 0, 20_000, Fill::Data(&pattern(3, 20_000)))
        .await
        .unwrap();
    w.faults.set(Fault::Hang);
    let flush = tokio::spawn({
        let e = e.clone();
        async move { e.flush().await }
    });
    // Several requests' budgets: each hung attempt was abandoned and the barrier kept waiting.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!flush.is_finished(), "the barrier gave up during the hang");
    assert!(e.store_outage().is_some_and(|o| o.seconds >= 3));
    w.faults.set(Fault::None);
    tokio::time::timeout(Duration::from_secs(20), flush)
        .await
        .expect("the barrier returned once the store answered")
        .unwrap()
        .unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, 20_000).await.unwrap(), pattern(3, 20_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_read_waits_through_an_outage_and_fails_past_the_timeout() {
    let w = world();
    let e = open(&w).await;
    e.write(1, 0, 40_000, Fill::Data(&pattern(4, 40_000)))
        .await
        .unwrap();
    e.kv_commit(vec![KvChange::Put(b"k".to_vec(), b"v".to_vec())])
        .unwrap();
    e.flush().await.unwrap();
    crash(&w, e).await;

    // Nothing is cached after the restart: the read needs the store, and waits for it.
    let e = open_with_limits(&w, Duration::from_secs(30), short_limits()).await;
    w.faults.set(Fault::FailAll);
    let read = tokio::spawn({
        let e = e.clone();
        async move { e.read(1, 0, 40_000).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!read.is_finished(), "the read failed during the outage");
    let outage = e.store_outage().expect("the outage is reported");
    assert_eq!(outage.requests, OutageSide::Reads);
    w.faults.set(Fault::None);
    let got = tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the read returned once the store answered")
        .unwrap()
        .unwrap();
    assert_eq!(got, pattern(4, 40_000));
    assert_eq!(e.store_outage(), None);
    crash(&w, e).await;

    // Past the timeout the read answers the error, and later reads work again.
    let e = open_with_limits(&w, Duration::from_secs(2), short_limits()).await;
    w.faults.set(Fault::Hang);
    let started = Instant::now();
    let err = e.read(1, 8192, 100).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, EngineError::Store(_)), "{err}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "the read failed after {took:?}"
    );
    assert!(e.store_outage().is_some());
    w.faults.set(Fault::None);
    assert_eq!(e.read(1, 0, 40_000).await.unwrap(), pattern(4, 40_000));
    assert_eq!(e.kv_get(b"k").await.unwrap().as_deref(), Some(&b"v"[..]));
    // The read that gave up is not retried, but the store answered the next one: the outage
    // is over.
    assert_eq!(e.store_outage(), None);
}
