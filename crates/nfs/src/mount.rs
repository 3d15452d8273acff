//! MOUNT version 3 (RFC 1813 appendix I): how a client gets the file handle of an export's
//! root. It is served on the NFS port itself, so no portmapper is needed. The mounts listed
//! by DUMP are the clients' own word, kept in memory: a hint, as everywhere.

use crate::export::{Clients, Exports};
use crate::handle;
use crate::rpc::{AcceptStat, Call, Credentials, AUTH_SYS};
use crate::server::{BoxFuture, Outcome, Program};
use crate::xdr::{Decoder, Encoder};
use bucketfs_fs::{Fs, FsError, ROOT_INO};
use parking_lot::Mutex;
use std::sync::Arc;

pub const MOUNT_PROGRAM: u32 = 100_005;
pub const MOUNT_V3: u32 = 3;
/// MNTPATHLEN and MNTNAMLEN.
const PATH_BYTES_MAX: usize = 1024;
const NAME_BYTES_MAX: usize = 255;

const MNT3_OK: u32 = 0;
const MNT3ERR_NOENT: u32 = 2;
const MNT3ERR_IO: u32 = 5;
const MNT3ERR_ACCES: u32 = 13;
const MNT3ERR_NOTDIR: u32 = 20;
const MNT3ERR_INVAL: u32 = 22;
const MNT3ERR_NAMETOOLONG: u32 = 63;
const MNT3ERR_SERVERFAULT: u32 = 10006;

pub struct MountProgram {
    fs: Arc<Fs>,
    exports: Arc<Exports>,
    /// (client's machine name, path) of each MNT not yet undone by UMNT.
    mounts: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
}

impl MountProgram {
    pub fn new(fs: Arc<Fs>, exports: Arc<Exports>) -> MountProgram {
        MountProgram {
            fs,
            exports,
            mounts: Mutex::default(),
        }
    }

    /// MNT: the handle of `path`'s directory, looked up as the caller, if an export that
    /// admits the client holds it.
    async fn mnt(&self, call: &Call<'_>, path: &[u8]) -> Result<Vec<u8>, u32> {
        let export = match self.exports.holding(path) {
            Some(e) if path.starts_with(b"/") && e.admits(call.peer) => e,
            _ => return Err(MNT3ERR_ACCES),
        };
        let who = export.caller(call.peer, &call.cred);
        let mut inode = self.fs.getattr(ROOT_INO).await.map_err(|e| status(&e))?;
        for name in path.split(|&b| b == b'/').filter(|n| !n.is_empty()) {
            if name.len() > NAME_BYTES_MAX {
                return Err(MNT3ERR_NAMETOOLONG);
            }
            if !inode.is_dir() {
                return Err(MNT3ERR_NOTDIR);
            }
            inode = self
                .fs
                .lookup(&who, inode.ino, name)
                .await
                .map_err(|e| status(&e))?;
        }
        if !inode.is_dir() {
            return Err(MNT3ERR_NOTDIR);
        }
        Ok(handle::encode(&self.fs, export.id, &inode))
    }
}

fn status(e: &FsError) -> u32 {
    match e.errno() {
        libc::ENOENT => MNT3ERR_NOENT,
        libc::EACCES | libc::EPERM => MNT3ERR_ACCES,
        libc::ENOTDIR => MNT3ERR_NOTDIR,
        libc::EINVAL => MNT3ERR_INVAL,
        libc::ENAMETOOLONG => MNT3ERR_NAMETOOLONG,
        libc::EIO => MNT3ERR_IO,
        _ => MNT3ERR_SERVERFAULT,
    }
}

fn machine(cred: &Credentials) -> Vec<u8> {
    match cred {
        Credentials::Sys { machine, .. } => machine.clone(),
        Credentials::None => b"unknown".to_vec(),
    }
}

impl Program for MountProgram {
    fn number(&self) -> u32 {
        MOUNT_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (MOUNT_V3, MOUNT_V3)
    }

