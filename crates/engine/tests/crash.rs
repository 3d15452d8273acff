//! The durability contract under crashes, checked against a model over thousands of seeded
//! schedules: each writer process runs random writes, zeroes, truncations, key-value commits and
//! barriers (the collector checkpointing and moving extents behind them), and dies at a random
//! PUT of its own, some of its requests in flight landing in the store unanswered. After every
//! crash the reopened bucket must hold exactly the model's state after some prefix of the
//! acknowledged mutations that includes every acknowledged barrier: nothing acknowledged lost,
//! no mutation torn or half applied, nothing that was never written.
//!
//! Scoped barriers (engine/scoped.rs) relax the rule per inode: an inode whose scoped barrier
//! returned must hold its state at that barrier when the prefix is older, unless a transaction
//! that changed it together with the other inode lies between (then the prefix must reach the
//! barrier, and the barrier must have been a full one).
//!
//! Odd seeds write through a journal tier (bucket/tier.rs) in a directory that outlives each
//! process, as a local disk does: there a barrier is acknowledged once journaled, and the crash
//! freezes the bucket below the journal. Seeds 1 mod 4 journal each client barrier's batch as a
//! record (engine/journaled.rs); seeds 3 mod 4 journal the log objects of the plain engine.
//!
//! `cargo test --release -p bucketfs-engine --test crash` runs CRASH_SEEDS_DEFAULT seeds; the soak
//! (docs/testing.md) sets BUCKETFS_CRASH_SEEDS and BUCKETFS_CRASH_FIRST_SEED. A failure prints
//! its seed; BUCKETFS_CRASH_SEED=N replays that one.

use bucketfs_engine::bucket::{
    open_url, CrashableBucket, FreezePlan, JournalTier, JournaledBucket, RetryingBucket,
    SharedBucket, TargetSpec,
};
use bucketfs_engine::limits::EXTENT_SIZE_BYTES;
use bucketfs_engine::{
    Codec, Engine, EngineError, EngineOptions, Expect, Fill, KdfCost, KvChange, Scope, TaskSet,
    Tuning, Txn,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Seeds run by the README's test command (a few seconds each at most).
const CRASH_SEEDS_DEFAULT: u64 = 300;
/// Writer processes per seed that crash; one more then opens the bucket and checks it.
const LIVES: usize = 4;
/// Mutations and barriers one process issues at most before it is killed anyway.
const OPS_PER_LIFE_MAX: u64 = 120;
const INODES: u64 = 2;
/// Bytes per file of the model: 14 extents, so writes overlap often.
const FILE_BYTES: u64 = 14 * EXTENT_SIZE_BYTES as u64;
const KV_KEYS: u64 = 8;

/// splitmix64: one seed reproduces a schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        // Runs of repeated bytes and noise, so frames both compress and do not.
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let run = (1 + self.below(600) as usize).min(len - out.len());
            if self.chance(50) {
                let b = self.next() as u8;
                out.extend(std::iter::repeat_n(b, run));
            } else {
                out.extend((0..run).map(|_| self.next() as u8));
            }
        }
        out
    }
}

