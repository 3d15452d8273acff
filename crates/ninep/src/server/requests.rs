//! Each 9P2000.L request mapped onto the filesystem core, and the encodings its replies need.

use super::*;

/// Linux open flags as 9P2000.L carries them.
const O_ACCMODE: u32 = 3;
const O_WRONLY: u32 = 1;
const O_RDWR: u32 = 2;
const O_TRUNC: u32 = 0o1000;
const O_APPEND: u32 = 0o2000;
const AT_REMOVEDIR: u32 = 0x200;
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;
/// statfs's f_type for v9fs.
const V9FS_MAGIC: u32 = 0x0102_1997;
/// What getattr answers: every basic field, btime and gen.
const GETATTR_VALID: u64 = 0x0000_17ff;
/// Preferred I/O size reported by getattr, and iounit of opened files (0: msize decides).
const BLOCK_SIZE_BYTES: u64 = 4096;

impl Connection {
    pub(super) async fn handle(&self, tag: u16, kind: u8, request: Request) -> Answer {
        let mut r = Reply::new(kind + 1, tag);
        match request {
            Request::Version { .. } | Request::Flush { .. } => unreachable!("handled inline"),
            // ENOENT is how 9P2000.L servers say "no authentication: attach without an afid"
            // (diod's client library reads it so).
            Request::Auth { .. } => {
                return Err(FsError::NotFound("an authentication scheme".into()))
            }
            Request::Attach {
                fid,
                uname,
                aname,
                n_uname,
                ..
            } => {
                let n_uname = (n_uname != wire::P9_NONUNAME).then_some(n_uname);
                let caller = crate::users::caller(&uname, n_uname).ok_or(FsError::NotPermitted)?;
                let caller = Arc::new(caller);
                let mut ino = bucketfs_fs::ROOT_INO;
                let mut parent = None;
                for name in aname.split(|&b| b == b'/').filter(|n| !n.is_empty()) {
                    let found = self.fs().lookup(&caller, ino, name).await?;
                    parent = Some((ino, name.to_vec()));
                    ino = found.ino;
                }
                let inode = self.fs().getattr(ino).await?;
                if self.fids.lock().contains_key(&fid) {
                    return Err(einval("fid in use"));
                }
                self.insert_fid(
                    fid,
                    Fid {
                        ino,
                        caller,
                        parent,
                        open: None,
                        xattr: None,
                    },
                )?;
                r.qid(qid(&inode));
            }
            Request::Walk { fid, newfid, names } => {
                // Plan 9 forbids walking from an open fid; diod allows it and its clients rely
                // on it (diodls -l walks from the directory it reads), so this server does too.
                let from = self.fid(fid)?;
                if from.xattr.is_some() {
                    return Err(einval("walk from an xattr fid"));
                }
                if newfid != fid && self.fids.lock().contains_key(&newfid) {
                    return Err(einval("newfid in use"));
                }
                let mut ino = from.ino;
                let mut parent = from.parent.clone();
                let mut qids = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    match self.fs().lookup(&from.caller, ino, name).await {
                        Ok(found) => {
                            qids.push(qid(&found));
                            parent = match name.as_slice() {
                                b"." => parent,
                                b".." => None,
                                _ => Some((ino, name.clone())),
                            };
                            ino = found.ino;
                        }
                        Err(e) if i == 0 => return Err(e),
                        Err(_) => break,
                    }
                }
                if qids.len() == names.len() {
                    self.insert_fid(
                        newfid,
                        Fid {
                            ino,
                            caller: from.caller.clone(),
                            parent,
                            open: None,
                            xattr: None,
                        },
                    )?;
                }
                r.u16(qids.len() as u16);
                for q in qids {
                    r.qid(q);
                }
            }
            Request::Lopen { fid, flags } => {
                let f = self.fid(fid)?;
                if f.open.is_some() {
                    return Err(einval("fid already open"));
                }
                let inode = self.fs().getattr(f.ino).await?;
                let open = self.open(&f, &inode, flags).await?;
                self.set_open(fid, f.ino, open).await?;
                r.qid(qid(&inode)).u32(0);
            }
            Request::Lcreate {
                fid,
                name,
                flags,
                mode,
                gid,
            } => {
                let f = self.fid(fid)?;
                if f.open.is_some() {
                    return Err(einval("fid already open"));
                }
                let caller = with_gid(&f.caller, gid);
                let inode = self
                    .fs()
                    .make(
                        &caller,
                        f.ino,
                        &name,
                        bucketfs_fs::S_IFREG | (mode & 0o7777),
                        0,
                    )
                    .await?;
                // The creator may write what it created, whatever the mode says.
                let access = flags & O_ACCMODE;
                let open = Open {
                    read: access != O_WRONLY,
                    write: access == O_WRONLY || access == O_RDWR,
                    append: flags & O_APPEND != 0,
                    handle: true,
                };
                self.fs().open_handle(inode.ino).await?;
                let newf = Fid {
                    ino: inode.ino,
                    caller: f.caller.clone(),
                    parent: Some((f.ino, name)),
                    open: Some(open),
                    xattr: None,
                };
                self.fids.lock().insert(fid, newf);
                r.qid(qid(&inode)).u32(0);
            }
            Request::Read { fid, offset, count } => {
                let f = self.fid(fid)?;
                let count = (count as usize).min(self.max_payload());
                if let Some(x) = &f.xattr {
                    let x = x.lock();
                    let Xattr::Reading(v) = &*x else {
                        return Err(einval("read of an xattr being written"));
                    };
                    let start = (offset as usize).min(v.len());
                    let end = (start + count).min(v.len());
                    r.u32((end - start) as u32).bytes(&v[start..end]);
                    return Ok(r);
                }
                match f.open {
                    Some(o) if o.read => {}
                    Some(_) => return Err(FsError::Access),
                    None => return Err(einval("read of an unopened fid")),
                }
                let data = self.fs().read_file(f.ino, offset, count).await?;
                r.u32(data.len() as u32).bytes(&data);
            }
            Request::Write { fid, offset, data } => {
                let f = self.fid(fid)?;
                if let Some(x) = &f.xattr {
                    let mut x = x.lock();
                    let Xattr::Writing {
                        size, data: buf, ..
                    } = &mut *x
                    else {
                        return Err(einval("write to an xattr being read"));
                    };
                    if offset != buf.len() as u64 || buf.len() + data.len() > *size as usize {
                        return Err(einval("xattr written out of order or beyond its size"));
                    }
                    buf.extend_from_slice(&data);
                    r.u32(data.len() as u32);
                    return Ok(r);
                }
                let o = match f.open {
                    Some(o) if o.write => o,
                    Some(_) => return Err(FsError::Access),
                    None => return Err(einval("write to an unopened fid")),
                };
                let n = data.len() as u32;
                self.fs()
                    .write_file(&f.caller, f.ino, offset, data, o.append)
                    .await?;
                r.u32(n);
            }
            Request::Clunk { fid } => {
                let f = self.fids.lock().remove(&fid).ok_or_else(ebadf)?;
                if f.open.is_some_and(|o| o.handle) {
                    self.fs().release_handle(f.ino).await?;
                }
                if let Some(x) = f.xattr {
                    let x = std::mem::replace(&mut *x.lock(), Xattr::Reading(Vec::new()));
                    if let Xattr::Writing {
                        name,
                        size,
                        flags,
                        data,
                    } = x
                    {
                        self.finish_xattr(&f.caller, f.ino, &name, size, flags, &data)
                            .await?;
                    }
                }
            }
            Request::Remove { fid } => {
                let f = self.fids.lock().remove(&fid).ok_or_else(ebadf)?;
                if f.open.is_some_and(|o| o.handle) {
                    self.fs().release_handle(f.ino).await?;
                }
                let (dir, name) = f.parent.ok_or_else(|| einval("remove of the root"))?;
                let inode = self.fs().getattr(f.ino).await?;
                if inode.is_dir() {
                    self.fs().rmdir(&f.caller, dir, &name).await?;
                } else {
                    self.fs().unlink(&f.caller, dir, &name).await?;
                }
            }
            Request::Statfs { fid } => {
                self.fid(fid)?;
                let s = self.fs().statfs();
                r.u32(V9FS_MAGIC)
                    .u32(BLOCK_SIZE_BYTES as u32)
                    .u64(s.blocks)
                    .u64(s.blocks_free)
                    .u64(s.blocks_free)
                    .u64(s.files)
                    .u64(s.files_free)
                    .u64(0)
                    .u32(bucketfs_fs::NAME_BYTES_MAX as u32);
            }
            Request::Symlink {
                fid,
                name,
                target,
                gid,
            } => {
                let f = self.fid(fid)?;
                let inode = self
                    .fs()
                    .symlink(&with_gid(&f.caller, gid), f.ino, &name, &target)
                    .await?;
                r.qid(qid(&inode));
            }
            Request::Mknod {
                dfid,
                name,
                mode,
                major,
                minor,
                gid,
            } => {
                let f = self.fid(dfid)?;
                let rdev = encode_dev(major, minor);
                let inode = self
                    .fs()
                    .make(&with_gid(&f.caller, gid), f.ino, &name, mode, rdev)
                    .await?;
                r.qid(qid(&inode));
            }
            Request::Mkdir {
                dfid,
                name,
                mode,
                gid,
            } => {
                let f = self.fid(dfid)?;
                let mode = bucketfs_fs::S_IFDIR | (mode & 0o7777);
                let inode = self
                    .fs()
                    .make(&with_gid(&f.caller, gid), f.ino, &name, mode, 0)
                    .await?;
                r.qid(qid(&inode));
            }
            Request::Rename { fid, dfid, name } => {
                let f = self.fid(fid)?;
                let d = self.fid(dfid)?;
                let (from_dir, from_name) = f.parent.ok_or_else(|| einval("rename of the root"))?;
                self.fs()
                    .rename(
                        &f.caller,
                        from_dir,
                        &from_name,
                        d.ino,
                        &name,
                        RenameFlags::default(),
                    )
                    .await?;
                if let Some(moved) = self.fids.lock().get_mut(&fid) {
                    moved.parent = Some((d.ino, name));
                }
            }
            Request::RenameAt {
                olddir,
                oldname,
                newdir,
                newname,
            } => {
                let from = self.fid(olddir)?;
                let to = self.fid(newdir)?;
                self.fs()
                    .rename(
                        &from.caller,
                        from.ino,
                        &oldname,
                        to.ino,
                        &newname,
                        RenameFlags::default(),
                    )
                    .await?;
            }
            Request::UnlinkAt { dfid, name, flags } => {
                let d = self.fid(dfid)?;
                if flags & AT_REMOVEDIR != 0 {
                    self.fs().rmdir(&d.caller, d.ino, &name).await?;
                } else {
                    self.fs().unlink(&d.caller, d.ino, &name).await?;
                }
            }
            Request::Link { dfid, fid, name } => {
                let d = self.fid(dfid)?;
                let f = self.fid(fid)?;
                self.fs().link(&d.caller, f.ino, d.ino, &name).await?;
            }
            Request::Readlink { fid } => {
                let f = self.fid(fid)?;
                let target = self.fs().readlink(f.ino).await?;
                r.string(&target);
            }
            Request::Getattr { fid, .. } => {
                let f = self.fid(fid)?;
                let inode = self.fs().getattr(f.ino).await?;
                getattr_reply(&mut r, &inode);
            }
            Request::Setattr(s) => {
                let f = self.fid(s.fid)?;
                let set = SetAttr {
                    through_writable_handle: f.open.is_some_and(|o| o.write),
                    ..set_attr(&s)
                };
                self.fs().setattr(&f.caller, f.ino, &set).await?;
            }
            Request::XattrWalk { fid, newfid, name } => {
                let f = self.fid(fid)?;
                if newfid != fid && self.fids.lock().contains_key(&newfid) {
                    return Err(einval("newfid in use"));
                }
                let value = if name.is_empty() {
                    let mut list = Vec::new();
                    for n in self.fs().list_xattr(&f.caller, f.ino).await? {
                        list.extend_from_slice(&n);
                        list.push(0);
                    }
                    list
                } else {
                    self.fs().get_xattr(&f.caller, f.ino, &name).await?
                };
                r.u64(value.len() as u64);
                self.insert_fid(
                    newfid,
                    Fid {
                        open: None,
                        xattr: Some(Arc::new(Mutex::new(Xattr::Reading(value)))),
                        ..f
                    },
                )?;
            }
            Request::XattrCreate {
                fid,
                name,
                size,
                flags,
            } => {
                self.fid(fid)?;
                if size > bucketfs_fs::XATTR_VALUE_BYTES_MAX as u64 {
                    return Err(FsError::TooLarge(size));
                }
                if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
                    return Err(einval("xattr flags"));
                }
                let state = Xattr::Writing {
                    name,
                    size,
                    flags,
                    data: Vec::new(),
                };
                let mut fids = self.fids.lock();
                let entry = fids.get_mut(&fid).ok_or_else(ebadf)?;
                entry.xattr = Some(Arc::new(Mutex::new(state)));
            }
            Request::Readdir { fid, offset, count } => {
                let f = self.fid(fid)?;
                if f.open.is_none() {
                    return Err(einval("readdir of an unopened fid"));
                }
                let room = (count as usize).min(self.max_payload());
                let data = self.readdir(&f, offset, room).await?;
                r.u32(data.len() as u32).bytes(&data);
            }
            Request::Fsync { fid, .. } => {
                let f = self.fid(fid)?;
                self.fs().fsync(f.ino).await?;
            }
            Request::Lock(l) => {
                let f = self.fid(l.fid)?;
                let status = self.lock(&f, &l);
                r.u8(status);
            }
            Request::GetLock(l) => {
                let f = self.fid(l.fid)?;
                let owner = self.owner(&l);
                let end = record_locks::range_end(l.start, l.length);
                match self
                    .server
                    .locks
                    .conflict(f.ino, &owner, l.kind, l.start, end)
                {
                    Some(h) => {
                        let length = if h.end == u64::MAX {
                            0
                        } else {
                            h.end - h.start
                        };
                        r.u8(h.kind)
                            .u64(h.start)
                            .u64(length)
                            .u32(h.owner.proc_id)
                            .string(&h.owner.client_id);
                    }
                    None => {
                        r.u8(record_locks::LOCK_UNLOCK)
                            .u64(l.start)
                            .u64(l.length)
                            .u32(l.proc_id)
                            .string(&l.client_id);
                    }
                }
            }
        }
        Ok(r)
    }

    /// Checks an open's access against the inode and applies O_TRUNC.
    async fn open(&self, f: &Fid, inode: &Inode, flags: u32) -> Result<Open, FsError> {
        let access = flags & O_ACCMODE;
        let read = access != O_WRONLY;
        let write = access == O_WRONLY || access == O_RDWR;
        if inode.is_dir() && write {
            return Err(FsError::IsDir);
        }
        let want = if read { MAY_READ } else { 0 } | if write { MAY_WRITE } else { 0 };
        f.caller.check(inode, want)?;
        if write && flags & O_TRUNC != 0 && inode.kind() == Kind::File {
            let set = SetAttr {
                size_bytes: Some(0),
                ..SetAttr::default()
            };
            self.fs().setattr(&f.caller, f.ino, &set).await?;
        }
        Ok(Open {
            read,
            write,
            append: flags & O_APPEND != 0,
            handle: inode.kind() == Kind::File,
        })
    }

    async fn set_open(&self, fid: u32, ino: u64, open: Open) -> Result<(), FsError> {
        if open.handle {
            self.fs().open_handle(ino).await?;
        }
        // No await between counting the handle and recording it: a cancel cannot leak it.
        match self.fids.lock().get_mut(&fid) {
            Some(f) => {
                f.open = Some(open);
                Ok(())
            }
            None => Err(ebadf()),
        }
    }

    async fn finish_xattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &[u8],
        size: u64,
        flags: u32,
        data: &[u8],
    ) -> Result<(), FsError> {
        if data.len() as u64 != size {
            return Err(einval("xattr shorter than announced"));
        }
        // v9fs removes an attribute as a replace with no value.
        if size == 0 && flags == XATTR_REPLACE {
            return self
                .fs()
                .set_xattr(caller, ino, name, None, XattrMode::Any)
                .await;
        }
        let mode = match flags {
            XATTR_CREATE => XattrMode::Create,
            XATTR_REPLACE => XattrMode::Replace,
            _ => XattrMode::Any,
        };
        self.fs()
            .set_xattr(caller, ino, name, Some(data), mode)
            .await
    }

    /// Directory entries after `offset` that fit `room` bytes, whole cookie groups only.
    async fn readdir(&self, f: &Fid, offset: u64, room: usize) -> Result<Vec<u8>, FsError> {
        let mut out = Vec::new();
        let mut after = offset;
        loop {
            let page = self
                .fs()
                .readdir(&f.caller, f.ino, after, READDIR_ENTRIES_PER_PAGE)
                .await?;
            if page.is_empty() {
                return Ok(out);
            }
            let mut i = 0;
            while i < page.len() {
                // Entries sharing a cookie go together: a resume after it skips them all.
                let cookie = page[i].cookie;
                let group_end = page[i..]
                    .iter()
                    .position(|e| e.cookie != cookie)
                    .map_or(page.len(), |n| i + n);
                let mut bytes = Vec::new();
                for e in &page[i..group_end] {
                    let q = Qid {
                        kind: qid_kind(e.kind),
                        version: 0,
                        path: e.ino,
                    };
                    bytes.push(q.kind);
                    bytes.extend_from_slice(&q.version.to_le_bytes());
                    bytes.extend_from_slice(&q.path.to_le_bytes());
                    bytes.extend_from_slice(&e.cookie.to_le_bytes());
                    bytes.push(e.kind.dirent_type());
                    bytes.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
                    bytes.extend_from_slice(&e.name);
                }
                if out.len() + bytes.len() > room {
                    if out.is_empty() {
                        return Err(einval("readdir count too small for one entry"));
                    }
                    return Ok(out);
                }
                out.extend_from_slice(&bytes);
                after = cookie;
                i = group_end;
            }
        }
    }

    fn owner(&self, l: &LockRequest) -> Owner {
        Owner {
            connection: self.id,
            client_id: l.client_id.clone(),
            proc_id: l.proc_id,
        }
    }

    /// Rlock's status: 0 granted, 1 blocked (the client retries a blocking request), 2 error.
    fn lock(&self, f: &Fid, l: &LockRequest) -> u8 {
        let known = [
            record_locks::LOCK_READ,
            record_locks::LOCK_WRITE,
            record_locks::LOCK_UNLOCK,
        ];
        if !known.contains(&l.kind) {
            return 2;
        }
        let end = record_locks::range_end(l.start, l.length);
        match self
            .server
            .locks
            .set(f.ino, &self.owner(l), l.kind, l.start, end)
        {
            true => 0,
            false => 1,
        }
    }
}

