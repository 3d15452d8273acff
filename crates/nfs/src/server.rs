//! The RPC server over a byte stream (TCP): records are read one after another and each call
//! runs as a task of its own, at most CALLS_IN_FLIGHT_MAX at once per connection, so a slow
//! call (a COMMIT) does not hold up the others; replies go out as they are ready, in any
//! order, matched by their transaction ids.
//!
//! A duplicate request cache answers a retransmitted call that is not idempotent (CREATE,
//! REMOVE, RENAME, ...) with the reply of the first, instead of running it again: a client
//! whose connection broke before the reply came resends the call, and REMOVE run twice would
//! answer NOENT for a removal that succeeded.

use crate::record::{read_record, record_mark};
use crate::rpc::{self, AcceptStat, Call, Refusal};
use crate::xdr::Encoder;
use parking_lot::Mutex;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};

/// Calls of one connection running at once; the next record is read when one finishes.
pub const CALLS_IN_FLIGHT_MAX: usize = 64;
/// Replies the duplicate request cache keeps, the oldest forgotten first. A client resends a
/// call within its timeout (Linux: 60 s over TCP), long before thousands of other changes
/// push its reply out; the replies it keeps are small (wcc_data, a handle), ~1 MB in all.
pub const REPLY_CACHE_ENTRIES: usize = 4096;

/// The reply a program gives a call: its body after an accept_stat of SUCCESS, or another
/// accept_stat (PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR) with no body.
pub type Outcome = Result<Encoder, AcceptStat>;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One RPC program in the versions `versions` covers (inclusive).
pub trait Program: Send + Sync + 'static {
    fn number(&self) -> u32;
    fn versions(&self) -> (u32, u32);
    /// Serves a call already checked to be for this program in one of its versions.
    fn call<'a>(&'a self, call: &'a Call<'a>) -> BoxFuture<'a, Outcome>;
    /// Whether running `procedure` twice answers as running it once; the replies of the others
    /// go through the duplicate request cache.
    fn idempotent(&self, procedure: u32) -> bool {
        let _ = procedure;
        true
    }
}

/// A call as the duplicate request cache knows it: the client's address, the transaction id
/// and a hash of the whole record (a client reuses transaction ids, a resent call is the same
/// bytes).
type CallKey = (Option<IpAddr>, u32, u64);

enum Cached {
    /// The first call is still running: a copy of it is dropped, and the client, which
    /// resends until it has a reply, gets the reply once it is here.
    Running,
    Done(Arc<Vec<u8>>),
}

/// The cache entry of a call running; dropped before the call finished, it removes it.
struct Running<'a> {
    replies: &'a Mutex<lru::LruCache<CallKey, Cached>>,
    key: Option<CallKey>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.replies.lock().pop(&key);
        }
    }
}

/// The programs one port serves (NFS and MOUNT share it: no portmapper is needed).
pub struct Dispatcher {
    programs: Vec<Arc<dyn Program>>,
    record_bytes_max: usize,
    replies: Mutex<lru::LruCache<CallKey, Cached>>,
    hasher: RandomState,
}

impl Dispatcher {
    /// `record_bytes_max` bounds a record (the largest WRITE plus its headers).
    pub fn new(programs: Vec<Arc<dyn Program>>, record_bytes_max: usize) -> Arc<Dispatcher> {
        let entries = NonZeroUsize::new(REPLY_CACHE_ENTRIES).expect("not zero");
        Arc::new(Dispatcher {
            programs,
            record_bytes_max,
            replies: Mutex::new(lru::LruCache::new(entries)),
            hasher: RandomState::new(),
        })
    }

    /// The reply to one record from a caller in this process, or None when there is nothing
    /// to answer.
    pub async fn reply(&self, record: &[u8]) -> Option<Vec<u8>> {
        self.reply_to(record, None).await
    }

