//! NFS version 3 (RFC 1813) over the filesystem core: all 22 procedures, each acting as the
//! caller its AUTH_SYS credential names, as the export its handle was given under sees it
//! (export.rs). Attributes go out as fattr3 with every reply that carries them
//! (post_op_attr).

use crate::export::{Export, Exports};
use crate::handle::{self, NFS3_FHSIZE};
use crate::rpc::{AcceptStat, Call};
use crate::server::{BoxFuture, Outcome, Program};
use crate::status::{
    Nfs3Error, NFS3ERR_ACCES, NFS3ERR_NOTDIR, NFS3ERR_ROFS, NFS3ERR_STALE, NFS3_OK,
};
use crate::xdr::{Decoder, Encoder, XdrResult};
use bucketfs_fs::{
    Caller, Fs, Inode, Kind, Time, MAY_EXEC, MAY_READ, MAY_WRITE, NAME_BYTES_MAX,
    STATFS_BLOCK_BYTES,
};
use std::sync::Arc;

mod namespace;

pub const NFS_PROGRAM: u32 = 100_003;
pub const NFS_V3: u32 = 3;

/// The largest READ and WRITE this server offers (FSINFO's rtmax and wtmax).
pub const IO_BYTES_MAX: u32 = 1024 * 1024;
/// What FSINFO suggests for READDIR.
const READDIR_PREF_BYTES: u32 = 64 * 1024;
/// Entries read from the core for one READDIR or READDIRPLUS at most.
const READDIR_ENTRIES_MAX: usize = 4096;
/// Bytes of a READDIR(PLUS) reply besides its entries: status, post_op_attr, verifier, the
/// list's end and eof.
const READDIR_HEAD_BYTES: usize = 4 + 4 + 84 + 8 + 4 + 4;
/// Bytes of a READDIRPLUS entry besides its name: value-follows, fileid, name length, cookie,
/// post_op_attr and post_op_fh3.
const READDIRPLUS_ENTRY_BYTES: usize = 4 + 8 + 4 + 8 + 4 + 84 + 4 + 4 + handle::HANDLE_BYTES + 3;
/// The same for READDIR.
const READDIR_ENTRY_BYTES: usize = 4 + 8 + 4 + 8;

// ACCESS bits (RFC 1813 section 3.3.4).
const ACCESS3_READ: u32 = 0x1;
const ACCESS3_LOOKUP: u32 = 0x2;
const ACCESS3_MODIFY: u32 = 0x4;
const ACCESS3_EXTEND: u32 = 0x8;
const ACCESS3_DELETE: u32 = 0x10;
const ACCESS3_EXECUTE: u32 = 0x20;

// FSINFO properties.
const FSF3_LINK: u32 = 0x1;
const FSF3_SYMLINK: u32 = 0x2;
const FSF3_HOMOGENEOUS: u32 = 0x8;
const FSF3_CANSETTIME: u32 = 0x10;

/// The fsid every fattr3 carries: one filesystem per server.
const FSID: u64 = 1;

// stable_how.
const UNSTABLE: u32 = 0;
const FILE_SYNC: u32 = 2;

pub struct Nfs3Program {
    fs: Arc<Fs>,
    exports: Arc<Exports>,
    /// The write verifier: new at every start of the server, so a client that wrote UNSTABLE
    /// data a crash may have lost sees it change at its COMMIT and sends that data again.
    verifier: [u8; 8],
}

impl Nfs3Program {
    pub fn new(fs: Arc<Fs>, exports: Arc<Exports>) -> Nfs3Program {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let v = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 48);
        Nfs3Program {
            fs,
            exports,
            verifier: v.to_be_bytes(),
        }
    }

    pub fn verifier(&self) -> [u8; 8] {
        self.verifier
    }

    /// Resolves a handle for a call. BADHANDLE and STALE as handle.rs says (STALE also for an
    /// export no longer served), ACCES for a client its export does not admit, ROFS when the
    /// call would `change` something under a read-only export.
    async fn target(
        &self,
        call: &Call<'_>,
        h: &[u8],
        change: bool,
    ) -> Result<Target<'_>, Nfs3Error> {
        let id = handle::export_id(&self.fs, h)?;
        let export = self.exports.by_id(id).ok_or(NFS3ERR_STALE)?;
        if !export.admits(call.peer) {
            return Err(NFS3ERR_ACCES);
        }
        if change && export.rule.read_only {
            return Err(NFS3ERR_ROFS);
        }
        let inode = handle::decode(&self.fs, h).await?;
        Ok(Target {
            inode,
            export,
            who: export.caller(call.peer, &call.cred),
        })
    }

    /// The handle of `i`, under the export `t` was reached through.
    fn handle_of(&self, t: &Target<'_>, i: &Inode) -> Vec<u8> {
        handle::encode(&self.fs, t.export.id, i)
    }
}

