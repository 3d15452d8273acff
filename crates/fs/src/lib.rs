//! The filesystem core: POSIX inodes, directories, files and their permissions over the
//! engine's keys and extents (docs/0006). Every mutation is one engine transaction, made under
//! the locks of the inodes it touches, so it is atomic after a crash and clients working on
//! different inodes never wait for one another. Block devices are the regular files of the
//! directory `/.nbd/`.
//!
//! Names are bytes (any but `/` and NUL, 1 to 255 of them). Protocol servers call this layer
//! with the caller's credentials; it answers `FsError`, which `FsError::errno` maps to POSIX.

mod acl;
mod blockdev;
mod change;
mod dir;
mod file;
mod inode;
mod keys;
mod locks;
mod namespace;
mod perm;
mod xattr;

pub use acl::{Acl, XATTR_ACCESS as ACL_XATTR_ACCESS, XATTR_DEFAULT as ACL_XATTR_DEFAULT};
pub use blockdev::BlockDevice;
pub use dir::{DirEntry, FIRST_COOKIE};
pub use file::SetAttr;
pub use inode::{
    Inode, Kind, Time, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
    S_ISGID, S_ISUID, S_ISVTX,
};
pub use namespace::RenameFlags;
pub use perm::{Caller, MAY_EXEC, MAY_READ, MAY_WRITE};
pub use xattr::{XattrMode, XATTR_VALUE_BYTES_MAX};

use bucketfs_engine::{Engine, EngineError, Expect, Txn};
use change::Change;
use dir::Entry;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

pub const ROOT_INO: u64 = 1;
pub const NBD_DIR_NAME: &str = ".nbd";
/// Longest file name, as in most POSIX filesystems.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target (PATH_MAX).
pub const SYMLINK_BYTES_MAX: usize = 4096;
/// Largest file: byte offsets must fit comfortably in u64 arithmetic and in extent indexes.
pub const FILE_SIZE_BYTES_MAX: u64 = 1 << 60;
/// Inode numbers reserved per counter update, so that creates in different directories do not
/// all wait on the counter; a crash forgets at most this many unused numbers.
const INO_RESERVE_COUNT: u64 = 1024;
/// What statfs reports as the size of a filesystem without a quota: the bucket is bottomless,
/// and tools divide by this, so it is large but far from overflowing anything (1 PiB).
const UNLIMITED_BYTES: u64 = 1 << 50;
/// statfs's block size.
pub const STATFS_BLOCK_BYTES: u64 = 4096;
/// The layout this build writes (keys::LAYOUT).
const LAYOUT_VERSION: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("invalid name {0:?}: names are 1 to 255 bytes, without '/' or NUL, and not . or ..")]
    InvalidName(String),
    #[error("size {0} is larger than the maximum file size")]
    TooLarge(u64),
    #[error("range {offset}+{length} is beyond the end of the file ({size} bytes)")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("permission denied")]
    Access,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("no such extended attribute")]
    NoXattr,
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("the filesystem's quota is reached; delete files to make room")]
    NoSpace,
    #[error("inode {0} is damaged: {1}")]
    Damaged(u64, String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl FsError {
    /// The POSIX errno a protocol answers for this error (Linux's numbers, which 9P2000.L and
    /// FUSE carry).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Exists(_) => libc::EEXIST,
            FsError::NotFound(_) => libc::ENOENT,
            FsError::InvalidName(n) if n.len() > NAME_BYTES_MAX => libc::ENAMETOOLONG,
            FsError::InvalidName(_) | FsError::Invalid(_) | FsError::OutOfRange { .. } => {
                libc::EINVAL
            }
            FsError::TooLarge(_) => libc::EFBIG,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Access => libc::EACCES,
            FsError::NotPermitted => libc::EPERM,
            FsError::NoXattr => libc::ENODATA,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::NoSpace => libc::ENOSPC,
            FsError::Engine(EngineError::ReadOnly) => libc::EROFS,
            FsError::Damaged(..) | FsError::Engine(_) => libc::EIO,
        }
    }
}

