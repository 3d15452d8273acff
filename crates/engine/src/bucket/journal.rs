//! The write-ahead journal of a local-directory bucket (docs/0002-local-journal.md).
//!
//! A small object is durable once its record is in this preallocated file: one direct,
//! synchronous write into blocks that already exist, which changes no file-system metadata and
//! so costs a device write and cache flush, not a file-system journal commit. Writing the object
//! as a file of its own (create, write, fsync, link, fsync the directory: two journal commits)
//! then happens in the background; once that file is durable the record is released and its
//! header zeroed. An object deleted while
//! it is only in the journal never becomes a file: its record is released the same way, or,
//! for garbage (`DeleteMode::Garbage`), forgotten, and zeroed later with other forgotten
//! records by a few long writes that are not synced.
//!
//! Records are appended in a ring. Each starts on a block boundary with a header:
//!
//! ```text
//! magic "BFSJRN01" (8) | record number u64 | data length u32 | key length u16 | 0u16 |
//! CRC-32C of everything in the record but this field, as u64 (8) | key | data | zero padding
//! ```
//!
//! A valid record whose header was not zeroed holds an object that may not exist as a file yet
//! (or garbage forgotten just before a crash, which may come back); opening the journal
//! returns those records, in order, so the caller can write their files.

use crc_fast::CrcAlgorithm;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Size of the journal file; when the ring is full, objects are written as files directly.
/// Objects stay in it until they are `JOURNAL_STORE_AFTER_S` old or it is seven eighths full
/// (`JOURNAL_STORE_ABOVE_BYTES`, local.rs), so it must hold an fsync-heavy load's objects for
/// that long (a 64 MiB ring did not); their bytes are held in memory meanwhile, so this also
/// bounds that memory. Measurements: docs/benchmarks/2026-11-26-0002-journal-rules-measured.md.
pub const JOURNAL_BYTES: u64 = 256 * 1024 * 1024;
/// Objects up to this size go through the journal; larger ones gain nothing from it (they are
/// not on the critical path of an fsync) and would crowd it.
pub const JOURNAL_OBJECT_BYTES_MAX: usize = 1024 * 1024;
/// Records start on this boundary (direct I/O alignment).
const BLOCK_BYTES: usize = 4096;
const HEADER_BYTES: usize = 32;
const MAGIC: &[u8; 8] = b"BFSJRN01";
/// Keys are bucket object names: short.
const KEY_BYTES_MAX: usize = 1024;
const RECORD_BYTES_MAX: usize =
    (HEADER_BYTES + KEY_BYTES_MAX + JOURNAL_OBJECT_BYTES_MAX).next_multiple_of(BLOCK_BYTES);
/// Forgotten records are zeroed by direct writes of at most this many bytes (a run of
/// adjacent records is one write, split at this size).
const ERASE_WRITE_BYTES_MAX: usize = 1024 * 1024;
/// Records zeroed by one run of `erase_forgotten` before their space is freed: bounds how much
/// space one slow run holds back.
const ERASE_RUN_RECORDS_MAX: usize = 1024;
/// Record buffers kept for reuse: one per append in flight (UPLOADS_IN_FLIGHT_MAX) and a few.
const SPARE_BUFFERS_MAX: usize = 8;
const _: () = assert!(JOURNAL_BYTES.is_multiple_of(BLOCK_BYTES as u64));
const _: () = assert!(JOURNAL_BYTES >= 8 * RECORD_BYTES_MAX as u64);

/// An object recovered from the journal.
pub struct Record {
    pub key: String,
    pub data: Vec<u8>,
}

/// A record in the ring, until `release`.
#[derive(Debug)]
pub struct Ticket {
    record: u64,
}

impl Ticket {
    /// Records are numbered in the order they are appended.
    pub fn number(&self) -> u64 {
        self.record
    }
}

#[derive(Debug)]
struct Slot {
    record: u64,
    start: u64,
    len: u64,
    state: SlotState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Live,
    /// Its object is garbage: the record is to be zeroed by `erase_forgotten`.
    Forgotten,
    /// Free once every earlier slot is.
    Released,
}

