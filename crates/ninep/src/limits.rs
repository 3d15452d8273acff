//! Every bound the 9P server enforces, with the reason for its value.

/// The largest message (msize) the server accepts and offers. Linux's v9fs asks for 512 KiB by
/// default on TCP and at most what the transport allows; 1 MiB + a header leaves room for a
/// 1 MiB read or write per request, which is what bulk copies reach, while bounding what one
/// request can make the server hold.
pub const MSIZE_MAX: u32 = 1024 * 1024 + 4096;

/// The smallest msize that still carries a useful request: a walk of one maximum-length name.
pub const MSIZE_MIN: u32 = 4096;

/// Longest name in a request (NAME_MAX of Linux and of the filesystem core).
pub const NAME_BYTES_MAX: usize = 255;

/// Names in one walk: Plan 9's MAXWELEM; v9fs never sends more.
pub const WALK_NAMES_MAX: usize = 16;

/// Requests of one connection being served at once: v9fs keeps far fewer in flight per mount
/// (one per waiting syscall), so this only bounds the tasks and memory a hostile client can
/// claim: at most this many msize buffers.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Connections served on threads of their own at once (`Server::serve_tcp`). A mount or a
/// client program holds one; past this many (a client opening connections without end), a
/// connection is served on the shared runtime instead, as tasks cost less than threads.
pub const CONNECTION_THREADS_MAX: usize = 256;

/// A Twrite with more data than this, and every Tread, runs on the shared runtime, not on its
/// connection's thread: such bulk work would make the thread slow to read the next request.
pub const SMALL_WRITE_BYTES_MAX: usize = 64 * 1024;

/// Fids one connection may hold. A fid costs a few dozen bytes; a client that never clunks
/// (a leak, or an attack) gets EMFILE-like errors instead of growing the server without bound.
pub const FIDS_PER_CONNECTION_MAX: usize = 1 << 20;

/// Directory entries asked of the filesystem per readdir page; a 64 KiB reply holds about
/// 2,000 short names.
pub const READDIR_ENTRIES_PER_PAGE: usize = 512;

const _: () = assert!(MSIZE_MIN as usize > 2 * (NAME_BYTES_MAX + 32));
const _: () = assert!(MSIZE_MAX >= MSIZE_MIN);
