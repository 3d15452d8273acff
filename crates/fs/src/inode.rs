//! The inode record: what `stat` answers, kept as one sealed value per inode (docs/format.md,
//! "Filesystem keys"). The record is versioned by its first byte; the 21-byte record of
//! filesystem layout 1 (block devices only) still decodes.

use crate::FsError;

/// File type bits of `mode`, as in `<sys/stat.h>`.
pub const S_IFMT: u32 = 0o170_000;
pub const S_IFSOCK: u32 = 0o140_000;
pub const S_IFLNK: u32 = 0o120_000;
pub const S_IFREG: u32 = 0o100_000;
pub const S_IFBLK: u32 = 0o060_000;
pub const S_IFDIR: u32 = 0o040_000;
pub const S_IFCHR: u32 = 0o020_000;
pub const S_IFIFO: u32 = 0o010_000;
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

/// The record's first byte in this layout.
const RECORD_VERSION: u8 = 2;
/// Bytes of a version-2 record before a symlink's target.
const RECORD_FIXED_BYTES: usize = 1 + 4 * 4 + 8 * 4 + 4 * 12 + 4;
/// The record of filesystem layout 1: kind, size, mode, mtime in nanoseconds.
const LEGACY_RECORD_BYTES: usize = 21;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    pub fn of_mode(mode: u32) -> Option<Kind> {
        Some(match mode & S_IFMT {
            S_IFREG => Kind::File,
            S_IFDIR => Kind::Directory,
            S_IFLNK => Kind::Symlink,
            S_IFIFO => Kind::Fifo,
            S_IFSOCK => Kind::Socket,
            S_IFCHR => Kind::CharDevice,
            S_IFBLK => Kind::BlockDevice,
            _ => return None,
        })
    }

    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => S_IFREG,
            Kind::Directory => S_IFDIR,
            Kind::Symlink => S_IFLNK,
            Kind::Fifo => S_IFIFO,
            Kind::Socket => S_IFSOCK,
            Kind::CharDevice => S_IFCHR,
            Kind::BlockDevice => S_IFBLK,
        }
    }

    /// The `d_type` of a directory entry (`DT_*` of `<dirent.h>`).
    pub fn dirent_type(self) -> u8 {
        (self.mode_bits() >> 12) as u8
    }
}

/// Seconds and nanoseconds since the epoch; seconds may be negative (before 1970).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    fn from_ns(ns: u64) -> Time {
        Time {
            sec: (ns / 1_000_000_000) as i64,
            nsec: (ns % 1_000_000_000) as u32,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    /// Type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size_bytes: u64,
    pub rdev: u64,
    /// Tells a file handle of this inode from one of an earlier inode of the same number.
    pub generation: u64,
    /// A directory's parent (what `..` names); 0 for other kinds.
    pub parent: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub btime: Time,
    /// A symlink's target.
    pub target: Vec<u8>,
}

impl Inode {
    pub fn new(ino: u64, mode: u32, uid: u32, gid: u32, now: Time) -> Inode {
        let dir = mode & S_IFMT == S_IFDIR;
        Inode {
            ino,
            mode,
            uid,
            gid,
            nlink: if dir { 2 } else { 1 },
            size_bytes: 0,
            rdev: 0,
            generation: ino,
            parent: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            target: Vec::new(),
        }
    }