/// What the bucket must hold: the files' bytes and the key-value pairs.
#[derive(Clone, PartialEq, Eq)]
struct Model {
    files: Vec<Vec<u8>>,
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Model {
    fn empty() -> Model {
        Model {
            files: vec![vec![0; FILE_BYTES as usize]; INODES as usize],
            kv: BTreeMap::new(),
        }
    }
}

/// Checkpoints every few log objects and an eager collector, so crashes land in the middle of
/// checkpoints, deletions and moves too; small thresholds send batches down every sealing path.
fn crash_tuning(rng: &mut Rng) -> Tuning {
    Tuning {
        log_objects_per_checkpoint_min: 2 + rng.below(4),
        log_objects_per_checkpoint_max: 8,
        checkpoint_extents_per_log_object: 1 << 20,
        quiet_checkpoint_after_ms: if rng.chance(50) { 20 } else { 0 },
        quiet_checkpoint_fraction: 2,
        reseal_after_s: 0,
        repack_fragmented_bytes_min: 64 * 1024,
        repack_extents_per_object: 1 + rng.below(6),
        inline_seal_extents_max: rng.below(4),
        parallel_seal_extents_min: 2,
        dirty_bytes_flush_start: 48 * 1024,
        write_behind_gathered_bytes: 16 * 1024,
        // Half the seeds cut runs into small parts and sweep the bottom a few parts per
        // checkpoint, so crashes land between the steps of a sweep and in tiered merges.
        run_part_bytes: if rng.chance(50) {
            512 + 512 * rng.below(4)
        } else {
            64 << 20
        },
        run_merge_bytes_per_checkpoint: 256 + 256 * rng.below(8),
        sweep_after_delta_percent: 10 + 10 * rng.below(10),
        delta_runs_per_merge: 2 + rng.below(3),
        // Side records for most scoped barriers, and now and then the full barrier.
        scoped_barrier_ahead_bytes_min: if rng.chance(80) { 0 } else { 64 * 1024 },
        scoped_barrier_bytes_max: 16 * 1024 + rng.below(4) * 32 * 1024,
        ..Tuning::default()
    }
}

fn options(rng: &mut Rng, tasks: TaskSet) -> EngineOptions {
    let mut opts = EngineOptions::for_tests("pw");
    opts.codec = if rng.chance(50) {
        Codec::Zstd
    } else {
        Codec::Lz4
    };
    opts.kdf_cost = KdfCost {
        memory_kib: 64,
        passes: 1,
    };
    opts.tuning = crash_tuning(rng);
    opts.tasks = tasks;
    opts
}

/// What the schedules exercised, summed over every process of every seed: a crash test whose
/// crashes never hit a checkpoint or a move would prove little.
#[derive(Default, Debug)]
struct Tally {
    crashes: u64,
    crashes_while_opening: u64,
    barriers_acknowledged: u64,
    mutations: u64,
    /// Transactions refused because their condition failed (they must change nothing).
    conflicts: u64,
    /// Scoped barriers acknowledged, those served by a side record, and transactions that
    /// changed both inodes together.
    scoped_barriers: u64,
    scoped_by_side_record: u64,
    /// Extents side records left out, their inode's earlier side record holding them.
    side_extents_left_out: u64,
    shared_txns: u64,
    /// Named checkpoints created, and checked read-only against the state they were made at.
    pins_created: u64,
    pins_checked: u64,
    checkpoints: u64,
    log_objects_deleted: u64,
    extents_moved: u64,
    /// Compaction: bottom parts merged by sweeps, sweeps finished, deltas merged in tiers.
    bottom_parts_merged: u64,
    bottom_sweeps_finished: u64,
    delta_runs_merged: u64,
}

/// What a seed's bucket may hold: `history[acked]` is the newest state a barrier acknowledged,
/// and the history grows by one state per acknowledged mutation; each named checkpoint must
/// hold the state it was made at.
struct Expected {
    history: Vec<Model>,
    acked: usize,
    pins: BTreeMap<String, Model>,
    /// Per inode: the index in `history` of the state at its last acknowledged scoped barrier
    /// (0 for none), and the indices of the states made by transactions that changed it
    /// together with the other inode.
    scoped: Vec<usize>,
    shared: Vec<Vec<usize>>,
    /// A scoped barrier cut off by the crash (inode, index in `history`): its side record may
    /// have landed, as if it had returned.
    cut_off: Option<(u64, usize)>,
}

fn size_key(ino: u64) -> Vec<u8> {
    format!("size{ino}").into_bytes()
}

/// An inode's scope in this model: its extents and its size pair.
fn scope(ino: u64) -> Scope {
    Scope::with_keys(ino, [size_key(ino)])
}

/// The bucket's state as an engine opened on it sees it.
async fn observe(e: &Engine) -> Model {
    let mut files = Vec::new();
    for ino in 1..=INODES {
        files.push(e.read(ino, 0, FILE_BYTES as usize).await.expect("reads"));
    }
    Model {
        files,
        kv: e.kv_scan(b"").await.unwrap().into_iter().collect(),
    }
}

/// Whether `seen` is a state a crash may leave: the state after a prefix at or after `acked`,
/// with each inode whose scoped barrier is newer than the prefix as it was at that barrier (if
/// no transaction shared with the other inode lies between).
fn find_prefix(expected: &Expected, seen: &Model) -> bool {
    if let Some((ino, at)) = expected.cut_off {
        let mut scoped = expected.scoped.clone();
        scoped[(ino - 1) as usize] = at;
        if prefix_with(expected, &scoped, seen) {
            return true;
        }
    }
    prefix_with(expected, &expected.scoped, seen)
}

fn prefix_with(expected: &Expected, scoped: &[usize], seen: &Model) -> bool {
    let Expected {
        history,
        acked,
        shared,
        ..
    } = expected;
    (*acked..history.len()).rev().any(|p| {
        let mut state = history[p].clone();
        for ino in 1..=INODES {
            let i = (ino - 1) as usize;
            let at = scoped[i];
            if at <= p {
                continue;
            }
            if shared[i].iter().any(|&s| p < s && s <= at) {
                return false;
            }
            state.files[i] = history[at].files[i].clone();
            let key = size_key(ino);
            match history[at].kv.get(&key) {
                Some(v) => state.kv.insert(key, v.clone()),
                None => state.kv.remove(&key),
            };
        }
        state == *seen
    })
}

fn describe_mismatch(history: &[Model], acked: usize, seen: &Model) -> String {
    let last = history.last().expect("history is never empty");
    let mut why = format!(
        "the bucket matches none of the {} states from the last acknowledged barrier on",
        history.len() - acked
    );
    if let Some(i) = (0..acked).rev().find(|&i| history[i] == *seen) {
        why += &format!("; it equals state {i}, before the acknowledged state {acked}: an acknowledged barrier was lost");
    }
    for ino in 0..INODES as usize {
        if let Some(at) =
            (0..FILE_BYTES as usize).find(|&b| seen.files[ino][b] != last.files[ino][b])
        {
            why += &format!(
                "; inode {} first differs from the newest state at byte {at}",
                ino + 1
            );
        }
    }
    if seen.kv != last.kv {
        why += "; key-value pairs differ from the newest state";
    }
    why
}

/// One writer process: opens the bucket, checks what it finds (and every named checkpoint),
/// then mutates until its view of the bucket freezes (or it has done enough).
async fn live(
    store: &SharedBucket,
    // The journal's directory, and whether barriers write records there.
    journal: Option<(&std::path::Path, bool)>,
    rng: &mut Rng,
    plan: Option<FreezePlan>,
    tasks: TaskSet,
    expected: &mut Expected,
    tally: &mut Tally,
) -> Result<(), String> {
    let view = Arc::new(CrashableBucket::new(store.clone(), plan));
    let mut bucket: SharedBucket = Arc::new(RetryingBucket::new(view.clone()));
    if let Some((dir, _)) = journal {
        bucket = Arc::new(JournaledBucket::new(
            bucket,
            JournalTier {
                targets: vec![TargetSpec::Dir(dir.to_path_buf())],
                write_quorum: 1,
                accept_loss: false,
                bucket_url: "memory://crash".into(),
                // Small: a new journal is written whole, and every odd seed makes one.
                ring_bytes: Some(16 << 20),
                stop_wait: None,
            },
        ));
    }
    let mut opts = options(rng, tasks);
    opts.journaled_barriers = journal.is_some_and(|(_, records)| records);
    let e = tokio::select! {
        opened = Engine::open(bucket, opts) => opened.map_err(|e| format!("open failed: {e}"))?,
        () = view.frozen() => {
            tally.crashes_while_opening += 1;
            return Ok(());
        }
    };
    let seen = tokio::select! {
        seen = observe(&e) => seen,
        () = view.frozen() => return Ok(()),
    };
    if !find_prefix(expected, &seen) {
        return Err(describe_mismatch(&expected.history, expected.acked, &seen));
    }
    let Expected {
        history,
        acked,
        pins,
        scoped,
        shared,
        cut_off,
    } = expected;
    // From here on this is the state every later one builds on.
    history.clear();
    history.push(seen);
    *acked = 0;
    scoped.iter_mut().for_each(|s| *s = 0);
    shared.iter_mut().for_each(Vec::clear);
    *cut_off = None;
    // Every named checkpoint still holds the state it was made at, whatever crashed since.
    for (name, want) in pins.iter() {
        let mut opts = EngineOptions::for_tests("pw");
        opts.read_only = true;
        opts.checkpoint = Some(name.clone());
        let reader = Engine::open(store.clone(), opts)
            .await
            .map_err(|e| format!("opening checkpoint {name}: {e}"))?;
        if observe(&reader).await != *want {
            return Err(format!(
                "checkpoint {name} does not hold the state it was created at"
            ));
        }
        tally.pins_checked += 1;
    }
    // The last process only checks what the crashes left.
    let ops = if plan.is_some() {
        1 + rng.below(OPS_PER_LIFE_MAX)
    } else {
        0
    };
    for _ in 0..ops {
        if view.is_frozen() {
            break;
        }
        let mut next = history.last().expect("never empty").clone();
        let ino = 1 + rng.below(INODES);
        let file = &mut next.files[(ino - 1) as usize];
        match rng.below(100) {
            // Writes of any size and alignment, most of them small.
            0..=44 => {
                let offset = rng.below(FILE_BYTES);
                let room = FILE_BYTES - offset;
                let len = if rng.chance(60) {
                    1 + rng.below(room.min(9000))
                } else {
                    1 + rng.below(room)
                };
                let data = rng.bytes(len as usize);
                file[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                let w = e.write(ino, offset, len, Fill::Data(&data));
                tokio::select! {
                    r = w => r.map_err(|e| format!("write failed: {e}"))?,
                    // Cut off by the crash: it may or may not have been applied, and a flush
                    // already under way may carry it into the bucket.
                    () = view.frozen() => {
                        history.push(next);
                        break;
                    }
                }
            }
            45..=54 => {
                let offset = rng.below(FILE_BYTES);
                let len = 1 + rng.below(FILE_BYTES - offset);
                let punch = rng.chance(70);
                file[offset as usize..(offset + len) as usize].fill(0);
                let w = e.write(ino, offset, len, Fill::Zeroes { punch });
                tokio::select! {
                    r = w => r.map_err(|e| format!("zeroing failed: {e}"))?,
                    () = view.frozen() => {
                        history.push(next);
                        break;
                    }
                }
            }
            55..=57 => {
                let from_index = rng.below(FILE_BYTES / EXTENT_SIZE_BYTES as u64 + 1);
                file[(from_index * EXTENT_SIZE_BYTES as u64) as usize..].fill(0);
                e.drop_extents_from(ino, from_index)
                    .map_err(|e| format!("truncation failed: {e}"))?;
            }
            // A truncation as the filesystem makes it: the size record, the zeroed tail of the
            // last extent and the range deletion beyond it in one transaction, on the condition
            // that the size record is what this process last wrote (or, one time in five, on a
            // condition that fails, which must change nothing).
            58..=62 => {
                let size = rng.below(FILE_BYTES + 1);
                let key = size_key(ino);
                let fails = rng.chance(20);
                let expect = match (next.kv.get(&key), fails) {
                    (Some(v), false) => Expect::Value(v.clone()),
                    (None, false) => Expect::Absent,
                    (Some(_), true) => Expect::Absent,
                    (None, true) => Expect::Present,
                };
                let extent = EXTENT_SIZE_BYTES as u64;
                let tail_end = (size.div_ceil(extent) * extent).min(FILE_BYTES);
                let mut txn = Txn::new();
                txn.expect(key.clone(), expect)
                    .zero(ino, size, tail_end - size, rng.chance(50))
                    .drop_extents(ino, size.div_ceil(extent), u64::MAX)
                    .put(key.clone(), size.to_le_bytes().to_vec());
                let c = e.commit(&txn);
                let result = tokio::select! {
                    r = c => r,
                    () = view.frozen() => {
                        if !fails {
                            file[size as usize..].fill(0);
                            next.kv.insert(key, size.to_le_bytes().to_vec());
                        }
                        history.push(next);
                        break;
                    }
                };
                match (result, fails) {
                    (Ok(()), false) => {
                        file[size as usize..].fill(0);
                        next.kv.insert(key, size.to_le_bytes().to_vec());
                    }
                    (Err(EngineError::Conflict { .. }), true) => {
                        tally.conflicts += 1;
                        continue;
                    }
                    (r, _) => return Err(format!("transaction (condition fails: {fails}): {r:?}")),
                }
            }
            63..=71 => {
                let mut changes = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let key = format!("key{}", rng.below(KV_KEYS)).into_bytes();
                    if rng.chance(10) {
                        // A range deletion, from this key to another, by byte order.
                        let end = format!("key{}", rng.below(KV_KEYS)).into_bytes();
                        next.kv.retain(|k, _| !(key <= *k && *k < end));
                        changes.push(KvChange::DeleteRange(key, end));
                    } else if rng.chance(25) {
                        next.kv.remove(&key);
                        changes.push(KvChange::Delete(key));
                    } else {
                        let len = rng.below(200) as usize;
                        let value = rng.bytes(len);
                        next.kv.insert(key.clone(), value.clone());
                        changes.push(KvChange::Put(key, value));
                    }
                }
                e.kv_commit(changes)
                    .map_err(|e| format!("key-value commit failed: {e}"))?;
            }
            // A named checkpoint: made (a barrier too), or one deleted.
            72..=73 => {
                if !pins.is_empty() && rng.chance(40) {
                    let at = rng.below(pins.len() as u64) as usize;
                    let name = pins.keys().nth(at).expect("in range").clone();
                    let d = e.delete_checkpoint(&name);
                    tokio::select! {
                        r = d => r.map_err(|e| format!("deleting checkpoint {name}: {e}"))?,
                        // Deleted or not: checked no more.
                        () = view.frozen() => {
                            pins.remove(&name);
                            break;
                        }
                    }
                    pins.remove(&name);
                } else {
                    let name = format!("c{}", rng.next() % 1_000_000_000);
                    let c = e.create_checkpoint(&name);
                    let r = tokio::select! {
                        r = c => r,
                        () = view.frozen() => break,
                    };
                    match r {
                        Ok(_) => {}
                        // Only a bucket nothing was ever written to has no state to keep.
                        Err(EngineError::NothingToCheckpoint)
                            if history.iter().all(|m| *m == Model::empty()) =>
                        {
                            continue
                        }
                        Err(e) => return Err(format!("creating checkpoint {name}: {e}")),
                    }
                    *acked = history.len() - 1;
                    pins.insert(name, history.last().expect("never empty").clone());
                    tally.pins_created += 1;
                }
                continue;
            }
            // A transaction that writes both inodes: a scoped barrier of either must not keep
            // half of it.
            74..=77 => {
                let mut txn = Txn::new();
                for other in 1..=INODES {
                    let offset = rng.below(FILE_BYTES - 4096);
                    let len = 1 + rng.below(4096) as usize;
                    let data = rng.bytes(len);
                    next.files[(other - 1) as usize][offset as usize..offset as usize + data.len()]
                        .copy_from_slice(&data);
                    txn.write(other, offset, data);
                }
                txn.shared_by(1..=INODES);
                let c = e.commit(&txn);
                tokio::select! {
                    r = c => r.map_err(|e| format!("shared transaction failed: {e}"))?,
                    () = view.frozen() => {
                        history.push(next);
                        for s in shared.iter_mut() {
                            s.push(history.len() - 1);
                        }
                        break;
                    }
                }
                history.push(next);
                for s in shared.iter_mut() {
                    s.push(history.len() - 1);
                }
                tally.mutations += 1;
                tally.shared_txns += 1;
                continue;
            }
            // A scoped barrier: once it returns, the inode's state must survive.
            78..=87 => {
                let (sides, left_out) = {
                    let s = e.stats();
                    (s.scoped_barriers_side, s.side_record_extents_left_out)
                };
                let scope = scope(ino);
                tokio::select! {
                    r = e.scoped_flush(&scope) => r.map_err(|e| format!("scoped barrier failed: {e}"))?,
                    () = view.frozen() => {
                        *cut_off = Some((ino, history.len() - 1));
                        break;
                    }
                }
                scoped[(ino - 1) as usize] = history.len() - 1;
                tally.scoped_barriers += 1;
                let s = e.stats();
                tally.scoped_by_side_record += s.scoped_barriers_side - sides;
                tally.side_extents_left_out += s.side_record_extents_left_out - left_out;
                continue;
            }
            // A barrier: once it returns, everything before it must survive.
            _ => {
                tokio::select! {
                    r = e.flush() => r.map_err(|e| format!("barrier failed: {e}"))?,
                    () = view.frozen() => break,
                }
                *acked = history.len() - 1;
                tally.barriers_acknowledged += 1;
                if rng.chance(20) {
                    // Room for the collector and the quiet checkpoint to run.
                    tokio::time::sleep(Duration::from_millis(rng.below(25))).await;
                }
                continue;
            }
        }
        history.push(next);
        tally.mutations += 1;
        if rng.chance(10) {
            let now = tokio::select! {
                now = observe(&e) => now,
                () = view.frozen() => break,
            };
            if now != *history.last().expect("never empty") {
                return Err("a read differs from what was just written".into());
            }
        }
    }
    let stats = e.stats();
    tally.checkpoints += stats.checkpoints_written;
    tally.log_objects_deleted += stats.log_objects_deleted;
    tally.extents_moved +=
        stats.extents_repacked + stats.extents_defragmented + stats.extents_resealed;
    tally.bottom_parts_merged += stats.bottom_parts_merged;
    tally.bottom_sweeps_finished += stats.bottom_sweeps_finished;
    tally.delta_runs_merged += stats.delta_runs_merged;
    // Killed here if not frozen yet: whatever was in flight may still land.
    view.freeze();
    Ok(())
}

/// Runs one seeded schedule; the error says what broke.
fn run_seed(seed: u64, tally: &mut Tally) -> Result<(), String> {
    let mut rng = Rng(seed);
    let store: SharedBucket = open_url("memory://", &Vec::new()).expect("memory store");
    let mut expected = Expected {
        history: vec![Model::empty()],
        acked: 0,
        pins: BTreeMap::new(),
        scoped: vec![0; INODES as usize],
        shared: vec![Vec::new(); INODES as usize],
        cut_off: None,
    };
    // Kept for every life of the seed, and removed when this returns (or panics).
    let journal = (seed % 2 == 1).then(|| {
        tempfile::TempDir::with_prefix(format!("bucketfs-crash-journal-{seed}-"))
            .expect("the temporary directory is writable")
    });
    for life in 0..=LIVES {
        let last = life == LIVES;
        let plan = (!last).then(|| FreezePlan {
            // A fifth of the processes die while opening or just after.
            at_put: if rng.chance(20) {
                rng.below(3)
            } else {
                rng.below(40)
            },
            land_max: rng.below(3) as u32,
            seed: rng.next(),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let tasks = TaskSet::default();
        let outcome = rt.block_on(live(
            &store,
            journal.as_ref().map(|dir| (dir.path(), seed % 4 == 1)),
            &mut rng,
            plan,
            tasks.clone(),
            &mut expected,
            tally,
        ));
        tally.crashes += u64::from(!last);
        // The crash: every task of the process stops where it is.
        rt.block_on(tasks.stop_all());
        rt.shutdown_timeout(Duration::from_secs(10));
        outcome.map_err(|why| format!("seed {seed}, life {life}: {why}"))?;
    }
    Ok(())
}

fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("BUCKETFS_CRASH_SEED") {
        return seed..seed + 1;
    }
    let first = var("BUCKETFS_CRASH_FIRST_SEED").unwrap_or(1);
    first..first + var("BUCKETFS_CRASH_SEEDS").unwrap_or(CRASH_SEEDS_DEFAULT)
}

#[test]
fn every_crash_leaves_a_prefix_that_holds_every_acknowledged_barrier() {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let count = seeds.end - seeds.start;
    let mut tally = Tally::default();
    let failures: Vec<String> = seeds
        .filter_map(|seed| run_seed(seed, &mut tally).err())
        .collect();
    eprintln!(
        "crash test: {count} seeds, {} failed, {:.1} s; {tally:?}",
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The schedules must reach what they are meant to crash.
    assert!(tally.barriers_acknowledged > 0 && tally.crashes_while_opening > 0);
    if count >= 20 {
        assert!(
            tally.checkpoints > 0
                && tally.log_objects_deleted > 0
                && tally.extents_moved > 0
                && tally.conflicts > 0
                && tally.pins_checked > 0
                && tally.scoped_by_side_record > 0
                && tally.shared_txns > 0,
            "{tally:?}"
        );
    }
}
