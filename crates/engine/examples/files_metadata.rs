//! The files half of `bench/metadata`: the metadata of N files in a `file://` bucket, as the
//! filesystem core keys it (an inode record and a directory entry per file, 1,000 files per
//! directory), without the filesystem of issue 35 around it.
//!
//!   files_metadata fill DIR N    commits N files in transactions of 1,000, then closes
//!   files_metadata open DIR N    opens the bucket, then times lookups and directory pages
//!   files_metadata fill-extents DIR N
//!                                commits N pairs shaped as extent pointers (a 17-byte key of
//!                                inode and index, a 16-byte value): a device of N x 8 KiB
//!                                whose pointers carry no data
//!   files_metadata overwrite DIR files|extents N COUNT
//!                                overwrites COUNT random ones of those N, then closes: the
//!                                checkpoint bytes this uploads (merges included) against the
//!                                encoded size of the entries it changed
//!   files_metadata open-extents DIR N
//!                                opens the bucket, then times random lookups
//!   files_metadata writers DIR creates|writes TASKS SECONDS
//!                                TASKS clients creating files or writing 4 KiB blocks, each
//!                                on its own inode: operations per second
//!
//! Each prints one JSON line with its timings and the process's peak RSS (VmHWM).

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions, Expect, Fill, KdfCost, KvChange, Txn};
use std::time::Instant;

/// The server's allocator (crates/bucketfs/src/main.rs), so that the memory measured here is
/// what `bucketfs run` would hold: with glibc's, a 10 M-file fill peaked at 1,117 MiB, with
/// mimalloc at 733 MiB.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FILES_PER_DIRECTORY: u64 = 1000;
const FILES_PER_COMMIT: u64 = 1000;
const FILES_PER_FLUSH: u64 = 10_000;

