//! NFSv3 procedures through the RPC dispatcher, beside MOUNT, over the core on `memory://`.

use super::*;
use crate::mount::MountProgram;
use crate::rpc;
use crate::server::Dispatcher;
use crate::status::{NFS3ERR_ACCES, NFS3ERR_BADHANDLE, NFS3ERR_NOENT};
use bucketfs_fs::{ROOT_INO, S_IFDIR, S_IFREG};

/// A call record. Each gets a transaction id of its own (`xid` in the low 16 bits), as a
/// client's calls do: the same call under one id twice would be answered from the duplicate
/// request cache.
pub(super) fn call(xid: u32, prog: u32, procedure: u32, uid: u32, args: &[u8]) -> Vec<u8> {
    static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let xid = xid | SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 16;
    rpc::encode_call(xid, prog, 3, procedure, b"host", uid, uid, args)
}

/// A handle under the default export.
pub(super) fn encode(fs: &Fs, i: &Inode) -> Vec<u8> {
    handle::encode(fs, crate::whole(fs).iter().next().unwrap().id, i)
}

pub(super) fn body(reply: &[u8]) -> Decoder<'_> {
    assert_eq!(reply[20..24], [0, 0, 0, 0], "accept_stat SUCCESS");
    Decoder::new(&reply[24..])
}

/// fattr3's type, mode, uid and fileid, skipping the rest.
pub(super) fn attr(d: &mut Decoder<'_>) -> (u32, u32, u32, u64) {
    let (t, mode, _nlink, uid, _gid) = (
        d.u32().unwrap(),
        d.u32().unwrap(),
        d.u32(),
        d.u32().unwrap(),
        d.u32(),
    );
    let (_size, _used, _rdev, _fsid) = (d.u64(), d.u64(), d.u64(), d.u64());
    let fileid = d.u64().unwrap();
    for _ in 0..6 {
        d.u32().unwrap();
    }
    (t, mode, uid, fileid)
}

pub(super) fn args(parts: &[&[u8]], tail: &[u32]) -> Vec<u8> {
    let mut e = Encoder::new();
    for p in parts {
        e.opaque(p);
    }
    for v in tail {
        e.u32(*v);
    }
    e.into_bytes()
}

