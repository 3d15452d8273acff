//! 9P2000.L messages on the wire: `size[4] type[1] tag[2]` and a body of little-endian integers,
//! strings (`len[2]` + bytes) and qids (`type[1] version[4] path[8]`). Requests are decoded
//! here and checked for shape only (lengths, counts, trailing bytes); what they mean is the
//! server's business. Written from diod's protocol.md and the Linux v9fs documentation.

use crate::limits::{NAME_BYTES_MAX, WALK_NAMES_MAX};

pub const TLERROR_RLERROR: u8 = 7;
pub const P9_NOFID: u32 = u32::MAX;
pub const P9_NONUNAME: u32 = u32::MAX;
/// Offset of the header: size, type, tag.
pub const HEADER_BYTES: usize = 7;

/// Qid types.
pub const QT_DIR: u8 = 0x80;
pub const QT_SYMLINK: u8 = 0x02;
pub const QT_FILE: u8 = 0x00;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Qid {
    pub kind: u8,
    pub version: u32,
    pub path: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ends before a field it promises.
    Short,
    /// Bytes after the last field.
    Trailing,
    /// A type this server does not know (answered with EOPNOTSUPP, the tag is known).
    UnknownType(u8),
    /// A string or list longer than the protocol or our limits allow.
    TooLong(&'static str),
}

/// A request, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Version {
        msize: u32,
        version: Vec<u8>,
    },
    Auth {
        afid: u32,
        uname: Vec<u8>,
        aname: Vec<u8>,
        n_uname: u32,
    },
    Attach {
        fid: u32,
        afid: u32,
        uname: Vec<u8>,
        aname: Vec<u8>,
        n_uname: u32,
    },
    Flush {
        oldtag: u16,
    },
    Walk {
        fid: u32,
        newfid: u32,
        names: Vec<Vec<u8>>,
    },
    Read {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Write {
        fid: u32,
        offset: u64,
        data: Vec<u8>,
    },
    Clunk {
        fid: u32,
    },
    Remove {
        fid: u32,
    },
    Statfs {
        fid: u32,
    },
    Lopen {
        fid: u32,
        flags: u32,
    },
    Lcreate {
        fid: u32,
        name: Vec<u8>,
        flags: u32,
        mode: u32,
        gid: u32,
    },
    Symlink {
        fid: u32,
        name: Vec<u8>,
        target: Vec<u8>,
        gid: u32,
    },
    Mknod {
        dfid: u32,
        name: Vec<u8>,
        mode: u32,
        major: u32,
        minor: u32,
        gid: u32,
    },
    Rename {
        fid: u32,
        dfid: u32,
        name: Vec<u8>,
    },
    Readlink {
        fid: u32,
    },
    Getattr {
        fid: u32,
        mask: u64,
    },
    Setattr(SetattrRequest),
    XattrWalk {
        fid: u32,
        newfid: u32,
        name: Vec<u8>,
    },
    XattrCreate {
        fid: u32,
        name: Vec<u8>,
        size: u64,
        flags: u32,
    },
    Readdir {
        fid: u32,
        offset: u64,
        count: u32,
    },
    Fsync {
        fid: u32,
        datasync: u32,
    },
    Lock(LockRequest),
    GetLock(LockRequest),
    Link {
        dfid: u32,
        fid: u32,
        name: Vec<u8>,
    },
    Mkdir {
        dfid: u32,
        name: Vec<u8>,
        mode: u32,
        gid: u32,
    },
    RenameAt {
        olddir: u32,
        oldname: Vec<u8>,
        newdir: u32,
        newname: Vec<u8>,
    },
    UnlinkAt {
        dfid: u32,
        name: Vec<u8>,
        flags: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetattrRequest {
    pub fid: u32,
    pub valid: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: (u64, u64),
    pub mtime: (u64, u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRequest {
    pub fid: u32,
    pub kind: u8,
    /// Tlock only.
    pub flags: u32,
    pub start: u64,
    pub length: u64,
    pub proc_id: u32,
    pub client_id: Vec<u8>,
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Short);
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = usize::from(self.u16()?);
        Ok(self.take(n)?.to_vec())
    }
    /// A name: a string no longer than a file name may be.
    fn name(&mut self) -> Result<Vec<u8>, DecodeError> {
        let s = self.string()?;
        if s.len() > NAME_BYTES_MAX {
            return Err(DecodeError::TooLong("name"));
        }
        Ok(s)
    }
    fn lock(&mut self, with_flags: bool) -> Result<LockRequest, DecodeError> {
        Ok(LockRequest {
            fid: self.u32()?,
            kind: self.u8()?,
            flags: if with_flags { self.u32()? } else { 0 },
            start: self.u64()?,
            length: self.u64()?,
            proc_id: self.u32()?,
            client_id: self.string()?,
        })
    }
}

/// Decodes the body of a request of type `kind` (the bytes after the header).
/// Twrite's type.
pub const TWRITE: u8 = 118;
/// Twrite's fixed fields after the header: fid[4] offset[8] count[4].
pub const TWRITE_FIXED_BYTES: usize = 16;

/// Twrite from its fixed fields and the rest of its message, which becomes the data without a
/// copy: as `decode` answers for the whole body.
pub fn decode_write(
    fixed: &[u8; TWRITE_FIXED_BYTES],
    rest: Vec<u8>,
) -> Result<Request, DecodeError> {
    let mut c = Cursor { b: fixed };
    let (fid, offset, n) = (c.u32()?, c.u64()?, c.u32()? as usize);
    if rest.len() < n {
        return Err(DecodeError::Short);
    }
    if rest.len() > n {
        return Err(DecodeError::Trailing);
    }
    Ok(Request::Write {
        fid,
        offset,
        data: rest,
    })
}

pub fn decode(kind: u8, body: &[u8]) -> Result<Request, DecodeError> {
    let mut c = Cursor { b: body };
    let r = match kind {
        100 => Request::Version {
            msize: c.u32()?,
            version: c.string()?,
        },
        102 => Request::Auth {
            afid: c.u32()?,
            uname: c.string()?,
            aname: c.string()?,
            n_uname: c.u32()?,
        },
        104 => Request::Attach {
            fid: c.u32()?,
            afid: c.u32()?,
            uname: c.string()?,
            aname: c.string()?,
            n_uname: c.u32()?,
        },
        108 => Request::Flush { oldtag: c.u16()? },
        110 => {
            let (fid, newfid) = (c.u32()?, c.u32()?);
            let n = usize::from(c.u16()?);
            if n > WALK_NAMES_MAX {
                return Err(DecodeError::TooLong("walk"));
            }
            let names = (0..n).map(|_| c.name()).collect::<Result<_, _>>()?;
            Request::Walk { fid, newfid, names }
        }
        116 => Request::Read {
            fid: c.u32()?,
            offset: c.u64()?,
            count: c.u32()?,
        },
        TWRITE => {
            let (fid, offset) = (c.u32()?, c.u64()?);
            let n = c.u32()? as usize;
            Request::Write {
                fid,
                offset,
                data: c.take(n)?.to_vec(),
            }
        }
        120 => Request::Clunk { fid: c.u32()? },
        122 => Request::Remove { fid: c.u32()? },
        8 => Request::Statfs { fid: c.u32()? },
        12 => Request::Lopen {
            fid: c.u32()?,
            flags: c.u32()?,
        },
        14 => Request::Lcreate {
            fid: c.u32()?,
            name: c.name()?,
            flags: c.u32()?,
            mode: c.u32()?,
            gid: c.u32()?,
        },
        16 => Request::Symlink {
            fid: c.u32()?,
            name: c.name()?,
            target: c.string()?,
            gid: c.u32()?,
        },
        18 => Request::Mknod {
            dfid: c.u32()?,
            name: c.name()?,
            mode: c.u32()?,
            major: c.u32()?,
            minor: c.u32()?,
            gid: c.u32()?,
        },
        20 => Request::Rename {
            fid: c.u32()?,
            dfid: c.u32()?,
            name: c.name()?,
        },
        22 => Request::Readlink { fid: c.u32()? },
        24 => Request::Getattr {
            fid: c.u32()?,
            mask: c.u64()?,
        },
        26 => Request::Setattr(SetattrRequest {
            fid: c.u32()?,
            valid: c.u32()?,
            mode: c.u32()?,
            uid: c.u32()?,
            gid: c.u32()?,
            size: c.u64()?,
            atime: (c.u64()?, c.u64()?),
            mtime: (c.u64()?, c.u64()?),
        }),
        30 => Request::XattrWalk {
            fid: c.u32()?,
            newfid: c.u32()?,
            name: c.name()?,
        },
        32 => Request::XattrCreate {
            fid: c.u32()?,
            name: c.name()?,
            size: c.u64()?,
            flags: c.u32()?,
        },
        40 => Request::Readdir {
            fid: c.u32()?,
            offset: c.u64()?,
            count: c.u32()?,
        },
        50 => Request::Fsync {
            fid: c.u32()?,
            datasync: c.u32()?,
        },
        52 => Request::Lock(c.lock(true)?),
        54 => Request::GetLock(c.lock(false)?),
        70 => Request::Link {
            dfid: c.u32()?,
            fid: c.u32()?,
            name: c.name()?,
        },
        72 => Request::Mkdir {
            dfid: c.u32()?,
            name: c.name()?,
            mode: c.u32()?,
            gid: c.u32()?,
        },
        74 => Request::RenameAt {
            olddir: c.u32()?,
            oldname: c.name()?,
            newdir: c.u32()?,
            newname: c.name()?,
        },
        76 => Request::UnlinkAt {
            dfid: c.u32()?,
            name: c.name()?,
            flags: c.u32()?,
        },
        other => return Err(DecodeError::UnknownType(other)),
    };
    if !c.b.is_empty() {
        return Err(DecodeError::Trailing);
    }
    Ok(r)
}

/// A reply under construction: `size` is filled in by `finish`.
pub struct Reply {
    buf: Vec<u8>,
}

impl Reply {
    /// A reply of type `kind` (a request's type + 1) to `tag`.
    pub fn new(kind: u8, tag: u16) -> Reply {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0; 4]);
        buf.push(kind);
        buf.extend_from_slice(&tag.to_le_bytes());
        Reply { buf }
    }

    pub fn error(tag: u16, errno: i32) -> Reply {
        let mut r = Reply::new(TLERROR_RLERROR, tag);
        r.u32(errno as u32);
        r
    }

    pub fn u8(&mut self, v: u8) -> &mut Reply {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Reply {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A string; callers pass at most u16::MAX bytes (names, targets, versions).
    pub fn string(&mut self, s: &[u8]) -> &mut Reply {
        let n = u16::try_from(s.len()).expect("strings in replies fit their length field");
        self.u16(n);
        self.buf.extend_from_slice(s);
        self
    }
    pub fn qid(&mut self, q: Qid) -> &mut Reply {
        self.u8(q.kind).u32(q.version).u64(q.path)
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Reply {
        self.buf.extend_from_slice(b);
        self
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.len() == HEADER_BYTES
    }

    pub fn finish(mut self) -> Vec<u8> {
        let n = u32::try_from(self.buf.len()).expect("replies are bounded by msize");
        self.buf[..4].copy_from_slice(&n.to_le_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twrite_decodes_the_same_from_its_parts() {
        let mut body = Vec::new();
        body.extend_from_slice(&7u32.to_le_bytes());
        body.extend_from_slice(&(1u64 << 40).to_le_bytes());
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(b"hello, and more");
        let parts = |body: &[u8]| {
            let fixed: [u8; TWRITE_FIXED_BYTES] = body[..TWRITE_FIXED_BYTES].try_into().unwrap();
            decode_write(&fixed, body[TWRITE_FIXED_BYTES..].to_vec())
        };
        // Count 5, 15 bytes of data, 100: trailing, whole, short.
        for (count, expect) in [
            (5u32, Err(DecodeError::Trailing)),
            (15, Ok(())),
            (100, Err(DecodeError::Short)),
        ] {
            body[12..16].copy_from_slice(&count.to_le_bytes());
            let whole = decode(TWRITE, &body);
            assert_eq!(parts(&body), whole, "count {count}");
            assert_eq!(whole.as_ref().map(|_| ()), expect.as_ref().map(|_| ()));
        }
        body[12..16].copy_from_slice(&15u32.to_le_bytes());
        let Ok(Request::Write { fid, offset, data }) = parts(&body) else {
            panic!("a whole Twrite decodes");
        };
        assert_eq!(
            (fid, offset, &data[..]),
            (7, 1 << 40, &b"hello, and more"[..])
        );
    }

    fn body(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    fn s(x: &[u8]) -> Vec<u8> {
        let mut v = (x.len() as u16).to_le_bytes().to_vec();
        v.extend_from_slice(x);
        v
    }

    #[test]
    fn requests_decode_and_malformed_ones_are_refused() {
        let walk = body(&[
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &2u16.to_le_bytes(),
            &s(b"a"),
            &s(b"bc"),
        ]);
        assert_eq!(
            decode(110, &walk).unwrap(),
            Request::Walk {
                fid: 1,
                newfid: 2,
                names: vec![b"a".to_vec(), b"bc".to_vec()]
            }
        );
        for cut in 0..walk.len() {
            assert_eq!(
                decode(110, &walk[..cut]),
                Err(DecodeError::Short),
                "cut {cut}"
            );
        }
        let mut long = walk.clone();
        long.push(0);
        assert_eq!(decode(110, &long), Err(DecodeError::Trailing));
        let many = body(&[
            &1u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &17u16.to_le_bytes(),
        ]);
        assert_eq!(decode(110, &many), Err(DecodeError::TooLong("walk")));
        let big_name = body(&[&1u32.to_le_bytes(), &s(&[b'x'; 256]), &0u32.to_le_bytes()]);
        assert_eq!(decode(76, &big_name), Err(DecodeError::TooLong("name")));
        let write = body(&[
            &1u32.to_le_bytes(),
            &0u64.to_le_bytes(),
            &u32::MAX.to_le_bytes(),
        ]);
        assert_eq!(decode(118, &write), Err(DecodeError::Short));
        assert_eq!(decode(99, &[]), Err(DecodeError::UnknownType(99)));
    }

    #[test]
    fn replies_carry_their_size() {
        let mut r = Reply::new(111, 7);
        r.u16(1).qid(Qid {
            kind: QT_DIR,
            version: 0,
            path: 5,
        });
        let b = r.finish();
        assert_eq!(b.len(), 7 + 2 + 13);
        assert_eq!(
            u32::from_le_bytes(b[..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!((b[4], u16::from_le_bytes([b[5], b[6]])), (111, 7));
    }
}