fn check_name(name: &[u8]) -> Result<(), FsError> {
    let bad = name.is_empty()
        || name.len() > NAME_BYTES_MAX
        || name.contains(&b'/')
        || name.contains(&0)
        || name == b"."
        || name == b"..";
    if bad {
        return Err(FsError::InvalidName(
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    Ok(())
}

fn decode_ino(owner: u64, v: &[u8]) -> Result<u64, FsError> {
    let b: [u8; 8] = v
        .try_into()
        .map_err(|_| FsError::Damaged(owner, "inode number has the wrong length".into()))?;
    Ok(u64::from_be_bytes(b))
}

/// What statfs answers, in `STATFS_BLOCK_BYTES` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
}

pub struct Fs {
    engine: Engine,
    /// A read-only open of a layout-1 bucket (names in keys): lookups use its keys.
    legacy: bool,
    nbd_dir: u64,
    /// Sizes of block devices, checked on every NBD request without a key-value lookup.
    sizes: RwLock<HashMap<u64, u64>>,
    locks: locks::LockTable,
    /// Reserved inode numbers not yet handed out: next, end.
    inos: tokio::sync::Mutex<(u64, u64)>,
    /// Serialises renames of directories to another parent, so that two of them cannot each
    /// pass the check that they do not move a directory under itself, and together do.
    dir_moves: tokio::sync::Mutex<()>,
    /// Open handles per inode: an unlinked inode keeps its data until the last one closes.
    open_files: Mutex<HashMap<u64, u32>>,
    /// Bytes files may allocate; u64::MAX: no quota.
    quota_bytes: AtomicU64,
}

impl Fs {
    /// Opens the filesystem: creates `/` and `/.nbd/` in a new bucket, migrates a layout-1
    /// bucket, and deletes what inodes unlinked while open left behind a crash.
    pub async fn open(engine: Engine) -> Result<Fs, FsError> {
        let writable = !engine.read_only();
        let has_root = engine.kv_get(&keys::inode(ROOT_INO)).await?.is_some();
        let layout = engine.kv_get(keys::LAYOUT).await?;
        if !has_root && writable {
            Fs::format(&engine).await?;
        } else if has_root && layout.is_none() && writable {
            Fs::migrate_layout_1(&engine).await?;
        }
        let legacy = has_root && layout.is_none() && !writable;
        let mut fs = Fs {
            engine,
            legacy,
            nbd_dir: 0,
            sizes: RwLock::default(),
            locks: locks::LockTable::default(),
            inos: tokio::sync::Mutex::new((0, 0)),
            dir_moves: tokio::sync::Mutex::new(()),
            open_files: Mutex::default(),
            quota_bytes: AtomicU64::new(u64::MAX),
        };
        fs.nbd_dir = match fs.lookup_entry(ROOT_INO, NBD_DIR_NAME.as_bytes()).await? {
            Some(e) => e.ino,
            // A read-only open of a bucket whose first writer never got this far.
            None => return Err(FsError::NotFound("/.nbd".into())),
        };
        if writable {
            fs.delete_orphans().await?;
        }
        let devices = fs.block_devices().await?;
        fs.sizes
            .write()
            .extend(devices.iter().map(|d| (d.ino, d.size_bytes)));
        Ok(fs)
    }

    async fn format(engine: &Engine) -> Result<(), FsError> {
        let now = Time::now();
        let mut root = Inode::new(ROOT_INO, S_IFDIR | 0o755, 0, 0, now);
        root.parent = ROOT_INO;
        root.nlink = 3;
        let nbd_ino = ROOT_INO + 1;
        let mut nbd = Inode::new(nbd_ino, S_IFDIR | 0o700, 0, 0, now);
        nbd.parent = ROOT_INO;
        let name = NBD_DIR_NAME.as_bytes();
        let cookie = dir::cookie_of(engine.name_hash(ROOT_INO, name));
        let entry = Entry {
            name: name.to_vec(),
            ino: nbd_ino,
            kind: Kind::Directory,
        };
        let mut txn = Txn::new();
        txn.expect(keys::inode(ROOT_INO), Expect::Absent)
            .put(keys::inode(ROOT_INO), root.encode())
            .put(keys::inode(nbd_ino), nbd.encode())
            .put(keys::dirent(ROOT_INO, cookie), dir::encode_bucket(&[entry]))
            .put(
                keys::NEXT_INO.to_vec(),
                (nbd_ino + 1).to_be_bytes().to_vec(),
            )
            .put(keys::LAYOUT.to_vec(), vec![LAYOUT_VERSION]);
        engine.commit(&txn).await?;
        engine.flush().await?;
        Ok(())
    }

    /// Layout 1 kept names in keys (`d` + parent + name) and 21-byte inode records, and held
    /// only `/`, `/.nbd/` and block devices: a few pairs, rewritten in one transaction.
    async fn migrate_layout_1(engine: &Engine) -> Result<(), FsError> {
        let old = engine.kv_scan(keys::LEGACY_DIRENT_PREFIX).await?;
        let mut txn = Txn::new();
        txn.expect(keys::LAYOUT.to_vec(), Expect::Absent);
        let mut buckets: HashMap<(u64, u64), Vec<Entry>> = HashMap::new();
        let mut dirs: HashMap<u64, (u64, u32)> = HashMap::from([(ROOT_INO, (ROOT_INO, 2))]);
        for (k, v) in &old {
            let parent = keys::ino_of(k).ok_or_else(|| {
                FsError::Damaged(ROOT_INO, "a layout-1 directory entry is malformed".into())
            })?;
            let name = k[9..].to_vec();
            let ino = decode_ino(parent, v)?;
            let raw = engine.kv_get(&keys::inode(ino)).await?;
            let child = Inode::decode(ino, raw.as_deref().unwrap_or_default())?;
            if child.is_dir() {
                dirs.entry(ino).or_insert((parent, 2)).0 = parent;
                dirs.entry(parent).or_insert((parent, 2)).1 += 1;
            }
            let cookie = dir::cookie_of(engine.name_hash(parent, &name));
            buckets.entry((parent, cookie)).or_default().push(Entry {
                name,
                ino,
                kind: child.kind(),
            });
            txn.delete(k.clone());
        }
        for ((parent, cookie), entries) in &buckets {
            txn.put(keys::dirent(*parent, *cookie), dir::encode_bucket(entries));
        }
        for (ino, (parent, nlink)) in dirs {
            let raw = engine.kv_get(&keys::inode(ino)).await?;
            let mut d = Inode::decode(ino, raw.as_deref().unwrap_or_default())?;
            d.parent = parent;
            d.nlink = nlink;
            txn.put(keys::inode(ino), d.encode());
        }
        txn.put(keys::LAYOUT.to_vec(), vec![LAYOUT_VERSION]);
        engine.commit(&txn).await?;
        engine.flush().await?;
        tracing::info!(
            entries = old.len(),
            "migrated the filesystem from layout 1 to layout {LAYOUT_VERSION}"
        );
        Ok(())
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub async fn getattr(&self, ino: u64) -> Result<Inode, FsError> {
        let v = self
            .engine
            .kv_get(&keys::inode(ino))
            .await?
            .ok_or_else(|| FsError::NotFound(format!("inode {ino}")))?;
        Inode::decode(ino, &v)
    }

    fn cookie(&self, dir: u64, name: &[u8]) -> u64 {
        dir::cookie_of(self.engine.name_hash(dir, name))
    }

    /// The entry `name` of directory `dir`, without permission checks.
    async fn lookup_entry(&self, dir: u64, name: &[u8]) -> Result<Option<Entry>, FsError> {
        if self.legacy {
            let Some(v) = self.engine.kv_get(&keys::legacy_dirent(dir, name)).await? else {
                return Ok(None);
            };
            let ino = decode_ino(dir, &v)?;
            let kind = self.getattr(ino).await?.kind();
            return Ok(Some(Entry {
                name: name.to_vec(),
                ino,
                kind,
            }));
        }
        let cookie = self.cookie(dir, name);
        let Some(v) = self.engine.kv_get(&keys::dirent(dir, cookie)).await? else {
            return Ok(None);
        };
        Ok(dir::decode_bucket(dir, cookie, &v)?
            .into_iter()
            .find(|e| e.name == name))
    }

    /// Looks `name` up in `dir`, which the caller must be allowed to search. `.` and `..` name
    /// the directory and its parent.
    pub async fn lookup(&self, caller: &Caller, dir: u64, name: &[u8]) -> Result<Inode, FsError> {
        let d = self.getattr(dir).await?;
        if !d.is_dir() {
            return Err(FsError::NotDir);
        }
        caller.check(&d, MAY_EXEC)?;
        match name {
            b"." => return Ok(d),
            b".." => return self.getattr(d.parent.max(ROOT_INO)).await,
            _ => check_name(name)?,
        }
        match self.lookup_entry(dir, name).await? {
            Some(e) => self.getattr(e.ino).await,
            None => Err(FsError::NotFound(
                String::from_utf8_lossy(name).into_owned(),
            )),
        }
    }

    /// Up to `limit` entries of `dir` after the offset `after` (0: from the start; then the
    /// cookie of the last entry returned). `.` and `..` come first, at offsets 1 and 2.
    pub async fn readdir(
        &self,
        caller: &Caller,
        dir: u64,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>, FsError> {
        let d = self.getattr(dir).await?;
        if !d.is_dir() {
            return Err(FsError::NotDir);
        }
        caller.check(&d, MAY_READ)?;
        let mut out = Vec::new();
        for (cookie, name, ino) in [(1, &b"."[..], dir), (2, &b".."[..], d.parent.max(1))] {
            if after < cookie && out.len() < limit {
                out.push(DirEntry {
                    name: name.to_vec(),
                    ino,
                    kind: Kind::Directory,
                    cookie,
                });
            }
        }
        if out.len() < limit {
            let from = after.max(FIRST_COOKIE - 1) + 1;
            out.extend(self.entries_from(dir, from, limit - out.len()).await?);
        }
        Ok(out)
    }

    /// Entries of `dir` with a cookie of at least `from`: whole cookie buckets, so at times a
    /// few more than `limit`, never a bucket split (the next call resumes after its cookie).
    async fn entries_from(
        &self,
        dir: u64,
        from: u64,
        limit: usize,
    ) -> Result<Vec<DirEntry>, FsError> {
        let mut out = Vec::new();
        if self.legacy {
            let prefix = keys::legacy_dirent(dir, b"");
            for (i, (k, v)) in self.engine.kv_scan(&prefix).await?.into_iter().enumerate() {
                let cookie = FIRST_COOKIE + i as u64;
                if cookie >= from && out.len() < limit {
                    let ino = decode_ino(dir, &v)?;
                    out.push(DirEntry {
                        name: k[prefix.len()..].to_vec(),
                        ino,
                        kind: self.getattr(ino).await?.kind(),
                        cookie,
                    });
                }
            }
            return Ok(out);
        }
        let start = keys::dirent(dir, from);
        let end = bucketfs_engine::prefix_end(&keys::dirent_prefix(dir));
        for (k, v) in self.engine.kv_range(&start, end.as_deref(), limit).await? {
            let cookie = keys::second_of(&k)
                .ok_or_else(|| FsError::Damaged(dir, "a directory entry key is short".into()))?;
            for e in dir::decode_bucket(dir, cookie, &v)? {
                out.push(DirEntry {
                    name: e.name,
                    ino: e.ino,
                    kind: e.kind,
                    cookie,
                });
            }
        }
        Ok(out)
    }

    async fn dir_is_empty(&self, dir: u64) -> Result<bool, FsError> {
        let start = keys::dirent_prefix(dir);
        let end = bucketfs_engine::prefix_end(&start);
        Ok(self
            .engine
            .kv_range(&start, end.as_deref(), 1)
            .await?
            .is_empty())
    }

    /// A fresh inode number: from the reserved range, or after reserving the next one.
    async fn next_ino(&self) -> Result<u64, FsError> {
        let mut inos = self.inos.lock().await;
        if inos.0 == inos.1 {
            let v = self.engine.kv_get(keys::NEXT_INO).await?;
            let next = decode_ino(ROOT_INO, v.as_deref().unwrap_or_default())?;
            let end = next + INO_RESERVE_COUNT;
            let mut txn = Txn::new();
            txn.expect(
                keys::NEXT_INO.to_vec(),
                Expect::Value(next.to_be_bytes().to_vec()),
            )
            .put(keys::NEXT_INO.to_vec(), end.to_be_bytes().to_vec());
            self.engine.commit(&txn).await?;
            *inos = (next, end);
        }
        inos.0 += 1;
        Ok(inos.0 - 1)
    }

    /// Deletes the inodes that were unlinked while open when the last writer stopped.
    async fn delete_orphans(&self) -> Result<(), FsError> {
        let orphans = self.engine.kv_scan(keys::ORPHAN_PREFIX).await?;
        for (k, _) in &orphans {
            let ino = keys::ino_of(k)
                .ok_or_else(|| FsError::Damaged(ROOT_INO, "an orphan key is short".into()))?;
            self.delete_if_unlinked(ino).await?;
        }
        if !orphans.is_empty() {
            tracing::info!(
                count = orphans.len(),
                "deleted files unlinked while open before the last stop"
            );
            self.engine.flush().await?;
        }
        Ok(())
    }

    /// Deletes the inode if no name and no open handle refers to it any more.
    async fn delete_if_unlinked(&self, ino: u64) -> Result<(), FsError> {
        let _held = self.locks.lock(&[ino]).await;
        if self.open_files.lock().contains_key(&ino) {
            return Ok(());
        }
        let mut c = Change::new(self);
        match c.inode(ino).await {
            Ok(i) if i.nlink > 0 => c.set_value(keys::orphan(ino), None),
            Ok(_) | Err(FsError::NotFound(_)) => c.delete_inode(ino),
            Err(e) => return Err(e),
        }
        c.commit().await
    }

    /// Limits the bytes files may allocate (`[filesystem] quota_bytes`); None: no limit.
    pub fn set_quota(&self, quota_bytes: Option<u64>) {
        self.quota_bytes
            .store(quota_bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn quota(&self) -> Option<u64> {
        Some(self.quota_bytes.load(Ordering::Relaxed)).filter(|&q| q != u64::MAX)
    }

    /// Refuses with `NoSpace` a change that would allocate `new_bytes` beyond the quota. The
    /// measure counts data not yet uploaded and frees deleted extents only once their deletion
    /// is uploaded, so before refusing it flushes and looks again: a delete makes room at once.
    async fn check_quota(&self, new_bytes: u64) -> Result<(), FsError> {
        let Some(q) = self.quota().filter(|_| new_bytes > 0) else {
            return Ok(());
        };
        if self.engine.allocated_bytes() + new_bytes <= q {
            return Ok(());
        }
        self.engine.flush().await?;
        if self.engine.allocated_bytes() + new_bytes > q {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    /// Sizes for statfs: data bytes in use are the allocated extents (whole 8 KiB extents,
    /// before compression), against the quota or, without one, a nominal 1 PiB. Inode counts
    /// are not limited.
    pub fn statfs(&self) -> StatFs {
        let used = self.engine.allocated_bytes();
        let total = self.quota().unwrap_or(UNLIMITED_BYTES).max(used);
        StatFs {
            blocks: total / STATFS_BLOCK_BYTES,
            blocks_free: (total - used) / STATFS_BLOCK_BYTES,
            files: u64::MAX >> 1,
            files_free: u64::MAX >> 1,
        }
    }

    /// The flush barrier: every earlier change, from any client, is durable when this returns.
    pub async fn sync(&self) -> Result<(), FsError> {
        Ok(self.engine.flush().await?)
    }
}

#[cfg(test)]
mod tests;
