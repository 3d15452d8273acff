//! POSIX record locks (fcntl F_SETLK, F_SETLKW, F_GETLK) through the server, so that processes
//! on different mounts, and the server's other clients, see each other's locks. The kernel
//! names a lock's owner by an opaque number (its file table), which goes to the server as the
//! 9P client id; the process id goes as 9P's proc_id, for F_GETLK to report, and since the
//! server tells owners apart by both, the pid of an owner's first lock is sent with all its
//! later requests on the file (the kernel sends pid 0 with an unlock). A blocking
//! request that the server answers BLOCKED is retried on a thread of its own, so a process
//! waiting for a lock holds up no other request. The kernel releases a process's locks at
//! close through FUSE's flush, which the mount turns into an unlock of the whole file.

use super::*;
use bucketfs_ninep::client::LockOwner;

const LOCK_UNLOCK: u8 = 2;
const LOCK_GRANTED: u8 = 0;
const LOCK_BLOCKED: u8 = 1;
const LOCK_FLAGS_BLOCK: u32 = 1;
/// How long a blocked lock request waits before asking again (v9fs waits similarly).
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// The (inode, owner) pairs that have taken a lock, with the pid they took it as: a close
/// unlocks only where something may be held instead of costing every close a round trip.
#[derive(Default)]
pub(super) struct LockUsers(HashMap<(u64, u64), u32>);

fn owner(lock_owner: u64, pid: u32) -> LockOwner {
    LockOwner {
        proc_id: pid,
        client_id: format!("bucketfs-mount/{lock_owner:016x}").into_bytes(),
    }
}

/// FUSE's inclusive end (OFFSET_MAX or beyond: to the end of the file) as 9P's length.
fn length_of(start: u64, end: u64) -> u64 {
    if end >= i64::MAX as u64 {
        0
    } else {
        end.saturating_sub(start) + 1
    }
}

impl Mount {
    pub(super) fn get_lock(
        &mut self,
        ino: u64,
        fh: u64,
        lock_owner: u64,
        (start, end, kind, pid): (u64, u64, i32, u32),
    ) -> Res<(u64, u64, i32, u32)> {
        let pid = self
            .lock_users
            .0
            .get(&(ino, lock_owner))
            .copied()
            .unwrap_or(pid);
        let (c, f) = self.io_fid(fh)?;
        let l = c.getlock(
            f,
            kind as u8,
            start,
            length_of(start, end),
            &owner(lock_owner, pid),
        )?;
        if l.kind == LOCK_UNLOCK {
            return Ok((start, end, libc::F_UNLCK, 0));
        }
        let end = if l.length == 0 {
            i64::MAX as u64
        } else {
            l.start + l.length - 1
        };
        Ok((l.start, end, i32::from(l.kind), l.owner.proc_id))
    }

    /// Takes, changes or releases a lock; `reply` is answered here, or by the thread that
    /// waits for a blocked lock.
    pub(super) fn set_lock(
        &mut self,
        ino: u64,
        fh: u64,
        lock_owner: u64,
        (start, end, kind, pid): (u64, u64, i32, u32),
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (c, f) = match self.io_fid(fh) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let pid = *self.lock_users.0.entry((ino, lock_owner)).or_insert(pid);
        let o = owner(lock_owner, pid);
        let length = length_of(start, end);
        let flags = if sleep { LOCK_FLAGS_BLOCK } else { 0 };
        let answer = |status: Res<u8>| match status {
            Ok(LOCK_GRANTED) => Ok(()),
            Ok(LOCK_BLOCKED) => Err(libc::EAGAIN),
            Ok(_) => Err(libc::ENOLCK),
            Err(e) => Err(e),
        };
        match c.lock(f, kind as u8, flags, start, length, &o) {
            Ok(LOCK_BLOCKED) if sleep => {
                std::thread::spawn(move || loop {
                    std::thread::sleep(LOCK_RETRY);
                    match c.lock(f, kind as u8, flags, start, length, &o) {
                        Ok(LOCK_BLOCKED) => continue,
                        status => {
                            return match answer(status) {
                                Ok(()) => reply.ok(),
                                Err(e) => reply.error(e),
                            }
                        }
                    }
                });
            }
            status => match answer(status) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
        }
    }

    /// At a close by `lock_owner`: POSIX drops every lock the process holds on the file.
    pub(super) fn unlock_all(&mut self, ino: u64, fh: u64, lock_owner: u64) {
        let Some(pid) = self.lock_users.0.remove(&(ino, lock_owner)) else {
            return;
        };
        if let Ok((c, f)) = self.io_fid(fh) {
            let _ = c.lock(f, LOCK_UNLOCK, 0, 0, 0, &owner(lock_owner, pid));
        }
    }
}
