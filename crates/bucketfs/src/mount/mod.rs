//! `bucketfs mount ADDR DIR`: a FUSE filesystem (fuser) that speaks 9P2000.L to any server,
//! bucketfs's or another (diod). Each user that touches the mount is attached as itself (9P's
//! access=user), so the server checks every permission and owns every new file correctly.
//!
//! Fids are kept per (uid, inode): a user's fid for an inode is walked from that user's fid for
//! the inode's parent, by the name the kernel looked it up by. If the connection breaks, the
//! next request reconnects and walks again; open files are reopened (without truncating) on
//! their next read or write. Writes that no fsync covered when the connection broke are
//! reported by the next fsync of their file (write_errors.rs).
//!
//! FUSE's request loop handles one request at a time, so reads, writes and fsyncs leave it:
//! the loop finds the open fid and hands the request to a worker thread, which sends it over
//! the shared connection and replies. A small file's fsync then does not queue behind another
//! process's stream of writes, and concurrent fsyncs reach the server together.

mod fuse_ops;
mod locks;
mod replies;
mod write_errors;

use bucketfs_ninep::client::{Attr, Client, Res, SetAttr};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the kernel may cache, like v9fs's `cache=` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cache {
    /// No page cache (every read and write goes to the server) and no attribute or name
    /// cache: other clients' changes show at once. Shared writable mmap is refused.
    None,
    /// The page cache within an open file, dropped at each open, and attributes and names
    /// trusted for 1 s: other clients' changes show at the next open or within a second.
    Mmap,
    /// The page cache kept across opens and attributes and names trusted for a minute: for a
    /// tree only this mount changes.
    Loose,
}

impl Cache {
    /// How long the kernel may trust attributes and names without asking again.
    fn ttl(self) -> Duration {
        match self {
            Cache::None => Duration::ZERO,
            Cache::Mmap => Duration::from_secs(1),
            Cache::Loose => Duration::from_secs(60),
        }
    }

    /// FOPEN_* flags of every open.
    fn open_flags(self) -> u32 {
        match self {
            Cache::None => fuser::consts::FOPEN_DIRECT_IO,
            Cache::Mmap => 0,
            Cache::Loose => fuser::consts::FOPEN_KEEP_CACHE,
        }
    }
}

/// What `bucketfs mount` is asked for besides the address and the directory.
#[derive(Debug, Clone)]
pub struct Options {
    pub aname: String,
    pub allow_other: bool,
    pub cache: Cache,
}

impl Options {
    /// Applies mount(8)-style `-o` options: `cache=none|mmap|loose`, `aname=PATH`,
    /// `allow_other`; anything else is named in the error.
    pub fn apply(&mut self, list: &str) -> Result<(), String> {
        use clap::ValueEnum;
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some(("cache", v)) => {
                    self.cache = Cache::from_str(v, false).map_err(|_| {
                        format!("-o cache={v}: the cache modes are none, mmap and loose")
                    })?
                }
                Some(("aname", v)) => self.aname = v.to_string(),
                None if opt == "allow_other" => self.allow_other = true,
                _ => {
                    return Err(format!(
                        "-o {opt}: unknown mount option (known: cache=none|mmap|loose, aname=PATH, allow_other)"
                    ))
                }
            }
        }
        Ok(())
    }
}
/// The msize asked of the server.
const MSIZE_BYTES: u32 = 512 * 1024;
/// Bytes asked per Treaddir.
const READDIR_BYTES: u32 = 64 * 1024;
const AT_REMOVEDIR: u32 = 0x200;
/// Open flags passed to Tlopen: access mode, O_TRUNC, O_APPEND (O_CREAT/O_EXCL are the
/// kernel's business, and the others mean nothing to the server).
const OPEN_FLAGS_PASSED: i32 = libc::O_ACCMODE | libc::O_TRUNC | libc::O_APPEND;
/// Threads running reads, writes and fsyncs: enough for every process that waits on the mount
/// at once in the workloads we serve (PostgreSQL's backends, a build's jobs).
const IO_WORKERS: usize = 16;

/// The attribute of a directory's default POSIX ACL.
const ACL_XATTR_DEFAULT: &[u8] = b"system.posix_acl_default";
const CAPS_XATTR: &[u8] = b"security.capability";

