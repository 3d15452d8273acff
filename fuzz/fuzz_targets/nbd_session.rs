//! A whole NBD session from a hostile client: the fuzzer's bytes are everything the client
//! sends (handshake, options, requests), against the in-memory exports of the NBD tests. The
//! server must end the session (error or end of input) without panicking or hanging.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/nbd/tests/nbd/common.rs"]
mod common;
#[path = "common/session.rs"]
mod session;

/// One set of exports for every run: allocating them (18 MiB) per input would dominate.
fn exports() -> std::sync::Arc<dyn bucketfs_nbd::Exports> {
    static FIXTURE: std::sync::OnceLock<common::Fixture> = std::sync::OnceLock::new();
    FIXTURE.get_or_init(common::fixture).exports.clone()
}

fuzz_target!(|data: &[u8]| {
    // Paused time: the fixture's slow reads and any timer advance at once when idle.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        session::play(
            data,
            |server| bucketfs_nbd::serve_connection(server, exports(), Default::default()),
            std::time::Duration::from_secs(600),
        )
        .await;
    });
});
