//! NBD wire constants and the encoding and decoding of fixed-layout messages. Values are those of
//! the NBD protocol document (NetworkBlockDevice/nbd, doc/proto.md); everything is big-endian.
//! Nothing here does I/O, so every parser can be tested (and fuzzed) on byte slices.

use crate::limits::STRING_BYTES_MAX;

// Handshake.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR_BIT | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT | 6;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT | 9;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id we give `base:allocation` in NBD_OPT_SET_META_CONTEXT, our only context.
pub const BASE_ALLOCATION_ID: u32 = 1;

// Transmission.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error values (NBD_E*), numerically the common Linux errno values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;

pub const GREETING_BYTES: usize = 18;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Reserved zeroes after the NBD_OPT_EXPORT_NAME reply unless NO_ZEROES was negotiated.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;

/// The server's first message: magic, option magic and the handshake flags we support.
pub fn encode_greeting() -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// The header of one option sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

impl OptionHeader {
    /// `None` when the magic is wrong, which means the client is not speaking newstyle NBD.
    pub fn decode(bytes: &[u8; OPTION_HEADER_BYTES]) -> Option<OptionHeader> {
        let mut r = Reader::new(bytes);
        if r.u64()? != IHAVEOPT {
            return None;
        }
        Some(OptionHeader {
            option: r.u32()?,
            length: r.u32()?,
        })
    }
}

/// Appends one fixed-newstyle option reply to `out`.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    let length = u32::try_from(data.len()).expect("option replies are built from bounded strings");
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an error option reply carrying a human-readable message.
pub fn encode_option_error(out: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    debug_assert!(reply_type & REP_ERROR_BIT != 0, "not an error reply type");
    encode_option_reply(out, option, reply_type, truncate_str(message).as_bytes());
}

/// The data of an NBD_REP_SERVER reply: name length, name, then the description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let name = truncate_str(name);
    let description = truncate_str(description);
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    data
}

/// The data of NBD_REP_INFO / NBD_INFO_EXPORT, also the body of the NBD_OPT_EXPORT_NAME reply.
pub fn encode_info_export(size_bytes: u64, transmission_flags: u16) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    out[2..10].copy_from_slice(&size_bytes.to_be_bytes());
    out[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// The data of NBD_REP_INFO / NBD_INFO_NAME or NBD_INFO_DESCRIPTION.
pub fn encode_info_string(info_type: u16, text: &str) -> Vec<u8> {
    let text = truncate_str(text);
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info_type.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// The data of NBD_REP_INFO / NBD_INFO_BLOCK_SIZE.
pub fn encode_info_block_size(min_bytes: u32, preferred_bytes: u32, max_bytes: u32) -> [u8; 14] {
    let mut out = [0u8; 14];
    out[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out[2..6].copy_from_slice(&min_bytes.to_be_bytes());
    out[6..10].copy_from_slice(&preferred_bytes.to_be_bytes());
    out[10..14].copy_from_slice(&max_bytes.to_be_bytes());
    out
}

/// The data of an NBD_REP_META_CONTEXT reply.
pub fn encode_meta_context(context_id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&context_id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// Why option data could not be parsed; becomes the message of an NBD_REP_ERR_INVALID reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub info_types: Vec<u16>,
}

impl InfoRequest {
    pub fn decode(data: &[u8]) -> Result<InfoRequest, Malformed> {
        let mut r = Reader::new(data);
        let name = r.string("export name")?;
        let count = r
            .u16()
            .ok_or_else(|| Malformed("missing information request count".into()))?;
        let mut info_types = Vec::with_capacity(usize::from(count).min(r.remaining() / 2));
        for _ in 0..count {
            let info_type = r.u16().ok_or_else(|| {
                Malformed(format!(
                    "{count} information requests announced, fewer sent"
                ))
            })?;
            info_types.push(info_type);
        }
        r.finish()?;
        Ok(InfoRequest { name, info_types })
    }
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    pub fn decode(data: &[u8]) -> Result<MetaContextRequest, Malformed> {
        let mut r = Reader::new(data);
        let export_name = r.string("export name")?;
        let count = r
            .u32()
            .ok_or_else(|| Malformed("missing query count".into()))?;
        // Each query takes at least its 4-byte length, which bounds the allocation by the data.
        let mut queries = Vec::with_capacity((count as usize).min(r.remaining() / 4));
        for _ in 0..count {
            let query = r.string("query")?;
            if !query.contains(':') {
                return Err(Malformed(format!("query {query:?} has no namespace")));
            }
            queries.push(query);
        }
        r.finish()?;
        Ok(MetaContextRequest {
            export_name,
            queries,
        })
    }
}

/// A transmission request header, not yet validated against the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

impl RequestHeader {
    /// `None` when the magic is wrong: the stream is out of sync and cannot be recovered.
    pub fn decode(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Option<RequestHeader> {
        let mut r = Reader::new(bytes);
        if r.u32()? != REQUEST_MAGIC {
            return None;
        }
        Some(RequestHeader {
            flags: r.u16()?,
            command: r.u16()?,
            handle: r.u64()?,
            offset: r.u64()?,
            length: r.u32()?,
        })
    }

    /// Clients encode requests; the server only needs this to test its decoder.
    #[cfg(test)]
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut out = [0u8; REQUEST_HEADER_BYTES];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.command.to_be_bytes());
        out[8..16].copy_from_slice(&self.handle.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.length.to_be_bytes());
        out
    }
}

pub fn encode_simple_reply(handle: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out
}

/// Appends a structured reply chunk header announcing `length` payload bytes.
pub fn encode_structured_header(
    out: &mut Vec<u8>,
    flags: u16,
    reply_type: u16,
    handle: u64,
    length: u32,
) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
}

/// A final NBD_REPLY_TYPE_ERROR chunk.
pub fn encode_structured_error(handle: u64, error: u32, message: &str) -> Vec<u8> {
    debug_assert!(error != 0, "an error chunk must carry a nonzero error");
    let message = truncate_str(message);
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_BYTES + 6 + message.len());
    encode_structured_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        6 + message.len() as u32,
    );
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// A final NBD_REPLY_TYPE_NONE chunk: success without data.
pub fn encode_structured_done(handle: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_BYTES);
    encode_structured_header(&mut out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
    out
}

