//! The NFSv3 procedures that change attributes and names: SETATTR (with its ctime guard),
//! CREATE (UNCHECKED, GUARDED, EXCLUSIVE), MKDIR, SYMLINK, MKNOD, REMOVE, RMDIR, RENAME and
//! LINK. Each is one transaction of the core, as the caller, and is durable before its reply:
//! RFC 1813 (section 4.8) makes them synchronous, and a client that saw a file made would
//! otherwise find it gone (STALE) after a crash. Each answers wcc_data for what it changed.

use super::*;
use crate::status::NFS3ERR_XDEV;
use crate::xdr::XdrError;
use bucketfs_fs::FsError;
use bucketfs_fs::{RenameFlags, SetAttr, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFREG, S_IFSOCK};

/// NFS3ERR_BADTYPE: MKNOD of a type it does not make.
const NFS3ERR_BADTYPE: u32 = 10007;
/// nfspath3's limit: a symlink's target.
const PATH_BYTES_MAX: usize = 4096;
/// NFS3ERR_NOT_SYNC: SETATTR's guard did not match.
const NFS3ERR_NOT_SYNC: u32 = 10002;
// time_how.
const SET_TO_SERVER_TIME: u32 = 1;
const SET_TO_CLIENT_TIME: u32 = 2;
// createmode3.
const GUARDED: u32 = 1;
const EXCLUSIVE: u32 = 2;

/// sattr3 as the core's SetAttr.
fn sattr(d: &mut Decoder<'_>) -> XdrResult<SetAttr> {
    let mut s = SetAttr::default();
    if d.bool()? {
        s.mode = Some(d.u32()? & 0o7777);
    }
    if d.bool()? {
        s.uid = Some(d.u32()?);
    }
    if d.bool()? {
        s.gid = Some(d.u32()?);
    }
    if d.bool()? {
        s.size_bytes = Some(d.u64()?);
    }
    for slot in [&mut s.atime, &mut s.mtime] {
        *slot = match d.u32()? {
            0 => None,
            SET_TO_SERVER_TIME => Some(None),
            SET_TO_CLIENT_TIME => Some(Some(Time {
                sec: i64::from(d.u32()?),
                nsec: d.u32()?,
            })),
            value => {
                return Err(XdrError::Bad {
                    what: "time_how",
                    value,
                })
            }
        };
    }
    Ok(s)
}

fn is_empty(s: &SetAttr) -> bool {
    *s == SetAttr::default()
}

/// diropargs3: a directory's handle and a name.
fn dirop<'a>(d: &mut Decoder<'a>) -> XdrResult<(&'a [u8], &'a [u8])> {
    Ok((fh(d)?, d.opaque(NAME_BYTES_MAX, "filename3")?))
}

impl Nfs3Program {
    /// A change that succeeded, made durable (the flush barrier); its failure is the reply's.
    async fn durable<T>(&self, changed: Result<T, FsError>) -> Result<T, FsError> {
        let value = changed?;
        self.fs.sync().await?;
        Ok(value)
    }

    /// The two handles of LINK and RENAME, for a change: XDEV when they were given under
    /// different exports (a change may not reach across them).
    async fn pair(
        &self,
        call: &Call<'_>,
        a: &[u8],
        b: &[u8],
    ) -> Result<(Target<'_>, Target<'_>), Nfs3Error> {
        let (a, b) = (
            self.target(call, a, true).await?,
            self.target(call, b, true).await?,
        );
        if a.export.id != b.export.id {
            return Err(NFS3ERR_XDEV);
        }
        Ok((a, b))
    }

