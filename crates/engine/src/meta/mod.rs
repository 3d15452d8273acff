//! Metadata: the key-value pairs of the filesystem core and the extent map of every file.
//!
//! It changes only by applying [`MetaOp`]s, the same ops that log objects carry, so the state
//! after replaying the log is the state that was committed. The committed state is sorted runs
//! in the bucket read through a bounded cache, under the changes since the last checkpoint held
//! in memory (state.rs; docs/0003-metadata-lsm.md).

mod mem;
mod objects;
mod state;

pub use mem::Here;
pub use objects::{ObjectTable, OBJECT_BYTES};
pub use state::{resolve, table_after, Base, BottomSweep, Frozen, KvLayer, MetaState};

/// How the metadata is keyed in runs (docs/format.md, "Runs"): extents first, so that loading a
/// run stack in key order sets them before the lz4 marks that need their objects live.
pub mod run_key {
    use super::ExtentPtr;

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

    pub fn ptr_value(ptr: ExtentPtr) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&ptr.seq.to_le_bytes());
        v.extend_from_slice(&ptr.offset.to_le_bytes());
        v.extend_from_slice(&ptr.length.to_le_bytes());
        v
    }

    /// The inode and index of an extent key.
    pub fn parse_extent(key: &[u8]) -> Option<(u64, u64)> {
        match key.split_first() {
            Some((&EXTENT, rest)) if rest.len() == 16 => {
                Some((u64_at(&rest[..8]), u64_at(&rest[8..])))
            }
            _ => None,
        }
    }

    /// The pointer an extent key's value holds.
    pub fn parse_ptr(value: &[u8]) -> Option<ExtentPtr> {
        (value.len() == 16).then(|| ExtentPtr {
            seq: u64::from_le_bytes(value[..8].try_into().expect("8 bytes")),
            offset: u32::from_le_bytes(value[8..12].try_into().expect("4 bytes")),
            length: u32::from_le_bytes(value[12..].try_into().expect("4 bytes")),
        })
    }

    /// The key-value key of a run key, if it is one.
    pub fn parse_kv(key: &[u8]) -> Option<&[u8]> {
        match key.split_first() {
            Some((&KV, rest)) => Some(rest),
            _ => None,
        }
    }

    /// The log object of an lz4 mark (format 2 and 3 runs; format 4 keeps them in the object
    /// table of the manifest).
    pub fn parse_lz4_object(key: &[u8]) -> Option<u64> {
        match key.split_first() {
            Some((&LZ4_OBJECT, rest)) if rest.len() == 8 => Some(u64_at(rest)),
            _ => None,
        }
    }

    /// The run keys of the key-value keys `start..end` (`None`: to the last one).
    pub fn kv_bounds(start: &[u8], end: Option<&[u8]>) -> (Vec<u8>, Vec<u8>) {
        (kv(start), end.map_or_else(|| vec![KV + 1], kv))
    }

    /// The first run key after every extent key.
    pub fn extents_end() -> Vec<u8> {
        vec![EXTENT + 1]
    }

    /// The keys after `prefix` of the run keys in `start..end` that begin with it: a window
    /// `from..to` of them (`to` `None`: unbounded), or `None` when there are none.
    fn window<'a>(
        prefix: u8,
        start: &'a [u8],
        end: &'a [u8],
    ) -> Option<(&'a [u8], Option<&'a [u8]>)> {
        let from: &[u8] = match start.split_first() {
            Some((&p, rest)) if p == prefix => rest,
            Some((&p, _)) if p > prefix => return None,
            _ => &[],
        };
        let to = match end.split_first() {
            Some((&p, rest)) if p == prefix => Some(rest),
            Some((&p, _)) if p > prefix => None,
            _ => return None,
        };
        match to {
            Some(to) if from >= to => None,
            _ => Some((from, to)),
        }
    }

    /// The key-value keys of the run keys in `start..end`, as a window `from..to` (`to`
    /// `None`: unbounded); `None` when there are none.
    pub fn kv_window<'a>(start: &'a [u8], end: &'a [u8]) -> Option<(&'a [u8], Option<&'a [u8]>)> {
        window(KV, start, end)
    }

    /// The inodes that have extent keys in `start..end`, or more of them: `None` when no
    /// extent key is in it.
    pub fn extent_inodes(start: &[u8], end: &[u8]) -> Option<std::ops::RangeInclusive<u64>> {
        // The first 8 bytes of a key, padded with zeros: at most the inode of any extent key
        // at or after it.
        let ino = |rest: &[u8]| {
            let mut b = [0u8; 8];
            let n = rest.len().min(8);
            b[..n].copy_from_slice(&rest[..n]);
            u64::from_be_bytes(b)
        };
        let (from, to) = window(EXTENT, start, end)?;
        Some(ino(from)..=to.map_or(u64::MAX, ino))
    }

    fn u64_at(b: &[u8]) -> u64 {
        u64::from_be_bytes(b.try_into().expect("8 bytes, checked by the caller"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_windows_of_run_key_bounds_hold_every_key_inside_them() {
        // Bounds of every kind (extent keys, key-value keys, lz4 marks, the ends of each
        // space) against keys of every kind: a key inside the bounds is inside the window.
        let mut keys: Vec<Vec<u8>> = vec![vec![], b"A".to_vec(), b"E".to_vec(), b"K".to_vec()];
        for ino in [0, 1, 7, 255, 256, u64::MAX] {
            for index in [0, 3, u64::MAX] {
                keys.push(run_key::extent(ino, index));
            }
        }
        for k in [&b""[..], b"a", b"a\0", b"b", b"\xff"] {
            keys.push(run_key::kv(k));
        }
        keys.extend([
            run_key::extents_end(),
            run_key::kv_bounds(b"", None).1,
            b"Z\0\0\0\0\0\0\0\x01".to_vec(),
            b"\xff".to_vec(),
            b"E\x01".to_vec(),
        ]);
        for start in &keys {
            for end in &keys {
                let inodes = run_key::extent_inodes(start, end);
                let kv = run_key::kv_window(start, end);
                for key in keys.iter().filter(|k| start <= *k && *k < end) {
                    if let Some((ino, _)) = run_key::parse_extent(key) {
                        assert!(
                            inodes.as_ref().is_some_and(|r| r.contains(&ino)),
                            "{key:?} in {start:?}..{end:?}: {inodes:?}"
                        );
                    }
                    if let Some(raw) = run_key::parse_kv(key) {
                        assert!(
                            kv.is_some_and(|(from, to)| from <= raw && to.is_none_or(|to| raw < to)),
                            "{key:?} in {start:?}..{end:?}: {kv:?}"
                        );
                    }
                }
            }
        }
        // And the windows are not wider than asked.
        assert_eq!(run_key::kv_window(b"E", b"K"), None);
        assert_eq!(
            run_key::kv_window(&run_key::kv(b"a"), &run_key::kv(b"c")),
            Some((&b"a"[..], Some(&b"c"[..])))
        );
        assert_eq!(
            run_key::extent_inodes(&run_key::extent(5, 0), &run_key::extent(9, 0)),
            Some(5..=9)
        );
        assert_eq!(run_key::extent_inodes(&run_key::kv(b""), b"\xff"), None);
    }

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
}
