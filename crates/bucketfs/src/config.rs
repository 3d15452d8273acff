//! The configuration file: one TOML file that deserialises into plain structs.
//!
//! Loading runs in stages so that every error names the file and, when one is at fault, the
//! dotted key (`storage.compression`):
//!
//! 1. parse the text into a `toml::Table`; syntax errors carry a line and column;
//! 2. walk the table against [`SCHEMA`], rejecting unknown keys and misplaced tables;
//! 3. replace `${VAR}` in every string value with the environment variable `VAR`;
//! 4. check every value (type, range, format) against its schema entry;
//! 5. deserialise into [`Config`] with serde, then check rules that span several keys.
//!
//! Serde alone would reject the same files, but its messages do not say which key failed,
//! and substitution must see the parsed values (not the text) so that a missing variable can
//! be blamed on the key that uses it and a value cannot inject TOML syntax.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::{Table, Value};

use crate::size::parse_size;

/// Default bucket: a directory next to where bucketfs runs, so that a first `bucketfs run`
/// works without any cloud account.
pub const DEFAULT_STORAGE_URL: &str = "file://./bucketfs-data";
/// Default bound on the loss window for writes nobody fsynced: a few seconds, as promised in
/// DESIGN.md, while keeping idle uploads rare.
pub const DEFAULT_FLUSH_INTERVAL_MS: u64 = 2000;
pub const DEFAULT_CACHE_DIR: &str = "./bucketfs-cache";
pub const DEFAULT_CACHE_DISK_BYTES_MAX: u64 = 10 << 30;
pub const DEFAULT_CACHE_MEMORY_BYTES_MAX: u64 = 1 << 30;
/// NBD has no authentication, so by default it listens on loopback only. 10809 is the port
/// IANA assigned to NBD.
pub const DEFAULT_NBD_LISTEN: &str = "127.0.0.1:10809";
/// The admin endpoint has no authentication either, so it is loopback-only too.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:10810";
/// `sun_path` holds 108 bytes on Linux, one of them the terminating NUL.
pub const UNIX_SOCKET_PATH_BYTES_MAX: usize = 107;

/// What `bucketfs init` writes. Parsed with `BUCKETFS_PASSWORD` set, it equals
/// [`Config::embedded_default`] plus that password (tested below). Settings without a
/// default are present but commented out, with an example value.
pub const INIT_TEMPLATE: &str = r#"# bucketfs configuration, written by `bucketfs init`.
#
# Every setting is listed with its default value; settings that have no default are
# commented out, with an example. Unknown keys are errors, so a typo cannot go unnoticed.
# In any string, ${NAME} is replaced by the environment variable NAME when the file is
# loaded (write $${ for a literal ${), so secrets need not be stored in this file.
# Sizes are a number of bytes, or a number with a unit K, M, G or T (1K = 1024 bytes).

[storage]
# Where the filesystem and its block devices are kept: s3://bucket/prefix,
# gs://bucket/prefix, az://container/prefix, file:///absolute/path, file://./relative/path,
# or memory:// (nothing survives the process).
url = "file://./bucketfs-data"
# Protects the key that encrypts everything in the bucket; without it the data cannot be
# read. Taken from the environment so that it is not stored in this file.
encryption_password = "${BUCKETFS_PASSWORD}"
# Compression of file data before encryption: zstd (smaller), lz4 (faster) or none.
# Recorded per extent, so a change applies to new writes and old data stays readable.
# With zstd, what clients wait on while they fsync several times a second or more (every
# commit, or a database's WAL writer) is sealed with lz4: about three times as fast, for up
# to twice the bytes; what stays of it in small objects is rewritten later, with zstd.
compression = "zstd"
# Writes that nobody fsynced are uploaded at least this often (milliseconds); a crash can
# lose only writes that are younger than this and were never flushed.
flush_interval_ms = 2000

[cache]
# Local cache directory. It holds copies of bucket data only: deleting it loses nothing.
dir = "./bucketfs-cache"
# Upper bound on the disk cache, which keeps data as stored (compressed and encrypted).
# Not used for file:// buckets, which are on local disk already.
disk_bytes_max = "10GiB"
# Upper bound on the memory cache of decoded data and metadata.
memory_bytes_max = "1GiB"

# Credentials and endpoint for s3:// URLs (Amazon S3, MinIO, Hetzner, R2, ...).
[aws]
# Access key id of the credentials.
# access_key_id = "${AWS_ACCESS_KEY_ID}"
# Secret access key of the credentials.
# secret_access_key = "${AWS_SECRET_ACCESS_KEY}"
# Session token, for temporary credentials only.
# session_token = "${AWS_SESSION_TOKEN}"
# Region of the bucket.
# region = "us-east-1"
# Endpoint of an S3-compatible service; unset means Amazon S3 itself.
# endpoint = "http://127.0.0.1:9000"
# Allow a plain http:// endpoint, for a test server; requests then go without TLS.
# allow_http = false

# Credentials for gs:// URLs (Google Cloud Storage).
[gcp]
# Path of a service-account JSON key file.
# service_account_path = "/etc/bucketfs/gcs-service-account.json"
# The same JSON key given inline, usually from the environment.
# service_account_key = "${GCP_SERVICE_ACCOUNT_KEY}"

# Credentials and endpoint for az:// URLs (Azure Blob Storage).
[azure]
# Name of the storage account.
# account_name = "mystorageaccount"
# Shared access key of the storage account.
# access_key = "${AZURE_STORAGE_ACCESS_KEY}"
# Endpoint other than the public Azure cloud.
# endpoint = "http://127.0.0.1:10000/devstoreaccount1"
# Allow a plain http:// endpoint, for a test server; requests then go without TLS.
# allow_http = false
# Use the local Azurite emulator and its well-known development account.
# use_emulator = false

[servers.nbd]
# TCP addresses of the NBD server; [] turns TCP off. NBD has no authentication: anyone who
# can connect can read and write every block device, so keep it on loopback unless the
# network is trusted.
listen = ["127.0.0.1:10809"]
# Unix socket of the NBD server, where file permissions control access; unset means none.
# unix_socket = "/run/bucketfs/nbd.sock"