fn inode_key(ino: u64) -> Vec<u8> {
    let mut k = b"i".to_vec();
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

fn dirent_key(parent: u64, name: &str) -> Vec<u8> {
    let mut k = b"d".to_vec();
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

/// A 45-byte inode record, as issue 35's versioned record is about to be.
fn inode_value(ino: u64) -> Vec<u8> {
    let mut v = vec![1u8];
    for field in [ino, 0o100644, 1000, 4096 * (ino % 7), ino * 1_000_003] {
        v.extend_from_slice(&field.to_le_bytes());
    }
    v.extend_from_slice(&[0; 4]);
    v
}

fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

fn options() -> EngineOptions {
    let mut opts = EngineOptions::for_tests("files-metadata");
    opts.kdf_cost = KdfCost {
        memory_kib: 1024,
        passes: 1,
    };
    opts.metadata_cache_bytes_max = 256 << 20;
    // The defaults of a server, not the small parts tests use.
    opts.tuning.run_part_bytes = bucketfs_engine::Tuning::default().run_part_bytes;
    // A checkpoint every 8 flushes (80,000 files), as a busy filesystem would reach them.
    opts.tuning.log_objects_per_checkpoint_min = 8;
    opts.tuning.log_objects_per_checkpoint_max = 8;
    opts
}

/// Extent-shaped pairs: 131,072 per inode (a 1 GiB file of 8 KiB extents).
fn extent_key(i: u64) -> Vec<u8> {
    let mut k = b"x".to_vec();
    k.extend_from_slice(&(1 + i / 131_072).to_be_bytes());
    k.extend_from_slice(&(i % 131_072).to_be_bytes());
    k
}

/// A pointer's 16 bytes: log object, offset, length; `round` changes it on overwrites.
fn extent_value(i: u64, round: u64) -> Vec<u8> {
    let mut v = (1000 * round + i / 1000).to_le_bytes().to_vec();
    v.extend_from_slice(&((i % 1000) as u32 * 8200).to_le_bytes());
    v.extend_from_slice(&(4000u32 + (i % 97) as u32).to_le_bytes());
    v
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn writer(dir: &str) -> bucketfs_engine::bucket::SharedBucket {
    open_url(&format!("file://{dir}"), &Vec::new()).expect("a directory bucket")
}

/// The size of a put as a run entry: key length u16, key, kind, value length u32, value.
fn encoded_size(k: &[u8], v: &[u8]) -> u64 {
    (2 + k.len() + 1 + 4 + v.len()) as u64
}

/// Commits the changes `of(i)` for i in 0..n, those of 1,000 items per transaction, a flush
/// every 10,000 items. Answers the encoded size of the puts committed.
async fn commit_all(e: &Engine, n: u64, mut of: impl FnMut(u64) -> Vec<KvChange>) -> u64 {
    let mut at = 0;
    let mut encoded = 0;
    while at < n {
        let end = (at + FILES_PER_COMMIT).min(n);
        let changes: Vec<KvChange> = (at..end).flat_map(&mut of).collect();
        for c in &changes {
            if let KvChange::Put(k, v) = c {
                encoded += encoded_size(k, v);
            }
        }
        e.kv_commit(changes).expect("commit");
        at = end;
        if at % FILES_PER_FLUSH == 0 || at == n {
            e.flush().await.expect("flush");
        }
    }
    encoded
}

async fn fill_extents(dir: &str, n: u64) {
    let started = Instant::now();
    let e = Engine::open(writer(dir), options()).await.expect("open");
    let encoded = commit_all(&e, n, |i| {
        vec![KvChange::Put(extent_key(i), extent_value(i, 0))]
    })
    .await;
    e.close().await.expect("close");
    let s = e.stats();
    println!(
        "{{\"phase\":\"fill-extents\",\"extents\":{n},\"seconds\":{:.1},\"checkpoints\":{},\"checkpoint_bytes\":{},\"changed_encoded_bytes\":{encoded},\"ratio\":{:.2},\"peak_rss_mib\":{}}}",
        started.elapsed().as_secs_f64(),
        s.checkpoints_written,
        s.checkpoint_bytes_written,
        s.checkpoint_bytes_written as f64 / encoded.max(1) as f64,
        peak_rss_mib()
    );
}

async fn overwrite(dir: &str, kind: &str, n: u64, count: u64) {
    let started = Instant::now();
    let e = Engine::open(writer(dir), options()).await.expect("open");
    let before = e.stats();
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let mut changed = std::collections::HashSet::new();
    let mut encoded = 0u64;
    commit_all(&e, count, |_| {
        let i = rng.below(n);
        let (k, v) = match kind {
            "files" => {
                let (ino, _, _) = file_of(i);
                let mut v = inode_value(ino);
                v[1] ^= 1;
                (inode_key(ino), v)
            }
            _ => (extent_key(i), extent_value(i, 1)),
        };
        if changed.insert(i) {
            encoded += encoded_size(&k, &v);
        }
        vec![KvChange::Put(k, v)]
    })
    .await;
    e.close().await.expect("close");
    let s = e.stats();
    let uploaded = s.checkpoint_bytes_written - before.checkpoint_bytes_written;
    println!(
        "{{\"phase\":\"overwrite\",\"kind\":\"{kind}\",\"entries\":{n},\"overwrites\":{count},\"changed\":{},\"changed_encoded_bytes\":{encoded},\"checkpoint_bytes\":{uploaded},\"ratio\":{:.2},\"checkpoints\":{},\"bottom_parts_merged\":{},\"bottom_sweeps_finished\":{},\"delta_runs_merged\":{},\"seconds\":{:.1},\"peak_rss_mib\":{}}}",
        changed.len(),
        uploaded as f64 / encoded.max(1) as f64,
        s.checkpoints_written - before.checkpoints_written,
        s.bottom_parts_merged,
        s.bottom_sweeps_finished,
        s.delta_runs_merged,
        started.elapsed().as_secs_f64(),
        peak_rss_mib()
    );
}

/// `tasks` clients, each creating files in its own directory (kind "creates": one transaction
/// per file, conditional on the name being absent, as a create is) or writing 4 KiB blocks at
/// random offsets of its own inode (kind "writes"), a flush every 1,000 operations, for
/// `seconds`. The operations per second against one client show whether clients on different
/// inodes wait for one another.
async fn writers(dir: &str, kind: &str, tasks: u64, seconds: f64) {
    let e = Engine::open(writer(dir), options()).await.expect("open");
    let deadline = Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut clients = Vec::new();
    for t in 0..tasks {
        let e = e.clone();
        let kind = kind.to_string();
        clients.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e3779b97f4a7c15 ^ (t + 1));
            let block = vec![t as u8 + 1; 4096];
            let mut done = 0u64;
            while Instant::now() < deadline {
                if kind == "creates" {
                    let ino = ((t + 1) << 40) + done;
                    let name = format!("file-{done:09}");
                    let mut txn = Txn::new();
                    txn.expect(dirent_key(ino >> 40, &name), Expect::Absent)
                        .put(inode_key(ino), inode_value(ino))
                        .put(dirent_key(ino >> 40, &name), ino.to_be_bytes().to_vec());
                    e.commit(&txn).await.expect("create");
                } else {
                    let offset = rng.below(1 << 18) * 4096;
                    e.write(1000 + t, offset, 4096, Fill::Data(&block))
                        .await
                        .expect("write");
                }
                done += 1;
                if done.is_multiple_of(1000) {
                    e.flush().await.expect("flush");
                }
            }
            done
        }));
    }
    let mut ops = 0;
    for c in clients {
        ops += c.await.expect("a client");
    }
    let elapsed = started.elapsed().as_secs_f64();
    e.close().await.expect("close");
    println!(
        "{{\"phase\":\"writers\",\"kind\":\"{kind}\",\"tasks\":{tasks},\"ops\":{ops},\"seconds\":{elapsed:.1},\"ops_per_s\":{:.0},\"peak_rss_mib\":{}}}",
        ops as f64 / elapsed,
        peak_rss_mib()
    );
}

