//! The engine's errors.

use super::*;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("corrupted object: {0}")]
    Corrupt(String),
    #[error("the bucket is open read-only")]
    ReadOnly,
    #[error("the bucket has no bucketfs filesystem yet; start a writer once to create it")]
    NotInitialised,
    #[error("transaction not applied: key {key} is not {expected}")]
    Conflict { key: String, expected: String },
    #[error("invalid checkpoint name {0:?}: 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'")]
    BadCheckpointName(String),
    #[error("a checkpoint named {0:?} exists already")]
    CheckpointExists(String),
    #[error("no checkpoint named {0:?} (`bucketfs checkpoint list` shows them)")]
    NoSuchCheckpoint(String),
    #[error("checkpoint {0:?} can only be served read-only")]
    CheckpointIsReadOnly(String),
    #[error("nothing has been written to the bucket yet: there is nothing to checkpoint")]
    NothingToCheckpoint,
    #[error("writes are refused after a failure on the durable path: {0}; restart bucketfs")]
    Poisoned(String),
}

impl From<crate::lsm::RunError> for EngineError {
    fn from(e: crate::lsm::RunError) -> Self {
        match e {
            crate::lsm::RunError::Store(e) => EngineError::Store(e),
            other => EngineError::Corrupt(other.to_string()),
        }
    }
}

impl From<ObjectError> for EngineError {
    fn from(e: ObjectError) -> Self {
        EngineError::Corrupt(e.to_string())
    }
}
