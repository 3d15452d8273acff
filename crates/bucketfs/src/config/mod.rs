//! The configuration file: one TOML file that deserialises into plain structs.
//!
//! Loading runs in stages so that every error names the file and, when one is at fault, the
//! dotted key (`storage.compression`):
//!
//! 1. parse the text into a `toml::Table`; syntax errors carry a line and column;
//! 2. walk the table against the key table of keys.rs, rejecting unknown keys and misplaced
//!    tables;
//! 3. replace `${VAR}` in every string value with the environment variable `VAR`;
//! 4. check every value (type, range, format) with the check declared with its key;
//! 5. set the declared default of every key left out, deserialise into [`Config`] with
//!    serde, then check rules that span several keys.
//!
//! Each key is declared once: in keys.rs, or, for `[tuning]`, as a field of the engine's
//! `Tuning` (read by tuning.rs). The checks, the defaults and the template that
//! `bucketfs init` writes (template.rs) come from that declaration.
//!
//! Serde alone would reject the same files, but its messages do not say which key failed,
//! and substitution must see the parsed values (not the text) so that a missing variable can
//! be blamed on the key that uses it and a value cannot inject TOML syntax.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use bucketfs_engine::Tuning;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::{Table, Value};

use crate::size::parse_size;

mod checks;
mod keys;
mod substitute;
mod template;
mod tuning;

use checks::{check_keys, check_values};
use substitute::substitute_value;
pub use template::init_template;

/// `sun_path` holds 108 bytes on Linux, one of them the terminating NUL.
pub const UNIX_SOCKET_PATH_BYTES_MAX: usize = 107;

/// How an entry of `servers.nbd.allow` names a client certificate: by its subject's CN.
pub const ALLOW_COMMON_NAME_PREFIX: &str = "CN=";

/// The admin socket's file name in `cache.dir` when `admin.socket` is unset.
pub const ADMIN_SOCKET_FILE_NAME: &str = "admin.sock";

/// The whole configuration file, as typed values. The keys, their checks and their defaults
/// are declared in keys.rs; defaults are set before deserialisation, so only the keys that
/// have none are `Option`s here.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub storage: StorageConfig,
    pub cache: CacheConfig,
    pub aws: AwsConfig,
    pub gcp: GcpConfig,
    pub azure: AzureConfig,
    pub servers: ServersConfig,
    pub filesystem: FilesystemConfig,
    pub admin: AdminConfig,
    pub tuning: Tuning,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemConfig {
    #[serde(default, deserialize_with = "deserialize_opt_size")]
    pub quota_bytes: Option<u64>,
}

#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `s3://`, `gs://`, `az://`, `file://` or `memory://`; checked by `checks::check_storage_url`.
    pub url: String,
    pub encryption_password: Option<String>,
    pub compression: Compression,
    /// Always positive.
    pub flush_interval_ms: u64,
    /// Always positive.
    pub outage_timeout_s: u64,
    #[serde(default)]
    pub journal: JournalConfig,
}

/// `[storage.journal]`: the journal tier (docs/0009-journal-tier.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// A directory on a fast local disk (one target); unset with no `targets`: no journal.
    pub path: Option<PathBuf>,
    /// `[[storage.journal.targets]]`: more targets (after `path`, if set), of which
    /// `write_quorum` hold each write.
    pub targets: Option<Vec<JournalTargetConfig>>,
    /// Unset: a majority of the targets.
    pub write_quorum: Option<usize>,
}

/// One entry of `[[storage.journal.targets]]` (checks.rs checks it before this reads it):
/// a local directory (`path`) or an object store (`url`, and for S3 an `endpoint` of its own).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalTargetConfig {
    pub path: Option<PathBuf>,
    pub url: Option<String>,
    pub endpoint: Option<String>,
}

impl JournalConfig {
    /// The targets: `path` first, then `targets`.
    pub fn all_targets(&self) -> Vec<JournalTargetConfig> {
        let path = self.path.iter().map(|p| JournalTargetConfig {
            path: Some(p.clone()),
            ..Default::default()
        });
        path.chain(self.targets.iter().flatten().cloned()).collect()
    }

