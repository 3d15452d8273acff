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
    /// Per open descriptor (FUSE file handle): its inode and the loss count it has seen.
    seen: HashMap<u64, (u64, u64)>,
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

    /// A descriptor `fh` of `ino` opens: losses before it are not its concern, unless none was
    /// reported yet.
    pub fn open(&mut self, fh: u64, ino: u64) {
        let mark = match self.lost.get(&ino) {
            Some(l) if l.reported => l.count,
            _ => 0,
        };
        self.seen.insert(fh, (ino, mark));
    }

    /// After an fsync through `fh`: EIO if a loss happened since the descriptor last looked
    /// (which it now has), else the fsync's own result. A successful fsync makes everything
    /// written so far durable.
    pub fn fsynced(&mut self, fh: u64, result: Result<(), i32>) -> Result<(), i32> {
        let Some((ino, seen)) = self.seen.get_mut(&fh) else {
            return result;
        };
        if result.is_ok() {
            self.unsynced.remove(ino);
        }
        match self.lost.get_mut(ino) {
            Some(l) if l.count > *seen => {
                *seen = l.count;
                l.reported = true;
                Err(libc::EIO)
            }
            _ => result,
        }
    }

    /// A descriptor closes. When no descriptor holds its file any more and nothing is left to
    /// report, the file's losses are forgotten, so the map does not grow with every file.
    pub fn release(&mut self, fh: u64) {
        let Some((ino, _)) = self.seen.remove(&fh) else {
            return;
        };
        if !self.seen.values().any(|(i, _)| *i == ino)
            && self.lost.get(&ino).is_some_and(|l| l.reported)
        {
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
        w.open(1, 7);
        w.open(2, 7);
        w.wrote(7);
        w.connection_lost();
        assert_eq!(w.fsynced(1, Ok(())), Err(libc::EIO));
        assert_eq!(w.fsynced(1, Ok(())), Ok(()));
        assert_eq!(w.fsynced(2, Ok(())), Err(libc::EIO));
        // Reported: a descriptor opened now does not see it.
        w.open(3, 7);
        assert_eq!(w.fsynced(3, Ok(())), Ok(()));
    }

    #[test]
    fn an_unreported_loss_reaches_a_descriptor_opened_after_it() {
        let mut w = WriteErrors::default();
        w.open(1, 3);
        w.wrote(3);
        w.release(1);
        w.connection_lost();
        w.open(2, 3);
        assert_eq!(w.fsynced(2, Ok(())), Err(libc::EIO));
        w.release(2);
        assert!(w.lost.is_empty() && w.seen.is_empty());
    }

    #[test]
    fn synced_or_untouched_files_lose_nothing() {
        let mut w = WriteErrors::default();
        w.open(1, 1);
        w.wrote(1);
        assert_eq!(w.fsynced(1, Ok(())), Ok(()));
        w.connection_lost();
        assert_eq!(w.fsynced(1, Ok(())), Ok(()));
        w.open(2, 2);
        assert_eq!(w.fsynced(2, Ok(())), Ok(()));
    }

    #[test]
    fn a_failed_fsync_keeps_the_file_unsynced() {
        let mut w = WriteErrors::default();
        w.open(1, 5);
        w.wrote(5);
        assert_eq!(w.fsynced(1, Err(libc::EIO)), Err(libc::EIO));
        w.connection_lost();
        assert_eq!(w.fsynced(1, Ok(())), Err(libc::EIO));
    }
}
