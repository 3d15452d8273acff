//! Key management and sealing (docs/format.md: `superblock.json`).
//!
//! A random 256-bit data key encrypts everything. The key is stored in the bucket's superblock,
//! wrapped (XChaCha20-Poly1305) by a key derived from the password with Argon2id. Changing the
//! password rewraps the data key; no data is re-encrypted. The superblock also names the cipher
//! that seals the bucket's objects (`Cipher`), chosen when the bucket is created.

use crate::limits::{ARGON2_MEMORY_KIB, ARGON2_PASSES, EXTENT_SIZE_BYTES};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use serde::{Deserialize, Serialize};

pub const NONCE_BYTES: usize = 24;
pub const TAG_BYTES: usize = 16;
/// The bucket format this build writes (docs/format.md): 9 names the cipher in the superblock
/// (`cipher`; a new bucket seals with AES-256-GCM where the CPU has AES instructions, which a
/// build before it would take for damage in every object); 8 adds the side records of scoped
/// barriers (`side/`, applied at open, for the same reason); 7 adds the journal records of
/// journaled barriers (`jrec/`, replayed at open; a build that did not know them would drop
/// acknowledged writes); 6 lays the filesystem out for POSIX
/// (versioned inode records, directory entries keyed by a keyed hash of their name, which the
/// filesystem layer migrates from format 5's names in keys when a writer opens it); 5 records a
/// sweep of the bottom run
/// under way in the manifest, and writes bottom parts of one id across checkpoints; 4 keeps the
/// object table (live bytes
/// per log object) in each manifest, so that open reads no run whole; 3 adds range deletions to
/// the log; 2 keeps metadata in sorted runs named by manifests; 1 kept it in whole-map
/// checkpoints. A bucket of format 2 to 7 is migrated when a writer opens it, before anything
/// is written, so that an older build refuses it rather than misreading it; a format-1 bucket
/// by its first checkpoint.
pub const FORMAT_VERSION: u32 = 9;
/// The oldest bucket format this build opens.
pub const FORMAT_VERSION_OLDEST: u32 = 1;
const WRAP_AAD: &[u8] = b"bucketfs data key v1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("wrong encryption password: it does not unlock this bucket's data key")]
    WrongPassword,
    #[error("superblock: {0}")]
    Damaged(String),
    #[error("bucket format version {found} is not supported by this build (it reads versions {FORMAT_VERSION_OLDEST} to {FORMAT_VERSION}); use a newer bucketfs")]
    UnsupportedVersion { found: u32 },
}

/// The cipher that seals a bucket's objects, recorded in its superblock when it is created and
/// never changed (that would mean re-encrypting every object). Both take a 24-byte random nonce
/// and give a 16-byte tag, so sealed bytes have one layout whichever seals them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cipher {
    /// XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha). Every bucket before format 9 uses it, so
    /// a superblock without the field means this one.
    #[default]
    #[serde(rename = "xchacha20-poly1305")]
    XChaCha20Poly1305,
    /// AES-256-GCM under a key of its own for each sealed string: BLAKE3 keyed by a key derived
    /// from the data key, of the nonce's first 12 bytes; the nonce's last 12 are GCM's nonce.
    /// The 192 random bits make a repeated (key, nonce) pair as unlikely as with XChaCha, where
    /// GCM's own 96-bit random nonces would wear out after some billions of objects. With AES
    /// instructions it seals and opens about 4x as fast as ChaCha20-Poly1305 (docs/benchmarks).
    #[serde(rename = "aes-256-gcm-blake3")]
    Aes256GcmBlake3,
}

impl Cipher {
    /// The cipher of a bucket created on this machine: AES-256-GCM where the CPU has AES and
    /// carry-less multiply instructions, XChaCha20-Poly1305 (fast in plain vector code) where
    /// it has not. A bucket opens on any machine whichever it uses; only the speed differs.
    pub fn for_new_buckets() -> Cipher {
        #[cfg(target_arch = "x86_64")]
        let hardware_aes = std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq");
        #[cfg(target_arch = "aarch64")]
        let hardware_aes = std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let hardware_aes = false;
        if hardware_aes {
            Cipher::Aes256GcmBlake3
        } else {
            Cipher::XChaCha20Poly1305
        }
    }
}

