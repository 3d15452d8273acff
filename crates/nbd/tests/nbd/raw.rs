//! The server driven byte by byte over a plain TCP socket, for what real clients never send:
//! malformed handshakes, oversized lengths, unknown options and commands, requests past the end,
//! and many requests in flight at once. Wire values are written out here independently of the
//! crate's own encoder, so a mistake there cannot hide in both.

use crate::common::{
    fixture, ro_pattern, start_tcp, Fixture, TestServer, DISK_BYTES, FAILING_OFFSET, SLOW_OFFSET,
    SMALL_BYTES,
};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_LIST_META_CONTEXT: u32 = 9;
const OPT_SET_META_CONTEXT: u32 = 10;

const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_META_CONTEXT: u32 = 4;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_POLICY: u32 = (1 << 31) + 2;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

const INFO_EXPORT: u16 = 0;
const INFO_NAME: u16 = 1;
const INFO_DESCRIPTION: u16 = 2;
const INFO_BLOCK_SIZE: u16 = 3;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
const CMD_CACHE: u16 = 5;
const CMD_WRITE_ZEROES: u16 = 6;
const CMD_BLOCK_STATUS: u16 = 7;

const FLAG_FUA: u16 = 1;
const FLAG_NO_HOLE: u16 = 2;
const FLAG_REQ_ONE: u16 = 8;
const FLAG_FAST_ZERO: u16 = 16;

const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

const EPERM: u32 = 1;
const EIO: u32 = 5;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;
const ENOTSUP: u32 = 95;

const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;

struct OptionReply {
    option: u32,
    reply_type: u32,
    data: Vec<u8>,
}

struct Chunk {
    flags: u16,
    reply_type: u16,
    handle: u64,
    payload: Vec<u8>,
}

impl Chunk {
    fn error(&self) -> (u32, String) {
        assert_eq!(self.reply_type, REPLY_TYPE_ERROR, "expected an error chunk");
        let errno = u32::from_be_bytes(self.payload[0..4].try_into().expect("4 bytes"));
        let length = u16::from_be_bytes(self.payload[4..6].try_into().expect("2 bytes")) as usize;
        assert_eq!(self.payload.len(), 6 + length);
        (
            errno,
            String::from_utf8(self.payload[6..].to_vec()).expect("UTF-8 message"),
        )
    }
}

struct Client {
    stream: TcpStream,
}

impl Client {
    /// Connects and checks the greeting.
    fn connect(server: &TestServer) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let mut client = Client { stream };
        let greeting = client.read(18);
        assert_eq!(&greeting[0..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], IHAVEOPT);
        assert_eq!(&greeting[16..18], &[0, 3], "FIXED_NEWSTYLE | NO_ZEROES");
        client
    }

    /// Connects and sends client flags FIXED_NEWSTYLE | NO_ZEROES.
    fn start(server: &TestServer) -> Client {
        let mut client = Client::connect(server);
        client.send(&3u32.to_be_bytes());
        client
    }

    /// Connects, negotiates and enters transmission on `name`.
    fn open(server: &TestServer, name: &str, structured: bool, block_status: bool) -> Client {
        let mut client = Client::start(server);
        if structured {
            client.option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(client.option_reply().reply_type, REP_ACK);
        }
        if block_status {
            client.option(
                OPT_SET_META_CONTEXT,
                &meta_query(name, &["base:allocation"]),
            );
            assert_eq!(client.option_reply().reply_type, REP_META_CONTEXT);
            assert_eq!(client.option_reply().reply_type, REP_ACK);
        }
        client.option(OPT_GO, &info_request(name, &[]));
        loop {
            let reply = client.option_reply();
            match reply.reply_type {
                REP_INFO => continue,
                REP_ACK => break,
                other => panic!("GO failed with {other:#x}"),
            }
        }
        client
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn read(&mut self, count: usize) -> Vec<u8> {
        let mut buffer = vec![0u8; count];
        self.stream
            .read_exact(&mut buffer)
            .expect("read from server");
        buffer
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.read(2).try_into().expect("2 bytes"))
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.read(4).try_into().expect("4 bytes"))
    }

    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.read(8).try_into().expect("8 bytes"))
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let mut bytes = IHAVEOPT.to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        self.send(&bytes);
    }

    fn option_reply(&mut self) -> OptionReply {
        assert_eq!(self.u64(), OPTION_REPLY_MAGIC);
        let option = self.u32();
        let reply_type = self.u32();
        let length = self.u32() as usize;
        let data = self.read(length);
        OptionReply {
            option,
            reply_type,
            data,
        }
    }

    fn request(
        &mut self,
        flags: u16,
        command: u16,
        handle: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&handle.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend_from_slice(payload);
        self.send(&bytes);
    }

    /// A simple reply header: (error, handle).
    fn simple_reply(&mut self) -> (u32, u64) {
        assert_eq!(self.u32(), SIMPLE_REPLY_MAGIC);
        let error = self.u32();
        (error, self.u64())
    }

    fn chunk(&mut self) -> Chunk {
        assert_eq!(self.u32(), STRUCTURED_REPLY_MAGIC);
        let flags = self.u16();
        let reply_type = self.u16();
        let handle = self.u64();
        let length = self.u32() as usize;
        Chunk {
            flags,
            reply_type,
            handle,
            payload: self.read(length),
        }
    }

    /// Asserts the server closed the connection (EOF or reset) without sending anything more.
    fn assert_closed(&mut self) {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => {}
            Ok(_) => panic!("server sent more data instead of closing"),
            Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
            Err(error) => panic!("expected the connection to close, got {error}"),
        }
    }

    /// Reads `length` bytes at `offset` on a simple-reply connection.
    fn read_simple(&mut self, handle: u64, offset: u64, length: u32) -> Vec<u8> {
        self.request(0, CMD_READ, handle, offset, length, &[]);
        assert_eq!(self.simple_reply(), (0, handle));
        self.read(length as usize)
    }
}

