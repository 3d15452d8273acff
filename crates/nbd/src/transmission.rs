//! The transmission phase. One reader (this task) parses and validates requests in order; each
//! valid request runs in its own task so slow ones do not hold up the rest, and writes its own
//! reply as soon as it completes, in any order, through the connection's `ReplyWriter`, which
//! keeps replies from interleaving. Two semaphores bound what a connection may have
//! outstanding: a request count and a payload byte count. A permit is held until the reply has
//! been written, so a client that stops reading replies stops being read from, and memory stays
//! bounded. Write payloads are read into buffers that the connection reuses (`PayloadBuffers`).

use crate::backend::{Export, ExportError, Extent};
use crate::error::{errno_of, NbdError};
use crate::handshake::Session;
use crate::limits::{
    BLOCK_STATUS_DESCRIPTORS_MAX, PAYLOAD_BUFFER_BYTES_KEPT, PAYLOAD_BYTES_IN_FLIGHT_MAX,
    REPLY_BUFFER_BYTES, REQUESTS_IN_FLIGHT_MAX, WRITE_DISCARD_BYTES_MAX,
};
use crate::proto::{self, RequestHeader};
use crate::request::{command_name, validate, Command, Rejection, Request, Target};
use bytes::Bytes;
use futures::FutureExt;
use parking_lot::Mutex;
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tracing::{debug, error, warn, Instrument, Span};

/// One encoded reply, with the permits it releases once written.
struct Reply {
    head: Vec<u8>,
    data: Option<Bytes>,
    _permits: Permits,
}

struct Permits {
    _request: OwnedSemaphorePermit,
    _payload: Option<OwnedSemaphorePermit>,
}

/// What a command produced, ready to encode.
enum Outcome {
    Done,
    Data {
        offset: u64,
        data: Bytes,
    },
    Extents {
        context_id: u32,
        descriptors: Vec<(u32, u32)>,
    },
}

/// Serves requests until the client disconnects, then waits for every request in flight to be
/// answered before returning.
pub(crate) async fn serve<R, W>(mut reader: R, writer: W, session: Session) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let writer = Arc::new(ReplyWriter::new(writer));
    let mut tasks = JoinSet::new();

    let read_result = read_requests(&mut reader, &session, &writer, &mut tasks).await;

    // Requests already handed to the export run to completion and are answered even when the
    // client broke the protocol: abandoning an export call midway could leave a write half done.
    while let Some(joined) = tasks.join_next().await {
        report_task(joined);
    }
    let write_result = writer.finish().await;
    read_result?;
    write_result.map_err(NbdError::Io)
}

/// The socket's write side, shared by the tasks that answer requests. Whoever completes writes
/// its own reply: no hand-over to another task, whose wake-up cost more than the write on the
/// fsync path. Replies never interleave (one writer at a time), and the socket is flushed by
/// the last writer of a run: a reply written while others wait for the lock leaves with
/// theirs, in one system call.
struct ReplyWriter<W> {
    out: tokio::sync::Mutex<BufWriter<W>>,
    /// Tasks waiting for `out`; the holder leaves the flush to them.
    waiting: AtomicUsize,
    /// Set once a write failed: nothing more can reach the client.
    broken: AtomicBool,
    error: Mutex<Option<io::Error>>,
}

