//! The FUSE operations of `bucketfs mount`, each as 9P requests on the caller's fids.

use super::replies::Sent;
use super::*;

fn gid_of(req: &Request<'_>) -> u32 {
    req.gid()
}

/// A time as 9P's (seconds, nanoseconds): seconds are signed (two's complement in the u64),
/// nanoseconds always forward, so 1969-12-31 23:59:59.5 is (-1, 500000000).
fn time_of(t: TimeOrNow) -> Option<(u64, u64)> {
    match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(t) => Some(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs(), u64::from(d.subsec_nanos())),
            Err(before) => {
                let d = before.duration();
                let (secs, nanos) = (d.as_secs() as i64, d.subsec_nanos());
                if nanos == 0 {
                    ((-secs) as u64, 0)
                } else {
                    ((-secs - 1) as u64, u64::from(1_000_000_000 - nanos))
                }
            }
        }),
    }
}

impl Filesystem for Mount {
    /// Record locks go to the server (locks.rs) rather than staying in this kernel. POSIX
    /// ACLs are the server's attributes, which the kernel then also checks (it turns on
    /// default_permissions) and caches as long as attributes; the umask is left to us
    /// (`Mount::create_mode`), since a directory's default ACL replaces it.
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        if config
            .add_capabilities(fuser::consts::FUSE_POSIX_LOCKS)
            .is_err()
        {
            tracing::warn!(
                "this kernel keeps record locks to itself: other mounts will not see them"
            );
        }
        if config
            .add_capabilities(fuser::consts::FUSE_POSIX_ACL | fuser::consts::FUSE_DONT_MASK)
            .is_err()
        {
            tracing::warn!(
                "this kernel does not take POSIX ACLs from FUSE: the server still enforces them, \
                 but the umask applies under default ACLs too"
            );
        }
        Ok(())
    }

    fn lookup(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let parent = self.to_server(parent);
        match self.lookup_as(req.uid(), parent, name.as_bytes()) {
            Ok(a) => reply.entry(&self.cache.ttl(), &a, 0),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        let ino = self.to_server(ino);
        let gone = match self.nodes.get_mut(&ino) {
            Some(n) => {
                n.lookups = n.lookups.saturating_sub(nlookup);
                n.lookups == 0
            }
            None => false,
        };
        if gone && ino != self.root {
            self.nodes.remove(&ino);
            let fids: Vec<u32> = self
                .fids
                .iter()
                .filter(|((_, i), _)| *i == ino)
                .map(|(_, &f)| f)
                .collect();
            self.fids.retain(|(_, i), _| *i != ino);
            for f in fids {
                let _ = self.call(|c| c.clunk(f));
            }
        }
    }

    fn getattr(&mut self, req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let ino = self.to_server(ino);
        match self.getattr_as(req.uid(), ino) {
            Ok(a) => reply.attr(&self.cache.ttl(), &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let ino = self.to_server(ino);
        let mut s = SetAttr::default();
        if let Some(m) = mode {
            s.valid |= 0x1;
            s.mode = m;
        }
        if let Some(u) = uid {
            s.valid |= 0x2;
            s.uid = u;
        }
        if let Some(g) = gid {
            s.valid |= 0x4;
            s.gid = g;
        }
        if let Some(sz) = size {
            s.valid |= 0x8;
            s.size = sz;
            self.write_errors
                .lock()
                .expect("write errors lock")
                .wrote(ino);
        }
        if let Some(t) = atime {
            s.valid |= 0x10;
            if let Some(t) = time_of(t) {
                s.valid |= 0x80;
                s.atime = t;
            }
        }
        if let Some(t) = mtime {
            s.valid |= 0x20;
            if let Some(t) = time_of(t) {
                s.valid |= 0x100;
                s.mtime = t;
            }
        }
        let uid = req.uid();
        // Through the open file when there is one (ftruncate, fchmod): a descriptor open for
        // writing may truncate whatever the mode says now.
        let fid = match fh {
            Some(fh) if self.handles.contains_key(&fh) => self.handle_fid(fh),
            _ => self.fid(uid, ino),
        };
        let r = fid
            .and_then(|f| self.call(|c| c.setattr(f, &s)))
            .and_then(|()| self.getattr_as(uid, ino));
        match r {
            Ok(a) => reply.attr(&self.cache.ttl(), &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&mut self, req: &Request<'_>, ino: u64, reply: ReplyData) {
        let ino = self.to_server(ino);
        let r = self
            .fid(req.uid(), ino)
            .and_then(|f| self.call(|c| c.readlink(f)));
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let parent = self.to_server(parent);
        let (uid, gid, name) = (req.uid(), gid_of(req), name.as_bytes());
        let (major, minor) = (libc::major(rdev.into()), libc::minor(rdev.into()));
        let r = self
            .fid(uid, parent)
            .and_then(|d| {
                let mode = self.create_mode(parent, d, mode, umask);
                self.call(|c| c.mknod(d, name, mode, major, minor, gid))
            })
            .and_then(|_| self.lookup_as(uid, parent, name));
        match r {
            Ok(a) => reply.entry(&self.cache.ttl(), &a, 0),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let parent = self.to_server(parent);
        let (uid, gid, name) = (req.uid(), gid_of(req), name.as_bytes());
        let r = self
            .fid(uid, parent)
            .and_then(|d| {
                let mode = self.create_mode(parent, d, mode, umask);
                self.call(|c| c.mkdir(d, name, mode, gid))
            })
            .and_then(|_| self.lookup_as(uid, parent, name));
        match r {
            Ok(a) => reply.entry(&self.cache.ttl(), &a, 0),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.to_server(parent);
        match self.remove_as(req.uid(), parent, name.as_bytes(), 0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let parent = self.to_server(parent);
        match self.remove_as(req.uid(), parent, name.as_bytes(), AT_REMOVEDIR) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let parent = self.to_server(parent);
        let (uid, gid, name) = (req.uid(), gid_of(req), link_name.as_bytes());
        let target = target.as_os_str().as_bytes();
        let r = self
            .fid(uid, parent)
            .and_then(|d| self.call(|c| c.symlink(d, name, target, gid)))
            .and_then(|_| self.lookup_as(uid, parent, name));
        match r {
            Ok(a) => reply.entry(&self.cache.ttl(), &a, 0),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        // 9P2000.L's renameat carries no flags: RENAME_NOREPLACE and RENAME_EXCHANGE cannot
        // be asked of the server, and faking them here would not be atomic.
        if flags != 0 {
            return reply.error(libc::EINVAL);
        }
        let (parent, newparent) = (self.to_server(parent), self.to_server(newparent));
        let uid = req.uid();
        let r = self.fid(uid, parent).and_then(|d| {
            let nd = self.fid(uid, newparent)?;
            match self.call(|c| c.renameat(d, name.as_bytes(), nd, newname.as_bytes())) {
                // Servers without renameat (diod) take the older Trename of a walked fid.
                Err(libc::EOPNOTSUPP) => {
                    let (f, _) = self.call(|c| c.walk(d, &[name.as_bytes()]))?;
                    let r = self.call(|c| c.rename(f, nd, newname.as_bytes()));
                    let _ = self.call(|c| c.clunk(f));
                    r
                }
                r => r,
            }
        });
        match r {
            Ok(()) => {
                self.moved(parent, name.as_bytes(), newparent, newname.as_bytes());
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        newparent: u64,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (ino, newparent) = (self.to_server(ino), self.to_server(newparent));
        let uid = req.uid();
        let r = self.fid(uid, newparent).and_then(|d| {
            let f = self.fid(uid, ino)?;
            self.call(|c| c.link(d, f, newname.as_bytes()))?;
            self.lookup_as(uid, newparent, newname.as_bytes())
        });
        match r {
            Ok(a) => reply.entry(&self.cache.ttl(), &a, 0),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let ino = self.to_server(ino);
        match self.open_as(req.uid(), ino, (flags & OPEN_FLAGS_PASSED) as u32) {
            Ok(fh) => reply.opened(fh, self.cache.open_flags()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let (c, f) = match self.io_fid(fh) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        self.workers.run(move || {
            let mut out = Vec::with_capacity(size as usize);
            while out.len() < size as usize {
                let at = offset as u64 + out.len() as u64;
                match c.read(f, at, size - out.len() as u32) {
                    Ok(chunk) if chunk.is_empty() => break,
                    Ok(chunk) => out.extend_from_slice(&chunk),
                    Err(e) => return reply.error(e),
                }
            }
            reply.data(&out)
        });
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        self.writing(fh);
        let (c, f) = match self.io_fid(fh) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let job = replies::WriteJob {
            client: c,
            fid: f,
            offset: offset as u64,
            data: data.into(),
            done: 0,
            reply,
            workers: self.workers.clone(),
        };
        let job = if data.len() <= replies::INLINE_WRITE_BYTES_MAX {
            match job.try_send() {
                Ok(()) => return,
                Err(job) => job,
            }
        } else {
            job
        };
        self.workers.run(move || job.send());
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, fh: u64, owner: u64, reply: ReplyEmpty) {
        self.unlock_all(ino, fh, owner);
        reply.ok();
    }

    fn getlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        match self.get_lock(ino, fh, lock_owner, (start, end, typ, pid)) {
            Ok((start, end, typ, pid)) => reply.locked(start, end, typ, pid),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        lock_owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.set_lock(ino, fh, lock_owner, (start, end, typ, pid), sleep, reply);
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_handle(fh);
        reply.ok();
    }

    /// A write lost since this descriptor last looked fails the fsync (write_errors.rs).
    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, datasync: bool, reply: ReplyEmpty) {
        let errors = self.write_errors.clone();
        let (c, f) = match self.io_fid(fh) {
            Ok(x) => x,
            Err(e) => {
                let r = errors
                    .lock()
                    .expect("write errors lock")
                    .fsynced(fh, Err(e));
                return reply.error(r.expect_err("an error stays one"));
            }
        };
        let job = replies::FsyncJob {
            client: c,
            fid: f,
            datasync,
            fh,
            errors,
            reply,
        };
        if let Err(job) = job.try_send() {
            self.workers.run(move || job.send());
        }
    }

    fn opendir(&mut self, req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let ino = self.to_server(ino);
        match self.open_as(req.uid(), ino, libc::O_RDONLY as u32) {
            Ok(fh) => reply.opened(fh, 0),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let mut offset = offset as u64;
        loop {
            let r = self
                .handle_fid(fh)
                .and_then(|f| self.call(|c| c.readdir(f, offset, READDIR_BYTES)));
            let entries = match r {
                Ok(e) => e,
                Err(e) => return reply.error(e),
            };
            if entries.is_empty() {
                return reply.ok();
            }
            for e in entries {
                let kind = file_type(u32::from(e.kind) << 12);
                let ino = self.to_fuse(e.qid.path);
                if reply.add(ino, e.offset as i64, kind, OsStr::from_bytes(&e.name)) {
                    return reply.ok();
                }
                offset = e.offset;
            }
        }
    }

    fn releasedir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        reply: ReplyEmpty,
    ) {
        self.release_handle(fh);
        reply.ok();
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(_req, _ino, fh, datasync, reply);
    }

    fn statfs(&mut self, req: &Request<'_>, ino: u64, reply: ReplyStatfs) {
        let ino = self.to_server(ino);
        let r = self
            .fid(req.uid(), ino)
            .and_then(|f| self.call(|c| c.statfs(f)));
        match r {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let ino = self.to_server(ino);
        self.xattr_changed(ino, name.as_bytes());
        let r = self.fid(req.uid(), ino).and_then(|f| {
            self.call(|c| c.xattr_set(f, name.as_bytes(), Some(value), flags as u32))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let ino = self.to_server(ino);
        let caps = name.as_bytes() == CAPS_XATTR;
        if caps && self.no_caps(ino) {
            return reply.error(libc::ENODATA);
        }
        let r = self
            .fid(req.uid(), ino)
            .and_then(|f| self.call(|c| c.xattr_get(f, name.as_bytes())));
        if caps {
            self.caps_read(ino, &r);
        }
        reply_xattr(r, size, reply);
    }

    fn listxattr(&mut self, req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        let ino = self.to_server(ino);
        let r = self
            .fid(req.uid(), ino)
            .and_then(|f| self.call(|c| c.xattr_get(f, b"")));
        reply_xattr(r, size, reply);
    }

    fn removexattr(&mut self, req: &Request<'_>, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        let ino = self.to_server(ino);
        self.xattr_changed(ino, name.as_bytes());
        let r = self
            .fid(req.uid(), ino)
            .and_then(|f| self.call(|c| c.xattr_set(f, name.as_bytes(), None, 0)));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let parent = self.to_server(parent);
        let (uid, gid, name) = (req.uid(), gid_of(req), name.as_bytes());
        let flags = (flags & OPEN_FLAGS_PASSED) as u32;
        let r = (|| {
            let d = self.fid(uid, parent)?;
            let mode = self.create_mode(parent, d, mode, umask) & 0o7777;
            let (f, _) = self.call(|c| c.walk(d, &[]))?;
            if let Err(e) = self.call(|c| c.lcreate(f, name, flags, mode, gid)) {
                let _ = self.call(|c| c.clunk(f));
                return Err(e);
            }
            let attr = match self.lookup_as(uid, parent, name) {
                Ok(a) => a,
                Err(e) => {
                    let _ = self.call(|c| c.clunk(f));
                    return Err(e);
                }
            };
            let fh = self.new_handle(uid, self.to_server(attr.ino), flags, f);
            Ok((attr, fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(&self.cache.ttl(), &a, 0, fh, self.cache.open_flags()),
            Err(e) => reply.error(e),
        }
    }
}

fn reply_xattr(r: Res<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(libc::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}