fn string_field(text: &str) -> Vec<u8> {
    let mut bytes = (text.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

fn info_request(name: &str, info_types: &[u16]) -> Vec<u8> {
    let mut bytes = string_field(name);
    bytes.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for info_type in info_types {
        bytes.extend_from_slice(&info_type.to_be_bytes());
    }
    bytes
}

fn meta_query(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut bytes = string_field(name);
    bytes.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        bytes.extend_from_slice(&string_field(query));
    }
    bytes
}

fn server() -> (Fixture, TestServer) {
    let f = fixture();
    let server = start_tcp(f.exports.clone());
    (f, server)
}

/// Proves the server still serves: a fresh connection negotiates and reads.
fn assert_server_alive(server: &TestServer) {
    let mut client = Client::open(server, "ro", false, false);
    assert_eq!(client.read_simple(1, 0, 3), vec![0, 1, 2]);
}

// ---------------------------------------------------------------- handshake

#[test]
fn export_name_reply_has_zeroes_unless_no_zeroes_was_negotiated() {
    let (_f, server) = server();
    let mut client = Client::connect(&server);
    client.send(&1u32.to_be_bytes()); // FIXED_NEWSTYLE only
    client.option(OPT_EXPORT_NAME, b"disk0");
    assert_eq!(client.u64(), DISK_BYTES);
    let flags = client.u16();
    assert_eq!(flags & 1, 1, "HAS_FLAGS");
    assert_eq!(client.read(124), vec![0u8; 124]);
    assert_eq!(client.read_simple(9, 0, 16), vec![0u8; 16]);

    let mut client = Client::start(&server);
    client.option(OPT_EXPORT_NAME, b"ro");
    assert_eq!(client.u64(), SMALL_BYTES);
    let flags = client.u16();
    assert_eq!(flags & 2, 2, "READ_ONLY");
    // No padding: the very next bytes are the reply to our first request.
    assert_eq!(client.read_simple(7, 1, 2), vec![1, 2]);
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let (_f, server) = server();
    let mut client = Client::connect(&server);
    client.send(&(1u32 << 5).to_be_bytes());
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    client.send(b"IHAVEOPX\0\0\0\x07\0\0\0\0");
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn unknown_options_are_unsupported_and_negotiation_goes_on() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    for option in [99u32, 4, 0xdead_beef] {
        client.option(option, b"some data");
        let reply = client.option_reply();
        assert_eq!((reply.option, reply.reply_type), (option, REP_ERR_UNSUP));
    }
    client.option(OPT_GO, &info_request("ro", &[]));
    let info = client.option_reply();
    assert_eq!(info.reply_type, REP_INFO);
    assert_eq!(&info.data[0..2], &INFO_EXPORT.to_be_bytes());
}

#[test]
fn starttls_is_refused_by_policy_when_tls_is_off_and_negotiation_goes_on() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    client.option(OPT_STARTTLS, &[]);
    let reply = client.option_reply();
    assert_eq!(
        (reply.option, reply.reply_type),
        (OPT_STARTTLS, REP_ERR_POLICY)
    );
    client.option(OPT_GO, &info_request("ro", &[]));
    assert_eq!(client.option_reply().reply_type, REP_INFO);
}

