//! Stages 2 and 4 of loading: the known keys, and a check for each value. The schema mirrors
//! the structs of the parent module; the template tests fail if the two disagree.

use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;

use toml::{Table, Value};

use super::{
    join_key, negative_size_message, Compression, ConfigError, UNIX_SOCKET_PATH_BYTES_MAX,
};
use crate::size::parse_size;

/// Checks one value after substitution; the message says what was expected and what was found.
pub(super) type Check = fn(&Value) -> Result<(), String>;

pub(super) enum Node {
    Table(&'static [(&'static str, Node)]),
    Leaf(Check),
    /// An array whose every element passes the check; errors name `key[index]`.
    List(Check),
}

pub(super) const SCHEMA: &[(&str, Node)] = &[
    (
        "storage",
        Node::Table(&[
            ("url", Node::Leaf(check_storage_url)),
            ("encryption_password", Node::Leaf(check_string)),
            ("compression", Node::Leaf(check_compression)),
            ("flush_interval_ms", Node::Leaf(check_flush_interval)),
        ]),
    ),
    (
        "cache",
        Node::Table(&[
            ("dir", Node::Leaf(check_path)),
            ("disk_bytes_max", Node::Leaf(check_size)),
            ("memory_bytes_max", Node::Leaf(check_size)),
        ]),
    ),
    (
        "aws",
        Node::Table(&[
            ("access_key_id", Node::Leaf(check_string)),
            ("secret_access_key", Node::Leaf(check_string)),
            ("session_token", Node::Leaf(check_string)),
            ("region", Node::Leaf(check_string)),
            ("endpoint", Node::Leaf(check_string)),
            ("allow_http", Node::Leaf(check_bool)),
        ]),
    ),
    (
        "gcp",
        Node::Table(&[
            ("service_account_path", Node::Leaf(check_string)),
            ("service_account_key", Node::Leaf(check_string)),
        ]),
    ),
    (
        "azure",
        Node::Table(&[
            ("account_name", Node::Leaf(check_string)),
            ("access_key", Node::Leaf(check_string)),
            ("endpoint", Node::Leaf(check_string)),
            ("allow_http", Node::Leaf(check_bool)),
            ("use_emulator", Node::Leaf(check_bool)),
        ]),
    ),
    (
        "servers",
        Node::Table(&[(
            "nbd",
            Node::Table(&[
                ("listen", Node::List(check_socket_address)),
                ("unix_socket", Node::Leaf(check_unix_socket)),
            ]),
        )]),
    ),
    (
        "admin",
        Node::Table(&[("listen", Node::Leaf(check_socket_address))]),
    ),
];

/// Stage 2: every key is known, and every section is a table.
pub(super) fn check_keys(
    table: &Table,
    schema: &[(&'static str, Node)],
    prefix: &str,
    origin: &Path,
) -> Result<(), ConfigError> {
    for (key, value) in table {
        let dotted = join_key(prefix, key);
        let Some((_, node)) = schema.iter().find(|(name, _)| name == key) else {
            return Err(ConfigError::UnknownKey {
                path: origin.to_path_buf(),
                key: dotted,
                expected: schema.iter().map(|(name, _)| *name).collect(),
            });
        };
        if let Node::Table(children) = node {
            match value {
                Value::Table(child) => check_keys(child, children, &dotted, origin)?,
                other => {
                    return Err(ConfigError::InvalidValue {
                        path: origin.to_path_buf(),
                        message: format!(
                            "expected a table ([{dotted}]), found {}",
                            describe(other)
                        ),
                        key: dotted,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Stage 4: every value passes its check. Runs after `check_keys`, so every key is known.
pub(super) fn check_values(
    table: &Table,
    schema: &[(&'static str, Node)],
    prefix: &str,
    origin: &Path,
) -> Result<(), ConfigError> {
    let invalid = |key: String, message: String| ConfigError::InvalidValue {
        path: origin.to_path_buf(),
        key,
        message,
    };
    for (name, node) in schema {
        let Some(value) = table.get(*name) else {
            continue;
        };
        let dotted = join_key(prefix, name);
        match (node, value) {
            (Node::Table(children), Value::Table(child)) => {
                check_values(child, children, &dotted, origin)?
            }
            (Node::Table(_), other) => {
                let message = format!("expected a table ([{dotted}]), found {}", describe(other));
                return Err(invalid(dotted, message));
            }
            (Node::Leaf(check), value) => {
                check(value).map_err(|message| invalid(dotted, message))?
            }
            (Node::List(check), Value::Array(items)) => {
                for (index, item) in items.iter().enumerate() {
                    check(item)
                        .map_err(|message| invalid(format!("{dotted}[{index}]"), message))?;
                }
            }
            (Node::List(_), other) => {
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

fn check_string(value: &Value) -> Result<(), String> {
    expect_string(value, "a string").map(|_| ())
}

fn check_bool(value: &Value) -> Result<(), String> {
    match value {
        Value::Boolean(_) => Ok(()),
        other => Err(format!("expected true or false, found {}", describe(other))),
    }
}

fn check_path(value: &Value) -> Result<(), String> {
    match expect_string(value, "a path")? {
        "" => Err("expected a path, found an empty string".to_string()),
        _ => Ok(()),
    }
}

fn check_unix_socket(value: &Value) -> Result<(), String> {
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

fn check_compression(value: &Value) -> Result<(), String> {
    let name = expect_string(value, "one of zstd, lz4, none")?;
    Compression::from_str(name).map(|_| ())
}

fn check_flush_interval(value: &Value) -> Result<(), String> {
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

fn check_size(value: &Value) -> Result<(), String> {
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

fn check_socket_address(value: &Value) -> Result<(), String> {
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
fn check_storage_url(value: &Value) -> Result<(), String> {
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