#[tokio::test]
async fn getattr_lookup_access_and_the_facts_of_the_filesystem() {
    let fs = crate::memory_fs().await;
    let root = Caller::root();
    let private = fs
        .make(&root, ROOT_INO, b"private", S_IFDIR | 0o700, 0)
        .await
        .unwrap();
    let file = fs
        .make(&root, ROOT_INO, b"file", S_IFREG | 0o640, 0)
        .await
        .unwrap();
    let d = Dispatcher::new(
        vec![
            Arc::new(MountProgram::new(fs.clone(), crate::whole(&fs))),
            Arc::new(Nfs3Program::new(fs.clone(), crate::whole(&fs))),
        ],
        1 << 16,
    );
    let r = d
        .reply(&call(1, 100_005, 1, 0, &args(&[b"/"], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!(b.u32(), Ok(0));
    let root_fh = b.opaque(64, "fh").unwrap().to_vec();

    // GETATTR of the root: a directory, 0755, owned by root, file id 1.
    let r = d
        .reply(&call(2, NFS_PROGRAM, 1, 0, &args(&[&root_fh], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!(b.u32(), Ok(NFS3_OK));
    assert_eq!(attr(&mut b), (2, 0o755, 0, ROOT_INO));

    // LOOKUP of the file as uid 1000: found, with the file's and the directory's attributes.
    let r = d
        .reply(&call(
            3,
            NFS_PROGRAM,
            3,
            1000,
            &args(&[&root_fh, b"file"], &[]),
        ))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!(b.u32(), Ok(NFS3_OK));
    let file_fh = b.opaque(64, "fh").unwrap().to_vec();
    assert_eq!(b.bool(), Ok(true));
    assert_eq!(attr(&mut b), (1, 0o640, 0, file.ino));
    assert_eq!(b.bool(), Ok(true));
    assert_eq!(attr(&mut b).3, ROOT_INO);
    // A missing name, and a name below a directory uid 1000 may not search.
    let r = d
        .reply(&call(
            4,
            NFS_PROGRAM,
            3,
            1000,
            &args(&[&root_fh, b"nope"], &[]),
        ))
        .await
        .unwrap();
    assert_eq!(body(&r).u32(), Ok(NFS3ERR_NOENT.0));
    let private_fh = encode(&fs, &private);
    let r = d
        .reply(&call(
            5,
            NFS_PROGRAM,
            3,
            1000,
            &args(&[&private_fh, b".."], &[]),
        ))
        .await
        .unwrap();
    assert_eq!(body(&r).u32(), Ok(NFS3ERR_ACCES.0));

    // ACCESS: uid 1000 (other) may read the 0640 file? No; root may read and modify it.
    let all = ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_EXECUTE;
    for (uid, want) in [
        (1000, 0),
        (0, ACCESS3_READ | ACCESS3_MODIFY | ACCESS3_EXTEND),
    ] {
        let r = d
            .reply(&call(6, NFS_PROGRAM, 4, uid, &args(&[&file_fh], &[all])))
            .await
            .unwrap();
        let mut b = body(&r);
        assert_eq!(b.u32(), Ok(NFS3_OK));
        assert_eq!(b.bool(), Ok(true));
        attr(&mut b);
        assert_eq!(b.u32(), Ok(want), "uid {uid}");
    }
    // A POSIX ACL naming uid 1000 with r-- (and a mask of r--) lets it read, and no more.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 1000u32),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    fs.set_xattr(
        &root,
        file.ino,
        bucketfs_fs::ACL_XATTR_ACCESS,
        Some(&acl),
        bucketfs_fs::XattrMode::Any,
    )
    .await
    .unwrap();
    let r = d
        .reply(&call(6, NFS_PROGRAM, 4, 1000, &args(&[&file_fh], &[all])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
    attr(&mut b);
    assert_eq!(b.u32(), Ok(ACCESS3_READ), "uid 1000 by the ACL");

    // FSINFO: the transfer sizes; PATHCONF: names up to 255 bytes.
    let r = d
        .reply(&call(7, NFS_PROGRAM, 19, 0, &args(&[&root_fh], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
    attr(&mut b);
    assert_eq!(b.u32(), Ok(IO_BYTES_MAX));
    let r = d
        .reply(&call(8, NFS_PROGRAM, 20, 0, &args(&[&root_fh], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
    attr(&mut b);
    assert_eq!((b.u32(), b.u32()), (Ok(u32::MAX), Ok(255)));

    // WRITE UNSTABLE answers UNSTABLE with the verifier; COMMIT answers the same verifier;
    // FILE_SYNC answers FILE_SYNC. READ gives the bytes back.
    let nfs3 = Nfs3Program::new(fs.clone(), crate::whole(&fs));
    let verifier = nfs3.verifier();
    let d2 = Dispatcher::new(vec![Arc::new(nfs3)], 1 << 16);
    for (xid, stable, want) in [
        (20, UNSTABLE, UNSTABLE),
        (21, 1, FILE_SYNC),
        (22, FILE_SYNC, FILE_SYNC),
    ] {
        let mut a = Encoder::new();
        a.opaque(&file_fh)
            .u64(0)
            .u32(5)
            .u32(stable)
            .opaque(b"12345");
        let r = d2
            .reply(&call(xid, NFS_PROGRAM, 7, 0, &a.into_bytes()))
            .await
            .unwrap();
        let mut b = body(&r);
        assert_eq!(b.u32(), Ok(NFS3_OK));
        assert_eq!(b.bool(), Ok(true));
        assert_eq!(
            b.u64(),
            Ok(if xid == 20 { 0 } else { 5 }),
            "the size before"
        );
        b.fixed(16).unwrap();
        assert_eq!(b.bool(), Ok(true));
        attr(&mut b);
        assert_eq!((b.u32(), b.u32()), (Ok(5), Ok(want)));
        assert_eq!(b.fixed(8), Ok(&verifier[..]));
    }
    let mut a = Encoder::new();
    a.opaque(&file_fh).u64(0).u32(0);
    let r = d2
        .reply(&call(23, NFS_PROGRAM, 21, 0, &a.into_bytes()))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!(b.u32(), Ok(NFS3_OK));
    assert_eq!((b.bool(), b.u64()), (Ok(true), Ok(5)));
    b.fixed(16).unwrap();
    assert_eq!(b.bool(), Ok(true));
    attr(&mut b);
    assert_eq!(b.fixed(8), Ok(&verifier[..]));
    assert_eq!(fs.read_file(file.ino, 0, 10).await.unwrap(), b"12345");
    // A count that is not the data's length is garbage; uid 1000 may not write root's 0640 file.
    let mut a = Encoder::new();
    a.opaque(&file_fh)
        .u64(0)
        .u32(9)
        .u32(UNSTABLE)
        .opaque(b"12345");
    assert_eq!(
        d2.reply(&call(24, NFS_PROGRAM, 7, 0, &a.into_bytes()))
            .await
            .unwrap()[4..],
        rpc::accepted(24, AcceptStat::GarbageArgs, &[])[4..]
    );
    let mut a = Encoder::new();
    a.opaque(&file_fh)
        .u64(0)
        .u32(5)
        .u32(UNSTABLE)
        .opaque(b"12345");
    let r = d2
        .reply(&call(25, NFS_PROGRAM, 7, 1000, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(body(&r).u32(), Ok(NFS3ERR_ACCES.0));

    // A forged handle, and arguments cut short.
    let mut forged = root_fh.clone();
    forged[3] ^= 1;
    let r = d
        .reply(&call(9, NFS_PROGRAM, 1, 0, &args(&[&forged], &[])))
        .await
        .unwrap();
    assert_eq!(body(&r).u32(), Ok(NFS3ERR_BADHANDLE.0));
    assert_eq!(
        d.reply(&call(10, NFS_PROGRAM, 4, 0, &args(&[&file_fh], &[])))
            .await
            .unwrap()[4..],
        rpc::accepted(10, AcceptStat::GarbageArgs, &[])[4..]
    );
}

pub(super) fn dirop(dir: &[u8], name: &[u8]) -> Encoder {
    let mut e = Encoder::new();
    e.opaque(dir).opaque(name);
    e
}

/// An empty sattr3 (nothing set).
pub(super) fn no_sattr(e: &mut Encoder) {
    e.u32(0).u32(0).u32(0).u32(0).u32(0).u32(0);
}

#[tokio::test]
async fn create_mkdir_rename_remove_and_setattr() {
    let fs = crate::memory_fs().await;
    let root_fh = encode(&fs, &fs.getattr(ROOT_INO).await.unwrap());
    let d = Dispatcher::new(
        vec![Arc::new(Nfs3Program::new(fs.clone(), crate::whole(&fs)))],
        1 << 16,
    );
    let status = |r: &[u8]| u32::from_be_bytes(r[24..28].try_into().unwrap());

    // GUARDED creates, then refuses an existing name.
    for want in [NFS3_OK, 17] {
        let mut a = dirop(&root_fh, b"new");
        a.u32(1);
        no_sattr(&mut a);
        let r = d
            .reply(&call(1, NFS_PROGRAM, 8, 0, &a.into_bytes()))
            .await
            .unwrap();
        assert_eq!(status(&r), want);
    }
    // EXCLUSIVE: the same verifier again is the same create; another verifier is EXIST.
    let mut handles = Vec::new();
    for (verifier, want) in [
        (*b"verifier", NFS3_OK),
        (*b"verifier", NFS3_OK),
        (*b"another!", 17),
    ] {
        let mut a = dirop(&root_fh, b"ex");
        a.u32(2).fixed(&verifier);
        let r = d
            .reply(&call(2, NFS_PROGRAM, 8, 0, &a.into_bytes()))
            .await
            .unwrap();
        assert_eq!(status(&r), want);
        if want == NFS3_OK {
            let mut b = body(&r);
            b.u32().unwrap();
            assert_eq!(b.bool(), Ok(true));
            handles.push(b.opaque(64, "fh").unwrap().to_vec());
        }
    }
    assert_eq!(handles[0], handles[1]);
    // uid 1000 may not create in root's 0755 directory.
    let mut a = dirop(&root_fh, b"nope");
    a.u32(0);
    no_sattr(&mut a);
    let r = d
        .reply(&call(3, NFS_PROGRAM, 8, 1000, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3ERR_ACCES.0);

    // MKDIR, RENAME into it, REMOVE, RMDIR.
    let mut a = dirop(&root_fh, b"d");
    no_sattr(&mut a);
    let r = d
        .reply(&call(4, NFS_PROGRAM, 9, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let mut b = body(&r);
    b.u32().unwrap();
    b.bool().unwrap();
    let d_fh = b.opaque(64, "fh").unwrap().to_vec();
    let mut a = dirop(&root_fh, b"new");
    a.opaque(&d_fh).opaque(b"moved");
    let r = d
        .reply(&call(5, NFS_PROGRAM, 14, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let r = d
        .reply(&call(
            6,
            NFS_PROGRAM,
            13,
            0,
            &dirop(&root_fh, b"d").into_bytes(),
        ))
        .await
        .unwrap();
    assert_eq!(status(&r), 66, "rmdir of a non-empty directory: NOTEMPTY");
    let r = d
        .reply(&call(
            7,
            NFS_PROGRAM,
            12,
            0,
            &dirop(&d_fh, b"moved").into_bytes(),
        ))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let r = d
        .reply(&call(
            8,
            NFS_PROGRAM,
            13,
            0,
            &dirop(&root_fh, b"d").into_bytes(),
        ))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let r = d
        .reply(&call(9, NFS_PROGRAM, 1, 0, &args(&[&d_fh], &[])))
        .await
        .unwrap();
    assert_eq!(status(&r), 70, "the removed directory's handle is STALE");

    // SETATTR: a guard on another ctime is NOT_SYNC; without it the mode and size are set.
    let ex = fs.lookup(&Caller::root(), ROOT_INO, b"ex").await.unwrap();
    for (guard, want) in [(Some((1u32, 0u32)), 10002), (None, NFS3_OK)] {
        let mut a = Encoder::new();
        a.opaque(&handles[0]);
        a.u32(1)
            .u32(0o600)
            .u32(0)
            .u32(0)
            .u32(1)
            .u64(3)
            .u32(0)
            .u32(0);
        match guard {
            Some((s, n)) => a.u32(1).u32(s).u32(n),
            None => a.u32(0),
        };
        let r = d
            .reply(&call(10, NFS_PROGRAM, 2, 0, &a.into_bytes()))
            .await
            .unwrap();
        assert_eq!(status(&r), want);
    }
    let after = fs.getattr(ex.ino).await.unwrap();
    assert_eq!((after.mode & 0o7777, after.size_bytes), (0o600, 3));

    // SYMLINK, then READLINK through the handle it answers; MKNOD of a FIFO and of a
    // character device (major 1, minor 3); MKNOD of a regular file is BADTYPE; LINK.
    let mut a = dirop(&root_fh, b"sl");
    no_sattr(&mut a);
    a.opaque(b"target/path");
    let r = d
        .reply(&call(11, NFS_PROGRAM, 10, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let mut b = body(&r);
    b.u32().unwrap();
    b.bool().unwrap();
    let sl = b.opaque(64, "fh").unwrap().to_vec();
    let r = d
        .reply(&call(12, NFS_PROGRAM, 5, 0, &args(&[&sl], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
    attr(&mut b);
    assert_eq!(b.opaque(4096, "path"), Ok(&b"target/path"[..]));
    let mut a = dirop(&root_fh, b"fifo");
    a.u32(7);
    no_sattr(&mut a);
    let r = d
        .reply(&call(13, NFS_PROGRAM, 11, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let mut a = dirop(&root_fh, b"null");
    a.u32(4);
    no_sattr(&mut a);
    a.u32(1).u32(3);
    let r = d
        .reply(&call(14, NFS_PROGRAM, 11, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    let mut b = body(&r);
    b.u32().unwrap();
    b.bool().unwrap();
    b.opaque(64, "fh").unwrap();
    b.bool().unwrap();
    assert_eq!(attr_with_rdev(&mut b), (4, 1, 3));
    let mut a = dirop(&root_fh, b"regular");
    a.u32(1);
    let r = d
        .reply(&call(15, NFS_PROGRAM, 11, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), 10007);
    let mut a = Encoder::new();
    a.opaque(&handles[0]).opaque(&root_fh).opaque(b"ex-link");
    let r = d
        .reply(&call(16, NFS_PROGRAM, 15, 0, &a.into_bytes()))
        .await
        .unwrap();
    assert_eq!(status(&r), NFS3_OK);
    assert_eq!(fs.getattr(ex.ino).await.unwrap().nlink, 2);
}

/// fattr3's (type, major, minor), skipping the rest.
fn attr_with_rdev(d: &mut Decoder<'_>) -> (u32, u32, u32) {
    let t = d.u32().unwrap();
    for _ in 0..4 {
        d.u32().unwrap();
    }
    d.u64().unwrap();
    d.u64().unwrap();
    let (major, minor) = (d.u32().unwrap(), d.u32().unwrap());
    d.u64().unwrap();
    d.u64().unwrap();
    for _ in 0..6 {
        d.u32().unwrap();
    }
    (t, major, minor)
}

/// Entries of a READDIR (or READDIRPLUS, `plus`) reply: (file id, name, cookie, and for
/// READDIRPLUS the file id its attributes name and its handle), and eof.
type Listed = (u64, Vec<u8>, u64, Option<(u64, Vec<u8>)>);

fn listed(reply: &[u8], plus: bool) -> (Vec<Listed>, bool) {
    let mut b = body(reply);
    assert_eq!(b.u32(), Ok(NFS3_OK));
    assert_eq!(b.bool(), Ok(true), "the directory's attributes");
    attr(&mut b);
    assert_eq!(b.fixed(8), Ok(&[0u8; 8][..]), "the cookie verifier");
    let mut out = Vec::new();
    while b.bool().unwrap() {
        let (id, name, cookie) = (
            b.u64().unwrap(),
            b.opaque(255, "name").unwrap().to_vec(),
            b.u64().unwrap(),
        );
        let extra = plus.then(|| {
            assert_eq!(b.bool(), Ok(true), "attributes of {name:?}");
            let of = attr(&mut b).3;
            assert_eq!(b.bool(), Ok(true), "a handle of {name:?}");
            (of, b.opaque(64, "fh").unwrap().to_vec())
        });
        out.push((id, name, cookie, extra));
    }
    let eof = b.bool().unwrap();
    assert!(b.is_empty(), "nothing after eof");
    (out, eof)
}

#[tokio::test]
async fn null_read_readdir_readdirplus_and_fsstat() {
    let fs = crate::memory_fs().await;
    let root = Caller::root();
    let dir = fs
        .make(&root, ROOT_INO, b"d", S_IFDIR | 0o755, 0)
        .await
        .unwrap();
    let mut names = Vec::new();
    for i in 0..40 {
        let name = format!("f{i:02}").into_bytes();
        fs.make(&root, dir.ino, &name, S_IFREG | 0o644, 0)
            .await
            .unwrap();
        names.push(name);
    }
    let file = fs
        .make(&root, ROOT_INO, b"data", S_IFREG | 0o600, 0)
        .await
        .unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    fs.write_file(&root, file.ino, 0, data.as_slice(), false)
        .await
        .unwrap();
    let file = fs.getattr(file.ino).await.unwrap();
    let d = Dispatcher::new(
        vec![Arc::new(Nfs3Program::new(fs.clone(), crate::whole(&fs)))],
        1 << 16,
    );
    let (dir_fh, file_fh) = (encode(&fs, &dir), encode(&fs, &file));

    // NULL: accepted, and nothing in the reply after the accept state.
    let r = d.reply(&call(1, NFS_PROGRAM, 0, 0, &[])).await.unwrap();
    assert!(body(&r).is_empty(), "NULL answers nothing: {r:?}");

    // READ: a range inside the file, then one running past its end (eof, short).
    for (offset, count, want) in [(100u64, 1000u32, 100..1100), (9_990, 100, 9_990..10_000)] {
        let mut a = Encoder::new();
        a.opaque(&file_fh).u64(offset).u32(count);
        let r = d
            .reply(&call(2, NFS_PROGRAM, 6, 0, &a.into_bytes()))
            .await
            .unwrap();
        let mut b = body(&r);
        assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
        assert_eq!(attr(&mut b).3, file.ino);
        assert_eq!(b.u32(), Ok(want.len() as u32));
        assert_eq!(b.bool(), Ok(want.end == 10_000), "eof at {offset}");
        assert_eq!(b.opaque(4096, "data"), Ok(&data[want]));
    }
    // READ refused: of a directory, by a stranger to a 0600 file, through a forged handle.
    let read = |xid: u32, fh: &[u8], uid: u32| {
        let mut a = Encoder::new();
        a.opaque(fh).u64(0).u32(10);
        call(xid, NFS_PROGRAM, 6, uid, &a.into_bytes())
    };
    let mut forged = file_fh.clone();
    *forged.last_mut().unwrap() ^= 1;
    for (r, want) in [
        (read(3, &dir_fh, 0), crate::status::NFS3ERR_ISDIR),
        (read(4, &file_fh, 1000), NFS3ERR_ACCES),
        (read(5, &forged, 0), NFS3ERR_BADHANDLE),
    ] {
        let r = d.reply(&r).await.unwrap();
        assert_eq!(body(&r).u32(), Ok(want.0));
    }

    // READDIR in pages of about 600 bytes, following the cookies. After the first page one
    // name already listed is removed and one not yet listed is added: every name that was
    // there throughout comes exactly once, whatever changes meanwhile.
    let readdir = |xid: u32, fh: &[u8], cookie: u64, count: u32, plus: bool| {
        let mut a = Encoder::new();
        a.opaque(fh).u64(cookie).fixed(&[0; 8]).u32(count);
        if plus {
            a.u32(count);
        }
        call(
            xid,
            NFS_PROGRAM,
            if plus { 17 } else { 16 },
            0,
            &a.into_bytes(),
        )
    };
    let (mut seen, mut cookie, mut pages) = (Vec::new(), 0, 0);
    loop {
        let r = d
            .reply(&readdir(6, &dir_fh, cookie, 600, false))
            .await
            .unwrap();
        let (entries, eof) = listed(&r, false);
        pages += 1;
        if pages == 1 {
            let gone = entries
                .iter()
                .find(|e| e.1.starts_with(b"f"))
                .expect("a file on the first page")
                .1
                .clone();
            fs.unlink(&root, dir.ino, &gone).await.unwrap();
            names.retain(|n| *n != gone);
            fs.make(&root, dir.ino, b"late", S_IFREG | 0o644, 0)
                .await
                .unwrap();
        }
        if let Some(last) = entries.last() {
            cookie = last.2;
        }
        seen.extend(entries.into_iter().map(|e| e.1));
        if eof {
            break;
        }
        assert!(pages < 100, "READDIR never reached its end");
    }
    assert!(pages > 2, "the listing took several pages: {pages}");
    for name in names.iter().chain([&b".".to_vec(), &b"..".to_vec()]) {
        let n = seen.iter().filter(|s| *s == name).count();
        assert_eq!(n, 1, "{} listed {n} times", String::from_utf8_lossy(name));
    }
    assert!(
        seen.len() <= names.len() + 4,
        "nothing listed twice: {seen:?}"
    );

    // READDIRPLUS: each entry with its attributes and a handle that GETATTR takes.
    let r = d
        .reply(&readdir(7, &dir_fh, 0, 65_536, true))
        .await
        .unwrap();
    let (entries, eof) = listed(&r, true);
    assert!(eof, "40 entries fit in 64 KiB");
    assert_eq!(entries.len(), names.len() + 3, "., .., the files and late");
    for (id, name, _, extra) in &entries {
        let (of, fh) = extra.as_ref().unwrap();
        assert_eq!(of, id, "{name:?}: its attributes are its own");
        let r = d
            .reply(&call(8, NFS_PROGRAM, 1, 0, &args(&[fh], &[])))
            .await
            .unwrap();
        let mut b = body(&r);
        assert_eq!(b.u32(), Ok(NFS3_OK));
        assert_eq!(attr(&mut b).3, *id, "{name:?}: its handle names it");
    }
    // Too small a count for even one entry, and a listing of a file, are refused.
    let r = d.reply(&readdir(9, &dir_fh, 0, 8, false)).await.unwrap();
    assert_eq!(body(&r).u32(), Ok(crate::status::NFS3ERR_TOOSMALL.0));
    let r = d
        .reply(&readdir(10, &file_fh, 0, 4096, true))
        .await
        .unwrap();
    assert_eq!(body(&r).u32(), Ok(crate::status::NFS3ERR_NOTDIR.0));

    // FSSTAT: sizes and counts that agree with one another.
    let r = d
        .reply(&call(11, NFS_PROGRAM, 18, 0, &args(&[&dir_fh], &[])))
        .await
        .unwrap();
    let mut b = body(&r);
    assert_eq!((b.u32(), b.bool()), (Ok(NFS3_OK), Ok(true)));
    attr(&mut b);
    let [tbytes, fbytes, abytes, tfiles, ffiles, afiles] = [0; 6].map(|_| b.u64().unwrap());
    assert!(
        tbytes >= fbytes && fbytes == abytes && tbytes > 0,
        "{tbytes} {fbytes} {abytes}"
    );
    assert!(
        tfiles >= ffiles && ffiles == afiles,
        "{tfiles} {ffiles} {afiles}"
    );
    assert_eq!(b.u32(), Ok(0), "invarsec");
    assert!(b.is_empty());
}