    /// The reply to one record from the client at `peer`, or None when there is nothing to
    /// answer (not a call, or a copy of a call still running).
    pub async fn reply_to(&self, record: &[u8], peer: Option<IpAddr>) -> Option<Vec<u8>> {
        self.reply_message(record, peer)
            .await
            .map(Encoder::into_bytes)
    }

    /// As `reply_to`, the reply kept in the parts it was built in (see `write_record`).
    async fn reply_message(&self, record: &[u8], peer: Option<IpAddr>) -> Option<Encoder> {
        let mut call = match rpc::decode_call(record) {
            Ok(c) => c,
            Err(Refusal::Ignore) => return None,
            Err(Refusal::Reply(r)) => return Some(r.into()),
        };
        call.peer = peer;
        let Some(p) = self.programs.iter().find(|p| p.number() == call.prog) else {
            return Some(rpc::accepted(call.xid, AcceptStat::ProgUnavail, &[]).into());
        };
        let (low, high) = p.versions();
        if call.vers < low || call.vers > high {
            return Some(rpc::prog_mismatch(call.xid, low, high).into());
        }
        if p.idempotent(call.procedure) {
            return Some(Self::run(p.as_ref(), &call).await);
        }
        let key = (peer, call.xid, self.hasher.hash_one(record));
        {
            let mut replies = self.replies.lock();
            match replies.get(&key) {
                Some(Cached::Done(reply)) => return Some(reply.as_ref().clone().into()),
                Some(Cached::Running) => return None,
                None => {
                    replies.put(key, Cached::Running);
                }
            }
        }
        // Should the call never finish (its task dropped), its entry goes, so that a resend
        // runs it rather than wait forever for a reply that will not come.
        let mut running = Running {
            replies: &self.replies,
            key: Some(key),
        };
        // The replies of calls that are not idempotent are small: one buffer in the cache.
        let reply = Self::run(p.as_ref(), &call).await.into_bytes();
        let key = running.key.take().expect("set above");
        self.replies
            .lock()
            .put(key, Cached::Done(Arc::new(reply.clone())));
        Some(reply.into())
    }

    async fn run(p: &dyn Program, call: &Call<'_>) -> Encoder {
        match p.call(call).await {
            Ok(body) => rpc::accepted_message(call.xid, AcceptStat::Success, body),
            Err(stat) => rpc::accepted_message(call.xid, stat, Encoder::new()),
        }
    }

    /// Accepts TCP clients and serves each until it goes away.
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) -> io::Result<()> {
        loop {
            let (stream, peer) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let me = self.clone();
            tokio::spawn(async move {
                if let Err(e) = me.serve_connection(stream, Some(peer.ip())).await {
                    tracing::warn!(%peer, error = %e, "NFS connection ended");
                }
            });
        }
    }

    /// Serves one client (at `peer`; None: in this process) until it disconnects or breaks
    /// the record framing.
    pub async fn serve_connection<S>(
        self: Arc<Self>,
        stream: S,
        peer: Option<IpAddr>,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let (tx, mut rx) = mpsc::unbounded_channel::<Encoder>();
        let writer = tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                write_record(&mut wr, reply).await?;
                while let Ok(more) = rx.try_recv() {
                    write_record(&mut wr, more).await?;
                }
                wr.flush().await?;
            }
            Ok::<_, io::Error>(())
        });
        let slots = Arc::new(Semaphore::new(CALLS_IN_FLIGHT_MAX));
        let result = loop {
            let record = match read_record(&mut rd, self.record_bytes_max).await {
                Ok(Some(r)) => r,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            let slot = slots.clone().acquire_owned().await.expect("never closed");
            let (me, tx) = (self.clone(), tx.clone());
            tokio::spawn(async move {
                if let Some(reply) = me.reply_message(&record, peer).await {
                    let _ = tx.send(reply);
                }
                drop(slot);
            });
        };
        drop(tx);
        // Calls still running send their replies before the writer ends.
        let _ = writer.await;
        result
    }
}

