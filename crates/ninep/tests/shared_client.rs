//! The blocking client shared by many threads against the real server over TCP: replies reach
//! the caller that asked, whatever order the server answers in, and a server that goes away
//! breaks the connection for everyone with EIO instead of leaving a caller waiting. Requests
//! sent without waiting (`Client::sending`) have their function run once, with the reply or
//! with the connection's error.

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::Fs;
use bucketfs_ninep::client::Client;
use bucketfs_ninep::Server;
use std::sync::Arc;

const O_RDWR: u32 = 2;

async fn serve() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (addr, _, task) = serve_counted().await;
    (addr, task)
}

/// `serve`, keeping the server to ask it how many connection threads it runs.
async fn serve_counted() -> (
    String,
    Arc<Server>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let engine = Engine::open(bucket, EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    let fs = Arc::new(Fs::open(engine).await.unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = Server::new(fs);
    (
        addr,
        server.clone(),
        tokio::spawn(server.serve_tcp(listener)),
    )
}

/// Reads one request frame from a hand-made server's socket; answers its type.
fn read_request(s: &mut std::net::TcpStream) -> u8 {
    use std::io::Read;
    let mut head = [0u8; 7];
    s.read_exact(&mut head).unwrap();
    let size = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    let mut rest = vec![0u8; size - 7];
    s.read_exact(&mut rest).unwrap();
    head[4]
}

/// Rversion: msize 8192, "9P2000.L", tag NOTAG.
fn send_rversion(s: &mut std::net::TcpStream) {
    use std::io::Write;
    let mut reply = Vec::new();
    reply.extend_from_slice(&(7u32 + 4 + 2 + 8).to_le_bytes());
    reply.push(101);
    reply.extend_from_slice(&0xffffu16.to_le_bytes());
    reply.extend_from_slice(&8192u32.to_le_bytes());
    reply.extend_from_slice(&8u16.to_le_bytes());
    reply.extend_from_slice(b"9P2000.L");
    s.write_all(&reply).unwrap();
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

    // Writes and fsyncs sent without waiting, from several threads, beside waiting calls:
    // every function runs once with its own reply.
    let (f, _) = c.walk(root, &[]).unwrap();
    c.lcreate(f, b"then", O_RDWR, 0o644, 0).unwrap();
    let (done_tx, done) = std::sync::mpsc::channel();
    let senders: Vec<_> = (0..4u64)
        .map(|t| {
            let (c, done_tx) = (c.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for i in 0..32u64 {
                    let at = (t * 32 + i) * 4096;
                    let tx = done_tx.clone();
                    let block = vec![(t * 32 + i) as u8; 4096];
                    c.sending(true)
                        .unwrap()
                        .write_then(f, at, &block, move |r| tx.send(("write", r)).unwrap());
                    if i % 8 == 7 {
                        let tx = done_tx.clone();
                        c.sending(true).unwrap().fsync_then(f, false, move |r| {
                            tx.send(("fsync", r.map(|()| 0))).unwrap()
                        });
                    }
                    assert!(c.getattr(f).is_ok());
                }
            })
        })
        .collect();
    drop(done_tx);
    for t in senders {
        t.join().unwrap();
    }
    let replies: Vec<_> = done.iter().collect();
    assert_eq!(
        replies
            .iter()
            .filter(|(k, r)| *k == "write" && *r == Ok(4096))
            .count(),
        128
    );
    assert_eq!(
        replies
            .iter()
            .filter(|(k, r)| *k == "fsync" && *r == Ok(0))
            .count(),
        16
    );
    assert_eq!(replies.len(), 144, "every function ran exactly once");
    let got: Vec<u8> = (0..8u64)
        .flat_map(|i| c.read(f, i * 65536, 65536).unwrap())
        .collect();
    assert_eq!(got.len(), 128 * 4096);
    assert!(got
        .chunks(4096)
        .enumerate()
        .all(|(i, b)| b.iter().all(|&x| x == i as u8)));
    // An Rlerror reaches the function as its errno: a write through a fid never made, which
    // the server answers with EINVAL.
    let (tx, rx) = std::sync::mpsc::channel();
    c.sending(true)
        .unwrap()
        .write_then(9999, 0, b"x", move |r| tx.send(r).unwrap());
    assert_eq!(rx.recv().unwrap(), Err(libc::EINVAL));
    // While one thread holds the socket, one that must not wait is told so.
    let held = c.sending(true).unwrap();
    assert!(c.sending(false).is_none());
    drop(held);
    assert!(c.sending(false).is_some());

    // Errors still reach their caller: ENOENT for a missing name.
    assert_eq!(c.walk(root, &[b"missing"]).unwrap_err(), libc::ENOENT);

    server.abort();
}

/// A server that answers Tversion and then hangs up: the client notices, and every request
/// answers EIO at once instead of waiting.
#[test]
fn a_server_that_hangs_up_breaks_the_connection() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        assert_eq!(read_request(&mut s), 100);
        send_rversion(&mut s);
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

/// A server that reads one request after Tversion and hangs up without answering it: the
/// function of the request in flight runs once, with EIO, and so does one sent afterwards.
#[test]
fn a_request_in_flight_when_the_server_hangs_up_gets_eio() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        assert_eq!(read_request(&mut s), 100);
        send_rversion(&mut s);
        // Tfsync, then hang up.
        assert_eq!(read_request(&mut s), 50);
    });
    let c = Client::connect(&addr, 65536).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let first = tx.clone();
    c.sending(true)
        .unwrap()
        .fsync_then(7, false, move |r| first.send(r).unwrap());
    server.join().unwrap();
    let timeout = std::time::Duration::from_secs(10);
    assert_eq!(rx.recv_timeout(timeout).unwrap(), Err(libc::EIO));
    assert!(c.is_broken());
    c.sending(true)
        .unwrap()
        .write_then(7, 0, b"late", move |r| tx.send(r.map(|_| ())).unwrap());
    assert_eq!(rx.recv_timeout(timeout).unwrap(), Err(libc::EIO));
    // Both functions ran and dropped their senders: nothing else arrives.
    assert!(rx.recv_timeout(timeout).is_err());
}

