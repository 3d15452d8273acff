//! The engine's integration tests, as one binary: each test binary links the whole engine, which
//! in a release build (fat LTO) costs about a minute of CPU, so separate binaries made most of
//! `cargo test --release`'s time. The crash test (../crash.rs) stays on its own, run by name.

mod basics;
mod caches;
mod checkpoint;
mod collector;
mod common;
mod compaction;
mod fsck;
mod journal_tier;
mod local_bucket;
mod metrics;
mod outage;
mod scoped;
mod txn;
mod uploads;
