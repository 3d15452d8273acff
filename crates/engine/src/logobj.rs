//! The two kinds of objects that carry data and metadata (docs/format.md):
//!
//! - a **log object** `log/<seq>`: the frames of one flush followed by the sealed record of the
//!   metadata ops of that flush. One PUT makes a flush durable, data and metadata together.
//! - a **checkpoint** `checkpoint/<seq>`: the whole metadata state as of log object `seq`, so
//!   opening a bucket replays only the log objects after it.

use crate::crypto::Sealer;
use crate::meta::{decode_ops, encode_ops, MetaOp, MetaState};

const LOG_MAGIC: &[u8; 8] = b"BFSLOG01";
const LOG_END_MAGIC: &[u8; 8] = b"BFSEND01";
const CHECKPOINT_MAGIC: &[u8; 8] = b"BFSCKP01";
/// Checkpoints are written in the background, rarely: a slower, tighter zstd level than frames.
const CHECKPOINT_ZSTD_LEVEL: i32 = 3;
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

/// Encodes, compresses and seals a checkpoint of `state` as of log object `seq`. The scratch
/// buffers are reused from one checkpoint to the next (a checkpoint of a large map is megabytes,
/// which fresh memory would have the kernel fault in and zero every time).
pub fn encode_checkpoint(
    sealer: &Sealer,
    seq: u64,
    state: &MetaState,
    scratch: &mut CheckpointScratch,
) -> Vec<u8> {
    let CheckpointScratch {
        plain,
        compressed,
        compressor,
    } = scratch;
    plain.clear();
    state.encode_as_ops(plain);
    compressed.clear();
    compressed.reserve(zstd::zstd_safe::compress_bound(plain.len()));
    compressor
        .compress_to_buffer(plain.as_slice(), compressed)
        .expect("the buffer holds zstd's bound for this input");
    let mut buf = Vec::with_capacity(24 + Sealer::sealed_len(compressed.len()));
    buf.extend_from_slice(CHECKPOINT_MAGIC);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&(plain.len() as u64).to_le_bytes());
    sealer.seal_into(
        &mut buf,
        &checkpoint_aad(seq, plain.len() as u64),
        compressed,
    );
    buf
}

/// Buffers and compression context `encode_checkpoint` reuses.
pub struct CheckpointScratch {
    plain: Vec<u8>,
    compressed: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
}

impl Default for CheckpointScratch {
    fn default() -> Self {
        Self {
            plain: Vec::new(),
            compressed: Vec::new(),
            compressor: zstd::bulk::Compressor::new(CHECKPOINT_ZSTD_LEVEL)
                .expect("zstd accepts this level"),
        }
    }
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