/// Positions are logical (ever growing); the file offset is the position modulo JOURNAL_BYTES.
#[derive(Debug, Default)]
struct Ring {
    head: u64,
    next_record: u64,
    live: VecDeque<Slot>,
}

impl Ring {
    fn tail(&self) -> u64 {
        self.live.front().map_or(self.head, |s| s.start)
    }

    /// Where the live record `record` is in `live` (ordered by record number).
    fn slot(&self, record: u64) -> usize {
        self.live
            .binary_search_by_key(&record, |s| s.record)
            .expect("a ticket names a live record")
    }
}

#[derive(Debug)]
pub struct Journal {
    file: File,
    /// The ring's size: JOURNAL_BYTES, or less for tests (`open_sized`).
    bytes: u64,
    /// Direct I/O handles; `None` where the file system cannot do direct I/O (tmpfs), and then
    /// nothing is journaled.
    direct: Option<DirectFiles>,
    ring: Mutex<Ring>,
    syncs: Mutex<Syncs>,
    synced: Condvar,
    /// Record buffers of RECORD_BYTES_MAX, reused: a fresh one per append was a page fault
    /// (and the kernel zeroing a huge page) every few appends on the fsync path (perf).
    spare_buffers: Mutex<Vec<Vec<u8>>>,
    /// Writes the zeros of `release` and `erase_forgotten`, many at once.
    eraser: Eraser,
}

#[derive(Debug)]
struct DirectFiles {
    /// Direct and synchronous: a record write that returns is durable.
    append: File,
    /// Direct, not synchronous: headers are zeroed a batch at a time, then `sync`ed. Direct so
    /// that no page-cache copy of a block can ever be written back over a newer record.
    clear: File,
}

fn crc(record: &[u8]) -> u64 {
    let mut digest = crc_fast::Digest::new(CrcAlgorithm::Crc32Iscsi);
    digest.update(&record[..24]);
    digest.update(&record[HEADER_BYTES..]);
    digest.finalize()
}

/// A zeroed buffer of at least `len` bytes whose start is block-aligned, as direct I/O needs.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + BLOCK_BYTES];
    let skew = block_skew(&buf);
    (buf, skew)
}

/// Where the first block-aligned byte of `buf` is (it must have a block to spare).
fn block_skew(buf: &[u8]) -> usize {
    let skew = buf.as_ptr().align_offset(BLOCK_BYTES);
    assert!(skew < BLOCK_BYTES, "a byte pointer can always be aligned");
    skew
}

impl Journal {
    /// Opens the journal at `path`, creating it (fully written with zeros, so that later
    /// writes allocate nothing) if it is missing or has the wrong size. Returns the records
    /// still in it, oldest first; the caller writes their objects, then calls `reset`.
    pub fn open(path: &Path) -> std::io::Result<(Journal, Vec<Record>)> {
        Self::open_sized(path, JOURNAL_BYTES)
    }

    /// `open` with a ring of `bytes` (a multiple of the block size, at least 8 records of the
    /// largest size): tests that create many journals keep them small.
    pub fn open_sized(path: &Path, bytes: u64) -> std::io::Result<(Journal, Vec<Record>)> {
        assert!(
            bytes.is_multiple_of(BLOCK_BYTES as u64) && bytes >= 8 * RECORD_BYTES_MAX as u64,
            "a journal of {bytes} bytes"
        );
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        let file = options.open(path)?;
        let len = file.metadata()?.len();
        // Whatever its size: a journal written with another JOURNAL_BYTES (an older version)
        // still holds acknowledged objects.
        let mut image = vec![0u8; len as usize];
        file.read_exact_at(&mut image, 0)?;
        let records = scan(&image);
        drop(image);
        let journal = Journal {
            file,
            bytes,
            direct: open_direct(path)?,
            ring: Mutex::default(),
            syncs: Mutex::default(),
            synced: Condvar::new(),
            spare_buffers: Mutex::default(),
            eraser: Eraser::new(),
        };
        // A journal of the right size without records needs nothing: every block was written
        // when it was created, and nothing in it is valid.
        if records.is_empty() && len != bytes {
            journal.reset()?;
        }
        Ok((journal, records))
    }

