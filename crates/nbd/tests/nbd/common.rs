//! Test fixture for the NBD protocol layer alone: an in-memory `Exports` (a byte vector behind a
//! mutex with a per-block allocation map, so block status means something), a server on
//! loopback, and a check for the external client tools.

#![allow(dead_code)] // Each test binary uses a different part of this module.

use async_trait::async_trait;
use bucketfs_nbd::{Export, ExportError, ExportSummary, Exports, Extent};
use bytes::Bytes;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Allocation granularity of the fixture: trims and punching zeroes free whole blocks only.
pub const BLOCK_BYTES: u64 = 4096;
pub const DISK_BYTES: u64 = 16 * 1024 * 1024;
pub const SMALL_BYTES: u64 = 1024 * 1024;
/// Reads at this offset of the "slow" export take this long, to force out-of-order replies.
pub const SLOW_OFFSET: u64 = 0;
pub const SLOW_READ_MS: u64 = 400;
/// Reads at this offset of the "slow" export fail with an I/O error.
pub const FAILING_OFFSET: u64 = 65536;

struct State {
    data: Vec<u8>,
    allocated: Vec<bool>,
}

pub struct MemExport {
    state: Mutex<State>,
    read_only: bool,
    slow: bool,
    pub flushes: AtomicU64,
    pub fua_writes: AtomicU64,
}

impl MemExport {
    fn new(size_bytes: u64, read_only: bool, slow: bool) -> Self {
        let blocks = size_bytes.div_ceil(BLOCK_BYTES) as usize;
        MemExport {
            state: Mutex::new(State {
                data: vec![0; size_bytes as usize],
                allocated: vec![false; blocks],
            }),
            read_only,
            slow,
            flushes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("fixture mutex poisoned")
    }

    /// Writes directly, bypassing the protocol, to set up a test.
    pub fn fill(&self, offset: u64, data: &[u8]) {
        let mut state = self.state();
        store(&mut state, offset, data);
    }

    pub fn contents(&self, offset: u64, length: usize) -> Vec<u8> {
        let state = self.state();
        state.data[offset as usize..offset as usize + length].to_vec()
    }

    pub fn is_allocated(&self, offset: u64) -> bool {
        self.state().allocated[(offset / BLOCK_BYTES) as usize]
    }
}

fn store(state: &mut State, offset: u64, data: &[u8]) {
    let start = offset as usize;
    state.data[start..start + data.len()].copy_from_slice(data);
    if !data.is_empty() {
        let last = (offset + data.len() as u64 - 1) / BLOCK_BYTES;
        for block in offset / BLOCK_BYTES..=last {
            state.allocated[block as usize] = true;
        }
    }
}

/// Zeroes the range; frees the blocks it covers entirely when `punch`, else allocates them all.
fn zero(state: &mut State, offset: u64, length: u32, punch: bool) {
    let start = offset as usize;
    let end = start + length as usize;
    state.data[start..end].fill(0);
    if length == 0 {
        return;
    }
    let end_offset = offset + u64::from(length);
    for block in offset / BLOCK_BYTES..=(end_offset - 1) / BLOCK_BYTES {
        let block_start = block * BLOCK_BYTES;
        let covered = block_start >= offset && block_start + BLOCK_BYTES <= end_offset;
        if punch {
            if covered {
                state.allocated[block as usize] = false;
            }
        } else {
            state.allocated[block as usize] = true;
        }
    }
}

#[async_trait]
impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.state().data.len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    async fn read(&self, offset: u64, length: u32) -> Result<Bytes, ExportError> {
        if self.slow && offset == SLOW_OFFSET {
            tokio::time::sleep(Duration::from_millis(SLOW_READ_MS)).await;
        }
        if self.slow && offset == FAILING_OFFSET {
            return Err(ExportError::Io("simulated media error".into()));
        }
        let state = self.state();
        let start = offset as usize;
        Ok(Bytes::copy_from_slice(
            &state.data[start..start + length as usize],
        ))
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        assert!(
            !self.read_only,
            "the server let a write through to a read-only export"
        );
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        store(&mut self.state(), offset, data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, length: u32, _fua: bool) -> Result<(), ExportError> {
        assert!(
            !self.read_only,
            "the server let a trim through to a read-only export"
        );
        zero(&mut self.state(), offset, length, true);
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        may_punch: bool,
        _fua: bool,
    ) -> Result<(), ExportError> {
        assert!(
            !self.read_only,
            "the server let a zero through to a read-only export"
        );
        zero(&mut self.state(), offset, length, may_punch);
        Ok(())
    }

    fn zeroes_are_fast(&self, may_punch: bool) -> bool {
        // Punching only flips bits; writing zeroes for real is as slow as a write.
        may_punch
    }

    async fn cache(&self, _offset: u64, _length: u32) -> Result<(), ExportError> {
        Ok(())
    }

    async fn block_status(&self, offset: u64, length: u32) -> Result<Vec<Extent>, ExportError> {
        let state = self.state();
        let end = offset + u64::from(length);
        let mut extents: Vec<Extent> = Vec::new();
        let mut position = offset;
        while position < end {
            let block = position / BLOCK_BYTES;
            let run_end = ((block + 1) * BLOCK_BYTES).min(end);
            let hole = !state.allocated[block as usize];
            let zero = hole
                || state.data[position as usize..run_end as usize]
                    .iter()
                    .all(|&b| b == 0);
            let run = (run_end - position) as u32;
            match extents.last_mut() {
                Some(last) if last.hole == hole && last.zero == zero => last.length += run,
                _ => extents.push(Extent {
                    length: run,
                    hole,
                    zero,
                }),
            }
            position = run_end;
        }
        Ok(extents)
    }
}

pub struct MemExports {
    exports: Vec<(ExportSummary, Arc<MemExport>)>,
}

#[async_trait]
impl Exports for MemExports {
    async fn list(&self) -> Result<Vec<ExportSummary>, ExportError> {
        Ok(self
            .exports
            .iter()
            .map(|(summary, _)| summary.clone())
            .collect())
    }