/// A handle resolved for one call: the inode it names, the export it was given under, and the
/// caller as that export sees it (root squashed or not).
pub(super) struct Target<'e> {
    pub inode: Inode,
    pub export: &'e Export,
    pub who: Caller,
}

/// wcc_data: the size and times before the change (pre_op_attr), the attributes after.
fn wcc(e: &mut Encoder, before: Option<&Inode>, after: Option<&Inode>) {
    match before {
        Some(b) => {
            e.bool(true).u64(b.size_bytes);
            time(e, b.mtime);
            time(e, b.ctime);
        }
        None => {
            e.bool(false);
        }
    }
    post_op(e, after);
}

fn ftype(kind: Kind) -> u32 {
    match kind {
        Kind::File => 1,
        Kind::Directory => 2,
        Kind::BlockDevice => 3,
        Kind::CharDevice => 4,
        Kind::Symlink => 5,
        Kind::Socket => 6,
        Kind::Fifo => 7,
    }
}

/// nfstime3 carries unsigned seconds: times before 1970 go out as 0.
fn time(e: &mut Encoder, t: Time) {
    e.u32(t.sec.clamp(0, i64::from(u32::MAX)) as u32)
        .u32(t.nsec);
}

/// fattr3.
pub fn fattr(e: &mut Encoder, i: &Inode) {
    let rdev = i.rdev;
    let (major, minor) = (
        ((rdev >> 8) & 0xfff) as u32,
        ((rdev & 0xff) | ((rdev >> 12) & 0xfff00)) as u32,
    );
    e.u32(ftype(i.kind()))
        .u32(i.mode & 0o7777)
        .u32(i.nlink)
        .u32(i.uid)
        .u32(i.gid)
        .u64(i.size_bytes)
        .u64(i.size_bytes.div_ceil(STATFS_BLOCK_BYTES) * STATFS_BLOCK_BYTES)
        .u32(major)
        .u32(minor)
        .u64(FSID)
        .u64(i.ino);
    time(e, i.atime);
    time(e, i.mtime);
    time(e, i.ctime);
}

/// post_op_attr.
fn post_op(e: &mut Encoder, i: Option<&Inode>) {
    match i {
        Some(i) => {
            e.bool(true);
            fattr(e, i);
        }
        None => {
            e.bool(false);
        }
    }
}

fn fh<'a>(d: &mut Decoder<'a>) -> XdrResult<&'a [u8]> {
    d.opaque(NFS3_FHSIZE, "file handle")
}

/// The ACCESS bits of `asked` the caller holds on `i`.
fn access(who: &Caller, i: &Inode, asked: u32) -> u32 {
    let may = |want| who.may(i, want);
    let mut granted = 0;
    if asked & ACCESS3_READ != 0 && may(MAY_READ) {
        granted |= ACCESS3_READ;
    }
    if i.is_dir() {
        if asked & ACCESS3_LOOKUP != 0 && may(MAY_EXEC) {
            granted |= ACCESS3_LOOKUP;
        }
        if may(MAY_WRITE | MAY_EXEC) {
            granted |= asked & (ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE);
        }
    } else {
        if may(MAY_WRITE) {
            granted |= asked & (ACCESS3_MODIFY | ACCESS3_EXTEND);
        }
        if asked & ACCESS3_EXECUTE != 0 && may(MAY_EXEC) {
            granted |= ACCESS3_EXECUTE;
        }
    }
    granted
}

impl Nfs3Program {
    async fn getattr(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let h = fh(args).map_err(|_| AcceptStat::GarbageArgs)?;
        match self.target(call, h, false).await {
            Ok(t) => {
                out.u32(NFS3_OK);
                fattr(out, &t.inode);
            }
            Err(Nfs3Error(s)) => {
                out.u32(s);
            }
        }
        Ok(())
    }