/// The object `superblock.json`: the only unencrypted object in the bucket besides the writer
/// lock. It holds no secret: the data key in it is wrapped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Superblock {
    pub format_version: u32,
    /// Files are cut into extents of this size; a build with another size refuses the bucket.
    pub extent_size_bytes: u32,
    pub kdf: String,
    pub kdf_memory_kib: u32,
    pub kdf_passes: u32,
    pub kdf_salt_hex: String,
    pub wrapped_key_nonce_hex: String,
    pub wrapped_key_hex: String,
    /// Absent in buckets before format 9, which all use XChaCha20-Poly1305.
    #[serde(default)]
    pub cipher: Cipher,
}

fn derive_kek(
    password: &str,
    salt: &[u8],
    memory_kib: u32,
    passes: u32,
) -> Result<[u8; 32], KeyError> {
    let params = argon2::Params::new(memory_kib, passes, 1, Some(32))
        .map_err(|e| KeyError::Damaged(format!("argon2 parameters: {e}")))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut kek = [0u8; 32];
    argon
        .hash_password_into(password.as_bytes(), salt, &mut kek)
        .map_err(|e| KeyError::Damaged(format!("argon2: {e}")))?;
    Ok(kek)
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

/// What deriving the key-wrapping key from the password costs (Argon2id), recorded in the
/// superblock. Every bucket bucketfs creates uses the default; tests that create thousands of
/// buckets lower it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdfCost {
    pub memory_kib: u32,
    pub passes: u32,
}

impl Default for KdfCost {
    fn default() -> Self {
        KdfCost {
            memory_kib: ARGON2_MEMORY_KIB,
            passes: ARGON2_PASSES,
        }
    }
}

impl Superblock {
    /// A new superblock with a fresh random data key; returns it with the key.
    pub fn create(
        password: &str,
        cost: KdfCost,
        cipher: Cipher,
    ) -> Result<(Superblock, DataKey), KeyError> {
        let key = DataKey(random::<32>());
        Ok((Self::wrap(password, &key, cost, cipher)?, key))
    }

    fn wrap(
        password: &str,
        key: &DataKey,
        cost: KdfCost,
        cipher: Cipher,
    ) -> Result<Superblock, KeyError> {
        let salt = random::<16>();
        let kek = derive_kek(password, &salt, cost.memory_kib, cost.passes)?;
        let nonce = random::<NONCE_BYTES>();
        let wrapped = XChaCha20Poly1305::new((&kek).into())
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &key.0,
                    aad: WRAP_AAD,
                },
            )
            .map_err(|_| KeyError::Damaged("key wrapping failed".into()))?;
        Ok(Superblock {
            format_version: FORMAT_VERSION,
            extent_size_bytes: EXTENT_SIZE_BYTES as u32,
            kdf: "argon2id".into(),
            kdf_memory_kib: cost.memory_kib,
            kdf_passes: cost.passes,
            kdf_salt_hex: hex::encode(salt),
            wrapped_key_nonce_hex: hex::encode(nonce),
            wrapped_key_hex: hex::encode(wrapped),
            cipher,
        })
    }

    pub fn unlock(&self, password: &str) -> Result<DataKey, KeyError> {
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&self.format_version) {
            return Err(KeyError::UnsupportedVersion {
                found: self.format_version,
            });
        }
        if self.extent_size_bytes as usize != EXTENT_SIZE_BYTES {
            return Err(KeyError::Damaged(format!(
                "the bucket uses {}-byte extents; this build uses {EXTENT_SIZE_BYTES}",
                self.extent_size_bytes
            )));
        }
        if self.kdf != "argon2id" {
            return Err(KeyError::Damaged(format!("unknown kdf `{}`", self.kdf)));
        }
        let unhex = |what: &str, s: &str| {
            hex::decode(s).map_err(|e| KeyError::Damaged(format!("{what}: {e}")))
        };
        let salt = unhex("kdf_salt_hex", &self.kdf_salt_hex)?;
        let nonce = unhex("wrapped_key_nonce_hex", &self.wrapped_key_nonce_hex)?;
        let wrapped = unhex("wrapped_key_hex", &self.wrapped_key_hex)?;
        let nonce = XNonce::try_from(nonce.as_slice())
            .map_err(|_| KeyError::Damaged("wrapped key nonce has the wrong length".into()))?;
        let kek = derive_kek(password, &salt, self.kdf_memory_kib, self.kdf_passes)?;
        let key = XChaCha20Poly1305::new((&kek).into())
            .decrypt(
                &nonce,
                Payload {
                    msg: &wrapped,
                    aad: WRAP_AAD,
                },
            )
            .map_err(|_| KeyError::WrongPassword)?;
        let key: [u8; 32] = key
            .try_into()
            .map_err(|_| KeyError::Damaged("data key has the wrong length".into()))?;
        Ok(DataKey(key))
    }

    /// The same data key wrapped under a new password (fresh salt and nonce).
    pub fn rewrap(&self, old_password: &str, new_password: &str) -> Result<Superblock, KeyError> {
        let key = self.unlock(old_password)?;
        let mut sb = Self::wrap(new_password, &key, KdfCost::default(), self.cipher)?;
        // A new password does not migrate the bucket.
        sb.format_version = self.format_version;
        Ok(sb)
    }

    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The same superblock for a bucket migrated to `version`.
    pub fn migrated(mut self, version: u32) -> Superblock {
        self.format_version = version;
        self
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a struct of strings and integers always serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<Superblock, KeyError> {
        serde_json::from_slice(bytes).map_err(|e| KeyError::Damaged(e.to_string()))
    }
}

