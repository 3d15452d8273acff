//! Metadata as immutable sorted runs in the bucket (docs/0003-metadata-lsm.md, option B).
//!
//! A run holds point entries (a value, or a deletion) in key order and range deletions. Runs are
//! ordered newest first. Within a run, point entries are newer than the run's own range
//! deletions (a batch applies a range deletion to what it holds already, so what it still holds
//! in that range was written after it); a run's range deletions hide only older runs.
//!
//! Checkpoints write runs and manifests (engine/checkpoint.rs); opening reads them whole into
//! the in-memory map (engine/recovery.rs). Reading them on demand, with bounded memory, is the
//! next step (docs/0003).

pub mod cache;
pub mod merge;
pub mod ranges;
pub mod run;

pub use ranges::RangeSet;

/// What a run says about one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Put(Vec<u8>),
    Delete,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RunError {
    #[error("{key}: not a run object (bad magic or length)")]
    Malformed { key: String },
    #[error("{key}: block {block} failed authentication (corrupted, or sealed with another key)")]
    Authentication { key: String, block: u64 },
    #[error("{key}: block {block} is malformed: {why}")]
    Block {
        key: String,
        block: u64,
        why: &'static str,
    },
    #[error(transparent)]
    Store(#[from] crate::bucket::StoreError),
}

/// The changes of one interval gathered for a new run, in the order they were made: a range
/// deletion removes what the interval itself wrote in its range, so what the run keeps in that
/// range is newer than the deletion (the rule above).
#[derive(Debug, Default, Clone)]
pub struct MemRun {
    pub points: std::collections::BTreeMap<Vec<u8>, Entry>,
    /// The range deletions, as the keys they cover.
    pub ranges: RangeSet,
}

impl MemRun {
    #[cfg(test)]
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.points.insert(key, Entry::Put(value));
    }

    #[cfg(test)]
    pub fn delete(&mut self, key: Vec<u8>) {
        self.points.insert(key, Entry::Delete);
    }

    #[cfg(test)]
    pub fn delete_range(&mut self, start: Vec<u8>, end: Vec<u8>) {
        if start >= end {
            return;
        }
        let doomed: Vec<Vec<u8>> = self
            .points
            .range(start.clone()..end.clone())
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.points.remove(&k);
        }
        self.ranges.insert(start, end);
    }
}

#[cfg(test)]
mod tests;
