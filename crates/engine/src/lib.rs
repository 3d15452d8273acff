//! The bucketfs storage engine: file data in sealed extents inside immutable log objects,
//! metadata replayed from those objects and checkpoints, one flush barrier with group commit.
//! It knows nothing of POSIX: files are inode numbers with extents, plus key-value pairs that
//! the filesystem core gives meaning to.

pub mod bucket;
pub mod bulk;
mod cache;
mod cadence;
mod crypto;
mod engine;
mod extent_buffers;
mod frame;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod histogram;
mod lease;
pub mod limits;
mod logobj;
mod lsm;
mod meta;
mod object_buffer;
mod tasks;
mod tuning;

pub use crypto::{Cipher, KdfCost, KeyError, FORMAT_VERSION};
pub use engine::{
    change_password, check_checkpoint_name, prefix_end, BarrierLatency, BarrierPart,
    CheckpointInfo, Engine, EngineError, EngineOptions, EngineStats, Expect, Fill, FsckProblem,
    FsckReport, KvChange, OutageSide, Scope, StoreOutage, Txn, SUPERBLOCK_KEY,
};
pub use frame::Codec;
pub use lease::LeaseError;
pub use tasks::TaskSet;
pub use tuning::Tuning;