    async fn lookup(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let (h, name) = (|| {
            Ok::<_, crate::xdr::XdrError>((fh(args)?, args.opaque(NAME_BYTES_MAX, "filename3")?))
        })()
        .map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(t) = self.object(call, h, out).await else {
            return Ok(());
        };
        let dir = &t.inode;
        if !dir.is_dir() {
            out.u32(NFS3ERR_NOTDIR.0);
            post_op(out, Some(dir));
            return Ok(());
        }
        let who = &t.who;
        let found = match name {
            b"." | b".." if !who.may(dir, MAY_EXEC) => Err(bucketfs_fs::FsError::Access),
            b"." => Ok(dir.clone()),
            // `..` of the export's root is the root: a client cannot walk out of its export.
            b".." => match t.export.root(&self.fs).await {
                Ok(root) if root.ino == dir.ino => Ok(dir.clone()),
                _ => self.fs.getattr(dir.parent).await,
            },
            _ => self.fs.lookup(who, dir.ino, name).await,
        };
        match found {
            Ok(i) => {
                out.u32(NFS3_OK).opaque(&self.handle_of(&t, &i));
                post_op(out, Some(&i));
                post_op(out, Some(dir));
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                post_op(out, Some(dir));
            }
        }
        Ok(())
    }

    async fn access(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let (h, asked) = (|| Ok::<_, crate::xdr::XdrError>((fh(args)?, args.u32()?)))()
            .map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(t) = self.object(call, h, out).await else {
            return Ok(());
        };
        let mut granted = access(&t.who, &t.inode, asked);
        if t.export.rule.read_only {
            granted &= !(ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE);
        }
        out.u32(NFS3_OK);
        post_op(out, Some(&t.inode));
        out.u32(granted);
        Ok(())
    }

    /// The handle resolved for a call that only reads, or the reply already holds the error
    /// and an empty post_op_attr.
    async fn object(&self, call: &Call<'_>, h: &[u8], out: &mut Encoder) -> Option<Target<'_>> {
        match self.target(call, h, false).await {
            Ok(t) => Some(t),
            Err(Nfs3Error(s)) => {
                out.u32(s);
                post_op(out, None);
                None
            }
        }
    }

    async fn readlink(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let h = fh(args).map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target { inode: i, .. }) = self.object(call, h, out).await else {
            return Ok(());
        };
        match self.fs.readlink(i.ino).await {
            Ok(target) => {
                out.u32(NFS3_OK);
                post_op(out, Some(&i));
                out.opaque(&target);
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                post_op(out, Some(&i));
            }
        }
        Ok(())
    }

