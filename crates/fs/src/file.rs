//! Files' contents and attributes: read, write, setattr (truncate both ways, chmod, chown,
//! times), open handles and what unlinked open files keep, readlink, fallocate, SEEK_DATA
//! and SEEK_HOLE, fsync.

use crate::change::Change;
use crate::inode::{Inode, Kind, Time, S_IFMT, S_ISGID, S_ISUID};
use crate::perm::{Caller, MAY_WRITE};
use crate::{keys, Fs, FsError, FILE_SIZE_BYTES_MAX};
use bucketfs_engine::limits::EXTENT_SIZE_BYTES_U64;
use bytes::Bytes;

/// What a setattr changes; `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size_bytes: Option<u64>,
    /// `Some(None)`: the current time.
    pub atime: Option<Option<Time>>,
    pub mtime: Option<Option<Time>>,
    /// The request comes through a handle open for writing, whose open checked the write
    /// permission a size change needs (ftruncate after a chmod to 0 still works).
    pub through_writable_handle: bool,
}

impl Fs {
    /// Counts an open handle of `ino`: an unlinked inode keeps its data until the last one is
    /// released.
    pub async fn open_handle(&self, ino: u64) -> Result<Inode, FsError> {
        let _held = self.locks.lock(&[ino]).await;
        let inode = self.getattr(ino).await?;
        *self.open_files.lock().entry(ino).or_default() += 1;
        Ok(inode)
    }

