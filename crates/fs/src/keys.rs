//! The filesystem's keys in the engine's keyspace (docs/format.md, "Filesystem keys"). Keys
//! are stored in the clear, so no name appears in one: a name is represented by its keyed hash
//! (`Engine::name_hash`) and kept in the sealed value.

/// `i` + ino (8, big-endian) -> the inode record.
pub fn inode(ino: u64) -> Vec<u8> {
    with_ino(b'i', ino)
}

/// `e` + directory ino + entry cookie (8, big-endian) -> the entries whose names hash to it.
pub fn dirent(dir: u64, cookie: u64) -> Vec<u8> {
    let mut k = with_ino(b'e', dir);
    k.extend_from_slice(&cookie.to_be_bytes());
    k
}

/// Every entry key of a directory starts with this.
pub fn dirent_prefix(dir: u64) -> Vec<u8> {
    with_ino(b'e', dir)
}

/// `x` + ino + name hash -> the extended attributes whose names hash to it.
pub fn xattr(ino: u64, hash: u64) -> Vec<u8> {
    let mut k = with_ino(b'x', ino);
    k.extend_from_slice(&hash.to_be_bytes());
    k
}

pub fn xattr_prefix(ino: u64) -> Vec<u8> {
    with_ino(b'x', ino)
}

/// `o` + ino -> nothing: an unlinked inode still open, whose data goes at its last close or,
/// after a crash, at the next writer's open.
pub fn orphan(ino: u64) -> Vec<u8> {
    with_ino(b'o', ino)
}

pub const ORPHAN_PREFIX: &[u8] = b"o";

/// The next inode number never handed out.
pub const NEXT_INO: &[u8] = b"c/next_ino";
/// The filesystem layout's version; absent in layout 1 (block devices only, names in keys).
pub const LAYOUT: &[u8] = b"c/fs_layout";
/// Layout 1's directory entries: `d` + parent + name -> child ino.
pub const LEGACY_DIRENT_PREFIX: &[u8] = b"d";

pub fn legacy_dirent(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut k = with_ino(b'd', parent);
    k.extend_from_slice(name);
    k
}

/// The key ranges that hold an inode's own pairs (its record, extended attributes, orphan
/// mark, and a directory's entries): with its extents, the scope of a scoped barrier.
pub fn scope_ranges(ino: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    [b'i', b'x', b'o', b'e']
        .into_iter()
        .map(|tag| {
            let start = with_ino(tag, ino);
            let end = bucketfs_engine::prefix_end(&start).expect("a tag and an inode number");
            (start, end)
        })
        .collect()
}

/// The inode whose scope (`scope_ranges`) holds `key`, if any.
pub fn scope_of(key: &[u8]) -> Option<u64> {
    match key.first()? {
        b'i' | b'x' | b'o' | b'e' => ino_of(key),
        _ => None,
    }
}

fn with_ino(tag: u8, ino: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(tag);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// The inode number in the 8 bytes after a key's tag.
pub fn ino_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(1..9)?.try_into().ok()?))
}

/// The 8 bytes after a key's tag and inode number.
pub fn second_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(9..17)?.try_into().ok()?))
}
