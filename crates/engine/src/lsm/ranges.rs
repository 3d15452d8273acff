//! Range deletions as the set of keys they cover.
//!
//! A layer's range deletions only ever answer "does one of them cover this key?", so a layer
//! keeps their union: disjoint ranges ordered by start, where overlapping or touching ranges
//! have become one. A lookup is then one ordered search instead of a pass over every range,
//! which matters because each removed file adds one (a pass over thousands of them was most of
//! a remove's CPU), and files removed one after another usually touch and merge into one range.

use std::collections::BTreeMap;
use std::ops::Bound;

/// Key ranges `start..end`, kept as their union (see the module comment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// Start to end of each range; ranges neither overlap nor touch.
    by_start: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A set with no range, for callers that need a reference to one.
pub static EMPTY: RangeSet = RangeSet::new();

impl RangeSet {
    pub const fn new() -> RangeSet {
        RangeSet {
            by_start: BTreeMap::new(),
        }
    }

    /// Adds `start..end`; an empty range adds nothing.
    pub fn insert(&mut self, mut start: Vec<u8>, mut end: Vec<u8>) {
        if start >= end {
            return;
        }
        // A range that starts at or before `start` and reaches it absorbs the new one's start.
        if let Some((s, e)) = self.last_starting_at_or_before(&start) {
            if e >= start.as_slice() {
                if e >= end.as_slice() {
                    return;
                }
                start = s.to_vec();
            }
        }
        // Ranges starting within `start..=end` are inside the union or extend its end.
        loop {
            let next = self
                .by_start
                .range::<[u8], _>((Bound::Included(start.as_slice()), Bound::Unbounded))
                .next()
                .filter(|(s, _)| s.as_slice() <= end.as_slice())
                .map(|(s, _)| s.clone());
            let Some(s) = next else { break };
            let e = self.by_start.remove(&s).expect("just seen");
            if e > end {
                end = e;
            }
        }
        self.by_start.insert(start, end);
    }

    /// Whether a range covers `key`.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.last_starting_at_or_before(key)
            .is_some_and(|(_, end)| key < end)
    }

    fn last_starting_at_or_before(&self, key: &[u8]) -> Option<(&[u8], &[u8])> {
        self.by_start
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
    }

    /// The ranges in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.by_start
            .iter()
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
    }

    /// The ranges that share a key with `start..end` (`end` `None`: to the last key), in key
    /// order, not clipped to it.
    pub fn overlapping<'a>(
        &'a self,
        start: &'a [u8],
        end: Option<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        // The one range that may start before `start` and reach into it, then those that
        // start inside. An empty window (BTreeMap::range refuses a reversed one) has none.
        let window = end.is_none_or(|end| start < end).then_some((start, end));
        let before = window.and_then(|(start, _)| {
            self.by_start
                .range::<[u8], _>((Bound::Unbounded, Bound::Excluded(start)))
                .next_back()
                .filter(move |(_, e)| e.as_slice() > start)
        });
        let inside = window.into_iter().flat_map(move |(start, end)| {
            self.by_start.range::<[u8], _>((
                Bound::Included(start),
                end.map_or(Bound::Unbounded, Bound::Excluded),
            ))
        });
        before
            .into_iter()
            .chain(inside)
            .map(|(s, e)| (s.as_slice(), e.as_slice()))
    }

    /// Adds every range of `other`.
    pub fn extend_from(&mut self, other: &RangeSet) {
        for (s, e) in other.iter() {
            self.insert(s.to_vec(), e.to_vec());
        }
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// Bytes of memory the set keeps, roughly: its keys and a map node's share per range.
    pub fn memory_bytes(&self) -> usize {
        self.iter().map(|(s, e)| 48 + s.len() + e.len()).sum()
    }
}

impl<S: Into<Vec<u8>>, E: Into<Vec<u8>>> FromIterator<(S, E)> for RangeSet {
    fn from_iter<I: IntoIterator<Item = (S, E)>>(iter: I) -> RangeSet {
        let mut set = RangeSet::new();
        for (s, e) in iter {
            set.insert(s.into(), e.into());
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn set(ranges: &[(&str, &str)]) -> RangeSet {
        ranges.iter().map(|&(s, e)| (s, e)).collect()
    }

    fn pairs(set: &RangeSet) -> Vec<(String, String)> {
        set.iter()
            .map(|(s, e)| {
                (
                    String::from_utf8(s.to_vec()).unwrap(),
                    String::from_utf8(e.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn overlapping_and_touching_ranges_become_one_and_empty_ones_vanish() {
        let s = set(&[("c", "e"), ("a", "b"), ("e", "f"), ("d", "d"), ("x", "w")]);
        assert_eq!(
            pairs(&s),
            [("a".into(), "b".into()), ("c".into(), "f".into())]
        );
        let s = set(&[("b", "c"), ("d", "e"), ("f", "g"), ("a", "z")]);
        assert_eq!(pairs(&s), [("a".into(), "z".into())]);
        let s = set(&[("a", "m"), ("b", "c")]);
        assert_eq!(pairs(&s), [("a".into(), "m".into())]);
        let s = set(&[("b", "c"), ("a", "bb"), ("cc", "d")]);
        assert_eq!(
            pairs(&s),
            [("a".into(), "c".into()), ("cc".into(), "d".into())]
        );
    }

    #[test]
    fn covers_and_overlapping_agree_with_every_range_checked_one_by_one() {
        // Keys and ranges over a small alphabet, so that overlaps, touches and shared ends
        // are common; compared with a model that checks each range added.
        let alphabet: Vec<Vec<u8>> = (0u8..6)
            .flat_map(|a| std::iter::once(vec![a]).chain((0u8..6).map(move |b| vec![a, b])))
            .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for _ in 0..300 {
            let mut set = RangeSet::new();
            let mut model: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for _ in 0..next(12) {
                let (s, e) = (
                    alphabet[next(alphabet.len())].clone(),
                    alphabet[next(alphabet.len())].clone(),
                );
                set.insert(s.clone(), e.clone());
                model.push((s, e));
            }
            let covered = |k: &[u8]| {
                model
                    .iter()
                    .any(|(s, e)| s.as_slice() <= k && k < e.as_slice())
            };
            for k in &alphabet {
                assert_eq!(set.covers(k), covered(k), "key {k:?} in {model:?}");
            }
            // Disjoint, not touching, in order.
            let ranges: Vec<_> = set.iter().collect();
            assert!(ranges.iter().all(|(s, e)| s < e));
            assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0));
            // `overlapping` names exactly the ranges holding a key of the window.
            let (ws, we) = (
                alphabet[next(alphabet.len())].clone(),
                alphabet[next(alphabet.len())].clone(),
            );
            let got: BTreeSet<_> = set.overlapping(&ws, Some(&we)).collect();
            let want: BTreeSet<_> = ranges
                .iter()
                .copied()
                .filter(|(s, e)| *s < we.as_slice() && ws.as_slice() < *e && ws < we)
                .collect();
            assert_eq!(got, want, "window {ws:?}..{we:?} in {model:?}");
            let got: BTreeSet<_> = set.overlapping(&ws, None).collect();
            let want: BTreeSet<_> = ranges
                .iter()
                .copied()
                .filter(|(_, e)| ws.as_slice() < *e)
                .collect();
            assert_eq!(got, want, "window {ws:?}.. in {model:?}");
        }
    }
}
