//! The filesystem core against a real engine over `memory://`, with crashes that stop every
//! task of the engine and reopen the bucket.

use super::*;
use crate::inode::{S_IFIFO, S_IFREG, S_ISGID, S_ISVTX};
use bucketfs_engine::bucket::{open_url, SharedBucket};
use bucketfs_engine::{EngineOptions, TaskSet};
use std::sync::Arc;

/// Opens the filesystem as a new process would; returns the tasks its engine starts.
async fn open(bucket: &SharedBucket) -> (Fs, TaskSet) {
    let opts = EngineOptions::for_tests("pw");
    let tasks = opts.tasks.clone();
    let engine = Engine::open(bucket.clone(), opts).await.unwrap();
    (Fs::open(engine).await.unwrap(), tasks)
}

/// Stops the process: every task its engine started, then the engine.
async fn crash(fs: Fs, tasks: TaskSet) {
    drop(fs);
    tasks.stop_all().await;
}

fn memory() -> SharedBucket {
    open_url("memory://", &Vec::new()).unwrap()
}

fn root() -> Caller {
    Caller::root()
}

async fn names(fs: &Fs, dir: u64) -> Vec<String> {
    let mut out: Vec<String> = fs
        .readdir(&root(), dir, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    out.sort();
    out
}

async fn mkdir(fs: &Fs, c: &Caller, parent: u64, name: &str, mode: u32) -> Inode {
    fs.make(c, parent, name.as_bytes(), S_IFDIR | mode, 0)
        .await
        .unwrap()
}

async fn create(fs: &Fs, c: &Caller, parent: u64, name: &str) -> Inode {
    fs.make(c, parent, name.as_bytes(), S_IFREG | 0o644, 0)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_devices_are_created_resized_and_deleted_durably() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let d = fs.create_block_device("disk1", 1 << 20).await.unwrap();
    assert!(matches!(
        fs.create_block_device("disk1", 1).await,
        Err(FsError::Exists(_))
    ));
    assert!(matches!(
        fs.create_block_device("a/b", 1).await,
        Err(FsError::InvalidName(_))
    ));
    fs.write(d.ino, 100_000, &[7; 5000]).await.unwrap();
    assert!(matches!(
        fs.write(d.ino, (1 << 20) - 10, &[1; 11]).await,
        Err(FsError::OutOfRange { .. })
    ));
    fs.resize_block_device("disk1", 102_000).await.unwrap();
    fs.resize_block_device("disk1", 1 << 20).await.unwrap();
    let back = fs.read(d.ino, 100_000, 5000).await.unwrap();
    assert_eq!(&back[..2000], &[7; 2000][..]);
    assert_eq!(
        &back[2000..],
        &[0; 3000][..],
        "bytes cut by a shrink read as zeroes after growing"
    );
    fs.create_block_device("disk2", 4096).await.unwrap();
    crash(fs, tasks).await;
    let (fs, tasks) = open(&bucket).await;
    let names: Vec<_> = fs
        .block_devices()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.name, d.size_bytes))
        .collect();
    assert_eq!(
        names,
        vec![("disk1".to_string(), 1 << 20), ("disk2".to_string(), 4096)]
    );
    fs.delete_block_device("disk1").await.unwrap();
    assert!(matches!(
        fs.block_device("disk1").await,
        Err(FsError::NotFound(_))
    ));
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert_eq!(fs.block_devices().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_changes_survive_a_crash_with_their_link_counts() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let r = root();
    let a = mkdir(&fs, &r, ROOT_INO, "a", 0o755).await;
    let b = mkdir(&fs, &r, ROOT_INO, "b", 0o755).await;
    let f = create(&fs, &r, a.ino, "f").await;
    fs.link(&r, f.ino, b.ino, b"hard").await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().nlink, 2);
    let l = fs.symlink(&r, a.ino, b"l", b"../b/hard").await.unwrap();
    assert_eq!(fs.readlink(l.ino).await.unwrap(), b"../b/hard");
    let p = fs
        .make(&r, a.ino, b"pipe", S_IFIFO | 0o600, 0)
        .await
        .unwrap();
    assert_eq!(p.kind(), Kind::Fifo);
    let name = vec![0xfe; NAME_BYTES_MAX];
    create(&fs, &r, a.ino, std::str::from_utf8(b"x").unwrap()).await;
    fs.make(&r, a.ino, &name, S_IFREG | 0o600, 0).await.unwrap();
    assert!(matches!(
        fs.make(&r, a.ino, &vec![b'n'; 256], S_IFREG, 0).await,
        Err(FsError::InvalidName(_))
    ));
    assert_eq!(
        fs.make(&r, a.ino, b"f", S_IFREG | 0o644, 0)
            .await
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    // A directory moves under b: a's and b's link counts follow, `..` names b.
    let sub = mkdir(&fs, &r, a.ino, "sub", 0o755).await;
    assert_eq!(fs.getattr(a.ino).await.unwrap().nlink, 3);
    fs.rename(&r, a.ino, b"sub", b.ino, b"moved", RenameFlags::default())
        .await
        .unwrap();
    assert_eq!(fs.getattr(a.ino).await.unwrap().nlink, 2);
    assert_eq!(fs.getattr(b.ino).await.unwrap().nlink, 3);
    assert_eq!(fs.lookup(&r, sub.ino, b"..").await.unwrap().ino, b.ino);
    // Not into its own subtree.
    let err = fs
        .rename(&r, ROOT_INO, b"b", sub.ino, b"loop", RenameFlags::default())
        .await
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    fs.unlink(&r, a.ino, b"f").await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().nlink, 1);
    assert_eq!(
        fs.unlink(&r, ROOT_INO, b"a").await.unwrap_err().errno(),
        libc::EISDIR
    );
    assert_eq!(
        fs.rmdir(&r, ROOT_INO, b"a").await.unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    assert_eq!(
        fs.rmdir(&r, a.ino, b"x").await.unwrap_err().errno(),
        libc::ENOTDIR
    );
    fs.sync().await.unwrap();
    crash(fs, tasks).await;

    let (fs, tasks) = open(&bucket).await;
    assert_eq!(names(&fs, a.ino).await, {
        let mut v = vec![
            ".".to_string(),
            "..".into(),
            "l".into(),
            "pipe".into(),
            "x".into(),
            String::from_utf8_lossy(&name).into_owned(),
        ];
        v.sort();
        v
    });
    assert_eq!(names(&fs, b.ino).await, [".", "..", "hard", "moved"]);
    assert_eq!(fs.getattr(b.ino).await.unwrap().nlink, 3);
    fs.unlink(&r, b.ino, b"hard").await.unwrap();
    assert!(matches!(fs.getattr(f.ino).await, Err(FsError::NotFound(_))));
    fs.rmdir(&r, b.ino, b"moved").await.unwrap();
    assert_eq!(fs.getattr(b.ino).await.unwrap().nlink, 2);
    fs.sync().await.unwrap();
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert_eq!(names(&fs, b.ino).await, [".", ".."]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_replaces_refuses_and_exchanges() {
    let bucket = memory();
    let (fs, _tasks) = open(&bucket).await;
    let r = root();
    let d = mkdir(&fs, &r, ROOT_INO, "d", 0o755).await;
    let one = create(&fs, &r, d.ino, "one").await;
    let two = create(&fs, &r, d.ino, "two").await;
    let e1 = mkdir(&fs, &r, d.ino, "e1", 0o755).await;
    let e2 = mkdir(&fs, &r, d.ino, "e2", 0o755).await;
    let none = RenameFlags::default();
    let no_replace = RenameFlags {
        no_replace: true,
        ..none
    };
    let exchange = RenameFlags {
        exchange: true,
        ..none
    };
    assert_eq!(
        fs.rename(&r, d.ino, b"one", d.ino, b"two", no_replace)
            .await
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    fs.rename(&r, d.ino, b"one", d.ino, b"two", exchange)
        .await
        .unwrap();
    assert_eq!(fs.lookup(&r, d.ino, b"two").await.unwrap().ino, one.ino);
    assert_eq!(fs.lookup(&r, d.ino, b"one").await.unwrap().ino, two.ino);
    // Over a file: the replaced inode is gone.
    fs.rename(&r, d.ino, b"one", d.ino, b"two", none)
        .await
        .unwrap();
    assert!(matches!(
        fs.getattr(one.ino).await,
        Err(FsError::NotFound(_))
    ));
    assert_eq!(fs.lookup(&r, d.ino, b"two").await.unwrap().ino, two.ino);
    // A file over a directory, a directory over a file, over a non-empty directory.
    assert_eq!(
        fs.rename(&r, d.ino, b"two", d.ino, b"e1", none)
            .await
            .unwrap_err()
            .errno(),
        libc::EISDIR
    );
    assert_eq!(
        fs.rename(&r, d.ino, b"e1", d.ino, b"two", none)
            .await
            .unwrap_err()
            .errno(),
        libc::ENOTDIR
    );
    create(&fs, &r, e2.ino, "inside").await;
    assert_eq!(
        fs.rename(&r, d.ino, b"e1", d.ino, b"e2", none)
            .await
            .unwrap_err()
            .errno(),
        libc::ENOTEMPTY
    );
    // Over an empty directory: the parent loses a link.
    assert_eq!(fs.getattr(d.ino).await.unwrap().nlink, 4);
    fs.rename(&r, d.ino, b"e2", d.ino, b"e1", none)
        .await
        .unwrap();
    assert!(matches!(
        fs.getattr(e1.ino).await,
        Err(FsError::NotFound(_))
    ));
    assert_eq!(fs.getattr(d.ino).await.unwrap().nlink, 3);
    // Exchange across directories: a directory and a file swap parents.
    fs.rename(&r, d.ino, b"e1", ROOT_INO, b"d", exchange)
        .await
        .unwrap_err();
    let top = create(&fs, &r, ROOT_INO, "top").await;
    fs.rename(&r, d.ino, b"e1", ROOT_INO, b"top", exchange)
        .await
        .unwrap();
    assert_eq!(fs.lookup(&r, ROOT_INO, b"top").await.unwrap().ino, e2.ino);
    assert_eq!(fs.lookup(&r, d.ino, b"e1").await.unwrap().ino, top.ino);
    assert_eq!(fs.lookup(&r, e2.ino, b"..").await.unwrap().ino, ROOT_INO);
    assert_eq!(fs.getattr(d.ino).await.unwrap().nlink, 2);
    assert_eq!(
        fs.rename(&r, d.ino, b"nothing", d.ino, b"x", none)
            .await
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_sticky_and_setgid_directories() {
    let bucket = memory();
    let (fs, _tasks) = open(&bucket).await;
    let r = root();
    let alice = Caller::user(1000, 1000);
    let mut bob = Caller::user(1001, 1001);
    bob.groups.push(50);
    let tmp = mkdir(&fs, &r, ROOT_INO, "tmp", 0o777 | S_ISVTX).await;
    let private = mkdir(&fs, &r, ROOT_INO, "private", 0o755).await;
    assert_eq!(
        fs.make(&alice, private.ino, b"f", S_IFREG | 0o644, 0)
            .await
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
    let af = create(&fs, &alice, tmp.ino, "alice").await;
    assert_eq!((af.uid, af.gid), (1000, 1000));
    assert_eq!(
        fs.unlink(&bob, tmp.ino, b"alice")
            .await
            .unwrap_err()
            .errno(),
        libc::EPERM,
        "the sticky bit keeps bob from deleting alice's file"
    );
    fs.unlink(&alice, tmp.ino, b"alice").await.unwrap();
    // A setgid directory hands down its group, and its bit to subdirectories.
    let shared = mkdir(&fs, &r, ROOT_INO, "shared", 0o777).await;
    fs.setattr(
        &r,
        shared.ino,
        &SetAttr {
            gid: Some(50),
            mode: Some(0o2777),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    let f = create(&fs, &alice, shared.ino, "f").await;
    assert_eq!(f.gid, 50);
    let sub = mkdir(&fs, &alice, shared.ino, "sub", 0o755).await;
    assert_eq!((sub.gid, sub.mode & S_ISGID), (50, S_ISGID));
    // chmod and chown: the owner, or root; a group the owner belongs to.
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&bob, f.ino, &chmod).await.unwrap_err().errno(),
        libc::EPERM
    );
    fs.setattr(&alice, f.ino, &chmod).await.unwrap();
    assert_eq!(
        fs.read_file_as(&bob, f.ino).await.unwrap_err().errno(),
        libc::EACCES
    );
    let give = SetAttr {
        uid: Some(1001),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&alice, f.ino, &give).await.unwrap_err().errno(),
        libc::EPERM
    );
    fs.setattr(&r, f.ino, &give).await.unwrap();
    let to_group = SetAttr {
        gid: Some(50),
        ..SetAttr::default()
    };
    fs.setattr(&bob, f.ino, &to_group).await.unwrap();
    let to_other = SetAttr {
        gid: Some(1000),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&bob, f.ino, &to_other)
            .await
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    // Lookups need search permission on the directory.
    fs.setattr(
        &r,
        private.ino,
        &SetAttr {
            mode: Some(0o700),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    create(&fs, &r, private.ino, "secret").await;
    assert_eq!(
        fs.lookup(&alice, private.ino, b"secret")
            .await
            .unwrap_err()
            .errno(),
        libc::EACCES
    );
}

/// Set-user-ID and set-group-ID as Linux keeps them: writes and truncates by others than root
/// take them away (the kernel sends a mode that only drops them, which any writer may), and a
/// new file in a setgid directory keeps a set-group-ID bit without group execute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_id_bits_writers_and_setgid_directories() {
    let bucket = memory();
    let (fs, _tasks) = open(&bucket).await;
    let r = root();
    let alice = Caller::user(1000, 1000);
    let mode = |m: u32| SetAttr {
        mode: Some(m),
        ..SetAttr::default()
    };
    let shared = mkdir(&fs, &r, ROOT_INO, "shared", 0o777).await;
    let f = create(&fs, &r, shared.ino, "f").await;
    fs.setattr(&r, f.ino, &mode(0o6777)).await.unwrap();
    fs.write_file(&r, f.ino, 0, b"root", false).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().mode & 0o7777, 0o6777);
    assert_eq!(
        fs.setattr(&alice, f.ino, &mode(0o6666))
            .await
            .unwrap_err()
            .errno(),
        libc::EPERM,
        "a writer other than the owner may only take the set-ID bits away"
    );
    fs.setattr(&alice, f.ino, &mode(0o2777)).await.unwrap();
    fs.write_file(&alice, f.ino, 0, b"alice", false)
        .await
        .unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().mode & 0o7777, 0o777);
    fs.setattr(&r, f.ino, &mode(0o4644)).await.unwrap();
    assert_eq!(
        fs.setattr(&alice, f.ino, &mode(0o644))
            .await
            .unwrap_err()
            .errno(),
        libc::EPERM,
        "without write permission, taking set-user-ID away is a chmod like any other"
    );
    // A truncate through a handle open for writing needs no write permission now.
    fs.setattr(&r, f.ino, &mode(0)).await.unwrap();
    let cut = SetAttr {
        size_bytes: Some(1),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&alice, f.ino, &cut).await.unwrap_err().errno(),
        libc::EACCES
    );
    let through_handle = SetAttr {
        through_writable_handle: true,
        ..cut
    };
    fs.setattr(&alice, f.ino, &through_handle).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().size_bytes, 1);
    // In a setgid directory of a group alice is not in.
    fs.setattr(
        &r,
        shared.ino,
        &SetAttr {
            gid: Some(50),
            mode: Some(0o2777),
            ..SetAttr::default()
        },
    )
    .await
    .unwrap();
    let runs = fs
        .make(&alice, shared.ino, b"runs", S_IFREG | 0o2755, 0)
        .await
        .unwrap();
    let marked = fs
        .make(&alice, shared.ino, b"marked", S_IFREG | 0o2744, 0)
        .await
        .unwrap();
    assert_eq!((runs.gid, runs.mode & 0o7777), (50, 0o755));
    assert_eq!((marked.gid, marked.mode & 0o7777), (50, 0o2744));
}

impl Fs {
    /// A read as `caller` would open the file for reading.
    async fn read_file_as(&self, caller: &Caller, ino: u64) -> Result<Vec<u8>, FsError> {
        caller.check(&self.getattr(ino).await?, MAY_READ)?;
        self.read_file(ino, 0, 1 << 20).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_contents_sizes_holes_and_truncation() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let r = root();
    let f = create(&fs, &r, ROOT_INO, "f").await;
    let after = fs
        .write_file(&r, f.ino, 10_000, b"hello", false)
        .await
        .unwrap();
    assert_eq!(after.size_bytes, 10_005);
    assert_eq!(
        fs.read_file(f.ino, 9_998, 100).await.unwrap(),
        b"\0\0hello",
        "a read stops at the end of the file"
    );
    assert!(fs.read_file(f.ino, 20_000, 10).await.unwrap().is_empty());
    fs.write_file(&r, f.ino, 0, b"!", true).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().size_bytes, 10_006);
    // Beyond 4 GiB.
    let far = 5u64 << 30;
    fs.write_file(&r, f.ino, far, b"far", false).await.unwrap();
    assert_eq!(fs.read_file(f.ino, far, 3).await.unwrap(), b"far");
    assert_eq!(fs.seek(f.ino, 0, true).await.unwrap(), Some(8192));
    assert_eq!(fs.seek(f.ino, 9000, false).await.unwrap(), Some(16_384));
    assert_eq!(
        fs.seek(f.ino, 20_000, true).await.unwrap(),
        Some(far & !8191)
    );
    assert_eq!(fs.seek(f.ino, far + 3, true).await.unwrap(), None);
    // Truncate down inside an extent, then up: the cut bytes read as zeroes.
    let cut = SetAttr {
        size_bytes: Some(10_002),
        ..SetAttr::default()
    };
    fs.setattr(&r, f.ino, &cut).await.unwrap();
    let grow = SetAttr {
        size_bytes: Some(20_000),
        ..SetAttr::default()
    };
    fs.setattr(&r, f.ino, &grow).await.unwrap();
    assert_eq!(fs.read_file(f.ino, 10_000, 6).await.unwrap(), b"he\0\0\0\0");
    assert_eq!(fs.seek(f.ino, 16_384, true).await.unwrap(), None);
    fs.fallocate(f.ino, 8192, 8192, true, true).await.unwrap();
    assert_eq!(fs.read_file(f.ino, 10_000, 6).await.unwrap(), [0; 6]);
    assert_eq!(fs.seek(f.ino, 0, true).await.unwrap(), None);
    fs.fallocate(f.ino, 0, 30_000, false, false).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().size_bytes, 30_000);
    fs.write_file(&r, f.ino, 1, b"durable", false)
        .await
        .unwrap();
    fs.fsync(f.ino).await.unwrap();
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert_eq!(fs.getattr(f.ino).await.unwrap().size_bytes, 30_000);
    assert_eq!(fs.read_file(f.ino, 0, 9).await.unwrap(), b"\0durable\0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_open_file_lives_until_its_last_close_or_the_next_open() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let r = root();
    let f = create(&fs, &r, ROOT_INO, "f").await;
    fs.write_file(&r, f.ino, 0, &[5; 20_000], false)
        .await
        .unwrap();
    fs.open_handle(f.ino).await.unwrap();
    fs.open_handle(f.ino).await.unwrap();
    fs.unlink(&r, ROOT_INO, b"f").await.unwrap();
    assert_eq!(fs.read_file(f.ino, 0, 3).await.unwrap(), [5; 3]);
    fs.release_handle(f.ino).await.unwrap();
    assert_eq!(fs.getattr(f.ino).await.unwrap().nlink, 0);
    fs.release_handle(f.ino).await.unwrap();
    assert!(matches!(fs.getattr(f.ino).await, Err(FsError::NotFound(_))));
    // Open, unlinked, crashed: the next open deletes it.
    let g = create(&fs, &r, ROOT_INO, "g").await;
    fs.write_file(&r, g.ino, 0, &[6; 20_000], false)
        .await
        .unwrap();
    fs.open_handle(g.ino).await.unwrap();
    fs.unlink(&r, ROOT_INO, b"g").await.unwrap();
    fs.sync().await.unwrap();
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert!(matches!(fs.getattr(g.ino).await, Err(FsError::NotFound(_))));
    assert_eq!(
        fs.engine().allocation(g.ino, 0, 20_000).await.unwrap(),
        vec![(20_000, false)],
        "its extents are gone"
    );
    assert!(fs.engine().kv_scan(b"o").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_attributes() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let r = root();
    let alice = Caller::user(1000, 1000);
    let open_to_all = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    fs.setattr(&r, ROOT_INO, &open_to_all).await.unwrap();
    let f = create(&fs, &alice, ROOT_INO, "f").await;
    let set = |c: &Caller, n: &'static [u8], v: Option<&'static [u8]>, m| {
        let fs = &fs;
        let c = c.clone();
        async move { fs.set_xattr(&c, f.ino, n, v, m).await }
    };
    set(&alice, b"user.a", Some(b"1"), XattrMode::Any)
        .await
        .unwrap();
    set(&alice, b"user.b", Some(&[9; 3000]), XattrMode::Create)
        .await
        .unwrap();
    assert_eq!(
        set(&alice, b"user.b", Some(b"x"), XattrMode::Create)
            .await
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    assert_eq!(
        set(&alice, b"user.c", Some(b"x"), XattrMode::Replace)
            .await
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    assert_eq!(
        set(&alice, b"trusted.t", Some(b"x"), XattrMode::Any)
            .await
            .unwrap_err()
            .errno(),
        libc::EPERM
    );
    set(&r, b"trusted.t", Some(b"root's"), XattrMode::Any)
        .await
        .unwrap();
    assert_eq!(
        set(&r, b"system.nfs4_acl", Some(b"x"), XattrMode::Any)
            .await
            .unwrap_err()
            .errno(),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        set(&r, ACL_XATTR_ACCESS, Some(b"x"), XattrMode::Any)
            .await
            .unwrap_err()
            .errno(),
        libc::EINVAL,
        "a malformed ACL"
    );
    assert_eq!(
        fs.list_xattr(&alice, f.ino).await.unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    assert_eq!(fs.list_xattr(&r, f.ino).await.unwrap().len(), 3);
    set(&alice, b"user.a", None, XattrMode::Any).await.unwrap();
    fs.sync().await.unwrap();
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert_eq!(
        fs.get_xattr(&alice, f.ino, b"user.b").await.unwrap(),
        vec![9; 3000]
    );
    assert_eq!(
        fs.get_xattr(&alice, f.ino, b"user.a")
            .await
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    // An unlinked file takes its attributes with it.
    fs.unlink(&r, ROOT_INO, b"f").await.unwrap();
    assert!(fs
        .engine()
        .kv_scan(&keys::xattr_prefix(f.ino))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_pages_are_stable_while_entries_come_and_go() {
    let bucket = memory();
    let (fs, _tasks) = open(&bucket).await;
    let r = root();
    let d = mkdir(&fs, &r, ROOT_INO, "d", 0o755).await;
    for i in 0..300 {
        create(&fs, &r, d.ino, &format!("f{i}")).await;
    }
    // Page through 7 entries at a time while other entries are created and deleted: every
    // entry present throughout is listed exactly once.
    let mut seen = std::collections::HashMap::new();
    let mut after = 0;
    let mut round = 0;
    loop {
        let page = fs.readdir(&r, d.ino, after, 7).await.unwrap();
        let Some(last) = page.last() else { break };
        after = last.cookie;
        for e in page {
            *seen.entry(e.name).or_insert(0) += 1;
        }
        create(&fs, &r, d.ino, &format!("new{round}")).await;
        if round < 100 {
            fs.unlink(&r, d.ino, format!("f{}", 200 + round).as_bytes())
                .await
                .unwrap();
        }
        round += 1;
    }
    for i in 0..200 {
        assert_eq!(seen.get(format!("f{i}").as_bytes()), Some(&1), "f{i}");
    }
    assert!(seen.values().all(|&n| n == 1));
    assert_eq!(seen.get(b".".as_slice()), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_create_and_rename_without_losing_entries() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let fs = Arc::new(fs);
    let r = root();
    let shared = mkdir(&fs, &r, ROOT_INO, "shared", 0o777).await;
    let open_to_all = SetAttr {
        mode: Some(0o777),
        ..SetAttr::default()
    };
    fs.setattr(&r, ROOT_INO, &open_to_all).await.unwrap();
    let mut clients = Vec::new();
    for t in 0..8u32 {
        let fs = fs.clone();
        clients.push(tokio::spawn(async move {
            let me = Caller::user(1000 + t, 1000);
            let own = fs
                .make(
                    &me,
                    ROOT_INO,
                    format!("c{t}").as_bytes(),
                    S_IFDIR | 0o755,
                    0,
                )
                .await;
            let own = match own {
                Ok(i) => i,
                Err(e) => panic!("client {t}: {e}"),
            };
            for i in 0..40 {
                let name = format!("t{t}-{i}");
                fs.make(&me, shared.ino, name.as_bytes(), S_IFREG | 0o644, 0)
                    .await
                    .unwrap();
                fs.make(&me, own.ino, name.as_bytes(), S_IFREG | 0o644, 0)
                    .await
                    .unwrap();
                // Move every other one from the shared directory into its own.
                if i % 2 == 0 {
                    let to = format!("moved-{i}");
                    fs.rename(
                        &me,
                        shared.ino,
                        name.as_bytes(),
                        own.ino,
                        to.as_bytes(),
                        RenameFlags::default(),
                    )
                    .await
                    .unwrap();
                }
            }
            own.ino
        }));
    }
    let mut own = Vec::new();
    for c in clients {
        own.push(c.await.unwrap());
    }
    fs.sync().await.unwrap();
    let fs = Arc::into_inner(fs).expect("the clients are done");
    crash(fs, tasks).await;
    let (fs, _tasks) = open(&bucket).await;
    assert_eq!(names(&fs, shared.ino).await.len(), 2 + 8 * 20);
    for ino in own {
        assert_eq!(names(&fs, ino).await.len(), 2 + 40 + 20);
    }
    assert_eq!(fs.getattr(ROOT_INO).await.unwrap().nlink, 2 + 2 + 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_refuses_allocation_but_never_deletes_or_overwrites() {
    let bucket = memory();
    let (fs, _tasks) = open(&bucket).await;
    let r = root();
    fs.set_quota(Some(64 * 1024));
    assert_eq!(fs.statfs().blocks, 16, "statfs reports the quota");
    let f = create(&fs, &r, ROOT_INO, "f").await;
    fs.write_file(&r, f.ino, 0, &[1; 48 * 1024], false)
        .await
        .unwrap();
    let err = fs
        .write_file(&r, f.ino, 48 * 1024, &[2; 24 * 1024], false)
        .await
        .unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC);
    assert_eq!(
        fs.getattr(f.ino).await.unwrap().size_bytes,
        48 * 1024,
        "nothing written"
    );
    // Overwriting allocated extents, growing sparsely and deleting are allowed when full.
    fs.write_file(&r, f.ino, 0, &[3; 8192], false)
        .await
        .unwrap();
    let grow = SetAttr {
        size_bytes: Some(1 << 30),
        ..SetAttr::default()
    };
    fs.setattr(&r, f.ino, &grow).await.unwrap();
    fs.sync().await.unwrap();
    assert_eq!(fs.statfs().blocks_free, 4, "48 KiB of 64 in use");
    // A delete makes room at once, though its upload is still to come.
    fs.unlink(&r, ROOT_INO, b"f").await.unwrap();
    let g = create(&fs, &r, ROOT_INO, "g").await;
    fs.write_file(&r, g.ino, 0, &[4; 60 * 1024], false)
        .await
        .unwrap();
    fs.set_quota(None);
    fs.write_file(&r, g.ino, 60 * 1024, &[5; 100 * 1024], false)
        .await
        .unwrap();
}

use crate::acl::xattr_of as acl_xattr;

const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// POSIX ACLs: a named user entry grants what the mode alone would not, the mask limits it,
/// chmod moves the mask, only the owner sets an ACL, a directory's default ACL is inherited
/// (umask aside) by files and directories made in it, and all of it survives a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_acls_are_enforced_inherited_and_survive_a_crash() {
    let bucket = memory();
    let (fs, tasks) = open(&bucket).await;
    let r = root();
    let alice = Caller::user(1000, 1000);
    let bob = Caller::user(1001, 1001);
    let d = mkdir(&fs, &r, ROOT_INO, "shared", 0o700).await;
    let to_alice = SetAttr {
        uid: Some(1000),
        gid: Some(1000),
        ..Default::default()
    };
    fs.setattr(&r, d.ino, &to_alice).await.unwrap();
    let f = create(&fs, &alice, d.ino, "f").await;
    fs.setattr(
        &alice,
        f.ino,
        &SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // Bob is nobody to the directory or the file...
    assert!(fs.lookup(&bob, d.ino, b"f").await.is_err());
    // ...until alice names him: r-x on the directory, rw- on the file.
    let dir_acl = acl_xattr(&[
        (USER_OBJ, 7, 0),
        (USER, 5, 1001),
        (GROUP_OBJ, 0, 0),
        (MASK, 5, 0),
        (OTHER, 0, 0),
    ]);
    assert_eq!(
        fs.set_xattr(
            &bob,
            d.ino,
            ACL_XATTR_ACCESS,
            Some(&dir_acl),
            XattrMode::Any
        )
        .await
        .unwrap_err()
        .errno(),
        libc::EPERM,
        "only the owner sets an ACL"
    );
    fs.set_xattr(
        &alice,
        d.ino,
        ACL_XATTR_ACCESS,
        Some(&dir_acl),
        XattrMode::Any,
    )
    .await
    .unwrap();
    let file_acl = acl_xattr(&[
        (USER_OBJ, 6, 0),
        (USER, 6, 1001),
        (GROUP_OBJ, 0, 0),
        (MASK, 6, 0),
        (OTHER, 0, 0),
    ]);
    fs.set_xattr(
        &alice,
        f.ino,
        ACL_XATTR_ACCESS,
        Some(&file_acl),
        XattrMode::Any,
    )
    .await
    .unwrap();
    let got = fs.lookup(&bob, d.ino, b"f").await.unwrap();
    assert_eq!(got.mode & 0o777, 0o660, "the group bits show the mask");
    assert!(bob.may(&got, MAY_READ | MAY_WRITE));
    assert!(
        !Caller::user(1002, 1002).may(&got, MAY_READ),
        "carol is other"
    );
    assert_eq!(
        fs.get_xattr(&bob, f.ino, ACL_XATTR_ACCESS).await.unwrap(),
        acl_xattr(&[
            (USER_OBJ, 6, u32::MAX),
            (USER, 6, 1001),
            (GROUP_OBJ, 0, u32::MAX),
            (MASK, 6, u32::MAX),
            (OTHER, 0, u32::MAX),
        ])
    );
    assert!(fs
        .list_xattr(&bob, f.ino)
        .await
        .unwrap()
        .contains(&ACL_XATTR_ACCESS.to_vec()));
    // chmod 0640 makes the mask r--: bob keeps read, loses write.
    fs.setattr(
        &alice,
        f.ino,
        &SetAttr {
            mode: Some(0o640),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let got = fs.getattr(f.ino).await.unwrap();
    assert!(bob.may(&got, MAY_READ) && !bob.may(&got, MAY_WRITE));
    // A default ACL on a regular file is refused; on the directory it is inherited.
    let default = acl_xattr(&[
        (USER_OBJ, 7, 0),
        (USER, 7, 1001),
        (GROUP_OBJ, 5, 0),
        (MASK, 7, 0),
        (OTHER, 5, 0),
    ]);
    assert_eq!(
        fs.set_xattr(
            &alice,
            f.ino,
            ACL_XATTR_DEFAULT,
            Some(&default),
            XattrMode::Any
        )
        .await
        .unwrap_err()
        .errno(),
        libc::EACCES
    );
    fs.set_xattr(
        &alice,
        d.ino,
        ACL_XATTR_DEFAULT,
        Some(&default),
        XattrMode::Any,
    )
    .await
    .unwrap();
    let new = fs
        .make(&alice, d.ino, b"new", S_IFREG | 0o666, 0)
        .await
        .unwrap();
    assert_eq!(
        new.mode,
        S_IFREG | 0o664,
        "the default ACL, limited by the mode"
    );
    assert!(bob.may(&new, MAY_READ | MAY_WRITE));
    let sub = mkdir(&fs, &alice, d.ino, "sub", 0o777).await;
    assert_eq!(sub.mode & 0o777, 0o775);
    assert!(
        sub.default_acl.is_some(),
        "a subdirectory inherits the default"
    );
    let link = fs.symlink(&alice, d.ino, b"l", b"new").await.unwrap();
    assert!(link.acl.is_none() && link.mode & 0o777 == 0o777);
    assert_eq!(
        fs.set_xattr(
            &alice,
            link.ino,
            ACL_XATTR_ACCESS,
            Some(&default),
            XattrMode::Any
        )
        .await
        .unwrap_err()
        .errno(),
        libc::EOPNOTSUPP,
        "a symlink has no ACL"
    );
    // A minimal access ACL is the mode: nothing is kept.
    fs.set_xattr(
        &r,
        new.ino,
        ACL_XATTR_ACCESS,
        Some(&acl_xattr(&[
            (USER_OBJ, 6, 0),
            (GROUP_OBJ, 4, 0),
            (OTHER, 0, 0),
        ])),
        XattrMode::Any,
    )
    .await
    .unwrap();
    let got = fs.getattr(new.ino).await.unwrap();
    assert_eq!((got.mode & 0o777, got.acl.is_none()), (0o640, true));
    assert_eq!(
        fs.get_xattr(&r, new.ino, ACL_XATTR_ACCESS)
            .await
            .unwrap_err()
            .errno(),
        libc::ENODATA
    );
    fs.sync().await.unwrap();
    crash(fs, tasks).await;

    let (fs, _tasks) = open(&bucket).await;
    let got = fs.lookup(&bob, d.ino, b"f").await.unwrap();
    assert!(bob.may(&got, MAY_READ) && !bob.may(&got, MAY_WRITE));
    assert!(fs.getattr(d.ino).await.unwrap().default_acl.is_some());
    fs.set_xattr(&alice, d.ino, ACL_XATTR_DEFAULT, None, XattrMode::Any)
        .await
        .unwrap();
    let plain = fs
        .make(&alice, d.ino, b"plain", S_IFREG | 0o644, 0)
        .await
        .unwrap();
    assert_eq!((plain.mode & 0o777, plain.acl.is_none()), (0o644, true));
}

/// Opens with every file fsync eligible for a side record (no other data need be on its way).
async fn open_scoped(bucket: &SharedBucket) -> (Fs, TaskSet) {
    let mut opts = EngineOptions::for_tests("pw");
    opts.tuning.scoped_barrier_ahead_bytes_min = 0;
    let tasks = opts.tasks.clone();
    let engine = Engine::open(bucket.clone(), opts).await.unwrap();
    (Fs::open(engine).await.unwrap(), tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_fsync_is_scoped_but_covers_its_new_entry_and_a_directorys_covers_all() {
    let bucket = memory();
    let r = root();
    let (fs, tasks) = open_scoped(&bucket).await;
    let a = create(&fs, &r, ROOT_INO, "a").await;
    fs.write_file(&r, a.ino, 0, b"first", false).await.unwrap();
    // The create changed the directory and the file together: this fsync is the full barrier.
    fs.fsync(a.ino).await.unwrap();
    let b = create(&fs, &r, ROOT_INO, "b").await;
    fs.write_file(&r, b.ino, 0, b"never synced", false)
        .await
        .unwrap();
    fs.write_file(&r, a.ino, 5, b", second", false)
        .await
        .unwrap();
    // Only `a` changed on its own since: a side record, which `b` is not in.
    fs.fsync(a.ino).await.unwrap();
    assert_eq!(fs.engine().stats().scoped_barriers_side, 1);
    crash(fs, tasks).await;

    let (fs, tasks) = open_scoped(&bucket).await;
    let a = fs.lookup(&r, ROOT_INO, b"a").await.unwrap();
    assert_eq!(fs.read_file(a.ino, 0, 100).await.unwrap(), b"first, second");
    assert_eq!(fs.getattr(a.ino).await.unwrap().size_bytes, 13);
    // `b` was created and written before `a`'s last fsync, but nothing covered it.
    assert!(fs.lookup(&r, ROOT_INO, b"b").await.is_err());

    let b = create(&fs, &r, ROOT_INO, "b").await;
    fs.write_file(&r, b.ino, 0, b"synced by the directory", false)
        .await
        .unwrap();
    fs.write_file(&r, a.ino, 13, b", third", false)
        .await
        .unwrap();
    fs.fsync(ROOT_INO).await.unwrap();
    crash(fs, tasks).await;
    let (fs, _tasks) = open_scoped(&bucket).await;
    let b = fs.lookup(&r, ROOT_INO, b"b").await.unwrap();
    assert_eq!(
        fs.read_file(b.ino, 0, 100).await.unwrap(),
        b"synced by the directory"
    );
    assert_eq!(
        fs.read_file(a.ino, 0, 100).await.unwrap(),
        b"first, second, third"
    );
}
