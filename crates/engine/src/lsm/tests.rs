//! Runs against a model: a stack of runs written from random intervals of puts, deletes and range
//! deletions must read (point lookups and scans) exactly as one ordered map that applied the same
//! changes in order, before and after compaction; damaged runs are errors, never wrong data.

use super::merge::{compact, get, scan};
use super::run::{encode, RunReader};
use super::{Entry, MemRun, RunError};
use crate::bucket::{open_url, PutMode, SharedBucket};
use crate::crypto::{Cipher, DataKey, Sealer};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Op {
    Put(u16, u16),
    Delete(u16),
    DeleteRange(u16, u16),
}

fn key(k: u16) -> Vec<u8> {
    // Variable-length keys that share prefixes, as inode and directory keys do.
    format!("k{}", k).into_bytes()
}

fn value(k: u16, v: u16) -> Vec<u8> {
    let mut out = format!("v{k}-{v}-").into_bytes();
    out.resize(out.len() + (v as usize % 300), b'x');
    out
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u16..2000, any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0u16..2000).prop_map(Op::Delete),
        1 => (0u16..2000, 0u16..2000).prop_map(|(a, b)| Op::DeleteRange(a, b)),
    ]
}

fn sealer() -> Arc<Sealer> {
    Arc::new(Sealer::new(&DataKey::for_tests(9), Cipher::Aes256GcmBlake3))
}

async fn store(
    bucket: &SharedBucket,
    sealer: &Arc<Sealer>,
    run_id: u64,
    mem: &MemRun,
) -> RunReader {
    let points = mem.points.iter().map(|(k, e)| (k.clone(), e.clone()));
    write_run(bucket, sealer, run_id, points.collect(), mem.ranges.clone()).await
}

async fn write_run(
    bucket: &SharedBucket,
    sealer: &Arc<Sealer>,
    run_id: u64,
    points: Vec<(Vec<u8>, Entry)>,
    ranges: super::RangeSet,
) -> RunReader {
    let bytes = encode(sealer, run_id, points, &ranges);
    let name = format!("run/{run_id:020}");
    let size = bytes.len() as u64;
    bucket
        .put(&name, bytes.into(), PutMode::Create)
        .await
        .expect("memory put");
    RunReader::open(bucket.clone(), sealer.clone(), &name, run_id, size)
        .await
        .expect("a run just written opens")
}

async fn check(runs: &[RunReader], model: &BTreeMap<Vec<u8>, Vec<u8>>, probes: &[(u16, u16)]) {
    for k in (0..2000).step_by(37).chain([0, 1, 1999]) {
        assert_eq!(
            get(runs, &key(k)).await.unwrap(),
            model.get(&key(k)).cloned(),
            "get {k}"
        );
    }
    for &(a, b) in probes {
        let (start, end) = (key(a), key(b));
        let limit = 1 + (a as usize % 50);
        let want: Vec<(Vec<u8>, Vec<u8>)> = if start < end {
            model
                .range(start.clone()..end.clone())
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(
            scan(runs, &start, &end, limit).await.unwrap(),
            want,
            "scan {a}..{b} limit {limit}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn runs_read_as_the_ordered_map_of_the_same_changes(
        intervals in proptest::collection::vec(proptest::collection::vec(op(), 0..400), 1..6),
        probes in proptest::collection::vec((0u16..2000, 0u16..2000), 8),
        compact_top in 1usize..6,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let bucket: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
            let sealer = sealer();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut runs: Vec<RunReader> = Vec::new();
            for (i, ops) in intervals.iter().enumerate() {
                let mut mem = MemRun::default();
                for op in ops {
                    match *op {
                        Op::Put(k, v) => {
                            model.insert(key(k), value(k, v));
                            mem.put(key(k), value(k, v));
                        }
                        Op::Delete(k) => {
                            model.remove(&key(k));
                            mem.delete(key(k));
                        }
                        Op::DeleteRange(a, b) => {
                            let (start, end) = (key(a), key(b));
                            if start < end {
                                let doomed: Vec<Vec<u8>> = model.range(start.clone()..end.clone()).map(|(k, _)| k.clone()).collect();
                                for k in doomed { model.remove(&k); }
                            }
                            mem.delete_range(start, end);
                        }
                    }
                }
                if mem.points.is_empty() && mem.ranges.is_empty() {
                    continue;
                }
                runs.insert(0, store(&bucket, &sealer, i as u64 + 1, &mem).await);
            }
            check(&runs, &model, &probes).await;
            // The newest few runs merged into one, in place.
            let top = compact_top.min(runs.len());
            let bottom = top == runs.len();
            let (points, ranges) = compact(&runs[..top], bottom).await.unwrap();
            if bottom {
                assert!(ranges.is_empty() && points.iter().all(|(_, e)| *e != Entry::Delete));
            }
            let rest = runs.split_off(top);
            let mut merged = Vec::new();
            if !points.is_empty() || !ranges.is_empty() {
                merged.push(write_run(&bucket, &sealer, 1000, points, ranges).await);
            }
            merged.extend(rest);
            check(&merged, &model, &probes).await;
        });
    }
}

