//! What a hostile or damaged bucket can hand the engine: log-object metadata and trailers,
//! manifests, named-checkpoint pins, run indexes and run blocks; and the filesystem: inode
//! records (with their POSIX ACLs), which must come back the same when encoded again. The
//! first byte picks the decoder; the rest is its input.
#![no_main]

use bucketfs_engine::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    match which % 7 {
        0 => fuzzing::log_ops(input),
        1 => fuzzing::log_object(input),
        2 => fuzzing::manifest(input),
        3 => fuzzing::pin(input),
        4 => fuzzing::run_block(input),
        5 => fuzzing::run_index(input),
        _ => {
            if let Ok(inode) = bucketfs_fs::Inode::decode(7, input) {
                let again = bucketfs_fs::Inode::decode(7, &inode.encode())
                    .expect("an inode record encoded again decodes");
                assert_eq!(again, inode);
            }
        }
    }
});
