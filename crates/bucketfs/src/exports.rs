//! The block devices of the filesystem as NBD exports, and the one place where filesystem
//! errors become NBD errors.

use async_trait::async_trait;
use bucketfs_engine::EngineError;
use bucketfs_fs::{Fs, FsError};
use bucketfs_nbd::{Export, ExportError, ExportSummary, Exports, Extent};
use bytes::Bytes;
use std::sync::Arc;

pub struct BlockDevices {
    pub fs: Arc<Fs>,
}

pub fn fs_error_message(e: FsError) -> String {
    e.to_string()
}

fn to_export_error(e: FsError) -> ExportError {
    let msg = e.to_string();
    match e {
        FsError::OutOfRange { .. } | FsError::InvalidName(_) | FsError::Invalid(_) => {
            ExportError::Invalid(msg)
        }
        FsError::TooLarge(_) | FsError::NoSpace => ExportError::NoSpace(msg),
        FsError::Engine(EngineError::ReadOnly) | FsError::Access | FsError::NotPermitted => {
            ExportError::Permission(msg)
        }
        FsError::NotFound(_)
        | FsError::Exists(_)
        | FsError::Damaged(..)
        | FsError::NotDir
        | FsError::IsDir
        | FsError::NotEmpty
        | FsError::NoXattr
        | FsError::NotSupported(_) => ExportError::Io(msg),
        FsError::Engine(_) => {
            tracing::error!(error = %msg, "block device I/O failed");
            ExportError::Io(msg)
        }
    }
}

#[async_trait]
impl Exports for BlockDevices {
    async fn list(&self) -> Result<Vec<ExportSummary>, ExportError> {
        let devs = self.fs.block_devices().await.map_err(to_export_error)?;
        Ok(devs
            .into_iter()
            .map(|d| ExportSummary {
                description: format!("bucketfs block device /.nbd/{}", d.name),
                name: d.name,
            })
            .collect())
    }

    async fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError> {
        let dev = match self.fs.block_device(name).await {
            Ok(d) => d,
            Err(FsError::NotFound(_)) => return Err(ExportError::NotFound),
            Err(e) => return Err(to_export_error(e)),
        };
        Ok(Arc::new(BlockDevice {
            fs: self.fs.clone(),
            ino: dev.ino,
            size_bytes: dev.size_bytes,
            read_only: self.fs.engine().read_only(),
        }))
    }
}

struct BlockDevice {
    fs: Arc<Fs>,
    ino: u64,
    size_bytes: u64,
    read_only: bool,
}

impl BlockDevice {
    async fn after_write(&self, fua: bool) -> Result<(), ExportError> {
        if fua {
            self.fs.sync().await.map_err(to_export_error)?;
        }
        Ok(())
    }
}

#[async_trait]
impl Export for BlockDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    async fn read(&self, offset: u64, length: u32) -> Result<Bytes, ExportError> {
        self.fs
            .read(self.ino, offset, length as usize)
            .await
            .map(Bytes::from)
            .map_err(to_export_error)
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.fs
            .write(self.ino, offset, data)
            .await
            .map_err(to_export_error)?;
        self.after_write(fua).await
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.fs.sync().await.map_err(to_export_error)
    }

    async fn trim(&self, offset: u64, length: u32, fua: bool) -> Result<(), ExportError> {
        self.fs
            .zero(self.ino, offset, u64::from(length), true)
            .await
            .map_err(to_export_error)?;
        self.after_write(fua).await
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        may_punch: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        self.fs
            .zero(self.ino, offset, u64::from(length), may_punch)
            .await
            .map_err(to_export_error)?;
        self.after_write(fua).await
    }

    fn zeroes_are_fast(&self, may_punch: bool) -> bool {
        // Punching only edits the extent map; writing zero extents costs a frame each.
        may_punch
    }

    async fn cache(&self, offset: u64, length: u32) -> Result<(), ExportError> {
        self.fs
            .read(self.ino, offset, length as usize)
            .await
            .map(drop)
            .map_err(to_export_error)
    }

    async fn block_status(&self, offset: u64, length: u32) -> Result<Vec<Extent>, ExportError> {
        let runs = self
            .fs
            .allocation(self.ino, offset, u64::from(length))
            .await
            .map_err(to_export_error)?;
        Ok(runs
            .into_iter()
            .map(|(len, allocated)| Extent {
                length: len as u32,
                hole: !allocated,
                zero: !allocated,
            })
            .collect())
    }
}
