//! Serving 9P2000.L connections: the frame loop (many tags in flight, Tflush cancelling one)
//! and the fid table; requests.rs maps each request onto the filesystem core. Errors reach the
//! client as Rlerror with the errno `FsError::errno` gives.

mod requests;

use crate::limits::{
    CONNECTION_THREADS_MAX, FIDS_PER_CONNECTION_MAX, MSIZE_MAX, MSIZE_MIN,
    READDIR_ENTRIES_PER_PAGE, REQUESTS_IN_FLIGHT_MAX, SMALL_WRITE_BYTES_MAX,
};
use crate::record_locks::{self, Owner, RecordLocks};
use crate::wire::{self, DecodeError, LockRequest, Qid, Reply, Request, SetattrRequest};
use bucketfs_fs::Fs;
use bucketfs_fs::{
    Caller, FsError, Inode, Kind, RenameFlags, SetAttr, Time, XattrMode, MAY_READ, MAY_WRITE,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info_span, warn, Instrument};

const VERSION_9P2000_L: &[u8] = b"9P2000.L";
/// The buffer a connection's messages are read through.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// One 9P server: the filesystem it serves and what its connections share.
pub struct Server {
    fs: Arc<Fs>,
    locks: RecordLocks,
    connections: AtomicU64,
    /// Connections being served on threads of their own.
    threads: AtomicUsize,
}

/// A fid's state.
#[derive(Clone)]
struct Fid {
    ino: u64,
    caller: Arc<Caller>,
    /// The directory and name it was reached by (what Tremove and Trename need).
    parent: Option<(u64, Vec<u8>)>,
    open: Option<Open>,
    xattr: Option<Arc<Mutex<Xattr>>>,
}

#[derive(Clone, Copy)]
struct Open {
    read: bool,
    write: bool,
    append: bool,
    /// Counted in the filesystem's open handles (files), released at clunk.
    handle: bool,
}

enum Xattr {
    /// A value or a list of names, read with Tread.
    Reading(Vec<u8>),
    /// A value being written with Twrite, set at Tclunk.
    Writing {
        name: Vec<u8>,
        size: u64,
        flags: u32,
        data: Vec<u8>,
    },
}

struct Connection {
    id: u64,
    server: Arc<Server>,
    fids: Mutex<HashMap<u32, Fid>>,
    msize: AtomicU32,
    /// Requests being served, by tag, so that Tflush can cancel one.
    in_flight: Mutex<HashMap<u16, tokio::task::AbortHandle>>,
    replies: mpsc::UnboundedSender<Vec<u8>>,
    /// Where reads and large writes run: the server's shared runtime.
    bulk: Handle,
}

type Answer = Result<Reply, FsError>;

fn einval(why: &str) -> FsError {
    FsError::Invalid(why.to_string())
}

fn ebadf() -> FsError {
    FsError::Invalid("unknown fid".into())
}

impl Server {
    pub fn new(fs: Arc<Fs>) -> Arc<Server> {
        Arc::new(Server {
            fs,
            locks: RecordLocks::default(),
            connections: AtomicU64::new(0),
            threads: AtomicUsize::new(0),
        })
    }

    /// Connections being served on threads of their own.
    pub fn connection_threads(&self) -> usize {
        self.threads.load(Ordering::Acquire)
    }