[admin]
# Address of the admin endpoint that the CLI (`bucketfs nbd create ...`) talks to. It has no
# authentication either, so keep it on loopback.
listen = "127.0.0.1:10810"
"#;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub storage: StorageConfig,
    pub cache: CacheConfig,
    pub aws: AwsConfig,
    pub gcp: GcpConfig,
    pub azure: AzureConfig,
    pub servers: ServersConfig,
    pub admin: AdminConfig,
}

#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `s3://`, `gs://`, `az://`, `file://` or `memory://`; checked by [`check_storage_url`].
    pub url: String,
    pub encryption_password: Option<String>,
    pub compression: Compression,
    /// Always positive.
    pub flush_interval_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    pub dir: PathBuf,
    #[serde(deserialize_with = "deserialize_size")]
    pub disk_bytes_max: u64,
    #[serde(deserialize_with = "deserialize_size")]
    pub memory_bytes_max: u64,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsConfig {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub allow_http: Option<bool>,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcpConfig {
    pub service_account_path: Option<String>,
    pub service_account_key: Option<String>,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AzureConfig {
    pub account_name: Option<String>,
    pub access_key: Option<String>,
    pub endpoint: Option<String>,
    pub allow_http: Option<bool>,
    pub use_emulator: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServersConfig {
    pub nbd: NbdServerConfig,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NbdServerConfig {
    /// Empty means no TCP listener.
    pub listen: Vec<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    pub listen: SocketAddr,
}

/// Codec for file data before it is sealed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    #[default]
    Zstd,
    Lz4,
    None,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read the config file: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: invalid TOML: {message}", position(path, *line_column))]
    Syntax {
        path: PathBuf,
        /// One-based line and column (in characters), when the parser knows them.
        line_column: Option<(usize, usize)>,
        message: String,
    },
    #[error("{}: unknown key `{key}` (expected one of: {})", path.display(), expected.join(", "))]
    UnknownKey {
        path: PathBuf,
        key: String,
        expected: Vec<&'static str>,
    },
    #[error("{}: {key}: environment variable {variable} is not set", path.display())]
    MissingEnvVar {
        path: PathBuf,
        key: String,
        variable: String,
    },
    #[error("{}: {key}: {message}", path.display())]
    InvalidValue {
        path: PathBuf,
        key: String,
        message: String,
    },
}

fn position(path: &Path, line_column: Option<(usize, usize)>) -> String {
    match line_column {
        Some((line, column)) => format!("{}:{line}:{column}", path.display()),
        None => path.display().to_string(),
    }
}

impl Config {
    /// Reads, substitutes `${VAR}` from the process environment, parses and validates.
    /// Logs a warning for each of [`Config::exposure_warnings`].
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let config = Config::parse(&text, path)?;
        for warning in config.exposure_warnings() {
            tracing::warn!(config = %path.display(), "{warning}");
        }
        Ok(config)
    }

    /// Like [`Config::load`] on `text`, without logging; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, origin, &|name| std::env::var(name).ok())
    }

    /// Like [`Config::parse`], with `${VAR}` looked up through `env` instead of the process
    /// environment.
    pub fn parse_with_env(
        text: &str,
        origin: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut root: Table =
            text.parse()
                .map_err(|error: toml::de::Error| ConfigError::Syntax {
                    path: origin.to_path_buf(),
                    line_column: error.span().map(|span| line_column(text, span.start)),
                    message: one_line(error.message()),
                })?;
        check_keys(&root, SCHEMA, "", origin)?;
        for (key, value) in root.iter_mut() {
            substitute_value(value, &join_key("", key), env, origin)?;
        }
        check_values(&root, SCHEMA, "", origin)?;
        let config: Config = Value::Table(root)
            .try_into()
            .map_err(|error: toml::de::Error| ConfigError::InvalidValue {
                // Unreachable while SCHEMA matches the structs (a test checks that), but a
                // mismatch must still come out as an error, not a panic.
                path: origin.to_path_buf(),
                key: "(file)".to_string(),
                message: one_line(error.message()),
            })?;
        config.check_relations(origin)?;
        Ok(config)
    }

    /// The configuration used when there is no file, and what an empty file means.
    pub fn embedded_default() -> Config {
        Config::default()
    }

    /// Settings that work but that the operator should know about, one sentence each.
    pub fn exposure_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for address in &self.servers.nbd.listen {
            if !address.ip().is_loopback() {
                warnings.push(format!(
                    "servers.nbd.listen: {address} is not a loopback address, and NBD has no \
                     authentication: anyone who can reach it can read and write every block device"
                ));
            }
        }
        if !self.admin.listen.ip().is_loopback() {
            warnings.push(format!(
                "admin.listen: {} is not a loopback address, and the admin endpoint has no \
                 authentication: anyone who can reach it can manage this server",
                self.admin.listen
            ));
        }
        if self.storage.url.starts_with("memory://") {
            warnings.push(
                "storage.url: memory:// keeps everything in this process; it is all lost when \
                 the process exits"
                    .to_string(),
            );
        }
        warnings
    }

    /// Rules that involve more than one value, checked after deserialisation.
    fn check_relations(&self, origin: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::InvalidValue {
            path: origin.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let listen = &self.servers.nbd.listen;
        for (index, address) in listen.iter().enumerate() {
            if let Some(earlier) = listen[..index].iter().find(|a| addresses_clash(a, address)) {
                return Err(invalid(
                    "servers.nbd.listen",
                    format!("{address} clashes with {earlier}, listed before it"),
                ));
            }
        }
        if let Some(nbd) = listen
            .iter()
            .find(|a| addresses_clash(a, &self.admin.listen))
        {
            return Err(invalid(
                "admin.listen",
                format!(
                    "{} clashes with {nbd} in servers.nbd.listen; give the admin endpoint a port \
                     of its own",
                    self.admin.listen
                ),
            ));
        }
        Ok(())
    }
}

/// Whether two listeners could not both bind: same port (0 picks a free one, so never
/// clashes), and the same address or a wildcard on either side.
fn addresses_clash(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            url: DEFAULT_STORAGE_URL.to_string(),
            encryption_password: None,
            compression: Compression::Zstd,
            flush_interval_ms: DEFAULT_FLUSH_INTERVAL_MS,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: PathBuf::from(DEFAULT_CACHE_DIR),
            disk_bytes_max: DEFAULT_CACHE_DISK_BYTES_MAX,
            memory_bytes_max: DEFAULT_CACHE_MEMORY_BYTES_MAX,
        }
    }
}

