//! Extended attributes, stored for real: `user.` (on files and directories, by their
//! permissions), `trusted.` (root only) and `security.` (written by root, read by all).
//! `system.posix_acl_access` and `system.posix_acl_default` are the inode's POSIX ACLs (acl.rs),
//! kept in its record and enforced; any other `system.` name is refused with EOPNOTSUPP.
//!
//! An attribute's key holds its inode and a keyed hash of its name; the sealed value holds the
//! names and values of every attribute with that hash.

use crate::acl::{self, Acl};
use crate::change::Change;
use crate::inode::{Inode, Kind, Time};
use crate::perm::{Caller, MAY_READ, MAY_WRITE};
use crate::{keys, Fs, FsError, NAME_BYTES_MAX};

/// The largest value, as Linux's XATTR_SIZE_MAX.
pub const XATTR_VALUE_BYTES_MAX: usize = 64 * 1024;

/// setxattr's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    #[default]
    Any,
    /// XATTR_CREATE: fail if it exists.
    Create,
    /// XATTR_REPLACE: fail if it does not.
    Replace,
}

type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

fn encode(pairs: &Pairs) -> Vec<u8> {
    let mut v = Vec::new();
    for (name, value) in pairs {
        v.push(u8::try_from(name.len()).expect("xattr names are checked to be at most 255"));
        v.extend_from_slice(name);
        v.extend_from_slice(&(value.len() as u32).to_le_bytes());
        v.extend_from_slice(value);
    }
    v
}

fn decode(ino: u64, mut v: &[u8]) -> Result<Pairs, FsError> {
    let damaged = || FsError::Damaged(ino, "an extended attribute is malformed".into());
    let mut out = Vec::new();
    while !v.is_empty() {
        let n = usize::from(v[0]);
        let name = v.get(1..1 + n).ok_or_else(damaged)?.to_vec();
        let len_at = 1 + n;
        let len = v.get(len_at..len_at + 4).ok_or_else(damaged)?;
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let value = v
            .get(len_at + 4..len_at + 4 + len)
            .ok_or_else(damaged)?
            .to_vec();
        out.push((name, value));
        v = &v[len_at + 4 + len..];
    }
    Ok(out)
}

/// What the caller wants to do with the attribute `name` of `inode`: allowed, or why not.
fn check(caller: &Caller, inode: &Inode, name: &[u8], write: bool) -> Result<(), FsError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(FsError::Invalid(
            "an extended attribute's name is 1 to 255 bytes".into(),
        ));
    }
    if name.starts_with(b"user.") {
        if !matches!(inode.kind(), Kind::File | Kind::Directory) {
            return Err(FsError::NotPermitted);
        }
        return caller.check(inode, if write { MAY_WRITE } else { MAY_READ });
    }
    if name.starts_with(b"trusted.") {
        return match caller.is_root() {
            true => Ok(()),
            false if write => Err(FsError::NotPermitted),
            false => Err(FsError::NoXattr),
        };
    }
    if name.starts_with(b"security.") {
        return match !write || caller.is_root() {
            true => Ok(()),
            false => Err(FsError::NotPermitted),
        };
    }
    Err(FsError::NotSupported(format!(
        "extended attributes named {:?}",
        String::from_utf8_lossy(name)
    )))
}

impl Fs {
    fn xattr_key(&self, ino: u64, name: &[u8]) -> Vec<u8> {
        keys::xattr(ino, self.engine.name_hash(ino, name))
    }