#[test]
fn malformed_options_are_invalid_and_negotiation_goes_on() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    let mut bad_name_length = 100u32.to_be_bytes().to_vec();
    bad_name_length.extend_from_slice(&[0, 0]);
    let mut count_too_large = string_field("disk0");
    count_too_large.extend_from_slice(&5u16.to_be_bytes());
    let mut not_utf8 = 2u32.to_be_bytes().to_vec();
    not_utf8.extend_from_slice(&[0xff, 0xfe, 0, 0]);
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (OPT_LIST, b"x".to_vec()),
        (OPT_STRUCTURED_REPLY, b"x".to_vec()),
        (OPT_GO, vec![]),
        (OPT_GO, bad_name_length.clone()),
        (OPT_INFO, count_too_large),
        (OPT_INFO, not_utf8),
        // Metadata contexts before structured replies.
        (OPT_SET_META_CONTEXT, meta_query("", &["base:allocation"])),
    ];
    for (option, data) in cases {
        client.option(option, &data);
        let reply = client.option_reply();
        assert_eq!(
            (reply.option, reply.reply_type),
            (option, REP_ERR_INVALID),
            "option {option}"
        );
        assert!(!reply.data.is_empty(), "error replies carry a message");
    }
    client.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.option_reply().reply_type, REP_ACK);
    client.option(OPT_LIST_META_CONTEXT, &bad_name_length);
    assert_eq!(client.option_reply().reply_type, REP_ERR_INVALID);
    client.option(OPT_SET_META_CONTEXT, &meta_query("", &["no-namespace"]));
    assert_eq!(client.option_reply().reply_type, REP_ERR_INVALID);
    client.option(OPT_GO, &info_request("", &[]));
    assert_eq!(client.option_reply().reply_type, REP_INFO);
}

#[test]
fn oversized_option_is_refused_then_the_connection_closes() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    let mut header = IHAVEOPT.to_vec();
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    client.send(&header);
    let reply = client.option_reply();
    assert_eq!((reply.option, reply.reply_type), (OPT_GO, REP_ERR_TOO_BIG));
    client.assert_closed();

    // NBD_OPT_EXPORT_NAME cannot be answered with an error: just closed.
    let mut client = Client::start(&server);
    let mut header = IHAVEOPT.to_vec();
    header.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    client.send(&header);
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn unknown_exports_are_reported_or_closed() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    for option in [OPT_INFO, OPT_GO] {
        client.option(option, &info_request("nope", &[INFO_NAME]));
        let reply = client.option_reply();
        assert_eq!((reply.option, reply.reply_type), (option, REP_ERR_UNKNOWN));
    }
    client.option(OPT_EXPORT_NAME, b"nope");
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn list_then_info_then_abort() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    client.option(OPT_LIST, &[]);
    let mut listed = Vec::new();
    loop {
        let reply = client.option_reply();
        assert_eq!(reply.option, OPT_LIST);
        if reply.reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, REP_SERVER);
        let name_length =
            u32::from_be_bytes(reply.data[0..4].try_into().expect("4 bytes")) as usize;
        let name = String::from_utf8(reply.data[4..4 + name_length].to_vec()).expect("UTF-8");
        let description = String::from_utf8(reply.data[4 + name_length..].to_vec()).expect("UTF-8");
        listed.push((name, description));
    }
    assert_eq!(
        listed,
        vec![
            ("disk0".to_owned(), "test disk".to_owned()),
            ("ro".to_owned(), "read-only pattern".to_owned()),
            ("slow".to_owned(), "slow and failing".to_owned()),
        ]
    );

    // The empty name is the default export, the first listed.
    client.option(
        OPT_INFO,
        &info_request("", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    );
    let mut infos = HashMap::new();
    loop {
        let reply = client.option_reply();
        if reply.reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, REP_INFO);
        let info_type = u16::from_be_bytes(reply.data[0..2].try_into().expect("2 bytes"));
        infos.insert(info_type, reply.data[2..].to_vec());
    }
    let export = &infos[&INFO_EXPORT];
    assert_eq!(&export[0..8], &DISK_BYTES.to_be_bytes());
    let flags = u16::from_be_bytes(export[8..10].try_into().expect("2 bytes"));
    // HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, CAN_MULTI_CONN, SEND_CACHE,
    // SEND_FAST_ZERO; not READ_ONLY, not SEND_DF.
    assert_eq!(flags, 1 | 4 | 8 | 32 | 64 | 256 | 1024 | 2048);
    assert_eq!(infos[&INFO_NAME], b"disk0");
    assert_eq!(infos[&INFO_DESCRIPTION], b"test disk");
    let sizes: Vec<u32> = infos[&INFO_BLOCK_SIZE]
        .chunks(4)
        .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        .collect();
    assert_eq!(sizes, vec![1, 4096, MAX_PAYLOAD]);

    client.option(OPT_ABORT, &[]);
    assert_eq!(client.option_reply().reply_type, REP_ACK);
    client.assert_closed();
}

