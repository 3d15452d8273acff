//! ONC RPC version 2 (RFC 5531): the call header a server reads, with AUTH_NONE and AUTH_SYS
//! credentials, and the replies it sends, accepted or denied.

use crate::xdr::{Decoder, Encoder, XdrResult};

pub const RPC_VERSION: u32 = 2;
const CALL: u32 = 0;
const REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const RPC_MISMATCH: u32 = 0;
const AUTH_ERROR: u32 = 1;
pub const AUTH_NONE: u32 = 0;
pub const AUTH_SYS: u32 = 1;
/// The largest credential or verifier body (RFC 5531, opaque_auth).
const AUTH_BODY_MAX: usize = 400;
/// AUTH_SYS's limits (RFC 5531 appendix A).
const MACHINE_NAME_MAX: usize = 255;
const AUTH_SYS_GROUPS_MAX: usize = 16;

/// accept_stat of an accepted reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptStat {
    Success = 0,
    ProgUnavail = 1,
    ProgMismatch = 2,
    ProcUnavail = 3,
    GarbageArgs = 4,
    SystemErr = 5,
}

/// auth_stat of a reply denied for its credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStat {
    BadCred = 1,
    RejectedCred = 2,
    BadVerf = 3,
    RejectedVerf = 4,
    TooWeak = 5,
}

/// Who the caller says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    None,
    Sys {
        machine: Vec<u8>,
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
}

/// A call's header and its arguments, still encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub procedure: u32,
    pub cred: Credentials,
    pub args: &'a [u8],
    /// The client's address; None for a caller inside this process.
    pub peer: Option<std::net::IpAddr>,
}

/// A record that is not a call to serve: nothing to answer (no transaction id, or not a call),
/// or the reply that refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Ignore,
    Reply(Vec<u8>),
}

/// A call record with AUTH_SYS credentials (no supplementary groups), as a client sends it:
/// for the test client and the tests.
#[allow(clippy::too_many_arguments)]
pub fn encode_call(
    xid: u32,
    prog: u32,
    vers: u32,
    procedure: u32,
    machine: &[u8],
    uid: u32,
    gid: u32,
    args: &[u8],
) -> Vec<u8> {
    let mut cred = Encoder::new();
    cred.u32(0).opaque(machine).u32(uid).u32(gid).u32(0);
    let mut e = Encoder::new();
    e.u32(xid)
        .u32(CALL)
        .u32(RPC_VERSION)
        .u32(prog)
        .u32(vers)
        .u32(procedure);
    e.u32(AUTH_SYS)
        .opaque(&cred.into_bytes())
        .u32(AUTH_NONE)
        .opaque(&[])
        .raw(args);
    e.into_bytes()
}

/// Reads a record as a call. A refusal names the RPC error the caller gets.
pub fn decode_call(record: &[u8]) -> Result<Call<'_>, Refusal> {
    let mut d = Decoder::new(record);
    let (Ok(xid), Ok(CALL)) = (d.u32(), d.u32()) else {
        return Err(Refusal::Ignore);
    };
    let header =
        (|| -> XdrResult<(u32, u32, u32, u32)> { Ok((d.u32()?, d.u32()?, d.u32()?, d.u32()?)) })();
    let (rpcvers, prog, vers, procedure) = match header {
        Ok(h) => h,
        Err(_) => return Err(Refusal::Reply(accepted(xid, AcceptStat::GarbageArgs, &[]))),
    };
    if rpcvers != RPC_VERSION {
        return Err(Refusal::Reply(rpc_mismatch(xid)));
    }
    let cred = credentials(&mut d).map_err(|s| Refusal::Reply(auth_error(xid, s)))?;
    // The verifier: AUTH_NONE and AUTH_SYS callers send an empty one; its body is not used.
    let verf = (|| -> XdrResult<()> {
        d.u32()?;
        d.opaque(AUTH_BODY_MAX, "verifier")?;
        Ok(())
    })();
    if verf.is_err() {
        return Err(Refusal::Reply(auth_error(xid, AuthStat::BadVerf)));
    }
    Ok(Call {
        xid,
        prog,
        vers,
        procedure,
        cred,
        args: d.rest(),
        peer: None,
    })
}

fn credentials(d: &mut Decoder<'_>) -> Result<Credentials, AuthStat> {
    let flavor = d.u32().map_err(|_| AuthStat::BadCred)?;
    let body = d
        .opaque(AUTH_BODY_MAX, "credential")
        .map_err(|_| AuthStat::BadCred)?;
    match flavor {
        AUTH_NONE => Ok(Credentials::None),
        AUTH_SYS => auth_sys(body).map_err(|_| AuthStat::BadCred),
        // RPCSEC_GSS and others: this server does not speak them.
        _ => Err(AuthStat::RejectedCred),
    }
}

fn auth_sys(body: &[u8]) -> XdrResult<Credentials> {
    let mut d = Decoder::new(body);
    let _stamp = d.u32()?;
    let machine = d.opaque(MACHINE_NAME_MAX, "machine name")?.to_vec();
    let (uid, gid) = (d.u32()?, d.u32()?);
    let n = d.count(AUTH_SYS_GROUPS_MAX, "AUTH_SYS groups")?;
    let groups = (0..n).map(|_| d.u32()).collect::<XdrResult<Vec<u32>>>()?;
    Ok(Credentials::Sys {
        machine,
        uid,
        gid,
        groups,
    })
}

