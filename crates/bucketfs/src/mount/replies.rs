//! Writes and fsyncs answered to FUSE from the 9P client's reader thread.
//!
//! A request the FUSE thread waits for, or hands to a worker that waits, costs a thread
//! wake-up each way on top of the round trip, and on a busy machine each wake-up can wait for
//! a core (docs/benchmarks/2026-11-30-fsync-beside-a-streamer-cpu-queueing.md). So a small
//! write or an fsync is sent by the FUSE thread itself when the socket is free, and its reply
//! goes to the kernel from the thread that read it. A large write is sent by a worker, so that
//! copying it and waiting for room in the socket never hold up the FUSE thread; its reply too
//! is answered from the reader thread, which frees the worker at once.

use super::write_errors::WriteErrors;
use super::Workers;
use bucketfs_ninep::client::{Client, Res, Sending};
use fuser::{ReplyEmpty, ReplyWrite};
use std::sync::{Arc, Mutex};

/// A request whose reply the reader thread takes.
pub(super) trait Sent: Sized {
    fn client(&self) -> Arc<Client>;
    /// Sends it on the socket held; its reply completes it on the reader thread.
    fn send_on(self, s: Sending<'_>);

    /// Sends it from the calling thread, or gives it back if another thread is sending.
    fn try_send(self) -> Result<(), Self> {
        let client = self.client();
        let Some(s) = client.sending(false) else {
            return Err(self);
        };
        self.send_on(s);
        Ok(())
    }

    /// Sends it, waiting for the socket if another thread is sending.
    fn send(self) {
        let client = self.client();
        let s = client
            .sending(true)
            .expect("a waiting send gets the socket");
        self.send_on(s)
    }
}

/// Writes of at most this many bytes may be sent by the FUSE thread itself.
pub(super) const INLINE_WRITE_BYTES_MAX: usize = 64 * 1024;

/// A write on its way to the server; a short one continues on a worker.
pub(super) struct WriteJob {
    pub client: Arc<Client>,
    pub fid: u32,
    pub offset: u64,
    pub data: Arc<[u8]>,
    pub done: usize,
    pub reply: ReplyWrite,
    pub workers: Workers,
}

impl Sent for WriteJob {
    fn client(&self) -> Arc<Client> {
        self.client.clone()
    }

    fn send_on(self, s: Sending<'_>) {
        let data = self.data.clone();
        let at = self.offset + self.done as u64;
        s.write_then(self.fid, at, &data[self.done..], move |r| self.replied(r));
    }
}

impl WriteJob {
    /// On the reader thread: answers the kernel, or hands what is left to a worker (the reader
    /// thread must not send).
    fn replied(mut self, r: Res<u32>) {
        match r {
            Ok(0) => self.reply.error(libc::EIO),
            Ok(n) => {
                self.done += n as usize;
                if self.done >= self.data.len() {
                    self.reply.written(self.data.len() as u32)
                } else {
                    let workers = self.workers.clone();
                    workers.run(move || self.send())
                }
            }
            Err(e) => self.reply.error(e),
        }
    }
}

/// An fsync on its way to the server; its outcome passes through the write errors first
/// (write_errors.rs).
pub(super) struct FsyncJob {
    pub client: Arc<Client>,
    pub fid: u32,
    pub datasync: bool,
    pub fh: u64,
    pub errors: Arc<Mutex<WriteErrors>>,
    pub reply: ReplyEmpty,
}

impl Sent for FsyncJob {
    fn client(&self) -> Arc<Client> {
        self.client.clone()
    }

    fn send_on(self, s: Sending<'_>) {
        let (fid, datasync) = (self.fid, self.datasync);
        s.fsync_then(fid, datasync, move |r| {
            let r = self
                .errors
                .lock()
                .expect("write errors lock")
                .fsynced(self.fh, r);
            match r {
                Ok(()) => self.reply.ok(),
                Err(e) => self.reply.error(e),
            }
        });
    }
}
