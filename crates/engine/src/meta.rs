//! Metadata: the key-value pairs of the filesystem core and the extent map of every file.
//!
//! The whole map is held in memory (docs/0001-bucket-layout-and-flush.md says why and what that
//! costs). It changes only by applying [`MetaOp`]s, the same ops that log objects carry, so the
//! state after replaying the log is the state that was committed.

use crate::lsm::{Entry, MemRun};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// How the metadata is keyed in runs (docs/format.md, "Runs"): extents first, so that loading a
/// run stack in key order sets them before the lz4 marks that need their objects live.
pub mod run_key {
    use super::{DecodeError, ExtentPtr, MetaOp};

    const EXTENT: u8 = b'E';
    const KV: u8 = b'K';
    const LZ4_OBJECT: u8 = b'Z';

    pub fn extent(ino: u64, index: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(17);
        k.push(EXTENT);
        k.extend_from_slice(&ino.to_be_bytes());
        k.extend_from_slice(&index.to_be_bytes());
        k
    }

    pub fn kv(key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(1 + key.len());
        k.push(KV);
        k.extend_from_slice(key);
        k
    }

    pub fn lz4_object(seq: u64) -> Vec<u8> {
        let mut k = vec![LZ4_OBJECT];
        k.extend_from_slice(&seq.to_be_bytes());
        k
    }

    pub fn ptr_value(ptr: ExtentPtr) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&ptr.seq.to_le_bytes());
        v.extend_from_slice(&ptr.offset.to_le_bytes());
        v.extend_from_slice(&ptr.length.to_le_bytes());
        v
    }

    fn bad(why: &'static str) -> DecodeError {
        DecodeError { at: 0, why }
    }

    fn u64_at(b: &[u8]) -> u64 {
        u64::from_be_bytes(b.try_into().expect("8 bytes, checked by the caller"))
    }

    /// The op that sets the state of `key` to `value`.
    pub fn op(key: &[u8], value: &[u8]) -> Result<MetaOp, DecodeError> {
        match key.split_first() {
            Some((&EXTENT, rest)) if rest.len() == 16 && value.len() == 16 => {
                Ok(MetaOp::ExtentSet {
                    ino: u64_at(&rest[..8]),
                    index: u64_at(&rest[8..]),
                    ptr: ExtentPtr {
                        seq: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
                        offset: u32::from_le_bytes(value[8..12].try_into().expect("4 bytes")),
                        length: u32::from_le_bytes(value[12..].try_into().expect("4 bytes")),
                    },
                })
            }
            Some((&KV, rest)) => Ok(MetaOp::KvPut {
                key: rest.to_vec(),
                value: value.to_vec(),
            }),
            Some((&LZ4_OBJECT, rest)) if rest.len() == 8 && value.is_empty() => {
                Ok(MetaOp::HoldsLz4 { seq: u64_at(rest) })
            }
            _ => Err(bad("a run entry of no known kind")),
        }
    }
}