impl<W: AsyncWrite + Unpin> ReplyWriter<W> {
    fn new(writer: W) -> ReplyWriter<W> {
        ReplyWriter {
            out: tokio::sync::Mutex::new(BufWriter::with_capacity(REPLY_BUFFER_BYTES, writer)),
            waiting: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            error: Mutex::new(None),
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Writes one reply, then releases its permits. After a failed write the reply is dropped:
    /// the connection is gone, and there is nobody left to answer.
    async fn send(&self, reply: Reply) {
        if self.is_broken() {
            return;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let mut out = self.out.lock().await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        if self.is_broken() {
            return;
        }
        let mut written = write_reply(&mut out, &reply).await;
        // A task that is waiting flushes after its own reply, so its wait covers this one too;
        // it cannot give up meanwhile (request tasks are never cancelled).
        if written.is_ok() && self.waiting.load(Ordering::Acquire) == 0 {
            written = out.flush().await;
        }
        if let Err(error) = written {
            self.broken.store(true, Ordering::Release);
            self.error.lock().get_or_insert(error);
        }
    }

    /// Once every reply is written: shuts the write side down, or returns the first write error.
    async fn finish(&self) -> io::Result<()> {
        let mut out = self.out.lock().await;
        if let Some(error) = self.error.lock().take() {
            return Err(error);
        }
        // Every reply is out; the client may already have closed its end, which is not an error.
        if let Err(error) = out.shutdown().await {
            debug!(%error, "shutting down the connection");
        }
        Ok(())
    }
}

fn report_task(joined: Result<(), JoinError>) {
    if let Err(join_error) = joined {
        // Panics are caught inside the task and answered with EIO, so this is a cancellation,
        // which nothing here asks for.
        error!(%join_error, "request task ended without replying");
    }
}

async fn read_requests<R, W>(
    reader: &mut R,
    session: &Session,
    writer: &Arc<ReplyWriter<W>>,
    tasks: &mut JoinSet<()>,
) -> Result<(), NbdError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let requests = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX));
    let payload_bytes = Arc::new(Semaphore::new(PAYLOAD_BYTES_IN_FLIGHT_MAX));
    let payload_buffers = Arc::new(PayloadBuffers::default());
    let target = Target {
        size_bytes: session.size_bytes,
        read_only: session.read_only,
        block_status_context: session.block_status_context,
    };
    let structured = session.structured_replies;

    loop {
        // Reap finished tasks so the set does not grow over a long-lived connection.
        while let Some(joined) = tasks.try_join_next() {
            report_task(joined);
        }
        if writer.is_broken() {
            // A reply could not be written; that error is the one worth reporting.
            return Ok(());
        }

        let mut header_bytes = [0u8; proto::REQUEST_HEADER_BYTES];
        if !read_header(reader, &mut header_bytes).await? {
            debug!("client closed the connection without NBD_CMD_DISC");
            return Ok(());
        }
        let header = RequestHeader::decode(&header_bytes)
            .ok_or_else(|| NbdError::Protocol("request without the request magic".into()))?;
        let request_permit = Arc::clone(&requests)
            .acquire_owned()
            .await
            .expect("the request semaphore is never closed");

        let command = match validate(&header, &target) {
            Ok(Request::Disconnect) => {
                debug!("client sent NBD_CMD_DISC");
                return Ok(());
            }
            Ok(Request::Command(command)) => command,
            Err(rejection) => {
                debug!(
                    command = command_name(header.command),
                    handle = header.handle,
                    errno = rejection.errno,
                    message = %rejection.message,
                    "request refused"
                );
                // A refused write's payload is still on the wire and must be consumed to reach
                // the next request, unless it is too large to be anything but an attack.
                let discard = header.command == proto::CMD_WRITE && header.length > 0;
                let hard_disconnect = discard && header.length > WRITE_DISCARD_BYTES_MAX;
                if discard && !hard_disconnect {
                    discard_payload(reader, header.length).await?;
                }
                let permits = Permits {
                    _request: request_permit,
                    _payload: None,
                };
                let reply = encode_reply(header.handle, structured, Err(rejection), permits);
                writer.send(reply).await;
                if hard_disconnect {
                    return Err(NbdError::Protocol(format!(
                        "write of {} bytes, too large to skip",
                        header.length
                    )));
                }
                continue;
            }
        };

        let payload_permit = match command {
            Command::Read { length, .. } | Command::Write { length, .. } if length > 0 => Some(
                Arc::clone(&payload_bytes)
                    .acquire_many_owned(length)
                    .await
                    .expect("the payload semaphore is never closed"),
            ),
            _ => None,
        };
        let payload = match command {
            Command::Write { length, .. } if length > 0 => {
                let mut buffer = payload_buffers.take();
                read_payload(reader, length, &mut buffer).await?;
                Some(buffer)
            }
            _ => None,
        };
        let permits = Permits {
            _request: request_permit,
            _payload: payload_permit,
        };

        let export = Arc::clone(&session.export);
        let writer = Arc::clone(writer);
        let payload_buffers = Arc::clone(&payload_buffers);
        let handle = header.handle;
        let task = async move {
            let executed = AssertUnwindSafe(execute(&*export, command, payload.as_deref()))
                .catch_unwind()
                .await;
            if let Some(buffer) = payload {
                payload_buffers.give_back(buffer);
            }
            let outcome = match executed {
                Ok(outcome) => outcome,
                Err(_) => {
                    error!(?command, handle, "export panicked while serving a request");
                    Err(Rejection::new(proto::EIO, "internal server error"))
                }
            };
            writer
                .send(encode_reply(handle, structured, outcome, permits))
                .await;
        };
        tasks.spawn(task.instrument(Span::current()));
    }
}

