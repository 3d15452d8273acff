//! Reading through a stack of runs, newest first: point lookups, ordered scans with a limit, and
//! the merge that compacts runs into one. A key's newest point entry wins, unless a range
//! deletion of a newer run covers it (mod.rs states the rule).

use super::run::RunReader;
use super::{Entry, RangeDelete, RunError};
use std::collections::VecDeque;

/// Whether a range deletion of one of `newer` covers `key`.
fn deleted_by(newer: &[RunReader], key: &[u8]) -> bool {
    newer
        .iter()
        .any(|run| run.range_deletes().iter().any(|r| r.covers(key)))
}

/// The value of `key`, looking through `runs` (newest first).
// Reads through runs (not yet the engine's: it loads runs whole at open, docs/0003).
#[cfg_attr(not(test), allow(dead_code))]
pub async fn get(runs: &[RunReader], key: &[u8]) -> Result<Option<Vec<u8>>, RunError> {
    for (i, run) in runs.iter().enumerate() {
        if deleted_by(&runs[..i], key) {
            return Ok(None);
        }
        match run.get(key).await? {
            Some(Entry::Put(value)) => return Ok(Some(value)),
            Some(Entry::Delete) => return Ok(None),
            None => {}
        }
    }
    Ok(None)
}

/// A run's point entries from some key on, one block in memory at a time.
struct Cursor<'a> {
    run: &'a RunReader,
    next_block: usize,
    entries: VecDeque<(Vec<u8>, Entry)>,
    end: Option<&'a [u8]>,
}

impl<'a> Cursor<'a> {
    async fn new(
        run: &'a RunReader,
        start: &[u8],
        end: Option<&'a [u8]>,
    ) -> Result<Cursor<'a>, RunError> {
        let mut c = Cursor {
            run,
            next_block: run.block_from(start),
            entries: VecDeque::new(),
            end,
        };
        c.fill().await?;
        while c.entries.front().is_some_and(|(k, _)| k.as_slice() < start) {
            c.entries.pop_front();
            c.fill().await?;
        }
        Ok(c)
    }

    /// Loads the next block when the current one is used up and the next may still be in range.
    async fn fill(&mut self) -> Result<(), RunError> {
        while self.entries.is_empty() && self.next_block < self.run.block_count() {
            if self
                .end
                .is_some_and(|end| self.run.block_first_key(self.next_block) >= end)
            {
                self.next_block = self.run.block_count();
                break;
            }
            self.entries = self.run.block(self.next_block).await?.into();
            self.next_block += 1;
        }
        Ok(())
    }

    fn head(&self) -> Option<&[u8]> {
        self.entries
            .front()
            .map(|(k, _)| k.as_slice())
            .filter(|k| self.end.is_none_or(|end| *k < end))
    }
}

/// Merges `runs` (newest first) over `start..end` (`None`: to the last key) and calls `emit` with
/// each key's winning entry and the index of the run it came from, in key order, until `emit`
/// says stop. Entries a newer run's range deletion covers are skipped.
async fn merge(
    runs: &[RunReader],
    start: &[u8],
    end: Option<&[u8]>,
    mut emit: impl FnMut(Vec<u8>, Entry, usize) -> bool,
) -> Result<(), RunError> {
    let mut cursors = Vec::with_capacity(runs.len());
    for run in runs {
        cursors.push(Cursor::new(run, start, end).await?);
    }
    loop {
        // The smallest head; on a tie the newest run (lowest index) wins.
        let Some((winner, key)) = cursors
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.head().map(|k| (i, k.to_vec())))
            .min_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        else {
            return Ok(());
        };
        let mut entry = None;
        for (i, c) in cursors.iter_mut().enumerate() {
            if c.head() == Some(key.as_slice()) {
                let (_, e) = c.entries.pop_front().expect("a head was seen");
                if i == winner {
                    entry = Some(e);
                }
                c.fill().await?;
            }
        }
        let entry = entry.expect("the winner had the key");
        if !deleted_by(&runs[..winner], &key) && !emit(key, entry, winner) {
            return Ok(());
        }
    }
}

/// Up to `limit` live pairs with keys in `start..end`, in key order.
// Reads through runs (not yet the engine's: it loads runs whole at open, docs/0003).
#[cfg_attr(not(test), allow(dead_code))]
pub async fn scan(
    runs: &[RunReader],
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>, RunError> {
    let mut out = Vec::new();
    if limit == 0 || start >= end {
        return Ok(out);
    }
    merge(runs, start, Some(end), |key, entry, _| {
        if let Entry::Put(value) = entry {
            out.push((key, value));
        }
        out.len() < limit
    })
    .await?;
    Ok(out)
}

/// Calls `visit` with every live pair of `runs` (newest first), in key order, one block per run
/// in memory at a time; stops early when `visit` returns false.
pub async fn for_each_live(
    runs: &[RunReader],
    mut visit: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<(), RunError> {
    merge(runs, &[], None, |key, entry, _| match entry {
        Entry::Put(value) => visit(&key, &value),
        Entry::Delete => true,
    })
    .await
}

/// What one run replacing all of `runs` (newest first) must hold. Into the bottom of the stack
/// (nothing older below), deletions have nothing left to hide and are dropped.
// Merging runs (stage 2: today a checkpoint rewrites the whole map from memory instead).
#[cfg_attr(not(test), allow(dead_code))]
pub async fn compact(
    runs: &[RunReader],
    bottom: bool,
) -> Result<(Vec<(Vec<u8>, Entry)>, Vec<RangeDelete>), RunError> {
    let mut entries = Vec::new();
    merge(runs, &[], None, |key, entry, _| {
        if !(bottom && entry == Entry::Delete) {
            entries.push((key, entry));
        }
        true
    })
    .await?;
    let ranges = if bottom {
        Vec::new()
    } else {
        let mut all: Vec<RangeDelete> = runs
            .iter()
            .flat_map(|r| r.range_deletes().iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    };
    Ok((entries, ranges))
}
