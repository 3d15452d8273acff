//! Every key of the config file, declared once: its dotted path, how its value is checked, its
//! default (or an example), and the sentences that explain it. The key checker and the value
//! checks (checks.rs), the defaults of unset keys, and the template of `bucketfs init`
//! (template.rs) all come from this table; the structs of the parent module are the typed
//! result, and tests check that they take exactly these keys.

use std::borrow::Cow;
use std::sync::LazyLock;

use toml::{Table, Value};

use super::checks::{check_allow, check_export, check_journal_target, check_tls_mode, check_token};
use super::checks::{
    check_bool, check_compression, check_count, check_flush_interval, check_path,
    check_positive_seconds, check_size, check_socket_address, check_storage_url, check_string,
    check_unix_socket, CheckFn,
};

/// How the value of a key is checked after substitution.
#[derive(Clone, Copy)]
pub(super) enum Check {
    One(CheckFn),
    /// An array whose every element passes; errors name `key[index]`.
    Each(CheckFn),
}

/// What a key means when the file leaves it out, and what `bucketfs init` writes for it. The
/// values are TOML text.
#[derive(Clone)]
pub(super) enum Shown {
    /// The default, written as a setting.
    Default(Cow<'static, str>),
    /// The default, written commented out, so that a file keeps following the default when a
    /// later version changes it: the tuning values.
    CommentedDefault(Cow<'static, str>),
    /// No default (the key stays unset); an example, written commented out.
    Example(&'static str),
    /// No default, but `init` writes this setting all the same: the password, taken from the
    /// environment, which a server needs before it can open its bucket.
    Suggested(&'static str),
}

#[derive(Clone)]
pub(super) struct Key {
    /// `servers.nbd.listen`: every part a bare TOML key.
    pub path: Cow<'static, str>,
    pub check: Check,
    pub shown: Shown,
    /// What the key does, in sentences; the template's comment above it.
    pub doc: Cow<'static, str>,
}

/// A table that the template explains above its header.
pub(super) struct Section {
    pub path: &'static str,
    pub doc: &'static str,
}

impl Shown {
    pub(super) fn default(&self) -> Option<&str> {
        match self {
            Shown::Default(text) | Shown::CommentedDefault(text) => Some(text),
            Shown::Example(_) | Shown::Suggested(_) => None,
        }
    }
}

impl Key {
    /// The table that holds the key, and the key's name in it.
    pub(super) fn split(&self) -> (&str, &str) {
        self.path
            .rsplit_once('.')
            .expect("every key sits in a table (tested)")
    }
}

const fn key(path: &'static str, check: Check, shown: Shown, doc: &'static str) -> Key {
    Key {
        path: Cow::Borrowed(path),
        check,
        shown,
        doc: Cow::Borrowed(doc),
    }
}

const fn default(text: &'static str) -> Shown {
    Shown::Default(Cow::Borrowed(text))
}

use Check::{Each, One};
use Shown::{Example, Suggested};

/// The keys of every table but `[tuning]`, whose keys are the fields of the engine's `Tuning`
/// (tuning.rs). A table's keys are listed together; the template keeps this order.
const DECLARED: &[Key] = &[
    // A directory next to where bucketfs runs, so that a first `bucketfs run` works without
    // any cloud account.
    key(
        "storage.url",
        One(check_storage_url),
        default("\"file://./bucketfs-data\""),
        "Where the filesystem and its block devices are kept: s3://bucket/prefix, \
         gs://bucket/prefix, az://container/prefix, file:///absolute/path, \
         file://./relative/path, or memory:// (nothing survives the process).",
    ),
    key(
        "storage.encryption_password",
        One(check_string),
        Suggested("\"${BUCKETFS_PASSWORD}\""),
        "Protects the key that encrypts everything in the bucket; without it the data cannot \
         be read. Taken from the environment so that it is not stored in this file.",
    ),
    key(
        "storage.compression",
        One(check_compression),
        default("\"zstd\""),
        "Compression of file data before encryption: zstd (smaller), lz4 (faster) or none. \
         Recorded per extent, so a change applies to new writes and old data stays readable. \
         With zstd, what clients wait on while they fsync several times a second or more \
         (every commit, or a database's WAL writer) is sealed with lz4: about three times as \
         fast, for up to twice the bytes; what stays of it in small objects is rewritten \
         later, with zstd.",
    ),
    // A few seconds, as promised in DESIGN.md, while keeping idle uploads rare.
    key(
        "storage.flush_interval_ms",
        One(check_flush_interval),
        default("2000"),
        "Writes that nobody fsynced are uploaded at least this often (milliseconds); a crash \
         can lose only writes that are younger than this and were never flushed.",
    ),
    // Long enough for a region's brownout or a store's failover; short enough that a store gone
    // for good is reported to the database rather than hidden for hours.
    key(
        "storage.outage_timeout_s",
        One(check_positive_seconds),
        default("600"),
        "While the object store fails or hangs, flushes (fsync) wait and retry for up to this \
         many seconds before they report an I/O error; writes go on until the memory for \
         unflushed data is full, then wait too. `bucketfs status` shows an outage under way.",
    ),
    key(
        "storage.journal.path",
        One(check_path),
        Example("\"/var/lib/bucketfs/journal\""),
        "A directory on a fast local disk for the journal tier: a flush (fsync) returns once \
         its data is written there, and the bucket receives it in the background, in order. \
         It survives a crash of the process and a power loss; losing this machine's disk \
         loses what the bucket had not yet received. Unset: a flush waits for the bucket. \
         A bucket written through a journal refuses to start without it (and says which) \
         unless `bucketfs run --accept-journal-loss`. docs/0009-journal-tier.md.",
    ),
    key(
        "storage.journal.targets",
        Each(check_journal_target),
        Example(
            "[{ path = \"/nvme/bucketfs-journal\" }, \
             { url = \"s3://journal-zone-b/bucketfs\", endpoint = \"https://s3.zone-b.example\" }, \
             { url = \"s3://journal-zone-c/bucketfs\" }]",
        ),
        "Targets of the journal besides path (or instead of it), written as \
         [[storage.journal.targets]] tables, each a local directory (path) or an object store \
         (url, with its own endpoint \
         if it is S3 elsewhere; the [aws], [gcp] and [azure] credentials apply). A flush \
         returns once write_quorum of them hold its data, so it survives the loss of any \
         write_quorum - 1 of them, at the latency of the write_quorum-th fastest; a start needs \
         targets - write_quorum + 1 of them. docs/0009-journal-tier.md.",
    ),
    key(
        "storage.journal.write_quorum",
        One(check_count),
        Example("2"),
        "Journal targets (storage.journal.path and storage.journal.targets) that must hold a \
         write before a flush returns, from 1 to their number. Unset: a majority of them.",
    ),
    key(
        "cache.dir",
        One(check_path),
        default("\"./bucketfs-cache\""),
        "Local cache directory. It holds copies of bucket data only: deleting it loses nothing.",
    ),
    key(
        "cache.disk_bytes_max",
        One(check_size),
        default("\"10GiB\""),
        "Upper bound on the disk cache, which keeps data as stored (compressed and encrypted). \
         Not used for file:// buckets, which are on local disk already.",
    ),
    key(
        "cache.memory_bytes_max",
        One(check_size),
        default("\"1GiB\""),
        "Upper bound on the memory cache of decoded data.",
    ),
    key(
        "cache.metadata_bytes_max",
        One(check_size),
        default("\"256MiB\""),
        "Upper bound on the memory cache of metadata (blocks of the sorted runs that hold file \
         and extent metadata in the bucket). Metadata beyond it is read from the bucket when \
         needed, so memory does not grow with the bucket.",
    ),
    key(
        "aws.access_key_id",
        One(check_string),
        Example("\"${AWS_ACCESS_KEY_ID}\""),
        "Access key id of the credentials.",
    ),
    key(
        "aws.secret_access_key",
        One(check_string),
        Example("\"${AWS_SECRET_ACCESS_KEY}\""),
        "Secret access key of the credentials.",
    ),
    key(
        "aws.session_token",
        One(check_string),
        Example("\"${AWS_SESSION_TOKEN}\""),
        "Session token, for temporary credentials only.",
    ),
    key(
        "aws.region",
        One(check_string),
        Example("\"us-east-1\""),
        "Region of the bucket.",
    ),
    key(
        "aws.endpoint",
        One(check_string),
        Example("\"http://127.0.0.1:9000\""),
        "Endpoint of an S3-compatible service; unset means Amazon S3 itself.",
    ),
    key(
        "aws.allow_http",
        One(check_bool),
        Example("false"),
        "Allow a plain http:// endpoint, for a test server; requests then go without TLS.",
    ),
    key(
        "gcp.service_account_path",
        One(check_string),
        Example("\"/etc/bucketfs/gcs-service-account.json\""),
        "Path of a service-account JSON key file.",
    ),
    key(
        "gcp.service_account_key",
        One(check_string),
        Example("\"${GCP_SERVICE_ACCOUNT_KEY}\""),
        "The same JSON key given inline, usually from the environment.",
    ),
    key(
        "azure.account_name",
        One(check_string),
        Example("\"mystorageaccount\""),
        "Name of the storage account.",
    ),
    key(
        "azure.access_key",
        One(check_string),
        Example("\"${AZURE_STORAGE_ACCESS_KEY}\""),
        "Shared access key of the storage account.",
    ),
    key(
        "azure.endpoint",
        One(check_string),
        Example("\"http://127.0.0.1:10000/devstoreaccount1\""),
        "Endpoint other than the public Azure cloud.",
    ),
    key(
        "azure.allow_http",
        One(check_bool),
        Example("false"),
        "Allow a plain http:// endpoint, for a test server; requests then go without TLS.",
    ),
    key(
        "azure.use_emulator",
        One(check_bool),
        Example("false"),
        "Use the local Azurite emulator and its well-known development account.",
    ),
    // Without TLS NBD has no authentication, so by default it listens on loopback only. 10809
    // is the port IANA assigned to NBD.
    key(
        "servers.nbd.listen",
        Each(check_socket_address),
        default("[\"127.0.0.1:10809\"]"),
        "TCP addresses of the NBD server; [] turns TCP off. Without TLS and client \
         certificates (below) NBD has no authentication: anyone who can connect can read and \
         write every block device, so keep it on loopback unless the network is trusted; \
         bucketfs warns at start when it is not.",
    ),
    key(
        "servers.nbd.unix_socket",
        One(check_unix_socket),
        Example("\"/run/bucketfs/nbd.sock\""),
        "Unix socket of the NBD server, where file permissions control access; unset means \
         none. The TLS settings below apply to it too.",
    ),
    // Unset rather than a fixed default: a certificate switches TLS on, and an operator who
    // configures one should not also have to remember to require it.
    key(
        "servers.nbd.tls",
        One(check_tls_mode),
        Example("\"required\""),
        "TLS for NBD (the protocol's NBD_OPT_STARTTLS): off, optional (clients may start TLS) \
         or required (clients must, before anything else). Unset: required when tls_cert is \
         set, off otherwise. Clients: nbdinfo/nbdcopy with nbds://...?tls-certificates=DIR, \
         qemu with --object tls-creds-x509. TLS with a pre-shared key (PSK) is not available: \
         rustls, the TLS library, does not implement it.",
    ),
    key(
        "servers.nbd.tls_cert",
        One(check_path),
        Example("\"/etc/bucketfs/nbd-server-cert.pem\""),
        "PEM file with the server's certificate (then any intermediate certificates). Clients \
         check it against their CA and the address they connect to.",
    ),
    key(
        "servers.nbd.tls_key",
        One(check_path),
        Example("\"/etc/bucketfs/nbd-server-key.pem\""),
        "PEM file with the private key of tls_cert (PKCS#8, PKCS#1 or SEC1).",
    ),
    key(
        "servers.nbd.tls_client_ca",
        One(check_path),
        Example("\"/etc/bucketfs/nbd-client-ca.pem\""),
        "PEM file with the CA certificate(s) that sign client certificates. When set, every \
         client must present a certificate signed by one of them, and tls must be required. \
         Without it, TLS encrypts but anyone who can connect may use every block device.",
    ),
    key(
        "servers.nbd.allow",
        One(check_allow),
        Example("{ \"CN=alice\" = [\"disk1\", \"disk2\"], \"CN=backup\" = [\"*\"] }"),
        "Which block devices each client may see and open, by the common name (CN) of its \
         verified certificate; \"*\" stands for all of them. Needs tls_client_ca. A client \
         whose name is not listed sees none (so {} admits nobody), and a device it may not use \
         is answered as if it did not exist. Unset: every client may use every block device.",
    ),
    // 9P has no authentication of its own (a client names its uid at attach), so by default
    // it listens on loopback only. 564 is 9P's registered port; 5564 needs no privilege.
    key(
        "servers.ninep.listen",
        Each(check_socket_address),
        default("[\"127.0.0.1:5564\"]"),
        "TCP addresses of the 9P2000.L server (the POSIX filesystem, for `bucketfs mount` and \
         Linux's v9fs); [] turns TCP off. 9P has no authentication: a client names the uid it \
         acts as, so anyone who can connect can act as any user, root included. Keep it on \
         loopback unless the network is trusted; bucketfs warns at start when it is not.",
    ),
    key(
        "servers.ninep.unix_socket",
        One(check_unix_socket),
        Example("\"/run/bucketfs/9p.sock\""),
        "Unix socket of the 9P server, where file permissions control who may connect; unset \
         means none.",
    ),
    key(
        "servers.nfs.listen",
        Each(check_socket_address),
        default("[\"127.0.0.1:2049\"]"),
        "TCP addresses of the NFSv3 server (MOUNT and NFS on the same port, no portmapper: \
         clients give it as both ports, e.g. mount's port=2049,mountport=2049 or nfs-ls's \
         ?nfsport=2049&mountport=2049); [] turns NFS off. WRITE answers UNSTABLE and COMMIT \
         makes data durable (docs/0007). AUTH_SYS: a client names the uid it acts as, so keep \
         it on loopback unless the network is trusted; bucketfs warns at start when it is not.",
    ),
    key(
        "servers.nfs.exports",
        Each(check_export),
        Example(
            "[{ path = \"/\", clients = [\"127.0.0.1\"] }, \
             { path = \"/srv\", read_only = true, clients = [\"10.0.0.0/8\"] }]",
        ),
        "The directories NFS clients may mount, written as [[servers.nfs.exports]] tables: \
         path (absolute, in the filesystem); clients (\"*\", addresses or networks such as \
         \"10.0.0.0/8\"; default [\"*\"]), the clients that may use it; read_only (default \
         false); root_squash (default true): root of a client that is not on loopback acts as \
         nobody (65534). A client may mount any directory below an export and never climbs \
         above it. Unset: the whole filesystem, to every client that can connect, root \
         squashed.",
    ),
    key(
        "filesystem.quota_bytes",
        One(check_size),
        Example("\"100GiB\""),
        "Most bytes the filesystem's files may allocate (whole 8 KiB extents, before \
         compression; block devices count as the extents written to them). Writes that would \
         allocate beyond it fail with ENOSPC; deletes and overwrites of allocated data are \
         always allowed. statfs reports it as the size. Unset: no quota.",
    ),
    // A unix socket by default, where the file mode is the access control: the admin endpoint
    // can delete block devices.
    key(
        "admin.socket",
        One(check_unix_socket),
        Example("\"/run/bucketfs/admin.sock\""),
        "Unix socket of the admin endpoint that the CLI (`bucketfs nbd create ...`, `bucketfs \
         status`) talks to, created with mode 0600: only the user that runs the server, and \
         root, can use it. Unset: admin.sock in cache.dir.",
    ),
    key(
        "admin.listen",
        One(check_socket_address),
        Example("\"127.0.0.1:10810\""),
        "Also serve the admin endpoint on this TCP address, for tools on other machines; \
         unset means no TCP. Needs admin.token. The CLI always uses the socket.",
    ),
    key(
        "admin.token",
        One(check_token),
        Example("\"${BUCKETFS_ADMIN_TOKEN}\""),
        "Secret that every request over admin.listen must carry (its \"token\" field); at \
         least 16 characters. It travels in clear text, so keep admin.listen on a trusted \
         network.",
    ),
    // Off by default: Prometheus needs an address in its own config anyway, and a default
    // port would clash between a writer and a checkpoint reader on one machine.
    key(
        "admin.metrics_listen",
        One(check_socket_address),
        Example("\"127.0.0.1:10811\""),
        "Serve GET /metrics in Prometheus' text format on this TCP address: object-store \
         requests, bytes and latency, flush barrier latency and its parts, cache hits and \
         misses. No authentication, so keep it on loopback or a trusted network. Unset: no \
         HTTP listener; `bucketfs metrics` prints the same text through the admin socket.",
    ),
];

pub(super) const SECTIONS: &[Section] = &[
    Section {
        path: "aws",
        doc: "Credentials and endpoint for s3:// URLs (Amazon S3, MinIO, Hetzner, R2, ...).",
    },
    Section {
        path: "gcp",
        doc: "Credentials for gs:// URLs (Google Cloud Storage).",
    },
    Section {
        path: "azure",
        doc: "Credentials and endpoint for az:// URLs (Azure Blob Storage).",
    },
    Section {
        path: "tuning",
        doc: "Values fitted to a workload on a machine; docs/benchmarks.md has the \
              measurements. Each is listed with its default, commented out so that the \
              default applies.",
    },
];

/// Every key of the file, in the template's order.
pub(super) fn keys() -> &'static [Key] {
    static KEYS: LazyLock<Vec<Key>> = LazyLock::new(|| {
        let mut keys = DECLARED.to_vec();
        keys.extend(super::tuning::keys());
        keys
    });
    &KEYS
}

pub(super) fn find(path: &str) -> Option<&'static Key> {
    keys().iter().find(|key| key.path == path)
}

/// Whether `path` names a table that holds keys (`servers`, `servers.nbd`).
pub(super) fn is_table(path: &str) -> bool {
    keys().iter().any(|key| {
        key.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The names that may appear in the table at `prefix` ("" for the top level), in the order
/// of the table above.
pub(super) fn names_in(prefix: &str) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for key in keys() {
        let rest = if prefix.is_empty() {
            Some(&*key.path)
        } else {
            key.path
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('.'))
        };
        if let Some(name) = rest.and_then(|rest| rest.split('.').next()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The value at a dotted path, when every table on the way is there.
pub(super) fn lookup<'v>(table: &'v Table, path: &str) -> Option<&'v Value> {
    let mut parts = path.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// Sets every unset key that has a default, and creates every table, so that the structs
/// need no defaults of their own. Runs after the checks, which made every table a table.
pub(super) fn fill_defaults(root: &mut Table) {
    for key in keys() {
        let (table_path, name) = key.split();
        let mut table = &mut *root;
        for part in table_path.split('.') {
            table = table
                .entry(part)
                .or_insert_with(|| Value::Table(Table::new()))
                .as_table_mut()
                .expect("check_keys let through only tables where the keys have tables");
        }
        if let Some(text) = key.shown.default() {
            if !table.contains_key(name) {
                table.insert(name.to_string(), parse_value(text));
            }
        }
    }
}

/// A value written as TOML text.
fn parse_value(text: &str) -> Value {
    let mut table: Table = format!("value = {text}")
        .parse()
        .expect("defaults are valid TOML values (tested)");
    table
        .remove("value")
        .expect("a table parsed from `value = ...` holds `value`")
}