/// Reads a request header; `false` when the client closed the connection between requests.
async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut R,
    bytes: &mut [u8; proto::REQUEST_HEADER_BYTES],
) -> Result<bool, NbdError> {
    let mut filled = 0;
    while filled < bytes.len() {
        let count = reader.read(&mut bytes[filled..]).await?;
        if count == 0 {
            if filled == 0 {
                return Ok(false);
            }
            return Err(NbdError::Protocol(format!(
                "connection closed after {filled} bytes of a request header"
            )));
        }
        filled += count;
    }
    Ok(true)
}

/// Write payload buffers of one connection, kept for its next writes: a fresh buffer per write
/// was fresh memory per write, and the kernel zeroing its pages was 8 % of bucketfs's CPU under
/// 1 MiB sequential writes (perf, 2-core VM). At most PAYLOAD_BUFFER_BYTES_KEPT are kept.
#[derive(Default)]
struct PayloadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl PayloadBuffers {
    fn take(&self) -> Vec<u8> {
        self.free.lock().pop().unwrap_or_default()
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        buffer.clear();
        let mut free = self.free.lock();
        let kept: usize = free.iter().map(Vec::capacity).sum();
        if kept + buffer.capacity() <= PAYLOAD_BUFFER_BYTES_KEPT {
            free.push(buffer);
        }
    }
}

/// Reads a write's payload into `buffer` (emptied first).
async fn read_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    length: u32,
    buffer: &mut Vec<u8>,
) -> Result<(), NbdError> {
    buffer.clear();
    buffer.reserve(length as usize);
    // `take` keeps the read from running into the next request's header.
    let mut limited = reader.take(u64::from(length));
    while buffer.len() < length as usize {
        if limited.read_buf(buffer).await? == 0 {
            return Err(NbdError::Protocol(format!(
                "connection closed after {} of {length} write payload bytes",
                buffer.len()
            )));
        }
    }
    Ok(())
}

async fn discard_payload<R: AsyncRead + Unpin>(
    reader: &mut R,
    length: u32,
) -> Result<(), NbdError> {
    let skipped =
        tokio::io::copy(&mut reader.take(u64::from(length)), &mut tokio::io::sink()).await?;
    if skipped < u64::from(length) {
        return Err(NbdError::Protocol(format!(
            "connection closed after {skipped} of {length} write payload bytes"
        )));
    }
    Ok(())
}

