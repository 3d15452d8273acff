//! One extent as stored: compressed, then sealed. Layout: `codec (1) || sealed(compressed)`.
//! The associated data binds a frame to its inode, extent index and codec, so a frame cannot be
//! moved to another place of the same file or another file without failing to open.

use crate::crypto::{Sealer, NONCE_BYTES};
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
    /// A compressed frame's body, opened, on its way to the decompressor: at most an extent.
    static OPENED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// zstd contexts are costly to create (a measurable share of a flush when made per frame),
    /// so each thread keeps one of each.
    static ZSTD: std::cell::RefCell<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)> =
        std::cell::RefCell::new((
            zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("zstd level 1 is valid"),
            zstd::bulk::Decompressor::new().expect("a zstd decompression context can be created"),
        ));
    /// lz4 needs room for its worst case, a little more than an extent, to compress into.
    static LZ4_OUT: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(
        vec![0u8; lz4_flex::block::get_maximum_output_size(EXTENT_SIZE_BYTES)],
    );
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
/// Samples whose bytes carry at least this many bits each (estimated) are not worth a zstd
/// pass, which costs about three times the encryption of the same bytes. Measured with zstd
/// level 1 on 8 KiB blocks of bytes drawn from skewed distributions: an estimate of 7.52 bits
/// meant 4.1 % saved, 7.26 bits 7.1 %, so this threshold is about 5 %. Random or encrypted
/// bytes estimate 7.94 to 8.0; fio's write buffers (random, with short runs of zeros) 7.40 to
/// 7.93, and zstd saves 2.75 % of them; text, code and database pages far less.
const INCOMPRESSIBLE_BITS_PER_BYTE: f32 = 7.4;

/// Already-compressed or encrypted data (media, archives, fio's write buffers) would cost a
/// full zstd pass for next to nothing. Two 512-byte samples, one from each half of the extent
/// (so a 4 KiB write into an otherwise empty extent still counts as compressible), give an
/// estimate of the bytes' entropy (Shannon, with the Miller-Madow correction for a small
/// sample) in about half a microsecond: cheaper than an lz4 pass over the samples, and it also
/// catches what only entropy coding compresses (hex digits: lz4 finds no matches, zstd halves
/// them). lz4 is not probed: it gives up on random bytes about as fast as the probe runs.
/// Measurements: docs/benchmarks/2026-11-23-where-the-gaps-come-from.md (1 MiB writes) and
/// 2026-11-24-journal-storer-and-eraser.md.
fn looks_incompressible(plain: &[u8]) -> bool {
    let stride = plain.len() / PROBES;
    let mut counts = [0u16; 256];
    for i in 0..PROBES {
        for &b in &plain[i * stride..][..PROBE_BYTES] {
            counts[usize::from(b)] += 1;
        }
    }
    estimated_bits_per_byte(&counts) >= INCOMPRESSIBLE_BITS_PER_BYTE
}

const SAMPLED_BYTES: usize = PROBES * PROBE_BYTES;

fn estimated_bits_per_byte(counts: &[u16; 256]) -> f32 {
    // c * log2(c) for every count a sample can reach.
    static C_LOG2_C: std::sync::LazyLock<Vec<f32>> = std::sync::LazyLock::new(|| {
        (0..=SAMPLED_BYTES)
            .map(|c| {
                if c == 0 {
                    0.0
                } else {
                    c as f32 * (c as f32).log2()
                }
            })
            .collect()
    });
    let table = &*C_LOG2_C;
    let n = SAMPLED_BYTES as f32;
    let (mut sum, mut seen) = (0.0f32, 0u32);
    for &c in counts {
        sum += table[usize::from(c)];
        seen += u32::from(c > 0);
    }
    n.log2() - sum / n + (seen.saturating_sub(1)) as f32 / (2.0 * n * std::f32::consts::LN_2)
}

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
    // Compressed straight into the frame, where it is then encrypted in place; a result must
    // be smaller than the extent to be kept. Otherwise the extent is encrypted on its way in.
    let smaller = &mut out[1 + NONCE_BYTES..][..EXTENT_SIZE_BYTES - 1];
    let compressed_len = match codec {
        Codec::None => None,
        Codec::Zstd if looks_incompressible(plain) => None,
        Codec::Zstd => ZSTD.with(|z| z.borrow_mut().0.compress_to_buffer(plain, smaller).ok()),
        Codec::Lz4 => LZ4_OUT.with(|scratch| {
            let scratch = &mut scratch.borrow_mut()[..];
            let n = lz4_flex::block::compress_into(plain, scratch).ok()?;
            smaller.get_mut(..n)?.copy_from_slice(&scratch[..n]);
            Some(n)
        }),
    };
    match compressed_len {
        Some(n) => {
            out[0] = codec as u8;
            1 + sealer.seal_in_place(&mut out[1..], &aad(ino, index, codec as u8), n)
        }
        None => {
            out[0] = Codec::None as u8;
            1 + sealer.seal_to_slice(&mut out[1..], &aad(ino, index, Codec::None as u8), plain)
        }
    }
}

/// The codec a frame was sealed with, as its first byte records it (not authenticated until
/// the frame is opened).
pub fn codec(frame: &[u8]) -> Option<Codec> {
    frame.first().copied().and_then(Codec::from_byte)
}