    /// READ. NFS has no open, so every read checks permission; the owner may read a file
    /// whatever its mode says, as a local process that opened it before a chmod could.
    async fn read(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let (h, offset, count) =
            (|| Ok::<_, crate::xdr::XdrError>((fh(args)?, args.u64()?, args.u32()?)))()
                .map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target { inode: i, who, .. }) = self.object(call, h, out).await else {
            return Ok(());
        };
        if !(who.may(&i, MAY_READ) || who.uid == i.uid) {
            out.u32(crate::status::NFS3ERR_ACCES.0);
            post_op(out, Some(&i));
            return Ok(());
        }
        let count = count.min(IO_BYTES_MAX) as usize;
        match self.fs.read_file_pieces(i.ino, offset, count).await {
            Ok(data) => {
                let len: usize = data.iter().map(|p| p.len()).sum();
                let eof = offset.saturating_add(len as u64) >= i.size_bytes;
                out.u32(NFS3_OK);
                post_op(out, Some(&i));
                out.u32(len as u32).bool(eof).opaque_pieces(data);
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                post_op(out, Some(&i));
            }
        }
        Ok(())
    }

    /// READDIR and READDIRPLUS (`plus`): entries after `cookie` while they fit in the count the
    /// client gave. Cookies are the core's, stable while entries come and go, so the cookie
    /// verifier is always zero and never refused.
    async fn readdir(
        &self,
        call: &Call<'_>,
        plus: bool,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| {
            let h = fh(args)?;
            let cookie = args.u64()?;
            args.fixed(8)?;
            let count = args.u32()?;
            let max = if plus { args.u32()? } else { count };
            Ok::<_, crate::xdr::XdrError>((h, cookie, max))
        })();
        let (h, cookie, max) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(t) = self.object(call, h, out).await else {
            return Ok(());
        };
        let (dir, who) = (&t.inode, &t.who);
        let per_entry = if plus {
            READDIRPLUS_ENTRY_BYTES
        } else {
            READDIR_ENTRY_BYTES
        };
        let room = (max.min(IO_BYTES_MAX) as usize).saturating_sub(READDIR_HEAD_BYTES);
        let want = (room / per_entry + 1).min(READDIR_ENTRIES_MAX);
        let entries = match self.fs.readdir(who, dir.ino, cookie, want).await {
            Ok(e) => e,
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                post_op(out, Some(dir));
                return Ok(());
            }
        };
        let mut list = Encoder::new();
        let mut sent = 0;
        for e in &entries {
            let size = per_entry + e.name.len() + 3;
            if list.len() + size > room {
                break;
            }
            list.bool(true).u64(e.ino).opaque(&e.name).u64(e.cookie);
            if plus {
                match self.fs.getattr(e.ino).await {
                    Ok(i) => {
                        post_op(&mut list, Some(&i));
                        list.bool(true).opaque(&self.handle_of(&t, &i));
                    }
                    // Gone since the listing: its name without attributes or handle.
                    Err(_) => {
                        list.bool(false).bool(false);
                    }
                }
            }
            sent += 1;
        }
        if sent == 0 && !entries.is_empty() {
            out.u32(crate::status::NFS3ERR_TOOSMALL.0);
            post_op(out, Some(dir));
            return Ok(());
        }
        let eof = sent == entries.len() && entries.len() < want;
        out.u32(NFS3_OK);
        post_op(out, Some(dir));
        out.fixed(&[0; 8])
            .raw(&list.into_bytes())
            .bool(false)
            .bool(eof);
        Ok(())
    }

    /// WRITE. UNSTABLE data is answered as UNSTABLE: it is in the server's memory, and only a
    /// COMMIT (or the engine's own flush) makes it durable. DATA_SYNC and FILE_SYNC are made
    /// durable before the reply, which then says FILE_SYNC.
    async fn write(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| {
            let h = fh(args)?;
            let (offset, count, stable) = (args.u64()?, args.u32()?, args.u32()?);
            let data = args.opaque(IO_BYTES_MAX as usize, "write data")?;
            Ok::<_, crate::xdr::XdrError>((h, offset, count, stable, data))
        })();
        let (h, offset, count, stable, data) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        if count as usize != data.len() || stable > FILE_SYNC {
            return Err(AcceptStat::GarbageArgs);
        }
        let Some(Target {
            inode: before, who, ..
        }) = self.object_wcc(call, h, true, out).await
        else {
            return Ok(());
        };
        if !(who.may(&before, MAY_WRITE) || who.uid == before.uid) {
            out.u32(crate::status::NFS3ERR_ACCES.0);
            wcc(out, Some(&before), Some(&before));
            return Ok(());
        }
        let mut result = self
            .fs
            .write_file(&who, before.ino, offset, data, false)
            .await;
        if stable != UNSTABLE {
            if let Ok(after) = &result {
                let ino = after.ino;
                if let Err(e) = self.fs.fsync(ino).await {
                    result = Err(e);
                }
            }
        }
        match result {
            Ok(after) => {
                out.u32(NFS3_OK);
                wcc(out, Some(&before), Some(&after));
                out.u32(count)
                    .u32(if stable == UNSTABLE {
                        UNSTABLE
                    } else {
                        FILE_SYNC
                    })
                    .fixed(&self.verifier);
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                let now = self.fs.getattr(before.ino).await.ok();
                wcc(out, Some(&before), now.as_ref());
            }
        }
        Ok(())
    }

    /// COMMIT: returns once everything written before it is durable (the engine's log is one
    /// order, so that covers the whole file, whatever range was asked).
    async fn commit(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let parsed = (|| Ok::<_, crate::xdr::XdrError>((fh(args)?, args.u64()?, args.u32()?)))();
        let (h, _offset, _count) = parsed.map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target { inode: i, .. }) = self.object_wcc(call, h, false, out).await else {
            return Ok(());
        };
        match self.fs.fsync(i.ino).await {
            Ok(()) => {
                out.u32(NFS3_OK);
                wcc(out, Some(&i), Some(&i));
                out.fixed(&self.verifier);
            }
            Err(e) => {
                out.u32(Nfs3Error::from(&e).0);
                wcc(out, Some(&i), Some(&i));
            }
        }
        Ok(())
    }

    /// Like `object`, for replies whose failure carries wcc_data; `change` as for `target`.
    async fn object_wcc(
        &self,
        call: &Call<'_>,
        h: &[u8],
        change: bool,
        out: &mut Encoder,
    ) -> Option<Target<'_>> {
        match self.target(call, h, change).await {
            Ok(t) => Some(t),
            Err(Nfs3Error(s)) => {
                out.u32(s);
                wcc(out, None, None);
                None
            }
        }
    }

    /// FSSTAT, FSINFO and PATHCONF: facts about the filesystem, with the attributes of the
    /// handle they were asked through.
    async fn fs_facts(
        &self,
        call: &Call<'_>,
        args: &mut Decoder<'_>,
        out: &mut Encoder,
    ) -> Result<(), AcceptStat> {
        let h = fh(args).map_err(|_| AcceptStat::GarbageArgs)?;
        let Some(Target { inode: i, .. }) = self.object(call, h, out).await else {
            return Ok(());
        };
        out.u32(NFS3_OK);
        post_op(out, Some(&i));
        match call.procedure {
            18 => {
                let s = self.fs.statfs();
                out.u64(s.blocks * STATFS_BLOCK_BYTES)
                    .u64(s.blocks_free * STATFS_BLOCK_BYTES)
                    .u64(s.blocks_free * STATFS_BLOCK_BYTES)
                    .u64(s.files)
                    .u64(s.files_free)
                    .u64(s.files_free)
                    .u32(0);
            }
            19 => {
                out.u32(IO_BYTES_MAX)
                    .u32(IO_BYTES_MAX)
                    .u32(STATFS_BLOCK_BYTES as u32)
                    .u32(IO_BYTES_MAX)
                    .u32(IO_BYTES_MAX)
                    .u32(STATFS_BLOCK_BYTES as u32)
                    .u32(READDIR_PREF_BYTES)
                    .u64(bucketfs_fs::FILE_SIZE_BYTES_MAX)
                    .u32(0)
                    .u32(1)
                    .u32(FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME);
            }
            _ => {
                out.u32(u32::MAX)
                    .u32(NAME_BYTES_MAX as u32)
                    .bool(true)
                    .bool(true)
                    .bool(false)
                    .bool(true);
            }
        }
        Ok(())
    }
}

