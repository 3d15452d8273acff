//! A small NFSv3 client over one TCP connection, one call at a time, for tests that drive a
//! server at the RPC level: libnfs's tools cannot send a call twice under one transaction id,
//! or leave an UNSTABLE write without a COMMIT, which is what the crash and retransmission
//! tests need.

use crate::mount::{MOUNT_PROGRAM, MOUNT_V3};
use crate::nfs3::{NFS_PROGRAM, NFS_V3};
use crate::record::{frame, read_record};
use crate::xdr::{Decoder, Encoder};
use std::io;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The largest reply this client reads: a READ of 1 MiB and its headers.
const REPLY_BYTES_MAX: usize = 2 << 20;

/// stable_how of a WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    Unstable = 0,
    DataSync = 1,
    FileSync = 2,
}

/// An NFSv3 reply's status other than NFS3_OK (or a MOUNT status), or a failure below it.
#[derive(Debug)]
pub enum ClientError {
    Status(u32),
    Io(io::Error),
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Status(s) => write!(f, "status {s}"),
            ClientError::Io(e) => write!(f, "{e}"),
        }
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

fn garbled(what: &str) -> ClientError {
    ClientError::Io(io::Error::new(io::ErrorKind::InvalidData, what.to_string()))
}

pub struct Client {
    stream: TcpStream,
    next_xid: u32,
    /// AUTH_SYS uid and gid of every call.
    pub uid: u32,
    pub gid: u32,
}