async fn open_extents(dir: &str, n: u64) {
    let mut opts = options();
    opts.read_only = true;
    let started = Instant::now();
    let e = Engine::open(writer(dir), opts).await.expect("open");
    let open_s = started.elapsed().as_secs_f64();
    let first = Instant::now();
    let i = n / 3;
    assert!(e.kv_get(&extent_key(i)).await.expect("lookup").is_some());
    let first_ms = first.elapsed().as_secs_f64() * 1000.0;
    let rss_open = peak_rss_mib();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let lookups = 2000;
    let started = Instant::now();
    for _ in 0..lookups {
        let i = rng.below(n);
        assert!(
            e.kv_get(&extent_key(i)).await.expect("lookup").is_some(),
            "extent {i}"
        );
    }
    let lookup_us = started.elapsed().as_micros() as f64 / f64::from(lookups);
    let s = e.stats();
    println!(
        "{{\"phase\":\"open-extents\",\"extents\":{n},\"open_s\":{open_s:.2},\"first_lookup_ms\":{first_ms:.1},\"rss_open_mib\":{rss_open},\"lookup_us\":{lookup_us:.0},\"metadata_runs\":{},\"metadata_delta_runs\":{},\"peak_rss_mib\":{}}}",
        s.metadata_runs,
        s.metadata_delta_runs,
        peak_rss_mib()
    );
}

fn file_of(i: u64) -> (u64, u64, String) {
    let ino = 1000 + i;
    let parent = 10 + i / FILES_PER_DIRECTORY;
    (
        ino,
        parent,
        format!("file-{:07}.dat", i % FILES_PER_DIRECTORY),
    )
}

async fn fill(dir: &str, files: u64) {
    let bucket = open_url(&format!("file://{dir}"), &Vec::new()).expect("a directory bucket");
    let started = Instant::now();
    let e = Engine::open(bucket, options()).await.expect("open");
    let encoded = commit_all(&e, files, |i| {
        let (ino, parent, name) = file_of(i);
        vec![
            KvChange::Put(inode_key(ino), inode_value(ino)),
            KvChange::Put(dirent_key(parent, &name), ino.to_be_bytes().to_vec()),
        ]
    })
    .await;
    e.close().await.expect("close");
    let s = e.stats();
    println!(
        "{{\"phase\":\"fill\",\"files\":{files},\"seconds\":{:.1},\"checkpoints\":{},\"checkpoint_bytes\":{},\"changed_encoded_bytes\":{encoded},\"ratio\":{:.2},\"barriers_held\":{},\"peak_rss_mib\":{}}}",
        started.elapsed().as_secs_f64(),
        s.checkpoints_written,
        s.checkpoint_bytes_written,
        s.checkpoint_bytes_written as f64 / encoded.max(1) as f64,
        s.barriers_held_for_checkpoint,
        peak_rss_mib()
    );
}

