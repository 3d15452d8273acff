//! A whole 9P2000.L session from a hostile client: the fuzzer's bytes are everything the client
//! sends, against the filesystem core over a `memory://` engine that runs share. The
//! server must end the session (error or end of input) without panicking or hanging.
#![no_main]

#[path = "common/session.rs"]
mod session;

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::Fs;
use bucketfs_ninep::Server;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex};

/// Runs on one runtime and filesystem before both are made anew: opening an engine per input
/// would dominate, and one kept forever would hold everything every input created (the
/// `memory://` bucket) until the RSS limit of a long soak.
const RUNS_PER_WORLD: usize = 5000;

struct World {
    rt: tokio::runtime::Runtime,
    server: Arc<Server>,
    runs: usize,
}

fn new_world() -> World {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = rt.block_on(async {
        let bucket = open_url("memory://", &Vec::new()).expect("a memory bucket");
        let engine = Engine::open(bucket, EngineOptions::for_tests("fuzz"))
            .await
            .expect("an engine");
        Server::new(Arc::new(Fs::open(engine).await.expect("a filesystem")))
    });
    World { rt, server, runs: 0 }
}

/// The runtime and server for this run.
fn world() -> (tokio::runtime::Handle, Arc<Server>) {
    static WORLD: Mutex<Option<World>> = Mutex::new(None);
    let mut w = WORLD.lock().expect("not poisoned: a panic ends the fuzzer");
    if w.as_ref().is_none_or(|w| w.runs >= RUNS_PER_WORLD) {
        *w = Some(new_world());
    }
    let w = w.as_mut().expect("made above");
    w.runs += 1;
    (w.rt.handle().clone(), w.server.clone())
}

fuzz_target!(|data: &[u8]| {
    let (rt, server) = world();
    rt.block_on(async {
        session::play(
            data,
            |stream| server.serve_connection(stream),
            std::time::Duration::from_secs(60),
        )
        .await;
    });
});
