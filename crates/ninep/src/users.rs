//! Who a 9P attach names: the uid (n_uname, or uname looked up), with the primary group and
//! supplementary groups this machine's user database gives it, as diod does. 9P2000.L carries
//! no groups of its own; permission checks need them.

use bucketfs_fs::Caller;
use std::ffi::{CStr, CString};

/// The group of a uid this machine does not know: nogroup.
const UNKNOWN_GID: u32 = 65534;
/// Supplementary groups looked up per user (NGROUPS_MAX is 65536; real users have a few).
const GROUPS_MAX: usize = 256;

/// The caller for an attach: `n_uname` if set, else the user named `uname`.
pub fn caller(uname: &[u8], n_uname: Option<u32>) -> Option<Caller> {
    let (uid, gid, name) = match n_uname {
        Some(uid) => match by_uid(uid) {
            Some((gid, name)) => (uid, gid, Some(name)),
            None => (uid, UNKNOWN_GID, None),
        },
        None => by_name(uname)?,
    };
    let groups = name.map(|n| groups_of(&n, gid)).unwrap_or_default();
    Some(Caller { uid, gid, groups })
}

fn by_uid(uid: u32) -> Option<(u32, CString)> {
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory owned here and sized as passed.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r filled pw_name with a NUL-terminated string inside `buf`.
    let name = unsafe { CStr::from_ptr(pw.pw_name) }.to_owned();
    Some((pw.pw_gid, name))
}

fn by_name(uname: &[u8]) -> Option<(u32, u32, Option<CString>)> {
    let name = CString::new(uname).ok()?;
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: as in by_uid.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return None;
    }
    Some((pw.pw_uid, pw.pw_gid, Some(name)))
}

fn groups_of(name: &CStr, gid: u32) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; GROUPS_MAX];
    let mut n = GROUPS_MAX as libc::c_int;
    // SAFETY: `groups` has room for `n` entries; getgrouplist writes at most that many.
    let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
    if rc < 0 {
        return Vec::new();
    }
    groups.truncate(n.max(0) as usize);
    groups.retain(|&g| g != gid);
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_known_and_strangers_get_nogroup() {
        let root = caller(b"root", None).expect("root is in every user database");
        assert_eq!((root.uid, root.gid), (0, 0));
        let by_number = caller(b"", Some(0)).unwrap();
        assert_eq!(by_number.uid, 0);
        let stranger = caller(b"", Some(3_999_999)).unwrap();
        assert_eq!((stranger.gid, stranger.groups.len()), (UNKNOWN_GID, 0));
        assert!(caller(b"no-such-user-here", None).is_none());
    }
}
