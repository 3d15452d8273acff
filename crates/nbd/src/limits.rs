//! Every bound the NBD server enforces, in one place, each with the reason for its value.
//! Relations between them are checked at compile time at the bottom of this file.

/// Largest READ or WRITE payload (and CACHE length) accepted in one request, advertised as the
/// maximum block size. 32 MiB is the size the NBD specification tells clients never to exceed
/// for interoperability, so real clients already split their I/O at or below it; a larger value
/// would only let one request pin more server memory.
pub const REQUEST_PAYLOAD_BYTES_MAX: u32 = 32 * 1024 * 1024;

/// Advertised minimum block size: any byte is addressable because the layer below does its own
/// read-modify-write, so clients never have to.
pub const BLOCK_SIZE_MIN_BYTES: u32 = 1;

/// Advertised preferred block size: the filesystem block size every client stack uses, and the
/// smallest write that does not force a partial-extent read-modify-write below us.
pub const BLOCK_SIZE_PREFERRED_BYTES: u32 = 4096;

/// Requests of one connection being served at once. qemu keeps at most 16 in flight and nbdcopy
/// 64, so 128 never throttles a well-behaved client while bounding the tasks one client can start.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 128;

/// READ and WRITE payload bytes of one connection held in memory at once (write data waiting for
/// the export, read data waiting for the socket). Bounds the memory one client can pin to four
/// maximum-size requests instead of `REQUESTS_IN_FLIGHT_MAX` of them.
pub const PAYLOAD_BYTES_IN_FLIGHT_MAX: usize = 128 * 1024 * 1024;

/// Write payload buffers one connection keeps for reuse, in bytes of capacity: four 1 MiB
/// writes in flight (fio, nbdcopy) reuse theirs; an idle connection holds at most this.
pub const PAYLOAD_BUFFER_BYTES_KEPT: usize = 8 * 1024 * 1024;

/// A WRITE longer than `REQUEST_PAYLOAD_BYTES_MAX` but at most this long has its payload read and
/// thrown away so the client gets EINVAL and can go on. Beyond it the client is not off by a
/// rounding error but broken or hostile, and we hard-disconnect instead of reading gigabytes.
pub const WRITE_DISCARD_BYTES_MAX: u32 = 2 * REQUEST_PAYLOAD_BYTES_MAX;

/// Longest string the protocol allows (export names, queries, error messages).
pub const STRING_BYTES_MAX: usize = 4096;

/// Largest option payload read during the handshake. The biggest legitimate option is a metadata
/// context request naming a maximum-length export and a few maximum-length queries; anything
/// longer is refused with NBD_REP_ERR_TOO_BIG and the connection is closed, so a client cannot
/// make us buffer up to 4 GiB before transmission even starts.
pub const OPTION_DATA_BYTES_MAX: u32 = 64 * 1024;

/// Options one client may send before choosing an export. `nbdinfo --list` sends one INFO per
/// export plus a handful of others; a client still haggling after this many is looping.
pub const OPTIONS_PER_HANDSHAKE_MAX: u32 = 1024;

/// Time a client has from connecting to entering transmission. Without it a client that connects
/// and says nothing holds a task and a socket forever.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 30_000;

/// Descriptors in one BLOCK_STATUS reply. Keeps a reply for a fragmented 4 GiB range to 32 KiB;
/// clients ask again from where a shorter reply stopped, as the specification allows.
pub const BLOCK_STATUS_DESCRIPTORS_MAX: usize = 4096;

/// Read-ahead buffer for request headers, so small requests do not cost a syscall each.
pub const REQUEST_BUFFER_BYTES: usize = 64 * 1024;

/// Write buffer for replies; replies that complete together leave in one syscall.
pub const REPLY_BUFFER_BYTES: usize = 64 * 1024;

/// Pause after a failed accept (typically out of file descriptors) so the listener does not spin
/// on an error that only time can clear.
pub const ACCEPT_RETRY_DELAY_MS: u64 = 100;

const _: () = assert!(BLOCK_SIZE_MIN_BYTES.is_power_of_two() && BLOCK_SIZE_MIN_BYTES <= 65536);
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES.is_power_of_two());
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES >= 512);
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES >= BLOCK_SIZE_MIN_BYTES);
const _: () = assert!(REQUEST_PAYLOAD_BYTES_MAX.is_multiple_of(BLOCK_SIZE_MIN_BYTES));
const _: () = assert!(REQUEST_PAYLOAD_BYTES_MAX >= 1024 * 1024);
const _: () = assert!(REQUEST_PAYLOAD_BYTES_MAX >= BLOCK_SIZE_PREFERRED_BYTES);
// One maximum-size request must always be able to get its payload permits, or it would wait forever.
const _: () = assert!(PAYLOAD_BYTES_IN_FLIGHT_MAX >= REQUEST_PAYLOAD_BYTES_MAX as usize);
const _: () = assert!(WRITE_DISCARD_BYTES_MAX >= REQUEST_PAYLOAD_BYTES_MAX);
// Export name and three queries, each with its 32-bit length, plus the query count.
const _: () = assert!(OPTION_DATA_BYTES_MAX as usize >= 4 * (4 + STRING_BYTES_MAX) + 4);
const _: () = assert!(REQUESTS_IN_FLIGHT_MAX >= 1);
const _: () = assert!(BLOCK_STATUS_DESCRIPTORS_MAX >= 1);