fn with_gid(caller: &Caller, gid: u32) -> Caller {
    let mut c = caller.clone();
    if gid != u32::MAX && (c.is_root() || c.in_group(gid)) {
        c.gid = gid;
    }
    c
}

fn qid_kind(kind: Kind) -> u8 {
    match kind {
        Kind::Directory => wire::QT_DIR,
        Kind::Symlink => wire::QT_SYMLINK,
        _ => wire::QT_FILE,
    }
}

fn qid(inode: &Inode) -> Qid {
    Qid {
        kind: qid_kind(inode.kind()),
        version: 0,
        path: inode.ino,
    }
}

/// Linux's 32-bit device number encoding, which v9fs decodes (new_decode_dev).
fn encode_dev(major: u32, minor: u32) -> u64 {
    u64::from((minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12))
}

fn getattr_reply(r: &mut Reply, i: &Inode) {
    let blocks = i.size_bytes.div_ceil(512);
    r.u64(GETATTR_VALID)
        .qid(qid(i))
        .u32(i.mode)
        .u32(i.uid)
        .u32(i.gid)
        .u64(u64::from(i.nlink))
        .u64(i.rdev)
        .u64(i.size_bytes)
        .u64(BLOCK_SIZE_BYTES)
        .u64(blocks);
    for t in [i.atime, i.mtime, i.ctime, i.btime] {
        r.u64(t.sec as u64).u64(u64::from(t.nsec));
    }
    r.u64(i.generation).u64(0);
}