    /// Releases an open handle; the last one of an unlinked inode deletes it.
    pub async fn release_handle(&self, ino: u64) -> Result<(), FsError> {
        let last = {
            let mut open = self.open_files.lock();
            match open.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    open.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if last && self.getattr(ino).await.is_ok_and(|i| i.nlink == 0) {
            self.delete_if_unlinked(ino).await?;
        }
        Ok(())
    }

    /// Up to `length` bytes at `offset`; fewer at the end of the file, none beyond it.
    pub async fn read_file(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Vec<u8>, FsError> {
        match self.readable(ino, offset, length).await? {
            0 => Ok(Vec::new()),
            n => Ok(self.engine.read(ino, offset, n).await?),
        }
    }

    /// `read_file`'s bytes as pieces in order (the engine's `read_pieces`), for a reply that
    /// is written with `writev`.
    pub async fn read_file_pieces(
        &self,
        ino: u64,
        offset: u64,
        length: usize,
    ) -> Result<Vec<Bytes>, FsError> {
        match self.readable(ino, offset, length).await? {
            0 => Ok(Vec::new()),
            n => Ok(self.engine.read_pieces(ino, offset, n).await?),
        }
    }

    /// How many of `length` bytes at `offset` of file `ino` there are to read.
    async fn readable(&self, ino: u64, offset: u64, length: usize) -> Result<usize, FsError> {
        let inode = self.getattr(ino).await?;
        check_file(&inode)?;
        let end = offset.saturating_add(length as u64).min(inode.size_bytes);
        Ok(end.saturating_sub(offset) as usize)
    }

    /// Writes `data` at `offset` (at the end of the file when `append`), growing the file if
    /// it ends beyond it; answers the inode after the write. Data and the new size and times
    /// are one transaction: after a crash the file has both or neither.
    pub async fn write_file(
        &self,
        caller: &Caller,
        ino: u64,
        offset: u64,
        data: impl Into<Vec<u8>>,
        append: bool,
    ) -> Result<Inode, FsError> {
        // Owned data (a 9P write's buffer) moves into the change without a copy.
        let data: Vec<u8> = data.into();
        let _held = self.locks.lock(&[ino]).await;
        let mut c = Change::new(self);
        let mut inode = c.inode(ino).await?;
        check_file(&inode)?;
        let offset = if append { inode.size_bytes } else { offset };
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= FILE_SIZE_BYTES_MAX)
            .ok_or(FsError::TooLarge(offset.saturating_add(data.len() as u64)))?;
        self.check_quota(
            self.unallocated_bytes(ino, offset, data.len() as u64)
                .await?,
        )
        .await?;
        inode.size_bytes = inode.size_bytes.max(end);
        let now = Time::now();
        inode.mtime = now;
        inode.ctime = now;
        // A write takes away set-user-ID, and set-group-ID where it means that (group
        // execute set), as Linux does for writers without CAP_FSETID: all but root.
        if !caller.is_root() {
            inode.mode &= !S_ISUID;
            if inode.mode & 0o010 != 0 {
                inode.mode &= !S_ISGID;
            }
        }
        if !data.is_empty() {
            c.write(ino, offset, data);
        }
        c.put_inode(&inode);
        c.commit().await?;
        self.note_size(ino, inode.size_bytes);
        Ok(inode)
    }

    pub async fn setattr(
        &self,
        caller: &Caller,
        ino: u64,
        set: &SetAttr,
    ) -> Result<Inode, FsError> {
        let _held = self.locks.lock(&[ino]).await;
        let mut c = Change::new(self);
        let mut inode = c.inode(ino).await?;
        let now = Time::now();
        if let Some(mode) = set.mode {
            let mut mode = mode & 0o7777;
            // Whoever may write takes set-user-ID and set-group-ID away as Linux's writes and
            // truncates by non-root callers do (a FUSE or v9fs client sends that as a mode).
            if drops_only_set_id(inode.mode & 0o7777, mode) {
                caller
                    .check(&inode, MAY_WRITE)
                    .or(caller.check_owner(&inode))?;
            } else {
                caller.check_owner(&inode)?;
            }
            // Only root, or a member of the file's group, may keep set-group-ID.
            if !caller.is_root() && !caller.in_group(inode.gid) {
                mode &= !S_ISGID;
            }
            inode.mode = (inode.mode & S_IFMT) | mode;
            if let Some(acl) = &mut inode.acl {
                acl.set_mode_bits(mode);
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid = set.uid.unwrap_or(inode.uid);
            let gid = set.gid.unwrap_or(inode.gid);
            if !caller.is_root() {
                // Non-root may only give the file to a group it belongs to, and keep its owner.
                if uid != inode.uid || caller.uid != inode.uid {
                    return Err(FsError::NotPermitted);
                }
                if gid != inode.gid && !caller.in_group(gid) {
                    return Err(FsError::NotPermitted);
                }
            }
            if !inode.is_dir() && (uid != inode.uid || gid != inode.gid || !caller.is_root()) {
                inode.mode &= !S_ISUID;
                if inode.mode & 0o010 != 0 {
                    inode.mode &= !S_ISGID;
                }
            }
            inode.uid = uid;
            inode.gid = gid;
        }
        // Times: explicit ones need ownership; "now" also whoever may write.
        let times = [set.atime, set.mtime];
        let owner = caller.check_owner(&inode).is_ok();
        if times.iter().any(|t| matches!(t, Some(Some(_)))) && !owner {
            return Err(FsError::NotPermitted);
        }
        if times.iter().any(|t| matches!(t, Some(None))) && !owner {
            caller.check(&inode, MAY_WRITE)?;
        }
        if let Some(t) = set.atime {
            inode.atime = t.unwrap_or(now);
        }
        if let Some(t) = set.mtime {
            inode.mtime = t.unwrap_or(now);
        }
        if let Some(size) = set.size_bytes {
            check_file(&inode)?;
            if !set.through_writable_handle {
                caller.check(&inode, MAY_WRITE)?;
            }
            if size > FILE_SIZE_BYTES_MAX {
                return Err(FsError::TooLarge(size));
            }
            if size < inode.size_bytes {
                cut(&mut c, ino, size);
            }
            if size != inode.size_bytes {
                inode.size_bytes = size;
                inode.mtime = now;
            }
        }
        inode.ctime = now;
        c.put_inode(&inode);
        c.commit().await?;
        self.note_size(ino, inode.size_bytes);
        Ok(inode)
    }

    pub async fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let inode = self.getattr(ino).await?;
        if inode.kind() != Kind::Symlink {
            return Err(FsError::Invalid("not a symlink".into()));
        }
        Ok(inode.target)
    }

    /// fallocate: reserves nothing (the bucket has no blocks to reserve) but grows the file to
    /// `offset + length` unless `keep_size`; with `punch_hole` the range reads as zeroes and
    /// whole extents in it are deallocated.
    pub async fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        keep_size: bool,
        punch_hole: bool,
    ) -> Result<Inode, FsError> {
        if length == 0 {
            return Err(FsError::Invalid("fallocate of 0 bytes".into()));
        }
        if punch_hole && !keep_size {
            return Err(FsError::NotSupported(
                "punching a hole must keep the size".into(),
            ));
        }
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= FILE_SIZE_BYTES_MAX)
            .ok_or(FsError::TooLarge(offset.saturating_add(length)))?;
        let _held = self.locks.lock(&[ino]).await;
        let mut c = Change::new(self);
        let mut inode = c.inode(ino).await?;
        check_file(&inode)?;
        let now = Time::now();
        if punch_hole {
            let to = end.min(inode.size_bytes);
            if to > offset {
                c.zero(ino, offset, to - offset);
            }
        } else if !keep_size && end > inode.size_bytes {
            inode.size_bytes = end;
        }
        inode.mtime = now;
        inode.ctime = now;
        c.put_inode(&inode);
        c.commit().await?;
        self.note_size(ino, inode.size_bytes);
        Ok(inode)
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `offset`: the first byte at or after it that is
    /// data (allocated extent) or hole; the end of the file counts as a hole. `None` where
    /// lseek answers ENXIO.
    pub async fn seek(&self, ino: u64, offset: u64, data: bool) -> Result<Option<u64>, FsError> {
        let inode = self.getattr(ino).await?;
        check_file(&inode)?;
        let size = inode.size_bytes;
        if offset >= size {
            return Ok(None);
        }
        let mut at = offset;
        for (length, allocated) in self.engine.allocation(ino, offset, size - offset).await? {
            if allocated == data {
                return Ok(Some(at));
            }
            at += length;
        }
        Ok(if data { None } else { Some(size) })
    }

