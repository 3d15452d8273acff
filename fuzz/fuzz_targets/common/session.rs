//! What the session targets share: play the fuzzer's bytes as everything a client sends to a
//! server serving the other end of an in-memory stream, read whatever it answers, and require
//! that the server ends the session (error or end of input) rather than hang.

use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Runs `serve` on the server's end of a fresh stream while `data` is sent on the client's.
pub async fn play<F: Future>(data: &[u8], serve: impl FnOnce(DuplexStream) -> F, limit: Duration) {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let serve = serve(server);
    let talk = async move {
        let (mut rx, mut tx) = tokio::io::split(&mut client);
        let send = async {
            let _ = tx.write_all(data).await;
            let _ = tx.shutdown().await;
        };
        let drain = async {
            let mut sink = vec![0u8; 1 << 16];
            while let Ok(n) = rx.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::join!(send, drain);
    };
    let ended = tokio::time::timeout(limit, async { tokio::join!(serve, talk) }).await;
    assert!(ended.is_ok(), "the session did not end after the input did");
}
