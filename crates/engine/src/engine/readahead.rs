//! Readahead: a client that reads a file or device front to back, one request after another
//! (an NFS client's READs, a copy tool), gets the next requests' extents fetched and decoded
//! while it handles this one, so that the store's latency and the decoding overlap with the
//! client instead of adding up.
//!
//! A read is sequential when it starts where the last read of the same inode ended, or within
//! the window that stream read or fetched lately (reads in flight together arrive in any
//! order). Each sequential read starts fetches, in pieces of its own length (at least 64 KiB),
//! of what lies after it up to `Tuning::readahead_bytes` ahead. A read that finds such a fetch
//! of its range under way waits for it rather than fetching the same extents again, then finds
//! them in the memory tier. Fetches go through the engine's own read path, so they see exactly
//! what a read would.

use futures::future::{BoxFuture, FutureExt, Shared};
use lru::LruCache;
use parking_lot::Mutex;
use std::num::NonZeroUsize;

/// Inodes whose reads are followed at once; the least recently read is forgotten first.
const STREAMS_MAX: usize = 1024;

pub(super) type Fetch = Shared<BoxFuture<'static, ()>>;

/// What the reads of one inode look like so far.
#[derive(Default)]
struct Stream {
    /// Where the last read ended.
    next: u64,
    /// Where the fetches started so far end.
    ahead_end: u64,
    /// Fetches started and maybe still under way: their ranges.
    fetches: Vec<(u64, u64, Fetch)>,
}

pub(super) struct Readahead {
    streams: Mutex<LruCache<u64, Stream>>,
}

/// A read's part in readahead: the fetches to wait for, and the ranges to fetch now.
pub(super) struct Plan {
    pub wait: Vec<Fetch>,
    pub fetch: Vec<(u64, u64)>,
}

impl Default for Readahead {
    fn default() -> Self {
        Readahead {
            streams: Mutex::new(LruCache::new(
                NonZeroUsize::new(STREAMS_MAX).expect("not zero"),
            )),
        }
    }
}

/// The smallest piece fetched ahead: 8 extents, so a window of 4 MiB is at most 64 fetches.
const PIECE_BYTES_MIN: u64 = 64 * 1024;

impl Readahead {
    /// Notes a read of `offset..end` of `ino`, with `ahead` bytes of readahead.
    pub(super) fn plan(&self, ino: u64, offset: u64, end: u64, ahead: u64) -> Plan {
        let mut streams = self.streams.lock();
        let s = streams.get_or_insert_mut(ino, Stream::default);
        // Reads in flight together (a queue depth above one) may arrive out of order: a read
        // that lands inside what this stream has read or fetched ahead lately is still the same
        // stream, so it extends the window instead of starting it again (which fetched the
        // window twice over a remote store).
        let window_start = s.next.saturating_sub(ahead);
        let sequential = offset > 0 && offset >= window_start && offset <= s.ahead_end.max(s.next);
        s.next = if sequential { s.next.max(end) } else { end };
        // Fetches wholly before this read are done with (or no longer wanted).
        s.fetches.retain(|(_, e, _)| *e > offset);
        let wait = s
            .fetches
            .iter()
            .filter(|(start, e, _)| *start < end && offset < *e)
            .map(|(_, _, f)| f.clone())
            .collect();
        let mut fetch = Vec::new();
        if sequential {
            // Pieces the size of the read, so that each next read waits for its own; but never
            // small ones, or a client reading a byte at a time would start a task per byte of
            // the window (millions, found by the nfs_rpc fuzz target).
            let piece = (end - offset).max(PIECE_BYTES_MIN);
            let mut from = s.ahead_end.max(end);
            let until = end.saturating_add(ahead);
            while from < until {
                let to = from.saturating_add(piece).min(until);
                fetch.push((from, to));
                from = to;
            }
            s.ahead_end = s.ahead_end.max(until);
        } else {
            // A jump: what was fetched ahead of the old position is not this stream's future.
            s.ahead_end = end;
        }
        Plan { wait, fetch }
    }

    /// Records a fetch of `start..end` of `ino` that `plan` asked for and that is now under way.
    pub(super) fn started(&self, ino: u64, start: u64, end: u64, fetch: BoxFuture<'static, ()>) {
        let fetch = fetch.shared();
        if let Some(s) = self.streams.lock().get_mut(&ino) {
            s.fetches.push((start, end, fetch));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn sequential_reads_fetch_ahead_in_pieces_and_jumps_do_not() {
        let r = Readahead::default();
        // The first read of an inode is not sequential.
        assert!(r.plan(7, 0, 100 * K, 250 * K).fetch.is_empty());
        // The second is: the next 250 KiB in pieces of 100.
        let p = r.plan(7, 100 * K, 200 * K, 250 * K);
        assert_eq!(
            p.fetch,
            vec![(200 * K, 300 * K), (300 * K, 400 * K), (400 * K, 450 * K)]
        );
        for (s, e) in p.fetch {
            r.started(7, s, e, async {}.boxed());
        }
        // The third waits for the fetch of its range and asks only for what is new.
        let p = r.plan(7, 200 * K, 300 * K, 250 * K);
        assert_eq!(p.wait.len(), 1);
        assert_eq!(p.fetch, vec![(450 * K, 550 * K)]);
        // A read of the stream that arrives ahead of the one before it (two in flight) extends
        // the window; the one it overtook, arriving next, fetches nothing again.
        let p = r.plan(7, 400 * K, 500 * K, 250 * K);
        assert_eq!(p.fetch, vec![(550 * K, 650 * K), (650 * K, 750 * K)]);
        let p = r.plan(7, 300 * K, 400 * K, 250 * K);
        assert!(p.fetch.is_empty(), "{:?}", p.fetch);
        let p = r.plan(7, 500 * K, 600 * K, 250 * K);
        assert_eq!(p.fetch, vec![(750 * K, 850 * K)]);
        // Another inode is a stream of its own; a jump fetches nothing.
        assert!(r.plan(8, 200 * K, 300 * K, 250 * K).fetch.is_empty());
        let p = r.plan(7, 10_000 * K, 10_100 * K, 250 * K);
        assert!(p.fetch.is_empty() && p.wait.is_empty());
        // No readahead asked: nothing fetched.
        assert!(r.plan(7, 10_100 * K, 10_200 * K, 0).fetch.is_empty());
    }

    #[test]
    fn reads_of_a_byte_fetch_ahead_in_pieces_of_at_least_64_kib() {
        let r = Readahead::default();
        r.plan(9, 0, 1, 4 << 20);
        let p = r.plan(9, 1, 2, 4 << 20);
        assert_eq!(p.fetch.len(), 64, "4 MiB ahead in 64 KiB pieces");
        assert!(p.fetch.iter().all(|(s, e)| e - s <= PIECE_BYTES_MIN));
    }
}