    fn call<'a>(&'a self, call: &'a Call<'a>) -> BoxFuture<'a, Outcome> {
        Box::pin(async move {
            let mut args = Decoder::new(call.args);
            let mut out = Encoder::new();
            match call.procedure {
                // NULL
                0 => {}
                // MNT
                1 => {
                    let path = args
                        .opaque(PATH_BYTES_MAX, "dirpath")
                        .map_err(|_| AcceptStat::GarbageArgs)?;
                    match self.mnt(call, path).await {
                        Ok(h) => {
                            out.u32(MNT3_OK).opaque(&h).u32(1).u32(AUTH_SYS);
                            self.mounts
                                .lock()
                                .push((machine(&call.cred), path.to_vec()));
                        }
                        Err(stat) => {
                            out.u32(stat);
                        }
                    }
                }
                // DUMP
                2 => {
                    for (host, dir) in self.mounts.lock().iter() {
                        out.bool(true).opaque(host).opaque(dir);
                    }
                    out.bool(false);
                }
                // UMNT
                3 => {
                    let path = args
                        .opaque(PATH_BYTES_MAX, "dirpath")
                        .map_err(|_| AcceptStat::GarbageArgs)?;
                    let host = machine(&call.cred);
                    self.mounts
                        .lock()
                        .retain(|(h, d)| !(h == &host && d == path));
                }
                // UMNTALL
                4 => {
                    let host = machine(&call.cred);
                    self.mounts.lock().retain(|(h, _)| h != &host);
                }
                // EXPORT: every export with the clients it admits (no groups: everyone).
                5 => {
                    for e in self.exports.iter() {
                        out.bool(true).opaque(e.rule.path.as_bytes());
                        if let Clients::Networks(nets) = &e.rule.clients {
                            for net in nets {
                                out.bool(true).opaque(net.to_string().as_bytes());
                            }
                        }
                        out.bool(false);
                    }
                    out.bool(false);
                }
                _ => return Err(AcceptStat::ProcUnavail),
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc;
    use crate::server::Dispatcher;
    use bucketfs_fs::{Caller, S_IFDIR, S_IFREG};

    fn call(xid: u32, procedure: u32, uid: u32, args: &[u8]) -> Vec<u8> {
        rpc::encode_call(xid, MOUNT_PROGRAM, 3, procedure, b"host-a", uid, uid, args)
    }

    fn path(p: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new();
        e.opaque(p);
        e.into_bytes()
    }

    /// The body of a successful reply (after the 24-byte accepted header).
    fn body(reply: &[u8]) -> Decoder<'_> {
        assert_eq!(reply[20..24], [0, 0, 0, 0], "accept_stat SUCCESS");
        Decoder::new(&reply[24..])
    }

    #[tokio::test]
    async fn mnt_hands_out_the_root_handle_and_refuses_what_it_must() {
        let fs = crate::memory_fs().await;
        let root = Caller::root();
        let private = fs
            .make(&root, ROOT_INO, b"private", S_IFDIR | 0o700, 0)
            .await
            .unwrap();
        fs.make(&root, private.ino, b"inner", S_IFDIR | 0o755, 0)
            .await
            .unwrap();
        fs.make(&root, ROOT_INO, b"file", S_IFREG | 0o644, 0)
            .await
            .unwrap();
        let d = Dispatcher::new(
            vec![Arc::new(MountProgram::new(fs.clone(), crate::whole(&fs)))],
            1 << 16,
        );

        let r = d.reply(&call(1, 1, 0, &path(b"/"))).await.unwrap();
        let mut b = body(&r);
        assert_eq!(b.u32(), Ok(MNT3_OK));
        let h = b.opaque(64, "handle").unwrap().to_vec();
        assert_eq!(handle::decode(&fs, &h).await.unwrap().ino, ROOT_INO);
        assert_eq!((b.u32(), b.u32()), (Ok(1), Ok(AUTH_SYS)));

        // Root reaches into the private directory; uid 1000 may not search it.
        let r = d
            .reply(&call(2, 1, 0, &path(b"/private/inner")))
            .await
            .unwrap();
        assert_eq!(body(&r).u32(), Ok(MNT3_OK));
        for (p, uid, want) in [
            (&b"/private/inner"[..], 1000, MNT3ERR_ACCES),
            (b"/missing", 0, MNT3ERR_NOENT),
            (b"/file", 0, MNT3ERR_NOTDIR),
            (b"relative", 0, MNT3ERR_ACCES),
        ] {
            let r = d.reply(&call(3, 1, uid, &path(p))).await.unwrap();
            assert_eq!(body(&r).u32(), Ok(want), "{}", String::from_utf8_lossy(p));
        }

        // DUMP lists the two mounts; UMNT of one leaves the other; EXPORT lists "/".
        let r = d.reply(&call(4, 2, 0, &[])).await.unwrap();
        let mut b = body(&r);
        assert_eq!(b.bool(), Ok(true));
        assert_eq!(b.opaque(255, "host"), Ok(&b"host-a"[..]));
        assert_eq!(b.opaque(1024, "dir"), Ok(&b"/"[..]));
        d.reply(&call(5, 3, 0, &path(b"/"))).await.unwrap();
        let r = d.reply(&call(6, 2, 0, &[])).await.unwrap();
        let mut b = body(&r);
        assert_eq!(b.bool(), Ok(true));
        b.opaque(255, "host").unwrap();
        assert_eq!(b.opaque(1024, "dir"), Ok(&b"/private/inner"[..]));
        assert_eq!(b.bool(), Ok(false));
        let r = d.reply(&call(7, 5, 0, &[])).await.unwrap();
        let mut b = body(&r);
        assert_eq!(b.bool(), Ok(true));
        assert_eq!(b.opaque(1024, "dir"), Ok(&b"/"[..]));
        assert_eq!((b.bool(), b.bool()), (Ok(false), Ok(false)));

        // A path longer than MNTPATHLEN, and a procedure MOUNT does not have.
        let long = path(&[b'a'; 1025]);
        assert_eq!(
            d.reply(&call(8, 1, 0, &long)).await.unwrap(),
            rpc::accepted(8, AcceptStat::GarbageArgs, &[])
        );
        assert_eq!(
            d.reply(&call(9, 6, 0, &[])).await.unwrap(),
            rpc::accepted(9, AcceptStat::ProcUnavail, &[])
        );
    }
}
