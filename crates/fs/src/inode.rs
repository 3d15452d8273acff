//! The inode record: what `stat` answers, kept as one sealed value per inode (docs/format.md,
//! "Filesystem keys"). The record is versioned by its first byte; the 21-byte record of
//! filesystem layout 1 (block devices only) still decodes. An inode with a POSIX ACL has a
//! version-3 record, which holds the ACLs too: a build that knows only version 2 refuses such
//! an inode (as damaged) rather than grant what its ACL denies.

use crate::acl::Acl;
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

/// The record's first byte in this layout, without ACLs and with them.
const RECORD_VERSION: u8 = 2;
const RECORD_VERSION_ACL: u8 = 3;
/// Bytes of a version-2 record before a symlink's target (the last 4 are reserved, zero).
const RECORD_FIXED_BYTES: usize = 1 + 4 * 4 + 8 * 4 + 4 * 12 + 4;
/// Bytes of a version-3 record before its ACLs: the version-2 fields, then the lengths of the
/// access ACL and the default ACL (xattr form; 0 for none).
const RECORD_ACL_FIXED_BYTES: usize = RECORD_FIXED_BYTES + 4;
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
    /// The access ACL, when it holds more than the mode says (acl.rs).
    pub acl: Option<Acl>,
    /// A directory's default ACL, which its new entries inherit.
    pub default_acl: Option<Acl>,
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
            acl: None,
            default_acl: None,
        }
    }

    pub fn kind(&self) -> Kind {
        Kind::of_mode(self.mode).expect("a decoded record has a known type")
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Kind::Directory
    }

    pub fn encode(&self) -> Vec<u8> {
        let acls = self.acl.is_some() || self.default_acl.is_some();
        let mut v = Vec::with_capacity(RECORD_ACL_FIXED_BYTES + self.target.len());
        v.push(if acls {
            RECORD_VERSION_ACL
        } else {
            RECORD_VERSION
        });
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
        if acls {
            let access = self.acl.as_ref().map(Acl::to_xattr).unwrap_or_default();
            let default = self
                .default_acl
                .as_ref()
                .map(Acl::to_xattr)
                .unwrap_or_default();
            v.extend_from_slice(&(access.len() as u32).to_le_bytes());
            v.extend_from_slice(&(default.len() as u32).to_le_bytes());
            v.extend_from_slice(&access);
            v.extend_from_slice(&default);
        } else {
            v.extend_from_slice(&0u32.to_le_bytes());
        }
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
        if v[0] != RECORD_VERSION && v[0] != RECORD_VERSION_ACL {
            return Err(damaged(&format!("unknown inode record version {}", v[0])));
        }
        let u32_at = |at: usize| u32::from_le_bytes(v[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(v[at..at + 8].try_into().expect("8 bytes"));
        let time_at = |at: usize| Time {
            sec: u64_at(at) as i64,
            nsec: u32_at(at + 8),
        };
        let (acl, default_acl, rest) = if v[0] == RECORD_VERSION_ACL {
            Inode::decode_acls(ino, v)?
        } else {
            (None, None, &v[RECORD_FIXED_BYTES..])
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
            target: rest.to_vec(),
            acl,
            default_acl,
        };
        if Kind::of_mode(inode.mode).is_none() {
            return Err(damaged(&format!(
                "unknown file type in mode {:o}",
                inode.mode
            )));
        }
        Ok(inode)
    }

    /// The ACLs of a version-3 record, and what follows them (a symlink's target).
    #[allow(clippy::type_complexity)]
    fn decode_acls(ino: u64, v: &[u8]) -> Result<(Option<Acl>, Option<Acl>, &[u8]), FsError> {
        let damaged = |why: String| FsError::Damaged(ino, why);
        if v.len() < RECORD_ACL_FIXED_BYTES {
            return Err(damaged("inode record is too short for its ACLs".into()));
        }
        let len_at =
            |at: usize| u32::from_le_bytes(v[at..at + 4].try_into().expect("4 bytes")) as usize;
        let (access_len, default_len) =
            (len_at(RECORD_FIXED_BYTES - 4), len_at(RECORD_FIXED_BYTES));
        let rest = &v[RECORD_ACL_FIXED_BYTES..];
        if access_len.saturating_add(default_len) > rest.len() {
            return Err(damaged("inode record is shorter than its ACLs".into()));
        }
        let acl = |bytes: &[u8]| -> Result<Option<Acl>, FsError> {
            if bytes.is_empty() {
                return Ok(None);
            }
            Acl::from_xattr(bytes).map_err(|e| damaged(format!("inode record's ACL: {e}")))
        };
        let (access, rest) = rest.split_at(access_len);
        let (default, rest) = rest.split_at(default_len);
        Ok((acl(access)?, acl(default)?, rest))
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
    fn records_with_acls_round_trip_and_cut_ones_are_refused() {
        let mut i = Inode::new(8, S_IFDIR | 0o770, 1000, 100, Time::default());
        // Owner rwx, a named user 1001 with rwx, group r-x, the mask it needs, others none.
        let acl = crate::acl::xattr_of(&[
            (0x01, 7, u32::MAX),
            (0x02, 7, 1001),
            (0x04, 5, u32::MAX),
            (0x10, 7, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        i.acl = Acl::from_xattr(&acl).unwrap();
        i.default_acl = Some(Acl::of_mode(0o700));
        let v = i.encode();
        assert_eq!(v[0], RECORD_VERSION_ACL);
        assert_eq!(Inode::decode(8, &v).unwrap(), i);
        i.acl = None;
        assert_eq!(Inode::decode(8, &i.encode()).unwrap(), i);
        i.default_acl = None;
        assert_eq!(i.encode()[0], RECORD_VERSION, "no ACL, the old record");
        for cut in [RECORD_FIXED_BYTES + 2, v.len() - 1] {
            assert!(Inode::decode(8, &v[..cut]).is_err(), "cut at {cut}");
        }
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
