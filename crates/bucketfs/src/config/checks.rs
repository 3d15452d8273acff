//! Stages 2 and 4 of loading: every key is one of keys.rs, and every value passes the check
//! declared with its key. The value checks themselves are here too.

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use toml::{Table, Value};

use super::keys::{self, Check};
use super::{
    join_key, negative_size_message, Compression, ConfigError, TlsMode, ALLOW_COMMON_NAME_PREFIX,
    UNIX_SOCKET_PATH_BYTES_MAX,
};
use crate::size::parse_size;

/// Checks one value after substitution; the message says what was expected and what was found.
pub(super) type CheckFn = fn(&Value) -> Result<(), String>;

/// Stage 2: every key is known, and every table is a table. `prefix` is the dotted path of
/// `table` ("" for the whole file).
pub(super) fn check_keys(table: &Table, prefix: &str, origin: &Path) -> Result<(), ConfigError> {
    for (name, value) in table {
        let dotted = join_key(prefix, name);
        if keys::find(&dotted).is_some() {
            continue;
        }
        if !keys::is_table(&dotted) {
            return Err(ConfigError::UnknownKey {
                path: origin.to_path_buf(),
                key: dotted,
                expected: keys::names_in(prefix),
            });
        }
        match value {
            Value::Table(child) => check_keys(child, &dotted, origin)?,
            other => {
                return Err(ConfigError::InvalidValue {
                    path: origin.to_path_buf(),
                    message: format!("expected a table ([{dotted}]), found {}", describe(other)),
                    key: dotted,
                })
            }
        }
    }
    Ok(())
}

/// Stage 4: every value that is set passes its check, in the order of the key table. Runs
/// after `check_keys`, so every key is known and every table a table.
pub(super) fn check_values(root: &Table, origin: &Path) -> Result<(), ConfigError> {
    let invalid = |key: String, message: String| ConfigError::InvalidValue {
        path: origin.to_path_buf(),
        key,
        message,
    };
    for key in keys::keys() {
        let Some(value) = keys::lookup(root, &key.path) else {
            continue;
        };
        let dotted = key.path.to_string();
        match (key.check, value) {
            (Check::One(check), value) => {
                check(value).map_err(|message| invalid(dotted, message))?
            }
            (Check::Each(check), Value::Array(items)) => {
                for (index, item) in items.iter().enumerate() {
                    check(item)
                        .map_err(|message| invalid(format!("{dotted}[{index}]"), message))?;
                }
            }
            (Check::Each(_), other) => {
                let message = format!("expected an array, found {}", describe(other));
                return Err(invalid(dotted, message));
            }
        }
    }
    Ok(())
}

/// A value as an error message shows it: `string "x"`, `integer 5`, `a table`.
fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => format!("string {text:?}"),
        Value::Integer(number) => format!("integer {number}"),
        Value::Float(number) => format!("float {number}"),
        Value::Boolean(flag) => format!("boolean {flag}"),
        Value::Datetime(datetime) => format!("datetime {datetime}"),
        Value::Array(_) => "an array".to_string(),
        Value::Table(_) => "a table".to_string(),
    }
}

fn expect_string<'v>(value: &'v Value, expected: &str) -> Result<&'v str, String> {
    match value {
        Value::String(text) => Ok(text),
        other => Err(format!("expected {expected}, found {}", describe(other))),
    }
}

pub(super) fn check_string(value: &Value) -> Result<(), String> {
    expect_string(value, "a string").map(|_| ())
}

pub(super) fn check_bool(value: &Value) -> Result<(), String> {
    match value {
        Value::Boolean(_) => Ok(()),
        other => Err(format!("expected true or false, found {}", describe(other))),
    }
}

pub(super) fn check_path(value: &Value) -> Result<(), String> {
    match expect_string(value, "a path")? {
        "" => Err("expected a path, found an empty string".to_string()),
        _ => Ok(()),
    }
}

pub(super) fn check_unix_socket(value: &Value) -> Result<(), String> {
    check_path(value)?;
    let path = expect_string(value, "a path")?;
    if path.len() > UNIX_SOCKET_PATH_BYTES_MAX {
        return Err(format!(
            "a unix socket path can be at most {UNIX_SOCKET_PATH_BYTES_MAX} bytes long; \
             this one is {} bytes",
            path.len()
        ));
    }
    Ok(())
}

