//! The NBD (Network Block Device) server of bucketfs: the fixed-newstyle handshake and the
//! transmission phase of the NBD protocol (NetworkBlockDevice/nbd, doc/proto.md) over any
//! `Exports`. This layer parses and validates every client field and maps errors to NBD codes;
//! it never touches storage types.
//!
//! Supported: NBD_OPT_EXPORT_NAME, ABORT, LIST, INFO, GO (export, name, description and block
//! size information), STRUCTURED_REPLY, LIST_META_CONTEXT and SET_META_CONTEXT (`base:allocation`);
//! commands READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES (NO_HOLE, FAST_ZERO) and
//! BLOCK_STATUS (REQ_ONE), with FUA. Many requests run at once per connection and are answered
//! out of order.
//!
//! Security is the `Policy` of a listener: TLS through NBD_OPT_STARTTLS (off, optional or
//! required; client certificates are verified by the rustls `ServerConfig` given), and an
//! allow-list of exports per client certificate. Without TLS, NBD has no authentication: bind
//! to localhost or a Unix socket.

mod backend;
mod error;
mod handshake;
pub mod limits;
mod policy;
mod proto;
mod request;
mod server;
mod transmission;
mod x509;

pub use backend::{Export, ExportError, ExportSummary, Exports, Extent};
pub use error::NbdError;
pub use policy::{tls_server_config, Access, Policy, Tls, TlsSetupError, EVERY_EXPORT};
pub use rustls;
pub use server::{serve_connection, serve_tcp, serve_unix};
