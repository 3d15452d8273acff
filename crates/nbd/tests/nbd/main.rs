//! The NBD server's integration tests, as one binary: each test binary is a link of its own
//! (with fat LTO in release builds), so one binary of modules keeps `cargo test --release` short.

mod clients;
mod common;
mod raw;
mod stream;
mod tls;
