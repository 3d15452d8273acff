//! One filesystem mutation as one engine transaction. A `Change` reads the pairs it will
//! modify, remembers what it read, and commits its writes on the condition that every pair it
//! read is still as it was: the per-inode locks keep that true in this process, and the engine
//! refuses the commit if anything slipped past them.

use crate::dir::{self, Entry};
use crate::inode::Inode;
use crate::{keys, Fs, FsError};
use bucketfs_engine::{Expect, Txn};
use std::collections::BTreeMap;

enum DataOp {
    Drop {
        ino: u64,
        from: u64,
        to: u64,
    },
    Zero {
        ino: u64,
        offset: u64,
        length: u64,
    },
    Write {
        ino: u64,
        offset: u64,
        data: Vec<u8>,
    },
    DeleteRange {
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

pub(crate) struct Change<'a> {
    fs: &'a Fs,
    read: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    now: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    data: Vec<DataOp>,
}

impl<'a> Change<'a> {
    pub fn new(fs: &'a Fs) -> Change<'a> {
        Change {
            fs,
            read: BTreeMap::new(),
            now: BTreeMap::new(),
            data: Vec::new(),
        }
    }

    async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        if let Some(v) = self.now.get(key) {
            return Ok(v.clone());
        }
        let v = self.fs.engine.kv_get(key).await?;
        self.read.insert(key.to_vec(), v.clone());
        self.now.insert(key.to_vec(), v.clone());
        Ok(v)
    }

    fn set(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.now.insert(key, value);
    }

    /// The inode as this change has it so far.
    pub async fn inode(&mut self, ino: u64) -> Result<Inode, FsError> {
        match self.get(&keys::inode(ino)).await? {
            Some(v) => Inode::decode(ino, &v),
            None => Err(FsError::NotFound(format!("inode {ino}"))),
        }
    }

    pub fn put_inode(&mut self, inode: &Inode) {
        self.set(keys::inode(inode.ino), Some(inode.encode()));
    }

    /// Writes a new inode, which must not exist yet.
    pub fn create_inode(&mut self, inode: &Inode) {
        self.read.insert(keys::inode(inode.ino), None);
        self.put_inode(inode);
    }

    /// Deletes the inode, its data, its extended attributes and its orphan mark.
    pub fn delete_inode(&mut self, ino: u64) {
        self.set(keys::inode(ino), None);
        self.set(keys::orphan(ino), None);
        self.data.push(DataOp::Drop {
            ino,
            from: 0,
            to: u64::MAX,
        });
        let start = keys::xattr_prefix(ino);
        let end = bucketfs_engine::prefix_end(&start).expect("a tag and an inode number");
        self.data.push(DataOp::DeleteRange { start, end });
    }

    pub fn mark_orphan(&mut self, ino: u64) {
        self.set(keys::orphan(ino), Some(Vec::new()));
    }

    /// The entries of `dir` whose names share `name`'s cookie.
    pub async fn entries(&mut self, dir: u64, cookie: u64) -> Result<Vec<Entry>, FsError> {
        match self.get(&keys::dirent(dir, cookie)).await? {
            Some(v) => dir::decode_bucket(dir, cookie, &v),
            None => Ok(Vec::new()),
        }
    }

    /// The entries of a bucket this change has already read (`entries`).
    pub fn entries_read(&self, dir: u64, cookie: u64) -> Vec<Entry> {
        match self.now.get(&keys::dirent(dir, cookie)) {
            Some(Some(v)) => {
                dir::decode_bucket(dir, cookie, v).expect("a bucket decoded when it was read")
            }
            Some(None) => Vec::new(),
            None => panic!("directory bucket {dir}/{cookie} was not read first"),
        }
    }

    pub fn set_entries(&mut self, dir: u64, cookie: u64, entries: &[Entry]) {
        let v = (!entries.is_empty()).then(|| dir::encode_bucket(entries));
        self.set(keys::dirent(dir, cookie), v);
    }

    /// A pair other than an inode or a directory entry (an xattr bucket, a counter).
    pub async fn value(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        self.get(key).await
    }

    pub fn set_value(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.set(key, value);
    }

    /// Deallocates the extents of `ino` from index `from` on.
    pub fn drop_extents(&mut self, ino: u64, from: u64) {
        self.data.push(DataOp::Drop {
            ino,
            from,
            to: u64::MAX,
        });
    }

    pub fn zero(&mut self, ino: u64, offset: u64, length: u64) {
        if length > 0 {
            self.data.push(DataOp::Zero {
                ino,
                offset,
                length,
            });
        }
    }

    pub fn write(&mut self, ino: u64, offset: u64, data: Vec<u8>) {
        self.data.push(DataOp::Write { ino, offset, data });
    }

    /// Commits the change: every pair read must still hold what it held.
    pub async fn commit(self) -> Result<(), FsError> {
        let mut txn = Txn::new();
        for (key, was) in &self.read {
            let expect = match was {
                Some(v) => Expect::Value(v.clone()),
                None => Expect::Absent,
            };
            txn.expect(key.clone(), expect);
        }
        // The scopes (inodes) this change touches: several, or one and a key of none (a
        // counter), make it shared, so an fsync of either waits for the whole log.
        let mut scopes = std::collections::BTreeSet::new();
        let mut unscoped = false;
        for op in &self.data {
            match op {
                DataOp::Drop { ino, .. } | DataOp::Zero { ino, .. } | DataOp::Write { ino, .. } => {
                    scopes.insert(*ino);
                }
                DataOp::DeleteRange { start, .. } => match keys::scope_of(start) {
                    Some(ino) => {
                        scopes.insert(ino);
                    }
                    None => unscoped = true,
                },
            }
        }
        for op in self.data {
            match op {
                DataOp::Drop { ino, from, to } => txn.drop_extents(ino, from, to),
                DataOp::Zero {
                    ino,
                    offset,
                    length,
                } => txn.zero(ino, offset, length, true),
                DataOp::Write { ino, offset, data } => txn.write(ino, offset, data),
                DataOp::DeleteRange { start, end } => txn.delete_range(start, end),
            };
        }
        for (key, value) in self.now {
            if self.read.get(&key) == Some(&value) {
                continue;
            }
            match keys::scope_of(&key) {
                Some(ino) => {
                    scopes.insert(ino);
                }
                None => unscoped = true,
            }
            match value {
                Some(v) => txn.put(key, v),
                None => txn.delete(key),
            };
        }
        if scopes.len() > 1 || (unscoped && !scopes.is_empty()) {
            txn.shared_by(scopes);
        }
        self.fs.engine.commit(&txn).await?;
        Ok(())
    }
}
