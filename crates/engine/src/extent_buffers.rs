//! Reusable buffers for whole extents.
//!
//! A large write copies each whole extent of its payload into a buffer of its own, which then
//! lives on as the dirty extent and, once committed, in the memory cache until it is evicted.
//! Fresh buffers for every write meant fresh memory for every write: under 1 MiB sequential
//! writes, the kernel zeroing newly faulted pages for these copies was 16 % of bucketfs's CPU
//! (perf, 2-core VM), and neither mimalloc's nor glibc's allocator kept reusing the memory that
//! cache evictions gave back. So the buffers of evicted extents come back here.

use crate::limits::{EXTENT_BUFFERS_KEPT, EXTENT_SIZE_BYTES};
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Default)]
pub struct ExtentBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl ExtentBuffers {
    /// An extent's copy of `data` (EXTENT_SIZE_BYTES long).
    pub fn copy_of(&self, data: &[u8]) -> Arc<Vec<u8>> {
        assert_eq!(data.len(), EXTENT_SIZE_BYTES, "a whole extent");
        let mut buf = match self.free.lock().pop() {
            Some(buf) => buf,
            None => Vec::with_capacity(EXTENT_SIZE_BYTES),
        };
        buf.clear();
        buf.extend_from_slice(data);
        Arc::new(buf)
    }

    /// A whole extent's buffer for a caller that overwrites all of it (an extent opened from
    /// its frame): an evicted extent's, its old bytes still in it, else a new zeroed one.
    /// Zeroing a fresh buffer for every extent read was 3 % of a cold sequential read's CPU.
    pub fn overwritable(&self) -> Vec<u8> {
        let mut buf = self.free.lock().pop().unwrap_or_default();
        buf.resize(EXTENT_SIZE_BYTES, 0);
        buf
    }

    /// Takes back the buffers of extents that left the memory cache; those still referenced
    /// elsewhere (a reader's copy) are simply dropped by their last holder.
    pub fn give_back(&self, evicted: impl IntoIterator<Item = Arc<Vec<u8>>>) {
        let mut reusable = evicted
            .into_iter()
            .filter_map(|extent| Arc::try_unwrap(extent).ok())
            .filter(|buf| buf.capacity() == EXTENT_SIZE_BYTES);
        let mut free = self.free.lock();
        while free.len() < EXTENT_BUFFERS_KEPT {
            match reusable.next() {
                Some(buf) => free.push(buf),
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_evicted_extents_are_reused_and_hold_the_new_data() {
        let pool = ExtentBuffers::default();
        let first = pool.copy_of(&[1u8; EXTENT_SIZE_BYTES]);
        let address = first.as_ptr();
        pool.give_back([first]);
        let second = pool.copy_of(&[2u8; EXTENT_SIZE_BYTES]);
        assert_eq!(second.as_ptr(), address);
        assert!(second.iter().all(|&b| b == 2));
    }

    #[test]
    fn an_overwritable_buffer_is_a_whole_extent_reused_or_new() {
        let pool = ExtentBuffers::default();
        let fresh = pool.overwritable();
        assert_eq!(fresh.len(), EXTENT_SIZE_BYTES);
        let first = pool.copy_of(&[3u8; EXTENT_SIZE_BYTES]);
        let address = first.as_ptr();
        pool.give_back([first]);
        let reused = pool.overwritable();
        assert_eq!(
            (reused.as_ptr(), reused.len()),
            (address, EXTENT_SIZE_BYTES)
        );
    }

    #[test]
    fn a_buffer_still_shared_is_not_taken_back() {
        let pool = ExtentBuffers::default();
        let extent = pool.copy_of(&[1u8; EXTENT_SIZE_BYTES]);
        let reader = extent.clone();
        pool.give_back([extent]);
        assert!(pool.free.lock().is_empty());
        assert!(reader.iter().all(|&b| b == 1));
    }
}
