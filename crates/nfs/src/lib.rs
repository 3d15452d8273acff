//! NFSv3 for bucketfs (issue 36), built up from the wire: XDR (RFC 4506), ONC RPC version 2
//! with record marking over TCP (RFC 5531), then MOUNT v3 and NFSv3 (RFC 1813) over the POSIX
//! filesystem core. Every decoder bounds what it accepts before allocating, so a hostile
//! length costs an error, not memory.

pub mod client;
pub mod export;
pub mod handle;
pub mod mount;
pub mod nfs3;
pub mod record;
pub mod rpc;
pub mod server;
pub mod status;
pub mod xdr;

/// A filesystem over a `memory://` bucket, for the unit tests.
#[cfg(test)]
pub(crate) async fn memory_fs() -> std::sync::Arc<bucketfs_fs::Fs> {
    use bucketfs_engine::{bucket::open_url, Engine, EngineOptions};
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let engine = Engine::open(bucket, EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    std::sync::Arc::new(bucketfs_fs::Fs::open(engine).await.unwrap())
}

/// The default export (the whole filesystem) of `fs`, for the unit tests.
#[cfg(test)]
pub(crate) fn whole(fs: &bucketfs_fs::Fs) -> std::sync::Arc<export::Exports> {
    std::sync::Arc::new(export::Exports::new(fs, Vec::new()).unwrap())
}
