//! What the NBD server needs from the layer below it. The server parses and validates every
//! client field (ranges, flags, read-only) before calling in here, so implementations may assume
//! `offset + length <= size()` and a non-read-only export for mutating calls.

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;

/// Errors an export can report; the server maps each to the NBD error code of the same meaning.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ExportError {
    #[error("no such export")]
    NotFound,
    #[error("input/output error: {0}")]
    Io(String),
    #[error("no space left: {0}")]
    NoSpace(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("operation not permitted: {0}")]
    Permission(String),
    #[error("operation not supported: {0}")]
    NotSupported(String),
}

/// One run of the `base:allocation` metadata context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub length: u32,
    /// true: no storage is allocated (NBD_STATE_HOLE); such ranges always read as zeroes.
    pub hole: bool,
    /// true: the range reads as zeroes (NBD_STATE_ZERO).
    pub zero: bool,
}

/// An export as listed by NBD_OPT_LIST and NBD_OPT_INFO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    pub name: String,
    pub description: String,
}

/// The set of exports a server offers.
#[async_trait]
pub trait Exports: Send + Sync + 'static {
    async fn list(&self) -> Result<Vec<ExportSummary>, ExportError>;
    /// Opens an export for one connection; the size seen by that connection is fixed at open.
    async fn open(&self, name: &str) -> Result<Arc<dyn Export>, ExportError>;
}

/// An open block device. All methods may be called concurrently from many connections.
#[async_trait]
pub trait Export: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn read_only(&self) -> bool;
    async fn read(&self, offset: u64, length: u32) -> Result<Bytes, ExportError>;
    /// With `fua`, returns only after this write (and every write acknowledged before) is durable.
    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Returns only after every write completed before the call is durable, whatever the
    /// connection it arrived on.
    async fn flush(&self) -> Result<(), ExportError>;
    /// Deallocates what it can of the range; the range reads as zeroes afterwards.
    async fn trim(&self, offset: u64, length: u32, fua: bool) -> Result<(), ExportError>;
    /// Makes the range read as zeroes. `may_punch` is false when the client sent NO_HOLE.
    async fn write_zeroes(
        &self,
        offset: u64,
        length: u32,
        may_punch: bool,
        fua: bool,
    ) -> Result<(), ExportError>;
    /// Whether write_zeroes is fast (no data written) for this range; used for FAST_ZERO.
    fn zeroes_are_fast(&self, may_punch: bool) -> bool;
    /// Hint: the client will read this range soon.
    async fn cache(&self, offset: u64, length: u32) -> Result<(), ExportError>;
    /// Allocation status covering at least the first byte of the range and at most `length`
    /// bytes; consecutive entries have different flags.
    async fn block_status(&self, offset: u64, length: u32) -> Result<Vec<Extent>, ExportError>;
}
