//! NFSv3 for bucketfs (issue 36), built up from the wire: XDR (RFC 4506), ONC RPC version 2
//! with record marking over TCP (RFC 5531), then MOUNT v3 and NFSv3 (RFC 1813) over the POSIX
//! filesystem core. Every decoder bounds what it accepts before allocating, so a hostile
//! length costs an error, not memory.

pub mod handle;
pub mod mount;
pub mod nfs3;
pub mod record;
pub mod rpc;
pub mod server;
pub mod status;
pub mod xdr;