struct Node {
    parent: u64,
    name: Vec<u8>,
    lookups: u64,
    /// Whether the directory had a default ACL, and when that was asked (`Mount::create_mode`).
    default_acl: Option<(bool, Instant)>,
    /// When the server last answered that the file has no capabilities (`Mount::no_caps`).
    no_caps: Option<Instant>,
}

struct Handle {
    uid: u32,
    ino: u64,
    /// Flags to reopen with after a reconnection (never O_TRUNC again).
    flags: u32,
    fid: Option<u32>,
}

pub struct Mount {
    addr: String,
    aname: Vec<u8>,
    client: Option<Arc<Client>>,
    /// The server's inode number of the mount's root, which FUSE calls 1.
    root: u64,
    /// What `create_mode` learnt of the root's default ACL (other directories keep it in
    /// their `Node`).
    root_default_acl: Option<(bool, Instant)>,
    root_no_caps: Option<Instant>,
    nodes: HashMap<u64, Node>,
    fids: HashMap<(u32, u64), u32>,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
    write_errors: Arc<Mutex<write_errors::WriteErrors>>,
    workers: Workers,
    lock_users: locks::LockUsers,
    cache: Cache,
}

impl Mount {
    pub fn connect(addr: &str, aname: &str, cache: Cache) -> Result<Mount, String> {
        let client =
            Client::connect(addr, MSIZE_BYTES).map_err(|e| format!("cannot reach {addr}: {e}"))?;
        let uid = unsafe { libc::geteuid() };
        let (fid, qid) = client.attach(uid, aname.as_bytes()).map_err(|errno| {
            format!(
                "attach to {addr} as uid {uid}, aname {aname:?}: {}",
                std::io::Error::from_raw_os_error(errno)
            )
        })?;
        let mut m = Mount {
            addr: addr.to_string(),
            aname: aname.as_bytes().to_vec(),
            client: Some(Arc::new(client)),
            root: qid.path,
            root_default_acl: None,
            root_no_caps: None,
            nodes: HashMap::new(),
            fids: HashMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
            write_errors: Default::default(),
            workers: Workers::new(IO_WORKERS),
            lock_users: Default::default(),
            cache,
        };
        m.fids.insert((uid, qid.path), fid);
        Ok(m)
    }

    /// FUSE's inode number for a server's, and back: the root is 1 (the server's own 1 takes
    /// the root's number).
    fn to_fuse(&self, ino: u64) -> u64 {
        if ino == self.root {
            fuser::FUSE_ROOT_ID
        } else if ino == fuser::FUSE_ROOT_ID {
            self.root
        } else {
            ino
        }
    }

    fn to_server(&self, ino: u64) -> u64 {
        self.to_fuse(ino)
    }

    /// The connection, made again if it broke (fids of the old one are forgotten).
    fn client(&mut self) -> Res<Arc<Client>> {
        if self.client.is_none() {
            let c = Client::connect(&self.addr, MSIZE_BYTES).map_err(|e| {
                tracing::warn!(addr = %self.addr, error = %e, "cannot reconnect to the 9P server");
                libc::EIO
            })?;
            tracing::info!(addr = %self.addr, "reconnected to the 9P server");
            self.client = Some(Arc::new(c));
        }
        Ok(self.client.clone().expect("connected above"))
    }

    /// Runs a request; a broken connection is dropped so that the next request reconnects.
    fn call<T>(&mut self, f: impl FnOnce(&Client) -> Res<T>) -> Res<T> {
        let c = self.client()?;
        let r = f(&c);
        if matches!(r, Err(libc::EIO)) && c.is_broken() {
            self.drop_connection();
        }
        r
    }

    /// Forgets the connection and every fid of it; writes not yet fsynced may be lost.
    fn drop_connection(&mut self) {
        self.client = None;
        self.fids.clear();
        for h in self.handles.values_mut() {
            h.fid = None;
        }
        self.write_errors
            .lock()
            .expect("write errors lock")
            .connection_lost();
    }

    /// Notices a server that hung up since the last request (a restart), before any fid of
    /// the old connection is used: the next request connects again and walks afresh.
    fn check_connection(&mut self) {
        if self.client.as_ref().is_some_and(|c| c.is_broken()) {
            tracing::warn!(addr = %self.addr, "the 9P server closed the connection");
            self.drop_connection();
        }
    }

