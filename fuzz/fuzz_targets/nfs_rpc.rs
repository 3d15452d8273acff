//! What any client can send the NFS port: a byte stream cut into RPC records and each read as
//! a call, with the replies a server sends checked for what they promise. No input may panic,
//! allocate past the record limit, or get a reply to a transaction it did not name.
#![no_main]

use bucketfs_nfs::record::read_record;
use bucketfs_nfs::rpc::{decode_call, Credentials, Refusal};
use libfuzzer_sys::fuzz_target;

const RECORD_BYTES_MAX: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut stream = data;
        while let Ok(Some(record)) = read_record(&mut stream, RECORD_BYTES_MAX).await {
            assert!(record.len() <= RECORD_BYTES_MAX);
            match decode_call(&record) {
                Ok(call) => {
                    // The arguments are what follows the header, never beyond the record.
                    assert!(record.ends_with(call.args));
                    if let Credentials::Sys { machine, groups, .. } = &call.cred {
                        assert!(machine.len() <= 255 && groups.len() <= 16);
                    }
                }
                // A refusal answers the transaction the record named, as a reply.
                Err(Refusal::Reply(reply)) => {
                    assert_eq!(reply[..4], record[..4]);
                    assert_eq!(reply[4..8], 1u32.to_be_bytes());
                }
                Err(Refusal::Ignore) => {}
            }
        }
    });
});
