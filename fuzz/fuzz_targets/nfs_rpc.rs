//! What any client can send the NFS port: a byte stream cut into RPC records, each read as a
//! call and then served by MOUNT and NFSv3 over the filesystem core on a `memory://` engine.
//! No input may panic, allocate past the record limit, or get a reply to a transaction it did
//! not name.
//!
//! Random bytes almost never make a valid file handle (it carries a keyed tag), so wherever
//! the arguments hold the length of a handle (37) at a 4-byte boundary, the 37 bytes after it
//! are replaced by a real handle: of the root, a directory or a file. That lets the fuzzer
//! reach every procedure's body, not only its handle check.
#![no_main]

use bucketfs_engine::bucket::open_url;
use bucketfs_engine::{Engine, EngineOptions};
use bucketfs_fs::{Caller, Fs, ROOT_INO, S_IFDIR, S_IFREG};
use bucketfs_nfs::export::Exports;
use bucketfs_nfs::handle::{self, HANDLE_BYTES};
use bucketfs_nfs::mount::MountProgram;
use bucketfs_nfs::nfs3::Nfs3Program;
use bucketfs_nfs::record::read_record;
use bucketfs_nfs::rpc::{decode_call, Credentials, Refusal};
use bucketfs_nfs::server::Dispatcher;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex};

const RECORD_BYTES_MAX: usize = 64 * 1024;
/// Runs on one runtime and filesystem before both are made anew (as ninep_session does).
const RUNS_PER_WORLD: usize = 5000;

struct World {
    rt: tokio::runtime::Runtime,
    server: Arc<Dispatcher>,
    handles: Arc<Vec<Vec<u8>>>,
    runs: usize,
}

fn new_world() -> World {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (server, handles) = rt.block_on(async {
        let bucket = open_url("memory://", &Vec::new()).expect("a memory bucket");
        let engine = Engine::open(bucket, EngineOptions::for_tests("fuzz"))
            .await
            .expect("an engine");
        let fs = Arc::new(Fs::open(engine).await.expect("a filesystem"));
        let root = Caller::root();
        let dir = fs.make(&root, ROOT_INO, b"d", S_IFDIR | 0o777, 0).await.unwrap();
        let file = fs.make(&root, dir.ino, b"f", S_IFREG | 0o666, 0).await.unwrap();
        let exports = Arc::new(Exports::new(&fs, Vec::new()).unwrap());
        let id = exports.iter().next().unwrap().id;
        let top = fs.getattr(ROOT_INO).await.unwrap();
        let handles = [&top, &dir, &file].map(|i| handle::encode(&fs, id, i)).to_vec();
        let server = Dispatcher::new(
            vec![
                Arc::new(MountProgram::new(fs.clone(), exports.clone())),
                Arc::new(Nfs3Program::new(fs, exports)),
            ],
            RECORD_BYTES_MAX,
        );
        (server, handles)
    });
    World {
        rt,
        server,
        handles: Arc::new(handles),
        runs: 0,
    }
}

/// Runs `run` on the current world (made anew every RUNS_PER_WORLD runs). It runs in the
/// runtime's own `block_on`: on a current-thread runtime only that one drives spawned tasks
/// and timers, and a READ may wait for a readahead task an earlier run spawned (through a
/// `Handle`, such a READ waited forever).
fn in_world(run: impl FnOnce(&tokio::runtime::Runtime, Arc<Dispatcher>, Arc<Vec<Vec<u8>>>)) {
    static WORLD: Mutex<Option<World>> = Mutex::new(None);
    let mut w = WORLD.lock().expect("not poisoned: a panic ends the fuzzer");
    if w.as_ref().is_none_or(|w| w.runs >= RUNS_PER_WORLD) {
        *w = Some(new_world());
    }
    let w = w.as_mut().expect("made above");
    w.runs += 1;
    run(&w.rt, w.server.clone(), w.handles.clone());
}

/// `record` with a real handle after every handle-sized length in its arguments.
fn with_real_handles(record: &[u8], args_at: usize, handles: &[Vec<u8>]) -> Vec<u8> {
    let mut r = record.to_vec();
    let (mut at, mut n) = (args_at, 0);
    while at + 4 + HANDLE_BYTES <= r.len() {
        if r[at..at + 4] == (HANDLE_BYTES as u32).to_be_bytes() {
            // The byte after the length picks which handle.
            let pick = usize::from(r[at + 4]) + n;
            r[at + 4..at + 4 + HANDLE_BYTES].copy_from_slice(&handles[pick % handles.len()]);
            at += 4 + HANDLE_BYTES;
            n += 1;
        } else {
            at += 4;
        }
    }
    r
}

fuzz_target!(|data: &[u8]| in_world(|rt, server, handles| {
    rt.block_on(async {
        let mut stream = data;
        while let Ok(Some(record)) = read_record(&mut stream, RECORD_BYTES_MAX).await {
            assert!(record.len() <= RECORD_BYTES_MAX);
            let record = match decode_call(&record) {
                Ok(call) => {
                    // The arguments are what follows the header, never beyond the record.
                    assert!(record.ends_with(call.args));
                    if let Credentials::Sys { machine, groups, .. } = &call.cred {
                        assert!(machine.len() <= 255 && groups.len() <= 16);
                    }
                    with_real_handles(&record, record.len() - call.args.len(), &handles)
                }
                // A refusal answers the transaction the record named, as a reply.
                Err(Refusal::Reply(reply)) => {
                    assert_eq!(reply[..4], record[..4]);
                    assert_eq!(reply[4..8], 1u32.to_be_bytes());
                    continue;
                }
                Err(Refusal::Ignore) => continue,
            };
            // Served: a reply (none only for a copy of a call still running, which cannot be
            // here: calls run one after another) to this transaction.
            let reply = server.reply(&record).await.expect("a call gets a reply");
            assert_eq!(reply[..4], record[..4]);
            assert_eq!(reply[4..8], 1u32.to_be_bytes());
        }
    });
}));
