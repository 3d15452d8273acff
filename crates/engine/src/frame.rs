//! One extent as stored: compressed, then sealed. Layout: `codec (1) || sealed(compressed)`.
//! The associated data binds a frame to its inode, extent index and codec, so a frame cannot be
//! moved to another place of the same file or another file without failing to open.

use crate::crypto::Sealer;
use crate::limits::EXTENT_SIZE_BYTES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Zstd = 1,
    Lz4 = 2,
}

impl Codec {
    fn from_byte(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::None),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Lz4),
            _ => None,
        }
    }
}

/// zstd's fastest positive level: on 2 cores the flush path is CPU-bound, and level 1 already
/// turns zero-filled and text-like pages into a fraction of their size.
const ZSTD_LEVEL: i32 = 1;

thread_local! {
    /// zstd contexts are costly to create (a measurable share of a flush when made per frame),
    /// so each thread keeps one of each.
    static ZSTD: std::cell::RefCell<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)> =
        std::cell::RefCell::new((
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd level 1 is valid"),
            zstd::bulk::Decompressor::new().expect("a zstd decompression context can be created"),
        ));
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of inode {ino} extent {index} failed authentication (corrupted or misplaced)")]
    Authentication { ino: u64, index: u64 },
    #[error("frame of inode {ino} extent {index} is malformed: {why}")]
    Malformed { ino: u64, index: u64, why: String },
}

fn aad(ino: u64, index: u64, codec: u8) -> [u8; 21] {
    let mut a = [0u8; 21];
    a[..4].copy_from_slice(b"bfsx");
    a[4..12].copy_from_slice(&ino.to_le_bytes());
    a[12..20].copy_from_slice(&index.to_le_bytes());
    a[20] = codec;
    a
}

/// Bytes of each of the samples taken to guess whether an extent compresses at all.
const PROBE_BYTES: usize = 512;
const PROBES: usize = 2;

/// Already-compressed or encrypted data (media, archives, fio's random buffers) would cost a
/// full zstd pass for nothing. lz4 over two 512-byte samples, one per half of the extent (so a
/// 4 KiB write into an otherwise empty extent still counts as compressible), decides in well
/// under a microsecond.
fn looks_incompressible(plain: &[u8]) -> bool {
    let stride = plain.len() / PROBES;
    (0..PROBES).all(|i| {
        let probe = &plain[i * stride..i * stride + PROBE_BYTES];
        lz4_flex::compress(probe).len() * 100 >= PROBE_BYTES * 97
    })
}

/// Appends the frame of one extent to `out`; returns the frame's length.
/// The most bytes one frame takes: codec byte, nonce, the extent stored raw, tag.
pub const FRAME_BYTES_MAX: usize = 1 + Sealer::sealed_len(EXTENT_SIZE_BYTES);

/// Writes the frame of one extent at the start of `out` (at least FRAME_BYTES_MAX long) and
/// returns its length.
pub fn encode(
    out: &mut [u8],
    sealer: &Sealer,
    codec: Codec,
    ino: u64,
    index: u64,
    plain: &[u8],
) -> usize {
    assert_eq!(
        plain.len(),
        EXTENT_SIZE_BYTES,
        "frames always hold a whole extent"
    );
    let compressed = match codec {
        Codec::None => None,
        _ if looks_incompressible(plain) => None,
        Codec::Zstd => ZSTD.with(|z| z.borrow_mut().0.compress(plain).ok()),
        Codec::Lz4 => Some(lz4_flex::compress(plain)),
    };
    let (codec, body) = match &compressed {
        Some(c) if c.len() < plain.len() => (codec, c.as_slice()),
        _ => (Codec::None, plain),
    };
    out[0] = codec as u8;
    1 + sealer.seal_to_slice(&mut out[1..], &aad(ino, index, codec as u8), body)
}

pub fn decode(sealer: &Sealer, ino: u64, index: u64, frame: &[u8]) -> Result<Vec<u8>, FrameError> {
    let malformed = |why: &str| FrameError::Malformed {
        ino,
        index,
        why: why.to_string(),
    };
    let (&codec_byte, sealed) = frame
        .split_first()
        .ok_or_else(|| malformed("empty frame"))?;
    let body = sealer
        .open(&aad(ino, index, codec_byte), sealed)
        .map_err(|_| FrameError::Authentication { ino, index })?;
    let codec = Codec::from_byte(codec_byte).ok_or_else(|| malformed("unknown codec"))?;
    let plain = match codec {
        Codec::None => body,
        Codec::Zstd => ZSTD
            .with(|z| z.borrow_mut().1.decompress(&body, EXTENT_SIZE_BYTES))
            .map_err(|e| malformed(&e.to_string()))?,
        Codec::Lz4 => {
            lz4_flex::decompress(&body, EXTENT_SIZE_BYTES).map_err(|e| malformed(&e.to_string()))?
        }
    };
    if plain.len() != EXTENT_SIZE_BYTES {
        return Err(malformed("decoded extent has the wrong size"));
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::DataKey;

    #[test]
    fn every_codec_round_trips_and_frames_cannot_move() {
        let sealer = Sealer::new(&DataKey::for_tests(1));
        let mut plain = vec![0u8; EXTENT_SIZE_BYTES];
        plain[100..200].fill(0x5a);
        for codec in [Codec::None, Codec::Zstd, Codec::Lz4] {
            let mut out = vec![0u8; FRAME_BYTES_MAX];
            let n = encode(&mut out, &sealer, codec, 7, 3, &plain);
            out.truncate(n);
            assert!(
                codec == Codec::None || n < EXTENT_SIZE_BYTES / 2,
                "compressible"
            );
            assert_eq!(decode(&sealer, 7, 3, &out).unwrap(), plain);
            assert_eq!(
                decode(&sealer, 7, 4, &out),
                Err(FrameError::Authentication { ino: 7, index: 4 })
            );
            assert_eq!(
                decode(&sealer, 8, 3, &out),
                Err(FrameError::Authentication { ino: 8, index: 3 })
            );
        }
        let random: Vec<u8> = (0..EXTENT_SIZE_BYTES)
            .map(|i| (i * 7919 % 251) as u8 ^ (i >> 8) as u8)
            .collect();
        let mut out = vec![0u8; FRAME_BYTES_MAX];
        let n = encode(&mut out, &sealer, Codec::Zstd, 1, 1, &random);
        assert!(n <= FRAME_BYTES_MAX);
        out.truncate(n);
        assert_eq!(decode(&sealer, 1, 1, &out).unwrap(), random);
    }
}
