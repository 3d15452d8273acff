//! The committed changes of one checkpoint interval, held in memory until a checkpoint writes
//! them as a run.
//!
//! A range deletion (a cut) removes the table's own entries in its range when it is made, so
//! what the table still holds in a cut range is newer than the cut: its cuts hide only older
//! layers (the rule of lsm/mod.rs).

use super::objects::Deltas;
use super::{run_key, ExtentPtr};
use crate::lsm::{Entry, MemRun, RangeSet};
use std::collections::{BTreeMap, BTreeSet};

type ExtentItem<'a> = (&'a (u64, u64), &'a Option<ExtentPtr>);
type KvItem<'a> = (&'a Vec<u8>, &'a Option<Vec<u8>>);

#[derive(Debug, Default, Clone)]
pub struct MemTable {
    /// Extent pointers set (`Some`) or cleared (`None`) in the interval.
    pub(super) extents: BTreeMap<(u64, u64), Option<ExtentPtr>>,
    pub(super) kv: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Extent index ranges `from..to` cut, per inode.
    pub(super) extent_cuts: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Key ranges cut, as the keys they cover.
    pub(super) kv_cuts: RangeSet,
    /// Extents whose pointer in an older layer this interval replaced or cleared: the objects
    /// those pointers point into are debited when the interval is checkpointed, once the older
    /// pointer is looked up (docs/0003, "Live bytes per log object").
    pub(super) shadowed: BTreeSet<(u64, u64)>,
    /// Live bytes and extents credited and debited in the interval, per object.
    pub(super) deltas: Deltas,
    /// Objects marked as holding lz4 frames in the interval.
    pub(super) lz4: BTreeSet<u64>,
}

/// What one layer says about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Here<T> {
    /// The layer decides: this value, or none.
    Is(Option<T>),
    /// Look in older layers.
    NotHere,
}

impl MemTable {
    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
            && self.kv.is_empty()
            && self.extent_cuts.is_empty()
            && self.kv_cuts.is_empty()
            && self.lz4.is_empty()
    }

    pub(super) fn cuts_extent(&self, ino: u64, index: u64) -> bool {
        self.extent_cuts
            .get(&ino)
            .is_some_and(|cuts| cuts.iter().any(|&(from, to)| from <= index && index < to))
    }

    pub(super) fn cuts_key(&self, key: &[u8]) -> bool {
        self.kv_cuts.covers(key)
    }

    pub fn extent(&self, ino: u64, index: u64) -> Here<ExtentPtr> {
        match self.extents.get(&(ino, index)) {
            Some(v) => Here::Is(*v),
            None if self.cuts_extent(ino, index) => Here::Is(None),
            None => Here::NotHere,
        }
    }

    pub fn kv(&self, key: &[u8]) -> Here<&Vec<u8>> {
        match self.kv.get(key) {
            Some(v) => Here::Is(v.as_ref()),
            None if self.cuts_key(key) => Here::Is(None),
            None => Here::NotHere,
        }
    }

    /// The table as a run's entries (run keys), restricted to run keys in `start..end` when
    /// given: the layer a merge reads, or what a checkpoint writes.
    pub fn to_run(&self, bounds: Option<(&[u8], &[u8])>) -> MemRun {
        let inside = |k: &[u8]| bounds.is_none_or(|(s, e)| s <= k && k < e);
        let overlaps = |s: &[u8], e: &[u8]| bounds.is_none_or(|(bs, be)| s < be && bs < e);
        let mut run = MemRun::default();
        // Only the cuts that may reach into the bounds are looked at: there is one per file
        // removed in the interval, and a read of one file's extents builds this.
        type Cuts<'a> = Box<dyn Iterator<Item = (&'a u64, &'a Vec<(u64, u64)>)> + 'a>;
        let extent_cuts: Cuts<'_> = match bounds {
            None => Box::new(self.extent_cuts.iter()),
            Some((s, e)) => match run_key::extent_inodes(s, e) {
                Some(inodes) => Box::new(self.extent_cuts.range(inodes)),
                None => Box::new(std::iter::empty()),
            },
        };
        for (ino, cuts) in extent_cuts {
            for &(from, to) in cuts {
                let (s, e) = (run_key::extent(*ino, from), run_key::extent(*ino, to));
                if overlaps(&s, &e) {
                    run.ranges.insert(s, e);
                }
            }
        }
        let kv_cuts: Box<dyn Iterator<Item = (&[u8], &[u8])>> = match bounds {
            None => Box::new(self.kv_cuts.iter()),
            Some((s, e)) => match run_key::kv_window(s, e) {
                Some((from, to)) => Box::new(self.kv_cuts.overlapping(from, to)),
                None => Box::new(std::iter::empty()),
            },
        };
        for (start, end) in kv_cuts {
            let (s, e) = (run_key::kv(start), run_key::kv(end));
            if overlaps(&s, &e) {
                run.ranges.insert(s, e);
            }
        }
        let extents: Box<dyn Iterator<Item = ExtentItem<'_>>> = match bounds
            .and_then(|(s, e)| Some((run_key::parse_extent(s)?, run_key::parse_extent(e))))
        {
            // Extents of one inode from some index: only that part of the map.
            Some((from, Some(to))) => Box::new(self.extents.range(from..to)),
            _ => Box::new(self.extents.iter()),
        };
        for (&(ino, index), ptr) in extents {
            let key = run_key::extent(ino, index);
            if inside(&key) {
                let entry = ptr.map_or(Entry::Delete, |p| Entry::Put(run_key::ptr_value(p)));
                run.points.insert(key, entry);
            }
        }
        let kv_range =
            bounds.and_then(|(s, e)| Some((run_key::parse_kv(s)?, run_key::parse_kv(e)?)));
        let kv: Box<dyn Iterator<Item = KvItem<'_>>> = match kv_range {
            Some((s, e)) if s <= e => Box::new(
                self.kv
                    .range::<[u8], _>((std::ops::Bound::Included(s), std::ops::Bound::Excluded(e))),
            ),
            Some(_) => Box::new(std::iter::empty()),
            None => Box::new(self.kv.iter()),
        };
        for (k, v) in kv {
            let key = run_key::kv(k);
            if inside(&key) {
                let entry = v.clone().map_or(Entry::Delete, Entry::Put);
                run.points.insert(key, entry);
            }
        }
        run
    }

    /// Memory the table takes, roughly.
    pub fn bytes(&self) -> usize {
        self.extents.len() * 64
            + self
                .kv
                .iter()
                .map(|(k, v)| 64 + k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
            + self.shadowed.len() * 40
            + self.deltas.len() * 48
    }
}