pub struct DataKey([u8; 32]);

impl DataKey {
    #[cfg(test)]
    pub fn for_tests(seed: u8) -> DataKey {
        DataKey([seed; 32])
    }

    /// A key every run of the fuzz targets shares.
    #[cfg(feature = "fuzzing")]
    pub fn fixed(seed: u8) -> DataKey {
        DataKey([seed; 32])
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("authentication failed: the sealed bytes were altered, truncated, or belong elsewhere")]
pub struct OpenError;

/// Seals and opens byte strings with the data key. Every sealed string is
/// `nonce (24) || ciphertext || tag (16)`; the associated data binds it to its place.
///
/// Both ciphers are built from parts AWS-LC provides, whose assembly seals and opens the data
/// path's 8 KiB frames several times faster than portable crates (the superblock's key wrap,
/// off the data path, still uses the chacha20poly1305 crate):
/// - XChaCha20-Poly1305: HChaCha20 of the key and the nonce's first 16 bytes keys a
///   ChaCha20-Poly1305 (RFC 8439) whose nonce is four zero bytes and the nonce's last 8;
/// - AES-256-GCM with a key per string, as `Cipher::Aes256GcmBlake3` says.
pub struct Sealer {
    cipher: Cipher,
    key: [u8; 32],
    /// Keys the BLAKE3 that derives each string's AES-256-GCM key from its nonce.
    aes_key: [u8; 32],
    /// Keys the hash that stands for a name in a metadata key (`Sealer::name_hash`).
    name_key: [u8; 32],
    /// Keys the tag of a file handle given to clients (`Sealer::handle_tag`).
    handle_key: [u8; 32],
}

/// The context of the name-hash key's derivation from the data key. Part of the format: a
/// different context would find no directory entry of an existing bucket.
const NAME_HASH_CONTEXT: &str = "bucketfs 2026-11-27 names in metadata keys";
/// The context of the file-handle key's derivation: a different one would make every handle a
/// client holds (NFS) unknown to the server.
const HANDLE_TAG_CONTEXT: &str = "bucketfs 2026-11-27 file handles given to clients";
/// The context of the AES key-derivation key's derivation from the data key. Part of the
/// format: a different one would open nothing an AES bucket holds.
const AES_KEYS_CONTEXT: &str = "bucketfs 2026-11-30 AES-256-GCM keys of sealed strings";
/// Where a 24-byte nonce is cut for AES-256-GCM: the bytes before derive the key, the bytes
/// after are GCM's 96-bit nonce.
const AES_NONCE_CUT: usize = NONCE_BYTES - 12;

impl Sealer {
    pub fn new(key: &DataKey, cipher: Cipher) -> Self {
        Self {
            cipher,
            key: key.0,
            aes_key: blake3::derive_key(AES_KEYS_CONTEXT, &key.0),
            name_key: blake3::derive_key(NAME_HASH_CONTEXT, &key.0),
            handle_key: blake3::derive_key(HANDLE_TAG_CONTEXT, &key.0),
        }
    }

    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// A 64-bit keyed hash of `scope` and `name`. Metadata keys are stored in the clear (they
    /// must sort), so a name that belongs in a key (a directory entry, an extended attribute)
    /// goes there as this hash, and the name itself in the sealed value. Without the data key
    /// the hash says nothing of the name; the scope (a directory's inode number) keeps equal
    /// names in different directories from showing as equal.
    pub fn name_hash(&self, scope: u64, name: &[u8]) -> u64 {
        let mut h = blake3::Hasher::new_keyed(&self.name_key);
        h.update(&scope.to_be_bytes());
        h.update(name);
        let out = h.finalize();
        u64::from_be_bytes(out.as_bytes()[..8].try_into().expect("8 of 32 bytes"))
    }