    pub async fn get_xattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &[u8],
    ) -> Result<Vec<u8>, FsError> {
        let inode = self.getattr(ino).await?;
        if let Some(acl) = acl_of(&inode, name) {
            // Anyone who can reach the inode may read its ACLs, as its mode.
            return acl.map(Acl::to_xattr).ok_or(FsError::NoXattr);
        }
        check(caller, &inode, name, false)?;
        let Some(v) = self.engine.kv_get(&self.xattr_key(ino, name)).await? else {
            return Err(FsError::NoXattr);
        };
        decode(ino, &v)?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value)
            .ok_or(FsError::NoXattr)
    }

    /// The names of the attributes the caller may see.
    pub async fn list_xattr(&self, caller: &Caller, ino: u64) -> Result<Vec<Vec<u8>>, FsError> {
        let inode = self.getattr(ino).await?;
        let prefix = keys::xattr_prefix(ino);
        let mut names = Vec::new();
        for name in [acl::XATTR_ACCESS, acl::XATTR_DEFAULT] {
            if acl_of(&inode, name).flatten().is_some() {
                names.push(name.to_vec());
            }
        }
        for (_, v) in self.engine.kv_scan(&prefix).await? {
            for (name, _) in decode(ino, &v)? {
                if !name.starts_with(b"trusted.") || caller.is_root() {
                    names.push(name);
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Sets (`Some`) or removes (`None`) the attribute `name`.
    pub async fn set_xattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &[u8],
        value: Option<&[u8]>,
        mode: XattrMode,
    ) -> Result<(), FsError> {
        if value.is_some_and(|v| v.len() > XATTR_VALUE_BYTES_MAX) {
            return Err(FsError::TooLarge(value.map_or(0, |v| v.len() as u64)));
        }
        let _held = self.locks.lock(&[ino]).await;
        let mut c = Change::new(self);
        let mut inode = c.inode(ino).await?;
        if acl_of(&inode, name).is_some() {
            set_acl(caller, &mut inode, name, value)?;
            inode.ctime = Time::now();
            c.put_inode(&inode);
            return c.commit().await;
        }
        check(caller, &inode, name, true)?;
        let key = self.xattr_key(ino, name);
        let mut pairs = match c.value(&key).await? {
            Some(v) => decode(ino, &v)?,
            None => Vec::new(),
        };
        let at = pairs.iter().position(|(n, _)| n == name);
        match (at, value, mode) {
            (Some(_), Some(_), XattrMode::Create) => {
                return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()))
            }
            (None, Some(_), XattrMode::Replace) | (None, None, _) => return Err(FsError::NoXattr),
            (Some(i), None, _) => {
                pairs.remove(i);
            }
            (Some(i), Some(v), _) => pairs[i].1 = v.to_vec(),
            (None, Some(v), _) => pairs.push((name.to_vec(), v.to_vec())),
        }
        c.set_value(key, (!pairs.is_empty()).then(|| encode(&pairs)));
        inode.ctime = Time::now();
        c.put_inode(&inode);
        c.commit().await
    }
}

/// `Some` with the inode's ACL (or `None` if it has none) if `name` is one of the ACL
/// attributes; `None` for any other name.
fn acl_of<'a>(inode: &'a Inode, name: &[u8]) -> Option<Option<&'a Acl>> {
    match name {
        acl::XATTR_ACCESS => Some(inode.acl.as_ref()),
        acl::XATTR_DEFAULT => Some(inode.default_acl.as_ref()),
        _ => None,
    }
}

/// setxattr and removexattr of an ACL attribute, as Linux: only the owner (or root); an access
/// ACL sets the mode's permission bits and is kept only if it says more than they do, and a
/// caller outside the file's group (not root) loses set-group-ID by it; a default ACL is for
/// directories (EACCES elsewhere) and is kept even if minimal, since it also turns the umask
/// off for new entries. Symlinks have none (EOPNOTSUPP). setxattr's create and replace flags
/// do not apply, as on Linux.
fn set_acl(
    caller: &Caller,
    inode: &mut Inode,
    name: &[u8],
    value: Option<&[u8]>,
) -> Result<(), FsError> {
    if inode.kind() == Kind::Symlink {
        return Err(FsError::NotSupported("POSIX ACLs on symlinks".into()));
    }
    caller.check_owner(inode)?;
    let access = name == acl::XATTR_ACCESS;
    // Removing, or setting an ACL without entries, drops it (and succeeds if there is none,
    // as on Linux's filesystems); the mode stays as it is.
    let Some(new) = value.map(Acl::from_xattr).transpose()?.flatten() else {
        if access {
            inode.acl = None;
        } else {
            inode.default_acl = None;
        }
        return Ok(());
    };
    if !access {
        if !inode.is_dir() {
            return Err(FsError::Access);
        }
        inode.default_acl = Some(new);
        return Ok(());
    }
    inode.mode = (inode.mode & !0o777) | new.mode_bits();
    if !caller.is_root() && !caller.in_group(inode.gid) {
        inode.mode &= !crate::inode::S_ISGID;
    }
    inode.acl = (!new.is_minimal()).then_some(new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_cut_ones_are_refused() {
        let pairs = vec![
            (b"user.a".to_vec(), vec![]),
            (b"user.b".to_vec(), vec![7; 300]),
        ];
        let v = encode(&pairs);
        assert_eq!(decode(1, &v).unwrap(), pairs);
        for cut in [1, 5, 8, v.len() - 1] {
            assert!(decode(1, &v[..cut]).is_err(), "cut at {cut}");
        }
    }
}
