//! The 9P2000.L server against a client of our own at the message level, over an in-memory
//! stream, with the real filesystem core and engine (`memory://` bucket) behind it: every
//! request type, its errors, and malformed input.

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::Fs;
use bucketfs_ninep::Server;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const RLERROR: u8 = 7;

struct Client {
    io: DuplexStream,
    tag: u16,
}

/// A request body under construction.
#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn u8(mut self, v: u8) -> B {
        self.0.push(v);
        self
    }
    fn u16(mut self, v: u16) -> B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(mut self, v: &[u8]) -> B {
        self.0.extend_from_slice(&(v.len() as u16).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
    fn raw(mut self, v: &[u8]) -> B {
        self.0.extend_from_slice(v);
        self
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Client {
    async fn send_frame(&mut self, kind: u8, tag: u16, body: &[u8]) {
        let mut f = ((7 + body.len()) as u32).to_le_bytes().to_vec();
        f.push(kind);
        f.extend_from_slice(&tag.to_le_bytes());
        f.extend_from_slice(body);
        self.io.write_all(&f).await.unwrap();
    }

    async fn recv(&mut self) -> (u8, u16, Vec<u8>) {
        let mut size = [0u8; 4];
        self.io.read_exact(&mut size).await.unwrap();
        let mut rest = vec![0u8; u32::from_le_bytes(size) as usize - 4];
        self.io.read_exact(&mut rest).await.unwrap();
        (
            rest[0],
            u16::from_le_bytes([rest[1], rest[2]]),
            rest[3..].to_vec(),
        )
    }

    /// Sends a request and answers the reply's body, or the errno of an Rlerror.
    async fn call(&mut self, kind: u8, body: B) -> Result<Vec<u8>, i32> {
        self.tag = self.tag.wrapping_add(1) % 0xfff0;
        let tag = self.tag;
        self.send_frame(kind, tag, &body.0).await;
        let (rkind, rtag, b) = self.recv().await;
        assert_eq!(rtag, tag);
        if rkind == RLERROR {
            return Err(u32_at(&b, 0) as i32);
        }
        assert_eq!(rkind, kind + 1, "reply type");
        Ok(b)
    }

    async fn ok(&mut self, kind: u8, body: B) -> Vec<u8> {
        match self.call(kind, body).await {
            Ok(b) => b,
            Err(errno) => panic!("request {kind} failed with errno {errno}"),
        }
    }

    async fn walk(&mut self, fid: u32, newfid: u32, names: &[&[u8]]) -> Result<Vec<u8>, i32> {
        let mut b = B::default().u32(fid).u32(newfid).u16(names.len() as u16);
        for n in names {
            b = b.s(n);
        }
        self.call(110, b).await
    }

    async fn getattr(&mut self, fid: u32) -> Vec<u8> {
        self.ok(24, B::default().u32(fid).u64(0x3fff)).await
    }
}

/// Size and mode of an Rgetattr body.
fn size_and_mode(g: &[u8]) -> (u64, u32) {
    // valid[8] qid[13] mode[4] uid[4] gid[4] nlink[8] rdev[8] size[8]
    (u64_at(g, 8 + 13 + 12 + 16), u32_at(g, 21))
}

async fn start() -> (Client, Arc<Fs>) {
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let engine = Engine::open(bucket, EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    let fs = Arc::new(Fs::open(engine).await.unwrap());
    let server = Server::new(fs.clone());
    let (a, b) = tokio::io::duplex(4 << 20);
    tokio::spawn(server.serve_connection(b));
    let mut c = Client { io: a, tag: 0 };
    let v = c.ok(100, B::default().u32(1 << 30).s(b"9P2000.L")).await;
    assert_eq!(
        u32_at(&v, 0),
        bucketfs_ninep::limits::MSIZE_MAX,
        "msize is clamped"
    );
    (c, fs)
}

async fn attach(c: &mut Client, fid: u32, uid: u32) {
    c.ok(
        104,
        B::default().u32(fid).u32(u32::MAX).s(b"").s(b"").u32(uid),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_directories_links_and_attributes() {
    let (mut c, _fs) = start().await;
    attach(&mut c, 1, 0).await;
    // mkdir, lcreate, write, read, getattr, truncate through setattr, fsync.
    c.ok(72, B::default().u32(1).s(b"dir").u32(0o755).u32(0))
        .await;
    c.walk(1, 2, &[b"dir"]).await.unwrap();
    c.ok(14, B::default().u32(2).s(b"f").u32(2).u32(0o644).u32(0))
        .await;
    let w = c
        .ok(118, B::default().u32(2).u64(5).u32(5).raw(b"hello"))
        .await;
    assert_eq!(u32_at(&w, 0), 5);
    let r = c.ok(116, B::default().u32(2).u64(0).u32(100)).await;
    assert_eq!(&r[4..], b"\0\0\0\0\0hello");
    assert_eq!(size_and_mode(&c.getattr(2).await), (10, 0o100644));
    let setsize = B::default()
        .u32(2)
        .u32(0x8)
        .u32(0)
        .u32(0)
        .u32(0)
        .u64(7)
        .u64(0)
        .u64(0)
        .u64(0)
        .u64(0);
    c.ok(26, setsize).await;
    assert_eq!(size_and_mode(&c.getattr(2).await).0, 7);
    c.ok(50, B::default().u32(2).u32(0)).await;
    c.ok(120, B::default().u32(2)).await;
    // symlink and readlink, mknod, link.
    c.walk(1, 3, &[b"dir"]).await.unwrap();
    c.ok(16, B::default().u32(3).s(b"ln").s(b"f").u32(0)).await;
    c.walk(3, 4, &[b"ln"]).await.unwrap();
    let t = c.ok(22, B::default().u32(4)).await;
    assert_eq!(&t[2..], b"f");
    c.ok(
        18,
        B::default()
            .u32(3)
            .s(b"fifo")
            .u32(0o10600)
            .u32(0)
            .u32(0)
            .u32(0),
    )
    .await;
    c.walk(3, 5, &[b"f"]).await.unwrap();
    c.ok(70, B::default().u32(1).u32(5).s(b"hard")).await;
    let g = c.getattr(5).await;
    assert_eq!(u64_at(&g, 8 + 13 + 12), 2, "nlink after link");
    // renameat, rename (by fid), unlinkat, remove.
    c.ok(74, B::default().u32(3).s(b"fifo").u32(1).s(b"fifo2"))
        .await;
    assert_eq!(c.walk(3, 6, &[b"fifo"]).await, Err(libc::ENOENT));
    c.ok(20, B::default().u32(5).u32(1).s(b"moved")).await;
    c.walk(1, 6, &[b"moved"]).await.unwrap();
    c.ok(76, B::default().u32(1).s(b"hard").u32(0)).await;
    c.ok(122, B::default().u32(6)).await;
    assert_eq!(c.walk(1, 7, &[b"moved"]).await, Err(libc::ENOENT));
    assert_eq!(
        c.call(76, B::default().u32(1).s(b"dir").u32(0x200)).await,
        Err(libc::ENOTEMPTY)
    );
    // A walk whose first name is missing fails; a later one returns the qids found so far.
    let partial = c.walk(1, 8, &[b"dir", b"nothing"]).await.unwrap();
    assert_eq!(u16::from_le_bytes([partial[0], partial[1]]), 1);
    assert_eq!(
        c.call(116, B::default().u32(8).u64(0).u32(1)).await,
        Err(libc::EINVAL)
    );
    // statfs.
    let st = c.ok(8, B::default().u32(1)).await;
    assert_eq!(u32_at(&st, 0), 0x0102_1997);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_pages_hold_every_entry_once() {
    let (mut c, _fs) = start().await;
    attach(&mut c, 1, 0).await;
    for i in 0..120 {
        c.ok(
            72,
            B::default()
                .u32(1)
                .s(format!("d{i}").as_bytes())
                .u32(0o755)
                .u32(0),
        )
        .await;
    }
    c.walk(1, 2, &[]).await.unwrap();
    c.ok(12, B::default().u32(2).u32(0)).await;
    let mut names = std::collections::BTreeSet::new();
    let mut offset = 0;
    loop {
        let r = c.ok(40, B::default().u32(2).u64(offset).u32(300)).await;
        let n = u32_at(&r, 0) as usize;
        if n == 0 {
            break;
        }
        let mut at = 4;
        while at < 4 + n {
            offset = u64_at(&r, at + 13);
            let len = u16::from_le_bytes([r[at + 22], r[at + 23]]) as usize;
            let name = r[at + 24..at + 24 + len].to_vec();
            assert!(names.insert(name), "listed twice");
            at += 24 + len;
        }
    }
    assert_eq!(names.len(), 120 + 3, ". .. .nbd and 120 directories");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xattrs_locks_permissions_and_bad_input() {
    let (mut c, _fs) = start().await;
    attach(&mut c, 1, 0).await;
    // Lcreate turns its fid into the new file's: create through a clone of the root's.
    c.walk(1, 9, &[]).await.unwrap();
    c.ok(14, B::default().u32(9).s(b"f").u32(2).u32(0o600).u32(0))
        .await;
    // Set user.a through xattrcreate + write + clunk, then read it and the list back.
    c.walk(1, 2, &[b"f"]).await.unwrap();
    c.ok(32, B::default().u32(2).s(b"user.a").u64(3).u32(0))
        .await;
    c.ok(118, B::default().u32(2).u64(0).u32(3).raw(b"xyz"))
        .await;
    c.ok(120, B::default().u32(2)).await;
    c.walk(1, 3, &[b"f"]).await.unwrap();
    let size = c.ok(30, B::default().u32(3).u32(4).s(b"user.a")).await;
    assert_eq!(u64_at(&size, 0), 3);
    let v = c.ok(116, B::default().u32(4).u64(0).u32(100)).await;
    assert_eq!(&v[4..], b"xyz");
    c.ok(30, B::default().u32(3).u32(5).s(b"")).await;
    let list = c.ok(116, B::default().u32(5).u64(0).u32(100)).await;
    assert_eq!(&list[4..], b"user.a\0");
    assert_eq!(
        c.call(30, B::default().u32(3).u32(6).s(b"user.none")).await,
        Err(libc::ENODATA)
    );
    // Record locks: a write lock of one process blocks another's.
    let lock = |kind: u8, proc_id: u32| {
        B::default()
            .u32(3)
            .u8(kind)
            .u32(0)
            .u64(0)
            .u64(100)
            .u32(proc_id)
            .s(b"host")
    };
    assert_eq!(c.ok(52, lock(1, 10)).await, [0]);
    assert_eq!(c.ok(52, lock(0, 11)).await, [1], "blocked");
    let getlock = B::default().u32(3).u8(0).u64(0).u64(10).u32(11).s(b"host");
    let held = c.ok(54, getlock).await;
    assert_eq!((held[0], u32_at(&held, 17)), (1, 10));
    assert_eq!(c.ok(52, lock(2, 10)).await, [0]);
    assert_eq!(c.ok(52, lock(0, 11)).await, [0]);
    // Another user: no write to root's directory, no read of a 0600 file.
    attach(&mut c, 20, 4242).await;
    assert_eq!(
        c.call(14, B::default().u32(20).s(b"g").u32(2).u32(0o644).u32(0))
            .await,
        Err(libc::EACCES)
    );
    // Bad input: a truncated request, an unknown type, a name too long; the connection goes on.
    assert_eq!(c.call(110, B::default().u32(1)).await, Err(libc::EINVAL));
    assert_eq!(c.call(99, B::default()).await, Err(libc::EOPNOTSUPP));
    assert_eq!(
        c.call(72, B::default().u32(1).s(&[b'n'; 300]).u32(0o755).u32(0))
            .await,
        Err(libc::ENAMETOOLONG)
    );
    assert_eq!(c.walk(77, 78, &[]).await, Err(libc::EINVAL), "unknown fid");
    // Flush of a tag not in flight answers Rflush.
    c.ok(108, B::default().u16(4242)).await;
    // Flush of a request in flight (an fsync, a barrier): its reply comes before Rflush, or
    // never.
    c.send_frame(50, 900, &B::default().u32(3).u32(0).0).await;
    c.send_frame(108, 901, &B::default().u16(900).0).await;
    let (kind, tag, _) = c.recv().await;
    if (kind, tag) == (51, 900) {
        let (kind, tag, _) = c.recv().await;
        assert_eq!(
            (kind, tag),
            (109, 901),
            "Rflush after the flushed request's reply"
        );
    } else {
        assert_eq!((kind, tag), (109, 901), "Rflush, the fsync cancelled");
    }
    c.getattr(1).await;
    // A frame larger than msize closes the connection.
    c.io.write_all(&(u32::MAX).to_le_bytes()).await.unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(c.io.read(&mut buf).await.unwrap(), 0, "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fsync_makes_writes_durable_across_a_crash() {
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let open = || async {
        let opts = EngineOptions::for_tests("pw");
        let tasks = opts.tasks.clone();
        let engine = Engine::open(bucket.clone(), opts).await.unwrap();
        (Arc::new(Fs::open(engine).await.unwrap()), tasks)
    };
    let (fs, tasks) = open().await;
    let (a, b) = tokio::io::duplex(4 << 20);
    let server = tokio::spawn(Server::new(fs.clone()).serve_connection(b));
    let mut c = Client { io: a, tag: 0 };
    c.ok(100, B::default().u32(65536).s(b"9P2000.L")).await;
    attach(&mut c, 1, 0).await;
    c.walk(1, 2, &[]).await.unwrap();
    c.ok(
        14,
        B::default().u32(2).s(b"synced").u32(2).u32(0o644).u32(0),
    )
    .await;
    c.ok(118, B::default().u32(2).u64(0).u32(6).raw(b"kept!\n"))
        .await;
    c.ok(50, B::default().u32(2).u32(1)).await;
    c.walk(1, 3, &[]).await.unwrap();
    c.ok(
        14,
        B::default().u32(3).s(b"unsynced").u32(2).u32(0o644).u32(0),
    )
    .await;
    c.ok(118, B::default().u32(3).u64(0).u32(4).raw(b"lost"))
        .await;
    // The process dies: every task of its engine stops, nothing more reaches the bucket.
    drop(c);
    server.abort();
    let _ = server.await;
    drop(fs);
    tasks.stop_all().await;
    let (fs, _tasks) = open().await;
    let root = bucketfs_fs::Caller::root();
    let f = fs
        .lookup(&root, bucketfs_fs::ROOT_INO, b"synced")
        .await
        .unwrap();
    assert_eq!(fs.read_file(f.ino, 0, 100).await.unwrap(), b"kept!\n");
    // What came after the fsync may or may not have reached the bucket, but only whole: a
    // prefix of the transactions (create, then write).
    if let Ok(u) = fs.lookup(&root, bucketfs_fs::ROOT_INO, b"unsynced").await {
        let data = fs.read_file(u.ino, 0, 100).await.unwrap();
        assert!(data.is_empty() || data == b"lost", "{data:?}");
    }
}