    /// Empties the journal: every record in it must be stored as a file (durably) by now.
    pub fn reset(&self) -> std::io::Result<()> {
        let zeros = vec![0u8; 1024 * 1024];
        let mut at = 0;
        while at < self.bytes {
            self.file.write_all_at(&zeros, at)?;
            at += zeros.len() as u64;
        }
        self.file.set_len(self.bytes)?;
        self.file.sync_all()?;
        *self.ring.lock() = Ring::default();
        Ok(())
    }

    /// Writes a record of `key` and `data` durably. `None` when the ring has no room, the
    /// object is too large or the file system cannot do direct I/O: the caller stores it
    /// another way.
    pub fn append(&self, key: &str, data: &[u8]) -> std::io::Result<Option<Ticket>> {
        let Some(direct) = &self.direct else {
            return Ok(None);
        };
        if data.len() > JOURNAL_OBJECT_BYTES_MAX || key.len() > KEY_BYTES_MAX {
            return Ok(None);
        }
        let len = (HEADER_BYTES + key.len() + data.len()).next_multiple_of(BLOCK_BYTES);
        let (record, start) = {
            let mut ring = self.ring.lock();
            let mut start = ring.head;
            // A record never wraps around the end of the file.
            if start % self.bytes + len as u64 > self.bytes {
                start = start.next_multiple_of(self.bytes);
            }
            if start + len as u64 - ring.tail() > self.bytes {
                return Ok(None);
            }
            let record = ring.next_record;
            ring.next_record += 1;
            ring.head = start + len as u64;
            ring.live.push_back(Slot {
                record,
                start,
                len: len as u64,
                state: SlotState::Live,
            });
            (record, start)
        };
        let mut buf = self
            .spare_buffers
            .lock()
            .pop()
            .unwrap_or_else(|| vec![0u8; RECORD_BYTES_MAX + BLOCK_BYTES]);
        let skew = block_skew(&buf);
        let out = &mut buf[skew..skew + len];
        let data_end = HEADER_BYTES + key.len() + data.len();
        out[..8].copy_from_slice(MAGIC);
        out[8..16].copy_from_slice(&record.to_le_bytes());
        out[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        out[20..22].copy_from_slice(&(key.len() as u16).to_le_bytes());
        out[22..24].fill(0);
        out[HEADER_BYTES..HEADER_BYTES + key.len()].copy_from_slice(key.as_bytes());
        out[HEADER_BYTES + key.len()..data_end].copy_from_slice(data);
        // A reused buffer holds an earlier record's bytes here.
        out[data_end..].fill(0);
        let sum = crc(out);
        out[24..32].copy_from_slice(&sum.to_le_bytes());
        let written = direct.append.write_all_at(out, start % self.bytes);
        {
            let mut spare = self.spare_buffers.lock();
            if spare.len() < SPARE_BUFFERS_MAX {
                spare.push(buf);
            }
        }
        if let Err(e) = written {
            // Never acknowledged: give the space back as if the object had been stored.
            self.release(vec![Ticket { record }])?;
            return Err(e);
        }
        Ok(Some(Ticket { record }))
    }

    /// The records' objects are durable as files, or deleted: zero their headers (so they are
    /// never replayed; durable after the next `sync`) and free their space once every earlier
    /// record is free too. The space is freed even if a zeroing write fails (a record may then
    /// come back at the next start, which stores its object again), but not if waiting for
    /// the writes failed: they may still be in flight, and the space stays in use until a
    /// restart.
    pub fn release(&self, tickets: Vec<Ticket>) -> std::io::Result<()> {
        let records: Vec<u64> = tickets.into_iter().map(|t| t.record).collect();
        let headers: Vec<(u64, usize)> = {
            let ring = self.ring.lock();
            records
                .iter()
                .map(|&r| (ring.live[ring.slot(r)].start % self.bytes, BLOCK_BYTES))
                .collect()
        };
        let direct = self
            .direct
            .as_ref()
            .expect("tickets are only issued with direct I/O");
        // Only after these writes have returned may the space be given to a new record: a
        // zeroing write still in flight would otherwise land on it. Abandoned writes may be,
        // so then the records keep their space until a restart.
        let zeroed = self.eraser.write_zeros(&direct.clear, &headers)?;
        self.set_state(&records, SlotState::Released);
        zeroed.into_iter().collect()
    }

    /// The record's object is garbage (deleted with `DeleteMode::Garbage`): the record is
    /// zeroed later, with other forgotten records, by `erase_forgotten`, and only then is its
    /// space freed. Until then a crash brings the object back, which such a deletion
    /// allows. Nothing is written or synced here.
    pub fn forget(&self, ticket: Ticket) {
        self.set_state(&[ticket.record], SlotState::Forgotten);
    }

    /// Zeroes the forgotten records and frees their space. Adjacent ones (most of them: the
    /// collector deletes a checkpoint's dead objects at once, and they were appended one after
    /// another) are zeroed whole, by one direct write per run of up to `ERASE_WRITE_BYTES_MAX`,
    /// instead of a write per record, and the writes are submitted together (`Eraser`). Not
    /// synced: the zeros become durable with the next
    /// record's synchronous write, and a forgotten record that a crash keeps is garbage anyway.
    /// The storer thread calls this; it is the only caller, so no run is zeroed twice.
    pub fn erase_forgotten(&self) -> std::io::Result<()> {
        let runs: Vec<(u64, u64, Vec<u64>)> = {
            let ring = self.ring.lock();
            let mut runs: Vec<(u64, u64, Vec<u64>)> = Vec::new();
            for slot in ring.live.iter().filter(|s| s.state == SlotState::Forgotten) {
                match runs.last_mut() {
                    Some((_, end, records))
                        if *end == slot.start
                            && slot.start % self.bytes != 0
                            && records.len() < ERASE_RUN_RECORDS_MAX =>
                    {
                        *end += slot.len;
                        records.push(slot.record);
                    }
                    _ => runs.push((slot.start, slot.start + slot.len, vec![slot.record])),
                }
            }
            runs
        };
        let Some(direct) = &self.direct else {
            return Ok(());
        };
        // Each write: its file offset, its length, and the run it belongs to.
        let mut writes: Vec<(u64, usize, usize)> = Vec::new();
        for (run, (start, end, _)) in runs.iter().enumerate() {
            let mut at = *start;
            while at < *end {
                let n = (end - at).min(ERASE_WRITE_BYTES_MAX as u64) as usize;
                writes.push((at % self.bytes, n, run));
                at += n as u64;
            }
        }
        let offsets: Vec<(u64, usize)> = writes.iter().map(|&(at, n, _)| (at, n)).collect();
        let mut erased = vec![true; runs.len()];
        let mut result = Ok(());
        // Abandoned writes may still be in flight: their records keep their space.
        let written = self.eraser.write_zeros(&direct.clear, &offsets)?;
        for ((_, _, run), written) in writes.iter().zip(written) {
            if let Err(e) = written {
                // Left forgotten: tried again next time.
                erased[*run] = false;
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        let released: Vec<u64> = runs
            .into_iter()
            .zip(erased)
            .filter(|(_, erased)| *erased)
            .flat_map(|((_, _, records), _)| records)
            .collect();
        self.set_state(&released, SlotState::Released);
        result
    }

    /// Sets the state of live records, then frees the released ones at the front.
    fn set_state(&self, records: &[u64], state: SlotState) {
        let mut ring = self.ring.lock();
        for &record in records {
            let at = ring.slot(record);
            ring.live[at].state = state;
        }
        while ring
            .live
            .front()
            .is_some_and(|s| s.state == SlotState::Released)
        {
            ring.live.pop_front();
        }
    }

    /// Bytes of the ring between its oldest unreleased record and its head: when this nears
    /// `JOURNAL_BYTES`, appends find no room.
    pub fn used_bytes(&self) -> u64 {
        let ring = self.ring.lock();
        ring.head - ring.tail()
    }

    /// Makes the zeroed headers durable (see `release`), after a batch of them. Concurrent
    /// callers share syncs (group commit): a caller waits for the next sync to start and end,
    /// and runs it itself only if none is running. The collector deletes a checkpoint's dead
    /// log objects 16 at a time, each clearing a record; one sync each doubled the device
    /// cache flushes that the records' own synchronous writes already cost.
    pub fn sync(&self) -> std::io::Result<()> {
        let mut syncs = self.syncs.lock();
        // Only a sync that starts after this call covers the writes made before it.
        let needed = syncs.started + 1;
        loop {
            if syncs.finished >= needed {
                return match &syncs.latest_error {
                    None => Ok(()),
                    Some(e) => Err(std::io::Error::other(e.clone())),
                };
            }
            if syncs.running {
                self.synced.wait(&mut syncs);
                continue;
            }
            syncs.started += 1;
            syncs.running = true;
            let number = syncs.started;
            let result = parking_lot::MutexGuard::unlocked(&mut syncs, || self.file.sync_data());
            syncs.running = false;
            syncs.finished = number;
            syncs.latest_error = result.err().map(|e| e.to_string());
            self.synced.notify_all();
        }
    }
}

/// Writes zeros over many ranges of the journal: the headers that `release` clears (a batch
/// of stored files at a time) and `erase_forgotten`'s writes, one per run of forgotten
/// records, hundreds after each checkpoint's collection. They are submitted together through
/// io_uring, so the block layer hands a batch to the device with one notification instead of
/// one notification and one sleep per write (docs/0002, "How zeros are written"). Where
/// io_uring is not available (a kernel without it, a sandbox that forbids it), the writes are
/// made one at a time.
struct Eraser {
    /// `None` without io_uring; dropped for good if waiting for a batch ever fails.
    ring: Mutex<Option<io_uring::IoUring>>,
}

impl std::fmt::Debug for Eraser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eraser")
            .field("io_uring", &self.ring.lock().is_some())
            .finish()
    }
}

/// Writes submitted to io_uring at once (its submission queue's size). Small, because a
/// record written meanwhile may wait on the device behind every zeroing write queued before it;
/// 128 saved the CPU but not the time (docs/benchmarks/2026-11-24-journal-storer-and-eraser.md).
const ERASE_BATCH_WRITES: usize = 16;

/// ERASE_WRITE_BYTES_MAX zeroed bytes, block-aligned, for as long as the process lives: a write
/// submitted to io_uring reads them until it completes.
fn erase_zeros() -> &'static [u8] {
    static ZEROS: std::sync::LazyLock<Vec<u8>> =
        std::sync::LazyLock::new(|| vec![0u8; ERASE_WRITE_BYTES_MAX + BLOCK_BYTES]);
    let skew = block_skew(&ZEROS);
    &ZEROS[skew..skew + ERASE_WRITE_BYTES_MAX]
}