pub(super) fn check_compression(value: &Value) -> Result<(), String> {
    let name = expect_string(value, "one of zstd, lz4, none")?;
    Compression::from_str(name).map(|_| ())
}

pub(super) fn check_flush_interval(value: &Value) -> Result<(), String> {
    match value {
        Value::Integer(ms) if *ms > 0 => Ok(()),
        Value::Integer(ms) => Err(format!(
            "expected a positive number of milliseconds, found {ms}"
        )),
        other => Err(format!(
            "expected a positive integer number of milliseconds, found {}",
            describe(other)
        )),
    }
}

pub(super) fn check_positive_seconds(value: &Value) -> Result<(), String> {
    match value {
        Value::Integer(s) if *s > 0 => Ok(()),
        other => Err(format!(
            "expected a positive integer number of seconds, found {}",
            describe(other)
        )),
    }
}

pub(super) fn check_count(value: &Value) -> Result<(), String> {
    match value {
        Value::Integer(count) if *count >= 0 => Ok(()),
        other => Err(format!(
            "expected a non-negative integer, found {}",
            describe(other)
        )),
    }
}

pub(super) fn check_size(value: &Value) -> Result<(), String> {
    match value {
        Value::Integer(bytes) if *bytes < 0 => Err(negative_size_message(*bytes)),
        Value::Integer(_) => Ok(()),
        Value::String(text) => parse_size(text).map(|_| ()),
        other => Err(format!(
            "expected a size such as \"10GiB\" or an integer number of bytes, found {}",
            describe(other)
        )),
    }
}

pub(super) fn check_socket_address(value: &Value) -> Result<(), String> {
    const EXPECTED: &str = "an IP address and port such as \"127.0.0.1:10809\" or \"[::1]:10809\"";
    let text = expect_string(value, EXPECTED)?;
    match text.parse::<SocketAddr>() {
        Ok(_) => Ok(()),
        Err(_) => Err(format!(
            "expected {EXPECTED} (host names are not resolved), found {text:?}"
        )),
    }
}

const STORAGE_URL_FORMS: &str = "s3://bucket/prefix, gs://bucket/prefix, \
    az://container/prefix, file:///absolute/path, file://./relative/path or memory://";

