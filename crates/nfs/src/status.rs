//! nfsstat3 (RFC 1813 section 2.6): the status every NFSv3 reply begins with, from the
//! filesystem core's errors.

use bucketfs_fs::FsError;

/// An nfsstat3 other than NFS3_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nfs3Error(pub u32);

pub const NFS3_OK: u32 = 0;
pub const NFS3ERR_PERM: Nfs3Error = Nfs3Error(1);
pub const NFS3ERR_NOENT: Nfs3Error = Nfs3Error(2);
pub const NFS3ERR_IO: Nfs3Error = Nfs3Error(5);
pub const NFS3ERR_ACCES: Nfs3Error = Nfs3Error(13);
pub const NFS3ERR_EXIST: Nfs3Error = Nfs3Error(17);
pub const NFS3ERR_XDEV: Nfs3Error = Nfs3Error(18);
pub const NFS3ERR_NOTDIR: Nfs3Error = Nfs3Error(20);
pub const NFS3ERR_ISDIR: Nfs3Error = Nfs3Error(21);
pub const NFS3ERR_INVAL: Nfs3Error = Nfs3Error(22);
pub const NFS3ERR_FBIG: Nfs3Error = Nfs3Error(27);
pub const NFS3ERR_NOSPC: Nfs3Error = Nfs3Error(28);
pub const NFS3ERR_ROFS: Nfs3Error = Nfs3Error(30);
pub const NFS3ERR_MLINK: Nfs3Error = Nfs3Error(31);
pub const NFS3ERR_NAMETOOLONG: Nfs3Error = Nfs3Error(63);
pub const NFS3ERR_NOTEMPTY: Nfs3Error = Nfs3Error(66);
pub const NFS3ERR_DQUOT: Nfs3Error = Nfs3Error(69);
pub const NFS3ERR_STALE: Nfs3Error = Nfs3Error(70);
pub const NFS3ERR_BADHANDLE: Nfs3Error = Nfs3Error(10001);
pub const NFS3ERR_BAD_COOKIE: Nfs3Error = Nfs3Error(10003);
pub const NFS3ERR_NOTSUPP: Nfs3Error = Nfs3Error(10004);
pub const NFS3ERR_TOOSMALL: Nfs3Error = Nfs3Error(10005);
pub const NFS3ERR_SERVERFAULT: Nfs3Error = Nfs3Error(10006);
pub const NFS3ERR_JUKEBOX: Nfs3Error = Nfs3Error(10008);

impl From<&FsError> for Nfs3Error {
    /// The errno the core gives an error, as the nfsstat3 of the same meaning. Errnos NFSv3
    /// has no status for become SERVERFAULT, except the ones with a near equivalent.
    fn from(e: &FsError) -> Nfs3Error {
        let errno = e.errno();
        match errno {
            libc::EPERM => NFS3ERR_PERM,
            libc::ENOENT => NFS3ERR_NOENT,
            libc::EIO => NFS3ERR_IO,
            libc::EACCES => NFS3ERR_ACCES,
            libc::EEXIST => NFS3ERR_EXIST,
            libc::EXDEV => NFS3ERR_XDEV,
            libc::ENOTDIR => NFS3ERR_NOTDIR,
            libc::EISDIR => NFS3ERR_ISDIR,
            libc::EINVAL => NFS3ERR_INVAL,
            libc::EFBIG => NFS3ERR_FBIG,
            libc::ENOSPC => NFS3ERR_NOSPC,
            libc::EROFS => NFS3ERR_ROFS,
            libc::EMLINK => NFS3ERR_MLINK,
            libc::ENAMETOOLONG => NFS3ERR_NAMETOOLONG,
            libc::ENOTEMPTY => NFS3ERR_NOTEMPTY,
            libc::EDQUOT => NFS3ERR_DQUOT,
            libc::ESTALE => NFS3ERR_STALE,
            libc::EOPNOTSUPP => NFS3ERR_NOTSUPP,
            // The store is unreachable for now: the client retries later.
            libc::EAGAIN => NFS3ERR_JUKEBOX,
            _ => NFS3ERR_SERVERFAULT,
        }
    }
}
