//! The object table: for each log object still holding a live extent, its live bytes and live
//! extents, and whether it holds lz4 frames. The collector deletes an object once it is out of
//! the table and moves extents out of sparse or fragmented ones; the table is kept in each
//! manifest (format 4), so that open reads it instead of walking every extent pointer.

use super::ExtentPtr;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectInfo {
    pub live_bytes: u64,
    pub live_extents: u64,
    /// The object holds frames sealed with lz4 (`MetaOp::HoldsLz4`).
    pub lz4: bool,
}

/// Signed changes of live bytes and live extents per object over an interval.
pub type Deltas = BTreeMap<u64, (i64, i64)>;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectTable {
    objects: BTreeMap<u64, ObjectInfo>,
    live_bytes: u64,
    live_extents: u64,
}

/// Encoded bytes of one object: seq, live bytes, live extents, flags.
pub const OBJECT_BYTES: usize = 8 + 8 + 8 + 1;
const FLAG_LZ4: u8 = 1;

impl ObjectTable {
    /// Adds `bytes` and `extents` (either may be negative) to object `seq`; the object leaves
    /// the table with its last live extent.
    pub fn add(&mut self, seq: u64, bytes: i64, extents: i64) {
        let info = self.objects.entry(seq).or_default();
        let apply = |v: &mut u64, d: i64, total: &mut u64| {
            *v = v
                .checked_add_signed(d)
                .expect("an object's live bytes and extents never go below zero");
            *total = total
                .checked_add_signed(d)
                .expect("the table's totals never go below zero");
        };
        apply(&mut info.live_bytes, bytes, &mut self.live_bytes);
        apply(&mut info.live_extents, extents, &mut self.live_extents);
        if info.live_extents == 0 {
            assert_eq!(
                info.live_bytes, 0,
                "an object without extents holds no bytes"
            );
            self.objects.remove(&seq);
        }
    }

    pub fn credit(&mut self, ptr: ExtentPtr) {
        self.add(ptr.seq, i64::from(ptr.length), 1);
    }

    pub fn debit(&mut self, ptr: ExtentPtr) {
        self.add(ptr.seq, -i64::from(ptr.length), -1);
    }

    pub fn apply(&mut self, deltas: &Deltas) {
        for (seq, (bytes, extents)) in deltas {
            self.add(*seq, *bytes, *extents);
        }
    }

    /// Marks object `seq` as holding lz4 frames, if it is live.
    pub fn mark_lz4(&mut self, seq: u64) {
        if let Some(info) = self.objects.get_mut(&seq) {
            info.lz4 = true;
        }
    }

    pub fn get(&self, seq: u64) -> ObjectInfo {
        self.objects.get(&seq).copied().unwrap_or_default()
    }

    pub fn live_bytes(&self, seq: u64) -> u64 {
        self.get(seq).live_bytes
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, ObjectInfo)> + '_ {
        self.objects.iter().map(|(s, i)| (*s, *i))
    }

    /// The log objects that hold a live extent, in order.
    pub fn live_objects(&self) -> Vec<u64> {
        self.objects.keys().copied().collect()
    }

    pub fn live_bytes_total(&self) -> u64 {
        self.live_bytes
    }

    pub fn extent_count(&self) -> u64 {
        self.live_extents
    }

    /// The live bytes of the objects holding lz4 frames: an upper bound on what is still stored
    /// in lz4, as those objects may also hold zstd frames.
    pub fn live_bytes_in_lz4_objects(&self) -> u64 {
        self.objects
            .values()
            .filter(|i| i.lz4)
            .map(|i| i.live_bytes)
            .sum()
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(8 + self.objects.len() * OBJECT_BYTES);
        out.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for (seq, info) in &self.objects {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&info.live_bytes.to_le_bytes());
            out.extend_from_slice(&info.live_extents.to_le_bytes());
            out.push(if info.lz4 { FLAG_LZ4 } else { 0 });
        }
    }

    /// Decodes what `encode` wrote: objects in increasing order, each with at least one extent.
    pub fn decode(buf: &[u8]) -> Result<ObjectTable, &'static str> {
        let count = buf
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or("truncated object count")?;
        let body = &buf[8..];
        if count.checked_mul(OBJECT_BYTES as u64) != Some(body.len() as u64) {
            return Err("object table length does not match its count");
        }
        let mut table = ObjectTable::default();
        let mut last = None;
        for c in body.chunks_exact(OBJECT_BYTES) {
            let u = |at: usize| u64::from_le_bytes(c[at..at + 8].try_into().expect("8 bytes"));
            let (seq, live_bytes, live_extents) = (u(0), u(8), u(16));
            if last.is_some_and(|l| l >= seq) || live_extents == 0 || c[24] & !FLAG_LZ4 != 0 {
                return Err("malformed object table entry");
            }
            last = Some(seq);
            table.live_bytes = table
                .live_bytes
                .checked_add(live_bytes)
                .ok_or("object table totals overflow")?;
            table.live_extents = table
                .live_extents
                .checked_add(live_extents)
                .ok_or("object table totals overflow")?;
            table.objects.insert(
                seq,
                ObjectInfo {
                    live_bytes,
                    live_extents,
                    lz4: c[24] & FLAG_LZ4 != 0,
                },
            );
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(seq: u64, length: u32) -> ExtentPtr {
        ExtentPtr {
            seq,
            offset: 0,
            length,
        }
    }

    #[test]
    fn objects_leave_with_their_last_extent_and_the_table_round_trips() {
        let mut t = ObjectTable::default();
        t.credit(ptr(3, 100));
        t.credit(ptr(3, 50));
        t.credit(ptr(5, 10));
        t.mark_lz4(3);
        t.mark_lz4(9);
        assert_eq!(t.live_objects(), vec![3, 5]);
        assert_eq!((t.live_bytes_total(), t.extent_count()), (160, 3));
        assert_eq!(t.live_bytes_in_lz4_objects(), 150);
        let mut buf = Vec::new();
        t.encode(&mut buf);
        assert_eq!(ObjectTable::decode(&buf).unwrap(), t);
        for cut in 0..buf.len() {
            assert!(ObjectTable::decode(&buf[..cut]).is_err());
        }
        t.debit(ptr(3, 100));
        t.debit(ptr(3, 50));
        assert_eq!(t.live_objects(), vec![5]);
        assert_eq!(t.live_bytes_in_lz4_objects(), 0);
        let mut deltas = Deltas::new();
        deltas.insert(5, (-10, -1));
        deltas.insert(7, (8, 1));
        t.apply(&deltas);
        assert_eq!(t.live_objects(), vec![7]);
    }
}
