//! The files half of `bench/metadata`: the metadata of N files in a `file://` bucket, as the
//! filesystem core keys it (an inode record and a directory entry per file, 1,000 files per
//! directory), without the filesystem of issue 35 around it.
//!
//!   files_metadata fill DIR N    commits N files in transactions of 1,000, then closes
//!   files_metadata open DIR      opens the bucket, then times lookups and directory pages
//!
//! Each prints one JSON line with its timings and the process's peak RSS (VmHWM).

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions, KdfCost, KvChange};
use std::time::Instant;

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
    let mut at = 0;
    while at < files {
        let end = (at + FILES_PER_COMMIT).min(files);
        let mut changes = Vec::with_capacity(2 * (end - at) as usize);
        for i in at..end {
            let (ino, parent, name) = file_of(i);
            changes.push(KvChange::Put(inode_key(ino), inode_value(ino)));
            changes.push(KvChange::Put(
                dirent_key(parent, &name),
                ino.to_be_bytes().to_vec(),
            ));
        }
        e.kv_commit(changes).expect("commit");
        at = end;
        if at % FILES_PER_FLUSH == 0 || at == files {
            e.flush().await.expect("flush");
        }
    }
    e.close().await.expect("close");
    let s = e.stats();
    println!(
        "{{\"phase\":\"fill\",\"files\":{files},\"seconds\":{:.1},\"checkpoints\":{},\"checkpoint_bytes\":{},\"barriers_held\":{},\"peak_rss_mib\":{}}}",
        started.elapsed().as_secs_f64(),
        s.checkpoints_written,
        s.checkpoint_bytes_written,
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
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % files
    };
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
        _ => {
            eprintln!("usage: files_metadata fill|open DIR FILES");
            std::process::exit(2);
        }
    }
}
