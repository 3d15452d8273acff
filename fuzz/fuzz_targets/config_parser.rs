//! What an operator (or a template gone wrong) can hand `bucketfs run -c FILE`: any text is
//! parsed into a configuration or rejected with an error naming the file, never a panic. `${VAR}`
//! references resolve to a value derived from the variable's name, so that substitution is
//! exercised too.
#![no_main]

use bucketfs::config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name.len() % 3 != 0).then(|| name.repeat(2));
    match Config::parse_with_env(text, Path::new("fuzz.toml"), &env) {
        Ok(config) => {
            let _ = config.exposure_warnings();
            let _ = config.admin_socket();
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("fuzz.toml"),
                "the error does not name the file: {message}"
            );
        }
    }
});
