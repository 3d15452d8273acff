//! Every released bucket format stays readable: a small bucket written by each format version's
//! first build is kept under `tests/compat/format-N/` (a `file://` bucket) and opened by this
//! build, read-only and as a writer. A build that changes the format adds its own fixture
//! (`BUCKETFS_COMPAT_OUT=DIR cargo test -p bucketfs-fs --test compat -- --ignored`) and keeps
//! every older one passing, by reading it or by migrating it on open.

use bucketfs_engine::bucket::{open_url, SharedBucket};
use bucketfs_engine::{Engine, EngineOptions, KdfCost, FORMAT_VERSION};
use bucketfs_fs::Fs;
use std::path::{Path, PathBuf};

const PASSWORD: &str = "compat-fixture";

/// A write that made a fixture: offset, length, pattern seed.
type Write = (u64, u64, u8);

/// The devices of every fixture: name, size, and the writes that made them, in order;
/// everything else reads as zeroes.
const DEVICES: &[(&str, u64, &[Write])] = &[
    (
        "disk1",
        1 << 20,
        &[
            (0, 20_000, 1),
            (300_000, 10_000, 2),
            (1_000_000, 48_576, 3),
            (8_000, 100, 4),
            (290_000, 40_000, 5),
        ],
    ),
    ("disk2", 64 * 1024, &[(0, 64 * 1024, 6), (4096, 8192, 7)]),
];

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i % 253) as u8))
        .collect()
}

fn expected(size: u64, writes: &[Write]) -> Vec<u8> {
    let mut device = vec![0; size as usize];
    for &(offset, len, seed) in writes {
        device[offset as usize..(offset + len) as usize].copy_from_slice(&pattern(seed, len));
    }
    device
}

fn bucket(dir: &Path) -> SharedBucket {
    open_url(&format!("file://{}", dir.display()), &Vec::new()).expect("a directory bucket")
}

fn options(read_only: bool) -> EngineOptions {
    let mut opts = EngineOptions::for_tests(PASSWORD);
    opts.read_only = read_only;
    // Checkpoints after a few log objects, so that a fixture holds both kinds.
    opts.tuning.log_objects_per_checkpoint_min = 3;
    opts.kdf_cost = KdfCost {
        memory_kib: 1024,
        passes: 1,
    };
    opts
}

async fn check_devices(fs: &Fs, fixture: &Path) {
    let found: Vec<(String, u64)> = fs
        .block_devices()
        .await
        .expect("devices list")
        .into_iter()
        .map(|d| (d.name, d.size_bytes))
        .collect();
    let wanted: Vec<(String, u64)> = DEVICES
        .iter()
        .map(|(name, size, _)| (name.to_string(), *size))
        .collect();
    assert_eq!(found, wanted, "{}", fixture.display());
    for (name, size, writes) in DEVICES {
        let d = fs.block_device(name).await.expect("the device exists");
        let bytes = fs.read(d.ino, 0, *size as usize).await.expect("reads");
        assert!(
            bytes == expected(*size, writes),
            "{}: {name} reads back wrong",
            fixture.display()
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("readdir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/compat exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_of_every_released_format_open_and_read_back() {
    let fixtures = fixtures();
    // Every format from the first to this build's has its fixture, so a format change that
    // forgets to add one fails here.
    for format in 1..=FORMAT_VERSION {
        assert!(
            fixtures
                .iter()
                .any(|f| f.ends_with(format!("format-{format}"))),
            "no fixture of format {format} in tests/compat: {fixtures:?}"
        );
    }
    for fixture in fixtures {
        // Removed at the end of each fixture's turn, or when a check panics.
        let scratch = tempfile::TempDir::with_prefix(format!(
            "bucketfs-compat-{}-",
            fixture.file_name().expect("named").to_string_lossy()
        ))
        .expect("the temporary directory is writable");
        let dir = scratch.path();
        copy_dir(&fixture, dir);

        let reader = Engine::open(bucket(dir), options(true))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        check_devices(&Fs::open(reader).await.expect("fs"), &fixture).await;

        // As a writer: opens (migrating if it must), keeps the data, and writes on top.
        let writer = Engine::open(bucket(dir), options(false))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()));
        let fs = Fs::open(writer.clone()).await.expect("fs");
        check_devices(&fs, &fixture).await;
        // Enough barriers for a checkpoint, which migrates the bucket to this build's format.
        let d = fs.block_device("disk2").await.expect("disk2");
        for _ in 0..4 {
            fs.write(d.ino, 0, &pattern(6, 4096)).await.expect("write");
            fs.sync().await.expect("sync");
        }
        for _ in 0..200 {
            if writer.stats().checkpoints_written > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(
            writer.stats().checkpoints_written > 0,
            "a checkpoint was written"
        );
        writer.close().await.expect("close");
        let superblock = std::fs::read_to_string(dir.join("superblock.json")).expect("superblock");
        assert!(
            superblock.contains(&format!("\"format_version\": {FORMAT_VERSION}")),
            "{superblock}"
        );
        drop(fs);
        let reader = Engine::open(bucket(dir), options(true))
            .await
            .expect("reopen");
        check_devices(&Fs::open(reader).await.expect("fs"), &fixture).await;
    }
}

/// Writes the fixture of this build's format into BUCKETFS_COMPAT_OUT (a new directory); check
/// it in as `crates/fs/tests/compat/format-N/` when the format changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes a fixture; run by hand when the bucket format changes"]
async fn write_the_fixture_of_this_format() {
    let out = PathBuf::from(std::env::var("BUCKETFS_COMPAT_OUT").expect("BUCKETFS_COMPAT_OUT"));
    assert!(!out.exists(), "{} exists already", out.display());
    let engine = Engine::open(bucket(&out), options(false))
        .await
        .expect("open");
    let fs = Fs::open(engine.clone()).await.expect("fs");
    fs.create_block_device("disk3", 8192).await.expect("disk3");
    for (name, size, writes) in DEVICES {
        let d = if *name == "disk2" {
            // Grown after creation, as `bucketfs nbd resize` does.
            fs.create_block_device(name, size / 2)
                .await
                .expect("create");
            fs.resize_block_device(name, *size).await.expect("resize");
            fs.block_device(name).await.expect("exists")
        } else {
            fs.create_block_device(name, *size).await.expect("create")
        };
        for &(offset, len, seed) in *writes {
            fs.write(d.ino, offset, &pattern(seed, len))
                .await
                .expect("write");
            fs.sync().await.expect("sync");
        }
    }
    fs.delete_block_device("disk3").await.expect("delete");
    fs.sync().await.expect("sync");
    check_devices(&fs, &out).await;
    engine.close().await.expect("close");
}