#[test]
fn metadata_contexts_list_and_select_base_allocation() {
    let (_f, server) = server();
    let mut client = Client::start(&server);
    client.option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(client.option_reply().reply_type, REP_ACK);

    let contexts = |client: &mut Client, option: u32, queries: &[&str]| {
        client.option(option, &meta_query("disk0", queries));
        let mut found = Vec::new();
        loop {
            let reply = client.option_reply();
            match reply.reply_type {
                REP_ACK => return found,
                REP_META_CONTEXT => {
                    let id = u32::from_be_bytes(reply.data[0..4].try_into().expect("4 bytes"));
                    found.push((
                        id,
                        String::from_utf8(reply.data[4..].to_vec()).expect("UTF-8"),
                    ));
                }
                other => panic!("unexpected reply {other:#x}"),
            }
        }
    };
    let base = "base:allocation".to_owned();
    assert_eq!(
        contexts(&mut client, OPT_LIST_META_CONTEXT, &[]),
        vec![(0, base.clone())]
    );
    assert_eq!(
        contexts(&mut client, OPT_LIST_META_CONTEXT, &["base:"]),
        vec![(0, base.clone())]
    );
    assert_eq!(
        contexts(&mut client, OPT_LIST_META_CONTEXT, &["qemu:dirty-bitmap:x"]),
        vec![]
    );
    assert_eq!(
        contexts(&mut client, OPT_SET_META_CONTEXT, &["base:"]),
        vec![]
    );
    let selected = contexts(
        &mut client,
        OPT_SET_META_CONTEXT,
        &["x-foo:bar", "base:allocation"],
    );
    assert_eq!(selected.len(), 1);
    assert_eq!(selected[0].1, base);
    let context_id = selected[0].0;

    client.option(OPT_GO, &info_request("disk0", &[]));
    while client.option_reply().reply_type != REP_ACK {}
    client.request(FLAG_REQ_ONE, CMD_BLOCK_STATUS, 5, 0, 65536, &[]);
    let chunk = client.chunk();
    assert_eq!(
        (chunk.flags, chunk.reply_type, chunk.handle),
        (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 5)
    );
    assert_eq!(&chunk.payload[0..4], &context_id.to_be_bytes());
    assert_eq!(&chunk.payload[4..8], &65536u32.to_be_bytes());
    assert_eq!(&chunk.payload[8..12], &3u32.to_be_bytes(), "HOLE | ZERO");
    assert_eq!(chunk.payload.len(), 12);
}

#[test]
fn one_bad_client_does_not_disturb_another() {
    let (_f, server) = server();
    let mut good = Client::open(&server, "ro", false, false);
    assert_eq!(good.read_simple(1, 10, 2), vec![10, 11]);
    let mut bad = Client::connect(&server);
    bad.send(b"this is not NBD at all, just noise .....................");
    bad.assert_closed();
    assert_eq!(good.read_simple(2, 20, 2), vec![20, 21]);
    assert_server_alive(&server);
}