impl Eraser {
    fn new() -> Eraser {
        let ring = match io_uring::IoUring::new(ERASE_BATCH_WRITES as u32) {
            Ok(ring) => Some(ring),
            Err(error) => {
                tracing::info!(%error, "io_uring is not available; the journal writes its zeros one write at a time");
                None
            }
        };
        Eraser {
            ring: Mutex::new(ring),
        }
    }

    /// Writes zeros at each (file offset, length), lengths at most ERASE_WRITE_BYTES_MAX and
    /// blocks. Returns when every write has completed, with each one's outcome; `Err` if
    /// waiting for them failed: some may then still be in flight, and none of these ranges
    /// may ever be given to a new record (a late zero would destroy it).
    fn write_zeros(
        &self,
        file: &File,
        writes: &[(u64, usize)],
    ) -> std::io::Result<Vec<std::io::Result<()>>> {
        let zeros = erase_zeros();
        let mut ring = self.ring.lock();
        let mut results = Vec::with_capacity(writes.len());
        for batch in writes.chunks(ERASE_BATCH_WRITES) {
            match ring.as_mut() {
                Some(uring) => match submit_zero_writes(uring, file, zeros, batch) {
                    Ok(outcomes) => results.extend(outcomes),
                    Err(error) => {
                        // The callers keep these records' space unused for as long as this
                        // process runs; the ring may then fill, and objects become files.
                        tracing::error!(%error, "waiting for the journal's zeroing writes failed; their records' space is not used again until a restart, and later zeros are written one at a time");
                        *ring = None;
                        return Err(std::io::Error::other(format!(
                            "zeroing writes abandoned: {error}"
                        )));
                    }
                },
                None => results.extend(
                    batch
                        .iter()
                        .map(|&(at, n)| file.write_all_at(&zeros[..n], at)),
                ),
            }
        }
        Ok(results)
    }
}