async fn open(dir: &str, files: u64) {
    let bucket = open_url(&format!("file://{dir}"), &Vec::new()).expect("a directory bucket");
    let mut opts = options();
    opts.read_only = true;
    let started = Instant::now();
    let e = Engine::open(bucket, opts).await.expect("open");
    let open_s = started.elapsed().as_secs_f64();
    let rss_open = peak_rss_mib();
    // Random lookups of a file's directory entry and inode, as a path walk does.
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut next = || rng.below(files);
    let lookups = 2000;
    let started = Instant::now();
    for _ in 0..lookups {
        let (ino, parent, name) = file_of(next());
        let found = e.kv_get(&dirent_key(parent, &name)).await.expect("lookup");
        assert_eq!(found, Some(ino.to_be_bytes().to_vec()), "directory entry");
        let inode = e.kv_get(&inode_key(ino)).await.expect("lookup");
        assert_eq!(inode, Some(inode_value(ino)), "inode of {ino}");
    }
    let lookup_us = started.elapsed().as_micros() as f64 / f64::from(lookups);
    // Directory pages of 100 entries, as readdir asks.
    let pages = 200;
    let started = Instant::now();
    for _ in 0..pages {
        let parent = 10 + next() / FILES_PER_DIRECTORY;
        let prefix = dirent_key(parent, "");
        let end = bucketfs_engine::prefix_end(&prefix);
        let page = e
            .kv_range(&prefix, end.as_deref(), 100)
            .await
            .expect("scan");
        assert_eq!(page.len(), 100, "a page of directory {parent}");
    }
    let page_us = started.elapsed().as_micros() as f64 / f64::from(pages);
    let s = e.stats();
    println!(
        "{{\"phase\":\"open\",\"files\":{files},\"open_s\":{open_s:.2},\"rss_open_mib\":{rss_open},\"lookup_pair_us\":{lookup_us:.0},\"page_of_100_us\":{page_us:.0},\"metadata_runs\":{},\"metadata_cache_mib\":{},\"metadata_memory_mib\":{},\"peak_rss_mib\":{}}}",
        s.metadata_runs,
        s.metadata_cache_bytes >> 20,
        s.metadata_memory_bytes >> 20,
        peak_rss_mib()
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1..).unwrap_or_default() {
        [phase, dir, n] if phase == "fill" => fill(dir, n.parse().expect("a file count")).await,
        [phase, dir, n] if phase == "open" => open(dir, n.parse().expect("a file count")).await,
        [phase, dir, n] if phase == "fill-extents" => {
            fill_extents(dir, n.parse().expect("a count")).await
        }
        [phase, dir, n] if phase == "open-extents" => {
            open_extents(dir, n.parse().expect("a count")).await
        }
        [phase, dir, kind, n, count]
            if phase == "overwrite" && (kind == "files" || kind == "extents") =>
        {
            overwrite(
                dir,
                kind,
                n.parse().expect("a count"),
                count.parse().expect("a count"),
            )
            .await
        }
        [phase, dir, kind, tasks, seconds]
            if phase == "writers" && (kind == "creates" || kind == "writes") =>
        {
            writers(
                dir,
                kind,
                tasks.parse().expect("a task count"),
                seconds.parse().expect("seconds"),
            )
            .await
        }
        _ => {
            eprintln!("usage: files_metadata fill|open DIR FILES | fill-extents|open-extents DIR N | overwrite DIR files|extents N COUNT | writers DIR creates|writes TASKS SECONDS");
            std::process::exit(2);
        }
    }
}