/// Where one extent's frame is stored: in log object `seq`, at `offset`, `length` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentPtr {
    pub seq: u64,
    pub offset: u32,
    pub length: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaOp {
    KvPut {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    KvDelete {
        key: Vec<u8>,
    },
    ExtentSet {
        ino: u64,
        index: u64,
        ptr: ExtentPtr,
    },
    ExtentClear {
        ino: u64,
        index: u64,
    },
    /// Deallocates every extent of `ino` with an index in `from..to`: truncation, unlink and
    /// TRIM of any size in one op.
    ExtentClearRange {
        ino: u64,
        from: u64,
        to: u64,
    },
    /// Deletes every key-value pair with a key in `start..end`.
    KvDeleteRange {
        start: Vec<u8>,
        end: Vec<u8>,
    },
    /// Log object `seq` holds frames sealed with lz4. Comes after the object's `ExtentSet`s;
    /// the collector re-seals such frames with zstd once they are aged
    /// (`Tuning::reseal_after_s`; docs/0001, "Re-sealing lz4 frames").
    HoldsLz4 {
        seq: u64,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("metadata record is malformed at byte {at}: {why}")]
pub struct DecodeError {
    pub at: usize,
    pub why: &'static str,
}

const TAG_KV_PUT: u8 = 1;
const TAG_KV_DELETE: u8 = 2;
const TAG_EXTENT_SET: u8 = 3;
const TAG_EXTENT_CLEAR: u8 = 4;
const TAG_HOLDS_LZ4: u8 = 5;
const TAG_EXTENT_CLEAR_RANGE: u8 = 6;
const TAG_KV_DELETE_RANGE: u8 = 7;

pub fn encode_ops(ops: &[MetaOp], out: &mut Vec<u8>) {
    out.extend_from_slice(&(ops.len() as u64).to_le_bytes());
    for op in ops {
        encode_op(op, out);
    }
}

/// Encoded bytes of an `ExtentSet` op: tag, ino, index, seq, offset, length.
#[cfg(test)]
const EXTENT_SET_BYTES: usize = 1 + 8 + 8 + 8 + 4 + 4;

/// Encoded bytes of a `HoldsLz4` op: tag, seq.
#[cfg(test)]
const HOLDS_LZ4_BYTES: usize = 1 + 8;

fn encode_op(op: &MetaOp, out: &mut Vec<u8>) {
    match op {
        MetaOp::KvPut { key, value } => encode_kv_put(key, value, out),
        MetaOp::KvDelete { key } => {
            out.push(TAG_KV_DELETE);
            put_bytes(out, key);
        }
        MetaOp::ExtentSet { ino, index, ptr } => {
            out.push(TAG_EXTENT_SET);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&ptr.seq.to_le_bytes());
            out.extend_from_slice(&ptr.offset.to_le_bytes());
            out.extend_from_slice(&ptr.length.to_le_bytes());
        }
        MetaOp::ExtentClear { ino, index } => {
            out.push(TAG_EXTENT_CLEAR);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
        }
        MetaOp::HoldsLz4 { seq } => {
            out.push(TAG_HOLDS_LZ4);
            out.extend_from_slice(&seq.to_le_bytes());
        }
        MetaOp::ExtentClearRange { ino, from, to } => {
            out.push(TAG_EXTENT_CLEAR_RANGE);
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&from.to_le_bytes());
            out.extend_from_slice(&to.to_le_bytes());
        }
        MetaOp::KvDeleteRange { start, end } => {
            out.push(TAG_KV_DELETE_RANGE);
            put_bytes(out, start);
            put_bytes(out, end);
        }
    }
}