/// Runs one validated command against the export.
async fn execute(
    export: &dyn Export,
    command: Command,
    payload: Option<&[u8]>,
) -> Result<Outcome, Rejection> {
    let failed = |error: ExportError| {
        if matches!(error, ExportError::Io(_)) {
            warn!(?command, %error, "export i/o error");
        } else {
            debug!(?command, %error, "export refused request");
        }
        Rejection::new(errno_of(&error), error.to_string())
    };
    match command {
        Command::Read { offset, length: 0 } => Ok(Outcome::Data {
            offset,
            data: Bytes::new(),
        }),
        Command::Read { offset, length } => {
            let data = export.read(offset, length).await.map_err(failed)?;
            // A short or long buffer would desynchronise the stream for simple replies.
            if data.len() != length as usize {
                error!(
                    offset,
                    length,
                    returned = data.len(),
                    "export returned a wrong-sized read"
                );
                return Err(Rejection::new(
                    proto::EIO,
                    "internal server error: short read",
                ));
            }
            Ok(Outcome::Data { offset, data })
        }
        Command::Write { length: 0, .. } => Ok(Outcome::Done),
        Command::Write {
            offset,
            length,
            fua,
        } => {
            let data = payload.expect("the reader attaches the payload of every nonempty write");
            assert_eq!(data.len(), length as usize, "write payload length");
            export.write(offset, data, fua).await.map_err(failed)?;
            Ok(Outcome::Done)
        }
        Command::Flush => {
            export.flush().await.map_err(failed)?;
            Ok(Outcome::Done)
        }
        Command::Trim { length: 0, .. } => Ok(Outcome::Done),
        Command::Trim {
            offset,
            length,
            fua,
        } => {
            export.trim(offset, length, fua).await.map_err(failed)?;
            Ok(Outcome::Done)
        }
        Command::Cache { length: 0, .. } => Ok(Outcome::Done),
        Command::Cache { offset, length } => {
            export.cache(offset, length).await.map_err(failed)?;
            Ok(Outcome::Done)
        }
        Command::WriteZeroes { length: 0, .. } => Ok(Outcome::Done),
        Command::WriteZeroes {
            offset,
            length,
            may_punch,
            fua,
            fast_only,
        } => {
            if fast_only && !export.zeroes_are_fast(may_punch) {
                return Err(Rejection::new(
                    proto::ENOTSUP,
                    "zeroing is not faster than writing here",
                ));
            }
            export
                .write_zeroes(offset, length, may_punch, fua)
                .await
                .map_err(failed)?;
            Ok(Outcome::Done)
        }
        Command::BlockStatus {
            offset,
            length,
            one_extent,
            context_id,
        } => {
            let extents = export.block_status(offset, length).await.map_err(failed)?;
            let descriptors = block_status_descriptors(&extents, length, one_extent)?;
            Ok(Outcome::Extents {
                context_id,
                descriptors,
            })
        }
    }
}

fn encode_reply(
    handle: u64,
    structured: bool,
    outcome: Result<Outcome, Rejection>,
    permits: Permits,
) -> Reply {
    let (head, data) = match outcome {
        Err(rejection) if structured => (
            proto::encode_structured_error(handle, rejection.errno, &rejection.message),
            None,
        ),
        Err(rejection) => (
            proto::encode_simple_reply(handle, rejection.errno).to_vec(),
            None,
        ),
        Ok(Outcome::Data { data, .. }) if !structured => {
            (proto::encode_simple_reply(handle, 0).to_vec(), Some(data))
        }
        // An offset-data chunk must carry a byte; an empty read is just done.
        Ok(Outcome::Data { data, .. }) if data.is_empty() => {
            (proto::encode_structured_done(handle), None)
        }
        Ok(Outcome::Data { offset, data }) => {
            let length =
                u32::try_from(data.len()).expect("reads are at most REQUEST_PAYLOAD_BYTES_MAX");
            (
                proto::encode_offset_data_header(handle, offset, length),
                Some(data),
            )
        }
        // Only negotiated with structured replies, so a structured chunk is always allowed.
        Ok(Outcome::Extents {
            context_id,
            descriptors,
        }) => (
            proto::encode_block_status(handle, context_id, &descriptors),
            None,
        ),
        // Success without data: a simple reply is allowed even when structured replies are on.
        Ok(Outcome::Done) => (proto::encode_simple_reply(handle, 0).to_vec(), None),
    };
    Reply {
        head,
        data,
        _permits: permits,
    }
}

/// Turns the export's extents into `base:allocation` descriptors that obey the protocol:
/// nonzero lengths, within the request, neighbours with different flags, at most one with
/// REQ_ONE, and at most `BLOCK_STATUS_DESCRIPTORS_MAX`.
fn block_status_descriptors(
    extents: &[Extent],
    request_length: u32,
    one_extent: bool,
) -> Result<Vec<(u32, u32)>, Rejection> {
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut covered: u32 = 0;
    for extent in extents {
        let room = request_length - covered;
        if room == 0 {
            break;
        }
        let length = extent.length.min(room);
        if length == 0 {
            continue;
        }
        let flags = if extent.hole { proto::STATE_HOLE } else { 0 }
            | if extent.zero { proto::STATE_ZERO } else { 0 };
        if let Some(last) = descriptors.last_mut().filter(|last| last.1 == flags) {
            last.0 += length;
        } else if descriptors.len() == BLOCK_STATUS_DESCRIPTORS_MAX {
            break;
        } else {
            descriptors.push((length, flags));
        }
        covered += length;
    }
    if descriptors.is_empty() {
        error!(
            request_length,
            "export reported no extents for a block status request"
        );
        return Err(Rejection::new(
            proto::EIO,
            "internal server error: no extents",
        ));
    }
    if one_extent {
        descriptors.truncate(1);
    }
    Ok(descriptors)
}

