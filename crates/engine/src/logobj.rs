//! The objects that carry data and metadata (docs/format.md):
//!
//! - a **log object** `log/<seq>`: the frames of one flush followed by the sealed record of the
//!   metadata ops of that flush. One PUT makes a flush durable, data and metadata together.
//! - a **checkpoint** `checkpoint/<seq>` (format 1, read to migrate a bucket, no longer written):
//!   the whole metadata state as of log object `seq`;
//! - a **manifest** `manifest/<seq>` (format 2): the runs (`run/<id>`, lsm/run.rs) that hold the
//!   metadata as of log object `seq`, so opening a bucket replays only the log objects after it.

use crate::crypto::Sealer;
use crate::meta::{decode_ops, encode_ops, MetaOp, ObjectTable};

const LOG_MAGIC: &[u8; 8] = b"BFSLOG01";
const LOG_END_MAGIC: &[u8; 8] = b"BFSEND01";
const CHECKPOINT_MAGIC: &[u8; 8] = b"BFSCKP01";
pub const LOG_HEADER_BYTES: usize = 16;
/// meta offset (8) || meta length (8) || end magic (8)
pub const LOG_TRAILER_BYTES: u64 = 24;

pub fn log_key(seq: u64) -> String {
    format!("log/{seq:020}")
}

pub fn checkpoint_key(seq: u64) -> String {
    format!("checkpoint/{seq:020}")
}

/// The sequence number in a `log/` or `checkpoint/` key, None for anything else.
pub fn parse_seq(key: &str, folder: &str) -> Option<u64> {
    let name = key.strip_prefix(folder)?.strip_prefix('/')?;
    if name.len() != 20 {
        return None;
    }
    name.parse().ok()
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    #[error("{key}: not a bucketfs object of the expected kind (bad magic or length)")]
    Malformed { key: String },
    #[error("{key}: metadata failed authentication (corrupted, or sealed with another key)")]
    Authentication { key: String },
    #[error("{key}: {why}")]
    Record { key: String, why: String },
}

fn meta_aad(kind: &[u8], seq: u64) -> Vec<u8> {
    let mut a = kind.to_vec();
    a.extend_from_slice(&seq.to_le_bytes());
    a
}

/// The start of a log object; the frames follow it.
pub fn log_header(seq: u64) -> [u8; LOG_HEADER_BYTES] {
    let mut h = [0u8; LOG_HEADER_BYTES];
    h[..8].copy_from_slice(LOG_MAGIC);
    h[8..].copy_from_slice(&seq.to_le_bytes());
    h
}

/// The end of a log object whose frames end at `meta_offset`: the sealed metadata record and
/// the trailer that points at it.
pub fn log_tail(sealer: &Sealer, seq: u64, ops: &[MetaOp], meta_offset: usize) -> Vec<u8> {
    let mut plain = Vec::new();
    encode_ops(ops, &mut plain);
    let mut tail = Vec::with_capacity(Sealer::sealed_len(plain.len()) + LOG_TRAILER_BYTES as usize);
    sealer.seal_into(&mut tail, &meta_aad(b"bfs-log-meta", seq), &plain);
    let meta_len = tail.len() as u64;
    tail.extend_from_slice(&(meta_offset as u64).to_le_bytes());
    tail.extend_from_slice(&meta_len.to_le_bytes());
    tail.extend_from_slice(LOG_END_MAGIC);
    tail
}