/// Each TCP client is served on a thread of its own, small requests there and large writes
/// and reads on the shared runtime: what one client wrote, in both sizes and fsynced, the next
/// reads back after it disconnected, and every connection's thread ends with its client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_is_served_on_a_thread_that_ends_with_it() {
    let (a, s, server) = serve_counted().await;
    let connection_threads = move || s.connection_threads();
    let clients = 12u8;
    tokio::task::spawn_blocking(move || {
        let mut open = Vec::new();
        for n in 0..clients {
            let c = Client::connect(&a, 512 * 1024).unwrap();
            let (root, _) = c.attach(0, b"").unwrap();
            let (f, _) = c.walk(root, &[]).unwrap();
            c.lcreate(f, format!("c{n}").as_bytes(), O_RDWR, 0o644, 0)
                .unwrap();
            // 4 KiB is served on the connection's thread, 256 KiB on the shared runtime.
            assert_eq!(c.write(f, 0, &[n; 4096]).unwrap(), 4096);
            assert_eq!(c.write(f, 4096, &vec![n; 256 * 1024]).unwrap(), 256 * 1024);
            c.fsync(f, false).unwrap();
            assert_eq!(c.read(f, 4000, 200).unwrap(), vec![n; 200]);
            open.push(c);
        }
        assert_eq!(connection_threads(), clients as usize);
        drop(open);
        for _ in 0..200 {
            if connection_threads() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            connection_threads(),
            0,
            "a disconnected client's thread lives on"
        );
        let c = Client::connect(&a, 512 * 1024).unwrap();
        let (root, _) = c.attach(0, b"").unwrap();
        for n in 0..clients {
            let (f, _) = c.walk(root, &[format!("c{n}").as_bytes()]).unwrap();
            c.lopen(f, 0).unwrap();
            let got = c.read(f, 0, 300 * 1024).unwrap();
            assert_eq!(got.len(), 4096 + 256 * 1024, "client {n}");
            assert!(got.iter().all(|&b| b == n), "client {n}");
            c.clunk(f).unwrap();
        }
    })
    .await
    .unwrap();
    server.abort();
}

/// Past `CONNECTION_THREADS_MAX` connections at once, the next ones are served on the shared
/// runtime: they work the same, and no more threads start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_thread_limit_are_served_on_the_shared_runtime() {
    let (a, s, server) = serve_counted().await;
    let max = bucketfs_ninep::limits::CONNECTION_THREADS_MAX;
    tokio::task::spawn_blocking(move || {
        let clients: Vec<Client> = (0..max + 2)
            .map(|_| Client::connect(&a, 64 * 1024).unwrap())
            .collect();
        assert_eq!(s.connection_threads(), max);
        for (n, c) in clients.iter().enumerate().skip(max - 1) {
            let (root, _) = c.attach(0, b"").unwrap();
            let (f, _) = c.walk(root, &[]).unwrap();
            c.lcreate(f, format!("past{n}").as_bytes(), O_RDWR, 0o644, 0)
                .unwrap();
            assert_eq!(c.write(f, 0, b"served").unwrap(), 6);
            c.fsync(f, false).unwrap();
            assert_eq!(c.read(f, 0, 6).unwrap(), b"served");
        }
    })
    .await
    .unwrap();
    server.abort();
}