    /// The write quorum: as set, or a majority of the targets.
    pub fn quorum(&self) -> usize {
        let n = self.all_targets().len();
        self.write_quorum.unwrap_or(n / 2 + 1).clamp(1, n.max(1))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    pub dir: PathBuf,
    #[serde(deserialize_with = "deserialize_size")]
    pub disk_bytes_max: u64,
    #[serde(deserialize_with = "deserialize_size")]
    pub memory_bytes_max: u64,
    #[serde(deserialize_with = "deserialize_size")]
    pub metadata_bytes_max: u64,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub allow_http: Option<bool>,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    pub service_account_path: Option<String>,
    pub service_account_key: Option<String>,
}

#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    pub account_name: Option<String>,
    pub access_key: Option<String>,
    pub endpoint: Option<String>,
    pub allow_http: Option<bool>,
    pub use_emulator: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServersConfig {
    pub nbd: NbdServerConfig,
    pub ninep: NinepServerConfig,
    pub nfs: NfsServerConfig,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsServerConfig {
    /// Empty means no NFS server.
    pub listen: Vec<SocketAddr>,
    /// Unset: the whole filesystem to every client that can connect, root squashed unless it
    /// is on loopback.
    pub exports: Option<Vec<NfsExportConfig>>,
}

/// One entry of `[[servers.nfs.exports]]` (checks.rs checks it before this reads it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsExportConfig {
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default = "every_client")]
    pub clients: Vec<String>,
    #[serde(default = "yes")]
    pub root_squash: bool,
}

fn every_client() -> Vec<String> {
    vec!["*".to_string()]
}

fn yes() -> bool {
    true
}