const SETATTR_MODE: u32 = 0x1;
const SETATTR_UID: u32 = 0x2;
const SETATTR_GID: u32 = 0x4;
const SETATTR_SIZE: u32 = 0x8;
const SETATTR_ATIME: u32 = 0x10;
const SETATTR_MTIME: u32 = 0x20;
const SETATTR_ATIME_SET: u32 = 0x80;
const SETATTR_MTIME_SET: u32 = 0x100;

fn set_attr(s: &SetattrRequest) -> SetAttr {
    let time = |set: bool, (sec, nsec): (u64, u64)| {
        set.then_some(Time {
            sec: sec as i64,
            nsec: nsec.min(999_999_999) as u32,
        })
    };
    let v = s.valid;
    SetAttr {
        mode: (v & SETATTR_MODE != 0).then_some(s.mode),
        uid: (v & SETATTR_UID != 0).then_some(s.uid),
        gid: (v & SETATTR_GID != 0).then_some(s.gid),
        size_bytes: (v & SETATTR_SIZE != 0).then_some(s.size),
        atime: (v & SETATTR_ATIME != 0).then(|| time(v & SETATTR_ATIME_SET != 0, s.atime)),
        mtime: (v & SETATTR_MTIME != 0).then(|| time(v & SETATTR_MTIME_SET != 0, s.mtime)),
        through_writable_handle: false,
    }
}
