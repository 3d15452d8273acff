//! `serve_connection` over an in-process byte stream instead of a socket: the mode a fuzzer or
//! a stdin/stdout harness uses.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn serve_connection_runs_over_any_byte_stream() {
    let f = crate::common::fixture();
    let (mut client, server_side) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(bucketfs_nbd::serve_connection(
        server_side,
        f.exports.clone(),
        Default::default(),
    ));

    let mut greeting = [0u8; 18];
    client.read_exact(&mut greeting).await.expect("greeting");
    assert_eq!(&greeting[0..8], b"NBDMAGIC");
    client
        .write_all(&3u32.to_be_bytes())
        .await
        .expect("client flags");
    let mut option = b"IHAVEOPT".to_vec();
    option.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    option.extend_from_slice(&2u32.to_be_bytes());
    option.extend_from_slice(b"ro");
    client.write_all(&option).await.expect("export name");
    assert_eq!(
        client.read_u64().await.expect("size"),
        crate::common::SMALL_BYTES
    );
    client.read_u16().await.expect("flags");

    // READ 3 bytes at offset 5, then DISC.
    let mut request = Vec::new();
    for (command, length) in [(0u16, 3u32), (2, 0)] {
        request.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        request.extend_from_slice(&0u16.to_be_bytes());
        request.extend_from_slice(&command.to_be_bytes());
        request.extend_from_slice(&77u64.to_be_bytes());
        request.extend_from_slice(&5u64.to_be_bytes());
        request.extend_from_slice(&length.to_be_bytes());
    }
    client.write_all(&request).await.expect("requests");
    let mut reply = [0u8; 19];
    client.read_exact(&mut reply).await.expect("reply");
    assert_eq!(&reply[0..4], &0x6744_6698u32.to_be_bytes());
    assert_eq!(&reply[4..8], &[0, 0, 0, 0]);
    assert_eq!(&reply[8..16], &77u64.to_be_bytes());
    assert_eq!(&reply[16..19], &[5, 6, 7]);

    server
        .await
        .expect("server task")
        .expect("clean disconnect");
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.expect("end of stream");
    assert!(rest.is_empty());
}