/// Writes one reply as one record: its record mark and its parts, gathered into as few
/// `writev` calls as the socket takes, so a READ's data goes out of the buffer it was read into.
async fn write_record<W: AsyncWrite + Unpin>(wr: &mut W, reply: Encoder) -> io::Result<()> {
    let mark = record_mark(reply.len());
    let parts = reply.into_parts();
    let mut slices: Vec<IoSlice<'_>> = std::iter::once(&mark[..])
        .chain(parts.iter().map(|p| &p[..]))
        .map(IoSlice::new)
        .collect();
    let mut left = &mut slices[..];
    while !left.is_empty() {
        let n = wr.write_vectored(left).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::frame;
    use crate::rpc::{Credentials, AUTH_NONE, AUTH_SYS};
    use crate::xdr::{Decoder, Encoder};
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// Program 400000 version 1: procedure 0 answers nothing, 1 echoes its u32 argument after
    /// waiting that many milliseconds, 2 answers the caller's uid, 3 (not idempotent) counts
    /// its calls after waiting as 1 does.
    #[derive(Default)]
    struct Echo {
        count: std::sync::atomic::AtomicU32,
    }

    impl Program for Echo {
        fn number(&self) -> u32 {
            400_000
        }
        fn versions(&self) -> (u32, u32) {
            (1, 1)
        }
        fn call<'a>(&'a self, call: &'a Call<'a>) -> BoxFuture<'a, Outcome> {
            Box::pin(async move {
                let mut out = Encoder::new();
                match call.procedure {
                    0 => {}
                    1 => {
                        let ms = Decoder::new(call.args)
                            .u32()
                            .map_err(|_| AcceptStat::GarbageArgs)?;
                        tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
                        out.u32(ms);
                    }
                    2 => match &call.cred {
                        Credentials::Sys { uid, .. } => {
                            out.u32(*uid);
                        }
                        Credentials::None => return Err(AcceptStat::SystemErr),
                    },
                    3 => {
                        let ms = Decoder::new(call.args)
                            .u32()
                            .map_err(|_| AcceptStat::GarbageArgs)?;
                        tokio::time::sleep(Duration::from_millis(u64::from(ms))).await;
                        let n = self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        out.u32(n + 1);
                    }
                    _ => return Err(AcceptStat::ProcUnavail),
                }
                Ok(out)
            })
        }
        fn idempotent(&self, procedure: u32) -> bool {
            procedure != 3
        }
    }

    fn call(
        xid: u32,
        prog: u32,
        vers: u32,
        procedure: u32,
        uid: Option<u32>,
        args: &[u8],
    ) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(xid).u32(0).u32(2).u32(prog).u32(vers).u32(procedure);
        match uid {
            Some(uid) => {
                let mut body = Encoder::new();
                body.u32(0).opaque(b"test").u32(uid).u32(uid).u32(0);
                e.u32(AUTH_SYS).opaque(&body.into_bytes());
            }
            None => {
                e.u32(AUTH_NONE).opaque(&[]);
            }
        }
        e.u32(AUTH_NONE).opaque(&[]).raw(args);
        frame(&e.into_bytes())
    }

    async fn read_reply(r: &mut (impl AsyncRead + Unpin)) -> (u32, Vec<u8>) {
        let rec = read_record(r, 1 << 20).await.unwrap().unwrap();
        let xid = u32::from_be_bytes(rec[..4].try_into().unwrap());
        (xid, rec)
    }

    #[tokio::test]
    async fn calls_overlap_and_every_error_is_an_rpc_reply() {
        let d = Dispatcher::new(vec![Arc::new(Echo::default())], 64 * 1024);
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(d.serve_connection(server, None));
        // A slow call first, a quick one second: the quick one is answered first.
        client
            .write_all(&call(1, 400_000, 1, 1, None, &300u32.to_be_bytes()))
            .await
            .unwrap();
        client
            .write_all(&call(2, 400_000, 1, 1, None, &0u32.to_be_bytes()))
            .await
            .unwrap();
        assert_eq!(read_reply(&mut client).await.0, 2);
        let (xid, slow) = read_reply(&mut client).await;
        assert_eq!(xid, 1);
        assert_eq!(
            slow,
            rpc::accepted(1, AcceptStat::Success, &300u32.to_be_bytes())
        );

        // AUTH_SYS reaches the program.
        client
            .write_all(&call(3, 400_000, 1, 2, Some(1000), &[]))
            .await
            .unwrap();
        assert_eq!(
            read_reply(&mut client).await.1,
            rpc::accepted(3, AcceptStat::Success, &1000u32.to_be_bytes())
        );
        // Unknown program, version, procedure; arguments that do not decode.
        for (msg, want) in [
            (
                call(4, 999, 1, 0, None, &[]),
                rpc::accepted(4, AcceptStat::ProgUnavail, &[]),
            ),
            (
                call(5, 400_000, 2, 0, None, &[]),
                rpc::prog_mismatch(5, 1, 1),
            ),
            (
                call(6, 400_000, 1, 9, None, &[]),
                rpc::accepted(6, AcceptStat::ProcUnavail, &[]),
            ),
            (
                call(7, 400_000, 1, 1, None, &[1]),
                rpc::accepted(7, AcceptStat::GarbageArgs, &[]),
            ),
        ] {
            client.write_all(&msg).await.unwrap();
            assert_eq!(read_reply(&mut client).await.1, want);
        }
        // A record past the limit ends the connection (its framing cannot be trusted).
        client
            .write_all(&(0x8000_0000u32 | (1 << 20)).to_be_bytes())
            .await
            .unwrap();
        assert!(served.await.unwrap().is_err());
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn a_resent_call_that_is_not_idempotent_gets_the_first_reply() {
        let d = Dispatcher::new(vec![Arc::new(Echo::default())], 64 * 1024);
        let count = |xid, ms: u32| call(xid, 400_000, 1, 3, Some(7), &ms.to_be_bytes());
        let unframe = |r: Vec<u8>| r[4..].to_vec();
        let first = d.reply(&unframe(count(10, 0))).await.unwrap();
        assert_eq!(first[24..], 1u32.to_be_bytes());
        // The same call again: the first reply, the procedure not run again.
        assert_eq!(d.reply(&unframe(count(10, 0))).await.unwrap(), first);
        // The same xid from another client, or another call under the same xid, runs.
        let far = Some("192.0.2.1".parse().unwrap());
        let r = d.reply_to(&unframe(count(10, 0)), far).await.unwrap();
        assert_eq!(r[24..], 2u32.to_be_bytes());
        let r = d.reply(&unframe(count(10, 1))).await.unwrap();
        assert_eq!(r[24..], 3u32.to_be_bytes());
        // A copy that arrives while the first still runs gets no reply of its own.
        let eleven = unframe(count(11, 200));
        let (slow, copy) = tokio::join!(d.reply(&eleven), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            d.reply(&eleven).await
        });
        assert_eq!(slow.unwrap()[24..], 4u32.to_be_bytes());
        assert_eq!(copy, None);
        // A call given up before it finished leaves nothing behind: its resend runs.
        let twelve = unframe(count(12, 200));
        let gave_up = tokio::time::timeout(Duration::from_millis(20), d.reply(&twelve)).await;
        assert!(gave_up.is_err());
        assert_eq!(d.reply(&twelve).await.unwrap()[24..], 5u32.to_be_bytes());
        // Idempotent procedures are not kept.
        let echo = unframe(call(13, 400_000, 1, 1, None, &0u32.to_be_bytes()));
        d.reply(&echo).await.unwrap();
        assert!(d.replies.lock().iter().all(|((_, xid, _), _)| *xid != 13));
    }
}