#[tokio::test]
async fn large_runs_span_many_blocks_and_a_lookup_reads_one() {
    let bucket: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
    let counting = Arc::new(crate::bucket::CountingBucket::new(bucket.clone()));
    let sealer = sealer();
    let mut mem = MemRun::default();
    for k in 0..20_000u32 {
        mem.put(
            format!("inode/{k:08}").into_bytes(),
            vec![(k % 251) as u8; 60],
        );
    }
    let points: Vec<(Vec<u8>, Entry)> = mem.points.into_iter().collect();
    let bytes = encode(&sealer, 7, points, &super::ranges::EMPTY);
    let size = bytes.len() as u64;
    bucket
        .put("run/7", bytes.into(), PutMode::Create)
        .await
        .unwrap();
    let shared: SharedBucket = counting.clone();
    let run = RunReader::open(shared, sealer.clone(), "run/7", 7, size)
        .await
        .unwrap();
    assert!(run.block_count() > 10, "{} blocks", run.block_count());
    assert_eq!(run.entry_count(), 20_000);
    let before = counting.counts();
    let found = get(std::slice::from_ref(&run), b"inode/00012345")
        .await
        .unwrap();
    assert_eq!(found, Some(vec![(12345 % 251) as u8; 60]));
    let after = counting.counts();
    assert_eq!(after.get - before.get, 1, "one ranged GET per cold lookup");
    let page = scan(
        std::slice::from_ref(&run),
        b"inode/00019990",
        b"inode/99",
        100,
    )
    .await
    .unwrap();
    assert_eq!(page.len(), 10);
}

#[tokio::test]
async fn damaged_runs_are_errors_never_wrong_data() {
    let bucket: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
    let sealer = sealer();
    let mut mem = MemRun::default();
    for k in 0..3000u16 {
        mem.put(key(k), value(k, k));
    }
    let points: Vec<(Vec<u8>, Entry)> = mem.points.into_iter().collect();
    let good = encode(&sealer, 3, points, &super::ranges::EMPTY);
    let size = good.len() as u64;
    // A flipped byte in a block: that block's lookups fail, the run still opens.
    let mut bad = good.clone();
    bad[40] ^= 1;
    bucket
        .put("run/a", bad.into(), PutMode::Create)
        .await
        .unwrap();
    let run = RunReader::open(bucket.clone(), sealer.clone(), "run/a", 3, size)
        .await
        .unwrap();
    let err = get(std::slice::from_ref(&run), &key(0)).await.unwrap_err();
    assert!(
        matches!(err, RunError::Authentication { block: 0, .. }),
        "{err}"
    );
    // A flipped byte in the index, a wrong run id, another key, a truncated object: no open.
    let mut bad = good.clone();
    bad[size as usize - 30] ^= 1;
    bucket
        .put("run/b", bad.into(), PutMode::Create)
        .await
        .unwrap();
    assert!(
        RunReader::open(bucket.clone(), sealer.clone(), "run/b", 3, size)
            .await
            .is_err()
    );
    bucket
        .put("run/c", good.clone().into(), PutMode::Create)
        .await
        .unwrap();
    assert!(
        RunReader::open(bucket.clone(), sealer.clone(), "run/c", 4, size)
            .await
            .is_err()
    );
    let other = Arc::new(Sealer::new(
        &DataKey::for_tests(10),
        Cipher::Aes256GcmBlake3,
    ));
    assert!(RunReader::open(bucket.clone(), other, "run/c", 3, size)
        .await
        .is_err());
    let short = good[..good.len() - 5].to_vec();
    bucket
        .put("run/d", short.into(), PutMode::Create)
        .await
        .unwrap();
    let err = RunReader::open(bucket.clone(), sealer.clone(), "run/d", 3, size - 5)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, RunError::Malformed { .. }), "{err}");
}
