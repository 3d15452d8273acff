//! The filesystem core: inodes, directories and file sizes over the engine's key-value pairs and
//! extents. Block devices are the files of the directory `/.nbd/`.
//!
//! Key layout (docs/format.md): `i` + ino (8, big-endian) -> inode; `d` + parent ino + name ->
//! child ino; `c/next_ino` -> the next free inode number. Every namespace change and every
//! resize is one engine transaction, so it is atomic.

use bucketfs_engine::{Engine, EngineError, Expect, Fill, KvChange, Txn};
use parking_lot::RwLock;
use std::collections::HashMap;

pub const ROOT_INO: u64 = 1;
pub const NBD_DIR_NAME: &str = ".nbd";
/// Longest file name, as in most POSIX filesystems.
pub const NAME_BYTES_MAX: usize = 255;
/// Largest file: byte offsets must fit comfortably in u64 arithmetic and in extent indexes.
pub const FILE_SIZE_BYTES_MAX: u64 = 1 << 60;

const NEXT_INO_KEY: &[u8] = b"c/next_ino";

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("invalid name {0:?}: names are 1 to 255 bytes, without '/' or NUL, and not . or ..")]
    InvalidName(String),
    #[error("size {0} is larger than the maximum file size")]
    TooLarge(u64),
    #[error("range {offset}+{length} is beyond the end of the file ({size} bytes)")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("inode {0} is damaged: {1}")]
    Damaged(u64, String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Directory = 1,
    File = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    pub kind: Kind,
    pub size_bytes: u64,
    pub mode: u32,
    pub mtime_ns: u64,
}

impl Inode {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(21);
        v.push(self.kind as u8);
        v.extend_from_slice(&self.size_bytes.to_le_bytes());
        v.extend_from_slice(&self.mode.to_le_bytes());
        v.extend_from_slice(&self.mtime_ns.to_le_bytes());
        v
    }

    fn decode(ino: u64, v: &[u8]) -> Result<Inode, FsError> {
        if v.len() != 21 {
            return Err(FsError::Damaged(
                ino,
                "inode record has the wrong length".into(),
            ));
        }
        let kind = match v[0] {
            1 => Kind::Directory,
            2 => Kind::File,
            k => return Err(FsError::Damaged(ino, format!("unknown inode kind {k}"))),
        };
        let u64_at = |at: usize| u64::from_le_bytes(v[at..at + 8].try_into().expect("8 bytes"));
        Ok(Inode {
            kind,
            size_bytes: u64_at(1),
            mode: u32::from_le_bytes(v[9..13].try_into().expect("4 bytes")),
            mtime_ns: u64_at(13),
        })
    }
}

