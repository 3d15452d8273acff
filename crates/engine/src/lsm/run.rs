//! One sorted run: an immutable object of sealed blocks of point entries, a sealed index, and a
//! plaintext tail that locates the index (docs/format.md, "Runs").
//!
//! ```text
//! header  "BFSRUN01" | run id (u64)
//! block*  sealed(codec byte | zstd(entries)), AAD "bfs-run-block" | run id | block number
//!         entry: key length (u16) | key | kind (1 put, 2 delete) | [value length (u32) | value]
//! index   sealed(codec byte | zstd(blocks, range deletions, entry count)), AAD "bfs-run-index" | run id
//! tail    index offset (u64) | index length (u64) | "BFSRUNEN"
//! ```
//!
//! Keys are sealed like values: the object reveals only its size and its blocks' sizes. A cold
//! lookup reads the tail and the index once per run (kept while the run is open), then one
//! block: one ranged GET.

use super::cache::{Block, BlockCache};
use super::{Entry, RangeSet, RunError};
use crate::bucket::SharedBucket;
use crate::cache::{DiskCache, Space};
use crate::crypto::Sealer;
use crate::limits::{
    RUN_BLOCK_BYTES_TARGET, RUN_BLOCK_PLAIN_BYTES_MAX, RUN_INDEX_PLAIN_BYTES_MAX,
    RUN_VALUE_BYTES_MAX,
};
use std::sync::Arc;

const RUN_MAGIC: &[u8; 8] = b"BFSRUN01";
const RUN_END_MAGIC: &[u8; 8] = b"BFSRUNEN";
const HEADER_BYTES: usize = 16;
pub const TAIL_BYTES: u64 = 24;
const CODEC_ZSTD: u8 = 1;
const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
/// Runs are written in the background: a tighter zstd level than the frames a client waits on.
const RUN_ZSTD_LEVEL: i32 = 3;

fn block_aad(run_id: u64, block: u64) -> Vec<u8> {
    let mut aad = b"bfs-run-block".to_vec();
    aad.extend_from_slice(&run_id.to_le_bytes());
    aad.extend_from_slice(&block.to_le_bytes());
    aad
}

fn index_aad(run_id: u64) -> Vec<u8> {
    let mut aad = b"bfs-run-index".to_vec();
    aad.extend_from_slice(&run_id.to_le_bytes());
    aad
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    let len =
        u16::try_from(key.len()).expect("keys are shorter than 64 KiB (checked by the writer)");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(key);
}

fn seal_compressed(sealer: &Sealer, aad: &[u8], plain: &[u8], out: &mut Vec<u8>) {
    let mut body = vec![CODEC_ZSTD];
    body.extend_from_slice(
        &zstd::bulk::compress(plain, RUN_ZSTD_LEVEL).expect("zstd compresses any input"),
    );
    sealer.seal_into(out, aad, &body);
}

/// Where one block is, and the keys it spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    pub offset: u64,
    pub length: u32,
    pub first_key: Vec<u8>,
    pub last_key: Vec<u8>,
}

/// Encodes a run: `entries` in strictly increasing key order, and the run's range deletions.
pub fn encode(
    sealer: &Sealer,
    run_id: u64,
    entries: impl IntoIterator<Item = (Vec<u8>, Entry)>,
    ranges: &RangeSet,
) -> Vec<u8> {
    let mut w = RunWriter::new(sealer, run_id);
    for (key, entry) in entries {
        w.push(&key, &entry);
    }
    w.finish(ranges)
}

/// A run encoded as its entries arrive: it holds the run's sealed blocks and the block being
/// filled, not the entries, so that a merge streams from its sources into the object.
pub struct RunWriter<'a> {
    sealer: &'a Sealer,
    run_id: u64,
    out: Vec<u8>,
    blocks: Vec<BlockRef>,
    plain: Vec<u8>,
    first_key: Option<Vec<u8>>,
    last_key: Vec<u8>,
    count: u64,
    entry_bytes: u64,
}