/// Submits `writes` of zeros to `ring` together and waits for all of them: `Err` only if
/// waiting failed, when some may still be in flight.
fn submit_zero_writes(
    ring: &mut io_uring::IoUring,
    file: &File,
    zeros: &'static [u8],
    writes: &[(u64, usize)],
) -> std::io::Result<Vec<std::io::Result<()>>> {
    use std::os::fd::AsRawFd;
    let fd = io_uring::types::Fd(file.as_raw_fd());
    {
        let mut queue = ring.submission();
        for (i, &(at, n)) in writes.iter().enumerate() {
            let write = io_uring::opcode::Write::new(fd, zeros.as_ptr(), n as u32)
                .offset(at)
                .build()
                .user_data(i as u64);
            // SAFETY: the bytes are static, and the file outlives the write: it is the
            // journal's, and this returns only once every write has completed (or never
            // again uses the ring, whose writes then only ever land on space left unused).
            unsafe { queue.push(&write) }.expect("a batch fits the submission queue");
        }
    }
    let mut outcomes: Vec<Option<std::io::Result<()>>> = writes.iter().map(|_| None).collect();
    let mut done = 0;
    while done < writes.len() {
        match ring.submit_and_wait(writes.len() - done) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for completion in ring.completion() {
            let i = completion.user_data() as usize;
            let result = completion.result();
            outcomes[i] = Some(match result {
                n if n < 0 => Err(std::io::Error::from_raw_os_error(-n)),
                n if n as usize == writes[i].1 => Ok(()),
                n => Err(std::io::Error::other(format!(
                    "short write: {n} of {} zero bytes",
                    writes[i].1
                ))),
            });
            done += 1;
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.expect("every write completed"))
        .collect())
}

