//! Lost writes are reported at fsync, as the kernel reports writeback errors.
//!
//! The mount writes through to the server, which holds a write in memory until an fsync makes
//! it durable. If the connection breaks (the server crashed or restarted) while a file has
//! writes no fsync has covered, those writes may be gone, and the mount reconnects without
//! telling anyone. An fsync that then succeeded would be a lie, so the file records the loss
//! and the next fsync through each descriptor open at the time fails with EIO, once, as
//! Linux's errseq does for a failed writeback. A descriptor opened after the loss sees it too
//! if no fsync has reported it yet, so a process that opens a file only to fsync it (as
//! PostgreSQL's checkpointer does) still learns of it. PostgreSQL then panics and recovers
//! from its WAL rather than trust pages that never reached the bucket.

use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(super) struct WriteErrors {
    /// Server inodes written (or truncated) since their last successful fsync.
    unsynced: HashSet<u64>,
    /// Per inode, how many losses happened and whether an fsync reported the latest one.
    lost: HashMap<u64, Loss>,
}

#[derive(Clone, Copy, Default)]
struct Loss {
    count: u64,
    reported: bool,
}

impl WriteErrors {
    /// A write or truncate of `ino` succeeded on the server; an fsync must follow for it to
    /// be durable.
    pub fn wrote(&mut self, ino: u64) {
        self.unsynced.insert(ino);
    }

    /// The connection broke: every write not yet covered by an fsync may be lost.
    pub fn connection_lost(&mut self) {
        for ino in self.unsynced.drain() {
            let l = self.lost.entry(ino).or_default();
            l.count += 1;
            l.reported = false;
        }
    }

    /// The mark a new descriptor of `ino` starts from: losses before it are not its concern,
    /// unless none was reported yet.
    pub fn sample(&self, ino: u64) -> u64 {
        match self.lost.get(&ino) {
            Some(l) if l.reported => l.count,
            _ => 0,
        }
    }

    /// Called after an fsync of `ino` through a descriptor whose mark is `seen`: EIO if a loss
    /// happened since that mark (the mark moves past it), else the fsync's own result. A
    /// successful fsync makes everything written so far durable.
    pub fn fsynced(
        &mut self,
        ino: u64,
        seen: &mut u64,
        result: Result<(), i32>,
    ) -> Result<(), i32> {
        if result.is_ok() {
            self.unsynced.remove(&ino);
        }
        match self.lost.get_mut(&ino) {
            Some(l) if l.count > *seen => {
                *seen = l.count;
                l.reported = true;
                Err(libc::EIO)
            }
            _ => result,
        }
    }

    /// A file that no descriptor holds any more and that has nothing unreported forgets its
    /// losses, so the map does not grow with every file ever written.
    pub fn forget(&mut self, ino: u64) {
        if self.lost.get(&ino).is_some_and(|l| l.reported) {
            self.lost.remove(&ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_is_reported_once_per_descriptor_then_fsync_works_again() {
        let mut w = WriteErrors::default();
        let (mut a, mut b) = (w.sample(7), w.sample(7));
        w.wrote(7);
        w.connection_lost();
        assert_eq!(w.fsynced(7, &mut a, Ok(())), Err(libc::EIO));
        assert_eq!(w.fsynced(7, &mut a, Ok(())), Ok(()));
        assert_eq!(w.fsynced(7, &mut b, Ok(())), Err(libc::EIO));
        // Reported: a descriptor opened now does not see it.
        let mut c = w.sample(7);
        assert_eq!(w.fsynced(7, &mut c, Ok(())), Ok(()));
    }

    #[test]
    fn an_unreported_loss_reaches_a_descriptor_opened_after_it() {
        let mut w = WriteErrors::default();
        w.wrote(3);
        w.connection_lost();
        let mut late = w.sample(3);
        assert_eq!(w.fsynced(3, &mut late, Ok(())), Err(libc::EIO));
    }

    #[test]
    fn synced_or_untouched_files_lose_nothing() {
        let mut w = WriteErrors::default();
        let mut a = w.sample(1);
        w.wrote(1);
        assert_eq!(w.fsynced(1, &mut a, Ok(())), Ok(()));
        w.connection_lost();
        assert_eq!(w.fsynced(1, &mut a, Ok(())), Ok(()));
        let mut other = w.sample(2);
        assert_eq!(w.fsynced(2, &mut other, Ok(())), Ok(()));
    }

    #[test]
    fn a_failed_fsync_keeps_the_file_unsynced() {
        let mut w = WriteErrors::default();
        let mut a = w.sample(5);
        w.wrote(5);
        assert_eq!(w.fsynced(5, &mut a, Err(libc::EIO)), Err(libc::EIO));
        w.connection_lost();
        assert_eq!(w.fsynced(5, &mut a, Ok(())), Err(libc::EIO));
    }
}
