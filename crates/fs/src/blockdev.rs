//! Block devices: the regular files of `/.nbd/`, served over NBD. Their I/O skips the inode
//! record (a device's size changes only by resize, and NBD has no times), checking ranges
//! against sizes kept in memory.

use crate::inode::S_IFREG;
use crate::perm::Caller;
use crate::{Fs, FsError, SetAttr, FILE_SIZE_BYTES_MAX};
use bucketfs_engine::Fill;

/// A block device: a regular file of `/.nbd/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    pub name: String,
    pub ino: u64,
    pub size_bytes: u64,
}

/// Directory entries read per page while listing devices.
const LIST_PAGE_ENTRIES: usize = 1024;

impl Fs {
    pub async fn block_devices(&self) -> Result<Vec<BlockDevice>, FsError> {
        let mut out = Vec::new();
        let mut after = crate::FIRST_COOKIE - 1;
        loop {
            let page = self
                .entries_from(self.nbd_dir, after + 1, LIST_PAGE_ENTRIES)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after = last.cookie;
            for e in page {
                let inode = self.getattr(e.ino).await?;
                if inode.kind() == crate::Kind::File {
                    out.push(BlockDevice {
                        name: String::from_utf8_lossy(&e.name).into_owned(),
                        ino: e.ino,
                        size_bytes: inode.size_bytes,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub async fn block_device(&self, name: &str) -> Result<BlockDevice, FsError> {
        let missing = || FsError::NotFound(format!("block device {name}"));
        let e = self
            .lookup_entry(self.nbd_dir, name.as_bytes())
            .await?
            .ok_or_else(missing)?;
        let inode = self.getattr(e.ino).await?;
        if inode.kind() != crate::Kind::File {
            return Err(missing());
        }
        Ok(BlockDevice {
            name: name.to_string(),
            ino: e.ino,
            size_bytes: inode.size_bytes,
        })
    }

    /// Creates a block device; durable when this returns.
    pub async fn create_block_device(
        &self,
        name: &str,
        size_bytes: u64,
    ) -> Result<BlockDevice, FsError> {
        if size_bytes > FILE_SIZE_BYTES_MAX {
            return Err(FsError::TooLarge(size_bytes));
        }
        let inode = self
            .make_sized(
                &Caller::root(),
                self.nbd_dir,
                name.as_bytes(),
                S_IFREG | 0o600,
                size_bytes,
            )
            .await
            .map_err(|e| match e {
                FsError::Exists(_) => FsError::Exists(format!("block device {name}")),
                e => e,
            })?;
        self.engine.flush().await?;
        Ok(BlockDevice {
            name: name.to_string(),
            ino: inode.ino,
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
        let dev = self.block_device(name).await?;
        if size_bytes < dev.size_bytes {
            // Shrink the size NBD checks first, so no write lands beyond it while the extents
            // beyond are dropped.
            self.sizes.write().insert(dev.ino, size_bytes);
        }
        let set = SetAttr {
            size_bytes: Some(size_bytes),
            ..SetAttr::default()
        };
        if let Err(e) = self.setattr(&Caller::root(), dev.ino, &set).await {
            self.sizes.write().insert(dev.ino, dev.size_bytes);
            return Err(e);
        }
        self.engine.flush().await?;
        Ok(BlockDevice { size_bytes, ..dev })
    }

    /// Deletes a block device and its data; durable when this returns.
    pub async fn delete_block_device(&self, name: &str) -> Result<(), FsError> {
        self.block_device(name).await?;
        self.unlink(&Caller::root(), self.nbd_dir, name.as_bytes())
            .await?;
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
}