impl Program for Nfs3Program {
    fn number(&self) -> u32 {
        NFS_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (NFS_V3, NFS_V3)
    }

    /// SETATTR and the procedures that make, remove or rename: run twice, the second would
    /// fail (EXIST, NOENT) or undo a change made since (a size set again).
    fn idempotent(&self, procedure: u32) -> bool {
        !matches!(procedure, 2 | 8..=15)
    }

    fn call<'a>(&'a self, call: &'a Call<'a>) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let mut args = Decoder::new(call.args);
            let mut out = Encoder::new();
            match call.procedure {
                0 => {}
                1 => self.getattr(call, &mut args, &mut out).await?,
                2 => self.setattr(call, &mut args, &mut out).await?,
                3 => self.lookup(call, &mut args, &mut out).await?,
                4 => self.access(call, &mut args, &mut out).await?,
                5 => self.readlink(call, &mut args, &mut out).await?,
                6 => self.read(call, &mut args, &mut out).await?,
                7 => self.write(call, &mut args, &mut out).await?,
                8 => self.create(call, false, &mut args, &mut out).await?,
                9 => self.create(call, true, &mut args, &mut out).await?,
                10 => self.make_special(call, true, &mut args, &mut out).await?,
                11 => self.make_special(call, false, &mut args, &mut out).await?,
                12 => self.remove(call, false, &mut args, &mut out).await?,
                13 => self.remove(call, true, &mut args, &mut out).await?,
                14 => self.rename(call, &mut args, &mut out).await?,
                15 => self.link(call, &mut args, &mut out).await?,
                16 => self.readdir(call, false, &mut args, &mut out).await?,
                17 => self.readdir(call, true, &mut args, &mut out).await?,
                18..=20 => self.fs_facts(call, &mut args, &mut out).await?,
                21 => self.commit(call, &mut args, &mut out).await?,
                _ => return Err(AcceptStat::ProcUnavail),
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod export_tests;
#[cfg(test)]
mod tests;