#[test]
fn random_garbage_never_brings_the_server_down() {
    let (_f, server) = server();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0u32..64 {
        let mut client = Client::connect(&server);
        let mut bytes = Vec::new();
        // Half the rounds get past the flags and option magic, to reach the option parsers.
        if round.is_multiple_of(2) {
            bytes.extend_from_slice(&3u32.to_be_bytes());
            bytes.extend_from_slice(IHAVEOPT);
            bytes.extend_from_slice(&((next() % 12) as u32).to_be_bytes());
            bytes.extend_from_slice(&((next() % 64) as u32).to_be_bytes());
        }
        let length = next() % 200;
        bytes.extend((0..length).map(|_| next() as u8));
        client.send(&bytes);
        client.stream.shutdown(Shutdown::Write).expect("half-close");
        // Whatever the server answers, it must end the connection once input runs out.
        let mut sink = Vec::new();
        let _ = client.stream.read_to_end(&mut sink);
    }
    assert_server_alive(&server);
}

// ---------------------------------------------------------------- transmission

#[test]
fn read_past_the_end_is_einval_and_the_connection_survives() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "ro", false, false);
    client.request(0, CMD_READ, 1, SMALL_BYTES - 10, 11, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 1));
    client.request(0, CMD_READ, 2, u64::MAX - 5, 10, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 2));
    let expected = vec![ro_pattern(SMALL_BYTES - 2), ro_pattern(SMALL_BYTES - 1)];
    assert_eq!(client.read_simple(3, SMALL_BYTES - 2, 2), expected);
}

#[test]
fn structured_replies_carry_data_and_error_messages() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "ro", true, false);
    client.request(0, CMD_READ, 1, SMALL_BYTES, 1, &[]);
    let chunk = client.chunk();
    assert_eq!((chunk.flags, chunk.handle), (REPLY_FLAG_DONE, 1));
    let (errno, message) = chunk.error();
    assert_eq!(errno, EINVAL);
    assert!(message.contains("past the end"), "message: {message}");

    client.request(0, CMD_READ, 2, 1000, 4, &[]);
    let chunk = client.chunk();
    assert_eq!(
        (chunk.flags, chunk.reply_type, chunk.handle),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert_eq!(&chunk.payload[0..8], &1000u64.to_be_bytes());
    let expected: Vec<u8> = (1000..1004).map(ro_pattern).collect();
    assert_eq!(&chunk.payload[8..], &expected[..]);

    // A zero-length read is a success without a data chunk.
    client.request(0, CMD_READ, 3, 0, 0, &[]);
    let chunk = client.chunk();
    assert_eq!(
        (chunk.flags, chunk.reply_type, chunk.handle),
        (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 3)
    );

    // Non-read successes may be simple replies even with structured replies on.
    client.request(0, CMD_FLUSH, 4, 0, 0, &[]);
    assert_eq!(client.simple_reply(), (0, 4));
}

#[test]
fn write_past_the_end_is_enospc_and_its_payload_is_skipped() {
    let (f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    client.request(0, CMD_WRITE, 1, DISK_BYTES - 4, 8, &[0xee; 8]);
    assert_eq!(client.simple_reply(), (ENOSPC, 1));
    client.request(0, CMD_WRITE_ZEROES, 2, DISK_BYTES, 1, &[]);
    assert_eq!(client.simple_reply(), (ENOSPC, 2));
    client.request(0, CMD_WRITE, 3, DISK_BYTES - 4, 4, &[0xaa; 4]);
    assert_eq!(client.simple_reply(), (0, 3));
    assert_eq!(
        f.disk.contents(DISK_BYTES - 8, 8),
        vec![0, 0, 0, 0, 0xaa, 0xaa, 0xaa, 0xaa]
    );
}

#[test]
fn oversized_write_payload_is_skipped_with_einval() {
    let (f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    let length = MAX_PAYLOAD + 1;
    let payload = vec![0x77u8; length as usize];
    // A second thread sends, since the payload is larger than the socket buffers.
    let mut sender = client.stream.try_clone().expect("clone socket");
    let send = std::thread::spawn(move || {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend_from_slice(&CMD_WRITE.to_be_bytes());
        bytes.extend_from_slice(&1u64.to_be_bytes());
        bytes.extend_from_slice(&0u64.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        sender.write_all(&bytes).expect("send header");
        sender.write_all(&payload).expect("send payload");
    });
    assert_eq!(client.simple_reply(), (EINVAL, 1));
    send.join().expect("sender");
    assert_eq!(client.read_simple(2, 0, 4), vec![0; 4]);
    assert!(
        !f.disk.is_allocated(0),
        "nothing of the refused write may land"
    );

    client.request(0, CMD_READ, 3, 0, MAX_PAYLOAD + 1, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 3));
    client.request(0, CMD_CACHE, 4, 0, MAX_PAYLOAD + 1, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 4));
    assert_eq!(client.read_simple(5, 0, 4), vec![0; 4]);
}

#[test]
fn absurd_write_length_ends_the_connection() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    client.request(0, CMD_WRITE, 1, 0, u32::MAX, &[1, 2, 3]);
    assert_eq!(client.simple_reply(), (EINVAL, 1));
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn unknown_commands_and_flags_are_einval() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    client.request(0, 42, 1, 0, 0, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 1));
    client.request(1 << 9, CMD_READ, 2, 0, 512, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 2));
    client.request(FLAG_NO_HOLE, CMD_TRIM, 3, 0, 512, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 3));
    // A refused write still has its payload consumed.
    client.request(FLAG_REQ_ONE, CMD_WRITE, 4, 0, 3, &[1, 2, 3]);
    assert_eq!(client.simple_reply(), (EINVAL, 4));
    client.request(0, CMD_FLUSH, 5, 1, 0, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 5));
    // Block status without a negotiated context.
    client.request(0, CMD_BLOCK_STATUS, 6, 0, 512, &[]);
    assert_eq!(client.simple_reply(), (EINVAL, 6));
    assert_eq!(client.read_simple(7, 0, 1), vec![0]);
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    client.send(&[0u8; 28]);
    client.assert_closed();
    assert_server_alive(&server);
}

