//! Entry points for the fuzz targets (fuzz/, docs/testing.md): each takes bytes as a hostile
//! or damaged bucket could hold them and must answer an error, never panic, hang or allocate
//! without bound. Sealed parts are sealed here with a fixed key around the fuzzer's bytes, so
//! that the fuzzer reaches the parsers behind authentication (a real attacker without the key
//! cannot, but a bug in our own encoder could).

use crate::bucket::{open_url, PutMode};
use crate::crypto::{Cipher, DataKey, Sealer};
use crate::lsm::run;
use crate::meta::{decode_ops, encode_ops};
use std::sync::Arc;

fn sealer() -> Arc<Sealer> {
    thread_local! {
        static SEALER: Arc<Sealer> = Arc::new(Sealer::new(&DataKey::fixed(7), Cipher::Aes256GcmBlake3));
    }
    SEALER.with(Arc::clone)
}

/// Log-object metadata (the ops a barrier commits): what decodes must encode back the same.
pub fn log_ops(data: &[u8]) {
    if let Ok(ops) = decode_ops(data) {
        let mut again = Vec::new();
        encode_ops(&ops, &mut again);
        assert_eq!(decode_ops(&again).as_ref(), Ok(&ops), "ops re-encode");
    }
}

/// A log object's trailer and sealed metadata, `data` as the whole object.
pub fn log_object(data: &[u8]) {
    let size = data.len() as u64;
    if size < crate::logobj::LOG_TRAILER_BYTES {
        return;
    }
    let tail = &data[(size - crate::logobj::LOG_TRAILER_BYTES) as usize..];
    if let Ok(range) = crate::logobj::parse_trailer("log/x", size, tail) {
        let sealed = &data[range.start as usize..range.end as usize];
        let _ = crate::logobj::open_log_meta(&sealer(), "log/x", 1, sealed);
    }
}

/// A manifest whose sealed body is `data`.
pub fn manifest(data: &[u8]) {
    let s = sealer();
    for version_2 in [false, true] {
        let object = crate::logobj::fuzz_manifest(&s, 1, data, version_2);
        let _ = crate::logobj::decode_manifest(&s, "manifest/x", 1, &object);
    }
}

/// A named checkpoint's pin whose compressed body is `data`.
pub fn pin(data: &[u8]) {
    crate::engine::fuzz_pin(&sealer(), data);
}

/// A run block's plaintext.
pub fn run_block(data: &[u8]) {
    let _ = run::fuzz_block(data);
}

/// A run object whose sealed index is `data` (compressed here), then every block it names.
pub fn run_index(data: &[u8]) {
    // One runtime and bucket per thread: made per input, they cost more than the parsing.
    thread_local! {
        static WORLD: (tokio::runtime::Runtime, crate::bucket::SharedBucket) = (
            tokio::runtime::Builder::new_current_thread().build().expect("a runtime"),
            open_url("memory://", &Vec::new()).expect("a memory bucket"),
        );
    }
    let s = sealer();
    let object = run::fuzz_object_with_index(&s, 1, data);
    WORLD.with(|(rt, bucket)| {
        rt.block_on(async {
            let size = object.len() as u64;
            bucket
                .put("run/x", object.into(), PutMode::Overwrite)
                .await
                .expect("memory put");
            if let Ok(reader) = run::RunReader::open(bucket.clone(), s, "run/x", 1, size).await {
                for block in 0..reader.block_count() {
                    let _ = reader.block(block).await;
                }
            }
        })
    });
}