async fn write_reply<W: AsyncWrite + Unpin>(
    out: &mut BufWriter<W>,
    reply: &Reply,
) -> io::Result<()> {
    out.write_all(&reply.head).await?;
    if let Some(data) = &reply.data {
        out.write_all(data).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(length: u32, hole: bool, zero: bool) -> Extent {
        Extent { length, hole, zero }
    }

    #[test]
    fn descriptors_merge_equal_neighbours_and_clip_to_the_request() {
        let extents = [
            extent(4096, false, false),
            extent(4096, false, false),
            extent(8192, true, true),
            extent(4096, false, true),
        ];
        let descriptors = block_status_descriptors(&extents, 12288, false).expect("valid");
        assert_eq!(
            descriptors,
            vec![(8192, 0), (4096, proto::STATE_HOLE | proto::STATE_ZERO)]
        );
    }

    #[test]
    fn descriptors_skip_empty_extents_and_honour_req_one() {
        let extents = [
            extent(0, true, true),
            extent(512, true, true),
            extent(512, false, false),
        ];
        assert_eq!(
            block_status_descriptors(&extents, 1024, true).expect("valid"),
            vec![(512, proto::STATE_HOLE | proto::STATE_ZERO)]
        );
    }

    #[test]
    fn descriptors_need_at_least_one_extent() {
        assert_eq!(
            block_status_descriptors(&[], 512, false).map_err(|r| r.errno),
            Err(proto::EIO)
        );
        assert_eq!(
            block_status_descriptors(&[extent(0, false, false)], 512, false).map_err(|r| r.errno),
            Err(proto::EIO)
        );
    }

    #[test]
    fn descriptors_are_bounded() {
        let extents: Vec<Extent> = (0..BLOCK_STATUS_DESCRIPTORS_MAX + 10)
            .map(|index| extent(1, index.is_multiple_of(2), false))
            .collect();
        let descriptors = block_status_descriptors(&extents, u32::MAX, false).expect("valid");
        assert_eq!(descriptors.len(), BLOCK_STATUS_DESCRIPTORS_MAX);
    }

    /// Many tasks answering at once over a narrow pipe: the lock is contended and writes wait
    /// for the client, so writers often leave the flush to those waiting behind them. Every
    /// reply must still reach the client, whole and without `finish`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_replies_all_reach_the_client_without_a_final_flush() {
        const REPLIES: u64 = 200;
        let (client, server) = tokio::io::duplex(64);
        let writer = Arc::new(ReplyWriter::new(server));
        let requests = Arc::new(Semaphore::new(REPLIES as usize));
        let mut tasks = JoinSet::new();
        for handle in 0..REPLIES {
            let writer = Arc::clone(&writer);
            let permit = Arc::clone(&requests).try_acquire_owned().expect("permit");
            tasks.spawn(async move {
                let permits = Permits {
                    _request: permit,
                    _payload: None,
                };
                let data = Bytes::from(vec![handle as u8; 100 + handle as usize]);
                let outcome = Ok(Outcome::Data { offset: 0, data });
                writer
                    .send(encode_reply(handle, false, outcome, permits))
                    .await;
            });
        }
        let mut client = client;
        let mut seen = std::collections::HashSet::new();
        let read_all = async {
            while (seen.len() as u64) < REPLIES {
                let mut head = [0u8; 16];
                client.read_exact(&mut head).await.expect("reply header");
                let handle = u64::from_be_bytes(head[8..16].try_into().unwrap());
                let mut data = vec![0u8; 100 + handle as usize];
                client.read_exact(&mut data).await.expect("reply data");
                assert!(data.iter().all(|&b| b == handle as u8), "reply {handle}");
                assert!(seen.insert(handle), "reply {handle} twice");
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), read_all)
            .await
            .expect("every reply arrives");
        while let Some(joined) = tasks.join_next().await {
            joined.expect("task");
        }
        assert_eq!(requests.available_permits(), REPLIES as usize);
    }
}
