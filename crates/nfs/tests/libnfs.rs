//! libnfs's own tools (`nfs-ls`, `nfs-cat`, `nfs-cp`, from scripts/setup's libnfs-utils)
//! against the MOUNT and NFSv3 programs on a real TCP port, over the filesystem core on
//! `memory://`: the reference for whether our XDR is the one clients speak.

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::{Caller, Fs, ROOT_INO, S_IFDIR, S_IFREG};
use bucketfs_nfs::export::Exports;
use bucketfs_nfs::mount::MountProgram;
use bucketfs_nfs::nfs3::Nfs3Program;
use bucketfs_nfs::server::Dispatcher;
use std::process::Command;
use std::sync::Arc;

async fn run(tool: &str, url: String) -> (bool, String) {
    let tool = tool.to_string();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(&tool)
            .arg(&url)
            .output()
            .unwrap_or_else(|e| panic!("{tool} (libnfs-utils, installed by scripts/setup): {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libnfs_tools_list_read_and_write_the_tree() {
    let bucket = open_url("memory://", &Vec::new()).unwrap();
    let engine = Engine::open(bucket, EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    let fs = Arc::new(Fs::open(engine).await.unwrap());
    let root = Caller::root();
    let dir = fs
        .make(&root, ROOT_INO, b"dir", S_IFDIR | 0o755, 0)
        .await
        .unwrap();
    let hello = fs
        .make(&root, dir.ino, b"hello.txt", S_IFREG | 0o644, 0)
        .await
        .unwrap();
    let text = b"hello over NFSv3\n".repeat(5000);
    fs.write_file(&root, hello.ino, 0, text.as_slice(), false)
        .await
        .unwrap();
    for i in 0..300 {
        fs.make(
            &root,
            dir.ino,
            format!("entry-{i:03}").as_bytes(),
            S_IFREG | 0o600,
            0,
        )
        .await
        .unwrap();
    }

    let exports = Arc::new(Exports::new(&fs, Vec::new()).unwrap());
    let d = Dispatcher::new(
        vec![
            Arc::new(MountProgram::new(fs.clone(), exports.clone())),
            Arc::new(Nfs3Program::new(fs.clone(), exports)),
        ],
        2 << 20,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(d.serve_tcp(listener));
    let q = format!("?version=3&nfsport={port}&mountport={port}");

    let (ok, out) = run("nfs-ls", format!("nfs://127.0.0.1/{q}")).await;
    assert!(ok, "nfs-ls of the root: {out}");
    assert!(out.contains("dir") && out.contains(".nbd"), "{out}");

    // 300 entries take more than one READDIRPLUS page at libnfs's counts.
    let (ok, out) = run("nfs-ls", format!("nfs://127.0.0.1/dir{q}")).await;
    assert!(ok, "nfs-ls of a directory: {out}");
    assert!(
        out.contains("hello.txt") && out.contains(&text.len().to_string()),
        "the file and its size: {out}"
    );
    assert!(
        out.contains(&text.len().to_string()),
        "the file's size: {out}"
    );
    for i in 0..300 {
        assert!(
            out.contains(&format!("entry-{i:03}")),
            "entry-{i:03} missing: {out}"
        );
    }

    let (ok, out) = run("nfs-cat", format!("nfs://127.0.0.1/dir/hello.txt{q}")).await;
    assert!(ok, "nfs-cat: {out}");
    assert_eq!(out.as_bytes(), &text[..], "nfs-cat read other bytes");

    let (ok, out) = run("nfs-cat", format!("nfs://127.0.0.1/dir/missing.txt{q}")).await;
    assert!(!ok, "nfs-cat of a missing file succeeded: {out}");

    // The write path: nfs-cp copies a local file in (CREATE, WRITE, COMMIT) and back out.
    let local = tempfile::NamedTempFile::with_prefix("bucketfs-nfs-cp-").unwrap();
    let content: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    std::fs::write(local.path(), &content).unwrap();
    let (src, dst) = (
        local.path().display().to_string(),
        format!("nfs://127.0.0.1/dir/copied{q}"),
    );
    let copied = tokio::task::spawn_blocking(move || {
        Command::new("nfs-cp")
            .arg(&src)
            .arg(&dst)
            .output()
            .expect("nfs-cp (libnfs-utils)")
    })
    .await
    .unwrap();
    drop(local);
    assert!(
        copied.status.success(),
        "nfs-cp in: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let dir_inode = fs.lookup(&root, ROOT_INO, b"dir").await.unwrap();
    let inode = fs.lookup(&root, dir_inode.ino, b"copied").await.unwrap();
    assert_eq!(inode.size_bytes, content.len() as u64);
    assert_eq!(
        fs.read_file(inode.ino, 0, content.len()).await.unwrap(),
        content
    );
}