    /// `uid`'s fid for the server inode `ino`.
    fn fid(&mut self, uid: u32, ino: u64) -> Res<u32> {
        self.check_connection();
        if let Some(&f) = self.fids.get(&(uid, ino)) {
            return Ok(f);
        }
        let fid = if ino == self.root {
            let aname = self.aname.clone();
            self.call(|c| c.attach(uid, &aname))?.0
        } else {
            let (parent, name) = match self.nodes.get(&ino) {
                Some(n) => (n.parent, n.name.clone()),
                None => return Err(libc::ESTALE),
            };
            let pfid = self.fid(uid, parent)?;
            self.call(|c| c.walk(pfid, &[&name]))?.0
        };
        self.fids.insert((uid, ino), fid);
        Ok(fid)
    }

    /// Looks `name` up in `parent` as `uid` and remembers the inode (one more kernel lookup).
    fn lookup_as(&mut self, uid: u32, parent: u64, name: &[u8]) -> Res<FileAttr> {
        let pfid = self.fid(uid, parent)?;
        let (fid, _) = self.call(|c| c.walk(pfid, &[name]))?;
        let attr = match self.call(|c| c.getattr(fid)) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.call(|c| c.clunk(fid));
                return Err(e);
            }
        };
        let ino = attr.qid.path;
        let node = self.nodes.entry(ino).or_insert(Node {
            parent,
            name: name.to_vec(),
            lookups: 0,
            default_acl: None,
            no_caps: None,
        });
        node.lookups += 1;
        node.parent = parent;
        node.name = name.to_vec();
        if let Some(old) = self.fids.insert((uid, ino), fid) {
            if old != fid {
                let _ = self.call(|c| c.clunk(old));
            }
        }
        Ok(self.file_attr(&attr))
    }

    /// The mode to create an entry of directory `dir` (server inode, open as `dfid`) with:
    /// the kernel leaves the umask to us (FUSE_DONT_MASK), and POSIX applies it only where
    /// the directory has no default ACL; where it has one, the server applies the ACL instead.
    /// Whether it has one is asked of the server, and trusted as long as attributes are.
    fn create_mode(&mut self, dir: u64, dfid: u32, mode: u32, umask: u32) -> u32 {
        if mode & umask & 0o777 == 0 {
            return mode;
        }
        let ttl = self.cache.ttl();
        let known = self
            .default_acl_slot(dir)
            .and_then(|slot| *slot)
            .filter(|(_, at)| at.elapsed() < ttl)
            .map(|(has, _)| has);
        let has = match known {
            Some(has) => has,
            None => {
                let has = self
                    .call(|c| c.xattr_get(dfid, ACL_XATTR_DEFAULT))
                    .is_ok_and(|v| !v.is_empty());
                if let Some(slot) = self.default_acl_slot(dir) {
                    *slot = Some((has, Instant::now()));
                }
                has
            }
        };
        if has {
            mode
        } else {
            mode & !umask
        }
    }

    /// Forgets what `create_mode` learnt of `ino`'s default ACL, or `no_caps` of its
    /// capabilities, after this mount changed them.
    fn xattr_changed(&mut self, ino: u64, name: &[u8]) {
        if name == ACL_XATTR_DEFAULT {
            if let Some(slot) = self.default_acl_slot(ino) {
                *slot = None;
            }
        }
        if name == CAPS_XATTR {
            if let Some(slot) = self.no_caps_slot(ino) {
                *slot = None;
            }
        }
    }

    /// The kernel asks for a file's capabilities before every write (to drop them), three
    /// round trips each time, on the thread that takes every request from the kernel. The
    /// answer "none" is trusted as long as attributes are (`Cache::ttl`), as other clients'
    /// changes of attributes are: not at all with `cache=none`.
    fn no_caps(&mut self, ino: u64) -> bool {
        let ttl = self.cache.ttl();
        self.no_caps_slot(ino)
            .and_then(|slot| *slot)
            .is_some_and(|at| at.elapsed() < ttl)
    }

    /// Notes the server's answer to a read of `ino`'s capabilities.
    fn caps_read(&mut self, ino: u64, r: &Res<Vec<u8>>) {
        if let Some(slot) = self.no_caps_slot(ino) {
            *slot = matches!(r, Err(libc::ENODATA)).then(Instant::now);
        }
    }

    fn no_caps_slot(&mut self, ino: u64) -> Option<&mut Option<Instant>> {
        if ino == self.root {
            return Some(&mut self.root_no_caps);
        }
        self.nodes.get_mut(&ino).map(|n| &mut n.no_caps)
    }

    /// Where what is known of directory `ino`'s default ACL is kept, if it is a known one.
    fn default_acl_slot(&mut self, ino: u64) -> Option<&mut Option<(bool, Instant)>> {
        if ino == self.root {
            return Some(&mut self.root_default_acl);
        }
        self.nodes.get_mut(&ino).map(|n| &mut n.default_acl)
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        // Seconds are signed (before 1970: negative), nanoseconds count forward from them.
        let time = |(sec, nsec): (u64, u64)| {
            let nanos = Duration::from_nanos(nsec.min(999_999_999));
            match sec as i64 {
                s if s >= 0 => UNIX_EPOCH + Duration::from_secs(s as u64) + nanos,
                s => UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + nanos,
            }
        };
        let kind = file_type(a.mode);
        FileAttr {
            ino: self.to_fuse(a.qid.path),
            size: a.size,
            blocks: a.blocks,
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: time(a.btime),
            kind,
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink.min(u64::from(u32::MAX)) as u32,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: a.blksize.clamp(512, 1 << 20) as u32,
            flags: 0,
        }
    }

    fn getattr_as(&mut self, uid: u32, ino: u64) -> Res<FileAttr> {
        let fid = self.fid(uid, ino)?;
        let a = self.call(|c| c.getattr(fid))?;
        Ok(self.file_attr(&a))
    }

    /// The open fid of a handle, reopened after a reconnection.
    fn handle_fid(&mut self, fh: u64) -> Res<u32> {
        self.check_connection();
        let (uid, ino, flags, fid) = match self.handles.get(&fh) {
            Some(h) => (h.uid, h.ino, h.flags, h.fid),
            None => return Err(libc::EBADF),
        };
        if let Some(f) = fid {
            return Ok(f);
        }
        let base = self.fid(uid, ino)?;
        let (f, _) = self.call(|c| c.walk(base, &[]))?;
        self.call(|c| c.lopen(f, flags))?;
        if let Some(h) = self.handles.get_mut(&fh) {
            h.fid = Some(f);
        }
        Ok(f)
    }

    fn new_handle(&mut self, uid: u32, ino: u64, flags: u32, fid: u32) -> u64 {
        let fh = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(
            fh,
            Handle {
                uid,
                ino,
                flags: flags & !(libc::O_TRUNC as u32),
                fid: Some(fid),
            },
        );
        let mut w = self.write_errors.lock().expect("write errors lock");
        w.open(fh, ino);
        if flags & libc::O_TRUNC as u32 != 0 {
            w.wrote(ino);
        }
        fh
    }

    fn open_as(&mut self, uid: u32, ino: u64, flags: u32) -> Res<u64> {
        let base = self.fid(uid, ino)?;
        let (f, _) = self.call(|c| c.walk(base, &[]))?;
        if let Err(e) = self.call(|c| c.lopen(f, flags)) {
            let _ = self.call(|c| c.clunk(f));
            return Err(e);
        }
        Ok(self.new_handle(uid, ino, flags, f))
    }

    fn release_handle(&mut self, fh: u64) {
        self.write_errors
            .lock()
            .expect("write errors lock")
            .release(fh);
        if let Some(Handle { fid: Some(f), .. }) = self.handles.remove(&fh) {
            let _ = self.call(|c| c.clunk(f));
        }
    }

    /// The open fid of a handle and the connection it belongs to, for a worker thread.
    fn io_fid(&mut self, fh: u64) -> Res<(Arc<Client>, u32)> {
        let f = self.handle_fid(fh)?;
        Ok((self.client()?, f))
    }

    /// Notes a write or truncate of the open file `fh` (before it is sent: one whose reply a
    /// broken connection lost may or may not have reached the server).
    fn writing(&mut self, fh: u64) {
        if let Some(h) = self.handles.get(&fh) {
            self.write_errors
                .lock()
                .expect("write errors lock")
                .wrote(h.ino);
        }
    }

    /// unlinkat, or on servers without it, Tremove of a walked fid.
    fn remove_as(&mut self, uid: u32, parent: u64, name: &[u8], flags: u32) -> Res<()> {
        let d = self.fid(uid, parent)?;
        match self.call(|c| c.unlinkat(d, name, flags)) {
            Err(libc::EOPNOTSUPP) => {
                let (f, _) = self.call(|c| c.walk(d, &[name]))?;
                self.call(|c| c.remove(f))
            }
            r => r,
        }
    }

    /// After a rename: the moved inode's new name and parent, if the kernel knows it, and no
    /// fid cached for it or below it. Path-based servers (diod) keep a fid's path as it was
    /// walked, so those fids would name the old place; they are walked again when needed.
    fn moved(&mut self, parent: u64, name: &[u8], newparent: u64, newname: &[u8]) {
        let mut moved = Vec::new();
        for (&ino, n) in self.nodes.iter_mut() {
            if n.parent == parent && n.name == name {
                n.parent = newparent;
                n.name = newname.to_vec();
                moved.push(ino);
            }
        }
        if moved.is_empty() {
            return;
        }
        let under = |mut ino: u64, nodes: &HashMap<u64, Node>| {
            for _ in 0..nodes.len() + 1 {
                if moved.contains(&ino) {
                    return true;
                }
                match nodes.get(&ino) {
                    Some(n) if n.parent != ino => ino = n.parent,
                    _ => return false,
                }
            }
            false
        };
        let stale: Vec<((u32, u64), u32)> = self
            .fids
            .iter()
            .filter(|((_, ino), _)| *ino != self.root && under(*ino, &self.nodes))
            .map(|(&k, &f)| (k, f))
            .collect();
        for (key, fid) in stale {
            self.fids.remove(&key);
            let _ = self.call(|c| c.clunk(fid));
        }
    }
}