fn inode_key(ino: u64) -> Vec<u8> {
    let mut k = b"i".to_vec();
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

fn dirent_prefix(parent: u64) -> Vec<u8> {
    let mut k = b"d".to_vec();
    k.extend_from_slice(&parent.to_be_bytes());
    k
}

fn dirent_key(parent: u64, name: &str) -> Vec<u8> {
    let mut k = dirent_prefix(parent);
    k.extend_from_slice(name.as_bytes());
    k
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn check_name(name: &str) -> Result<(), FsError> {
    let bad = name.is_empty()
        || name.len() > NAME_BYTES_MAX
        || name.contains('/')
        || name.contains('\0')
        || name == "."
        || name == "..";
    if bad {
        return Err(FsError::InvalidName(name.to_string()));
    }
    Ok(())
}

/// A block device: a regular file of `/.nbd/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    pub name: String,
    pub ino: u64,
    pub size_bytes: u64,
}

pub struct Fs {
    engine: Engine,
    nbd_dir: u64,
    /// Sizes of open files, checked on every I/O without a key-value lookup.
    sizes: RwLock<HashMap<u64, u64>>,
    /// Serialises namespace changes (create, resize, delete), which read then write.
    namespace: tokio::sync::Mutex<()>,
}

impl Fs {
    /// Opens the filesystem, creating `/` and `/.nbd/` in a new bucket.
    pub async fn open(engine: Engine) -> Result<Fs, FsError> {
        if engine.kv_get(&inode_key(ROOT_INO)).await?.is_none() && !engine.read_only() {
            let dir = Inode {
                kind: Kind::Directory,
                size_bytes: 0,
                mode: 0o755,
                mtime_ns: now_ns(),
            };
            let nbd_dir = ROOT_INO + 1;
            engine.kv_commit(vec![
                KvChange::Put(inode_key(ROOT_INO), dir.encode()),
                KvChange::Put(inode_key(nbd_dir), Inode { mode: 0o700, ..dir }.encode()),
                KvChange::Put(
                    dirent_key(ROOT_INO, NBD_DIR_NAME),
                    nbd_dir.to_be_bytes().to_vec(),
                ),
                KvChange::Put(NEXT_INO_KEY.to_vec(), (nbd_dir + 1).to_be_bytes().to_vec()),
            ])?;
            engine.flush().await?;
        }
        let nbd_dir = match engine.kv_get(&dirent_key(ROOT_INO, NBD_DIR_NAME)).await? {
            Some(v) => decode_ino(ROOT_INO, &v)?,
            // A read-only open of a bucket whose first writer never got this far.
            None => return Err(FsError::NotFound("/.nbd".into())),
        };
        let fs = Fs {
            engine,
            nbd_dir,
            sizes: RwLock::default(),
            namespace: tokio::sync::Mutex::new(()),
        };
        let devices = fs.block_devices().await?;
        fs.sizes
            .write()
            .extend(devices.iter().map(|d| (d.ino, d.size_bytes)));
        Ok(fs)
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    async fn inode(&self, ino: u64) -> Result<Inode, FsError> {
        let v = self
            .engine
            .kv_get(&inode_key(ino))
            .await?
            .ok_or_else(|| FsError::NotFound(format!("inode {ino}")))?;
        Inode::decode(ino, &v)
    }

    pub async fn block_devices(&self) -> Result<Vec<BlockDevice>, FsError> {
        let prefix = dirent_prefix(self.nbd_dir);
        let mut out = Vec::new();
        for (k, v) in self.engine.kv_scan(&prefix).await? {
            let name = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            let ino = decode_ino(self.nbd_dir, &v)?;
            out.push(BlockDevice {
                name,
                ino,
                size_bytes: self.inode(ino).await?.size_bytes,
            });
        }
        Ok(out)
    }

    pub async fn block_device(&self, name: &str) -> Result<BlockDevice, FsError> {
        let v = self
            .engine
            .kv_get(&dirent_key(self.nbd_dir, name))
            .await?
            .ok_or_else(|| FsError::NotFound(format!("block device {name}")))?;
        let ino = decode_ino(self.nbd_dir, &v)?;
        Ok(BlockDevice {
            name: name.to_string(),
            ino,
            size_bytes: self.inode(ino).await?.size_bytes,
        })
    }

    /// Creates a block device; durable when this returns.
    pub async fn create_block_device(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<BlockDevice, FsError> {
        check_name(name)?;
        if size_bytes > FILE_SIZE_BYTES_MAX {
            return Err(FsError::TooLarge(size_bytes));
        }
        let _guard = self.namespace.lock().await;
        if self
            .engine
            .kv_get(&dirent_key(self.nbd_dir, name))
            .await?
            .is_some()
        {
            return Err(FsError::Exists(format!("block device {name}")));
        }
        let ino = match self.engine.kv_get(NEXT_INO_KEY).await? {
            Some(v) => decode_ino(0, &v)?,
            None => {
                return Err(FsError::Damaged(
                    ROOT_INO,
                    "the inode counter is missing".into(),
                ))
            }
        };
        let inode = Inode {
            kind: Kind::File,
            size_bytes,
            mode: 0o600,
            mtime_ns: now_ns(),
        };
        let mut txn = Txn::new();
        txn.expect(dirent_key(self.nbd_dir, name), Expect::Absent)
            .expect(
                NEXT_INO_KEY.to_vec(),
                Expect::Value(ino.to_be_bytes().to_vec()),
            )
            .put(inode_key(ino), inode.encode())
            .put(dirent_key(self.nbd_dir, name), ino.to_be_bytes().to_vec())
            .put(NEXT_INO_KEY.to_vec(), (ino + 1).to_be_bytes().to_vec());
        self.engine.commit(&txn).await?;
        self.sizes.write().insert(ino, size_bytes);
        self.engine.flush().await?;
        Ok(BlockDevice {
            name: name.to_string(),
            ino,
            size_bytes,
        })
    }

    /// Changes a block device's size; bytes beyond a smaller size are deallocated, and read as
    /// zeroes if it grows again. Durable when this returns.
    pub async fn resize_block_device(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<BlockDevice, FsError> {
        if size_bytes > FILE_SIZE_BYTES_MAX {
            return Err(FsError::TooLarge(size_bytes));
        }
        let _guard = self.namespace.lock().await;
        let dev = self.block_device(name).await?;
        let mut inode = self.inode(dev.ino).await?;
        let old = inode.encode();
        let old_size = inode.size_bytes;
        let shrinks = size_bytes < inode.size_bytes;
        if shrinks {
            // Shrink the size first so no write lands beyond it while its extents are dropped.
            self.sizes.write().insert(dev.ino, size_bytes);
        }
        inode.size_bytes = size_bytes;
        inode.mtime_ns = now_ns();
        // The new size, the zeroed tail of the last extent and the range deletion beyond it
        // in one transaction: a crash cannot leave the data dropped and the size unchanged.
        let mut txn = Txn::new();
        txn.expect(inode_key(dev.ino), Expect::Value(old));
        if shrinks {
            let extent = bucketfs_engine::limits::EXTENT_SIZE_BYTES_U64;
            let tail_end = size_bytes.div_ceil(extent) * extent;
            txn.zero(dev.ino, size_bytes, tail_end - size_bytes, true)
                .drop_extents(dev.ino, size_bytes.div_ceil(extent), u64::MAX);
        }
        txn.put(inode_key(dev.ino), inode.encode());
        if let Err(e) = self.engine.commit(&txn).await {
            self.sizes.write().insert(dev.ino, old_size);
            return Err(e.into());
        }
        self.sizes.write().insert(dev.ino, size_bytes);
        self.engine.flush().await?;
        Ok(BlockDevice { size_bytes, ..dev })
    }

    /// Deletes a block device and its data; durable when this returns.
    pub async fn delete_block_device(&self, name: &str) -> Result<(), FsError> {
        let _guard = self.namespace.lock().await;
        let dev = self.block_device(name).await?;
        self.sizes.write().remove(&dev.ino);
        let mut txn = Txn::new();
        txn.expect(
            dirent_key(self.nbd_dir, name),
            Expect::Value(dev.ino.to_be_bytes().to_vec()),
        )
        .drop_extents(dev.ino, 0, u64::MAX)
        .delete(dirent_key(self.nbd_dir, name))
        .delete(inode_key(dev.ino));
        if let Err(e) = self.engine.commit(&txn).await {
            self.sizes.write().insert(dev.ino, dev.size_bytes);
            return Err(e.into());
        }
        self.engine.flush().await?;
        Ok(())
    }

    fn check_range(&self, ino: u64, offset: u64, length: u64) -> Result<(), FsError> {
        let size = *self
            .sizes
            .read()
            .get(&ino)
            .ok_or_else(|| FsError::NotFound(format!("inode {ino}")))?;
        match offset.checked_add(length) {
            Some(end) if end <= size => Ok(()),
            _ => Err(FsError::OutOfRange {
                offset,
                length,
                size,
            }),
        }
    }

    pub async fn read(&self, ino: u64, offset: u64, length: usize) -> Result<Vec<u8>, FsError> {
        self.check_range(ino, offset, length as u64)?;
        Ok(self.engine.read(ino, offset, length).await?)
    }

    pub async fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), FsError> {
        self.check_range(ino, offset, data.len() as u64)?;
        Ok(self
            .engine
            .write(ino, offset, data.len() as u64, Fill::Data(data))
            .await?)
    }

    /// Makes the range read as zeroes, deallocating whole extents when `punch` is set.
    pub async fn zero(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        punch: bool,
    ) -> Result<(), FsError> {
        self.check_range(ino, offset, length)?;
        Ok(self
            .engine
            .write(ino, offset, length, Fill::Zeroes { punch })
            .await?)
    }

    pub async fn allocation(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
    ) -> Result<Vec<(u64, bool)>, FsError> {
        self.check_range(ino, offset, length)?;
        Ok(self.engine.allocation(ino, offset, length).await?)
    }

    /// The flush barrier: every earlier write, from any client, is durable when this returns.
    pub async fn sync(&self) -> Result<(), FsError> {
        Ok(self.engine.flush().await?)
    }
}

fn decode_ino(owner: u64, v: &[u8]) -> Result<u64, FsError> {
    let b: [u8; 8] = v
        .try_into()
        .map_err(|_| FsError::Damaged(owner, "inode number has the wrong length".into()))?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_engine::bucket::{open_url, SharedBucket};
    use bucketfs_engine::{EngineOptions, TaskSet};

    /// Opens the filesystem as a new process would; returns the tasks its engine starts.
    async fn open(bucket: &SharedBucket) -> (Fs, TaskSet) {
        let opts = EngineOptions::for_tests("pw");
        let tasks = opts.tasks.clone();
        let engine = Engine::open(bucket.clone(), opts).await.unwrap();
        (Fs::open(engine).await.unwrap(), tasks)
    }

    /// Stops the process: every task its engine started, then the engine.
    async fn crash(fs: Fs, tasks: TaskSet) {
        drop(fs);
        tasks.stop_all().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn block_devices_are_created_resized_and_deleted_durably() {
        let bucket: SharedBucket = open_url("memory://", &Vec::new()).unwrap();
        let (fs, tasks) = open(&bucket).await;
        let d = fs.create_block_device("disk1", 1 << 20).await.unwrap();
        assert!(matches!(
            fs.create_block_device("disk1", 1).await,
            Err(FsError::Exists(_))
        ));
        assert!(matches!(
            fs.create_block_device("a/b", 1).await,
            Err(FsError::InvalidName(_))
        ));
        fs.write(d.ino, 100_000, &[7; 5000]).await.unwrap();
        assert!(matches!(
            fs.write(d.ino, (1 << 20) - 10, &[1; 11]).await,
            Err(FsError::OutOfRange { .. })
        ));
        fs.resize_block_device("disk1", 102_000).await.unwrap();
        fs.resize_block_device("disk1", 1 << 20).await.unwrap();
        let back = fs.read(d.ino, 100_000, 5000).await.unwrap();
        assert_eq!(&back[..2000], &[7; 2000][..]);
        assert_eq!(
            &back[2000..],
            &[0; 3000][..],
            "bytes cut by a shrink read as zeroes after growing"
        );
        fs.create_block_device("disk2", 4096).await.unwrap();
        crash(fs, tasks).await;
        let (fs, tasks) = open(&bucket).await;
        let names: Vec<_> = fs
            .block_devices()
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.name, d.size_bytes))
            .collect();
        assert_eq!(
            names,
            vec![("disk1".to_string(), 1 << 20), ("disk2".to_string(), 4096)]
        );
        fs.delete_block_device("disk1").await.unwrap();
        assert!(matches!(
            fs.block_device("disk1").await,
            Err(FsError::NotFound(_))
        ));
        crash(fs, tasks).await;
        let (fs, _tasks) = open(&bucket).await;
        assert_eq!(fs.block_devices().await.unwrap().len(), 1);
    }
}