impl<'a> RunWriter<'a> {
    pub fn new(sealer: &'a Sealer, run_id: u64) -> RunWriter<'a> {
        let mut out = Vec::with_capacity(HEADER_BYTES);
        out.extend_from_slice(RUN_MAGIC);
        out.extend_from_slice(&run_id.to_le_bytes());
        RunWriter {
            sealer,
            run_id,
            out,
            blocks: Vec::new(),
            plain: Vec::new(),
            first_key: None,
            last_key: Vec::new(),
            count: 0,
            entry_bytes: 0,
        }
    }

    /// Entries pushed so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Plain bytes of the entries pushed so far (what bounds a part).
    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Appends an entry; its key must be above every key pushed before.
    pub fn push(&mut self, key: &[u8], entry: &Entry) {
        assert!(
            key.len() <= u16::MAX as usize,
            "keys are shorter than 64 KiB"
        );
        assert!(
            self.count == 0 || self.last_key.as_slice() < key,
            "run entries are in strictly increasing key order"
        );
        if self.first_key.is_none() {
            self.first_key = Some(key.to_vec());
        }
        let before = self.plain.len();
        put_key(&mut self.plain, key);
        match entry {
            Entry::Put(value) => {
                self.plain.push(KIND_PUT);
                assert!(
                    value.len() <= RUN_VALUE_BYTES_MAX,
                    "run values are at most 1 MiB"
                );
                let len = value.len() as u32;
                self.plain.extend_from_slice(&len.to_le_bytes());
                self.plain.extend_from_slice(value);
            }
            Entry::Delete => self.plain.push(KIND_DELETE),
        }
        self.entry_bytes += (self.plain.len() - before) as u64;
        self.count += 1;
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        if self.plain.len() >= RUN_BLOCK_BYTES_TARGET {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let offset = self.out.len() as u64;
        let aad = block_aad(self.run_id, self.blocks.len() as u64);
        seal_compressed(self.sealer, &aad, &self.plain, &mut self.out);
        self.blocks.push(BlockRef {
            offset,
            length: u32::try_from(self.out.len() as u64 - offset)
                .expect("a block is far below 4 GiB"),
            first_key: self
                .first_key
                .take()
                .expect("a block holds at least one entry"),
            last_key: self.last_key.clone(),
        });
        self.plain.clear();
    }

    /// The run's object, with `ranges` as its range deletions.
    pub fn finish(mut self, ranges: &RangeSet) -> Vec<u8> {
        if !self.plain.is_empty() {
            self.flush();
        }
        let mut index = Vec::new();
        index.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for b in &self.blocks {
            index.extend_from_slice(&b.offset.to_le_bytes());
            index.extend_from_slice(&b.length.to_le_bytes());
            put_key(&mut index, &b.first_key);
            put_key(&mut index, &b.last_key);
        }
        index.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
        for (start, end) in ranges.iter() {
            put_key(&mut index, start);
            put_key(&mut index, end);
        }
        index.extend_from_slice(&self.count.to_le_bytes());
        let mut out = self.out;
        let index_offset = out.len() as u64;
        seal_compressed(self.sealer, &index_aad(self.run_id), &index, &mut out);
        let index_len = out.len() as u64 - index_offset;
        out.extend_from_slice(&index_offset.to_le_bytes());
        out.extend_from_slice(&index_len.to_le_bytes());
        out.extend_from_slice(RUN_END_MAGIC);
        out
    }
}

/// Reads the plaintext of a sealed, compressed part, at most `max` bytes of it.
fn open_compressed(
    sealer: &Sealer,
    aad: &[u8],
    sealed: &[u8],
    max: usize,
    fail: impl Fn(&'static str) -> RunError,
    unauthentic: RunError,
) -> Result<Vec<u8>, RunError> {
    let body = sealer.open(aad, sealed).map_err(|_| unauthentic)?;
    match body.split_first() {
        Some((&CODEC_ZSTD, compressed)) => {
            // The buffer is the size the frame declares (runs are written with it), not `max`:
            // an index's bound is 256 MiB, allocated for every run opened.
            let size = match zstd::zstd_safe::get_frame_content_size(compressed) {
                Ok(Some(size)) if size <= max as u64 => size as usize,
                Ok(Some(_)) => return Err(fail("decompresses to more than its bound")),
                _ => return Err(fail("does not decompress")),
            };
            let plain = zstd::bulk::decompress(compressed, size)
                .map_err(|_| fail("does not decompress"))?;
            if plain.len() != size {
                return Err(fail("decompresses to less than it declares"));
            }
            Ok(plain)
        }
        _ => Err(fail("unknown codec")),
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len())?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn key(&mut self) -> Option<Vec<u8>> {
        let n = self.u16()? as usize;
        Some(self.take(n)?.to_vec())
    }
    fn done(&self) -> bool {
        self.at == self.buf.len()
    }
}

#[cfg(feature = "fuzzing")]
pub fn fuzz_block(plain: &[u8]) -> Result<Vec<(Vec<u8>, Entry)>, &'static str> {
    decode_block(plain)
}

/// A run object with no blocks of its own whose sealed index holds `index` as its plaintext.
#[cfg(feature = "fuzzing")]
pub fn fuzz_object_with_index(sealer: &Sealer, run_id: u64, index: &[u8]) -> Vec<u8> {
    let mut out = RUN_MAGIC.to_vec();
    out.extend_from_slice(&run_id.to_le_bytes());
    // Room for the blocks an index may name, so that offsets can point somewhere.
    out.extend_from_slice(&vec![0u8; 4096]);
    let index_offset = out.len() as u64;
    seal_compressed(sealer, &index_aad(run_id), index, &mut out);
    let index_len = out.len() as u64 - index_offset;
    out.extend_from_slice(&index_offset.to_le_bytes());
    out.extend_from_slice(&index_len.to_le_bytes());
    out.extend_from_slice(RUN_END_MAGIC);
    out
}

/// Decodes a block's entries, checking their order.
fn decode_block(plain: &[u8]) -> Result<Vec<(Vec<u8>, Entry)>, &'static str> {
    let mut r = Reader { buf: plain, at: 0 };
    let mut entries: Vec<(Vec<u8>, Entry)> = Vec::new();
    while !r.done() {
        let key = r.key().ok_or("truncated key")?;
        let entry = match r.u8().ok_or("truncated kind")? {
            KIND_PUT => {
                let n = r.u32().ok_or("truncated value length")? as usize;
                Entry::Put(r.take(n).ok_or("truncated value")?.to_vec())
            }
            KIND_DELETE => Entry::Delete,
            _ => return Err("unknown entry kind"),
        };
        if entries.last().is_some_and(|(last, _)| *last >= key) {
            return Err("keys out of order");
        }
        entries.push((key, entry));
    }
    if entries.is_empty() {
        return Err("empty block");
    }
    // The block cache counts the entries, not the vector's spare room: give it back.
    entries.shrink_to_fit();
    Ok(entries)
}

/// An open run: its index in memory (a small fraction of the run), its blocks read on demand
/// through the block cache.
pub struct RunReader {
    key: String,
    run_id: u64,
    /// This reader's number in the block cache.
    uid: u64,
    bucket: SharedBucket,
    sealer: Arc<Sealer>,
    cache: Option<Arc<BlockCache>>,
    /// The local-disk tier under the block cache: a block evicted from memory is read from
    /// disk, not fetched again from the bucket.
    disk: Option<Arc<DiskCache>>,
    blocks: Vec<BlockRef>,
    ranges: RangeSet,
    entry_count: u64,
}

impl Drop for RunReader {
    fn drop(&mut self) {
        if let Some(cache) = &self.cache {
            cache.drop_reader(self.uid);
        }
    }
}

impl RunReader {
    /// Opens run `run_id` stored at `key` (`size` bytes): two ranged GETs, tail then index.
    pub async fn open(
        bucket: SharedBucket,
        sealer: Arc<Sealer>,
        key: &str,
        run_id: u64,
        size: u64,
    ) -> Result<RunReader, RunError> {
        check_size(key, size)?;
        let tail = bucket.get_range(key, size - TAIL_BYTES..size).await?;
        let (offset, length) = index_location(key, size, &tail)?;
        let sealed = bucket.get_range(key, offset..offset + length).await?;
        Self::with_index(bucket, sealer, key, run_id, offset, &sealed)
    }