    /// Accepts 9P clients on a TCP listener forever, each served on a thread of its own
    /// (`spawn_connection`).
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) -> io::Result<()> {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let span = info_span!("9p", %peer);
                    match stream.into_std() {
                        Ok(s) => self
                            .clone()
                            .spawn_connection(span, move || TcpStream::from_std(s)),
                        Err(error) => warn!(%error, "a 9P connection could not be handed over"),
                    }
                }
                Err(error) => {
                    warn!(%error, "accepting a 9P connection failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Accepts 9P clients on a unix socket forever.
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) -> io::Result<()> {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let span = info_span!("9p", peer = "unix");
                    match stream.into_std() {
                        Ok(s) => self
                            .clone()
                            .spawn_connection(span, move || UnixStream::from_std(s)),
                        Err(error) => warn!(%error, "a 9P connection could not be handed over"),
                    }
                }
                Err(error) => {
                    warn!(%error, "accepting a 9P connection failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Serves a connection on a thread of its own, whose runtime reads its requests, runs the
    /// small ones and writes every reply; reads and large writes run on the shared runtime,
    /// as does all the engine's background work. A small request then waits for no thread
    /// that another client's bulk transfer keeps busy, and the connection's requests are read
    /// as fast as they come: on one connection shared by a streaming writer and a small file's
    /// fsync, that fsync no longer queues behind the writer's data in the socket
    /// (docs/0006-posix-filesystem.md). `open` registers the socket with the runtime that
    /// serves it.
    fn spawn_connection<S, F>(self: Arc<Self>, span: tracing::Span, open: F)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnOnce() -> io::Result<S> + Send + 'static,
    {
        let shared = Handle::current();
        if self.threads.fetch_add(1, Ordering::AcqRel) >= CONNECTION_THREADS_MAX {
            self.threads.fetch_sub(1, Ordering::AcqRel);
            let serve = async move {
                match open() {
                    Ok(stream) => self.serve_on(stream, shared).await,
                    Err(e) => Err(e),
                }
            };
            tokio::spawn(Self::reported(serve).instrument(span));
            return;
        }
        let server = self.clone();
        let on_thread = span.clone();
        let spawned = std::thread::Builder::new()
            .name("9p-connection".into())
            .spawn(move || {
                let _counted = ThreadCount(server.clone());
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => runtime.block_on(
                        Self::reported(async move {
                            server.serve_on(open()?, shared).await
                        })
                        .instrument(on_thread),
                    ),
                    Err(error) => {
                        warn!(parent: &on_thread, %error, "no runtime for a 9P connection; closing it")
                    }
                }
            });
        if let Err(error) = spawned {
            self.threads.fetch_sub(1, Ordering::AcqRel);
            warn!(parent: &span, %error, "no thread for a 9P connection; closing it");
        }
    }

    async fn reported(serve: impl std::future::Future<Output = io::Result<()>>) {
        match serve.await {
            Ok(()) => debug!("client disconnected"),
            Err(error) => debug!(%error, "connection closed"),
        }
    }

    /// Serves one client over any byte stream until it disconnects or breaks the framing, all
    /// on the caller's runtime.
    pub async fn serve_connection<S>(self: Arc<Self>, stream: S) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_on(stream, Handle::current()).await
    }

    /// Serves one client on the current runtime, with reads and large writes on `bulk`.
    async fn serve_on<S>(self: Arc<Self>, stream: S, bulk: Handle) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (rd, mut wr) = tokio::io::split(stream);
        // Small requests come several to a read; a large Twrite's data bypasses the buffer.
        let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, rd);
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                wr.write_all(&frame).await?;
                // Send what is queued together, then flush once.
                while let Ok(more) = rx.try_recv() {
                    wr.write_all(&more).await?;
                }
                wr.flush().await?;
            }
            Ok::<_, io::Error>(())
        });
        let conn = Arc::new(Connection {
            id: self.connections.fetch_add(1, Ordering::Relaxed) + 1,
            server: self.clone(),
            fids: Mutex::default(),
            msize: AtomicU32::new(MSIZE_MIN),
            in_flight: Mutex::default(),
            replies: tx,
            bulk,
        });
        let slots = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
        let result = conn.clone().read_loop(&mut rd, &slots).await;
        // The client is gone: cancel what it asked, release what it held.
        for (_, h) in conn.in_flight.lock().drain() {
            h.abort();
        }
        conn.clunk_all().await;
        self.locks.release_connection(conn.id);
        drop(conn);
        let _ = writer.await;
        result
    }
}

/// Reads the rest of a message (`len` bytes after its size) and decodes it: its type, its tag
/// and the request. A Twrite's data is read into a buffer of its own, which moves down to the
/// engine without a copy; no buffer is zeroed before the socket fills it.
async fn read_request<R: AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
) -> io::Result<(u8, u16, Result<Request, DecodeError>)> {
    let mut head = [0u8; 3];
    rd.read_exact(&mut head).await?;
    let (kind, tag) = (head[0], u16::from_le_bytes([head[1], head[2]]));
    let body_len = len - 3;
    if kind == wire::TWRITE && body_len >= wire::TWRITE_FIXED_BYTES {
        let mut fixed = [0u8; wire::TWRITE_FIXED_BYTES];
        rd.read_exact(&mut fixed).await?;
        let data = read_vec(rd, body_len - wire::TWRITE_FIXED_BYTES).await?;
        return Ok((kind, tag, wire::decode_write(&fixed, data)));
    }
    let body = read_vec(rd, body_len).await?;
    Ok((kind, tag, wire::decode(kind, &body)))
}

/// Exactly `n` bytes, read into fresh memory without zeroing it first.
async fn read_vec<R: AsyncRead + Unpin>(rd: &mut R, n: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let want = (n - v.len()) as u64;
        if (&mut *rd).take(want).read_buf(&mut v).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(v)
}

/// Counts a connection's thread in `Server::threads` while it lives.
struct ThreadCount(Arc<Server>);

