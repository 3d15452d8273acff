//! What the metrics endpoint reads from the engine (docs/0008-metrics.md): the latency of client
//! barriers, whole and per part, and the hits and misses of the data caches.

use bucketfs_engine::bucket::Fault;
use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{BarrierPart, Engine, EngineOptions, Fill};
use std::time::Duration;

use crate::common::{open, pattern, world, ScratchDir};

const ROUND_TRIP: Duration = Duration::from_millis(5);

#[tokio::test]
async fn every_client_barrier_is_timed_whole_and_per_part() {
    let w = world();
    let e = open(&w).await;
    w.faults.set(Fault::Delay(ROUND_TRIP));
    let flushes = 6u64;
    for i in 0..flushes {
        e.write(1, i * 4096, 4096, Fill::Data(&pattern(i as u8, 4096)))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    let latency = e.barrier_latency();
    assert_eq!(latency.whole.count(), flushes);
    let mut parts_us = 0;
    for (part, histogram) in latency.parts {
        assert_eq!(
            histogram.count(),
            flushes,
            "{}: one per barrier",
            part.name()
        );
        parts_us += histogram.sum_us;
    }
    assert!(
        parts_us <= latency.whole.sum_us,
        "the parts ({parts_us} us) follow one another within the whole ({} us)",
        latency.whole.sum_us
    );
    let of = |wanted: BarrierPart| latency.parts[wanted as usize].1;
    // Each barrier's object is uploaded by the barrier itself or by a write-behind it waits for.
    let upload_us = of(BarrierPart::Put).sum_us + of(BarrierPart::UploadWait).sum_us;
    let round_trips_us = flushes * ROUND_TRIP.as_micros() as u64;
    assert!(
        upload_us >= round_trips_us,
        "put + upload_wait: {upload_us} us for {flushes} PUTs of {ROUND_TRIP:?}"
    );
    assert!(of(BarrierPart::Seal).sum_us > 0, "sealing takes time");
    assert_eq!(of(BarrierPart::OutageWait).sum_us, 0, "no outage");
    assert_eq!(
        latency.parts.map(|(part, _)| part),
        BarrierPart::ALL,
        "in their order"
    );

    // The engine's own barriers (here closing's) are not the clients'.
    e.write(1, 0, 4096, Fill::Data(&pattern(9, 4096)))
        .await
        .unwrap();
    e.close().await.unwrap();
    assert_eq!(e.barrier_latency().whole.count(), flushes);
}

#[tokio::test]
async fn reads_count_the_hits_and_misses_of_the_memory_and_disk_tiers() {
    // Extents 16 apart fall in one shard of the memory tier (engine/clean.rs), which holds 64 of
    // them at its smallest: reading 65 pushes the first out.
    const EXTENTS: u64 = 65;
    let offset = |j: u64| j * 16 * EXTENT_SIZE_BYTES as u64;
    let extent = |j: u64| pattern(j as u8, EXTENT_SIZE_BYTES);
    let w = world();
    let e = open(&w).await;
    for j in 0..EXTENTS {
        let data = extent(j);
        e.write(1, offset(j), data.len() as u64, Fill::Data(&data))
            .await
            .unwrap();
    }
    e.flush().await.unwrap();
    let before = e.stats();
    e.read(1, 0, 4096).await.unwrap();
    let after = e.stats();
    assert_eq!(after.memory_cache_hits, before.memory_cache_hits + 1);
    assert_eq!(after.memory_cache_misses, before.memory_cache_misses);
    e.close().await.unwrap();

    let cache_dir = ScratchDir::new("metrics-cache");
    let (bucket, mut opts) = w.writer(EngineOptions::for_tests("pw"));
    opts.memory_cache_bytes_max = 0;
    opts.disk_cache_dir = Some(cache_dir.to_path_buf());
    opts.disk_cache_bytes_max = 1 << 30;
    // Frame by frame: a miss that fetched the whole object would make the rest disk hits
    // (caches.rs tests that).
    opts.tuning.cold_read_whole_object_bytes_max = 0;
    let e = Engine::open(bucket, opts).await.unwrap();
    for j in 0..EXTENTS {
        let read = e.read(1, offset(j), EXTENT_SIZE_BYTES).await.unwrap();
        assert!(read == extent(j));
    }
    let cold = e.stats();
    assert_eq!(cold.memory_cache_misses, EXTENTS, "{cold:?}");
    assert_eq!(cold.disk_cache_misses, EXTENTS, "{cold:?}");
    assert_eq!(cold.disk_cache_hits, 0);
    // The first extent left the memory tier, not the disk tier.
    e.read(1, 0, 4096).await.unwrap();
    let again = e.stats();
    assert_eq!(again.memory_cache_misses, cold.memory_cache_misses + 1);
    assert_eq!(again.disk_cache_hits, 1, "{again:?}");
    assert_eq!(again.disk_cache_misses, cold.disk_cache_misses);
    // The last is still in memory.
    e.read(1, offset(EXTENTS - 1), 4096).await.unwrap();
    assert_eq!(e.stats().memory_cache_hits, again.memory_cache_hits + 1);
    e.close().await.unwrap();
}