#[test]
fn writes_to_a_read_only_export_are_eperm() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "ro", false, false);
    client.request(0, CMD_WRITE, 1, 0, 4, &[9; 4]);
    assert_eq!(client.simple_reply(), (EPERM, 1));
    client.request(0, CMD_TRIM, 2, 0, 4096, &[]);
    assert_eq!(client.simple_reply(), (EPERM, 2));
    client.request(0, CMD_WRITE_ZEROES, 3, 0, 4096, &[]);
    assert_eq!(client.simple_reply(), (EPERM, 3));
    assert_eq!(client.read_simple(4, 0, 4), vec![0, 1, 2, 3]);
}

#[test]
fn zero_length_requests_succeed() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "disk0", false, false);
    for (handle, command) in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES]
        .into_iter()
        .enumerate()
    {
        client.request(0, command, handle as u64, DISK_BYTES, 0, &[]);
        assert_eq!(
            client.simple_reply(),
            (0, handle as u64),
            "command {command}"
        );
    }
    assert_eq!(client.read_simple(99, 0, 1), vec![0]);
}

#[test]
fn fast_zero_fails_fast_unless_it_may_punch() {
    let (f, server) = server();
    f.disk.fill(0, &[5; 8192]);
    let mut client = Client::open(&server, "disk0", false, false);
    client.request(
        FLAG_FAST_ZERO | FLAG_NO_HOLE,
        CMD_WRITE_ZEROES,
        1,
        0,
        8192,
        &[],
    );
    assert_eq!(client.simple_reply(), (ENOTSUP, 1));
    assert_eq!(
        f.disk.contents(0, 8192),
        vec![5; 8192],
        "a refused fast zero changes nothing"
    );
    client.request(FLAG_FAST_ZERO | FLAG_FUA, CMD_WRITE_ZEROES, 2, 0, 4096, &[]);
    assert_eq!(client.simple_reply(), (0, 2));
    client.request(FLAG_NO_HOLE, CMD_WRITE_ZEROES, 3, 4096, 100, &[]);
    assert_eq!(client.simple_reply(), (0, 3));
    let mut expected = vec![0u8; 4196];
    expected.extend_from_slice(&[5; 3996]);
    assert_eq!(f.disk.contents(0, 8192), expected);
    assert!(!f.disk.is_allocated(0));
    assert!(f.disk.is_allocated(4096));
}

#[test]
fn export_errors_become_nbd_errors() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "slow", false, false);
    client.request(0, CMD_READ, 1, FAILING_OFFSET, 512, &[]);
    assert_eq!(client.simple_reply(), (EIO, 1));
    let mut client = Client::open(&server, "slow", true, false);
    client.request(0, CMD_READ, 2, FAILING_OFFSET, 512, &[]);
    let (errno, message) = client.chunk().error();
    assert_eq!(errno, EIO);
    assert!(
        message.contains("simulated media error"),
        "message: {message}"
    );
}