    /// A 128-bit keyed tag of a file handle's contents: a client cannot make a handle for an
    /// inode it was never given (and so skip the permissions of the directories above it).
    pub fn handle_tag(&self, handle: &[u8]) -> [u8; 16] {
        let out = blake3::keyed_hash(&self.handle_key, handle);
        out.as_bytes()[..16].try_into().expect("16 of 32 bytes")
    }

    /// Bytes `seal_to_slice` writes for a plaintext of `plain_len` bytes.
    pub const fn sealed_len(plain_len: usize) -> usize {
        NONCE_BYTES + plain_len + TAG_BYTES
    }

    /// Writes `nonce || ciphertext || tag` at the start of `out` and returns its length. The
    /// plaintext is encrypted on its way into `out`, in one pass: this runs over every byte
    /// written, and a copy before an in-place encryption was ~10 % of the server's CPU under
    /// 1 MiB sequential writes of incompressible data (perf).
    pub fn seal_to_slice(&self, out: &mut [u8], aad: &[u8], plaintext: &[u8]) -> usize {
        let (nonce, body, tag) = Self::sealed_parts(out, plaintext.len());
        nonce.copy_from_slice(&random::<NONCE_BYTES>());
        let (key, nonce) = self.inner(nonce);
        key.seal_out_of_place_scatter(nonce, Aad::from(aad), plaintext, body, &[], tag)
            .expect("sealing fails only on mismatched lengths");
        Self::sealed_len(plaintext.len())
    }

    /// Seals the `plain_len` bytes that the caller put at `out[NONCE_BYTES..]`: writes the nonce
    /// before them and the tag after them, and returns the sealed length (as `seal_to_slice`).
    pub fn seal_in_place(&self, out: &mut [u8], aad: &[u8], plain_len: usize) -> usize {
        let (nonce, body, tag) = Self::sealed_parts(out, plain_len);
        nonce.copy_from_slice(&random::<NONCE_BYTES>());
        let (key, nonce) = self.inner(nonce);
        let sealed_tag = key
            .seal_in_place_separate_tag(nonce, Aad::from(aad), body)
            .expect("sealing cannot fail for inputs below 64 GiB");
        tag.copy_from_slice(sealed_tag.as_ref());
        Self::sealed_len(plain_len)
    }

    /// `out` cut into where the nonce, the ciphertext and the tag go.
    fn sealed_parts(out: &mut [u8], plain_len: usize) -> (&mut [u8], &mut [u8], &mut [u8]) {
        assert!(
            out.len() >= Self::sealed_len(plain_len),
            "the caller sizes the output for the sealed bytes"
        );
        let (nonce, rest) = out.split_at_mut(NONCE_BYTES);
        let (body, rest) = rest.split_at_mut(plain_len);
        (nonce, body, &mut rest[..TAG_BYTES])
    }

    /// The AEAD key and 12-byte nonce that the bucket's cipher with `nonce` (24 bytes) reduces
    /// to: ChaCha20-Poly1305's for XChaCha20-Poly1305, AES-256-GCM's for the AES cipher.
    fn inner(&self, nonce: &[u8]) -> (LessSafeKey, Nonce) {
        let mut short = [0u8; 12];
        let key = match self.cipher {
            Cipher::XChaCha20Poly1305 => {
                let prefix: &[u8; 16] = nonce[..16].try_into().expect("24-byte nonce");
                let subkey =
                    chacha20::hchacha::<chacha20::R20>(&self.key.into(), &(*prefix).into());
                short[4..].copy_from_slice(&nonce[16..NONCE_BYTES]);
                UnboundKey::new(&CHACHA20_POLY1305, &subkey)
            }
            Cipher::Aes256GcmBlake3 => {
                let subkey = blake3::keyed_hash(&self.aes_key, &nonce[..AES_NONCE_CUT]);
                short.copy_from_slice(&nonce[AES_NONCE_CUT..NONCE_BYTES]);
                UnboundKey::new(&AES_256_GCM, subkey.as_bytes())
            }
        };
        let key = key.expect("a 32-byte key");
        (LessSafeKey::new(key), Nonce::assume_unique_for_key(short))
    }