pub fn decode(sealer: &Sealer, ino: u64, index: u64, frame: &[u8]) -> Result<Vec<u8>, FrameError> {
    decode_reusing(sealer, ino, index, frame, Vec::new)
}

/// `decode`, opening a frame stored plain into the buffer `spare` gives (a whole extent's,
/// whose old bytes it overwrites or, on an error, drops unseen) rather than into new memory.
pub fn decode_reusing(
    sealer: &Sealer,
    ino: u64,
    index: u64,
    frame: &[u8],
    spare: impl FnOnce() -> Vec<u8>,
) -> Result<Vec<u8>, FrameError> {
    let malformed = |why: &str| FrameError::Malformed {
        ino,
        index,
        why: why.to_string(),
    };
    let (&codec_byte, sealed) = frame
        .split_first()
        .ok_or_else(|| malformed("empty frame"))?;
    let unauthentic = |_| FrameError::Authentication { ino, index };
    let aad = aad(ino, index, codec_byte);
    // Opened straight into the extent when stored plain; else into this thread's buffer, which
    // the decompressor reads.
    let plain = match Codec::from_byte(codec_byte) {
        Some(Codec::None) => {
            let len = Sealer::opened_len(sealed).map_err(unauthentic)?;
            let mut out = spare();
            out.resize(len, 0);
            sealer
                .open_to_slice(&aad, sealed, &mut out)
                .map_err(unauthentic)?;
            out
        }
        // A compressed body is kept only when smaller than the extent (`encode`); a longer
        // one is corrupt, and must not grow this thread's buffer for good.
        Some(_) if frame.len() > FRAME_BYTES_MAX => {
            return Err(malformed("compressed frame longer than an extent"))
        }
        Some(codec) => OPENED.with(|buf| {
            let mut body = buf.borrow_mut();
            body.resize(Sealer::opened_len(sealed).map_err(unauthentic)?, 0);
            sealer
                .open_to_slice(&aad, sealed, &mut body)
                .map_err(unauthentic)?;
            match codec {
                Codec::Zstd => ZSTD
                    .with(|z| z.borrow_mut().1.decompress(&body, EXTENT_SIZE_BYTES))
                    .map_err(|e| malformed(&e.to_string())),
                _ => lz4_flex::decompress(&body, EXTENT_SIZE_BYTES)
                    .map_err(|e| malformed(&e.to_string())),
            }
        })?,
        None => {
            sealer.open(&aad, sealed).map_err(unauthentic)?;
            return Err(malformed("unknown codec"));
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
    use crate::crypto::{Cipher, DataKey};

    #[test]
    fn a_compressed_frame_longer_than_an_extent_is_malformed() {
        let sealer = Sealer::new(&DataKey::for_tests(1), Cipher::Aes256GcmBlake3);
        let mut frame = vec![0u8; FRAME_BYTES_MAX + 1];
        frame[0] = Codec::Zstd as u8;
        assert!(matches!(
            decode(&sealer, 1, 1, &frame),
            Err(FrameError::Malformed { .. })
        ));
    }

    #[test]
    fn every_codec_round_trips_and_frames_cannot_move() {
        let sealer = Sealer::new(&DataKey::for_tests(1), Cipher::Aes256GcmBlake3);
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

    /// Bytes from a fixed-seed xorshift generator: as random as encrypted data.
    fn random_bytes(len: usize, mut state: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect()
    }

    #[test]
    fn the_probe_skips_random_extents_only() {
        let random = random_bytes(EXTENT_SIZE_BYTES, 0x9e37_79b9_7f4a_7c15);
        assert!(looks_incompressible(&random));
        // A 4 KiB write into an empty extent, either half.
        let mut half = vec![0u8; EXTENT_SIZE_BYTES];
        half[..EXTENT_SIZE_BYTES / 2].copy_from_slice(&random[..EXTENT_SIZE_BYTES / 2]);
        assert!(!looks_incompressible(&half));
        half.reverse();
        assert!(!looks_incompressible(&half));
        let text: Vec<u8> = b"SELECT abalance FROM pgbench_accounts WHERE aid = 42; -- bucketfs\n"
            .iter()
            .copied()
            .cycle()
            .take(EXTENT_SIZE_BYTES)
            .collect();
        assert!(!looks_incompressible(&text));
        // Hex digits of random bytes: random, but over 16 values, so zstd halves them.
        let hex: Vec<u8> = random
            .iter()
            .map(|b| b"0123456789abcdef"[usize::from(b & 15)])
            .collect();
        assert!(!looks_incompressible(&hex));
    }

    #[test]
    fn random_extents_are_stored_raw_and_round_trip() {
        let sealer = Sealer::new(&DataKey::for_tests(1), Cipher::Aes256GcmBlake3);
        let random = random_bytes(EXTENT_SIZE_BYTES, 7);
        for codec in [Codec::Zstd, Codec::Lz4] {
            let mut out = vec![0u8; FRAME_BYTES_MAX];
            let n = encode(&mut out, &sealer, codec, 2, 9, &random);
            assert_eq!(n, FRAME_BYTES_MAX, "stored raw");
            assert_eq!(out[0], Codec::None as u8);
            assert_eq!(decode(&sealer, 2, 9, &out[..n]).unwrap(), random);
        }
    }
}
