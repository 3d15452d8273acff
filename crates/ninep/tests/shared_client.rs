//! The blocking client shared by many threads against the real server over TCP: replies reach
//! the caller that asked, whatever order the server answers in, and a server that goes away
//! breaks the connection for everyone with EIO instead of leaving a caller waiting.

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::Fs;
use bucketfs_ninep::client::Client;
use bucketfs_ninep::Server;
use std::sync::Arc;

const O_RDWR: u32 = 2;

async fn serve() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let engine = Engine::open(bucket, EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    let fs = Arc::new(Fs::open(engine).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (addr, tokio::spawn(Server::new(fs).serve_tcp(listener)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_share_one_connection() {
    let (addr, server) = serve().await;
    let c = Arc::new(
        tokio::task::spawn_blocking(move || Client::connect(&addr, 256 * 1024).unwrap())
            .await
            .unwrap(),
    );
    let (root, _) = c.attach(0, b"").unwrap();
    // Eight threads, each with its own file: writes, fsyncs and reads interleave on the wire.
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let (f, _) = c.walk(root, &[]).unwrap();
                c.lcreate(f, format!("f{t}").as_bytes(), O_RDWR, 0o644, 0)
                    .unwrap();
                let block = vec![t; 64 * 1024];
                for i in 0..16u64 {
                    assert_eq!(c.write(f, i * block.len() as u64, &block).unwrap(), 65536);
                    if i % 4 == 0 {
                        c.fsync(f, false).unwrap();
                    }
                }
                for i in 0..16u64 {
                    let got = c.read(f, i * 65536, 65536).unwrap();
                    assert!(
                        got.len() == 65536 && got.iter().all(|&b| b == t),
                        "thread {t}"
                    );
                }
                assert_eq!(c.getattr(f).unwrap().size, 16 * 65536);
                c.clunk(f).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!c.is_broken());
    // Errors still reach their caller: ENOENT for a missing name.
    assert_eq!(c.walk(root, &[b"missing"]).unwrap_err(), libc::ENOENT);

    server.abort();
}

/// A server that answers Tversion and then hangs up: the client notices, and every request
/// answers EIO at once instead of waiting.
#[test]
fn a_server_that_hangs_up_breaks_the_connection() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut head = [0u8; 7];
        s.read_exact(&mut head).unwrap();
        let size = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
        let mut rest = vec![0u8; size - 7];
        s.read_exact(&mut rest).unwrap();
        // Rversion: msize 8192, "9P2000.L", tag NOTAG.
        let mut reply = Vec::new();
        reply.extend_from_slice(&(7u32 + 4 + 2 + 8).to_le_bytes());
        reply.push(101);
        reply.extend_from_slice(&0xffffu16.to_le_bytes());
        reply.extend_from_slice(&8192u32.to_le_bytes());
        reply.extend_from_slice(&8u16.to_le_bytes());
        reply.extend_from_slice(b"9P2000.L");
        s.write_all(&reply).unwrap();
    });
    let c = Client::connect(&addr, 65536).unwrap();
    server.join().unwrap();
    for _ in 0..500 {
        if c.is_broken() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(c.is_broken(), "the hang-up went unnoticed");
    assert_eq!(c.attach(0, b"").unwrap_err(), libc::EIO);
}