/// Where the metadata record is, from the trailer (the last LOG_TRAILER_BYTES of the object).
pub fn parse_trailer(
    key: &str,
    object_size: u64,
    trailer: &[u8],
) -> Result<std::ops::Range<u64>, ObjectError> {
    let bad = || ObjectError::Malformed {
        key: key.to_string(),
    };
    if trailer.len() as u64 != LOG_TRAILER_BYTES || &trailer[16..24] != LOG_END_MAGIC {
        return Err(bad());
    }
    let off = u64::from_le_bytes(trailer[0..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes"));
    let end = off.checked_add(len).ok_or_else(bad)?;
    if off < LOG_HEADER_BYTES as u64 || end + LOG_TRAILER_BYTES != object_size {
        return Err(bad());
    }
    Ok(off..end)
}

pub fn open_log_meta(
    sealer: &Sealer,
    key: &str,
    seq: u64,
    sealed: &[u8],
) -> Result<Vec<MetaOp>, ObjectError> {
    let plain = sealer
        .open(&meta_aad(b"bfs-log-meta", seq), sealed)
        .map_err(|_| ObjectError::Authentication {
            key: key.to_string(),
        })?;
    decode_ops(&plain).map_err(|e| ObjectError::Record {
        key: key.to_string(),
        why: e.to_string(),
    })
}

fn checkpoint_aad(seq: u64, plain_len: u64) -> Vec<u8> {
    let mut a = meta_aad(b"bfs-checkpoint", seq);
    a.extend_from_slice(&plain_len.to_le_bytes());
    a
}

pub fn decode_checkpoint(
    sealer: &Sealer,
    key: &str,
    seq: u64,
    buf: &[u8],
) -> Result<Vec<MetaOp>, ObjectError> {
    let bad = || ObjectError::Malformed {
        key: key.to_string(),
    };
    if buf.len() < 24 || &buf[..8] != CHECKPOINT_MAGIC || buf[8..16] != seq.to_le_bytes() {
        return Err(bad());
    }
    let plain_len = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
    let compressed = sealer
        .open(&checkpoint_aad(seq, plain_len), &buf[24..])
        .map_err(|_| ObjectError::Authentication {
            key: key.to_string(),
        })?;
    // The length is authenticated (it is in the associated data), so allocating it is safe.
    let plain = zstd::bulk::decompress(&compressed, usize::try_from(plain_len).map_err(|_| bad())?)
        .map_err(|e| ObjectError::Record {
            key: key.to_string(),
            why: e.to_string(),
        })?;
    decode_ops(&plain).map_err(|e| ObjectError::Record {
        key: key.to_string(),
        why: e.to_string(),
    })
}

/// Formats 2 and 3: the run list only.
const MANIFEST_MAGIC: &[u8; 8] = b"BFSMAN01";
/// Format 4: the run list and the object table, compressed.
const MANIFEST_MAGIC_2: &[u8; 8] = b"BFSMAN02";

/// `manifest/<seq>`: the runs that hold the metadata as of log object `seq` (format 2).
pub fn manifest_key(seq: u64) -> String {
    format!("manifest/{seq:020}")
}

/// `run/<id>`: one sorted run of metadata (lsm/run.rs); its id is the log object its checkpoint
/// covered. A run merged from others is cut into parts of bounded size with disjoint key
/// ranges: part 0 is `run/<id>`, part n `run/<id>.<n>`.
pub fn run_key(id: u64, part: u32) -> String {
    match part {
        0 => format!("run/{id:020}"),
        n => format!("run/{id:020}.{n:05}"),
    }
}

/// The id and part of a run's key.
pub fn parse_run_key(key: &str) -> Option<(u64, u32)> {
    let name = key.strip_prefix("run/")?;
    let (id, part) = match name.split_once('.') {
        Some((id, part)) => (id, part.parse().ok().filter(|p| *p > 0)?),
        None => (name, 0),
    };
    (id.len() == 20 && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.parse().ok())
        .flatten()
        .map(|id| (id, part))
}

/// What a run part's blocks and index are sealed with (their AAD's run id): parts of one run
/// must not be exchangeable. Log sequence numbers stay far below 2^40.
pub fn run_seal_id(id: u64, part: u32) -> u64 {
    assert!(id < 1 << 40, "run ids are log sequence numbers");
    id | (u64::from(part) << 40)
}

/// One run (or part of one) a manifest names: its id, part and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunInfo {
    pub id: u64,
    pub part: u32,
    pub size_bytes: u64,
}

impl RunInfo {
    pub fn key(&self) -> String {
        run_key(self.id, self.part)
    }

    pub fn seal_id(&self) -> u64 {
        run_seal_id(self.id, self.part)
    }
}

/// A manifest of either version whose sealed plaintext is `plain` (the fuzz target's input).
#[cfg(feature = "fuzzing")]
pub fn fuzz_manifest(sealer: &Sealer, seq: u64, plain: &[u8], version_2: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    if version_2 {
        buf.extend_from_slice(MANIFEST_MAGIC_2);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&(plain.len() as u64).to_le_bytes());
        let compressed = zstd::bulk::compress(plain, 1).expect("zstd compresses any input");
        sealer.seal_into(
            &mut buf,
            &manifest_2_aad(seq, plain.len() as u64),
            &compressed,
        );
    } else {
        buf.extend_from_slice(MANIFEST_MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        sealer.seal_into(&mut buf, &meta_aad(b"bfs-manifest", seq), plain);
    }
    buf
}

/// A decoded manifest: its runs, oldest first, and the object table as of it (absent in
/// manifests of formats 2 and 3, which open rebuilds it for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub runs: Vec<RunInfo>,
    pub objects: Option<ObjectTable>,
    /// The sweep of the bottom run under way (format 5): the checkpoint that began it and the
    /// next key to merge, so that a restart goes on with it.
    pub sweep: Option<(u64, Vec<u8>)>,
}

/// Most bytes a manifest's plaintext may take once decompressed: the run list and an object
/// table of 25 bytes per live log object (about 3 MB at 1 TiB of 8 MiB objects).
const MANIFEST_PLAIN_BYTES_MAX: usize = 1 << 30;

