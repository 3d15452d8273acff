//! A 9P2000.L server for the filesystem core: what Linux's v9fs, diod's tools and
//! `bucketfs mount` speak. Written from diod's protocol.md and the Linux v9fs documentation.

pub mod client;
pub mod limits;
mod record_locks;
mod server;
mod users;
pub mod wire;

pub use server::Server;