    /// Opens a run from the object just written (`object`), without reading it back.
    pub fn from_object(
        bucket: SharedBucket,
        sealer: Arc<Sealer>,
        key: &str,
        run_id: u64,
        object: &[u8],
    ) -> Result<RunReader, RunError> {
        let size = object.len() as u64;
        check_size(key, size)?;
        let (offset, length) = index_location(key, size, &object[(size - TAIL_BYTES) as usize..])?;
        let sealed = &object[offset as usize..(offset + length) as usize];
        Self::with_index(bucket, sealer, key, run_id, offset, sealed)
    }

    /// Reads blocks through `cache` from now on.
    pub fn with_cache(mut self, cache: Arc<BlockCache>) -> RunReader {
        self.cache = Some(cache);
        self
    }

    /// Reads blocks that miss the block cache through the disk cache `disk` (if any).
    pub fn with_disk_cache(mut self, disk: Option<Arc<DiskCache>>) -> RunReader {
        self.disk = disk;
        self
    }

    fn with_index(
        bucket: SharedBucket,
        sealer: Arc<Sealer>,
        key: &str,
        run_id: u64,
        offset: u64,
        sealed: &[u8],
    ) -> Result<RunReader, RunError> {
        let fail = |why| RunError::Block {
            key: key.to_string(),
            block: u64::MAX,
            why,
        };
        let unauthentic = RunError::Authentication {
            key: key.to_string(),
            block: u64::MAX,
        };
        let plain = open_compressed(
            &sealer,
            &index_aad(run_id),
            sealed,
            RUN_INDEX_PLAIN_BYTES_MAX,
            fail,
            unauthentic,
        )?;
        let mut r = Reader { buf: &plain, at: 0 };
        let bad_index = || fail("malformed index");
        let block_count = r.u32().ok_or_else(bad_index)?;
        let mut blocks: Vec<BlockRef> = Vec::new();
        for _ in 0..block_count {
            let b = BlockRef {
                offset: r.u64().ok_or_else(bad_index)?,
                length: r.u32().ok_or_else(bad_index)?,
                first_key: r.key().ok_or_else(bad_index)?,
                last_key: r.key().ok_or_else(bad_index)?,
            };
            let in_order = blocks.last().is_none_or(|p| {
                p.last_key < b.first_key && p.offset + u64::from(p.length) <= b.offset
            });
            if !in_order
                || b.first_key > b.last_key
                || b.offset < HEADER_BYTES as u64
                || b.offset
                    .checked_add(u64::from(b.length))
                    .is_none_or(|end| end > offset)
            {
                return Err(bad_index());
            }
            blocks.push(b);
        }
        let range_count = r.u32().ok_or_else(bad_index)?;
        let mut ranges = RangeSet::new();
        for _ in 0..range_count {
            let start = r.key().ok_or_else(bad_index)?;
            let end = r.key().ok_or_else(bad_index)?;
            if start >= end {
                return Err(bad_index());
            }
            ranges.insert(start, end);
        }
        let entry_count = r.u64().ok_or_else(bad_index)?;
        if !r.done() {
            return Err(bad_index());
        }
        Ok(RunReader {
            key: key.to_string(),
            run_id,
            uid: super::cache::next_reader_id(),
            bucket,
            sealer,
            cache: None,
            disk: None,
            blocks,
            ranges,
            entry_count,
        })
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Bytes of memory the open run keeps: its index.
    pub fn index_bytes(&self) -> usize {
        self.blocks
            .iter()
            .map(|b| 48 + b.first_key.len() + b.last_key.len())
            .sum::<usize>()
            + self.ranges.memory_bytes()
    }

    pub fn range_deletes(&self) -> &RangeSet {
        &self.ranges
    }

    pub fn entry_count(&self) -> u64 {
        self.entry_count
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// The first block that may hold keys at or after `key`.
    pub fn block_from(&self, key: &[u8]) -> usize {
        self.blocks.partition_point(|b| b.last_key.as_slice() < key)
    }

    pub fn block_first_key(&self, block: usize) -> &[u8] {
        &self.blocks[block].first_key
    }

    /// Stored bytes of block number `block`.
    pub fn block_bytes(&self, block: usize) -> u64 {
        u64::from(self.blocks[block].length)
    }

    /// The run's last key (none: the run holds no point entries).
    pub fn last_key(&self) -> Option<&[u8]> {
        self.blocks.last().map(|b| b.last_key.as_slice())
    }

    /// Block number `block`: from the block cache, else from the disk cache, else read (one
    /// ranged GET); checked either way.
    pub async fn block(&self, block: usize) -> Result<Block, RunError> {
        if let Some(found) = self.cache.as_ref().and_then(|c| c.get(self.uid, block)) {
            return Ok(found);
        }
        let b = &self.blocks[block];
        let on_disk = self
            .disk
            .as_ref()
            .and_then(|d| d.get(Space::Run, self.run_id, b.offset, b.length));
        let entries = match on_disk.map(|sealed| self.open_block(block, &sealed)) {
            Some(Ok(entries)) => entries,
            found => {
                if found.is_some() {
                    // Damaged on local disk: the bucket's copy decides.
                    tracing::warn!(run = %self.key, block, "a cached run block failed its check; reading it from the bucket");
                    if let Some(d) = &self.disk {
                        d.drop_object(Space::Run, self.run_id);
                    }
                }
                let range = b.offset..b.offset + u64::from(b.length);
                let sealed = self.bucket.get_range(&self.key, range).await?;
                let entries = self.open_block(block, &sealed)?;
                if let Some(d) = &self.disk {
                    d.put_piece(Space::Run, self.run_id, b.offset, sealed.clone());
                }
                entries
            }
        };
        let entries: Block = Arc::new(entries);
        if let Some(cache) = &self.cache {
            cache.put(self.uid, block, entries.clone());
        }
        Ok(entries)
    }

    /// Authenticates, decompresses and decodes block `block` from its stored bytes.
    fn open_block(&self, block: usize, sealed: &[u8]) -> Result<Vec<(Vec<u8>, Entry)>, RunError> {
        let b = &self.blocks[block];
        let number = block as u64;
        let fail = |why| RunError::Block {
            key: self.key.clone(),
            block: number,
            why,
        };
        let plain = open_compressed(
            &self.sealer,
            &block_aad(self.run_id, number),
            sealed,
            RUN_BLOCK_PLAIN_BYTES_MAX,
            fail,
            RunError::Authentication {
                key: self.key.clone(),
                block: number,
            },
        )?;
        let entries = decode_block(&plain).map_err(fail)?;
        let (first, last) = (&entries[0].0, &entries[entries.len() - 1].0);
        if *first != b.first_key || *last != b.last_key {
            return Err(fail("keys differ from the index"));
        }
        Ok(entries)
    }

    /// This run's point entry for `key`, if it has one (range deletions aside).
    pub async fn get(&self, key: &[u8]) -> Result<Option<Entry>, RunError> {
        let block = self.block_from(key);
        if block == self.blocks.len() || self.blocks[block].first_key.as_slice() > key {
            return Ok(None);
        }
        let entries = self.block(block).await?;
        Ok(entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .map(|i| entries[i].1.clone()))
    }
}

/// Where the index of a run of `size` bytes is, from its tail (the last `TAIL_BYTES`).
fn index_location(key: &str, size: u64, tail: &[u8]) -> Result<(u64, u64), RunError> {
    let malformed = || RunError::Malformed {
        key: key.to_string(),
    };
    let mut r = Reader { buf: tail, at: 0 };
    let (offset, length) = (
        r.u64().ok_or_else(malformed)?,
        r.u64().ok_or_else(malformed)?,
    );
    if r.take(8) != Some(RUN_END_MAGIC.as_slice())
        || offset < HEADER_BYTES as u64
        || offset.checked_add(length) != Some(size - TAIL_BYTES)
    {
        return Err(malformed());
    }
    Ok((offset, length))
}

fn check_size(key: &str, size: u64) -> Result<(), RunError> {
    if size < HEADER_BYTES as u64 + TAIL_BYTES {
        return Err(RunError::Malformed {
            key: key.to_string(),
        });
    }
    Ok(())
}