fn reply_head(xid: u32, stat: u32) -> Encoder {
    let mut e = Encoder::new();
    e.u32(xid).u32(REPLY).u32(stat);
    e
}

/// An accepted reply (with an empty AUTH_NONE verifier) carrying `body` after its status.
pub fn accepted(xid: u32, stat: AcceptStat, body: &[u8]) -> Vec<u8> {
    accepted_message(xid, stat, Encoder::from(body.to_vec())).into_bytes()
}

/// As `accepted`, with the body's large parts moved into the reply, not copied.
pub fn accepted_message(xid: u32, stat: AcceptStat, body: Encoder) -> Encoder {
    let mut e = reply_head(xid, MSG_ACCEPTED);
    e.u32(AUTH_NONE).opaque(&[]).u32(stat as u32).append(body);
    e
}

/// PROG_MISMATCH: the program is served, in versions `low` to `high` only.
pub fn prog_mismatch(xid: u32, low: u32, high: u32) -> Vec<u8> {
    let mut range = Encoder::new();
    range.u32(low).u32(high);
    accepted(xid, AcceptStat::ProgMismatch, &range.into_bytes())
}

/// MSG_DENIED, RPC_MISMATCH: only RPC version 2 is spoken.
pub fn rpc_mismatch(xid: u32) -> Vec<u8> {
    let mut e = reply_head(xid, MSG_DENIED);
    e.u32(RPC_MISMATCH).u32(RPC_VERSION).u32(RPC_VERSION);
    e.into_bytes()
}

/// MSG_DENIED, AUTH_ERROR with why.
pub fn auth_error(xid: u32, stat: AuthStat) -> Vec<u8> {
    let mut e = reply_head(xid, MSG_DENIED);
    e.u32(AUTH_ERROR).u32(stat as u32);
    e.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_header(xid: u32, rpcvers: u32, cred: (u32, &[u8])) -> Encoder {
        let mut e = Encoder::new();
        e.u32(xid).u32(CALL).u32(rpcvers).u32(100003).u32(3).u32(1);
        e.u32(cred.0).opaque(cred.1).u32(AUTH_NONE).opaque(&[]);
        e
    }

    fn sys_body(groups: usize) -> Vec<u8> {
        let mut b = Encoder::new();
        b.u32(0)
            .opaque(b"client")
            .u32(1000)
            .u32(100)
            .u32(groups as u32);
        for g in 0..groups {
            b.u32(g as u32);
        }
        b.into_bytes()
    }

    #[test]
    fn a_call_with_auth_sys_decodes_with_its_arguments() {
        let mut e = call_header(42, 2, (AUTH_SYS, &sys_body(2)));
        e.u32(0xabcd);
        let record = e.into_bytes();
        let c = decode_call(&record).unwrap();
        assert_eq!((c.xid, c.prog, c.vers, c.procedure), (42, 100003, 3, 1));
        assert_eq!(
            c.cred,
            Credentials::Sys {
                machine: b"client".to_vec(),
                uid: 1000,
                gid: 100,
                groups: vec![0, 1]
            }
        );
        assert_eq!(c.args, &0xabcdu32.to_be_bytes());
    }

    #[test]
    fn bad_calls_get_the_rpc_error_they_deserve() {
        // RPC version 3: denied, RPC_MISMATCH 2..2.
        let r = call_header(1, 3, (AUTH_NONE, &[])).into_bytes();
        assert_eq!(decode_call(&r), Err(Refusal::Reply(rpc_mismatch(1))));
        // 17 groups in AUTH_SYS: a bad credential.
        let r = call_header(2, 2, (AUTH_SYS, &sys_body(17))).into_bytes();
        assert_eq!(
            decode_call(&r),
            Err(Refusal::Reply(auth_error(2, AuthStat::BadCred)))
        );
        // RPCSEC_GSS (6): rejected.
        let r = call_header(3, 2, (6, b"gss!")).into_bytes();
        assert_eq!(
            decode_call(&r),
            Err(Refusal::Reply(auth_error(3, AuthStat::RejectedCred)))
        );
        // The header cut after the program number: garbage.
        let r = call_header(4, 2, (AUTH_NONE, &[])).into_bytes();
        assert_eq!(
            decode_call(&r[..16]),
            Err(Refusal::Reply(accepted(4, AcceptStat::GarbageArgs, &[])))
        );
        // The verifier cut: a bad verifier.
        assert_eq!(
            decode_call(&r[..r.len() - 2]),
            Err(Refusal::Reply(auth_error(4, AuthStat::BadVerf)))
        );
        // A reply, or a record too short for a transaction id: nothing to answer.
        assert_eq!(
            decode_call(&accepted(5, AcceptStat::Success, &[])),
            Err(Refusal::Ignore)
        );
        assert_eq!(decode_call(&[0, 0]), Err(Refusal::Ignore));
    }

    #[test]
    fn replies_are_laid_out_as_rfc_5531_says() {
        assert_eq!(
            prog_mismatch(9, 3, 3),
            [9, REPLY, MSG_ACCEPTED, AUTH_NONE, 0, 2, 3, 3]
                .iter()
                .flat_map(|v: &u32| v.to_be_bytes())
                .collect::<Vec<u8>>()
        );
        assert_eq!(
            auth_error(9, AuthStat::TooWeak),
            [9, REPLY, MSG_DENIED, AUTH_ERROR, 5]
                .iter()
                .flat_map(|v: &u32| v.to_be_bytes())
                .collect::<Vec<u8>>()
        );
    }
}
