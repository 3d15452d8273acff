//! The library half of the bucketfs binary: its configuration, so that the fuzz target of the
//! config parser (fuzz/fuzz_targets/config_parser.rs) parses exactly what `bucketfs run` does.

pub mod config;
pub mod size;
