//! File handles (nfs_fh3, RFC 1813: opaque, at most 64 bytes) name an inode and its
//! generation, so they stay valid across server restarts while the file exists, and a handle
//! of a deleted file whose inode number came back answers STALE. They also name the export
//! they were given under. A keyed tag makes them unforgeable: a client cannot reach an inode
//! it was never given a handle to, past the permissions of the directories above it, nor move
//! a handle from one export to another.
//!
//! Layout (37 bytes): version (1) | export id (4, big-endian) | inode number (8) |
//! generation (8) | tag (16), the tag being the engine's keyed hash of the 21 bytes before it.

use crate::status::{Nfs3Error, NFS3ERR_BADHANDLE, NFS3ERR_STALE};
use bucketfs_fs::{Fs, FsError, Inode};

pub const HANDLE_BYTES: usize = 37;
/// nfs_fh3's limit.
pub const NFS3_FHSIZE: usize = 64;
/// Version 1 (33 bytes, no export id) was never served outside development builds.
const VERSION: u8 = 2;

/// The handle of `inode` under the export `export_id`.
pub fn encode(fs: &Fs, export_id: u32, inode: &Inode) -> Vec<u8> {
    let mut h = Vec::with_capacity(HANDLE_BYTES);
    h.push(VERSION);
    h.extend_from_slice(&export_id.to_be_bytes());
    h.extend_from_slice(&inode.ino.to_be_bytes());
    h.extend_from_slice(&inode.generation.to_be_bytes());
    let tag = fs.engine().handle_tag(&h);
    h.extend_from_slice(&tag);
    h
}

/// The export id a handle carries, once its tag is checked. BADHANDLE for bytes that are not
/// a handle of this bucket (wrong length, version, or tag).
pub fn export_id(fs: &Fs, h: &[u8]) -> Result<u32, Nfs3Error> {
    if h.len() != HANDLE_BYTES || h[0] != VERSION {
        return Err(NFS3ERR_BADHANDLE);
    }
    let (body, tag) = h.split_at(HANDLE_BYTES - 16);
    if fs.engine().handle_tag(body) != tag {
        return Err(NFS3ERR_BADHANDLE);
    }
    Ok(u32::from_be_bytes(body[1..5].try_into().expect("4 bytes")))
}

/// The inode a handle names, as it is now: BADHANDLE as for `export_id`, STALE for a handle
/// of a file that is gone.
pub async fn decode(fs: &Fs, h: &[u8]) -> Result<Inode, Nfs3Error> {
    export_id(fs, h)?;
    let ino = u64::from_be_bytes(h[5..13].try_into().expect("8 bytes"));
    let generation = u64::from_be_bytes(h[13..21].try_into().expect("8 bytes"));
    match fs.getattr(ino).await {
        Ok(inode) if inode.generation == generation => Ok(inode),
        Ok(_) | Err(FsError::NotFound(_)) => Err(NFS3ERR_STALE),
        Err(e) => Err(Nfs3Error::from(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_fs::{Caller, ROOT_INO, S_IFREG};

    #[tokio::test]
    async fn handles_name_their_inode_and_nothing_else() {
        let fs = crate::memory_fs().await;
        let root = fs.getattr(ROOT_INO).await.unwrap();
        let h = encode(&fs, 7, &root);
        assert!(h.len() == HANDLE_BYTES && h.len() <= NFS3_FHSIZE);
        assert_eq!(decode(&fs, &h).await.unwrap().ino, ROOT_INO);
        assert_eq!(export_id(&fs, &h), Ok(7));

        // Truncated, lengthened, another version, a forged inode number or tag: BADHANDLE.
        for bad in [
            &h[..20],
            &[&h[..], &[0]].concat()[..],
            &[&[1], &h[1..]].concat()[..],
        ] {
            assert_eq!(decode(&fs, bad).await.unwrap_err(), NFS3ERR_BADHANDLE);
        }
        // Another inode number or export id under the old tag.
        for byte in [4, 12] {
            let mut forged = h.clone();
            forged[byte] ^= 2;
            assert_eq!(decode(&fs, &forged).await.unwrap_err(), NFS3ERR_BADHANDLE);
        }

        // A handle of a file that was removed: STALE.
        let f = fs
            .make(&Caller::root(), ROOT_INO, b"f", S_IFREG | 0o644, 0)
            .await
            .unwrap();
        let fh = encode(&fs, 7, &f);
        assert_eq!(decode(&fs, &fh).await.unwrap().ino, f.ino);
        fs.unlink(&Caller::root(), ROOT_INO, b"f").await.unwrap();
        assert_eq!(decode(&fs, &fh).await.unwrap_err(), NFS3ERR_STALE);
    }
}
