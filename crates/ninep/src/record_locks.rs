//! POSIX advisory record locks (fcntl F_SETLK / F_GETLK, and flock, which v9fs sends as
//! whole-file record locks), kept in memory for the clients of this process: they do not
//! survive a restart, as no lock of a local filesystem survives a reboot. A blocking request
//! that conflicts is answered BLOCKED; v9fs retries it until it is granted.

use parking_lot::Mutex;
use std::collections::HashMap;

pub const LOCK_READ: u8 = 0;
pub const LOCK_WRITE: u8 = 1;
pub const LOCK_UNLOCK: u8 = 2;

/// Who holds a lock: the connection, the client's node name and the process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    pub connection: u64,
    pub client_id: Vec<u8>,
    pub proc_id: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub owner: Owner,
    pub kind: u8,
    pub start: u64,
    /// Exclusive; u64::MAX: to the end of the file, however far it grows.
    pub end: u64,
}

#[derive(Default)]
pub struct RecordLocks {
    by_ino: Mutex<HashMap<u64, Vec<Held>>>,
}

/// The end of a range of `length` bytes from `start` (0: to the end of the file).
pub fn range_end(start: u64, length: u64) -> u64 {
    if length == 0 {
        u64::MAX
    } else {
        start.saturating_add(length)
    }
}

fn conflicts(a: &Held, kind: u8, owner: &Owner, start: u64, end: u64) -> bool {
    a.owner != *owner
        && a.start < end
        && start < a.end
        && (a.kind == LOCK_WRITE || kind == LOCK_WRITE)
}

impl RecordLocks {
    /// Takes, changes or releases (LOCK_UNLOCK) `owner`'s lock on `start..end`: false if
    /// another owner's lock conflicts.
    pub fn set(&self, ino: u64, owner: &Owner, kind: u8, start: u64, end: u64) -> bool {
        let mut all = self.by_ino.lock();
        let locks = all.entry(ino).or_default();
        if kind != LOCK_UNLOCK && locks.iter().any(|l| conflicts(l, kind, owner, start, end)) {
            return false;
        }
        // The owner's locks lose what the new range covers; what is left either side stays.
        let mut kept = Vec::with_capacity(locks.len() + 2);
        for l in locks.drain(..) {
            if l.owner != *owner || l.end <= start || end <= l.start {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(Held {
                    end: start,
                    ..l.clone()
                });
            }
            if end < l.end {
                kept.push(Held { start: end, ..l });
            }
        }
        if kind != LOCK_UNLOCK {
            kept.push(Held {
                owner: owner.clone(),
                kind,
                start,
                end,
            });
        }
        if kept.is_empty() {
            all.remove(&ino);
        } else {
            *all.get_mut(&ino).expect("the entry made above") = kept;
        }
        true
    }

    /// The first lock of another owner that would conflict with this one, if any.
    pub fn conflict(
        &self,
        ino: u64,
        owner: &Owner,
        kind: u8,
        start: u64,
        end: u64,
    ) -> Option<Held> {
        let all = self.by_ino.lock();
        all.get(&ino)?
            .iter()
            .find(|l| conflicts(l, kind, owner, start, end))
            .cloned()
    }

    /// Drops every lock taken through a connection, when it closes.
    pub fn release_connection(&self, connection: u64) {
        let mut all = self.by_ino.lock();
        all.retain(|_, locks| {
            locks.retain(|l| l.owner.connection != connection);
            !locks.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(p: u32) -> Owner {
        Owner {
            connection: 1,
            client_id: b"host".to_vec(),
            proc_id: p,
        }
    }

    #[test]
    fn readers_share_writers_exclude_and_ranges_split() {
        let l = RecordLocks::default();
        assert!(l.set(9, &owner(1), LOCK_READ, 0, 100));
        assert!(l.set(9, &owner(2), LOCK_READ, 50, 150));
        assert!(!l.set(9, &owner(3), LOCK_WRITE, 120, 130));
        assert!(l.set(9, &owner(3), LOCK_WRITE, 150, u64::MAX));
        // Owner 2 unlocks the middle of its range: 120..130 is free of it, 50..120 is not.
        assert!(l.set(9, &owner(2), LOCK_UNLOCK, 100, 140));
        assert!(l.set(9, &owner(4), LOCK_WRITE, 120, 130));
        assert_eq!(
            l.conflict(9, &owner(5), LOCK_WRITE, 60, 61)
                .map(|h| h.owner.proc_id),
            Some(1)
        );
        assert!(
            l.conflict(9, &owner(1), LOCK_WRITE, 0, 10).is_none(),
            "its own lock"
        );
        l.release_connection(1);
        assert!(l.conflict(9, &owner(5), LOCK_WRITE, 0, u64::MAX).is_none());
    }
}
