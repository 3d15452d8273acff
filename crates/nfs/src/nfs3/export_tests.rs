//! Exports through MOUNT and NFS (who may mount what, read-only, root squash, `..` at an
//! export's root, changes across exports) and retransmitted calls answered from the duplicate
//! request cache.

use super::tests::{args, attr, body, call, dirop, no_sattr};
use super::*;
use crate::export::{parse_clients, ExportRule};
use crate::mount::MountProgram;
use crate::server::Dispatcher;
use crate::status::{NFS3ERR_ACCES, NFS3ERR_NOENT, NFS3ERR_ROFS, NFS3ERR_STALE, NFS3ERR_XDEV};
use bucketfs_fs::{ROOT_INO, S_IFDIR};
use std::net::IpAddr;

const MOUNT: u32 = 100_005;
const FAR: &str = "192.0.2.5";
const NEAR: &str = "127.0.0.1";

fn status(r: &[u8]) -> u32 {
    u32::from_be_bytes(r[24..28].try_into().unwrap())
}

fn at(peer: &str) -> Option<IpAddr> {
    Some(peer.parse().unwrap())
}

fn rule(path: &str, read_only: bool, clients: &[&str]) -> ExportRule {
    let clients: Vec<String> = clients.iter().map(|c| c.to_string()).collect();
    ExportRule {
        path: path.into(),
        read_only,
        clients: parse_clients(&clients).unwrap(),
        root_squash: true,
    }
}

fn server(fs: &Arc<Fs>, rules: Vec<ExportRule>) -> Arc<Dispatcher> {
    let exports = Arc::new(Exports::new(fs, rules).unwrap());
    Dispatcher::new(
        vec![
            Arc::new(MountProgram::new(fs.clone(), exports.clone())),
            Arc::new(Nfs3Program::new(fs.clone(), exports)),
        ],
        1 << 16,
    )
}

/// MNT of `path` as root from `peer`: the handle, or the MOUNT status.
async fn mnt(d: &Dispatcher, peer: &str, path: &[u8]) -> Result<Vec<u8>, u32> {
    let r = d
        .reply_to(&call(1, MOUNT, 1, 0, &args(&[path], &[])), at(peer))
        .await
        .unwrap();
    let mut b = body(&r);
    match b.u32().unwrap() {
        0 => Ok(b.opaque(64, "fh").unwrap().to_vec()),
        stat => Err(stat),
    }
}

/// CREATE (UNCHECKED) of `name` in `dir` as `uid` from `peer`: the status, and on success
/// the new file's owner.
async fn create(d: &Dispatcher, peer: &str, uid: u32, dir: &[u8], name: &[u8]) -> (u32, u32) {
    let mut a = dirop(dir, name);
    a.u32(0);
    no_sattr(&mut a);
    let r = d
        .reply_to(&call(2, NFS_PROGRAM, 8, uid, &a.into_bytes()), at(peer))
        .await
        .unwrap();
    let mut b = body(&r);
    let stat = b.u32().unwrap();
    if stat != NFS3_OK {
        return (stat, 0);
    }
    assert_eq!(b.bool(), Ok(true));
    b.opaque(64, "fh").unwrap();
    assert_eq!(b.bool(), Ok(true));
    (stat, attr(&mut b).2)
}