impl Drop for ThreadCount {
    fn drop(&mut self) {
        self.0.threads.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connection {
    async fn read_loop<R: AsyncRead + Unpin>(
        self: Arc<Self>,
        rd: &mut R,
        slots: &Arc<Semaphore>,
    ) -> io::Result<()> {
        loop {
            let mut size = [0u8; 4];
            match rd.read_exact(&mut size).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let size = u32::from_le_bytes(size);
            let msize = self.msize.load(Ordering::Relaxed).max(MSIZE_MIN);
            if (size as usize) < wire::HEADER_BYTES || size > msize.max(MSIZE_MIN) {
                // No reply can be framed for a message whose size is a lie: close.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("message of {size} bytes (msize {msize})"),
                ));
            }
            let (kind, tag, decoded) = read_request(rd, size as usize - 4).await?;
            let request = match decoded {
                Ok(r) => r,
                Err(e) => {
                    let errno = match e {
                        DecodeError::UnknownType(_) => libc::EOPNOTSUPP,
                        DecodeError::TooLong("name") => libc::ENAMETOOLONG,
                        _ => libc::EINVAL,
                    };
                    debug!(kind, ?e, "malformed request");
                    self.send(Reply::error(tag, errno));
                    continue;
                }
            };
            match request {
                // Version resets the session: it waits for nothing and cancels everything.
                Request::Version { msize, version } => {
                    for (_, h) in self.in_flight.lock().drain() {
                        h.abort();
                    }
                    self.clunk_all().await;
                    let msize = msize.clamp(MSIZE_MIN, MSIZE_MAX);
                    self.msize.store(msize, Ordering::Relaxed);
                    let mut r = Reply::new(101, tag);
                    let known = version.starts_with(VERSION_9P2000_L);
                    r.u32(msize)
                        .string(if known { VERSION_9P2000_L } else { b"unknown" });
                    self.send(r);
                }
                Request::Flush { oldtag } => {
                    // Under the lock that a finishing request takes to send its reply: either
                    // that reply is already queued (and precedes Rflush) or it never will be.
                    let mut in_flight = self.in_flight.lock();
                    if let Some(h) = in_flight.remove(&oldtag) {
                        h.abort();
                    }
                    let _ = self.replies.send(Reply::new(109, tag).finish());
                }
                request => {
                    let permit = slots
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed");
                    let conn = self.clone();
                    let mut in_flight = self.in_flight.lock();
                    if in_flight.contains_key(&tag) {
                        drop(in_flight);
                        self.send(Reply::error(tag, libc::EINVAL));
                        continue;
                    }
                    let bulk = match &request {
                        Request::Read { .. } => true,
                        Request::Write { data, .. } => data.len() > SMALL_WRITE_BYTES_MAX,
                        _ => false,
                    };
                    let serve = async move {
                        let reply = match conn.handle(tag, kind, request).await {
                            Ok(r) => r,
                            Err(e) => {
                                if let FsError::Engine(_) | FsError::Damaged(..) = e {
                                    warn!(error = %e, "9P request failed");
                                }
                                Reply::error(tag, e.errno())
                            }
                        };
                        let mut in_flight = conn.in_flight.lock();
                        if in_flight.remove(&tag).is_some() {
                            let _ = conn.replies.send(reply.finish());
                        }
                        drop(permit);
                    };
                    let task = if bulk {
                        self.bulk.spawn(serve)
                    } else {
                        tokio::spawn(serve)
                    };
                    in_flight.insert(tag, task.abort_handle());
                }
            }
        }
    }

    fn send(&self, r: Reply) {
        let _ = self.replies.send(r.finish());
    }

    fn fid(&self, fid: u32) -> Result<Fid, FsError> {
        self.fids.lock().get(&fid).cloned().ok_or_else(ebadf)
    }

    fn insert_fid(&self, fid: u32, f: Fid) -> Result<(), FsError> {
        let mut fids = self.fids.lock();
        if fids.len() >= FIDS_PER_CONNECTION_MAX && !fids.contains_key(&fid) {
            return Err(FsError::Invalid("too many fids".into()));
        }
        fids.insert(fid, f);
        Ok(())
    }

    fn fs(&self) -> &Fs {
        &self.server.fs
    }

    async fn clunk_all(&self) {
        let fids: Vec<Fid> = self.fids.lock().drain().map(|(_, f)| f).collect();
        for f in fids {
            if f.open.is_some_and(|o| o.handle) {
                let _ = self.fs().release_handle(f.ino).await;
            }
        }
    }

    fn max_payload(&self) -> usize {
        // Rread: header, count[4].
        self.msize.load(Ordering::Relaxed) as usize - wire::HEADER_BYTES - 4
    }
}
