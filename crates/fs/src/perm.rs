//! Who may do what: the POSIX permission rules, checked against the caller of each request
//! (9P's attach uid with `access=user`, FUSE's request context, NFS's AUTH_SYS credential).

use crate::inode::{Inode, S_ISVTX};
use crate::FsError;

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// The credentials a request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    pub fn root() -> Caller {
        Caller {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    pub fn user(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether the caller may do `want` (MAY_* bits) to the inode: by its access ACL if it has
    /// one, else by its mode. Root reads and writes anything, and executes what anyone may
    /// execute (or searches any directory).
    pub fn may(&self, inode: &Inode, want: u32) -> bool {
        if self.is_root() {
            return want & MAY_EXEC == 0 || inode.is_dir() || inode.mode & 0o111 != 0;
        }
        if let Some(acl) = &inode.acl {
            return acl.permits(self, inode.uid, inode.gid, want);
        }
        let shift = if self.uid == inode.uid {
            6
        } else if self.in_group(inode.gid) {
            3
        } else {
            0
        };
        let bits = (inode.mode >> shift) & 7;
        bits & want == want
    }

    pub fn check(&self, inode: &Inode, want: u32) -> Result<(), FsError> {
        if self.may(inode, want) {
            Ok(())
        } else {
            Err(FsError::Access)
        }
    }

    /// The caller owns the inode, or is root: what changing its mode, times or xattrs needs.
    pub fn check_owner(&self, inode: &Inode) -> Result<(), FsError> {
        if self.is_root() || self.uid == inode.uid {
            Ok(())
        } else {
            Err(FsError::NotPermitted)
        }
    }

    /// Whether the caller may remove (or rename away) `child` from `dir`: write and search on
    /// the directory, and in a sticky directory, ownership of the directory or the child.
    pub fn check_delete(&self, dir: &Inode, child: &Inode) -> Result<(), FsError> {
        self.check(dir, MAY_WRITE | MAY_EXEC)?;
        let sticky = dir.mode & S_ISVTX != 0;
        if sticky && !self.is_root() && self.uid != dir.uid && self.uid != child.uid {
            return Err(FsError::NotPermitted);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Time, S_IFDIR, S_IFREG};

    #[test]
    fn owner_group_other_and_root() {
        let f = Inode::new(5, S_IFREG | 0o640, 1000, 50, Time::default());
        let owner = Caller::user(1000, 1);
        let mut member = Caller::user(2000, 1);
        member.groups.push(50);
        let other = Caller::user(3000, 3000);
        assert!(owner.may(&f, MAY_READ | MAY_WRITE));
        assert!(!owner.may(&f, MAY_EXEC));
        assert!(member.may(&f, MAY_READ) && !member.may(&f, MAY_WRITE));
        assert!(!other.may(&f, MAY_READ));
        assert!(Caller::root().may(&f, MAY_READ | MAY_WRITE));
        assert!(
            !Caller::root().may(&f, MAY_EXEC),
            "root executes only what someone may"
        );
        let d = Inode::new(6, S_IFDIR | 0o1777, 1000, 50, Time::default());
        let theirs = Inode::new(7, S_IFREG | 0o644, 3000, 50, Time::default());
        assert!(Caller::root().may(&d, MAY_EXEC));
        assert!(other.check_delete(&d, &theirs).is_ok(), "the child's owner");
        assert!(
            owner.check_delete(&d, &theirs).is_ok(),
            "the directory's owner"
        );
        assert!(matches!(
            member.check_delete(&d, &theirs),
            Err(FsError::NotPermitted)
        ));
    }
}