#[tokio::test]
async fn exports_decide_who_mounts_what_and_as_whom() {
    let fs = crate::memory_fs().await;
    let root = Caller::root();
    for name in [&b"pub"[..], b"ro"] {
        let dir = fs
            .make(&root, ROOT_INO, name, S_IFDIR | 0o777, 0)
            .await
            .unwrap();
        fs.make(&root, dir.ino, b"sub", S_IFDIR | 0o777, 0)
            .await
            .unwrap();
    }
    let pub_ino = fs.lookup(&root, ROOT_INO, b"pub").await.unwrap().ino;
    let d = server(
        &fs,
        vec![
            rule("/pub", false, &["*"]),
            rule("/ro", true, &["*"]),
            rule("/", false, &[NEAR]),
        ],
    );

    // Who may mount what: "/" only from loopback; a directory below an export is that
    // export's; outside every export, nothing.
    assert_eq!(mnt(&d, FAR, b"/").await, Err(13));
    let whole = mnt(&d, NEAR, b"/").await.unwrap();
    let pub_fh = mnt(&d, FAR, b"/pub").await.unwrap();
    let sub_fh = mnt(&d, FAR, b"/pub/sub").await.unwrap();
    let ro_fh = mnt(&d, FAR, b"/ro").await.unwrap();

    // A handle of the loopback-only export is refused to another client.
    let r = d
        .reply_to(&call(3, NFS_PROGRAM, 1, 0, &args(&[&whole], &[])), at(FAR))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3ERR_ACCES.0);

    // Root squash: root from afar makes files as nobody, from loopback as root; other
    // users keep their ids.
    assert_eq!(
        create(&d, FAR, 0, &pub_fh, b"far").await,
        (NFS3_OK, crate::export::NOBODY)
    );
    assert_eq!(create(&d, NEAR, 0, &pub_fh, b"near").await, (NFS3_OK, 0));
    assert_eq!(
        create(&d, FAR, 1000, &pub_fh, b"user").await,
        (NFS3_OK, 1000)
    );

    // Read-only: CREATE is ROFS; ACCESS grants reading but no change; GETATTR works.
    assert_eq!(create(&d, NEAR, 0, &ro_fh, b"x").await.0, NFS3ERR_ROFS.0);
    let all = ACCESS3_READ | ACCESS3_LOOKUP | ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE;
    let r = d
        .reply_to(
            &call(4, NFS_PROGRAM, 4, 0, &args(&[&ro_fh], &[all])),
            at(NEAR),
        )
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!(b.u32(), Ok(NFS3_OK));
    assert_eq!(b.bool(), Ok(true));
    attr(&mut b);
    assert_eq!(b.u32(), Ok(ACCESS3_READ | ACCESS3_LOOKUP));

    // `..` climbs inside the export and stops at its root.
    for (from, want) in [(&sub_fh, pub_ino), (&pub_fh, pub_ino)] {
        let r = d
            .reply_to(
                &call(5, NFS_PROGRAM, 3, 0, &args(&[from, b".."], &[])),
                at(FAR),
            )
            .await
            .unwrap();
        let mut b = body(&r);
        assert_eq!(b.u32(), Ok(NFS3_OK));
        b.opaque(64, "fh").unwrap();
        assert_eq!(b.bool(), Ok(true));
        assert_eq!(attr(&mut b).3, want);
    }

    // A rename from one export into another: XDEV, nothing moved.
    let mut a = dirop(&pub_fh, b"near");
    a.opaque(&whole).opaque(b"moved");
    let r = d
        .reply_to(&call(6, NFS_PROGRAM, 14, 0, &a.into_bytes()), at(NEAR))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3ERR_XDEV.0);
    assert!(fs.lookup(&root, pub_ino, b"near").await.is_ok());

    // After a restart without the export "/pub", its handles are STALE.
    let d = server(&fs, vec![rule("/ro", true, &["*"])]);
    let r = d
        .reply_to(&call(7, NFS_PROGRAM, 1, 0, &args(&[&pub_fh], &[])), at(FAR))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3ERR_STALE.0);
    let r = d
        .reply_to(&call(8, NFS_PROGRAM, 1, 0, &args(&[&ro_fh], &[])), at(FAR))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
}

#[tokio::test]
async fn a_resent_create_rename_or_remove_gets_the_first_answer() {
    let fs = crate::memory_fs().await;
    let d = server(&fs, Vec::new());
    let root_fh = mnt(&d, NEAR, b"/").await.unwrap();

    // GUARDED CREATE, RENAME and REMOVE, each sent twice under one xid: the second copy is
    // answered as the first was (OK), where running it again would say EXIST or NOENT.
    let mut a = dirop(&root_fh, b"a");
    a.u32(1);
    no_sattr(&mut a);
    let create = call(1, NFS_PROGRAM, 8, 0, &a.into_bytes());
    let mut a = dirop(&root_fh, b"a");
    a.opaque(&root_fh).opaque(b"b");
    let rename = call(2, NFS_PROGRAM, 14, 0, &a.into_bytes());
    let remove = call(3, NFS_PROGRAM, 12, 0, &dirop(&root_fh, b"b").into_bytes());
    for record in [&create, &rename, &remove] {
        let first = d.reply_to(record, at(NEAR)).await.unwrap();
        assert_eq!(status(&first), NFS3_OK);
        assert_eq!(d.reply_to(record, at(NEAR)).await.unwrap(), first);
    }
    // A new REMOVE (another xid) runs: the name is gone.
    let again = call(4, NFS_PROGRAM, 12, 0, &dirop(&root_fh, b"b").into_bytes());
    let r = d.reply_to(&again, at(NEAR)).await.unwrap();
    assert_eq!(status(&r), NFS3ERR_NOENT.0);
}