    /// fsync of a file: a scoped barrier (engine/scoped.rs), which makes durable every earlier
    /// change to the file, and, when one of those changed other inodes too (a create, a rename,
    /// a link), everything before it. fsync of a directory is the full barrier, which covers
    /// its entries and everything else written before it: `sync DIR` is how a client makes a
    /// whole tree durable, as syncfs does not reach the server (docs/0006, "Durability").
    pub async fn fsync(&self, ino: u64) -> Result<(), FsError> {
        if self.getattr(ino).await?.is_dir() {
            return self.sync().await;
        }
        let scope = bucketfs_engine::Scope {
            ino,
            key_ranges: keys::scope_ranges(ino),
        };
        Ok(self.engine.scoped_flush(&scope).await?)
    }

    /// Bytes of `offset..offset+length` in extents not yet allocated: what writing it adds to
    /// the space in use.
    async fn unallocated_bytes(&self, ino: u64, offset: u64, length: u64) -> Result<u64, FsError> {
        if self.quota().is_none() || length == 0 {
            return Ok(0);
        }
        let extent = EXTENT_SIZE_BYTES_U64;
        let (start, end) = (
            offset / extent * extent,
            (offset + length).div_ceil(extent) * extent,
        );
        Ok(self
            .engine
            .allocation(ino, start, end - start)
            .await?
            .into_iter()
            .filter(|&(_, allocated)| !allocated)
            .map(|(n, _)| n)
            .sum())
    }

    /// Block devices keep their sizes in memory for the NBD path.
    pub(crate) fn note_size(&self, ino: u64, size: u64) {
        if let Some(s) = self.sizes.write().get_mut(&ino) {
            *s = size;
        }
    }
}

/// A truncation to `size` within a change: the tail of the last extent reads as zeroes, and
/// every extent beyond is dropped in one range deletion.
pub(crate) fn cut(c: &mut Change<'_>, ino: u64, size: u64) {
    let tail_end = size.div_ceil(EXTENT_SIZE_BYTES_U64) * EXTENT_SIZE_BYTES_U64;
    c.zero(ino, size, tail_end - size);
    c.drop_extents(ino, size.div_ceil(EXTENT_SIZE_BYTES_U64));
}

fn check_file(inode: &Inode) -> Result<(), FsError> {
    match inode.kind() {
        Kind::File => Ok(()),
        Kind::Directory => Err(FsError::IsDir),
        _ => Err(FsError::Invalid("not a regular file".into())),
    }
}

/// Whether `new` is `old` (permission bits) less set-user-ID or set-group-ID, and nothing else.
fn drops_only_set_id(old: u32, new: u32) -> bool {
    new != old && new & !old == 0 && (old & !new) & !(S_ISUID | S_ISGID) == 0
}