pub fn encode_manifest(
    sealer: &Sealer,
    seq: u64,
    runs: &[RunInfo],
    objects: &ObjectTable,
    sweep: Option<(u64, &[u8])>,
) -> Vec<u8> {
    let mut plain = Vec::with_capacity(4 + runs.len() * 20);
    plain.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for r in runs {
        plain.extend_from_slice(&r.id.to_le_bytes());
        plain.extend_from_slice(&r.part.to_le_bytes());
        plain.extend_from_slice(&r.size_bytes.to_le_bytes());
    }
    objects.encode(&mut plain);
    if let Some((first_seq, from)) = sweep {
        plain.extend_from_slice(&first_seq.to_le_bytes());
        plain.extend_from_slice(&(from.len() as u32).to_le_bytes());
        plain.extend_from_slice(from);
    }
    let compressed = zstd::bulk::compress(&plain, 3).expect("zstd compresses any input");
    let mut buf = Vec::with_capacity(24 + Sealer::sealed_len(compressed.len()));
    buf.extend_from_slice(MANIFEST_MAGIC_2);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&(plain.len() as u64).to_le_bytes());
    sealer.seal_into(
        &mut buf,
        &manifest_2_aad(seq, plain.len() as u64),
        &compressed,
    );
    buf
}

fn manifest_2_aad(seq: u64, plain_len: u64) -> Vec<u8> {
    let mut aad = meta_aad(b"bfs-manifest-2", seq);
    aad.extend_from_slice(&plain_len.to_le_bytes());
    aad
}

pub fn decode_manifest(
    sealer: &Sealer,
    key: &str,
    seq: u64,
    buf: &[u8],
) -> Result<Manifest, ObjectError> {
    let bad = || ObjectError::Malformed {
        key: key.to_string(),
    };
    let unauthentic = || ObjectError::Authentication {
        key: key.to_string(),
    };
    if buf.len() < 16 || buf[8..16] != seq.to_le_bytes() {
        return Err(bad());
    }
    let plain = if &buf[..8] == MANIFEST_MAGIC {
        sealer
            .open(&meta_aad(b"bfs-manifest", seq), &buf[16..])
            .map_err(|_| unauthentic())?
    } else if &buf[..8] == MANIFEST_MAGIC_2 && buf.len() >= 24 {
        let plain_len = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
        if plain_len > MANIFEST_PLAIN_BYTES_MAX as u64 {
            return Err(bad());
        }
        let compressed = sealer
            .open(&manifest_2_aad(seq, plain_len), &buf[24..])
            .map_err(|_| unauthentic())?;
        let plain = zstd::bulk::decompress(&compressed, plain_len as usize).map_err(|_| bad())?;
        if plain.len() as u64 != plain_len {
            return Err(bad());
        }
        plain
    } else {
        return Err(bad());
    };
    if plain.len() < 4 {
        return Err(bad());
    }
    let count = u32::from_le_bytes(plain[..4].try_into().expect("4 bytes")) as usize;
    // Version 1 names whole runs (id, size); version 2 parts (id, part, size).
    let version_1 = &buf[..8] == MANIFEST_MAGIC;
    let entry_bytes = if version_1 { 16 } else { 20 };
    let runs_end = count
        .checked_mul(entry_bytes)
        .and_then(|n| n.checked_add(4))
        .filter(|&end| end <= plain.len())
        .ok_or_else(bad)?;
    let u64_at =
        |c: &[u8], at: usize| u64::from_le_bytes(c[at..at + 8].try_into().expect("8 bytes"));
    let runs: Vec<RunInfo> = plain[4..runs_end]
        .chunks_exact(entry_bytes)
        .map(|c| match version_1 {
            true => RunInfo {
                id: u64_at(c, 0),
                part: 0,
                size_bytes: u64_at(c, 8),
            },
            false => RunInfo {
                id: u64_at(c, 0),
                part: u32::from_le_bytes(c[8..12].try_into().expect("4 bytes")),
                size_bytes: u64_at(c, 12),
            },
        })
        .collect();
    if runs
        .windows(2)
        .any(|w| (w[0].id, w[0].part) >= (w[1].id, w[1].part))
        || runs.iter().any(|r| r.id > seq || r.id >= 1 << 40)
    {
        return Err(bad());
    }
    let (objects, sweep) = if &buf[..8] == MANIFEST_MAGIC {
        if runs_end != plain.len() {
            return Err(bad());
        }
        (None, None)
    } else {
        // The object table (a count, then fixed-size entries), then the sweep if one is under way.
        let rest = &plain[runs_end..];
        let table_end = rest
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .and_then(|n| n.checked_mul(crate::meta::OBJECT_BYTES as u64))
            .and_then(|n| n.checked_add(8))
            .filter(|&n| n <= rest.len() as u64)
            .ok_or_else(bad)? as usize;
        let table = ObjectTable::decode(&rest[..table_end]).map_err(|_| bad())?;
        let sweep = match &rest[table_end..] {
            [] => None,
            t if t.len() >= 12 => {
                let first_seq = u64::from_le_bytes(t[..8].try_into().expect("8 bytes"));
                let len = u32::from_le_bytes(t[8..12].try_into().expect("4 bytes")) as usize;
                if t.len() != 12 + len || first_seq > seq {
                    return Err(bad());
                }
                Some((first_seq, t[12..].to_vec()))
            }
            _ => return Err(bad()),
        };
        (Some(table), sweep)
    };
    Ok(Manifest {
        runs,
        objects,
        sweep,
    })
}