    pub fn kind(&self) -> Kind {
        Kind::of_mode(self.mode).expect("a decoded record has a known type")
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Kind::Directory
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RECORD_FIXED_BYTES + self.target.len());
        v.push(RECORD_VERSION);
        for x in [self.mode, self.uid, self.gid, self.nlink] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [self.size_bytes, self.rdev, self.generation, self.parent] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for t in [self.atime, self.mtime, self.ctime, self.btime] {
            v.extend_from_slice(&t.sec.to_le_bytes());
            v.extend_from_slice(&t.nsec.to_le_bytes());
        }
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&self.target);
        debug_assert_eq!(Inode::decode(self.ino, &v).as_ref().ok(), Some(self));
        v
    }

    pub fn decode(ino: u64, v: &[u8]) -> Result<Inode, FsError> {
        let damaged = |why: &str| FsError::Damaged(ino, why.to_string());
        // A version-2 record is never this short, whatever its first byte.
        if v.len() == LEGACY_RECORD_BYTES {
            return Inode::decode_legacy(ino, v);
        }
        if v.len() < RECORD_FIXED_BYTES {
            return Err(damaged("inode record is too short"));
        }
        if v[0] != RECORD_VERSION {
            return Err(damaged(&format!("unknown inode record version {}", v[0])));
        }
        let u32_at = |at: usize| u32::from_le_bytes(v[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(v[at..at + 8].try_into().expect("8 bytes"));
        let time_at = |at: usize| Time {
            sec: u64_at(at) as i64,
            nsec: u32_at(at + 8),
        };
        let inode = Inode {
            ino,
            mode: u32_at(1),
            uid: u32_at(5),
            gid: u32_at(9),
            nlink: u32_at(13),
            size_bytes: u64_at(17),
            rdev: u64_at(25),
            generation: u64_at(33),
            parent: u64_at(41),
            atime: time_at(49),
            mtime: time_at(61),
            ctime: time_at(73),
            btime: time_at(85),
            target: v[RECORD_FIXED_BYTES..].to_vec(),
        };
        if Kind::of_mode(inode.mode).is_none() {
            return Err(damaged(&format!(
                "unknown file type in mode {:o}",
                inode.mode
            )));
        }
        Ok(inode)
    }

    /// Layout 1 knew directories (kind 1) and files (kind 2) owned by root, with one time.
    fn decode_legacy(ino: u64, v: &[u8]) -> Result<Inode, FsError> {
        let type_bits = match v[0] {
            1 => S_IFDIR,
            2 => S_IFREG,
            k => return Err(FsError::Damaged(ino, format!("unknown inode kind {k}"))),
        };
        let size_bytes = u64::from_le_bytes(v[1..9].try_into().expect("8 bytes"));
        let mode = u32::from_le_bytes(v[9..13].try_into().expect("4 bytes")) & 0o7777;
        let time = Time::from_ns(u64::from_le_bytes(v[13..21].try_into().expect("8 bytes")));
        let mut inode = Inode::new(ino, type_bits | mode, 0, 0, time);
        inode.size_bytes = size_bytes;
        Ok(inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let mut i = Inode::new(7, S_IFLNK | 0o777, 1000, 100, Time { sec: -5, nsec: 9 });
        i.target = b"../some/where".to_vec();
        i.size_bytes = 13;
        let v = i.encode();
        assert_eq!(Inode::decode(7, &v).unwrap(), i);
        assert!(Inode::decode(7, &v[..40]).is_err());
        let mut bad = v.clone();
        bad[0] = 9;
        assert!(Inode::decode(7, &bad).is_err());
        let mut no_type = v;
        no_type[1..5].copy_from_slice(&0o644u32.to_le_bytes());
        assert!(Inode::decode(7, &no_type).is_err());
    }

    #[test]
    fn layout_1_records_decode() {
        let mut v = vec![2u8];
        v.extend_from_slice(&(1u64 << 30).to_le_bytes());
        v.extend_from_slice(&0o600u32.to_le_bytes());
        v.extend_from_slice(&1_500_000_000_123u64.to_le_bytes());
        let i = Inode::decode(3, &v).unwrap();
        assert_eq!(i.kind(), Kind::File);
        assert_eq!(i.mode, S_IFREG | 0o600);
        assert_eq!(i.size_bytes, 1 << 30);
        assert_eq!(
            i.mtime,
            Time {
                sec: 1500,
                nsec: 123
            }
        );
    }
}
