//! Reading through a stack of sources, newest first: point lookups, ordered scans with a limit,
//! and the merge that compacts them into one run. A source is a stored run or the changes of
//! an interval still in memory. A key's newest point entry wins, unless a range deletion of a
//! newer source covers it (mod.rs states the rule).

use super::cache::Block;
use super::run::RunReader;
use super::{Entry, MemRun, RangeSet, RunError};
use std::collections::btree_map;
use std::iter::Peekable;

/// One layer of a stack.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    Run(&'a RunReader),
    Mem(&'a MemRun),
}

impl<'a> Source<'a> {
    pub fn range_deletes(&self) -> &'a RangeSet {
        match self {
            Source::Run(r) => r.range_deletes(),
            Source::Mem(m) => &m.ranges,
        }
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, RunError> {
        match self {
            Source::Run(r) => r.get(key).await,
            Source::Mem(m) => Ok(m.points.get(key).cloned()),
        }
    }
}

/// The sources of a stack of runs.
#[cfg(test)]
pub fn runs(runs: &[RunReader]) -> Vec<Source<'_>> {
    runs.iter().map(Source::Run).collect()
}

/// Whether a range deletion of one of `newer` covers `key`.
fn deleted_by(newer: &[Source<'_>], key: &[u8]) -> bool {
    newer.iter().any(|s| s.range_deletes().covers(key))
}

/// The value of `key`, looking through `sources` (newest first).
pub async fn get_in(sources: &[Source<'_>], key: &[u8]) -> Result<Option<Vec<u8>>, RunError> {
    for (i, source) in sources.iter().enumerate() {
        if deleted_by(&sources[..i], key) {
            return Ok(None);
        }
        match source.get(key).await? {
            Some(Entry::Put(value)) => return Ok(Some(value)),
            Some(Entry::Delete) => return Ok(None),
            None => {}
        }
    }
    Ok(None)
}

/// The value of `key`, looking through `runs` (newest first).
#[cfg(test)]
pub async fn get(runs_: &[RunReader], key: &[u8]) -> Result<Option<Vec<u8>>, RunError> {
    get_in(&runs(runs_), key).await
}

/// A source's point entries from some key on: for a run, one block in memory at a time.
enum Cursor<'a> {
    Run {
        run: &'a RunReader,
        next_block: usize,
        block: Option<Block>,
        at: usize,
        end: Option<&'a [u8]>,
    },
    Mem {
        entries: Peekable<btree_map::Range<'a, Vec<u8>, Entry>>,
        end: Option<&'a [u8]>,
    },
}

impl<'a> Cursor<'a> {
    async fn new(
        source: Source<'a>,
        start: &[u8],
        end: Option<&'a [u8]>,
    ) -> Result<Cursor<'a>, RunError> {
        match source {
            Source::Mem(m) => Ok(Cursor::Mem {
                entries: m
                    .points
                    .range::<[u8], _>((
                        std::ops::Bound::Included(start),
                        std::ops::Bound::Unbounded,
                    ))
                    .peekable(),
                end,
            }),
            Source::Run(run) => {
                let mut c = Cursor::Run {
                    run,
                    next_block: run.block_from(start),
                    block: None,
                    at: 0,
                    end,
                };
                c.fill().await?;
                while c.head().is_some_and(|k| k < start) {
                    c.pop();
                    c.fill().await?;
                }
                Ok(c)
            }
        }
    }

    /// Loads the next block when the current one is used up and the next may still be in range.
    async fn fill(&mut self) -> Result<(), RunError> {
        let Cursor::Run {
            run,
            next_block,
            block,
            at,
            end,
        } = self
        else {
            return Ok(());
        };
        while block.as_ref().is_none_or(|b| *at >= b.len()) && *next_block < run.block_count() {
            if end.is_some_and(|end| run.block_first_key(*next_block) >= end) {
                *next_block = run.block_count();
                break;
            }
            *block = Some(run.block(*next_block).await?);
            *at = 0;
            *next_block += 1;
        }
        Ok(())
    }

    fn head(&mut self) -> Option<&[u8]> {
        let (key, end) = match self {
            Cursor::Run { block, at, end, .. } => (
                block
                    .as_ref()
                    .and_then(|b| b.get(*at))
                    .map(|(k, _)| k.as_slice()),
                *end,
            ),
            Cursor::Mem { entries, end } => (entries.peek().map(|(k, _)| k.as_slice()), *end),
        };
        key.filter(|k| end.is_none_or(|end| *k < end))
    }

    fn pop(&mut self) -> (Vec<u8>, Entry) {
        match self {
            Cursor::Run { block, at, .. } => {
                let entry = block.as_ref().expect("a head was seen")[*at].clone();
                *at += 1;
                entry
            }
            Cursor::Mem { entries, .. } => {
                let (k, e) = entries.next().expect("a head was seen");
                (k.clone(), e.clone())
            }
        }
    }
}

