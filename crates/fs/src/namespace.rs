//! Changes to the namespace: create, mkdir, mknod, symlink, link, unlink, rmdir and rename,
//! each one transaction under the locks of the directories and inodes it changes.

use crate::change::Change;
use crate::dir::Entry;
use crate::inode::{Inode, Kind, Time, S_IFDIR, S_IFLNK, S_IFMT, S_ISGID};
use crate::perm::{Caller, MAY_EXEC, MAY_WRITE};
use crate::{check_name, Fs, FsError, SYMLINK_BYTES_MAX};

/// How a rename treats an existing target (renameat2's flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` rather than replace the target.
    pub no_replace: bool,
    /// Swap source and target, both of which must exist.
    pub exchange: bool,
}

/// How many times a mutation starts over when a name it looked up before locking changed
/// meanwhile (another client's rename or unlink in between): each retry means that client
/// made progress.
const RELOOKUP_ATTEMPTS_MAX: usize = 64;

impl Fs {
    /// Creates a regular file, directory, FIFO, socket or device node `name` in `parent`.
    /// `mode` holds the type bits and the permissions (after the client's umask, which a
    /// client applies only where the parent has no default ACL); `rdev` names a device node's
    /// device.
    pub async fn make(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<Inode, FsError> {
        match Kind::of_mode(mode) {
            None | Some(Kind::Symlink) => {
                return Err(FsError::Invalid(format!("file type of mode {mode:o}")))
            }
            Some(_) => {}
        }
        self.make_inode(caller, parent, name, mode & (S_IFMT | 0o7777), rdev, &[], 0)
            .await
    }

    /// A regular file (or other kind) created with a size, in one transaction.
    pub(crate) async fn make_sized(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        size_bytes: u64,
    ) -> Result<Inode, FsError> {
        self.make_inode(caller, parent, name, mode, 0, &[], size_bytes)
            .await
    }

    pub async fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Inode, FsError> {
        if target.is_empty() || target.len() > SYMLINK_BYTES_MAX || target.contains(&0) {
            return Err(FsError::Invalid(format!(
                "a symlink's target is 1 to {SYMLINK_BYTES_MAX} bytes without NUL"
            )));
        }
        let size = target.len() as u64;
        self.make_inode(caller, parent, name, S_IFLNK | 0o777, 0, target, size)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn make_inode(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        target: &[u8],
        size_bytes: u64,
    ) -> Result<Inode, FsError> {
        check_name(name)?;
        let ino = self.next_ino().await?;
        let _held = self.locks.lock(&[parent]).await;
        let mut c = Change::new(self);
        let mut dir = c.inode(parent).await?;
        check_live_dir(&dir)?;
        caller.check(&dir, MAY_WRITE | MAY_EXEC)?;
        let cookie = self.cookie(parent, name);
        let mut entries = c.entries(parent, cookie).await?;
        if entries.iter().any(|e| e.name == name) {
            return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        let now = Time::now();
        let mut mode = mode;
        // A setgid directory hands its group down, and its setgid bit to subdirectories.
        let gid = if dir.mode & S_ISGID != 0 {
            if mode & S_IFMT == S_IFDIR {
                mode |= S_ISGID;
            }
            dir.gid
        } else {
            caller.gid
        };
        // A file that would run as a group its creator is not in loses set-group-ID; without
        // group execute the bit is no such privilege (Linux's mode_strip_sgid) and stays.
        let runs_as_group = mode & (S_ISGID | 0o010) == S_ISGID | 0o010;
        if mode & S_IFMT != S_IFDIR && runs_as_group && !caller.is_root() && !caller.in_group(gid) {
            mode &= !S_ISGID;
        }
        // A directory's default ACL replaces the umask (the client sends the mode without
        // it): the new inode's access ACL is the default limited by the mode, and a new
        // directory inherits the default too. Symlinks have no ACLs.
        let mut acl = None;
        let mut default_acl = None;
        if let Some(default) = dir
            .default_acl
            .as_ref()
            .filter(|_| mode & S_IFMT != S_IFLNK)
        {
            let (inherited, masked) = default.for_new_inode(mode);
            mode = masked;
            acl = (!inherited.is_minimal()).then_some(inherited);
            if mode & S_IFMT == S_IFDIR {
                default_acl = Some(default.clone());
            }
        }
        let mut inode = Inode::new(ino, mode, caller.uid, gid, now);
        inode.acl = acl;
        inode.default_acl = default_acl;
        inode.rdev = rdev;
        inode.target = target.to_vec();
        inode.size_bytes = size_bytes;
        if inode.is_dir() {
            inode.parent = parent;
            dir.nlink += 1;
        }
        dir.mtime = now;
        dir.ctime = now;
        entries.push(Entry {
            name: name.to_vec(),
            ino,
            kind: inode.kind(),
        });
        c.set_entries(parent, cookie, &entries);
        c.put_inode(&dir);
        c.create_inode(&inode);
        c.commit().await?;
        if parent == self.nbd_dir && inode.kind() == Kind::File {
            self.sizes.write().insert(ino, size_bytes);
        }
        Ok(inode)
    }

    /// A new name `name` in `parent` for the inode `ino`, which must not be a directory.
    pub async fn link(
        &self,
        caller: &Caller,
        ino: u64,
        parent: u64,
        name: &[u8],
    ) -> Result<Inode, FsError> {
        check_name(name)?;
        let _held = self.locks.lock(&[parent, ino]).await;
        let mut c = Change::new(self);
        let mut dir = c.inode(parent).await?;
        check_live_dir(&dir)?;
        caller.check(&dir, MAY_WRITE | MAY_EXEC)?;
        let mut inode = c.inode(ino).await?;
        if inode.is_dir() {
            return Err(FsError::NotPermitted);
        }
        if inode.nlink == 0 {
            return Err(FsError::NotFound(format!("inode {ino}")));
        }
        let cookie = self.cookie(parent, name);
        let mut entries = c.entries(parent, cookie).await?;
        if entries.iter().any(|e| e.name == name) {
            return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        entries.push(Entry {
            name: name.to_vec(),
            ino,
            kind: inode.kind(),
        });
        let now = Time::now();
        inode.nlink += 1;
        inode.ctime = now;
        dir.mtime = now;
        dir.ctime = now;
        c.set_entries(parent, cookie, &entries);
        c.put_inode(&dir);
        c.put_inode(&inode);
        c.commit().await?;
        Ok(inode)
    }

    /// Removes the name `name` of a non-directory from `parent`; the inode goes with its last
    /// name, or at its last close if it is open.
    pub async fn unlink(&self, caller: &Caller, parent: u64, name: &[u8]) -> Result<(), FsError> {
        self.remove(caller, parent, name, false).await
    }

    /// Removes the empty directory `name` from `parent`.
    pub async fn rmdir(&self, caller: &Caller, parent: u64, name: &[u8]) -> Result<(), FsError> {
        match name {
            b"." => return Err(FsError::Invalid("rmdir of .".into())),
            b".." => return Err(FsError::NotEmpty),
            _ => {}
        }
        self.remove(caller, parent, name, true).await
    }

    async fn remove(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> Result<(), FsError> {
        check_name(name)?;
        for _ in 0..RELOOKUP_ATTEMPTS_MAX {
            let Some(found) = self.lookup_entry(parent, name).await? else {
                return Err(FsError::NotFound(
                    String::from_utf8_lossy(name).into_owned(),
                ));
            };
            let _held = self.locks.lock(&[parent, found.ino]).await;
            let mut c = Change::new(self);
            let mut dir = c.inode(parent).await?;
            check_live_dir(&dir)?;
            let cookie = self.cookie(parent, name);
            let mut entries = c.entries(parent, cookie).await?;
            let Some(at) = entries.iter().position(|e| e.name == name) else {
                return Err(FsError::NotFound(
                    String::from_utf8_lossy(name).into_owned(),
                ));
            };
            if entries[at].ino != found.ino {
                continue;
            }
            let mut child = c.inode(found.ino).await?;
            caller.check_delete(&dir, &child)?;
            match (want_dir, child.is_dir()) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                _ => {}
            }
            if want_dir && !self.dir_is_empty(child.ino).await? {
                return Err(FsError::NotEmpty);
            }
            entries.remove(at);
            c.set_entries(parent, cookie, &entries);
            let now = Time::now();
            dir.mtime = now;
            dir.ctime = now;
            if child.is_dir() {
                dir.nlink -= 1;
            }
            c.put_inode(&dir);
            self.drop_link(&mut c, &mut child, now);
            c.commit().await?;
            if child.nlink == 0 {
                self.sizes.write().remove(&found.ino);
            }
            return Ok(());
        }
        Err(FsError::Engine(bucketfs_engine::EngineError::Conflict {
            key: String::from_utf8_lossy(name).into_owned(),
            expected: "a stable directory entry".into(),
        }))
    }

    /// Takes one name away from `inode` within the change: deletes it with its last name
    /// (unless it is open: then it becomes an orphan, deleted at the last close).
    fn drop_link(&self, c: &mut Change<'_>, inode: &mut Inode, now: Time) {
        inode.nlink = if inode.is_dir() {
            0
        } else {
            inode.nlink.saturating_sub(1)
        };
        inode.ctime = now;
        if inode.nlink > 0 {
            c.put_inode(inode);
        } else if self.open_files.lock().contains_key(&inode.ino) {
            c.put_inode(inode);
            c.mark_orphan(inode.ino);
        } else {
            c.delete_inode(inode.ino);
        }
    }

    /// Renames `from_parent/from_name` to `to_parent/to_name`: atomically replaces the target
    /// if there is one (unless `flags` says otherwise), or swaps the two.
    pub async fn rename(
        &self,
        caller: &Caller,
        from_parent: u64,
        from_name: &[u8],
        to_parent: u64,
        to_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), FsError> {
        check_name(from_name)?;
        check_name(to_name)?;
        if flags.exchange && flags.no_replace {
            return Err(FsError::Invalid(
                "rename cannot both exchange and refuse to replace".into(),
            ));
        }
        for _ in 0..RELOOKUP_ATTEMPTS_MAX {
            let Some(src) = self.lookup_entry(from_parent, from_name).await? else {
                return Err(FsError::NotFound(
                    String::from_utf8_lossy(from_name).into_owned(),
                ));
            };
            let dst = self.lookup_entry(to_parent, to_name).await?;
            let moves_dir = from_parent != to_parent
                && (src.kind == Kind::Directory
                    || flags.exchange && dst.as_ref().is_some_and(|d| d.kind == Kind::Directory));
            let _moves = match moves_dir {
                true => Some(self.dir_moves.lock().await),
                false => None,
            };
            let mut inos = vec![from_parent, to_parent, src.ino];
            inos.extend(dst.as_ref().map(|d| d.ino));
            let _held = self.locks.lock(&inos).await;
            match self
                .rename_locked(
                    caller,
                    (from_parent, from_name, &src),
                    (to_parent, to_name, &dst),
                    flags,
                )
                .await
            {
                Err(FsError::Engine(bucketfs_engine::EngineError::Conflict { .. })) => continue,
                Ok(Moved::Again) => continue,
                Ok(Moved::Done) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Err(FsError::Engine(bucketfs_engine::EngineError::Conflict {
            key: String::from_utf8_lossy(from_name).into_owned(),
            expected: "stable directory entries".into(),
        }))
    }

    async fn rename_locked(
        &self,
        caller: &Caller,
        (from_parent, from_name, src): (u64, &[u8], &Entry),
        (to_parent, to_name, dst): (u64, &[u8], &Option<Entry>),
        flags: RenameFlags,
    ) -> Result<Moved, FsError> {
        let mut c = Change::new(self);
        let from_cookie = self.cookie(from_parent, from_name);
        let to_cookie = self.cookie(to_parent, to_name);
        let from_entries = c.entries(from_parent, from_cookie).await?;
        let to_entries = c.entries(to_parent, to_cookie).await?;
        let now_src = from_entries.iter().find(|e| e.name == from_name);
        let now_dst = to_entries.iter().find(|e| e.name == to_name);
        if now_src.map(|e| e.ino) != Some(src.ino)
            || now_dst.map(|e| e.ino) != dst.as_ref().map(|e| e.ino)
        {
            return Ok(Moved::Again);
        }
        let mut from_dir = c.inode(from_parent).await?;
        let mut to_dir = c.inode(to_parent).await?;
        check_live_dir(&from_dir)?;
        check_live_dir(&to_dir)?;
        let mut moving = c.inode(src.ino).await?;
        caller.check_delete(&from_dir, &moving)?;
        caller.check(&to_dir, MAY_WRITE | MAY_EXEC)?;
        let mut target = match dst {
            Some(d) => Some(c.inode(d.ino).await?),
            None => None,
        };
        if let Some(t) = &target {
            if flags.no_replace {
                return Err(FsError::Exists(
                    String::from_utf8_lossy(to_name).into_owned(),
                ));
            }
            caller.check_delete(&to_dir, t)?;
            // Two names of one inode: POSIX says the rename does nothing.
            if t.ino == moving.ino {
                return Ok(Moved::Done);
            }
        } else if flags.exchange {
            return Err(FsError::NotFound(
                String::from_utf8_lossy(to_name).into_owned(),
            ));
        }
        if from_parent != to_parent {
            if moving.is_dir() {
                caller.check(&moving, MAY_WRITE)?;
                self.check_not_under(&mut c, to_parent, moving.ino).await?;
            }
            if let Some(t) = target.as_ref().filter(|t| flags.exchange && t.is_dir()) {
                caller.check(t, MAY_WRITE)?;
                self.check_not_under(&mut c, from_parent, t.ino).await?;
            }
        }
        let now = Time::now();
        // Directory link counts change by these; the two may be one directory.
        let (mut from_links, mut to_links) = (0i64, 0i64);
        if flags.exchange {
            let t = target.as_mut().expect("an exchange has a target");
            set_name(&mut c, from_parent, from_cookie, from_name, Some(t));
            set_name(&mut c, to_parent, to_cookie, to_name, Some(&moving));
            if moving.is_dir() {
                moving.parent = to_parent;
                from_links -= 1;
                to_links += 1;
            }
            if t.is_dir() {
                t.parent = from_parent;
                to_links -= 1;
                from_links += 1;
            }
            t.ctime = now;
            c.put_inode(t);
        } else {
            if let Some(t) = target.as_mut() {
                match (moving.is_dir(), t.is_dir()) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if !self.dir_is_empty(t.ino).await? => {
                        return Err(FsError::NotEmpty)
                    }
                    _ => {}
                }
                if t.is_dir() {
                    to_links -= 1;
                }
                self.drop_link(&mut c, t, now);
            }
            set_name(&mut c, from_parent, from_cookie, from_name, None);
            set_name(&mut c, to_parent, to_cookie, to_name, Some(&moving));
            if moving.is_dir() {
                moving.parent = to_parent;
                from_links -= 1;
                to_links += 1;
            }
        }
        moving.ctime = now;
        c.put_inode(&moving);
        if from_parent == to_parent {
            to_links += from_links;
        } else {
            from_dir.nlink = add_links(from_dir.nlink, from_links);
            from_dir.mtime = now;
            from_dir.ctime = now;
            c.put_inode(&from_dir);
        }
        to_dir.nlink = add_links(to_dir.nlink, to_links);
        to_dir.mtime = now;
        to_dir.ctime = now;
        c.put_inode(&to_dir);
        c.commit().await?;
        if let Some(t) = &target {
            if t.nlink == 0 && !flags.exchange {
                self.sizes.write().remove(&t.ino);
            }
        }
        Ok(Moved::Done)
    }

    /// Fails with `Invalid` if `dir` is `ino` or lies under it: a directory cannot move into
    /// its own subtree.
    async fn check_not_under(&self, c: &mut Change<'_>, dir: u64, ino: u64) -> Result<(), FsError> {
        let mut at = dir;
        loop {
            if at == ino {
                return Err(FsError::Invalid(
                    "a directory cannot move under itself".into(),
                ));
            }
            if at == crate::ROOT_INO {
                return Ok(());
            }
            let parent = c.inode(at).await?.parent;
            if parent == at || parent == 0 {
                return Ok(());
            }
            at = parent;
        }
    }
}

/// Replaces the entry `name` of the bucket (`dir`, `cookie`) that the change has read, by one
/// for `to`, or by none.
fn set_name(c: &mut Change<'_>, dir: u64, cookie: u64, name: &[u8], to: Option<&Inode>) {
    let mut entries = c.entries_read(dir, cookie);
    entries.retain(|e| e.name != name);
    if let Some(i) = to {
        entries.push(Entry {
            name: name.to_vec(),
            ino: i.ino,
            kind: i.kind(),
        });
    }
    c.set_entries(dir, cookie, &entries);
}

fn add_links(nlink: u32, delta: i64) -> u32 {
    u32::try_from((i64::from(nlink) + delta).max(0)).unwrap_or(u32::MAX)
}

enum Moved {
    Done,
    /// A name changed between the lookup and the locks: look up again.
    Again,
}

/// A directory that may receive or lose entries: one still linked in the tree.
fn check_live_dir(dir: &Inode) -> Result<(), FsError> {
    if !dir.is_dir() {
        return Err(FsError::NotDir);
    }
    if dir.nlink == 0 {
        return Err(FsError::NotFound(format!("directory {}", dir.ino)));
    }
    Ok(())
}