impl NfsExportConfig {
    /// The export as the NFS server takes it.
    pub fn rule(&self) -> Result<bucketfs_nfs::export::ExportRule, String> {
        Ok(bucketfs_nfs::export::ExportRule {
            path: bucketfs_nfs::export::normal_path(&self.path)?,
            read_only: self.read_only,
            clients: bucketfs_nfs::export::parse_clients(&self.clients)?,
            root_squash: self.root_squash,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NinepServerConfig {
    /// Empty means no TCP listener.
    pub listen: Vec<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdServerConfig {
    /// Empty means no TCP listener.
    pub listen: Vec<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    /// Unset: see [`NbdServerConfig::tls_mode`].
    pub tls: Option<TlsMode>,
    /// Set together with `tls_key` (checked).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Set only with TLS required (checked).
    pub tls_client_ca: Option<PathBuf>,
    /// Keys are `CN=name` (checked); set only with `tls_client_ca` (checked).
    pub allow: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Unset: [`Config::admin_socket`].
    pub socket: Option<PathBuf>,
    /// TCP in addition to the socket; set together with `token` (checked).
    pub listen: Option<SocketAddr>,
    pub token: Option<String>,
    /// HTTP, GET /metrics only (crates/bucketfs/src/metrics.rs).
    pub metrics_listen: Option<SocketAddr>,
}

/// The TLS mode of the NBD server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsMode {
    Off,
    Optional,
    Required,
}

impl NbdServerConfig {
    /// The mode in effect: `tls` when set, else required with a certificate and off without.
    pub fn tls_mode(&self) -> TlsMode {
        match (self.tls, &self.tls_cert) {
            (Some(mode), _) => mode,
            (None, Some(_)) => TlsMode::Required,
            (None, None) => TlsMode::Off,
        }
    }
}

/// Codec for file data before it is sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
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
    /// `Tuning::validate` failed; its message names the keys (`tuning.<field>`).
    #[error("{}: {message}", path.display())]
    InvalidTuning { path: PathBuf, message: String },
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
        check_keys(&root, "", origin)?;
        for (key, value) in root.iter_mut() {
            substitute_value(value, &join_key("", key), env, origin)?;
        }
        check_values(&root, origin)?;
        keys::fill_defaults(&mut root);
        let config: Config = Value::Table(root)
            .try_into()
            .map_err(|error: toml::de::Error| ConfigError::InvalidValue {
                // Unreachable while the key table matches the structs (a test checks that), but a
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
        Config::parse_with_env("", Path::new("(embedded default)"), &|_| None)
            .expect("the declared defaults are valid (tested)")
    }

    /// The admin endpoint's unix socket: `admin.socket`, else admin.sock in `cache.dir`, a
    /// directory that is this server's own (its cache is locked to one process).
    pub fn admin_socket(&self) -> PathBuf {
        self.admin
            .socket
            .clone()
            .unwrap_or_else(|| self.cache.dir.join(ADMIN_SOCKET_FILE_NAME))
    }

    /// Settings that work but that the operator should know about, one sentence each.
    pub fn exposure_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let nbd = &self.servers.nbd;
        // Only a required TLS with verified client certificates keeps strangers out.
        let exposure = match (nbd.tls_mode(), &nbd.tls_client_ca) {
            (TlsMode::Off, _) => Some(
                "TLS is off: anyone who can reach it can read and write every block device, in \
                 clear text (set servers.nbd.tls_cert, tls_key and tls_client_ca)",
            ),
            (TlsMode::Optional, _) => Some(
                "TLS is only optional: anyone who can reach it can read and write every block \
                 device without it (set servers.nbd.tls = \"required\")",
            ),
            (TlsMode::Required, None) => Some(
                "client certificates are not required: traffic is encrypted, but anyone who \
                 can reach it can read and write every block device (set \
                 servers.nbd.tls_client_ca)",
            ),
            (TlsMode::Required, Some(_)) => None,
        };
        if let Some(exposure) = exposure {
            for address in nbd.listen.iter().filter(|a| !a.ip().is_loopback()) {
                warnings.push(format!(
                    "servers.nbd.listen: {address} is not a loopback address, and {exposure}"
                ));
            }
        }
        for address in self
            .servers
            .ninep
            .listen
            .iter()
            .filter(|a| !a.ip().is_loopback())
        {
            warnings.push(format!(
                "servers.ninep.listen: {address} is not a loopback address, and 9P has no \
                 authentication: anyone who can reach it can act as any user, root included"
            ));
        }
        for address in self
            .servers
            .nfs
            .listen
            .iter()
            .filter(|a| !a.ip().is_loopback())
        {
            warnings.push(format!(
                "servers.nfs.listen: {address} is not a loopback address, and NFS's AUTH_SYS \
                 trusts the uid a client names: anyone who can reach it can act as any user"
            ));
        }
        if let Some(address) = self.admin.listen.filter(|a| !a.ip().is_loopback()) {
            warnings.push(format!(
                "admin.listen: {address} is not a loopback address, and the admin token \
                 travels over it in clear text"
            ));
        }
        if let Some(address) = self.admin.metrics_listen.filter(|a| !a.ip().is_loopback()) {
            warnings.push(format!(
                "admin.metrics_listen: {address} is not a loopback address, and /metrics has \
                 no authentication: anyone who can reach it sees how busy the server is"
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

    /// Rules that involve more than one value, or limits of the engine, checked after
    /// deserialisation.
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
        let ninep = &self.servers.ninep.listen;
        for (index, address) in ninep.iter().enumerate() {
            let clash = ninep[..index]
                .iter()
                .map(|a| (a, "listed before it"))
                .chain(listen.iter().map(|a| (a, "in servers.nbd.listen")))
                .find(|(a, _)| addresses_clash(a, address));
            if let Some((earlier, where_)) = clash {
                return Err(invalid(
                    "servers.ninep.listen",
                    format!("{address} clashes with {earlier}, {where_}"),
                ));
            }
        }
        let nfs = &self.servers.nfs.listen;
        for (index, address) in nfs.iter().enumerate() {
            let clash = nfs[..index]
                .iter()
                .map(|a| (a, "listed before it"))
                .chain(listen.iter().map(|a| (a, "in servers.nbd.listen")))
                .chain(ninep.iter().map(|a| (a, "in servers.ninep.listen")))
                .chain(self.admin.listen.iter().map(|a| (a, "in admin.listen")))
                .find(|(a, _)| addresses_clash(a, address));
            if let Some((earlier, where_)) = clash {
                return Err(invalid(
                    "servers.nfs.listen",
                    format!("{address} clashes with {earlier}, {where_}"),
                ));
            }
        }
        let journal = &self.storage.journal;
        if let Some(w) = journal.write_quorum {
            let n = journal.all_targets().len();
            if w == 0 || w > n {
                return Err(invalid(
                    "storage.journal.write_quorum",
                    format!(
                        "{w} with {n} journal targets (storage.journal.path and \
                         storage.journal.targets): it must be between 1 and their number"
                    ),
                ));
            }
        }
        let exports = self.servers.nfs.exports.as_deref().unwrap_or_default();
        for (index, export) in exports.iter().enumerate() {
            let key = format!("servers.nfs.exports[{index}]");
            let rule = export.rule().map_err(|m| invalid(&key, m))?;
            let earlier = exports[..index]
                .iter()
                .position(|e| e.rule().is_ok_and(|r| r.path == rule.path));
            if let Some(earlier) = earlier {
                return Err(invalid(
                    &key,
                    format!(
                        "{:?} is exported by servers.nfs.exports[{earlier}] already",
                        rule.path
                    ),
                ));
            }
        }
        if let Some(admin) = self.admin.listen {
            if let Some(ninep) = ninep.iter().find(|a| addresses_clash(a, &admin)) {
                return Err(invalid(
                    "admin.listen",
                    format!(
                        "{admin} clashes with {ninep} in servers.ninep.listen; give the admin \
                         endpoint a port of its own"
                    ),
                ));
            }
            if let Some(nbd) = listen.iter().find(|a| addresses_clash(a, &admin)) {
                return Err(invalid(
                    "admin.listen",
                    format!(
                        "{admin} clashes with {nbd} in servers.nbd.listen; give the admin \
                         endpoint a port of its own"
                    ),
                ));
            }
        }
        if let Some(metrics) = self.admin.metrics_listen {
            let clash = listen
                .iter()
                .map(|a| (a, "servers.nbd.listen"))
                .chain(ninep.iter().map(|a| (a, "servers.ninep.listen")))
                .chain(nfs.iter().map(|a| (a, "servers.nfs.listen")))
                .chain(self.admin.listen.iter().map(|a| (a, "admin.listen")))
                .find(|(a, _)| addresses_clash(a, &metrics));
            if let Some((other, key)) = clash {
                return Err(invalid(
                    "admin.metrics_listen",
                    format!(
                        "{metrics} clashes with {other} in {key}; give /metrics a port of its own"
                    ),
                ));
            }
        }
        match (&self.admin.listen, &self.admin.token) {
            (Some(_), None) => {
                return Err(invalid(
                    "admin.token",
                    "admin.listen serves the admin endpoint over TCP, where only a token keeps \
                     others out: set admin.token too"
                        .to_string(),
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "admin.token",
                    "a token is only used with admin.listen (the socket is protected by its \
                     file mode): set admin.listen, or remove the token"
                        .to_string(),
                ))
            }
            _ => {}
        }
        self.check_nbd_tls(origin)?;
        self.tuning
            .validate()
            .map_err(|message| ConfigError::InvalidTuning {
                path: origin.to_path_buf(),
                message,
            })
    }
}

impl Config {
    /// The TLS keys of `[servers.nbd]` agree with each other.
    fn check_nbd_tls(&self, origin: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::InvalidValue {
            path: origin.to_path_buf(),
            key: format!("servers.nbd.{key}"),
            message: message.to_string(),
        };
        let nbd = &self.servers.nbd;
        match (&nbd.tls_cert, &nbd.tls_key) {
            (Some(_), None) => {
                return Err(invalid(
                    "tls_key",
                    "tls_cert is set, so the private key of that certificate must be set too",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls_cert",
                    "tls_key is set, so the certificate of that key must be set too",
                ))
            }
            _ => {}
        }
        let mode = nbd.tls_mode();
        if mode != TlsMode::Off && nbd.tls_cert.is_none() {
            return Err(invalid(
                "tls",
                &format!("TLS {} needs tls_cert and tls_key", mode.as_str()),
            ));
        }
        if nbd.tls_client_ca.is_some() && mode != TlsMode::Required {
            return Err(invalid(
                "tls_client_ca",
                &format!(
                    "client certificates need tls = \"required\" (it is \"{}\"): otherwise a \
                     client could connect without one",
                    mode.as_str()
                ),
            ));
        }
        if nbd.allow.is_some() && nbd.tls_client_ca.is_none() {
            return Err(invalid(
                "allow",
                "an allow-list by certificate needs verified client certificates: set \
                 tls_client_ca (and tls = \"required\")",
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
            .field("outage_timeout_s", &self.outage_timeout_s)
            .field("journal", &self.journal)
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

impl fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminConfig")
            .field("socket", &self.socket)
            .field("listen", &self.listen)
            .field("token", &redact(&self.token))
            .field("metrics_listen", &self.metrics_listen)
            .finish()
    }
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Off => "off",
            TlsMode::Optional => "optional",
            TlsMode::Required => "required",
        }
    }
}

impl FromStr for TlsMode {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "off" => Ok(TlsMode::Off),
            "optional" => Ok(TlsMode::Optional),
            "required" => Ok(TlsMode::Required),
            _ => Err(format!(
                "expected one of off, optional, required, found {name:?}"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for TlsMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(de::Error::custom)
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

fn deserialize_opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    deserialize_size(d).map(Some)
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

#[cfg(test)]
mod tests;