/// Merges `sources` (newest first) over `start..end` (`None`: to the last key) and calls `emit`
/// with each key's winning entry, in key order, until `emit` says stop. Entries a newer
/// source's range deletion covers are skipped.
async fn merge(
    sources: &[Source<'_>],
    start: &[u8],
    end: Option<&[u8]>,
    mut emit: impl FnMut(Vec<u8>, Entry) -> bool,
) -> Result<(), RunError> {
    let mut cursors = Vec::with_capacity(sources.len());
    for source in sources {
        cursors.push(Cursor::new(*source, start, end).await?);
    }
    loop {
        // The smallest head; on a tie the newest source (lowest index) wins.
        let mut best: Option<(usize, Vec<u8>)> = None;
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some(k) = c.head() {
                if best.as_ref().is_none_or(|(_, b)| k < b.as_slice()) {
                    best = Some((i, k.to_vec()));
                }
            }
        }
        let Some((winner, key)) = best else {
            return Ok(());
        };
        let mut entry = None;
        for (i, c) in cursors.iter_mut().enumerate() {
            if c.head() == Some(key.as_slice()) {
                let (_, e) = c.pop();
                if i == winner {
                    entry = Some(e);
                }
                c.fill().await?;
            }
        }
        let entry = entry.expect("the winner had the key");
        if !deleted_by(&sources[..winner], &key) && !emit(key, entry) {
            return Ok(());
        }
    }
}

/// Calls `emit` with each key's winning entry of `sources` (newest first) over `start..end`
/// (`None`: to the last key), in key order, until `emit` says stop: how a merge is streamed
/// into parts.
pub async fn merge_between(
    sources: &[Source<'_>],
    start: &[u8],
    end: Option<&[u8]>,
    emit: impl FnMut(Vec<u8>, Entry) -> bool,
) -> Result<(), RunError> {
    merge(sources, start, end, emit).await
}

/// Up to `limit` live pairs with keys in `start..end` (`None`: to the last key), in key order,
/// leaving out those `hidden` says something newer hides.
pub async fn scan_in(
    sources: &[Source<'_>],
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
    hidden: impl Fn(&[u8]) -> bool,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>, RunError> {
    let mut out = Vec::new();
    if limit == 0 || end.is_some_and(|end| start >= end) {
        return Ok(out);
    }
    merge(sources, start, end, |key, entry| {
        if let Entry::Put(value) = entry {
            if !hidden(&key) {
                out.push((key, value));
            }
        }
        out.len() < limit
    })
    .await?;
    Ok(out)
}

/// Up to `limit` live pairs of `runs` with keys in `start..end`, in key order.
#[cfg(test)]
pub async fn scan(
    runs_: &[RunReader],
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>, RunError> {
    scan_in(&runs(runs_), start, Some(end), limit, |_| false).await
}

/// Calls `visit` with every live pair of `sources` (newest first) in `start..end`, in key
/// order, one block per run in memory at a time; stops early when `visit` returns false.
pub async fn for_each_live_in(
    sources: &[Source<'_>],
    start: &[u8],
    end: Option<&[u8]>,
    mut visit: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<(), RunError> {
    merge(sources, start, end, |key, entry| match entry {
        Entry::Put(value) => visit(&key, &value),
        Entry::Delete => true,
    })
    .await
}

/// What one run replacing all of `sources` (newest first) must hold, leaving out the keys
/// `keep` refuses. Into the bottom of the stack (nothing older below), deletions have nothing
/// left to hide and are dropped.
#[cfg(test)]
pub async fn compact_in(
    sources: &[Source<'_>],
    bottom: bool,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<(Vec<(Vec<u8>, Entry)>, RangeSet), RunError> {
    let mut entries = Vec::new();
    merge(sources, &[], None, |key, entry| {
        if !(bottom && entry == Entry::Delete) && keep(&key) {
            entries.push((key, entry));
        }
        true
    })
    .await?;
    let mut ranges = RangeSet::new();
    if !bottom {
        for s in sources {
            ranges.extend_from(s.range_deletes());
        }
    }
    Ok((entries, ranges))
}

/// What one run replacing all of `runs` (newest first) must hold.
#[cfg(test)]
pub async fn compact(
    runs_: &[RunReader],
    bottom: bool,
) -> Result<(Vec<(Vec<u8>, Entry)>, RangeSet), RunError> {
    compact_in(&runs(runs_), bottom, |_| true).await
}
