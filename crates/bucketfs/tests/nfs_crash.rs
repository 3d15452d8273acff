//! NFSv3's durability contract against the real server process, killed with SIGKILL:
//! - an UNSTABLE write that no COMMIT covered: after the crash, COMMIT answers a new write
//!   verifier, so the client knows to send the write again;
//! - after a COMMIT, the data survives the crash, and so does a CREATE or a RENAME as soon as
//!   it is answered (RFC 1813 makes them synchronous);
//! - file handles from before a restart still work;
//! - a CREATE or RENAME sent twice under one transaction id (a client that reconnected and
//!   resent it) gets the first answer, not EXIST or NOENT.

use bucketfs_nfs::client::{Client, ClientError, Stable};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NFS3ERR_NOENT: u32 = 2;

struct Server {
    config: PathBuf,
    log: PathBuf,
    addr: SocketAddr,
    child: Option<Child>,
}

impl Server {
    fn new(dir: &Path) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("bucketfs.toml");
        // A flush interval far longer than the test: only barriers make anything durable.
        std::fs::write(
            &config,
            format!(
                "[storage]\nurl = \"file://{dir}/bucket\"\nencryption_password = \"pw\"\n\
                 flush_interval_ms = 600000\n\
                 [cache]\ndir = \"{dir}/cache\"\n\
                 [servers.nbd]\nlisten = []\n[servers.ninep]\nlisten = []\n\
                 [servers.nfs]\nlisten = [\"127.0.0.1:{port}\"]\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        Server {
            config,
            log: dir.join("bucketfs.log"),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child: None,
        }
    }

    async fn start(&mut self) -> Client {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_bucketfs"))
            .args(["run", "-c"])
            .arg(&self.config)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(c) = Client::connect(self.addr).await {
                return c;
            }
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "bucketfs did not come up ({exited:?}): {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill9(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_verifiers_and_synchronous_changes_survive_kill_9() {
    // Declared before the server: its process is killed before the directory goes.
    let dir = tempfile::TempDir::with_prefix("bucketfs-nfs-crash-").unwrap();
    let mut server = Server::new(dir.path());
    let mut c = server.start().await;
    let root = c.mount("/").await.unwrap();

    // CREATE sent twice under one xid, then again over a new connection: one answer.
    let create = c.create_record(1000, &root, "f");
    let first = c.send(&create).await.unwrap();
    assert_eq!(first[20..28], [0; 8], "CREATE accepted and NFS3_OK");
    assert_eq!(c.send(&create).await.unwrap(), first);
    let mut again = Client::connect(server.addr).await.unwrap();
    assert_eq!(again.send(&create).await.unwrap(), first);
    let f = c.lookup(&root, "f").await.unwrap();

    // An UNSTABLE write, no COMMIT, kill -9: the verifier changes, the handle still works.
    let (committed, before) = c
        .write(&f, 0, b"lost unless resent", Stable::Unstable)
        .await
        .unwrap();
    assert_eq!(committed, Stable::Unstable as u32);
    server.kill9();
    let mut c = server.start().await;
    let after = c.commit(&f).await.unwrap();
    assert_ne!(
        after, before,
        "the write verifier must change across a restart"
    );

    // The client resends and commits; a RENAME sent twice; kill -9 again.
    let data = b"durable after COMMIT".repeat(1000);
    let (_, v) = c.write(&f, 0, &data, Stable::Unstable).await.unwrap();
    assert_eq!(v, after, "the verifier is stable while the server runs");
    assert_eq!(c.commit(&f).await.unwrap(), after);
    let rename = c.rename_record(2000, &root, "f", "g");
    let first = c.send(&rename).await.unwrap();
    assert_eq!(first[20..28], [0; 8], "RENAME accepted and NFS3_OK");
    assert_eq!(c.send(&rename).await.unwrap(), first);
    server.kill9();

    // Everything answered is there: the data, the new name, and the old handle.
    let mut c = server.start().await;
    let g = c.lookup(&root, "g").await.unwrap();
    assert_eq!(g, f, "one inode, one handle, across restarts");
    assert!(matches!(
        c.lookup(&root, "f").await,
        Err(ClientError::Status(NFS3ERR_NOENT))
    ));
    assert_eq!(c.size(&f).await.unwrap(), data.len() as u64);
    let mut read = Vec::new();
    while read.len() < data.len() {
        let chunk = c.read(&f, read.len() as u64, 65536).await.unwrap();
        assert!(!chunk.is_empty());
        read.extend_from_slice(&chunk);
    }
    assert!(read == data, "the committed data reads back after kill -9");
    server.kill9();
}
