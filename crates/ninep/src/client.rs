//! A blocking 9P2000.L client over TCP or a unix socket that many threads share: each call
//! sends its request under a fresh tag and waits for its own reply, which a reader thread
//! hands over, so one slow request (an fsync) does not hold up the others. Writes and fsyncs
//! can also be sent without waiting (`Client::sending`): the reader thread then runs the
//! caller's function with the reply, which spares a thread hand-over on each way. Every
//! failure is an errno: the server's (Rlerror), or EIO once the connection is broken.

use crate::wire::{Qid, HEADER_BYTES, P9_NOFID, TLERROR_RLERROR};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, TryLockError};

/// A result whose error is a Linux errno.
pub type Res<T> = Result<T, i32>;

/// Tversion's tag (NOTAG); the others are taken from below TAG_LIMIT.
const NOTAG: u16 = 0xffff;
const TAG_LIMIT: u16 = 0xfff0;
const TVERSION: u8 = 100;

/// What Rgetattr answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attr {
    pub qid: Qid,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u64,
    pub blocks: u64,
    pub atime: (u64, u64),
    pub mtime: (u64, u64),
    pub ctime: (u64, u64),
    pub btime: (u64, u64),
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub qid: Qid,
    /// Where the next readdir resumes after this entry.
    pub offset: u64,
    pub kind: u8,
    pub name: Vec<u8>,
}

/// What Rstatfs answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatFs {
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}

/// Who holds a record lock: 9P names the process and the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOwner {
    pub proc_id: u32,
    pub client_id: Vec<u8>,
}

/// What Rgetlock answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub kind: u8,
    pub start: u64,
    /// 0: to the end of the file.
    pub length: u64,
    pub owner: LockOwner,
}

/// Tsetattr's fields; `valid` says which apply (P9_SETATTR_* bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: (u64, u64),
    pub mtime: (u64, u64),
}

enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(Shutdown::Both),
            Socket::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Socket {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(b),
            Socket::Unix(s) => s.read(b),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(b),
            Socket::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reply: its message type and body.
type Reply = (u8, Vec<u8>);

/// A function the reader thread runs with a request's reply, or with the error that broke the
/// connection.
type Then = Box<dyn FnOnce(io::Result<Reply>) + Send>;

/// Who takes a reply.
enum Waiter {
    /// A caller blocked on its channel; dropping the sender wakes it with an error.
    Caller(mpsc::SyncSender<Reply>),
    /// A caller that went on; the reader thread runs its function.
    Then(Then),
}

/// What the callers and the reader thread share.
struct Shared {
    /// Requests waiting for their replies, by tag. Emptied when the connection breaks, which
    /// wakes every caller and runs every function with the error.
    waiting: Mutex<HashMap<u16, Waiter>>,
    broken: AtomicBool,
}

impl Shared {
    fn break_off(&self) {
        self.broken.store(true, Ordering::SeqCst);
        let waiting: Vec<Waiter> = {
            let mut w = self.waiting.lock().expect("client lock");
            w.drain().map(|(_, waiter)| waiter).collect()
        };
        // Outside the lock: a function may hand its work to another thread.
        for waiter in waiting {
            if let Waiter::Then(then) = waiter {
                then(Err(io::ErrorKind::BrokenPipe.into()));
            }
        }
    }

    fn deliver(waiter: Waiter, reply: Reply) {
        match waiter {
            Waiter::Caller(tx) => {
                let _ = tx.send(reply);
            }
            Waiter::Then(then) => then(Ok(reply)),
        }
    }
}

pub struct Client {
    writer: Mutex<Socket>,
    shared: Arc<Shared>,
    msize: u32,
    next_tag: Mutex<u16>,
    fids: Mutex<Fids>,
}

#[derive(Default)]
struct Fids {
    next: u32,
    free: Vec<u32>,
}

/// A request under construction: room for the frame's header (filled in when it is sent),
/// then the body, so that a write's data is copied once on its way to the socket.
struct Body(Vec<u8>);

impl Default for Body {
    fn default() -> Body {
        Body(vec![0; HEADER_BYTES])
    }
}

impl Body {
    fn u16(mut self, v: u16) -> Body {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Body {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Body {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(mut self, v: &[u8]) -> Body {
        let n = u16::try_from(v.len()).unwrap_or(u16::MAX);
        self.0.extend_from_slice(&n.to_le_bytes());
        self.0.extend_from_slice(&v[..usize::from(n)]);
        self
    }
    fn raw(mut self, v: &[u8]) -> Body {
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads a reply body; a short one is EIO (the server broke the protocol).
struct Parse {
    b: Vec<u8>,
    at: usize,
}

impl Parse {
    fn new(b: Vec<u8>) -> Parse {
        Parse { b, at: 0 }
    }
    fn is_empty(&self) -> bool {
        self.at == self.b.len()
    }
    fn take(&mut self, n: usize) -> Res<&[u8]> {
        if self.b.len() - self.at < n {
            return Err(libc::EIO);
        }
        self.at += n;
        Ok(&self.b[self.at - n..self.at])
    }
    fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Res<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Res<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn s(&mut self) -> Res<Vec<u8>> {
        let n = usize::from(self.u16()?);
        Ok(self.take(n)?.to_vec())
    }
    fn qid(&mut self) -> Res<Qid> {
        Ok(Qid {
            kind: self.u8()?,
            version: self.u32()?,
            path: self.u64()?,
        })
    }
    fn time(&mut self) -> Res<(u64, u64)> {
        Ok((self.u64()?, self.u64()?))
    }
}

impl Client {
    /// Connects to `addr`: `HOST:PORT`, or the path of a unix socket (starting with `/` or
    /// `unix:`), and negotiates 9P2000.L with at most `msize`.
    pub fn connect(addr: &str, msize: u32) -> io::Result<Client> {
        let mut socket = match addr.strip_prefix("unix:") {
            Some(path) => Socket::Unix(UnixStream::connect(path)?),
            None if addr.starts_with('/') => Socket::Unix(UnixStream::connect(addr)?),
            None => {
                let s = TcpStream::connect(addr)?;
                s.set_nodelay(true)?;
                Socket::Tcp(s)
            }
        };
        // Tversion before anything else is in flight: its reply sets the frame limit.
        let body = Body::default().u32(msize).s(b"9P2000.L");
        write_frame(&mut socket, TVERSION, NOTAG, body)?;
        let (kind, _, reply) = read_frame(&mut socket, msize.max(crate::limits::MSIZE_MIN))?;
        let mut r = Parse::new(reply);
        if kind != TVERSION + 1 {
            return Err(io::Error::other(format!(
                "{addr} refused Tversion (reply type {kind})"
            )));
        }
        let server_msize = r.u32().map_err(io::Error::from_raw_os_error)?;
        let version = r.s().map_err(io::Error::from_raw_os_error)?;
        if version != b"9P2000.L" {
            return Err(io::Error::other(format!(
                "{addr} does not speak 9P2000.L (it answered {:?})",
                String::from_utf8_lossy(&version)
            )));
        }
        let msize = server_msize.min(msize);
        let shared = Arc::new(Shared {
            waiting: Mutex::new(HashMap::new()),
            broken: AtomicBool::new(false),
        });
        let reader = socket.try_clone()?;
        let for_reader = shared.clone();
        std::thread::Builder::new()
            .name("9p-client-reader".into())
            .spawn(move || read_replies(reader, msize, &for_reader))?;
        Ok(Client {
            writer: Mutex::new(socket),
            shared,
            msize,
            next_tag: Mutex::new(0),
            fids: Mutex::new(Fids::default()),
        })
    }

    /// Whether the connection is over (the server hung up, or a request could not be sent);
    /// every request answers EIO from then on.
    pub fn is_broken(&self) -> bool {
        self.shared.broken.load(Ordering::SeqCst)
    }

    /// The largest read or write payload one request carries.
    pub fn io_size(&self) -> usize {
        self.msize as usize - HEADER_BYTES - 4 - 4 - 8 - 4
    }

    fn alloc_fid(&self) -> u32 {
        let mut f = self.fids.lock().expect("client lock");
        f.free.pop().unwrap_or_else(|| {
            f.next += 1;
            f.next
        })
    }

    fn free_fid(&self, fid: u32) {
        self.fids.lock().expect("client lock").free.push(fid);
    }

    /// Takes a fresh tag for `waiter`; None (and the waiter back) once the connection is broken.
    fn register(&self, waiter: Waiter) -> Result<u16, Waiter> {
        let mut waiting = self.shared.waiting.lock().expect("client lock");
        if self.is_broken() {
            return Err(waiter);
        }
        let mut next = self.next_tag.lock().expect("client lock");
        // A tag still waiting for its reply is skipped; there are far fewer requests in flight
        // than tags.
        loop {
            *next = (*next + 1) % TAG_LIMIT;
            if !waiting.contains_key(&*next) {
                break;
            }
        }
        waiting.insert(*next, waiter);
        Ok(*next)
    }

    fn rpc_raw(&self, kind: u8, body: Body) -> io::Result<Reply> {
        let (tx, rx) = mpsc::sync_channel(1);
        let tag = self
            .register(Waiter::Caller(tx))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        let sent = write_frame(
            &mut *self.writer.lock().expect("client lock"),
            kind,
            tag,
            body,
        );
        if let Err(e) = sent {
            self.shared.break_off();
            return Err(e);
        }
        // The reader hands the reply over, or drops the sender when the connection breaks.
        rx.recv().map_err(|_| io::ErrorKind::BrokenPipe.into())
    }

    /// The socket, held for one request sent without waiting for its reply. None when another
    /// thread is sending and `wait` is false: a thread that must not block (FUSE's) then hands
    /// the request to one that may.
    pub fn sending(&self, wait: bool) -> Option<Sending<'_>> {
        let socket = match self.writer.try_lock() {
            Ok(s) => s,
            Err(TryLockError::WouldBlock) if wait => self.writer.lock().expect("client lock"),
            Err(TryLockError::WouldBlock) => return None,
            Err(TryLockError::Poisoned(_)) => panic!("client lock poisoned"),
        };
        Some(Sending {
            client: self,
            socket,
        })
    }

    /// One request and its reply's body; an Rlerror becomes its errno, a broken connection EIO.
    fn rpc(&self, kind: u8, body: Body) -> Res<Parse> {
        reply_body(kind, self.rpc_raw(kind, body))
    }

    /// Attaches as `uid` to `aname`; answers the root fid and its qid.
    pub fn attach(&self, uid: u32, aname: &[u8]) -> Res<(u32, Qid)> {
        let fid = self.alloc_fid();
        let body = Body::default()
            .u32(fid)
            .u32(P9_NOFID)
            .s(b"")
            .s(aname)
            .u32(uid);
        match self.rpc(104, body) {
            Ok(mut p) => Ok((fid, p.qid()?)),
            Err(e) => {
                self.free_fid(fid);
                Err(e)
            }
        }
    }

    /// Walks `names` from `fid` to a new fid (a clone when `names` is empty); all of them or
    /// ENOENT.
    pub fn walk(&self, fid: u32, names: &[&[u8]]) -> Res<(u32, Option<Qid>)> {
        let newfid = self.alloc_fid();
        let mut body = Body::default().u32(fid).u32(newfid).u16(names.len() as u16);
        for n in names {
            body = body.s(n);
        }
        let result = self.rpc(110, body).and_then(|mut p| {
            let n = p.u16()?;
            let mut last = None;
            for _ in 0..n {
                last = Some(p.qid()?);
            }
            if usize::from(n) != names.len() {
                return Err(libc::ENOENT);
            }
            Ok(last)
        });
        match result {
            Ok(q) => Ok((newfid, q)),
            Err(e) => {
                self.free_fid(newfid);
                Err(e)
            }
        }
    }

    pub fn clunk(&self, fid: u32) -> Res<()> {
        let r = self.rpc(120, Body::default().u32(fid)).map(|_| ());
        // The fid is gone whatever the answer (9P: clunk always frees it).
        self.free_fid(fid);
        r
    }

    pub fn lopen(&self, fid: u32, flags: u32) -> Res<Qid> {
        self.rpc(12, Body::default().u32(fid).u32(flags))?.qid()
    }

    /// Creates `name` in the directory `fid`, which then stands for the new file, open.
    pub fn lcreate(&self, fid: u32, name: &[u8], flags: u32, mode: u32, gid: u32) -> Res<Qid> {
        let body = Body::default()
            .u32(fid)
            .s(name)
            .u32(flags)
            .u32(mode)
            .u32(gid);
        self.rpc(14, body)?.qid()
    }

    pub fn read(&self, fid: u32, offset: u64, count: u32) -> Res<Vec<u8>> {
        let count = count.min(self.io_size() as u32);
        let mut p = self.rpc(116, Body::default().u32(fid).u64(offset).u32(count))?;
        let n = p.u32()? as usize;
        Ok(p.take(n)?.to_vec())
    }

    pub fn write(&self, fid: u32, offset: u64, data: &[u8]) -> Res<u32> {
        let data = &data[..data.len().min(self.io_size())];
        let body = Body::default()
            .u32(fid)
            .u64(offset)
            .u32(data.len() as u32)
            .raw(data);
        self.rpc(118, body)?.u32()
    }

    pub fn getattr(&self, fid: u32) -> Res<Attr> {
        let mut p = self.rpc(24, Body::default().u32(fid).u64(0x3fff))?;
        p.u64()?;
        Ok(Attr {
            qid: p.qid()?,
            mode: p.u32()?,
            uid: p.u32()?,
            gid: p.u32()?,
            nlink: p.u64()?,
            rdev: p.u64()?,
            size: p.u64()?,
            blksize: p.u64()?,
            blocks: p.u64()?,
            atime: p.time()?,
            mtime: p.time()?,
            ctime: p.time()?,
            btime: p.time()?,
            generation: p.u64()?,
        })
    }

    pub fn setattr(&self, fid: u32, s: &SetAttr) -> Res<()> {
        let body = Body::default()
            .u32(fid)
            .u32(s.valid)
            .u32(s.mode)
            .u32(s.uid)
            .u32(s.gid)
            .u64(s.size)
            .u64(s.atime.0)
            .u64(s.atime.1)
            .u64(s.mtime.0)
            .u64(s.mtime.1);
        self.rpc(26, body).map(|_| ())
    }

    pub fn readdir(&self, fid: u32, offset: u64, count: u32) -> Res<Vec<DirEntry>> {
        let count = count.min(self.io_size() as u32);
        let mut p = self.rpc(40, Body::default().u32(fid).u64(offset).u32(count))?;
        let n = p.u32()? as usize;
        let mut d = Parse::new(p.take(n)?.to_vec());
        let mut out = Vec::new();
        while !d.is_empty() {
            out.push(DirEntry {
                qid: d.qid()?,
                offset: d.u64()?,
                kind: d.u8()?,
                name: d.s()?,
            });
        }
        Ok(out)
    }

    pub fn mkdir(&self, dfid: u32, name: &[u8], mode: u32, gid: u32) -> Res<Qid> {
        self.rpc(72, Body::default().u32(dfid).s(name).u32(mode).u32(gid))?
            .qid()
    }

    pub fn symlink(&self, dfid: u32, name: &[u8], target: &[u8], gid: u32) -> Res<Qid> {
        self.rpc(16, Body::default().u32(dfid).s(name).s(target).u32(gid))?
            .qid()
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        dfid: u32,
        name: &[u8],
        mode: u32,
        major: u32,
        minor: u32,
        gid: u32,
    ) -> Res<Qid> {
        let body = Body::default()
            .u32(dfid)
            .s(name)
            .u32(mode)
            .u32(major)
            .u32(minor)
            .u32(gid);
        self.rpc(18, body)?.qid()
    }

    pub fn link(&self, dfid: u32, fid: u32, name: &[u8]) -> Res<()> {
        self.rpc(70, Body::default().u32(dfid).u32(fid).s(name))
            .map(|_| ())
    }

    pub fn renameat(&self, olddir: u32, oldname: &[u8], newdir: u32, newname: &[u8]) -> Res<()> {
        let body = Body::default()
            .u32(olddir)
            .s(oldname)
            .u32(newdir)
            .s(newname);
        self.rpc(74, body).map(|_| ())
    }

    /// Trename: the older form servers without renameat (diod) answer.
    pub fn rename(&self, fid: u32, dfid: u32, name: &[u8]) -> Res<()> {
        self.rpc(20, Body::default().u32(fid).u32(dfid).s(name))
            .map(|_| ())
    }

    /// Tremove: removes what `fid` names and frees the fid, whatever the answer.
    pub fn remove(&self, fid: u32) -> Res<()> {
        let r = self.rpc(122, Body::default().u32(fid)).map(|_| ());
        self.free_fid(fid);
        r
    }

    pub fn unlinkat(&self, dfid: u32, name: &[u8], flags: u32) -> Res<()> {
        self.rpc(76, Body::default().u32(dfid).s(name).u32(flags))
            .map(|_| ())
    }

    pub fn readlink(&self, fid: u32) -> Res<Vec<u8>> {
        self.rpc(22, Body::default().u32(fid))?.s()
    }

    pub fn statfs(&self, fid: u32) -> Res<StatFs> {
        let mut p = self.rpc(8, Body::default().u32(fid))?;
        p.u32()?;
        let bsize = p.u32()?;
        let (blocks, bfree, bavail, files, ffree) =
            (p.u64()?, p.u64()?, p.u64()?, p.u64()?, p.u64()?);
        p.u64()?;
        Ok(StatFs {
            bsize,
            blocks,
            bfree,
            bavail,
            files,
            ffree,
            namelen: p.u32()?,
        })
    }

    pub fn fsync(&self, fid: u32, datasync: bool) -> Res<()> {
        self.rpc(50, Body::default().u32(fid).u32(u32::from(datasync)))
            .map(|_| ())
    }

    /// Tlock: takes, changes or (kind 2) releases a record lock of `owner` on the open `fid`;
    /// answers Rlock's status (0 granted, 1 blocked, 2 error). `length` 0 runs to the end of
    /// the file; `flags` 1 asks for a blocking lock (the server still answers at once).
    pub fn lock(
        &self,
        fid: u32,
        kind: u8,
        flags: u32,
        start: u64,
        length: u64,
        owner: &LockOwner,
    ) -> Res<u8> {
        let body = Body::default()
            .u32(fid)
            .raw(&[kind])
            .u32(flags)
            .u64(start)
            .u64(length)
            .u32(owner.proc_id)
            .s(&owner.client_id);
        self.rpc(52, body)?.u8()
    }

    /// Tgetlock: the lock that would conflict with `owner` taking `kind` on the range, or the
    /// range back with kind 2 (unlocked) if none does.
    pub fn getlock(
        &self,
        fid: u32,
        kind: u8,
        start: u64,
        length: u64,
        owner: &LockOwner,
    ) -> Res<Lock> {
        let body = Body::default()
            .u32(fid)
            .raw(&[kind])
            .u64(start)
            .u64(length)
            .u32(owner.proc_id)
            .s(&owner.client_id);
        let mut p = self.rpc(54, body)?;
        Ok(Lock {
            kind: p.u8()?,
            start: p.u64()?,
            length: p.u64()?,
            owner: LockOwner {
                proc_id: p.u32()?,
                client_id: p.s()?,
            },
        })
    }

    /// Reads the attribute `name` (or, empty, the list of names) of `fid` whole.
    pub fn xattr_get(&self, fid: u32, name: &[u8]) -> Res<Vec<u8>> {
        let xfid = self.alloc_fid();
        let size = match self.rpc(30, Body::default().u32(fid).u32(xfid).s(name)) {
            Ok(mut p) => p.u64()?,
            Err(e) => {
                self.free_fid(xfid);
                return Err(e);
            }
        };
        let mut out = Vec::new();
        let result = (|| {
            while (out.len() as u64) < size {
                let chunk = self.read(xfid, out.len() as u64, (size - out.len() as u64) as u32)?;
                if chunk.is_empty() {
                    break;
                }
                out.extend_from_slice(&chunk);
            }
            Ok(())
        })();
        let _ = self.clunk(xfid);
        result.map(|()| out)
    }

    /// Sets (or, with None, removes) the attribute `name` of `fid`; `flags` are setxattr's.
    pub fn xattr_set(&self, fid: u32, name: &[u8], value: Option<&[u8]>, flags: u32) -> Res<()> {
        let (xfid, _) = self.walk(fid, &[])?;
        let (size, flags) = match value {
            Some(v) => (v.len() as u64, flags),
            None => (0, 2),
        };
        let body = Body::default().u32(xfid).s(name).u64(size).u32(flags);
        if let Err(e) = self.rpc(32, body) {
            let _ = self.clunk(xfid);
            return Err(e);
        }
        let mut at = 0;
        let v = value.unwrap_or_default();
        while at < v.len() {
            match self.write(xfid, at as u64, &v[at..]) {
                Ok(n) if n > 0 => at += n as usize,
                Ok(_) => break,
                Err(e) => {
                    let _ = self.clunk(xfid);
                    return Err(e);
                }
            }
        }
        // The server sets the attribute at clunk and answers its error there.
        self.clunk(xfid)
    }
}

impl Drop for Client {
    /// Shutting the socket down ends the reader thread.
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            w.shutdown();
        }
    }
}

/// One request on its way, its reply to be taken by a function on the reader thread. That
/// function must neither send on this client nor wait for another of its replies: the thread
/// running it is the one that reads them, and a send can wait for the server, which can wait
/// for that thread. It runs exactly once, with the reply or with the connection's error.
pub struct Sending<'a> {
    client: &'a Client,
    socket: MutexGuard<'a, Socket>,
}

impl Sending<'_> {
    /// Twrite of `data` (up to `Client::io_size` of it); `then` gets the count written.
    pub fn write_then(
        self,
        fid: u32,
        offset: u64,
        data: &[u8],
        then: impl FnOnce(Res<u32>) + Send + 'static,
    ) {
        let data = &data[..data.len().min(self.client.io_size())];
        let body = Body::default()
            .u32(fid)
            .u64(offset)
            .u32(data.len() as u32)
            .raw(data);
        self.send(
            118,
            body,
            Box::new(move |r| then(reply_body(118, r).and_then(|mut p| p.u32()))),
        );
    }

    /// Tfsync; `then` gets its outcome.
    pub fn fsync_then(self, fid: u32, datasync: bool, then: impl FnOnce(Res<()>) + Send + 'static) {
        let body = Body::default().u32(fid).u32(u32::from(datasync));
        self.send(
            50,
            body,
            Box::new(move |r| then(reply_body(50, r).map(|_| ()))),
        );
    }

    fn send(mut self, kind: u8, body: Body, then: Then) {
        let tag = match self.client.register(Waiter::Then(then)) {
            Ok(tag) => tag,
            Err(Waiter::Then(then)) => {
                drop(self.socket);
                return then(Err(io::ErrorKind::BrokenPipe.into()));
            }
            Err(Waiter::Caller(_)) => unreachable!("registered as a function"),
        };
        if write_frame(&mut *self.socket, kind, tag, body).is_err() {
            drop(self.socket);
            // Runs `then` with the error, with every other request in flight.
            self.client.shared.break_off();
        }
    }
}

/// A reply's body; an Rlerror becomes its errno, a broken connection or a reply of the wrong
/// type EIO.
fn reply_body(kind: u8, reply: io::Result<Reply>) -> Res<Parse> {
    let (rkind, b) = reply.map_err(|_| libc::EIO)?;
    let mut p = Parse::new(b);
    if rkind == TLERROR_RLERROR {
        return Err(p.u32()? as i32);
    }
    if rkind != kind + 1 {
        return Err(libc::EIO);
    }
    Ok(p)
}

fn write_frame(w: &mut impl Write, kind: u8, tag: u16, mut body: Body) -> io::Result<()> {
    let size = body.0.len() as u32;
    body.0[..4].copy_from_slice(&size.to_le_bytes());
    body.0[4] = kind;
    body.0[5..7].copy_from_slice(&tag.to_le_bytes());
    w.write_all(&body.0)
}

/// One frame: its type, tag and body. A size outside [header, limit] breaks the protocol.
fn read_frame(r: &mut impl Read, limit: u32) -> io::Result<(u8, u16, Vec<u8>)> {
    let mut size = [0u8; 4];
    r.read_exact(&mut size)?;
    let size = u32::from_le_bytes(size) as usize;
    if size < HEADER_BYTES || size > limit as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad reply size"));
    }
    let mut rest = vec![0u8; size - 4];
    r.read_exact(&mut rest)?;
    let tag = u16::from_le_bytes([rest[1], rest[2]]);
    let kind = rest[0];
    rest.drain(..3);
    Ok((kind, tag, rest))
}

/// The reader thread: hands each reply to the caller waiting on its tag, until the connection
/// ends or breaks the protocol; then every caller is woken with EIO.
fn read_replies(mut socket: Socket, msize: u32, shared: &Shared) {
    while let Ok((kind, tag, body)) = read_frame(&mut socket, msize.max(crate::limits::MSIZE_MIN)) {
        let waiter = shared.waiting.lock().expect("client lock").remove(&tag);
        // A reply nobody waits for (a tag never sent) is a broken server.
        let Some(waiter) = waiter else { break };
        Shared::deliver(waiter, (kind, body));
    }
    shared.break_off();
    socket.shutdown();
}