    async fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError> {
        self.exports
            .iter()
            .find(|(summary, _)| summary.name == name)
            .map(|(_, export)| Arc::clone(export) as Arc<dyn Export>)
            .ok_or(ExportError::NotFound)
    }
}

/// The exports every test sees: "disk0" (the default, writable, 16 MiB), "ro" (read-only,
/// 1 MiB of a known pattern) and "slow" (writable, 1 MiB, with a slow and a failing offset).
pub struct Fixture {
    pub disk: Arc<MemExport>,
    pub ro: Arc<MemExport>,
    pub slow: Arc<MemExport>,
    pub exports: Arc<dyn Exports>,
}

pub fn ro_pattern(offset: u64) -> u8 {
    (offset % 251) as u8
}

pub fn fixture() -> Fixture {
    let disk = Arc::new(MemExport::new(DISK_BYTES, false, false));
    let ro = Arc::new(MemExport::new(SMALL_BYTES, true, false));
    let pattern: Vec<u8> = (0..SMALL_BYTES).map(ro_pattern).collect();
    ro.fill(0, &pattern);
    let slow = Arc::new(MemExport::new(SMALL_BYTES, false, true));
    let summary = |name: &str, description: &str| ExportSummary {
        name: name.to_owned(),
        description: description.to_owned(),
    };
    let exports = Arc::new(MemExports {
        exports: vec![
            (summary("disk0", "test disk"), Arc::clone(&disk)),
            (summary("ro", "read-only pattern"), Arc::clone(&ro)),
            (summary("slow", "slow and failing"), Arc::clone(&slow)),
        ],
    });
    Fixture {
        disk,
        ro,
        slow,
        exports,
    }
}

/// A server running `serve_tcp` on 127.0.0.1 in its own runtime, stopped when dropped.
pub struct TestServer {
    pub port: u16,
    _runtime: tokio::runtime::Runtime,
}

impl TestServer {
    pub fn uri(&self, export: &str) -> String {
        format!("nbd://127.0.0.1:{}/{export}", self.port)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime")
}

pub fn start_tcp(exports: Arc<dyn Exports>) -> TestServer {
    init_logging();
    let runtime = runtime();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let port = listener.local_addr().expect("local address").port();
    runtime.spawn(async move {
        if let Err(error) = bucketfs_nbd::serve_tcp(listener, exports, Default::default()).await {
            panic!("serve_tcp failed: {error}");
        }
    });
    TestServer {
        port,
        _runtime: runtime,
    }
}

/// A server running `serve_unix` on `path`, stopped when dropped.
pub fn start_unix(exports: Arc<dyn Exports>, path: &std::path::Path) -> tokio::runtime::Runtime {
    init_logging();
    let runtime = runtime();
    let listener = {
        let _guard = runtime.enter();
        tokio::net::UnixListener::bind(path).expect("bind unix socket")
    };
    runtime.spawn(async move {
        if let Err(error) = bucketfs_nbd::serve_unix(listener, exports, Default::default()).await {
            panic!("serve_unix failed: {error}");
        }
    });
    runtime
}

/// Server logs go to the test output (shown for failing tests) when RUST_LOG is set.
fn init_logging() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Whether an external client tool is installed. In CI (env CI set) a missing tool fails the
/// test, because CI installs them; elsewhere the test is skipped with a message.
pub fn have_tool(name: &str) -> bool {
    let found = Command::new(name)
        .arg("--version")
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    if !found {
        if std::env::var_os("CI").is_some() {
            panic!("{name} is required but not installed (install libnbd-bin, qemu-utils, python3-libnbd)");
        }
        eprintln!("SKIPPED: {name} is not installed");
    }
    found
}

/// A scratch directory unique to one test, removed when dropped.
pub struct ScratchDir(pub std::path::PathBuf);

impl ScratchDir {
    pub fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!("bucketfs-nbd-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch dir");
        ScratchDir(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