/// Syncs of the journal, shared by concurrent callers (`Journal::sync`).
#[derive(Debug, Default)]
struct Syncs {
    started: u64,
    finished: u64,
    running: bool,
    /// The outcome of the latest finished sync.
    latest_error: Option<String>,
}

/// Opens the journal for direct writes. `None` when the file system cannot do direct I/O.
fn open_direct(path: &Path) -> std::io::Result<Option<DirectFiles>> {
    let open = |flags| {
        OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_DIRECT | libc::O_DSYNC) {
        Ok(append) => Ok(Some(DirectFiles {
            append,
            clear: open(libc::O_DIRECT)?,
        })),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The records in the journal at `path`, oldest first, read without changing anything: for
/// a reader beside a running writer (which appends and clears records meanwhile; a record
/// caught half written fails its checksum and is left out). Empty if there is no journal.
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    // Direct reads, so that no stale page-cache copy hides the writer's direct writes.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => File::open(path),
        opened => opened,
    };
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    // Direct reads need whole blocks; the writer keeps the file a multiple of them.
    let len = file.metadata()?.len() as usize / BLOCK_BYTES * BLOCK_BYTES;
    let (mut buf, skew) = aligned(len);
    let image = &mut buf[skew..skew + len];
    file.read_exact_at(image, 0)?;
    Ok(scan(image))
}

