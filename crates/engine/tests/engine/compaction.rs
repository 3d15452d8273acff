//! Compaction (engine/compaction.rs): while the runs hold far more than one checkpoint's merge
//! budget, no checkpoint writes much more than that budget; deltas merge in tiers; sweeps of the
//! bottom finish and drop the deltas they merged; and through it all, across crashes, the
//! key-value pairs read as a model of the same changes.

use super::common::*;
use bucketfs_engine::limits::RUNS_PER_MANIFEST_MAX;
use bucketfs_engine::{Engine, EngineOptions, KvChange};
use std::collections::BTreeMap;

fn options() -> EngineOptions {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.log_objects_per_checkpoint_min = 2;
    opts.tuning.log_objects_per_checkpoint_max = 2;
    opts.tuning.run_merge_bytes_per_checkpoint = 8 << 10;
    // A sweep's step merges whole parts of the bottom: parts far smaller than the runs keep a
    // step near its budget, as 64 MiB parts do in a bucket of many GiB of metadata.
    opts.tuning.run_part_bytes = 16 << 10;
    opts.tuning.sweep_after_delta_percent = 20;
    opts
}

async fn open_writer(w: &World) -> Engine {
    let (bucket, opts) = w.writer(options());
    Engine::open(bucket, opts).await.unwrap()
}

async fn run_bytes(w: &World) -> u64 {
    let runs = w.bucket.list("run/").await.unwrap();
    runs.iter().map(|o| o.size_bytes).sum()
}

async fn check(e: &Engine, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    let got = e.kv_range(b"", None, usize::MAX).await.unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(got.len(), want.len(), "{when}: pair count");
    assert!(got == want, "{when}: pairs differ from the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_stay_within_their_budget_and_read_as_a_model() {
    let w = world();
    let mut e = open_writer(&w).await;
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let key = |k: u64| format!("k{:06}", k).into_bytes();
    const KEYS: u64 = 20_000;
    for chunk in 0..KEYS / 1000 {
        let changes = (chunk * 1000..(chunk + 1) * 1000)
            .map(|k| {
                let v = format!("fill-{:016x}", k.wrapping_mul(0x9e3779b97f4a7c15)).into_bytes();
                model.insert(key(k), v.clone());
                KvChange::Put(key(k), v)
            })
            .collect();
        e.kv_commit(changes).unwrap();
        e.flush().await.unwrap();
    }
    // Two: the first may have begun before the last chunk was logged (a loaded machine lags),
    // and its rest would then count as round 0's checkpoint; the second begins after it.
    flush_until_checkpoints(&e, e.stats().checkpoints_written + 2).await;
    let filled = run_bytes(&w).await;

    let (mut sweeps, mut parts_merged, mut deltas_merged) = (0, 0, 0);
    let mut most_per_checkpoint = 0u64;
    let mut most_runs = 0u64;
    for round in 0..70 {
        for _ in 0..150 {
            let k = next(KEYS + 500);
            match next(20) {
                0..=15 => {
                    let v = format!("r{round}-{k}").into_bytes();
                    model.insert(key(k), v.clone());
                    e.kv_commit(vec![KvChange::Put(key(k), v)]).unwrap();
                }
                16..=18 => {
                    model.remove(&key(k));
                    e.kv_commit(vec![KvChange::Delete(key(k))]).unwrap();
                }
                _ => {
                    let (s, t) = (key(k), key(k + 1 + next(20)));
                    model.retain(|m, _| !(s <= *m && *m < t));
                    e.kv_commit(vec![KvChange::DeleteRange(s, t)]).unwrap();
                }
            }
        }
        let before = e.stats();
        flush_until_checkpoints(&e, before.checkpoints_written + 1).await;
        let after = e.stats();
        let per = (after.checkpoint_bytes_written - before.checkpoint_bytes_written)
            / (after.checkpoints_written - before.checkpoints_written);
        most_per_checkpoint = most_per_checkpoint.max(per);
        eprintln!(
            "round {round}: {per} B per checkpoint, {} delta runs, sweeps {} parts {} deltas {}",
            after.metadata_delta_runs,
            after.bottom_sweeps_finished,
            after.bottom_parts_merged,
            after.delta_runs_merged
        );
        most_runs = most_runs.max(after.metadata_delta_runs);
        if round % 5 == 4 {
            check(&e, &model, &format!("round {round}")).await;
        }
        if round % 9 == 8 {
            let s = e.stats();
            sweeps += s.bottom_sweeps_finished;
            parts_merged += s.bottom_parts_merged;
            deltas_merged += s.delta_runs_merged;
            e.flush().await.unwrap();
            crash(&w, e).await;
            e = open_writer(&w).await;
            check(&e, &model, &format!("reopened after round {round}")).await;
        }
    }
    let s = e.stats();
    sweeps += s.bottom_sweeps_finished;
    parts_merged += s.bottom_parts_merged;
    deltas_merged += s.delta_runs_merged;
    let stored = run_bytes(&w).await;
    eprintln!(
        "runs after the fill {filled} B, at the end {stored} B; most written by one checkpoint \
         {most_per_checkpoint} B; most delta runs {most_runs}; sweeps {sweeps}, parts merged \
         {parts_merged}, deltas merged {deltas_merged}"
    );
    assert!(sweeps >= 2, "sweeps of the bottom finished: {sweeps}");
    assert!(deltas_merged > 0, "no delta runs were merged in tiers");
    assert!(
        most_per_checkpoint * 3 < filled,
        "one checkpoint wrote {most_per_checkpoint} B, not well below the {filled} B of runs"
    );
    // A sweep begins once the deltas number half the manifest's limit and, while more arrive,
    // finishes before they reach it (engine/compaction.rs); tiers only slow their growth.
    assert!(
        most_runs as usize + 4 <= RUNS_PER_MANIFEST_MAX,
        "the manifest named {most_runs} delta runs, past the {RUNS_PER_MANIFEST_MAX} a manifest takes less 4"
    );
    check(&e, &model, "at the end").await;
}
