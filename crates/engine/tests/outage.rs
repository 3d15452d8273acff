//! Object-store outages: a barrier waits through one shorter than the outage timeout and then
//! returns with everything durable; past the timeout it answers the error, and nothing
//! acknowledged is lost either way.

use bucketfs_engine::bucket::Fault;
use bucketfs_engine::{Engine, EngineError, EngineOptions, Fill};
use std::time::{Duration, Instant};

mod common;
use common::{crash, open, pattern, world, World};

async fn open_with_outage_timeout(w: &World, timeout: Duration) -> Engine {
    let mut opts = EngineOptions::for_tests("pw");
    opts.outage_timeout = timeout;
    let (bucket, opts) = w.writer(opts);
    Engine::open(bucket, opts).await.unwrap()
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
    e.write(1, 0, 5000, Fill::Data(&pattern(1, 5000)))
        .await
        .unwrap();
    e.flush().await.unwrap();
    e.write(1, 0, 5000, Fill::Data(&pattern(2, 5000)))
        .await
        .unwrap();
    w.faults.set(Fault::FailPuts);
    let started = Instant::now();
    let err = e.flush().await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, EngineError::Store(_)), "{err}");
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(15),
        "the barrier failed after {took:?}"
    );
    // The store is back: the write, never acknowledged, is still in memory and goes out now.
    w.faults.set(Fault::None);
    e.flush().await.unwrap();
    crash(&w, e).await;
    let e = open(&w).await;
    assert_eq!(e.read(1, 0, 5000).await.unwrap(), pattern(2, 5000));
}
