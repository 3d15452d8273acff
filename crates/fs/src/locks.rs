//! Per-inode locks: a mutation locks the inodes it reads and writes, in ascending order (so two
//! mutations never wait for each other in a cycle), and clients working on different inodes
//! never wait for one another. A lock exists only while someone holds or waits for it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub(crate) struct LockTable {
    locks: Mutex<HashMap<u64, Arc<AsyncMutex<()>>>>,
}

/// The locks of some inodes, released when dropped.
pub(crate) struct Held<'a> {
    table: &'a LockTable,
    inos: Vec<u64>,
    guards: Vec<OwnedMutexGuard<()>>,
}

impl LockTable {
    pub async fn lock(&self, inos: &[u64]) -> Held<'_> {
        let mut inos = inos.to_vec();
        inos.sort_unstable();
        inos.dedup();
        let mut held = Held {
            table: self,
            inos: Vec::with_capacity(inos.len()),
            guards: Vec::with_capacity(inos.len()),
        };
        for ino in inos {
            let lock = self.locks.lock().entry(ino).or_default().clone();
            // Registered before the wait, so that a drop while waiting forgets it too.
            held.inos.push(ino);
            held.guards.push(lock.lock_owned().await);
        }
        held
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.guards.clear();
        let mut locks = self.table.locks.lock();
        for ino in &self.inos {
            // Only the table refers to it: nobody holds or waits for it.
            if locks.get(ino).is_some_and(|l| Arc::strong_count(l) == 1) {
                locks.remove(ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn locks_exclude_and_are_forgotten_when_free() {
        let t = Arc::new(LockTable::default());
        let a = t.lock(&[3, 1, 3]).await;
        assert_eq!(t.len(), 2);
        let t2 = t.clone();
        let waiter = tokio::spawn(async move {
            let _b = t2.lock(&[1]).await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "inode 1 is held");
        let _c = t.lock(&[2]).await;
        drop(a);
        waiter.await.unwrap();
        assert_eq!(t.len(), 1, "only inode 2 is still held");
    }
}
