//! Directory entries. An entry's key holds its directory and its cookie, a keyed hash of its
//! name (docs/format.md, "Filesystem keys"); the sealed value holds the names, inode numbers
//! and types of every entry with that cookie, which is almost always one. Readdir walks the
//! keys in cookie order and resumes after the last cookie it returned, so a listing stays
//! stable while entries come and go, like ext4's hashed directories.

use crate::inode::Kind;
use crate::FsError;

/// Readdir offsets 1 and 2 stand after `.` and `..`; entries' cookies start here.
pub const FIRST_COOKIE: u64 = 3;
/// Cookies stay below 2^63: some clients keep directory offsets in a signed 64-bit integer.
const COOKIE_BITS_MAX: u32 = 63;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
}

/// An entry as readdir returns it: the offset to resume after it is `cookie`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: Kind,
    pub cookie: u64,
}

/// The cookie of a name hashed by `Engine::name_hash` in its directory.
pub fn cookie_of(hash: u64) -> u64 {
    let c = hash >> (64 - COOKIE_BITS_MAX);
    c.max(FIRST_COOKIE)
}

pub fn encode_bucket(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::new();
    for e in entries {
        v.push(e.kind.dirent_type());
        v.extend_from_slice(&e.ino.to_le_bytes());
        v.push(u8::try_from(e.name.len()).expect("names are checked to be at most 255 bytes"));
        v.extend_from_slice(&e.name);
    }
    v
}

pub fn decode_bucket(dir: u64, cookie: u64, mut v: &[u8]) -> Result<Vec<Entry>, FsError> {
    let damaged = || FsError::Damaged(dir, format!("directory entry {cookie} is malformed"));
    let mut out = Vec::new();
    while !v.is_empty() {
        if v.len() < 10 {
            return Err(damaged());
        }
        let kind = Kind::of_mode(u32::from(v[0]) << 12).ok_or_else(damaged)?;
        let ino = u64::from_le_bytes(v[1..9].try_into().expect("8 bytes"));
        let len = usize::from(v[9]);
        let name = v.get(10..10 + len).ok_or_else(damaged)?.to_vec();
        if name.is_empty() {
            return Err(damaged());
        }
        out.push(Entry { name, ino, kind });
        v = &v[10 + len..];
    }
    if out.is_empty() {
        return Err(damaged());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_trip_and_malformed_ones_are_refused() {
        let entries = vec![
            Entry {
                name: b"a".to_vec(),
                ino: 9,
                kind: Kind::File,
            },
            Entry {
                name: vec![0xff; 255],
                ino: u64::MAX,
                kind: Kind::Directory,
            },
        ];
        let v = encode_bucket(&entries);
        assert_eq!(decode_bucket(1, 5, &v).unwrap(), entries);
        for cut in [1, 9, 10, v.len() - 1] {
            assert!(decode_bucket(1, 5, &v[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_bucket(1, 5, &[]).is_err());
        let mut bad = v;
        bad[0] = 0;
        assert!(decode_bucket(1, 5, &bad).is_err());
        assert_eq!(cookie_of(0), FIRST_COOKIE);
        assert!(cookie_of(u64::MAX) < 1 << 63);
    }
}