impl Default for NbdServerConfig {
    fn default() -> Self {
        NbdServerConfig {
            listen: vec![parse_default_address(DEFAULT_NBD_LISTEN)],
            unix_socket: None,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: parse_default_address(DEFAULT_ADMIN_LISTEN),
        }
    }
}

fn parse_default_address(text: &str) -> SocketAddr {
    text.parse()
        .expect("default listen addresses are valid literals (tested)")
}

// Secrets must not reach logs through `{:?}`, so the structs that hold them print only
// whether each secret is set.
const REDACTED: &str = "<redacted>";

fn redact(secret: &Option<String>) -> Option<&'static str> {
    secret.as_ref().map(|_| REDACTED)
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("url", &self.url)
            .field("encryption_password", &redact(&self.encryption_password))
            .field("compression", &self.compression)
            .field("flush_interval_ms", &self.flush_interval_ms)
            .finish()
    }
}

impl fmt::Debug for AwsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsConfig")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &redact(&self.secret_access_key))
            .field("session_token", &redact(&self.session_token))
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

impl fmt::Debug for GcpConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcpConfig")
            .field("service_account_path", &self.service_account_path)
            .field("service_account_key", &redact(&self.service_account_key))
            .finish()
    }
}

impl fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureConfig")
            .field("account_name", &self.account_name)
            .field("access_key", &redact(&self.access_key))
            .field("endpoint", &self.endpoint)
            .field("allow_http", &self.allow_http)
            .field("use_emulator", &self.use_emulator)
            .finish()
    }
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::None => "none",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "zstd" => Ok(Compression::Zstd),
            "lz4" => Ok(Compression::Lz4),
            "none" => Ok(Compression::None),
            _ => Err(format!("expected one of zstd, lz4, none, found {name:?}")),
        }
    }
}

impl<'de> Deserialize<'de> for Compression {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(de::Error::custom)
    }
}

/// A size is a TOML integer (bytes) or a string for [`parse_size`].
fn deserialize_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct SizeVisitor;

    impl Visitor<'_> for SizeVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a size: an integer number of bytes or a string such as \"10GiB\"")
        }

        fn visit_u64<E: de::Error>(self, bytes: u64) -> Result<u64, E> {
            Ok(bytes)
        }

        fn visit_i64<E: de::Error>(self, bytes: i64) -> Result<u64, E> {
            u64::try_from(bytes).map_err(|_| E::custom(negative_size_message(bytes)))
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<u64, E> {
            parse_size(text).map_err(E::custom)
        }
    }

    deserializer.deserialize_any(SizeVisitor)
}

fn negative_size_message(bytes: i64) -> String {
    format!("a size cannot be negative, found {bytes}")
}

// ---------------------------------------------------------------------------------------
// Schema: the known keys, and a check for each value. It mirrors the structs above; the
// template tests fail if the two disagree.

/// Checks one value after substitution; the message says what was expected and what was found.
type Check = fn(&Value) -> Result<(), String>;

enum Node {
    Table(&'static [(&'static str, Node)]),
    Leaf(Check),
    /// An array whose every element passes the check; errors name `key[index]`.
    List(Check),
}