fn encode_kv_put(key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(TAG_KV_PUT);
    put_bytes(out, key);
    put_bytes(out, value);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(DecodeError {
            at: self.at,
            why: "truncated",
        })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("take(4) returns 4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("take(8) returns 8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

pub fn decode_ops(buf: &[u8]) -> Result<Vec<MetaOp>, DecodeError> {
    let mut r = Reader { buf, at: 0 };
    let count = r.u64()?;
    // Each op takes at least 5 bytes: a count larger than that is a lie, not an allocation.
    if count > (buf.len() / 5) as u64 {
        return Err(DecodeError {
            at: 0,
            why: "op count exceeds record size",
        });
    }
    let mut ops = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let at = r.at;
        ops.push(match r.u8()? {
            TAG_KV_PUT => MetaOp::KvPut {
                key: r.bytes()?,
                value: r.bytes()?,
            },
            TAG_KV_DELETE => MetaOp::KvDelete { key: r.bytes()? },
            TAG_EXTENT_SET => MetaOp::ExtentSet {
                ino: r.u64()?,
                index: r.u64()?,
                ptr: ExtentPtr {
                    seq: r.u64()?,
                    offset: r.u32()?,
                    length: r.u32()?,
                },
            },
            TAG_EXTENT_CLEAR => MetaOp::ExtentClear {
                ino: r.u64()?,
                index: r.u64()?,
            },
            TAG_HOLDS_LZ4 => MetaOp::HoldsLz4 { seq: r.u64()? },
            TAG_EXTENT_CLEAR_RANGE => MetaOp::ExtentClearRange {
                ino: r.u64()?,
                from: r.u64()?,
                to: r.u64()?,
            },
            TAG_KV_DELETE_RANGE => MetaOp::KvDeleteRange {
                start: r.bytes()?,
                end: r.bytes()?,
            },
            _ => {
                return Err(DecodeError {
                    at,
                    why: "unknown op tag",
                })
            }
        });
    }
    if r.at != buf.len() {
        return Err(DecodeError {
            at: r.at,
            why: "trailing bytes",
        });
    }
    Ok(ops)
}

/// The committed metadata. `live_bytes` is derived from the extent map (never stored): the bytes
/// of each log object still referenced, which tells the garbage collector what it may delete.
#[derive(Debug, Default, Clone)]
pub struct MetaState {
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
    extents: HashMap<u64, BTreeMap<u64, ExtentPtr>>,
    live_bytes: HashMap<u64, u64>,
    /// Live log objects that hold lz4 frames (`MetaOp::HoldsLz4`); an object leaves the set
    /// when its last live extent does.
    lz4_objects: BTreeSet<u64>,
    /// Keys changed since the last checkpoint took them (`take_changes`): what the next
    /// checkpoint's run holds.
    touched: Touched,
}

/// The keys and ranges a stretch of ops changed, by kind.
#[derive(Debug, Default, Clone)]
struct Touched {
    kv: BTreeSet<Vec<u8>>,
    extents: BTreeSet<(u64, u64)>,
    lz4_objects: BTreeSet<u64>,
    /// Range deletions, as (start, end) and (ino, from, to): a run records them as ranges,
    /// whatever they covered.
    kv_ranges: Vec<(Vec<u8>, Vec<u8>)>,
    extent_ranges: Vec<(u64, u64, u64)>,
}

impl MetaState {
    pub fn apply(&mut self, op: &MetaOp) {
        match op {
            MetaOp::KvPut { key, value } => {
                self.touched.kv.insert(key.clone());
                self.kv.insert(key.clone(), value.clone());
            }
            MetaOp::KvDelete { key } => {
                self.touched.kv.insert(key.clone());
                self.kv.remove(key);
            }
            MetaOp::ExtentSet { ino, index, ptr } => {
                self.touched.extents.insert((*ino, *index));
                let old = self.extents.entry(*ino).or_default().insert(*index, *ptr);
                *self.live_bytes.entry(ptr.seq).or_default() += u64::from(ptr.length);
                if let Some(old) = old {
                    self.debit(old);
                }
            }
            MetaOp::ExtentClear { ino, index } => {
                self.touched.extents.insert((*ino, *index));
                if let Some(map) = self.extents.get_mut(ino) {
                    if let Some(old) = map.remove(index) {
                        if map.is_empty() {
                            self.extents.remove(ino);
                        }
                        self.debit(old);
                    }
                }
            }
            MetaOp::ExtentClearRange { ino, from, to } => {
                if from >= to {
                    return;
                }
                self.touched.extent_ranges.push((*ino, *from, *to));
                let Some(map) = self.extents.get_mut(ino) else {
                    return;
                };
                let doomed: Vec<u64> = map.range(*from..*to).map(|(i, _)| *i).collect();
                let old: Vec<ExtentPtr> = doomed.iter().filter_map(|i| map.remove(i)).collect();
                if map.is_empty() {
                    self.extents.remove(ino);
                }
                for ptr in old {
                    self.debit(ptr);
                }
            }
            MetaOp::KvDeleteRange { start, end } => {
                if start >= end {
                    return;
                }
                self.touched.kv_ranges.push((start.clone(), end.clone()));
                let doomed: Vec<Vec<u8>> = self
                    .kv
                    .range(start.clone()..end.clone())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in doomed {
                    self.kv.remove(&k);
                }
            }
            MetaOp::HoldsLz4 { seq } => {
                // Only a live object is worth re-sealing (its frames may all have been
                // overwritten within the very batch that wrote them).
                if self.live_bytes.contains_key(seq) && self.lz4_objects.insert(*seq) {
                    self.touched.lz4_objects.insert(*seq);
                }
            }
        }
    }

    fn debit(&mut self, old: ExtentPtr) {
        let live = self
            .live_bytes
            .get_mut(&old.seq)
            .expect("every stored pointer was credited to its log object");
        *live = live
            .checked_sub(u64::from(old.length))
            .expect("live bytes never go below zero");
        if *live == 0 {
            self.live_bytes.remove(&old.seq);
            if self.lz4_objects.remove(&old.seq) {
                self.touched.lz4_objects.insert(old.seq);
            }
        }
    }

    /// The entries of a run holding what changed since the last call (or since the state was
    /// built): each changed key's value now, or its deletion.
    pub fn take_changes(&mut self) -> MemRun {
        let touched = std::mem::take(&mut self.touched);
        let mut run = MemRun::default();
        // Ranges first: a run's points are newer than its ranges, and every touched point is
        // written below with its value now.
        for (start, end) in touched.kv_ranges {
            run.delete_range(run_key::kv(&start), run_key::kv(&end));
        }
        for (ino, from, to) in touched.extent_ranges {
            run.delete_range(run_key::extent(ino, from), run_key::extent(ino, to));
        }
        for key in touched.kv {
            match self.kv.get(&key) {
                Some(value) => run.put(run_key::kv(&key), value.clone()),
                None => run.delete(run_key::kv(&key)),
            }
        }
        for (ino, index) in touched.extents {
            match self.extent(ino, index) {
                Some(ptr) => run.put(run_key::extent(ino, index), run_key::ptr_value(ptr)),
                None => run.delete(run_key::extent(ino, index)),
            }
        }
        for seq in touched.lz4_objects {
            if self.lz4_objects.contains(&seq) {
                run.put(run_key::lz4_object(seq), Vec::new());
            } else {
                run.delete(run_key::lz4_object(seq));
            }
        }
        run
    }

    /// Forgets the changes `take_changes` would return: the whole state is being written.
    pub fn forget_changes(&mut self) {
        self.touched = Touched::default();
    }

    /// Every entry of the state, in key order: a run that replaces all others.
    pub fn entries(&self) -> Vec<(Vec<u8>, Entry)> {
        let mut out: Vec<(Vec<u8>, Entry)> =
            Vec::with_capacity(self.kv.len() + self.extent_count());
        let mut inos: Vec<_> = self.extents.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            for (index, ptr) in &self.extents[&ino] {
                out.push((
                    run_key::extent(ino, *index),
                    Entry::Put(run_key::ptr_value(*ptr)),
                ));
            }
        }
        for (key, value) in &self.kv {
            out.push((run_key::kv(key), Entry::Put(value.clone())));
        }
        for seq in &self.lz4_objects {
            out.push((run_key::lz4_object(*seq), Entry::Put(Vec::new())));
        }
        out
    }

    /// Applies one live entry of a run stack, in key order (extents come before the lz4 marks
    /// that need their objects live). The rebuilt state has no changes to take.
    pub fn load_entry(&mut self, key: &[u8], value: &[u8]) -> Result<(), DecodeError> {
        let op = run_key::op(key, value)?;
        self.apply(&op);
        self.touched = Touched::default();
        Ok(())
    }

    pub fn kv_get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.kv.get(key)
    }

    pub fn kv_bounds(
        &self,
        bounds: (std::ops::Bound<Vec<u8>>, std::ops::Bound<Vec<u8>>),
    ) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> + '_ {
        self.kv.range(bounds)
    }

    pub fn extent(&self, ino: u64, index: u64) -> Option<ExtentPtr> {
        self.extents.get(&ino).and_then(|m| m.get(&index)).copied()
    }

    /// Allocated extent indexes of `ino` in `range`.
    pub fn extent_indexes(&self, ino: u64, range: std::ops::Range<u64>) -> Vec<u64> {
        match self.extents.get(&ino) {
            Some(m) => m.range(range).map(|(i, _)| *i).collect(),
            None => Vec::new(),
        }
    }

    fn extents_where<'a>(
        &'a self,
        keep: impl Fn(&ExtentPtr) -> bool + 'a,
    ) -> impl Iterator<Item = (u64, u64, ExtentPtr)> + 'a {
        self.extents
            .iter()
            .flat_map(|(ino, m)| m.iter().map(move |(index, ptr)| (*ino, *index, *ptr)))
            .filter(move |(_, _, ptr)| keep(ptr))
    }

    /// The extents stored in each of the log objects `seqs` that holds at most `max` of them
    /// (and at least one), as (inode, index, pointer).
    pub fn extents_of_sparse_objects(
        &self,
        seqs: &HashSet<u64>,
        max: usize,
    ) -> Vec<(u64, u64, ExtentPtr)> {
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for (_, _, ptr) in self.extents_where(|p| seqs.contains(&p.seq)) {
            *counts.entry(ptr.seq).or_default() += 1;
        }
        counts.retain(|_, n| *n <= max);
        self.extents_where(|p| counts.contains_key(&p.seq))
            .collect()
    }

    /// The extents stored in log objects up to `through_seq` that hold lz4 frames and more
    /// than `more_than` live extents, oldest object first and in object order, as (inode,
    /// index, pointer).
    pub fn extents_of_lz4_objects(
        &self,
        through_seq: u64,
        more_than: usize,
    ) -> Vec<(u64, u64, ExtentPtr)> {
        if self.lz4_objects.range(..=through_seq).next().is_none() {
            return Vec::new();
        }
        let mut found: Vec<_> = self
            .extents_where(|p| p.seq <= through_seq && self.lz4_objects.contains(&p.seq))
            .collect();
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for (_, _, p) in &found {
            *counts.entry(p.seq).or_default() += 1;
        }
        found.retain(|(_, _, p)| counts[&p.seq] > more_than);
        found.sort_unstable_by_key(|(_, _, p)| (p.seq, p.offset));
        found
    }

    /// The log objects that hold a live extent, in order.
    pub fn live_objects(&self) -> Vec<u64> {
        let mut seqs: Vec<u64> = self.live_bytes.keys().copied().collect();
        seqs.sort_unstable();
        seqs
    }

    pub fn live_bytes(&self, seq: u64) -> u64 {
        self.live_bytes.get(&seq).copied().unwrap_or(0)
    }

    /// The live bytes of all log objects: what the data would take in a bucket without garbage.
    pub fn live_bytes_total(&self) -> u64 {
        self.live_bytes.values().sum()
    }

    /// The extents stored in the log objects `seqs`, in object order, as (inode, index,
    /// pointer).
    pub fn extents_of_objects(&self, seqs: &HashSet<u64>) -> Vec<(u64, u64, ExtentPtr)> {
        let mut found: Vec<_> = self.extents_where(|p| seqs.contains(&p.seq)).collect();
        found.sort_unstable_by_key(|(_, _, p)| (p.seq, p.offset));
        found
    }

    /// The live bytes (stored, compressed) of the log objects that hold lz4 frames: an upper
    /// bound on what is still stored in lz4, as those objects may also hold zstd frames.
    pub fn live_bytes_in_lz4_objects(&self) -> u64 {
        self.lz4_objects
            .iter()
            .map(|seq| self.live_bytes(*seq))
            .sum()
    }

    pub fn extent_count(&self) -> usize {
        self.extents.values().map(|m| m.len()).sum()
    }

    /// Appends the whole state, encoded as the ops that rebuild it from empty (as `encode_ops`
    /// writes them): the body of a checkpoint. Encodes straight from the map, without a list
    /// of ops in between; `out` is reused from checkpoint to checkpoint.
    #[cfg(test)]
    pub fn encode_as_ops(&self, out: &mut Vec<u8>) {
        let extents = self.extent_count();
        let kv_bytes: usize = self
            .kv
            .iter()
            .map(|(k, v)| 1 + 4 + k.len() + 4 + v.len())
            .sum();
        out.reserve(
            8 + kv_bytes + extents * EXTENT_SET_BYTES + self.lz4_objects.len() * HOLDS_LZ4_BYTES,
        );
        out.extend_from_slice(
            &((self.kv.len() + extents + self.lz4_objects.len()) as u64).to_le_bytes(),
        );
        for (key, value) in &self.kv {
            encode_kv_put(key, value, out);
        }
        let mut inos: Vec<_> = self.extents.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            for (index, ptr) in &self.extents[&ino] {
                let op = MetaOp::ExtentSet {
                    ino,
                    index: *index,
                    ptr: *ptr,
                };
                encode_op(&op, out);
            }
        }
        // After every extent: applying one needs its object live.
        for seq in &self.lz4_objects {
            encode_op(&MetaOp::HoldsLz4 { seq: *seq }, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_garbage_is_rejected() {
        let ops = vec![
            MetaOp::KvPut {
                key: b"a".to_vec(),
                value: b"xyz".to_vec(),
            },
            MetaOp::KvDelete { key: b"b".to_vec() },
            MetaOp::ExtentSet {
                ino: 5,
                index: 9,
                ptr: ExtentPtr {
                    seq: 3,
                    offset: 40,
                    length: 99,
                },
            },
            MetaOp::ExtentClear { ino: 5, index: 10 },
            MetaOp::HoldsLz4 { seq: 3 },
            MetaOp::ExtentClearRange {
                ino: 5,
                from: 2,
                to: u64::MAX,
            },
            MetaOp::KvDeleteRange {
                start: b"a".to_vec(),
                end: b"b".to_vec(),
            },
        ];
        let mut buf = Vec::new();
        encode_ops(&ops, &mut buf);
        assert_eq!(decode_ops(&buf).unwrap(), ops);
        for cut in 0..buf.len() {
            assert!(decode_ops(&buf[..cut]).is_err());
        }
        let mut huge = buf.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_ops(&huge).is_err());
    }

    #[test]
    fn range_deletions_debit_what_they_cover_and_reach_the_next_run_as_ranges() {
        let mut m = MetaState::default();
        for index in 0..100 {
            m.apply(&MetaOp::ExtentSet {
                ino: 4,
                index,
                ptr: ExtentPtr {
                    seq: 1 + index / 50,
                    offset: 0,
                    length: 10,
                },
            });
        }
        for key in [b"da".to_vec(), b"db".to_vec(), b"dc".to_vec()] {
            m.apply(&MetaOp::KvPut {
                key,
                value: b"v".to_vec(),
            });
        }
        m.take_changes();
        m.apply(&MetaOp::ExtentClearRange {
            ino: 4,
            from: 30,
            to: u64::MAX,
        });
        m.apply(&MetaOp::ExtentSet {
            ino: 4,
            index: 60,
            ptr: ExtentPtr {
                seq: 3,
                offset: 0,
                length: 10,
            },
        });
        m.apply(&MetaOp::KvDeleteRange {
            start: b"db".to_vec(),
            end: b"dz".to_vec(),
        });
        assert_eq!(
            (m.live_bytes(1), m.live_bytes(2), m.live_bytes(3)),
            (300, 0, 10)
        );
        assert_eq!(m.extent_count(), 31);
        assert_eq!(m.kv_get(b"da"), Some(&b"v".to_vec()));
        assert_eq!(m.kv_get(b"dc"), None);
        let run = m.take_changes();
        assert_eq!(
            run.ranges,
            vec![
                crate::lsm::RangeDelete {
                    start: run_key::kv(b"db"),
                    end: run_key::kv(b"dz"),
                },
                crate::lsm::RangeDelete {
                    start: run_key::extent(4, 30),
                    end: run_key::extent(4, u64::MAX),
                },
            ]
        );
        // The extent set after the range is a point of the run, newer than the range.
        assert_eq!(
            run.points.get(&run_key::extent(4, 60)),
            Some(&Entry::Put(run_key::ptr_value(ExtentPtr {
                seq: 3,
                offset: 0,
                length: 10
            })))
        );
        assert_eq!(run.points.len(), 1);
    }

    #[test]
    fn sparse_objects_are_those_with_few_extents_left() {
        let mut m = MetaState::default();
        // Object 1 holds three extents, object 2 one, object 3 one of inode 2.
        for (ino, index, seq) in [(1, 0, 1), (1, 1, 1), (1, 2, 1), (1, 3, 2), (2, 0, 3)] {
            m.apply(&MetaOp::ExtentSet {
                ino,
                index,
                ptr: ExtentPtr {
                    seq,
                    offset: index as u32 * 100,
                    length: 100,
                },
            });
        }
        let seqs: HashSet<u64> = [1, 2].into_iter().collect();
        let mut got = m.extents_of_sparse_objects(&seqs, 1);
        got.sort_by_key(|(ino, index, _)| (*ino, *index));
        assert_eq!(
            got.iter()
                .map(|(i, x, p)| (*i, *x, p.seq))
                .collect::<Vec<_>>(),
            vec![(1, 3, 2)]
        );
        assert_eq!(m.extents_of_sparse_objects(&seqs, 3).len(), 4);
        assert!(m.extents_of_sparse_objects(&HashSet::new(), 3).is_empty());
    }

    #[test]
    fn live_bytes_follow_the_extent_map() {
        let mut m = MetaState::default();
        let p = |seq, length| ExtentPtr {
            seq,
            offset: 0,
            length,
        };
        m.apply(&MetaOp::ExtentSet {
            ino: 1,
            index: 0,
            ptr: p(1, 10),
        });
        m.apply(&MetaOp::ExtentSet {
            ino: 1,
            index: 1,
            ptr: p(1, 20),
        });
        assert_eq!(m.live_bytes(1), 30);
        m.apply(&MetaOp::ExtentSet {
            ino: 1,
            index: 0,
            ptr: p(2, 5),
        });
        assert_eq!((m.live_bytes(1), m.live_bytes(2)), (20, 5));
        m.apply(&MetaOp::ExtentClear { ino: 1, index: 1 });
        m.apply(&MetaOp::ExtentClear { ino: 1, index: 7 });
        assert_eq!((m.live_bytes(1), m.live_bytes(2)), (0, 5));
        m.apply(&MetaOp::KvPut {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        });
        let mut encoded = Vec::new();
        m.encode_as_ops(&mut encoded);
        let mut rebuilt = MetaState::default();
        for op in decode_ops(&encoded).unwrap() {
            rebuilt.apply(&op);
        }
        assert_eq!(rebuilt.kv_get(b"k"), Some(&b"v".to_vec()));
        assert_eq!(rebuilt.extent(1, 0), m.extent(1, 0));
        assert_eq!(rebuilt.live_bytes(2), 5);
    }

    #[test]
    fn lz4_objects_follow_their_live_extents_and_survive_a_checkpoint() {
        let mut m = MetaState::default();
        let set = |m: &mut MetaState, index, seq| {
            m.apply(&MetaOp::ExtentSet {
                ino: 1,
                index,
                ptr: ExtentPtr {
                    seq,
                    offset: index as u32 * 100,
                    length: 100,
                },
            })
        };
        // Objects 1 and 3 hold lz4 frames, object 2 does not.
        set(&mut m, 0, 1);
        set(&mut m, 1, 1);
        m.apply(&MetaOp::HoldsLz4 { seq: 1 });
        set(&mut m, 2, 2);
        set(&mut m, 3, 3);
        m.apply(&MetaOp::HoldsLz4 { seq: 3 });
        let seqs = |found: Vec<(u64, u64, ExtentPtr)>| {
            found
                .iter()
                .map(|(_, i, p)| (*i, p.seq))
                .collect::<Vec<_>>()
        };
        assert_eq!(seqs(m.extents_of_lz4_objects(2, 0)), vec![(0, 1), (1, 1)]);
        assert_eq!(
            seqs(m.extents_of_lz4_objects(3, 0)),
            vec![(0, 1), (1, 1), (3, 3)]
        );
        assert!(m.extents_of_lz4_objects(0, 0).is_empty());
        assert_eq!(m.live_bytes_in_lz4_objects(), 300);
        // Only objects with more than so many live extents (the others are repacking's).
        assert_eq!(seqs(m.extents_of_lz4_objects(3, 1)), vec![(0, 1), (1, 1)]);
        assert!(m.extents_of_lz4_objects(3, 2).is_empty());
        // A checkpoint keeps what is known of live objects.
        let mut encoded = Vec::new();
        m.encode_as_ops(&mut encoded);
        let mut rebuilt = MetaState::default();
        for op in decode_ops(&encoded).unwrap() {
            rebuilt.apply(&op);
        }
        assert_eq!(
            seqs(rebuilt.extents_of_lz4_objects(3, 0)),
            seqs(m.extents_of_lz4_objects(3, 0))
        );
        // Object 3 dies: it is no longer one to re-seal, and a late marker does not revive it.
        set(&mut m, 3, 4);
        m.apply(&MetaOp::HoldsLz4 { seq: 3 });
        assert_eq!(seqs(m.extents_of_lz4_objects(4, 0)), vec![(0, 1), (1, 1)]);
        assert_eq!(m.live_bytes_in_lz4_objects(), 200);
        // Re-sealing moves object 1's extents out: nothing is left to re-seal.
        set(&mut m, 0, 5);
        set(&mut m, 1, 5);
        assert!(m.extents_of_lz4_objects(5, 0).is_empty());
        assert_eq!(m.live_bytes_in_lz4_objects(), 0);
    }
}