#[test]
fn replies_arrive_as_requests_complete() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "slow", false, false);
    client.request(0, CMD_READ, 1, SLOW_OFFSET, 4096, &[]);
    client.request(0, CMD_READ, 2, 8192, 4096, &[]);
    client.request(FLAG_FUA, CMD_WRITE, 3, 12288, 4, &[1, 2, 3, 4]);
    // The slow read was sent first but must be answered last.
    let mut order = Vec::new();
    for _ in 0..3 {
        let (error, handle) = client.simple_reply();
        assert_eq!(error, 0);
        if handle != 3 {
            client.read(4096);
        }
        order.push(handle);
    }
    assert_eq!(order.last(), Some(&1), "reply order {order:?}");
}

#[test]
fn disconnect_waits_for_requests_in_flight() {
    let (_f, server) = server();
    let mut client = Client::open(&server, "slow", false, false);
    client.request(0, CMD_READ, 1, SLOW_OFFSET, 512, &[]);
    client.request(0, CMD_DISC, 2, 0, 0, &[]);
    assert_eq!(client.simple_reply(), (0, 1));
    assert_eq!(client.read(512), vec![0; 512]);
    client.assert_closed();
}

#[test]
fn hundreds_of_pipelined_requests_all_get_their_reply() {
    let (f, server) = server();
    let client = Client::open(&server, "disk0", true, false);
    const COUNT: u64 = 600;
    const LENGTH: u32 = 4096;
    let pattern = |index: u64| (index % 250) as u8 + 1;

    // Replies are read on another thread, so the client never stops draining them while it sends.
    let mut replies = Client {
        stream: client.stream.try_clone().expect("clone socket"),
    };
    let reader = std::thread::spawn(move || {
        let mut seen = HashMap::new();
        while seen.len() < (2 * COUNT) as usize {
            let head = replies.u32();
            if head == SIMPLE_REPLY_MAGIC {
                let error = replies.u32();
                let handle = replies.u64();
                assert_eq!(error, 0, "write {handle} failed");
                seen.insert(handle, Vec::new());
            } else {
                assert_eq!(head, STRUCTURED_REPLY_MAGIC);
                let flags = replies.u16();
                let reply_type = replies.u16();
                let handle = replies.u64();
                let length = replies.u32() as usize;
                assert_eq!(
                    (flags, reply_type),
                    (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA),
                    "read {handle}"
                );
                let payload = replies.read(length);
                seen.insert(handle, payload[8..].to_vec());
            }
        }
        seen
    });

    let mut sender = client;
    // All writes leave in one burst: far more than REQUESTS_IN_FLIGHT_MAX arrive at once.
    let mut batch = Vec::new();
    for index in 0..COUNT {
        let offset = index * u64::from(LENGTH);
        batch.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        batch.extend_from_slice(&0u16.to_be_bytes());
        batch.extend_from_slice(&CMD_WRITE.to_be_bytes());
        batch.extend_from_slice(&index.to_be_bytes());
        batch.extend_from_slice(&offset.to_be_bytes());
        batch.extend_from_slice(&LENGTH.to_be_bytes());
        batch.extend(std::iter::repeat_n(pattern(index), LENGTH as usize));
    }
    sender.send(&batch);
    for index in 0..COUNT {
        sender.request(
            0,
            CMD_READ,
            COUNT + index,
            index * u64::from(LENGTH),
            LENGTH,
            &[],
        );
    }
    let seen = reader.join().expect("reply reader");
    for index in 0..COUNT {
        assert!(seen.contains_key(&index), "no reply to write {index}");
        let data = &seen[&(COUNT + index)];
        // A read may overtake the write to the same block, but must see all or nothing of it.
        assert!(
            data == &vec![pattern(index); LENGTH as usize] || data == &vec![0; LENGTH as usize],
            "read {index} saw a torn block"
        );
        assert_eq!(
            f.disk.contents(index * u64::from(LENGTH), LENGTH as usize),
            vec![pattern(index); LENGTH as usize]
        );
    }
    sender.request(0, CMD_DISC, 0, 0, 0, &[]);
    sender.assert_closed();
}