    pub(super) async fn setattr(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| {
            let h = fh(args)?;
            let set = sattr(args)?;
            let guard = if args.bool()? {
                Some((args.u32()?, args.u32()?))
            } else {
                None
            };
            Ok::<_, XdrError>((h, set, guard))
        })();
        let (h, set, guard) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target {
            inode: before, who, ..
        }) = self.object_wcc(call, h, true, out).await
        else {
            return Ok(());
        };
        if let Some((sec, nsec)) = guard {
            if (i64::from(sec), nsec) != (before.ctime.sec, before.ctime.nsec) {
                out.u32(NFS3ERR_NOT_SYNC);
                wcc(out, Some(&before), Some(&before));
                return Ok(());
            }
        }
        match self
            .durable(self.fs.setattr(&who, before.ino, &set).await)
            .await
        {
            Ok(after) => {
                out.u32(NFS3_OK);
                wcc(out, Some(&before), Some(&after));
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                wcc(out, Some(&before), Some(&before));
            }
        }
        Ok(())
    }

    /// The reply of CREATE, MKDIR, SYMLINK and MKNOD: the new inode's handle and attributes,
    /// or the error, then the directory's wcc_data.
    async fn answer_new(&self, out: &mut Encoder, made: Result<Inode, FsError>, dir: &Target<'_>) {
        let made = self.durable(made).await;
        let dir_after = self.fs.getattr(dir.inode.ino).await.ok();
        match made {
            Ok(i) => {
                out.u32(NFS3_OK).bool(true).opaque(&self.handle_of(dir, &i));
                post_op(out, Some(&i));
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
            }
        }
        wcc(out, Some(&dir.inode), dir_after.as_ref());
    }

    /// CREATE and MKDIR. EXCLUSIVE keeps the client's verifier in the new file's atime and
    /// mtime (as Linux's nfsd does): a retransmitted CREATE that finds a file with those times
    /// is answered as the first was, anything else that exists is EXIST.
    pub(super) async fn create(
        &self,
        call: &Call<'_>,
        dir_kind: bool,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| {
            let (h, name) = dirop(args)?;
            let (how, set, verifier) = if dir_kind {
                (GUARDED, sattr(args)?, None)
            } else {
                match args.u32()? {
                    EXCLUSIVE => (EXCLUSIVE, SetAttr::default(), Some(args.fixed(8)?)),
                    how @ (0 | GUARDED) => (how, sattr(args)?, None),
                    value => {
                        return Err(XdrError::Bad {
                            what: "createmode3",
                            value,
                        })
                    }
                }
            };
            Ok::<_, XdrError>((h, name, how, set, verifier))
        })();
        let (h, name, how, mut set, verifier) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(t) = self.object_wcc(call, h, true, out).await else {
            return Ok(());
        };
        let (dir, who) = (&t.inode, &t.who);
        let (kind, default_mode) = if dir_kind {
            (S_IFDIR, 0o755)
        } else {
            (S_IFREG, 0o644)
        };
        let mode = set
            .mode
            .take()
            .unwrap_or(if verifier.is_some() { 0 } else { default_mode });
        let stamp = verifier.map(|v| Time {
            sec: i64::from(u32::from_be_bytes(v[..4].try_into().expect("4"))),
            nsec: u32::from_be_bytes(v[4..].try_into().expect("4")) % 1_000_000_000,
        });
        let made = match self.fs.make(who, dir.ino, name, kind | mode, 0).await {
            Ok(i) => {
                // The client's other attributes (or the verifier) on the new file.
                if let Some(t) = stamp {
                    set.atime = Some(Some(t));
                    set.mtime = Some(Some(t));
                }
                if is_empty(&set) {
                    Ok(i)
                } else {
                    self.fs.setattr(who, i.ino, &set).await
                }
            }
            Err(e) if e.errno() == libc::EEXIST && how != GUARDED => {
                match self.fs.lookup(who, dir.ino, name).await {
                    // EXCLUSIVE: the same verifier means this is a retransmission.
                    Ok(i) if stamp.is_some() => {
                        if Some(i.mtime) == stamp && i.atime == i.mtime {
                            Ok(i)
                        } else {
                            Err(e)
                        }
                    }
                    // UNCHECKED: the existing file, with the attributes asked (a size of 0
                    // truncates it).
                    Ok(i) if i.kind() == Kind::File => {
                        if is_empty(&set) {
                            Ok(i)
                        } else {
                            self.fs.setattr(who, i.ino, &set).await
                        }
                    }
                    Ok(_) => Err(e),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        self.answer_new(out, made, &t).await;
        Ok(())
    }

    /// SYMLINK (`Some(target)` read here) and MKNOD: a new inode answered as CREATE answers.
    pub(super) async fn make_special(
        &self,
        call: &Call<'_>,
        symlink: bool,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| {
            let (h, name) = dirop(args)?;
            if symlink {
                let set = sattr(args)?;
                let target = args.opaque(PATH_BYTES_MAX, "nfspath3")?;
                return Ok::<_, XdrError>((h, name, Ok((0, set, 0)), Some(target)));
            }
            let what = match args.u32()? {
                t @ (3 | 4) => {
                    let set = sattr(args)?;
                    let (major, minor) = (args.u32()?, args.u32()?);
                    let rdev = u64::from(
                        (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12),
                    );
                    Ok((if t == 3 { S_IFBLK } else { S_IFCHR }, set, rdev))
                }
                t @ (6 | 7) => Ok((if t == 6 { S_IFSOCK } else { S_IFIFO }, sattr(args)?, 0)),
                _ => Err(()),
            };
            Ok((h, name, what, None))
        })();
        let (h, name, what, target) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(t) = self.object_wcc(call, h, true, out).await else {
            return Ok(());
        };
        let (dir, who) = (&t.inode, &t.who);
        let Ok((kind, mut set, rdev)) = what else {
            out.u32(NFS3ERR_BADTYPE);
            wcc(out, Some(dir), Some(dir));
            return Ok(());
        };
        let mode = set.mode.take().unwrap_or(0o644);
        let made = match target {
            Some(path) => self.fs.symlink(who, dir.ino, name, path).await,
            None => self.fs.make(who, dir.ino, name, kind | mode, rdev).await,
        };
        let made = match made {
            Ok(i) if !is_empty(&set) && target.is_none() => self.fs.setattr(who, i.ino, &set).await,
            r => r,
        };
        self.answer_new(out, made, &t).await;
        Ok(())
    }

    pub(super) async fn link(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| Ok::<_, XdrError>((fh(args)?, dirop(args)?)))();
        let (file_h, (dir_h, name)) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let (file, dir) = match self.pair(call, file_h, dir_h).await {
            Ok(pair) => pair,
            Err(Nfs3Error(s)) => {
                out.u32(s);
                post_op(out, None);
                wcc(out, None, None);
                return Ok(());
            }
        };
        let (file, dir) = (file.inode, dir);
        let r = self.fs.link(&dir.who, file.ino, dir.inode.ino, name).await;
        let r = self.durable(r).await;
        let (file_after, dir_after) = (
            self.fs.getattr(file.ino).await.ok(),
            self.fs.getattr(dir.inode.ino).await.ok(),
        );
        out.u32(match &r {
            Ok(_) => NFS3_OK,
            Err(e) => Nfs3Error::from(e).0,
        });
        post_op(out, file_after.as_ref());
        wcc(out, Some(&dir.inode), dir_after.as_ref());
        Ok(())
    }

    /// REMOVE and RMDIR (`dir_kind`).
    pub(super) async fn remove(
        &self,
        call: &Call<'_>,
        dir_kind: bool,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let (h, name) = dirop(args).map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target {
            inode: dir, who, ..
        }) = self.object_wcc(call, h, true, out).await
        else {
            return Ok(());
        };
        let r = if dir_kind {
            self.fs.rmdir(&who, dir.ino, name).await
        } else {
            self.fs.unlink(&who, dir.ino, name).await
        };
        let r = self.durable(r).await;
        let after = self.fs.getattr(dir.ino).await.ok();
        out.u32(match &r {
            Ok(()) => NFS3_OK,
            Err(e) => Nfs3Error::from(e).0,
        });
        wcc(out, Some(&dir), after.as_ref());
        Ok(())
    }

    pub(super) async fn rename(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| Ok::<_, XdrError>((dirop(args)?, dirop(args)?)))();
        let ((from_h, from_name), (to_h, to_name)) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let (from, to) = match self.pair(call, from_h, to_h).await {
            Ok((f, t)) => (f.inode, t),
            Err(Nfs3Error(s)) => {
                out.u32(s);
                wcc(out, None, None);
                wcc(out, None, None);
                return Ok(());
            }
        };
        let (who, to) = (to.who, to.inode);
        let r = self
            .fs
            .rename(
                &who,
                from.ino,
                from_name,
                to.ino,
                to_name,
                RenameFlags::default(),
            )
            .await;
        let r = self.durable(r).await;
        let (from_after, to_after) = (
            self.fs.getattr(from.ino).await.ok(),
            self.fs.getattr(to.ino).await.ok(),
        );
        out.u32(match &r {
            Ok(()) => NFS3_OK,
            Err(e) => Nfs3Error::from(e).0,
        });
        wcc(out, Some(&from), from_after.as_ref());
        wcc(out, Some(&to), to_after.as_ref());
        Ok(())
    }
}