impl Client {
    /// Connects as root.
    pub async fn connect(addr: std::net::SocketAddr) -> io::Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            next_xid: 1,
            uid: 0,
            gid: 0,
        })
    }

    /// A call record with AUTH_SYS credentials.
    pub fn encode_call(
        &self,
        xid: u32,
        prog: u32,
        vers: u32,
        procedure: u32,
        args: &[u8],
    ) -> Vec<u8> {
        crate::rpc::encode_call(
            xid,
            prog,
            vers,
            procedure,
            b"bucketfs-test",
            self.uid,
            self.gid,
            args,
        )
    }

    /// Sends a call record as it is and returns the reply record whole.
    pub async fn send(&mut self, record: &[u8]) -> io::Result<Vec<u8>> {
        self.stream.write_all(&frame(record)).await?;
        read_record(&mut self.stream, REPLY_BYTES_MAX)
            .await?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the server hung up"))
    }

    /// The body of an accepted, successful reply to a call under a new transaction id.
    pub async fn call(
        &mut self,
        prog: u32,
        vers: u32,
        procedure: u32,
        args: &[u8],
    ) -> ClientResult<Vec<u8>> {
        let xid = self.next_xid;
        self.next_xid = self.next_xid.wrapping_add(1);
        let record = self.encode_call(xid, prog, vers, procedure, args);
        let reply = self.send(&record).await?;
        // xid, REPLY, MSG_ACCEPTED, verifier (AUTH_NONE, empty), SUCCESS.
        if reply.len() < 24
            || reply[..4] != xid.to_be_bytes()
            || reply[4..12] != [0, 0, 0, 1, 0, 0, 0, 0]
        {
            return Err(garbled("a reply that is not an accepted reply to the call"));
        }
        let stat = u32::from_be_bytes(reply[20..24].try_into().expect("4 bytes"));
        if stat != 0 {
            return Err(garbled(&format!(
                "the call was not accepted (accept_stat {stat})"
            )));
        }
        Ok(reply[24..].to_vec())
    }

    /// An NFSv3 call whose reply starts with an nfsstat3: the rest of the body after NFS3_OK.
    async fn nfs(&mut self, procedure: u32, args: Encoder) -> ClientResult<Vec<u8>> {
        let body = self
            .call(NFS_PROGRAM, NFS_V3, procedure, &args.into_bytes())
            .await?;
        let mut d = Decoder::new(&body);
        match d.u32() {
            Ok(0) => Ok(d.rest().to_vec()),
            Ok(s) => Err(ClientError::Status(s)),
            Err(_) => Err(garbled("an empty NFS reply")),
        }
    }

    /// MNT: the handle of an exported directory.
    pub async fn mount(&mut self, path: &str) -> ClientResult<Vec<u8>> {
        let mut a = Encoder::new();
        a.opaque(path.as_bytes());
        let body = self
            .call(MOUNT_PROGRAM, MOUNT_V3, 1, &a.into_bytes())
            .await?;
        let mut d = Decoder::new(&body);
        match d.u32() {
            Ok(0) => Ok(d
                .opaque(64, "fh")
                .map_err(|_| garbled("MNT's handle"))?
                .to_vec()),
            Ok(s) => Err(ClientError::Status(s)),
            Err(_) => Err(garbled("an empty MNT reply")),
        }
    }

    /// The record of a GUARDED CREATE of `name` in `dir`, mode 0644, to send (and resend).
    pub fn create_record(&mut self, xid: u32, dir: &[u8], name: &str) -> Vec<u8> {
        let mut a = Encoder::new();
        a.opaque(dir).opaque(name.as_bytes()).u32(1);
        a.u32(1).u32(0o644).u32(0).u32(0).u32(0).u32(0).u32(0);
        self.encode_call(xid, NFS_PROGRAM, NFS_V3, 8, &a.into_bytes())
    }

    /// The record of a RENAME, to send (and resend).
    pub fn rename_record(&mut self, xid: u32, dir: &[u8], from: &str, to: &str) -> Vec<u8> {
        let mut a = Encoder::new();
        a.opaque(dir)
            .opaque(from.as_bytes())
            .opaque(dir)
            .opaque(to.as_bytes());
        self.encode_call(xid, NFS_PROGRAM, NFS_V3, 14, &a.into_bytes())
    }

    /// LOOKUP: the handle of `name` in `dir`.
    pub async fn lookup(&mut self, dir: &[u8], name: &str) -> ClientResult<Vec<u8>> {
        let mut a = Encoder::new();
        a.opaque(dir).opaque(name.as_bytes());
        let rest = self.nfs(3, a).await?;
        Decoder::new(&rest)
            .opaque(64, "fh")
            .map(<[u8]>::to_vec)
            .map_err(|_| garbled("LOOKUP's handle"))
    }

    /// GETATTR: the size.
    pub async fn size(&mut self, fh: &[u8]) -> ClientResult<u64> {
        let mut a = Encoder::new();
        a.opaque(fh);
        let rest = self.nfs(1, a).await?;
        let mut d = Decoder::new(&rest);
        for _ in 0..5 {
            d.u32().map_err(|_| garbled("fattr3"))?;
        }
        d.u64().map_err(|_| garbled("fattr3"))
    }

    /// WRITE: how it was committed and the server's write verifier.
    pub async fn write(
        &mut self,
        fh: &[u8],
        offset: u64,
        data: &[u8],
        stable: Stable,
    ) -> ClientResult<(u32, [u8; 8])> {
        let mut a = Encoder::new();
        a.opaque(fh)
            .u64(offset)
            .u32(data.len() as u32)
            .u32(stable as u32)
            .opaque(data);
        let rest = self.nfs(7, a).await?;
        let mut d = Decoder::new(&rest);
        skip_wcc(&mut d)?;
        let count = d.u32().map_err(|_| garbled("WRITE's count"))?;
        if count as usize != data.len() {
            return Err(garbled("a short WRITE"));
        }
        let committed = d.u32().map_err(|_| garbled("WRITE's committed"))?;
        let verifier = d.fixed(8).map_err(|_| garbled("WRITE's verifier"))?;
        Ok((committed, verifier.try_into().expect("8 bytes")))
    }

    /// COMMIT of the whole file: the server's write verifier.
    pub async fn commit(&mut self, fh: &[u8]) -> ClientResult<[u8; 8]> {
        let mut a = Encoder::new();
        a.opaque(fh).u64(0).u32(0);
        let rest = self.nfs(21, a).await?;
        let mut d = Decoder::new(&rest);
        skip_wcc(&mut d)?;
        let verifier = d.fixed(8).map_err(|_| garbled("COMMIT's verifier"))?;
        Ok(verifier.try_into().expect("8 bytes"))
    }

    /// READ of up to `count` bytes.
    pub async fn read(&mut self, fh: &[u8], offset: u64, count: u32) -> ClientResult<Vec<u8>> {
        let mut a = Encoder::new();
        a.opaque(fh).u64(offset).u32(count);
        let rest = self.nfs(6, a).await?;
        let mut d = Decoder::new(&rest);
        skip_post_op(&mut d)?;
        let (_count, _eof) = (d.u32(), d.bool());
        d.opaque(count as usize, "data")
            .map(<[u8]>::to_vec)
            .map_err(|_| garbled("READ's data"))
    }
}

/// post_op_attr: a flag, then fattr3 (84 bytes) when it is set.
fn skip_post_op(d: &mut Decoder<'_>) -> ClientResult<()> {
    if d.bool().map_err(|_| garbled("post_op_attr"))? {
        d.fixed(84).map_err(|_| garbled("fattr3"))?;
    }
    Ok(())
}

/// wcc_data: pre_op_attr (flag, then size and two times: 24 bytes), post_op_attr.
fn skip_wcc(d: &mut Decoder<'_>) -> ClientResult<()> {
    if d.bool().map_err(|_| garbled("pre_op_attr"))? {
        d.fixed(24).map_err(|_| garbled("wcc_attr"))?;
    }
    skip_post_op(d)
}