/// The URL forms the object-store layer understands. Checked here so that a mistake is
/// reported against the key at startup, not as an obscure failure at first I/O.
pub(super) fn check_storage_url(value: &Value) -> Result<(), String> {
    let url = expect_string(value, "a URL")?;
    let bad = |why: &str| Err(format!("{why} in {url:?}; expected {STORAGE_URL_FORMS}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return bad("no scheme");
    };
    match scheme {
        "s3" | "gs" | "az" => {
            let bucket = rest.split('/').next().unwrap_or_default();
            if bucket.is_empty() {
                return bad(if scheme == "az" {
                    "no container name"
                } else {
                    "no bucket name"
                });
            }
            if url.chars().any(char::is_whitespace) {
                return bad("whitespace");
            }
            Ok(())
        }
        "file" => {
            if rest.starts_with('/') || rest.starts_with("./") || rest.starts_with("../") {
                Ok(())
            } else {
                bad("a file URL needs an absolute path (file:///path) or one starting with ./")
            }
        }
        "memory" if rest.is_empty() => Ok(()),
        "memory" => bad("memory:// takes nothing after it"),
        _ => bad(&format!("unsupported scheme {scheme:?}")),
    }
}

pub(super) fn check_tls_mode(value: &Value) -> Result<(), String> {
    let name = expect_string(value, "one of off, optional, required")?;
    TlsMode::from_str(name).map(|_| ())
}

/// Shorter tokens can be guessed by trying; 16 random characters cannot.
pub(super) const ADMIN_TOKEN_CHARS_MIN: usize = 16;

pub(super) fn check_token(value: &Value) -> Result<(), String> {
    let token = expect_string(value, "a string")?;
    let chars = token.chars().count();
    if chars < ADMIN_TOKEN_CHARS_MIN {
        return Err(format!(
            "a token needs at least {ADMIN_TOKEN_CHARS_MIN} characters, this one has {chars}"
        ));
    }
    Ok(())
}

/// `{ "CN=name" = ["export", ...], ... }`: the identity form is spelled out so that other
/// forms (a certificate fingerprint, say) can be added later without ambiguity.
pub(super) fn check_allow(value: &Value) -> Result<(), String> {
    const EXPECTED: &str =
        "a table such as { \"CN=alice\" = [\"disk1\"] } (certificate name = export names)";
    let Value::Table(entries) = value else {
        return Err(format!("expected {EXPECTED}, found {}", describe(value)));
    };
    for (identity, exports) in entries {
        match identity.strip_prefix(ALLOW_COMMON_NAME_PREFIX) {
            Some(name) if !name.is_empty() => {}
            _ => {
                return Err(format!(
                    "entry {identity:?}: expected a certificate name written \
                     \"{ALLOW_COMMON_NAME_PREFIX}name\""
                ))
            }
        }
        let Value::Array(names) = exports else {
            return Err(format!(
                "entry {identity:?}: expected an array of export names, found {}",
                describe(exports)
            ));
        };
        for name in names {
            match name {
                Value::String(name) if !name.is_empty() => {}
                other => {
                    return Err(format!(
                        "entry {identity:?}: expected export names (or \"*\"), found {}",
                        describe(other)
                    ))
                }
            }
        }
    }
    Ok(())
}

/// An entry of `servers.nfs.exports`: a table with `path` and any of `read_only`, `clients`
/// and `root_squash`; each field's error names it.
pub(super) fn check_export(value: &Value) -> Result<(), String> {
    const FIELDS: &str = "path, read_only, clients, root_squash";
    let Value::Table(fields) = value else {
        return Err(format!(
            "expected a table such as {{ path = \"/\", clients = [\"10.0.0.0/8\"] }}, \
             found {}",
            describe(value)
        ));
    };
    for (name, field) in fields {
        match name.as_str() {
            "path" => {
                let path = expect_string(field, "an absolute path such as \"/home\"")
                    .map_err(|m| format!("path: {m}"))?;
                bucketfs_nfs::export::normal_path(path).map_err(|m| format!("path: {m}"))?;
            }
            "read_only" | "root_squash" => {
                if !matches!(field, Value::Boolean(_)) {
                    return Err(format!(
                        "{name}: expected true or false, found {}",
                        describe(field)
                    ));
                }
            }
            "clients" => {
                const EXPECTED: &str = "an array of \"*\", addresses and networks";
                let Value::Array(items) = field else {
                    return Err(format!(
                        "clients: expected {EXPECTED}, found {}",
                        describe(field)
                    ));
                };
                let mut clients = Vec::with_capacity(items.len());
                for item in items {
                    let text =
                        expect_string(item, EXPECTED).map_err(|m| format!("clients: {m}"))?;
                    clients.push(text.to_string());
                }
                bucketfs_nfs::export::parse_clients(&clients)
                    .map_err(|m| format!("clients: {m}"))?;
            }
            other => return Err(format!("unknown key {other:?} (an export takes {FIELDS})")),
        }
    }
    if !fields.contains_key("path") {
        return Err("path is missing: every export names the directory it exports".into());
    }
    Ok(())
}

/// An entry of `storage.journal.targets`: a table with `path` (a local directory) or `url` (an
/// object store) and, with `url`, an optional `endpoint`.
pub(super) fn check_journal_target(value: &Value) -> Result<(), String> {
    const FIELDS: &str = "path, or url and endpoint";
    let Value::Table(fields) = value else {
        return Err(format!(
            "expected a table such as {{ path = \"/var/lib/bucketfs/journal\" }} or \
             {{ url = \"s3://zonal-bucket/journal\" }}, found {}",
            describe(value)
        ));
    };
    for (name, field) in fields {
        match name.as_str() {
            "path" => check_path(field).map_err(|m| format!("path: {m}"))?,
            "url" => check_storage_url(field).map_err(|m| format!("url: {m}"))?,
            "endpoint" => check_string(field).map_err(|m| format!("endpoint: {m}"))?,
            other => {
                return Err(format!(
                    "unknown key {other:?} (a journal target takes {FIELDS})"
                ))
            }
        }
    }
    match (fields.contains_key("path"), fields.contains_key("url")) {
        (true, false) if fields.contains_key("endpoint") => {
            Err("endpoint goes with url, not with path".into())
        }
        (true, false) | (false, true) => Ok(()),
        (true, true) => {
            Err("give either path (a local directory) or url (an object store), not both".into())
        }
        (false, false) => Err(
            "path or url is missing: every target names a local directory or an object store"
                .into(),
        ),
    }
}