fn scan(image: &[u8]) -> Vec<Record> {
    let mut found: Vec<(u64, Record)> = Vec::new();
    let mut at = 0;
    while at + HEADER_BYTES <= image.len() {
        let h = &image[at..];
        if &h[..8] != MAGIC {
            at += BLOCK_BYTES;
            continue;
        }
        let record = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let data_len = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes")) as usize;
        let key_len = u16::from_le_bytes(h[20..22].try_into().expect("2 bytes")) as usize;
        let sum = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
        let len = (HEADER_BYTES + key_len + data_len).next_multiple_of(BLOCK_BYTES);
        let fits = data_len <= JOURNAL_OBJECT_BYTES_MAX
            && key_len <= KEY_BYTES_MAX
            && at + len <= image.len();
        // A torn or stale record fails its checksum: it was never acknowledged.
        if !fits || crc(&h[..len]) != sum {
            at += BLOCK_BYTES;
            continue;
        }
        let key = String::from_utf8_lossy(&h[HEADER_BYTES..HEADER_BYTES + key_len]).to_string();
        let data = h[HEADER_BYTES + key_len..HEADER_BYTES + key_len + data_len].to_vec();
        found.push((record, Record { key, data }));
        at += len;
    }
    found.sort_by_key(|(record, _)| *record);
    found.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(path: &Path) -> Vec<String> {
        read_records(path)
            .unwrap()
            .into_iter()
            .map(|r| r.key)
            .collect()
    }

    #[test]
    fn zeros_land_where_asked_with_io_uring_or_without_and_failures_are_reported() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-eraser-").unwrap();
        let path = scratch.path().join("journal");
        let blocks = 64;
        // More writes than one batch, at scattered offsets.
        let writes: Vec<(u64, usize)> = (0..40u64)
            .map(|i| (i * 5 % blocks * BLOCK_BYTES as u64, BLOCK_BYTES))
            .collect();
        let without = Eraser {
            ring: Mutex::new(None),
        };
        for eraser in [Eraser::new(), without] {
            std::fs::write(&path, vec![0xffu8; blocks as usize * BLOCK_BYTES]).unwrap();
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            let results = eraser.write_zeros(&file, &writes).unwrap();
            assert_eq!(results.len(), writes.len());
            assert!(results.iter().all(|r| r.is_ok()), "{eraser:?}: {results:?}");
            let image = std::fs::read(&path).unwrap();
            for (block, bytes) in image.chunks(BLOCK_BYTES).enumerate() {
                let zeroed = writes
                    .iter()
                    .any(|&(at, _)| at == (block * BLOCK_BYTES) as u64);
                let expected = if zeroed { 0 } else { 0xff };
                assert!(
                    bytes.iter().all(|&b| b == expected),
                    "{eraser:?}: block {block}"
                );
            }
            // A file not open for writing: every write fails, and says so.
            let read_only = File::open(&path).unwrap();
            let results = eraser.write_zeros(&read_only, &writes).unwrap();
            assert_eq!(results.len(), writes.len());
            assert!(
                results.iter().all(|r| r.is_err()),
                "{eraser:?}: {results:?}"
            );
        }
    }

    #[test]
    fn forgotten_records_stay_valid_until_erased_in_runs_then_their_space_is_free() {
        let scratch = tempfile::TempDir::with_prefix("bucketfs-forget-").unwrap();
        let path = scratch.path().join("journal");
        let (journal, _) = Journal::open(&path).unwrap();
        let mut tickets: Vec<Ticket> = ["log/1", "log/2", "log/3", "log/4"]
            .iter()
            .map(|k| {
                journal
                    .append(k, k.as_bytes())
                    .unwrap()
                    .expect("direct I/O")
            })
            .collect();
        let used = journal.used_bytes();
        let d = tickets.pop().unwrap();
        let c = tickets.pop().unwrap();
        let b = tickets.pop().unwrap();
        let a = tickets.pop().unwrap();
        journal.forget(a);
        journal.forget(b);
        journal.forget(d);
        assert_eq!(
            journal.used_bytes(),
            used,
            "forgotten records hold their space"
        );
        assert_eq!(
            keys(&path),
            ["log/1", "log/2", "log/3", "log/4"],
            "nothing is written when a record is forgotten"
        );
        journal.erase_forgotten().unwrap();
        assert_eq!(
            keys(&path),
            ["log/3"],
            "the live record between them is untouched"
        );
        assert!(
            journal.used_bytes() < used,
            "the first two records' space is free"
        );
        journal.release(vec![c]).unwrap();
        assert_eq!(journal.used_bytes(), 0);
        assert!(keys(&path).is_empty());
    }
}