const SCHEMA: &[(&str, Node)] = &[
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
fn check_keys(
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
fn check_values(
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

/// Stage 3: replaces `${VAR}` in every string in `value`, which sits at `key`.
fn substitute_value(
    value: &mut Value,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
    origin: &Path,
) -> Result<(), ConfigError> {
    match value {
        Value::String(text) => {
            *text = substitute(text, env).map_err(|error| match error {
                SubstituteError::Missing(variable) => ConfigError::MissingEnvVar {
                    path: origin.to_path_buf(),
                    key: key.to_string(),
                    variable,
                },
                SubstituteError::Malformed(message) => ConfigError::InvalidValue {
                    path: origin.to_path_buf(),
                    key: key.to_string(),
                    message,
                },
            })?;
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                substitute_value(item, &format!("{key}[{index}]"), env, origin)?;
            }
        }
        Value::Table(table) => {
            for (name, item) in table.iter_mut() {
                substitute_value(item, &join_key(key, name), env, origin)?;
            }
        }
        Value::Integer(_) | Value::Float(_) | Value::Boolean(_) | Value::Datetime(_) => {}
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum SubstituteError {
    Missing(String),
    Malformed(String),
}

/// Replaces each `${NAME}` with the variable's value and each `$${` with a literal `${`.
/// One pass: a value that itself contains `${` is kept as it is, not expanded again.
fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, SubstituteError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                return Err(SubstituteError::Malformed(
                    "`${` without a closing `}` (write `$${` for a literal `${`)".to_string(),
                ));
            };
            let name = &tail[..end];
            if !is_variable_name(name) {
                return Err(SubstituteError::Malformed(format!(
                    "`${{{name}}}` is not a valid environment variable name (letters, digits \
                     and _, not starting with a digit; write `$${{` for a literal `${{`)"
                )));
            }
            let value = env(name).ok_or_else(|| SubstituteError::Missing(name.to_string()))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `prefix.key`, with the key quoted as TOML would need it if it is not a bare key.
fn join_key(prefix: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let key = if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if prefix.is_empty() {
        key
    } else {
        format!("{prefix}.{key}")
    }
}

/// toml's messages can span lines ("invalid string\nexpected `"`"); an error is one line.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    lines.join("; ")
}

/// One-based line and column (in characters) of a byte offset in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
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

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: &str = "bucketfs.toml";

    fn env_with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    fn parse_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::parse_with_env(text, Path::new(ORIGIN), &env_with(vars))
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        parse_env(text, &[])
    }

    fn error(text: &str) -> String {
        error_env(text, &[])
    }

    fn error_env(text: &str, vars: &[(&str, &str)]) -> String {
        match parse_env(text, vars) {
            Ok(config) => panic!("expected an error for {text:?}, got {config:?}"),
            Err(error) => error.to_string(),
        }
    }

    /// Every dotted leaf key of the schema, e.g. `servers.nbd.listen`.
    fn schema_leaves(schema: &[(&str, Node)], prefix: &str, out: &mut Vec<String>) {
        for (name, node) in schema {
            let dotted = join_key(prefix, name);
            match node {
                Node::Table(children) => schema_leaves(children, &dotted, out),
                Node::Leaf(_) | Node::List(_) => out.push(dotted),
            }
        }
    }

    fn lookup<'v>(table: &'v Table, dotted: &str) -> Option<&'v Value> {
        let mut parts = dotted.split('.');
        let mut value = table.get(parts.next()?)?;
        for part in parts {
            value = value.as_table()?.get(part)?;
        }
        Some(value)
    }

    // --- defaults and the init template -------------------------------------------------

    #[test]
    fn empty_file_is_the_embedded_default() {
        assert_eq!(parse("").unwrap(), Config::embedded_default());
        assert_eq!(
            parse("\n# only a comment\n").unwrap(),
            Config::embedded_default()
        );
        assert_eq!(
            parse("[storage]\n[cache]\n[aws]\n[gcp]\n[azure]\n[servers.nbd]\n[admin]\n").unwrap(),
            Config::embedded_default()
        );
    }

    #[test]
    fn embedded_default_is_local_and_loopback_only() {
        let config = Config::embedded_default();
        assert_eq!(config.storage.url, "file://./bucketfs-data");
        assert_eq!(config.storage.encryption_password, None);
        assert_eq!(config.storage.compression, Compression::Zstd);
        assert_eq!(config.storage.flush_interval_ms, 2000);
        assert_eq!(config.cache.dir, PathBuf::from("./bucketfs-cache"));
        assert_eq!(config.cache.disk_bytes_max, 10 << 30);
        assert_eq!(config.cache.memory_bytes_max, 1 << 30);
        assert_eq!(
            config.servers.nbd.listen,
            vec![DEFAULT_NBD_LISTEN.parse().unwrap()]
        );
        assert_eq!(config.servers.nbd.unix_socket, None);
        assert_eq!(config.admin.listen, DEFAULT_ADMIN_LISTEN.parse().unwrap());
        assert!(config.exposure_warnings().is_empty());
        assert_eq!(config.aws, AwsConfig::default());
        assert_eq!(config.gcp, GcpConfig::default());
        assert_eq!(config.azure, AzureConfig::default());
    }

    #[test]
    fn init_template_parses_to_the_default_plus_password() {
        let config = parse_env(INIT_TEMPLATE, &[("BUCKETFS_PASSWORD", "hunter2")]).unwrap();
        let mut expected = Config::embedded_default();
        expected.storage.encryption_password = Some("hunter2".to_string());
        assert_eq!(config, expected);
    }

    #[test]
    fn init_template_without_password_variable_names_key_and_variable() {
        assert_eq!(
            error(INIT_TEMPLATE),
            "bucketfs.toml: storage.encryption_password: environment variable \
             BUCKETFS_PASSWORD is not set"
        );
    }

    /// Turns `# key = value` example lines into settings.
    fn uncomment_examples(template: &str) -> String {
        template
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if is_setting(rest) => rest,
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn is_setting(line: &str) -> bool {
        line.split_once(" = ").is_some_and(|(key, _)| {
            !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
    }

    #[test]
    fn init_template_lists_every_key_and_its_examples_are_valid() {
        let full = uncomment_examples(INIT_TEMPLATE);
        let any_variable = |_: &str| Some("from-env".to_string());
        let config = Config::parse_with_env(&full, Path::new(ORIGIN), &any_variable)
            .unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(
            config.servers.nbd.unix_socket,
            Some(PathBuf::from("/run/bucketfs/nbd.sock"))
        );
        assert_eq!(config.aws.allow_http, Some(false));
        assert_eq!(config.gcp.service_account_key.as_deref(), Some("from-env"));

        let table: Table = full.parse().unwrap();
        let mut leaves = Vec::new();
        schema_leaves(SCHEMA, "", &mut leaves);
        assert_eq!(leaves.len(), 23);
        for leaf in &leaves {
            assert!(lookup(&table, leaf).is_some(), "INIT_TEMPLATE lacks {leaf}");
        }
    }

    #[test]
    fn init_template_explains_every_setting() {
        let lines: Vec<&str> = INIT_TEMPLATE.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            let setting = line.strip_prefix("# ").unwrap_or(line);
            if !is_setting(setting) {
                continue;
            }
            let above = lines[index - 1];
            let explained = above
                .strip_prefix("# ")
                .is_some_and(|comment| !is_setting(comment));
            assert!(explained, "no explanation above {line:?}");
        }
    }

    #[test]
    fn schema_and_structs_accept_the_same_keys() {
        // A key in SCHEMA but not in the structs would pass stage 2 and then fail serde's
        // deny_unknown_fields with a message that names no key. Set each leaf on its own
        // with a valid value and check that serde takes it.
        let full: Table = uncomment_examples(INIT_TEMPLATE).parse().unwrap();
        let mut leaves = Vec::new();
        schema_leaves(SCHEMA, "", &mut leaves);
        for leaf in leaves {
            let (section, key) = leaf.rsplit_once('.').unwrap();
            let value = lookup(&full, &leaf).unwrap();
            let text = format!("[{section}]\n{key} = {value}\n");
            let any_variable = |_: &str| Some("x".to_string());
            Config::parse_with_env(&text, Path::new(ORIGIN), &any_variable)
                .unwrap_or_else(|error| panic!("{leaf}: {error}"));
        }
    }

    #[test]
    fn full_file_sets_every_field() {
        let text = r#"
            [storage]
            url = "s3://${BUCKET}/volumes"
            encryption_password = "${PW}"
            compression = "lz4"
            flush_interval_ms = 500
            [cache]
            dir = "/var/cache/bucketfs"
            disk_bytes_max = 1099511627776
            memory_bytes_max = "512 MiB"
            [aws]
            access_key_id = "AKIA"
            secret_access_key = "${SECRET}"
            session_token = "tok"
            region = "eu-central-1"
            endpoint = "http://127.0.0.1:9000"
            allow_http = true
            [gcp]
            service_account_path = "/etc/sa.json"
            service_account_key = "{}"
            [azure]
            account_name = "acct"
            access_key = "key"
            endpoint = "http://127.0.0.1:10000"
            allow_http = true
            use_emulator = false
            [servers.nbd]
            listen = ["127.0.0.1:20809", "[::1]:20809"]
            unix_socket = "/tmp/nbd.sock"
            [admin]
            listen = "[::1]:20810"
        "#;
        let vars = [("BUCKET", "data"), ("PW", "pw"), ("SECRET", "s3cr3t")];
        let config = parse_env(text, &vars).unwrap();
        let expected = Config {
            storage: StorageConfig {
                url: "s3://data/volumes".to_string(),
                encryption_password: Some("pw".to_string()),
                compression: Compression::Lz4,
                flush_interval_ms: 500,
            },
            cache: CacheConfig {
                dir: PathBuf::from("/var/cache/bucketfs"),
                disk_bytes_max: 1 << 40,
                memory_bytes_max: 512 << 20,
            },
            aws: AwsConfig {
                access_key_id: Some("AKIA".to_string()),
                secret_access_key: Some("s3cr3t".to_string()),
                session_token: Some("tok".to_string()),
                region: Some("eu-central-1".to_string()),
                endpoint: Some("http://127.0.0.1:9000".to_string()),
                allow_http: Some(true),
            },
            gcp: GcpConfig {
                service_account_path: Some("/etc/sa.json".to_string()),
                service_account_key: Some("{}".to_string()),
            },
            azure: AzureConfig {
                account_name: Some("acct".to_string()),
                access_key: Some("key".to_string()),
                endpoint: Some("http://127.0.0.1:10000".to_string()),
                allow_http: Some(true),
                use_emulator: Some(false),
            },
            servers: ServersConfig {
                nbd: NbdServerConfig {
                    listen: vec![
                        "127.0.0.1:20809".parse().unwrap(),
                        "[::1]:20809".parse().unwrap(),
                    ],
                    unix_socket: Some(PathBuf::from("/tmp/nbd.sock")),
                },
            },
            admin: AdminConfig {
                listen: "[::1]:20810".parse().unwrap(),
            },
        };
        assert_eq!(config, expected);
    }

    #[test]
    fn unset_keys_keep_their_defaults_within_a_section() {
        let config = parse("[storage]\ncompression = \"none\"\n").unwrap();
        let mut expected = Config::embedded_default();
        expected.storage.compression = Compression::None;
        assert_eq!(config, expected);
    }

    // --- unknown keys --------------------------------------------------------------------

    #[test]
    fn unknown_top_level_key_is_named_with_the_alternatives() {
        assert_eq!(
            error("[storag]\nurl = \"memory://\"\n"),
            "bucketfs.toml: unknown key `storag` (expected one of: storage, cache, aws, gcp, \
             azure, servers, admin)"
        );
        assert_eq!(
            error("verbose = true\n"),
            "bucketfs.toml: unknown key `verbose` (expected one of: storage, cache, aws, gcp, \
             azure, servers, admin)"
        );
    }

    #[test]
    fn unknown_nested_key_is_named_with_its_dotted_path() {
        assert_eq!(
            error("[storage]\ncompresion = \"lz4\"\n"),
            "bucketfs.toml: unknown key `storage.compresion` (expected one of: url, \
             encryption_password, compression, flush_interval_ms)"
        );
        assert_eq!(
            error("[servers.nfs]\nlisten = []\n"),
            "bucketfs.toml: unknown key `servers.nfs` (expected one of: nbd)"
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = []\nexport = \"x\"\n"),
            "bucketfs.toml: unknown key `servers.nbd.export` (expected one of: listen, \
             unix_socket)"
        );
        // Dotted keys and inline tables are the same TOML, so they get the same message.
        assert_eq!(
            error("cache.size = 1\n"),
            "bucketfs.toml: unknown key `cache.size` (expected one of: dir, disk_bytes_max, \
             memory_bytes_max)"
        );
        assert_eq!(
            error("admin = { listen = \"127.0.0.1:1\", port = 2 }\n"),
            "bucketfs.toml: unknown key `admin.port` (expected one of: listen)"
        );
    }

    #[test]
    fn unknown_key_that_is_not_bare_is_quoted() {
        assert_eq!(
            error("[aws]\n\"secret key\" = \"x\"\n"),
            "bucketfs.toml: unknown key `aws.\"secret key\"` (expected one of: access_key_id, \
             secret_access_key, session_token, region, endpoint, allow_http)"
        );
    }

    #[test]
    fn unknown_key_is_reported_before_a_missing_variable() {
        let message = error("[storage]\nencryption_password = \"${NOPE}\"\n[cache]\nsize = 1\n");
        assert!(message.contains("unknown key `cache.size`"), "{message}");
    }

    #[test]
    fn section_that_is_not_a_table_is_an_error() {
        assert_eq!(
            error("storage = \"s3://b\"\n"),
            "bucketfs.toml: storage: expected a table ([storage]), found string \"s3://b\""
        );
        assert_eq!(
            error("[servers]\nnbd = 1\n"),
            "bucketfs.toml: servers.nbd: expected a table ([servers.nbd]), found integer 1"
        );
        assert_eq!(
            error("[[cache]]\ndir = \"x\"\n"),
            "bucketfs.toml: cache: expected a table ([cache]), found an array"
        );
    }

    // --- ${VAR} substitution -------------------------------------------------------------

    #[test]
    fn missing_variable_names_file_key_and_variable() {
        assert_eq!(
            error("[storage]\nencryption_password = \"${BUCKETFS_PASSWORD}\"\n"),
            "bucketfs.toml: storage.encryption_password: environment variable \
             BUCKETFS_PASSWORD is not set"
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = [\"127.0.0.1:1\", \"${ADDR}\"]\n"),
            "bucketfs.toml: servers.nbd.listen[1]: environment variable ADDR is not set"
        );
    }

    #[test]
    fn variables_are_substituted_inside_longer_strings() {
        let vars = [("BUCKET", "my-bucket"), ("ENV", "prod"), ("PORT", "4000")];
        let config = parse_env(
            "[storage]\nurl = \"s3://${BUCKET}/bucketfs-${ENV}/${ENV}\"\n\
             [servers.nbd]\nlisten = [\"127.0.0.1:${PORT}\"]\n\
             [cache]\ndisk_bytes_max = \"${PORT}M\"\n",
            &vars,
        )
        .unwrap();
        assert_eq!(config.storage.url, "s3://my-bucket/bucketfs-prod/prod");
        assert_eq!(
            config.servers.nbd.listen,
            vec!["127.0.0.1:4000".parse().unwrap()]
        );
        assert_eq!(config.cache.disk_bytes_max, 4000 << 20);
    }

    #[test]
    fn substituted_value_is_checked_like_a_literal() {
        assert_eq!(
            error_env("[storage]\ncompression = \"${C}\"\n", &[("C", "gzip")]),
            "bucketfs.toml: storage.compression: expected one of zstd, lz4, none, found \"gzip\""
        );
    }

    #[test]
    fn dollar_dollar_brace_is_a_literal_dollar_brace() {
        let config = parse("[storage]\nencryption_password = \"a$${HOME}b$$c$d$\"\n").unwrap();
        assert_eq!(
            config.storage.encryption_password.as_deref(),
            Some("a${HOME}b$$c$d$")
        );
    }

    #[test]
    fn substitution_is_a_single_pass() {
        let vars = [("A", "${B}"), ("B", "never")];
        let config = parse_env("[storage]\nencryption_password = \"${A}\"\n", &vars).unwrap();
        assert_eq!(config.storage.encryption_password.as_deref(), Some("${B}"));
    }

    #[test]
    fn variable_may_be_set_to_the_empty_string() {
        let config = parse_env("[aws]\nregion = \"x${EMPTY}y\"\n", &[("EMPTY", "")]).unwrap();
        assert_eq!(config.aws.region.as_deref(), Some("xy"));
    }

    #[test]
    fn malformed_references_are_errors() {
        assert_eq!(
            error("[aws]\nregion = \"${REGION\"\n"),
            "bucketfs.toml: aws.region: `${` without a closing `}` (write `$${` for a literal `${`)"
        );
        assert_eq!(
            error("[aws]\nregion = \"${}\"\n"),
            "bucketfs.toml: aws.region: `${}` is not a valid environment variable name \
             (letters, digits and _, not starting with a digit; write `$${` for a literal `${`)"
        );
        for bad in ["${1X}", "${A-B}", "${A B}", "${a.b}"] {
            let message = error(&format!("[aws]\nregion = \"{bad}\"\n"));
            assert!(
                message.contains("is not a valid environment variable name"),
                "{message}"
            );
        }
    }

    #[test]
    fn only_string_values_are_substituted() {
        // Keys are never substituted, so `${X}` as a key is just an unknown key.
        assert_eq!(
            error_env("[aws]\n\"${X}\" = \"y\"\n", &[("X", "region")]),
            "bucketfs.toml: unknown key `aws.\"${X}\"` (expected one of: access_key_id, \
             secret_access_key, session_token, region, endpoint, allow_http)"
        );
        assert_eq!(substitute("plain", &|_| None), Ok("plain".to_string()));
        assert_eq!(
            substitute("${X}", &|_| None),
            Err(SubstituteError::Missing("X".to_string()))
        );
    }

    #[test]
    fn substituted_text_cannot_inject_toml() {
        let vars = [("PW", "x\"\n[admin]\nlisten = \"0.0.0.0:1")];
        let config = parse_env("[storage]\nencryption_password = \"${PW}\"\n", &vars).unwrap();
        assert_eq!(
            config.storage.encryption_password.as_deref(),
            Some(vars[0].1)
        );
        assert_eq!(config.admin, AdminConfig::default());
    }

    // --- values --------------------------------------------------------------------------

    #[test]
    fn sizes_accept_strings_with_units_and_integers() {
        for (text, bytes) in [
            ("\"4096\"", 4096),
            ("4096", 4096),
            ("0", 0),
            ("\"2K\"", 2 << 10),
            ("\"2KB\"", 2 << 10),
            ("\"2KiB\"", 2 << 10),
            ("\"3M\"", 3 << 20),
            ("\"3 MiB\"", 3 << 20),
            ("\"4G\"", 4 << 30),
            ("\"4gb\"", 4 << 30),
            ("\"5T\"", 5 << 40),
            ("\"5TiB\"", 5 << 40),
        ] {
            let config = parse(&format!("[cache]\ndisk_bytes_max = {text}\n")).unwrap();
            assert_eq!(config.cache.disk_bytes_max, bytes, "{text}");
        }
    }

    #[test]
    fn bad_sizes_name_key_and_expected_form() {
        assert_eq!(
            error("[cache]\nmemory_bytes_max = \"1 GX\"\n"),
            "bucketfs.toml: cache.memory_bytes_max: invalid size \"1 GX\": unknown unit \"GX\"; \
             use B, K, M, G or T (also KB/KiB, MB/MiB, GB/GiB, TB/TiB; 1K = 1024)"
        );
        assert_eq!(
            error("[cache]\ndisk_bytes_max = \"99999999T\"\n"),
            "bucketfs.toml: cache.disk_bytes_max: invalid size \"99999999T\": larger than the \
             maximum of 18446744073709551615 bytes"
        );
        assert_eq!(
            error("[cache]\ndisk_bytes_max = -1\n"),
            "bucketfs.toml: cache.disk_bytes_max: a size cannot be negative, found -1"
        );
        assert_eq!(
            error("[cache]\ndisk_bytes_max = 1.5\n"),
            "bucketfs.toml: cache.disk_bytes_max: expected a size such as \"10GiB\" or an \
             integer number of bytes, found float 1.5"
        );
    }

    #[test]
    fn size_deserializer_matches_the_schema_check() {
        // Stage 5 must accept what stage 4 accepted; exercise it directly on odd inputs.
        let cache: CacheConfig =
            toml::from_str("disk_bytes_max = \"7k\"\nmemory_bytes_max = 9").unwrap();
        assert_eq!((cache.disk_bytes_max, cache.memory_bytes_max), (7 << 10, 9));
        let error = toml::from_str::<CacheConfig>("disk_bytes_max = -5").unwrap_err();
        assert!(error.message().contains("cannot be negative"), "{error}");
    }

    #[test]
    fn compression_names() {
        for (name, expected) in [
            ("zstd", Compression::Zstd),
            ("lz4", Compression::Lz4),
            ("none", Compression::None),
        ] {
            let config = parse(&format!("[storage]\ncompression = \"{name}\"\n")).unwrap();
            assert_eq!(config.storage.compression, expected);
            assert_eq!(expected.to_string(), name);
        }
        assert_eq!(
            error("[storage]\ncompression = \"ZSTD\"\n"),
            "bucketfs.toml: storage.compression: expected one of zstd, lz4, none, found \"ZSTD\""
        );
        assert_eq!(
            error("[storage]\ncompression = false\n"),
            "bucketfs.toml: storage.compression: expected one of zstd, lz4, none, found \
             boolean false"
        );
    }

    #[test]
    fn flush_interval_must_be_positive() {
        assert_eq!(
            error("[storage]\nflush_interval_ms = 0\n"),
            "bucketfs.toml: storage.flush_interval_ms: expected a positive number of \
             milliseconds, found 0"
        );
        assert_eq!(
            error("[storage]\nflush_interval_ms = -10\n"),
            "bucketfs.toml: storage.flush_interval_ms: expected a positive number of \
             milliseconds, found -10"
        );
        assert_eq!(
            error("[storage]\nflush_interval_ms = \"2s\"\n"),
            "bucketfs.toml: storage.flush_interval_ms: expected a positive integer number of \
             milliseconds, found string \"2s\""
        );
        assert_eq!(
            parse("[storage]\nflush_interval_ms = 1\n")
                .unwrap()
                .storage
                .flush_interval_ms,
            1
        );
    }

    #[test]
    fn bad_socket_addresses_name_the_key() {
        assert_eq!(
            error("[admin]\nlisten = \"localhost:10810\"\n"),
            "bucketfs.toml: admin.listen: expected an IP address and port such as \
             \"127.0.0.1:10809\" or \"[::1]:10809\" (host names are not resolved), found \
             \"localhost:10810\""
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = [\"127.0.0.1:1\", \"127.0.0.1\"]\n"),
            "bucketfs.toml: servers.nbd.listen[1]: expected an IP address and port such as \
             \"127.0.0.1:10809\" or \"[::1]:10809\" (host names are not resolved), found \
             \"127.0.0.1\""
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = \"127.0.0.1:1\"\n"),
            "bucketfs.toml: servers.nbd.listen: expected an array, found string \"127.0.0.1:1\""
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = [10809]\n"),
            "bucketfs.toml: servers.nbd.listen[0]: expected an IP address and port such as \
             \"127.0.0.1:10809\" or \"[::1]:10809\", found integer 10809"
        );
        for bad in ["127.0.0.1:65536", "::1:80", "1.2.3:4", ""] {
            let message = error(&format!("[admin]\nlisten = \"{bad}\"\n"));
            assert!(
                message.starts_with("bucketfs.toml: admin.listen: expected"),
                "{message}"
            );
        }
    }

    #[test]
    fn empty_listen_list_means_no_tcp() {
        let config = parse("[servers.nbd]\nlisten = []\nunix_socket = \"/tmp/b.sock\"\n").unwrap();
        assert!(config.servers.nbd.listen.is_empty());
        assert_eq!(
            config.servers.nbd.unix_socket,
            Some(PathBuf::from("/tmp/b.sock"))
        );
    }

    #[test]
    fn listeners_that_cannot_all_bind_are_errors() {
        assert_eq!(
            error("[servers.nbd]\nlisten = [\"127.0.0.1:5000\", \"127.0.0.1:5000\"]\n"),
            "bucketfs.toml: servers.nbd.listen: 127.0.0.1:5000 clashes with 127.0.0.1:5000, \
             listed before it"
        );
        assert_eq!(
            error("[servers.nbd]\nlisten = [\"0.0.0.0:5000\", \"127.0.0.1:5000\"]\n"),
            "bucketfs.toml: servers.nbd.listen: 127.0.0.1:5000 clashes with 0.0.0.0:5000, \
             listed before it"
        );
        assert_eq!(
            error("[admin]\nlisten = \"127.0.0.1:10809\"\n"),
            "bucketfs.toml: admin.listen: 127.0.0.1:10809 clashes with 127.0.0.1:10809 in \
             servers.nbd.listen; give the admin endpoint a port of its own"
        );
        // Port 0 asks for any free port, so it never clashes (tests rely on this).
        parse("[servers.nbd]\nlisten = [\"127.0.0.1:0\", \"[::1]:0\"]\n[admin]\nlisten = \"127.0.0.1:0\"\n")
            .unwrap();
        // Different specific addresses on one port are fine.
        parse("[servers.nbd]\nlisten = [\"127.0.0.1:5000\", \"[::1]:5000\"]\n").unwrap();
    }

    #[test]
    fn unix_socket_path_must_fit_sun_path() {
        let longest = format!("/{}", "s".repeat(UNIX_SOCKET_PATH_BYTES_MAX - 1));
        parse(&format!("[servers.nbd]\nunix_socket = \"{longest}\"\n")).unwrap();
        assert_eq!(
            error(&format!("[servers.nbd]\nunix_socket = \"{longest}s\"\n")),
            "bucketfs.toml: servers.nbd.unix_socket: a unix socket path can be at most 107 bytes \
             long; this one is 108 bytes"
        );
        assert_eq!(
            error("[servers.nbd]\nunix_socket = \"\"\n"),
            "bucketfs.toml: servers.nbd.unix_socket: expected a path, found an empty string"
        );
    }

    #[test]
    fn storage_urls() {
        for good in [
            "s3://bucket",
            "s3://bucket/prefix/deeper",
            "gs://bucket/prefix",
            "az://container/prefix",
            "file:///var/lib/bucketfs",
            "file://./data",
            "file://../data",
            "memory://",
        ] {
            let config = parse(&format!("[storage]\nurl = \"{good}\"\n"))
                .unwrap_or_else(|error| panic!("{good}: {error}"));
            assert_eq!(config.storage.url, good);
        }
        assert_eq!(
            error("[storage]\nurl = \"http://example.com/b\"\n"),
            "bucketfs.toml: storage.url: unsupported scheme \"http\" in \"http://example.com/b\"; \
             expected s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, \
             file:///absolute/path, file://./relative/path or memory://"
        );
        for (bad, why) in [
            ("my-bucket", "no scheme"),
            ("", "no scheme"),
            ("s3://", "no bucket name"),
            ("gs:///prefix", "no bucket name"),
            ("az://", "no container name"),
            ("s3://my bucket", "whitespace"),
            ("file://data", "a file URL needs an absolute path"),
            ("file://", "a file URL needs an absolute path"),
            ("memory://x", "memory:// takes nothing after it"),
            ("S3://bucket", "unsupported scheme \"S3\""),
        ] {
            let message = error(&format!("[storage]\nurl = \"{bad}\"\n"));
            assert!(
                message.starts_with(&format!("bucketfs.toml: storage.url: {why}")),
                "{bad}: {message}"
            );
        }
        assert_eq!(
            error("[storage]\nurl = 5\n"),
            "bucketfs.toml: storage.url: expected a URL, found integer 5"
        );
    }

    #[test]
    fn wrong_types_name_key_and_expected_type() {
        assert_eq!(
            error("[aws]\nallow_http = \"yes\"\n"),
            "bucketfs.toml: aws.allow_http: expected true or false, found string \"yes\""
        );
        assert_eq!(
            error("[aws]\nregion = [\"a\"]\n"),
            "bucketfs.toml: aws.region: expected a string, found an array"
        );
        assert_eq!(
            error("[cache]\ndir = { path = \"x\" }\n"),
            "bucketfs.toml: cache.dir: expected a path, found a table"
        );
        assert_eq!(
            error("[cache]\ndir = \"\"\n"),
            "bucketfs.toml: cache.dir: expected a path, found an empty string"
        );
    }

    // --- syntax errors, files, output -----------------------------------------------------

    #[test]
    fn syntax_error_names_file_line_and_column() {
        let message = error("[storage]\nurl = \"memory://\"\ncompression = zstd\n");
        assert!(
            message.starts_with("bucketfs.toml:3:15: invalid TOML: "),
            "{message}"
        );
        let message = error("[storage\n");
        assert_eq!(
            message,
            "bucketfs.toml:1:9: invalid TOML: invalid table header; expected `.`, `]`"
        );
    }

    #[test]
    fn duplicate_key_is_a_syntax_error_with_position() {
        let message = error("[storage]\nurl = \"memory://\"\nurl = \"memory://\"\n");
        assert!(
            message.starts_with("bucketfs.toml:3:1: invalid TOML: "),
            "{message}"
        );
        assert!(message.contains("duplicate key"), "{message}");
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column("abc", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é\nxé", 5), (2, 3));
        assert_eq!(line_column("ab", 99), (1, 3));
    }

    /// A unique scratch file under the system temp directory, removed on drop.
    struct ScratchFile(PathBuf);

    impl ScratchFile {
        fn new(name: &str, contents: &str) -> ScratchFile {
            let path = std::env::temp_dir().join(format!(
                "bucketfs-config-test-{}-{name}",
                std::process::id()
            ));
            std::fs::write(&path, contents).unwrap();
            ScratchFile(path)
        }
    }

    impl Drop for ScratchFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn load_reads_the_file_and_names_it_in_errors() {
        let good = ScratchFile::new("good.toml", "[storage]\ncompression = \"lz4\"\n");
        assert_eq!(
            Config::load(&good.0).unwrap().storage.compression,
            Compression::Lz4
        );

        let bad = ScratchFile::new("bad.toml", "[cache]\nsize = 1\n");
        let message = Config::load(&bad.0).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("{}: unknown key `cache.size`", bad.0.display())),
            "{message}"
        );

        let missing = std::env::temp_dir().join(format!(
            "bucketfs-config-test-{}-missing.toml",
            std::process::id()
        ));
        let error = Config::load(&missing).unwrap_err();
        assert!(
            matches!(&error, ConfigError::Read { error, .. } if error.kind() == std::io::ErrorKind::NotFound),
            "{error:?}"
        );
        assert!(
            error.to_string().starts_with(&format!(
                "{}: cannot read the config file: ",
                missing.display()
            )),
            "{error}"
        );
    }

    #[test]
    fn parse_uses_the_process_environment() {
        // Process-wide state: use a name no other test touches and only read it.
        let config = Config::parse("[aws]\nregion = \"x$${PATH}\"\n", Path::new(ORIGIN)).unwrap();
        assert_eq!(config.aws.region.as_deref(), Some("x${PATH}"));
        if let Ok(path) = std::env::var("PATH") {
            let config = Config::parse("[aws]\nregion = \"${PATH}\"\n", Path::new(ORIGIN)).unwrap();
            assert_eq!(config.aws.region, Some(path));
        }
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let vars = [("S", "TOPSECRET")];
        let config = parse_env(
            "[storage]\nencryption_password = \"${S}\"\n\
             [aws]\naccess_key_id = \"AKIA\"\nsecret_access_key = \"${S}\"\nsession_token = \"${S}\"\n\
             [gcp]\nservice_account_key = \"${S}\"\n[azure]\naccess_key = \"${S}\"\n",
            &vars,
        )
        .unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("TOPSECRET"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(debug.contains("AKIA"), "{debug}");
    }

    #[test]
    fn exposure_warnings_for_public_listeners_and_memory_storage() {
        let config = parse(
            "[storage]\nurl = \"memory://\"\n[servers.nbd]\nlisten = [\"0.0.0.0:10809\"]\n\
             [admin]\nlisten = \"192.168.1.5:10810\"\n",
        )
        .unwrap();
        let warnings = config.exposure_warnings();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].starts_with("servers.nbd.listen: 0.0.0.0:10809 is not a loopback"));
        assert!(warnings[1].starts_with("admin.listen: 192.168.1.5:10810 is not a loopback"));
        assert!(warnings[2].starts_with("storage.url: memory://"));
    }
}
