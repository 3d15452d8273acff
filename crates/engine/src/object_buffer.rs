//! Reusable buffers for log objects.
//!
//! The log object of a write-heavy flush is tens of MiB. Allocating it afresh for every flush
//! costs more than sealing it: every new page faults and is zeroed by the kernel. So the buffers
//! of uploaded objects are kept and reused. A buffer only grows; its
//! length is the most it ever held, and the object is the prefix `..len` of it.

use crate::limits::{COPIED_OBJECT_BYTES_MAX, OBJECT_BUFFERS_KEPT};
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Default)]
pub struct ObjectBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl ObjectBuffers {
    /// A buffer with room for at least `room_bytes`.
    pub fn take(self: &Arc<Self>, room_bytes: usize) -> ObjectBuffer {
        // The largest kept buffer: growing a smaller one moves it to fresh memory.
        let buf = {
            let mut free = self.free.lock();
            let largest = (0..free.len()).max_by_key(|&i| free[i].len());
            largest.map(|i| free.swap_remove(i)).unwrap_or_default()
        };
        let mut buffer = ObjectBuffer {
            buf,
            len: 0,
            pool: self.clone(),
        };
        buffer.reserve(room_bytes);
        buffer
    }
}

/// A log object being built, then (through `into_bytes`) being uploaded; its memory goes back
/// to the pool when the last reference is dropped.
pub struct ObjectBuffer {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<ObjectBuffers>,
}

impl ObjectBuffer {
    /// Makes at least `room_bytes` writable through `room`.
    pub fn reserve(&mut self, room_bytes: usize) {
        if self.buf.len() < room_bytes {
            self.buf.resize(room_bytes, 0);
        }
    }

    /// All the writable bytes (at least what `reserve` asked for); the object is a prefix.
    pub fn room(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Ends the object at `len` bytes.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.buf.len(), "an object ends inside its buffer");
        self.len = len;
    }

    /// The object as `Bytes`. A small object is copied out and its buffer goes straight back to
    /// the pool: the store may hold an object for long (a `file://` bucket's journal keeps it
    /// until it is stored as a file or deleted, up to 30 s), and a pool drained by held
    /// buffers hands out fresh memory, which the kernel faults in and zeroes page by page
    /// (docs/benchmarks/2026-11-24-rounds-versus-profiles.md).
    pub fn into_bytes(self) -> Bytes {
        if self.len <= COPIED_OBJECT_BYTES_MAX {
            Bytes::copy_from_slice(self.as_ref())
        } else {
            Bytes::from_owner(self)
        }
    }
}

impl AsRef<[u8]> for ObjectBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for ObjectBuffer {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock();
        if free.len() < OBJECT_BUFFERS_KEPT {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_objects_are_their_prefix() {
        let pool = Arc::new(ObjectBuffers::default());
        let big = COPIED_OBJECT_BYTES_MAX + 1;
        let mut b = pool.take(big + 100);
        b.room()[..3].copy_from_slice(b"abc");
        b.set_len(big);
        let bytes = b.into_bytes();
        assert_eq!(bytes.len(), big);
        assert_eq!(&bytes[..3], b"abc");
        let copy = bytes.clone();
        drop(bytes);
        assert!(pool.free.lock().is_empty(), "still referenced");
        drop(copy);
        assert_eq!(pool.free.lock().len(), 1);
        let mut small = pool.take(10);
        small.room()[..3].copy_from_slice(b"xyz");
        small.set_len(3);
        let small = small.into_bytes();
        assert_eq!(&small[..], b"xyz");
        assert_eq!(
            pool.free.lock().len(),
            1,
            "a small object is copied out and its buffer is back at once"
        );
        drop(small);
        let mut again = pool.take(10);
        assert!(
            again.room().len() >= big + 100,
            "the larger buffer came back"
        );
        assert_eq!(again.as_ref(), b"", "a taken buffer starts empty");
        drop(again);
        let held: Vec<_> = (0..OBJECT_BUFFERS_KEPT + 3).map(|_| pool.take(1)).collect();
        drop(held);
        assert_eq!(pool.free.lock().len(), OBJECT_BUFFERS_KEPT);
    }
}