/// The header of a final NBD_REPLY_TYPE_OFFSET_DATA chunk; `data_length` bytes of data follow.
pub fn encode_offset_data_header(handle: u64, offset: u64, data_length: u32) -> Vec<u8> {
    debug_assert!(
        data_length > 0,
        "an offset-data chunk must describe at least one byte"
    );
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_BYTES + 8);
    encode_structured_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        handle,
        8 + data_length,
    );
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

/// A final NBD_REPLY_TYPE_BLOCK_STATUS chunk of (length, status flags) descriptors.
pub fn encode_block_status(handle: u64, context_id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    debug_assert!(
        !descriptors.is_empty(),
        "a block status chunk needs a descriptor"
    );
    debug_assert!(descriptors.iter().all(|&(length, _)| length > 0));
    let payload = 4 + 8 * descriptors.len();
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_BYTES + payload);
    encode_structured_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        payload as u32,
    );
    out.extend_from_slice(&context_id.to_be_bytes());
    for &(length, flags) in descriptors {
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

/// Cuts `text` to the protocol's string limit on a character boundary.
pub fn truncate_str(text: &str) -> &str {
    if text.len() <= STRING_BYTES_MAX {
        return text;
    }
    let mut end = STRING_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A bounds-checked big-endian cursor over untrusted bytes.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A 32-bit length followed by that many bytes of UTF-8 without NUL, as the protocol's
    /// strings are defined.
    fn string(&mut self, what: &str) -> Result<String, Malformed> {
        let length =
            self.u32()
                .ok_or_else(|| Malformed(format!("missing {what} length")))? as usize;
        if length > STRING_BYTES_MAX {
            return Err(Malformed(format!(
                "{what} is {length} bytes, the limit is {STRING_BYTES_MAX}"
            )));
        }
        let bytes = self.take(length).ok_or_else(|| {
            Malformed(format!(
                "{what} length {length} runs past the end of the option"
            ))
        })?;
        let text =
            std::str::from_utf8(bytes).map_err(|_| Malformed(format!("{what} is not UTF-8")))?;
        if text.contains('\0') {
            return Err(Malformed(format!("{what} contains NUL")));
        }
        Ok(text.to_owned())
    }

    fn finish(&self) -> Result<(), Malformed> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(Malformed(format!(
                "{} unexpected trailing bytes",
                self.bytes.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string_field(text: &[u8]) -> Vec<u8> {
        let mut out = (text.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(text);
        out
    }

    #[test]
    fn greeting_is_magic_then_flags() {
        let greeting = encode_greeting();
        assert_eq!(&greeting[0..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(&greeting[16..18], &[0, 3]);
    }

    #[test]
    fn option_header_round_trip_and_bad_magic() {
        let mut bytes = [0u8; OPTION_HEADER_BYTES];
        bytes[0..8].copy_from_slice(b"IHAVEOPT");
        bytes[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        bytes[12..16].copy_from_slice(&77u32.to_be_bytes());
        assert_eq!(
            OptionHeader::decode(&bytes),
            Some(OptionHeader {
                option: OPT_GO,
                length: 77
            })
        );
        bytes[0] = b'X';
        assert_eq!(OptionHeader::decode(&bytes), None);
    }

    #[test]
    fn option_reply_layout() {
        let mut out = Vec::new();
        encode_option_reply(&mut out, OPT_LIST, REP_SERVER, &[9, 8]);
        assert_eq!(out.len(), 20 + 2);
        assert_eq!(&out[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[8..12], &OPT_LIST.to_be_bytes());
        assert_eq!(&out[12..16], &REP_SERVER.to_be_bytes());
        assert_eq!(&out[16..20], &2u32.to_be_bytes());
        assert_eq!(&out[20..], &[9, 8]);
    }

    #[test]
    fn info_request_parses_name_and_types() {
        let mut data = string_field(b"disk0");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let request = InfoRequest::decode(&data).expect("well-formed");
        assert_eq!(request.name, "disk0");
        assert_eq!(request.info_types, vec![INFO_NAME, INFO_BLOCK_SIZE]);
    }

    #[test]
    fn info_request_rejects_malformed_data() {
        // Too short for even the name length.
        assert!(InfoRequest::decode(&[0, 0]).is_err());
        // Name length beyond the data.
        let mut data = 100u32.to_be_bytes().to_vec();
        data.extend_from_slice(&[0; 4]);
        assert!(InfoRequest::decode(&data).is_err());
        // Missing count.
        assert!(InfoRequest::decode(&string_field(b"a")).is_err());
        // Count larger than the list sent.
        let mut data = string_field(b"");
        data.extend_from_slice(&3u16.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert!(InfoRequest::decode(&data).is_err());
        // Trailing garbage.
        let mut data = string_field(b"");
        data.extend_from_slice(&0u16.to_be_bytes());
        data.push(1);
        assert!(InfoRequest::decode(&data).is_err());
        // Not UTF-8, and NUL inside.
        let mut data = string_field(&[0xff, 0xfe]);
        data.extend_from_slice(&0u16.to_be_bytes());
        assert!(InfoRequest::decode(&data).is_err());
        let mut data = string_field(b"a\0b");
        data.extend_from_slice(&0u16.to_be_bytes());
        assert!(InfoRequest::decode(&data).is_err());
        // Over the string limit.
        let mut data = string_field(&vec![b'a'; STRING_BYTES_MAX + 1]);
        data.extend_from_slice(&0u16.to_be_bytes());
        assert!(InfoRequest::decode(&data).is_err());
    }

    #[test]
    fn meta_context_request_parses_queries() {
        let mut data = string_field(b"disk0");
        data.extend_from_slice(&2u32.to_be_bytes());
        data.extend_from_slice(&string_field(b"base:allocation"));
        data.extend_from_slice(&string_field(b"qemu:dirty-bitmap:x"));
        let request = MetaContextRequest::decode(&data).expect("well-formed");
        assert_eq!(request.export_name, "disk0");
        assert_eq!(
            request.queries,
            vec!["base:allocation", "qemu:dirty-bitmap:x"]
        );
    }

    #[test]
    fn meta_context_request_rejects_malformed_data() {
        // A huge query count with no queries must fail without allocating for it.
        let mut data = string_field(b"");
        data.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(MetaContextRequest::decode(&data).is_err());
        // A query without a namespace.
        let mut data = string_field(b"");
        data.extend_from_slice(&1u32.to_be_bytes());
        data.extend_from_slice(&string_field(b"allocation"));
        assert!(MetaContextRequest::decode(&data).is_err());
        // Query length past the end.
        let mut data = string_field(b"");
        data.extend_from_slice(&1u32.to_be_bytes());
        data.extend_from_slice(&50u32.to_be_bytes());
        data.extend_from_slice(b"base:");
        assert!(MetaContextRequest::decode(&data).is_err());
    }

    #[test]
    fn request_header_round_trip_and_bad_magic() {
        let header = RequestHeader {
            flags: CMD_FLAG_FUA,
            command: CMD_WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let mut bytes = header.encode();
        assert_eq!(RequestHeader::decode(&bytes), Some(header));
        bytes[3] ^= 1;
        assert_eq!(RequestHeader::decode(&bytes), None);
    }

    #[test]
    fn simple_reply_layout() {
        let reply = encode_simple_reply(42, EINVAL);
        assert_eq!(&reply[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&reply[4..8], &22u32.to_be_bytes());
        assert_eq!(&reply[8..16], &42u64.to_be_bytes());
    }

    #[test]
    fn structured_error_layout() {
        let chunk = encode_structured_error(7, EIO, "boom");
        assert_eq!(&chunk[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&chunk[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&chunk[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&chunk[8..16], &7u64.to_be_bytes());
        assert_eq!(&chunk[16..20], &10u32.to_be_bytes());
        assert_eq!(&chunk[20..24], &EIO.to_be_bytes());
        assert_eq!(&chunk[24..26], &4u16.to_be_bytes());
        assert_eq!(&chunk[26..], b"boom");
    }

    #[test]
    fn structured_error_message_is_bounded() {
        let long = "é".repeat(STRING_BYTES_MAX);
        let chunk = encode_structured_error(1, EIO, &long);
        let message_length = u16::from_be_bytes([chunk[24], chunk[25]]) as usize;
        assert!(message_length <= STRING_BYTES_MAX);
        assert_eq!(chunk.len(), STRUCTURED_HEADER_BYTES + 6 + message_length);
        assert!(std::str::from_utf8(&chunk[26..]).is_ok());
    }

    #[test]
    fn offset_data_and_block_status_layout() {
        let header = encode_offset_data_header(3, 512, 100);
        assert_eq!(header.len(), STRUCTURED_HEADER_BYTES + 8);
        assert_eq!(&header[16..20], &108u32.to_be_bytes());
        assert_eq!(&header[20..28], &512u64.to_be_bytes());

        let chunk = encode_block_status(
            3,
            BASE_ALLOCATION_ID,
            &[(4096, STATE_HOLE | STATE_ZERO), (512, 0)],
        );
        assert_eq!(&chunk[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
        assert_eq!(&chunk[16..20], &20u32.to_be_bytes());
        assert_eq!(&chunk[20..24], &BASE_ALLOCATION_ID.to_be_bytes());
        assert_eq!(&chunk[24..28], &4096u32.to_be_bytes());
        assert_eq!(&chunk[28..32], &3u32.to_be_bytes());
        assert_eq!(&chunk[32..36], &512u32.to_be_bytes());
        assert_eq!(&chunk[36..40], &0u32.to_be_bytes());
    }

    #[test]
    fn info_replies_layout() {
        let export = encode_info_export(1 << 30, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH);
        assert_eq!(&export[0..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(&export[2..10], &(1u64 << 30).to_be_bytes());
        assert_eq!(&export[10..12], &5u16.to_be_bytes());
        let sizes = encode_info_block_size(1, 4096, 1 << 25);
        assert_eq!(&sizes[0..2], &INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(&sizes[10..14], &(1u32 << 25).to_be_bytes());
        let server = encode_rep_server("disk0", "a disk");
        assert_eq!(&server[0..4], &5u32.to_be_bytes());
        assert_eq!(&server[4..], b"disk0a disk");
    }
}