    /// Appends `nonce || ciphertext || tag` to `out`.
    pub fn seal_into(&self, out: &mut Vec<u8>, aad: &[u8], plaintext: &[u8]) {
        let start = out.len();
        out.resize(start + Self::sealed_len(plaintext.len()), 0);
        self.seal_to_slice(&mut out[start..], aad, plaintext);
    }

    #[cfg(test)]
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::sealed_len(plaintext.len()));
        self.seal_into(&mut out, aad, plaintext);
        out
    }

    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        let mut out = vec![0u8; Self::opened_len(sealed)?];
        self.open_to_slice(aad, sealed, &mut out)?;
        Ok(out)
    }

    /// Bytes `sealed` opens to, or an error if it is too short to be sealed bytes.
    pub fn opened_len(sealed: &[u8]) -> Result<usize, OpenError> {
        sealed
            .len()
            .checked_sub(NONCE_BYTES + TAG_BYTES)
            .ok_or(OpenError)
    }

    /// Opens `sealed` into `out`, which must be `opened_len` bytes: decrypted on its way, in
    /// one pass. On an error `out` holds nothing of use.
    pub fn open_to_slice(
        &self,
        aad: &[u8],
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<(), OpenError> {
        if Self::opened_len(sealed)? != out.len() {
            return Err(OpenError);
        }
        let (nonce, rest) = sealed.split_at(NONCE_BYTES);
        let (body, tag) = rest.split_at(out.len());
        let (key, nonce) = self.inner(nonce);
        key.open_separate_gather(nonce, Aad::from(aad), body, tag, out)
            .map_err(|_| OpenError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_unlocks_and_wrong_password_is_refused() {
        let (sb, key) =
            Superblock::create("right", KdfCost::default(), Cipher::Aes256GcmBlake3).unwrap();
        let sb = Superblock::from_json(&sb.to_json()).unwrap();
        assert_eq!(sb.unlock("right").unwrap().0, key.0);
        assert_eq!(sb.unlock("wrong").err(), Some(KeyError::WrongPassword));
        let sb2 = sb.rewrap("right", "new").unwrap();
        assert_eq!(sb2.unlock("new").unwrap().0, key.0);
        assert_eq!(sb2.unlock("right").err(), Some(KeyError::WrongPassword));
    }

    /// Pins the sealed format: bytes sealed by an earlier build (chacha20poly1305 0.10, before
    /// the AVX-512 backend) open unchanged, so a crate upgrade cannot silently change it.
    #[test]
    fn bytes_sealed_by_earlier_builds_still_open() {
        let sealer = Sealer::new(&DataKey([0x42; 32]), Cipher::XChaCha20Poly1305);
        let mut sealed: Vec<u8> = (0u8..24).collect();
        sealed.extend(
            hex::decode(
                "ee89e78ca2d5a1b3d215c1276e5d9a9eb3a07fdff0836acbc732ffe4e6fb1e9b\
                 3c1e0d9ff1b92944f19c827a587281eaa649e3b1af8bc3",
            )
            .unwrap(),
        );
        assert_eq!(
            sealer.open(b"log/00000000000000000001", &sealed).unwrap(),
            b"bucketfs sealed bytes, format version 1"
        );
    }

    /// The XChaCha20-Poly1305 built from AWS-LC's ChaCha20-Poly1305 is the standard one: what
    /// either seals, the portable crate's XChaCha20Poly1305 and the Sealer open alike.
    #[test]
    fn sealed_bytes_are_standard_xchacha20_poly1305_both_ways() {
        let key = DataKey([0x5a; 32]);
        let sealer = Sealer::new(&key, Cipher::XChaCha20Poly1305);
        let reference = XChaCha20Poly1305::new((&key.0).into());
        for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 1000, 8192, 8193, 100_000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let aad = format!("place {len}");
            let sealed = sealer.seal(aad.as_bytes(), &plain);
            let (nonce, ct) = sealed.split_at(NONCE_BYTES);
            let opened = reference
                .decrypt(
                    &XNonce::try_from(nonce).unwrap(),
                    Payload {
                        msg: ct,
                        aad: aad.as_bytes(),
                    },
                )
                .expect("the crate opens what the Sealer sealed");
            assert_eq!(opened, plain, "{len} bytes");
            let mut theirs = nonce.to_vec();
            theirs.extend(
                reference
                    .encrypt(
                        &XNonce::try_from(nonce).unwrap(),
                        Payload {
                            msg: &plain,
                            aad: aad.as_bytes(),
                        },
                    )
                    .unwrap(),
            );
            assert_eq!(
                theirs, sealed,
                "{len} bytes: same key and nonce, same bytes"
            );
            assert_eq!(sealer.open(aad.as_bytes(), &theirs).unwrap(), plain);
            let mut in_place = vec![0u8; Sealer::sealed_len(len)];
            in_place[NONCE_BYTES..NONCE_BYTES + len].copy_from_slice(&plain);
            sealer.seal_in_place(&mut in_place, aad.as_bytes(), len);
            assert_eq!(sealer.open(aad.as_bytes(), &in_place).unwrap(), plain);
        }
    }

    /// Seal and open rates of 8 KiB extents, this Sealer against the portable crate; a
    /// measurement, not a check: `cargo test --release -p bucketfs-engine --lib
    /// crypto::tests::extent_rates -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn extent_rates() {
        let key = DataKey([9; 32]);
        let sealer = Sealer::new(&key, Cipher::XChaCha20Poly1305);
        let aes = Sealer::new(&key, Cipher::Aes256GcmBlake3);
        let reference = XChaCha20Poly1305::new((&key.0).into());
        let plain = vec![0x33u8; EXTENT_SIZE_BYTES];
        let rounds = 50_000;
        let rate = |what: &str, f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                f();
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "{what}: {:.0} MB/s ({:.2} us per extent)",
                (rounds * EXTENT_SIZE_BYTES) as f64 / s / 1e6,
                s * 1e6 / rounds as f64
            );
        };
        let mut out = vec![0u8; Sealer::sealed_len(plain.len())];
        rate("Sealer seal", &mut || {
            sealer.seal_to_slice(&mut out, b"aad", &plain);
        });
        let sealed = out.clone();
        let mut opened = vec![0u8; plain.len()];
        rate("Sealer open", &mut || {
            sealer.open_to_slice(b"aad", &sealed, &mut opened).unwrap();
        });
        rate("Sealer seal, AES", &mut || {
            aes.seal_to_slice(&mut out, b"aad", &plain);
        });
        let aes_sealed = out.clone();
        rate("Sealer open, AES", &mut || {
            aes.open_to_slice(b"aad", &aes_sealed, &mut opened).unwrap();
        });
        let nonce = XNonce::try_from(&sealed[..NONCE_BYTES]).unwrap();
        rate("crate seal", &mut || {
            std::hint::black_box(
                reference
                    .encrypt(
                        &nonce,
                        Payload {
                            msg: &plain,
                            aad: b"aad",
                        },
                    )
                    .unwrap(),
            );
        });
        rate("crate open", &mut || {
            std::hint::black_box(
                reference
                    .decrypt(
                        &nonce,
                        Payload {
                            msg: &sealed[NONCE_BYTES..],
                            aad: b"aad",
                        },
                    )
                    .unwrap(),
            );
        });
    }

    #[test]
    fn sealed_bytes_are_bound_to_their_associated_data() {
        for cipher in [Cipher::XChaCha20Poly1305, Cipher::Aes256GcmBlake3] {
            let sealer = Sealer::new(&DataKey([7; 32]), cipher);
            let s = sealer.seal(b"place-1", b"hello");
            assert_eq!(sealer.open(b"place-1", &s).unwrap(), b"hello");
            assert_eq!(sealer.open(b"place-2", &s), Err(OpenError));
            for at in [0, 5, 13, 30, s.len() - 1] {
                let mut flipped = s.clone();
                flipped[at] ^= 1;
                assert_eq!(sealer.open(b"place-1", &flipped), Err(OpenError), "{at}");
            }
            assert_eq!(sealer.open(b"place-1", &s[..10]), Err(OpenError));
            let other = Sealer::new(&DataKey([8; 32]), cipher);
            assert_eq!(other.open(b"place-1", &s), Err(OpenError), "{cipher:?}");
        }
        // The same key under the other cipher opens nothing.
        let chacha = Sealer::new(&DataKey([7; 32]), Cipher::XChaCha20Poly1305);
        let aes = Sealer::new(&DataKey([7; 32]), Cipher::Aes256GcmBlake3);
        assert_eq!(aes.open(b"p", &chacha.seal(b"p", b"x")), Err(OpenError));
        assert_eq!(chacha.open(b"p", &aes.seal(b"p", b"x")), Err(OpenError));
    }

    /// Pins the AES cipher's construction: AES-256-GCM (AWS-LC's, used here directly) under
    /// BLAKE3-keyed(derived key, nonce[..12]) with nonce[12..] opens what the Sealer seals, and
    /// bytes sealed when format 9 was made still open.
    #[test]
    fn aes_sealed_bytes_are_aes_256_gcm_under_a_key_per_nonce() {
        let key = DataKey([0x42; 32]);
        let sealer = Sealer::new(&key, Cipher::Aes256GcmBlake3);
        let derivation_key = blake3::derive_key(AES_KEYS_CONTEXT, &key.0);
        for len in [0usize, 1, 15, 16, 17, 1000, 8192, 8193, 100_000] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let aad = format!("place {len}");
            let sealed = sealer.seal(aad.as_bytes(), &plain);
            let (nonce, ct) = sealed.split_at(NONCE_BYTES);
            let subkey = blake3::keyed_hash(&derivation_key, &nonce[..12]);
            let gcm = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, subkey.as_bytes()).unwrap());
            let mut in_out = ct.to_vec();
            let opened = gcm
                .open_in_place(
                    Nonce::try_assume_unique_for_key(&nonce[12..]).unwrap(),
                    Aad::from(aad.as_bytes()),
                    &mut in_out,
                )
                .expect("plain AES-256-GCM opens what the Sealer sealed");
            assert_eq!(opened, plain, "{len} bytes");
            let mut in_place = vec![0u8; Sealer::sealed_len(len)];
            in_place[NONCE_BYTES..NONCE_BYTES + len].copy_from_slice(&plain);
            sealer.seal_in_place(&mut in_place, aad.as_bytes(), len);
            assert_eq!(sealer.open(aad.as_bytes(), &in_place).unwrap(), plain);
        }
        let mut sealed: Vec<u8> = (0u8..24).collect();
        sealed.extend(hex::decode(PINNED_AES_SEALED).unwrap());
        assert_eq!(
            sealer.open(b"log/00000000000000000001", &sealed).unwrap(),
            b"bucketfs sealed bytes, format version 9"
        );
    }

    /// "bucketfs sealed bytes, format version 9" sealed with the nonce 0, 1, .., 23; Python's
    /// `cryptography` (OpenSSL's AES-GCM) opened it under the derived key when it was pinned.
    const PINNED_AES_SEALED: &str = "79ffbed1e18c5b2952bb7663a1a622574a6e7adddab155d0253d25d3b35f\
                                     39b40764f0f89209d37d6b4f5d87969bf08a070550ef2adc17";

    #[test]
    fn the_superblock_names_its_cipher_and_older_ones_mean_xchacha() {
        let cost = KdfCost {
            memory_kib: 64,
            passes: 1,
        };
        for cipher in [Cipher::XChaCha20Poly1305, Cipher::Aes256GcmBlake3] {
            let (sb, _) = Superblock::create("pw", cost, cipher).unwrap();
            let back = Superblock::from_json(&sb.to_json()).unwrap();
            assert_eq!(back.cipher(), cipher);
            assert_eq!(back.rewrap("pw", "new").unwrap().cipher(), cipher);
            assert_eq!(back.migrated(FORMAT_VERSION).cipher(), cipher);
        }
        let (sb, _) = Superblock::create("pw", cost, Cipher::Aes256GcmBlake3).unwrap();
        let json = String::from_utf8(sb.to_json()).unwrap();
        assert!(
            json.contains("\"cipher\": \"aes-256-gcm-blake3\""),
            "{json}"
        );
        let mut older: serde_json::Value = serde_json::from_str(&json).unwrap();
        older.as_object_mut().unwrap().remove("cipher");
        let older = Superblock::from_json(older.to_string().as_bytes()).unwrap();
        assert_eq!(older.cipher(), Cipher::XChaCha20Poly1305);
        let unknown = json.replace("aes-256-gcm-blake3", "rot13");
        let err = Superblock::from_json(unknown.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("rot13"), "{err}");
    }
}