/// A fixed pool of threads running jobs from a queue; a clone queues to the same threads.
#[derive(Clone)]
struct Workers {
    queue: mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Workers {
    fn new(threads: usize) -> Workers {
        let (queue, jobs) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..threads {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("mount-io-{i}"))
                .spawn(move || loop {
                    let job = jobs.lock().expect("worker queue lock").recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .expect("spawning the mount's I/O threads");
        }
        Workers { queue }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        // The threads live as long as the queue's sender, which is ours.
        let _ = self.queue.send(Box::new(job));
    }
}

/// FUSE's file type for the type bits of a mode (a directory entry's d_type shifted left 12).
fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// Mounts `addr`'s `aname` on `dir` until SIGINT or SIGTERM, then unmounts.
pub async fn mount(addr: &str, dir: &Path, o: &Options) -> Result<(), String> {
    let fs = Mount::connect(addr, &o.aname, o.cache)?;
    let mut options = vec![
        MountOption::FSName(format!("bucketfs:{addr}")),
        MountOption::Subtype("9p".into()),
    ];
    if o.allow_other {
        // The kernel serves cached names and attributes without asking the server, so it must
        // check permissions itself too, or another user could use a path that root's lookup
        // left in its cache. The server checks again on everything it is asked.
        options.push(MountOption::AllowOther);
        options.push(MountOption::DefaultPermissions);
    }
    let session = fuser::spawn_mount2(fs, dir, &options)
        .map_err(|e| format!("mounting on {}: {e}", dir.display()))?;
    tracing::info!(%addr, dir = %dir.display(), "mounted; SIGINT or SIGTERM unmounts");
    // Until a signal, or until the session ends by itself (`umount DIR`).
    let ended = async {
        while !session.guard.is_finished() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        _ = crate::run::wait_for_shutdown() => {}
        _ = ended => {}
    }
    drop(session);
    tracing::info!(dir = %dir.display(), "unmounted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_are_applied_or_named_in_the_error() {
        let mut o = Options {
            aname: "/".into(),
            allow_other: false,
            cache: Cache::Mmap,
        };
        o.apply("cache=none,allow_other,aname=/srv").unwrap();
        assert_eq!(
            (o.cache, o.allow_other, o.aname.as_str()),
            (Cache::None, true, "/srv")
        );
        o.apply("cache=loose").unwrap();
        assert_eq!(o.cache, Cache::Loose);
        let e = o.apply("cache=fscache").unwrap_err();
        assert!(
            e.contains("cache=fscache") && e.contains("none, mmap and loose"),
            "{e}"
        );
        let e = o.apply("rw,noexec").unwrap_err();
        assert!(e.contains("-o rw: unknown mount option"), "{e}");
    }
}
