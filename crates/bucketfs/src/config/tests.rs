use super::keys::{self, lookup};
use super::*;

const ORIGIN: &str = "bucketfs.toml";

fn env_with<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |name| {
        vars.iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_string())
    }
}

pub(super) fn parse_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::parse_with_env(text, Path::new(ORIGIN), &env_with(vars))
}

pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    parse_env(text, &[])
}

pub(super) fn error(text: &str) -> String {
    error_env(text, &[])
}

pub(super) fn error_env(text: &str, vars: &[(&str, &str)]) -> String {
    match parse_env(text, vars) {
        Ok(config) => panic!("expected an error for {text:?}, got {config:?}"),
        Err(error) => error.to_string(),
    }
}

/// Every declared key, dotted: `servers.nbd.listen`.
fn declared_keys() -> Vec<&'static str> {
    keys::keys().iter().map(|key| &*key.path).collect()
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
        parse("[storage]\n[cache]\n[aws]\n[gcp]\n[azure]\n[servers.nbd]\n[admin]\n[tuning]\n")
            .unwrap(),
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
        vec!["127.0.0.1:10809".parse().unwrap()]
    );
    assert_eq!(config.servers.nbd.unix_socket, None);
    assert_eq!(config.admin.listen, None);
    assert_eq!(
        config.admin_socket(),
        PathBuf::from("./bucketfs-cache/admin.sock")
    );
    assert_eq!(config.servers.nbd.tls_mode(), TlsMode::Off);
    assert!(config.exposure_warnings().is_empty());
    assert_eq!(config.aws, AwsConfig::default());
    assert_eq!(config.gcp, GcpConfig::default());
    assert_eq!(config.azure, AzureConfig::default());
    assert_eq!(config.tuning, Tuning::default());
}

#[test]
fn init_template_parses_to_the_default_plus_password() {
    let config = parse_env(&init_template(), &[("BUCKETFS_PASSWORD", "hunter2")]).unwrap();
    let mut expected = Config::embedded_default();
    expected.storage.encryption_password = Some("hunter2".to_string());
    assert_eq!(config, expected);
}

#[test]
fn init_template_without_password_variable_names_key_and_variable() {
    assert_eq!(
        error(&init_template()),
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
    let full = uncomment_examples(&init_template());
    // Long enough for a token.
    let any_variable = |_: &str| Some("from-the-environment".to_string());
    let config = Config::parse_with_env(&full, Path::new(ORIGIN), &any_variable)
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(
        config.servers.nbd.unix_socket,
        Some(PathBuf::from("/run/bucketfs/nbd.sock"))
    );
    assert_eq!(config.aws.allow_http, Some(false));
    assert_eq!(
        config.gcp.service_account_key.as_deref(),
        Some("from-the-environment")
    );
    assert_eq!(config.servers.nbd.tls_mode(), TlsMode::Required);
    assert_eq!(
        config.admin_socket(),
        PathBuf::from("/run/bucketfs/admin.sock")
    );
    // The tuning values are commented out; uncommented, they are the defaults.
    assert_eq!(config.tuning, Tuning::default());

    let table: Table = full.parse().unwrap();
    let leaves = declared_keys();
    let untuned = leaves
        .iter()
        .filter(|leaf| !leaf.starts_with("tuning."))
        .count();
    assert_eq!(untuned, 41);
    for leaf in leaves {
        assert!(lookup(&table, leaf).is_some(), "the template lacks {leaf}");
    }
}

/// Every dotted key that `table` sets, tables walked into unless they are a key's value
/// (`servers.nbd.allow`).
fn leaves_of(table: &Table, prefix: &str, out: &mut Vec<String>) {
    for (name, value) in table {
        let dotted = join_key(prefix, name);
        match value {
            Value::Table(child) if keys::find(&dotted).is_none() => leaves_of(child, &dotted, out),
            _ => out.push(dotted),
        }
    }
}

#[test]
fn every_key_of_the_template_is_known_to_the_checker() {
    let table: Table = uncomment_examples(&init_template()).parse().unwrap();
    let mut leaves = Vec::new();
    leaves_of(&table, "", &mut leaves);
    assert_eq!(leaves.len(), declared_keys().len());
    for leaf in leaves {
        assert!(
            keys::find(&leaf).is_some(),
            "the checker does not know {leaf}"
        );
    }
}

#[test]
fn explained_tables_hold_keys() {
    for section in keys::SECTIONS {
        assert!(keys::is_table(section.path), "{}", section.path);
    }
}

#[test]
fn init_template_explains_every_setting() {
    let template = init_template();
    let lines: Vec<&str> = template.lines().collect();
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
fn key_table_and_structs_accept_the_same_keys() {
    // A key in the key table but not in the structs would pass stage 2 and then fail serde's
    // deny_unknown_fields with a message that names no key. Set each leaf on its own
    // with a valid value and check that serde takes it: the file loads, or fails only a rule
    // between keys (a TLS key alone, say), which runs after serde. (A struct field missing
    // from the table has no default, so the empty file fails to deserialise: tested above.)
    let full: Table = uncomment_examples(&init_template()).parse().unwrap();
    for leaf in declared_keys() {
        let (section, key) = leaf.rsplit_once('.').unwrap();
        let value = lookup(&full, leaf).unwrap();
        let text = format!("[{section}]\n{key} = {value}\n");
        let any_variable = |_: &str| Some("x".repeat(16));
        match Config::parse_with_env(&text, Path::new(ORIGIN), &any_variable) {
            Ok(_) => {}
            Err(ConfigError::InvalidValue { key, .. }) if key != "(file)" => {}
            Err(error) => panic!("{leaf}: {error}"),
        }
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
        [storage.journal]
        path = "/var/lib/bucketfs/journal"
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
        tls = "required"
        tls_cert = "/etc/bucketfs/cert.pem"
        tls_key = "/etc/bucketfs/key.pem"
        tls_client_ca = "/etc/bucketfs/ca.pem"
        allow = { "CN=alice" = ["disk1", "disk2"], "CN=backup" = ["*"] }
        [servers.ninep]
        listen = ["127.0.0.1:20564"]
        unix_socket = "/tmp/9p.sock"
        [servers.nfs]
        listen = ["127.0.0.1:22049"]
        [[servers.nfs.exports]]
        path = "/srv/"
        read_only = true
        clients = ["10.0.0.0/8", "192.0.2.7"]
        root_squash = false
        [[servers.nfs.exports]]
        path = "/"
        [filesystem]
        quota_bytes = "2TiB"
        [admin]
        socket = "/tmp/admin.sock"
        listen = "[::1]:20810"
        token = "${TOKEN}"
        metrics_listen = "127.0.0.1:20811"
        [tuning]
        log_objects_per_checkpoint_min = 4
    "#;
    let vars = [
        ("BUCKET", "data"),
        ("PW", "pw"),
        ("SECRET", "s3cr3t"),
        ("TOKEN", "0123456789abcdefXYZ"),
    ];
    let config = parse_env(text, &vars).unwrap();
    let expected = Config {
        storage: StorageConfig {
            url: "s3://data/volumes".to_string(),
            encryption_password: Some("pw".to_string()),
            compression: Compression::Lz4,
            flush_interval_ms: 500,
            outage_timeout_s: 600,
            journal: JournalConfig {
                path: Some(PathBuf::from("/var/lib/bucketfs/journal")),
                ..Default::default()
            },
        },
        cache: CacheConfig {
            dir: PathBuf::from("/var/cache/bucketfs"),
            disk_bytes_max: 1 << 40,
            memory_bytes_max: 512 << 20,
            metadata_bytes_max: 256 << 20,
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
                tls: Some(TlsMode::Required),
                tls_cert: Some(PathBuf::from("/etc/bucketfs/cert.pem")),
                tls_key: Some(PathBuf::from("/etc/bucketfs/key.pem")),
                tls_client_ca: Some(PathBuf::from("/etc/bucketfs/ca.pem")),
                allow: Some(BTreeMap::from([
                    (
                        "CN=alice".to_string(),
                        vec!["disk1".to_string(), "disk2".to_string()],
                    ),
                    ("CN=backup".to_string(), vec!["*".to_string()]),
                ])),
            },
            ninep: NinepServerConfig {
                listen: vec!["127.0.0.1:20564".parse().unwrap()],
                unix_socket: Some(PathBuf::from("/tmp/9p.sock")),
            },
            nfs: NfsServerConfig {
                listen: vec!["127.0.0.1:22049".parse().unwrap()],
                exports: Some(vec![
                    NfsExportConfig {
                        path: "/srv/".to_string(),
                        read_only: true,
                        clients: vec!["10.0.0.0/8".to_string(), "192.0.2.7".to_string()],
                        root_squash: false,
                    },
                    NfsExportConfig {
                        path: "/".to_string(),
                        read_only: false,
                        clients: vec!["*".to_string()],
                        root_squash: true,
                    },
                ]),
            },
        },
        filesystem: FilesystemConfig {
            quota_bytes: Some(2 << 40),
        },
        admin: AdminConfig {
            socket: Some(PathBuf::from("/tmp/admin.sock")),
            listen: Some("[::1]:20810".parse().unwrap()),
            token: Some("0123456789abcdefXYZ".to_string()),
            metrics_listen: Some("127.0.0.1:20811".parse().unwrap()),
        },
        tuning: Tuning {
            log_objects_per_checkpoint_min: 4,
            ..Tuning::default()
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

// --- [tuning] -------------------------------------------------------------------------

#[test]
fn tuning_key_reaches_the_config() {
    let config = parse("[tuning]\nlog_objects_per_checkpoint_min = 4\n").unwrap();
    let expected = Tuning {
        log_objects_per_checkpoint_min: 4,
        ..Tuning::default()
    };
    assert_eq!(config.tuning, expected);
    let config = parse("tuning.reseal_after_s = 0\n").unwrap();
    assert_eq!(config.tuning.reseal_after_s, 0);
}

#[test]
fn unknown_tuning_key_is_named_with_the_file() {
    let message = error("[tuning]\nlog_objects_per_checkpoint = 4\n");
    assert!(
        message.starts_with(
            "bucketfs.toml: unknown key `tuning.log_objects_per_checkpoint` (expected one of: \
             dirty_bytes_flush_start, "
        ),
        "{message}"
    );
    assert!(
        message.contains("log_objects_per_checkpoint_min"),
        "{message}"
    );
}

#[test]
fn invalid_tuning_values_name_their_key_and_the_file() {
    assert_eq!(
        error("[tuning]\nlog_objects_per_checkpoint_min = 0\n"),
        "bucketfs.toml: tuning.log_objects_per_checkpoint_min must be at least 1"
    );
    assert_eq!(
        error(
            "[tuning]\nlog_objects_per_checkpoint_min = 10\nlog_objects_per_checkpoint_max = 9\n"
        ),
        "bucketfs.toml: tuning.log_objects_per_checkpoint_max must be at least \
         tuning.log_objects_per_checkpoint_min"
    );
    assert_eq!(
        error("[tuning]\nrepack_live_percent_max = -1\n"),
        "bucketfs.toml: tuning.repack_live_percent_max: expected a non-negative integer, \
         found integer -1"
    );
    assert_eq!(
        error("[tuning]\nreseal_after_s = \"10m\"\n"),
        "bucketfs.toml: tuning.reseal_after_s: expected a non-negative integer, found string \
         \"10m\""
    );
}

#[test]
fn init_template_lists_every_tuning_value_commented_out_with_its_default() {
    let template = init_template();
    let section = template
        .split_once("\n[tuning]\n")
        .map(|(_, rest)| rest)
        .expect("the template has a [tuning] table");
    let defaults = match Value::try_from(Tuning::default()) {
        Ok(Value::Table(table)) => table,
        other => panic!("{other:?}"),
    };
    for (name, value) in defaults {
        let line = format!("# {name} = {value}\n");
        assert!(section.contains(&line), "the template lacks {line:?}");
    }
    assert!(
        section.contains("# Fewest log objects between checkpoints.\n"),
        "{section}"
    );
}

// --- unknown keys --------------------------------------------------------------------

#[test]
fn unknown_top_level_key_is_named_with_the_alternatives() {
    assert_eq!(
        error("[storag]\nurl = \"memory://\"\n"),
        "bucketfs.toml: unknown key `storag` (expected one of: storage, cache, aws, gcp, \
         azure, servers, filesystem, admin, tuning)"
    );
    assert_eq!(
        error("verbose = true\n"),
        "bucketfs.toml: unknown key `verbose` (expected one of: storage, cache, aws, gcp, \
         azure, servers, filesystem, admin, tuning)"
    );
}

#[test]
fn unknown_nested_key_is_named_with_its_dotted_path() {
    assert_eq!(
        error("[storage]\ncompresion = \"lz4\"\n"),
        "bucketfs.toml: unknown key `storage.compresion` (expected one of: url, \
         encryption_password, compression, flush_interval_ms, outage_timeout_s, journal)"
    );
    assert_eq!(
        error("[servers.smb]\nlisten = []\n"),
        "bucketfs.toml: unknown key `servers.smb` (expected one of: nbd, ninep, nfs)"
    );
    assert_eq!(
        error("[servers.nbd]\nlisten = []\nexport = \"x\"\n"),
        "bucketfs.toml: unknown key `servers.nbd.export` (expected one of: listen, \
         unix_socket, tls, tls_cert, tls_key, tls_client_ca, allow)"
    );
    // Dotted keys and inline tables are the same TOML, so they get the same message.
    assert_eq!(
        error("cache.size = 1\n"),
        "bucketfs.toml: unknown key `cache.size` (expected one of: dir, disk_bytes_max, \
         memory_bytes_max, metadata_bytes_max)"
    );
    assert_eq!(
        error("admin = { listen = \"127.0.0.1:1\", port = 2 }\n"),
        "bucketfs.toml: unknown key `admin.port` (expected one of: socket, listen, token, \
         metrics_listen)"
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
fn size_deserializer_matches_the_value_check() {
    // Stage 5 must accept what stage 4 accepted; exercise it directly on odd inputs.
    let cache: CacheConfig = toml::from_str(
        "dir = \"c\"\ndisk_bytes_max = \"7k\"\nmemory_bytes_max = 9\nmetadata_bytes_max = 1",
    )
    .unwrap();
    assert_eq!((cache.disk_bytes_max, cache.memory_bytes_max), (7 << 10, 9));
    let error = toml::from_str::<CacheConfig>(
        "dir = \"c\"\ndisk_bytes_max = -5\nmemory_bytes_max = 9\nmetadata_bytes_max = 1",
    )
    .unwrap_err();
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
fn nfs_exports_are_checked_field_by_field() {
    let export = |fields: &str| error(&format!("[[servers.nfs.exports]]\n{fields}\n"));
    for (fields, want) in [
        (
            "path = \"srv\"",
            "servers.nfs.exports[0]: path: \"srv\" is not an absolute path",
        ),
        (
            "path = \"/a/../b\"",
            "servers.nfs.exports[0]: path: \"/a/../b\" has a . or .. component",
        ),
        (
            "path = \"/\"\nclients = [\"10.0.0.0/33\"]",
            "servers.nfs.exports[0]: clients: \"10.0.0.0/33\" is not \"*\", an IP address",
        ),
        (
            "path = \"/\"\nclients = \"*\"",
            "servers.nfs.exports[0]: clients: expected an array",
        ),
        (
            "path = \"/\"\nread_only = \"yes\"",
            "servers.nfs.exports[0]: read_only: expected true or false, found string \"yes\"",
        ),
        (
            "path = \"/\"\nsquash = true",
            "servers.nfs.exports[0]: unknown key \"squash\" (an export takes path, read_only, \
             clients, root_squash)",
        ),
        (
            "read_only = true",
            "servers.nfs.exports[0]: path is missing",
        ),
        (
            "path = \"/x\"\n[[servers.nfs.exports]]\npath = \"/x/\"",
            "servers.nfs.exports[1]: \"/x\" is exported by servers.nfs.exports[0] already",
        ),
    ] {
        let message = export(fields);
        assert!(
            message.starts_with(&format!("bucketfs.toml: {want}")),
            "{fields}: {message}"
        );
    }
    // NFS on a port another server has.
    let message = error(
        "[servers.ninep]\nlisten = [\"127.0.0.1:7000\"]\n\
         [servers.nfs]\nlisten = [\"127.0.0.1:7000\"]\n",
    );
    assert_eq!(
        message,
        "bucketfs.toml: servers.nfs.listen: 127.0.0.1:7000 clashes with 127.0.0.1:7000, in \
         servers.ninep.listen"
    );
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
    assert_eq!(
        error("[servers.nbd]\nlisten = [\"0.0.0.0:10811\"]\n[admin]\nmetrics_listen = \"127.0.0.1:10811\"\n"),
        "bucketfs.toml: admin.metrics_listen: 127.0.0.1:10811 clashes with 0.0.0.0:10811 in \
         servers.nbd.listen; give /metrics a port of its own"
    );
    assert_eq!(
        error(
            "[admin]\nlisten = \"127.0.0.1:10810\"\ntoken = \"0123456789abcdef\"\n\
             metrics_listen = \"127.0.0.1:10810\"\n"
        ),
        "bucketfs.toml: admin.metrics_listen: 127.0.0.1:10810 clashes with 127.0.0.1:10810 in \
         admin.listen; give /metrics a port of its own"
    );
    // Port 0 asks for any free port, so it never clashes (tests rely on this).
    parse(
        "[servers.nbd]\nlisten = [\"127.0.0.1:0\", \"[::1]:0\"]\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         token = \"0123456789abcdef\"\n",
    )
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
         [admin]\nlisten = \"192.168.1.5:10810\"\ntoken = \"0123456789abcdef\"\n\
         metrics_listen = \"[::]:10811\"\n",
    )
    .unwrap();
    let warnings = config.exposure_warnings();
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    assert!(warnings[0].starts_with("servers.nbd.listen: 0.0.0.0:10809 is not a loopback"));
    assert!(warnings[1].starts_with("admin.listen: 192.168.1.5:10810 is not a loopback"));
    assert!(warnings[2].starts_with("admin.metrics_listen: [::]:10811 is not a loopback"));
    assert!(warnings[3].starts_with("storage.url: memory://"));
    let loopback = parse("[admin]\nmetrics_listen = \"127.0.0.1:10811\"\n").unwrap();
    assert!(loopback.exposure_warnings().is_empty());
}

// --- TLS, the allow-list and the admin endpoint ---------------------------------------------

const TLS_FILES: &str = "tls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n";

#[test]
fn a_certificate_makes_tls_required_unless_told_otherwise() {
    let config = parse(&format!("[servers.nbd]\n{TLS_FILES}")).unwrap();
    assert_eq!(config.servers.nbd.tls_mode(), TlsMode::Required);
    let config = parse(&format!("[servers.nbd]\n{TLS_FILES}tls = \"optional\"\n")).unwrap();
    assert_eq!(config.servers.nbd.tls_mode(), TlsMode::Optional);
    let config = parse(&format!("[servers.nbd]\n{TLS_FILES}tls = \"off\"\n")).unwrap();
    assert_eq!(config.servers.nbd.tls_mode(), TlsMode::Off);
}

#[test]
fn tls_keys_that_disagree_are_errors_naming_the_key() {
    assert_eq!(
        error("[servers.nbd]\ntls_cert = \"/c.pem\"\n"),
        "bucketfs.toml: servers.nbd.tls_key: tls_cert is set, so the private key of that \
         certificate must be set too"
    );
    assert_eq!(
        error("[servers.nbd]\ntls_key = \"/k.pem\"\n"),
        "bucketfs.toml: servers.nbd.tls_cert: tls_key is set, so the certificate of that key \
         must be set too"
    );
    assert_eq!(
        error("[servers.nbd]\ntls = \"required\"\n"),
        "bucketfs.toml: servers.nbd.tls: TLS required needs tls_cert and tls_key"
    );
    assert_eq!(
        error("[servers.nbd]\ntls = \"sometimes\"\n"),
        "bucketfs.toml: servers.nbd.tls: expected one of off, optional, required, found \
         \"sometimes\""
    );
    assert_eq!(
        error(&format!(
            "[servers.nbd]\n{TLS_FILES}tls = \"optional\"\ntls_client_ca = \"/ca.pem\"\n"
        )),
        "bucketfs.toml: servers.nbd.tls_client_ca: client certificates need tls = \"required\" \
         (it is \"optional\"): otherwise a client could connect without one"
    );
    assert_eq!(
        error(&format!(
            "[servers.nbd]\n{TLS_FILES}allow = {{ \"CN=a\" = [\"d\"] }}\n"
        )),
        "bucketfs.toml: servers.nbd.allow: an allow-list by certificate needs verified client \
         certificates: set tls_client_ca (and tls = \"required\")"
    );
}

#[test]
fn allow_list_entries_are_checked() {
    let with = |allow: &str| {
        format!("[servers.nbd]\n{TLS_FILES}tls_client_ca = \"/ca.pem\"\nallow = {allow}\n")
    };
    let config = parse(&with("{ \"CN=alice\" = [\"disk1\"], \"CN=b\" = [\"*\"] }")).unwrap();
    assert_eq!(config.servers.nbd.allow.unwrap().len(), 2);
    assert_eq!(
        error(&with("{ alice = [\"disk1\"] }")),
        "bucketfs.toml: servers.nbd.allow: entry \"alice\": expected a certificate name written \
         \"CN=name\""
    );
    assert_eq!(
        error(&with("{ \"CN=\" = [\"disk1\"] }")),
        "bucketfs.toml: servers.nbd.allow: entry \"CN=\": expected a certificate name written \
         \"CN=name\""
    );
    assert_eq!(
        error(&with("{ \"CN=alice\" = \"disk1\" }")),
        "bucketfs.toml: servers.nbd.allow: entry \"CN=alice\": expected an array of export \
         names, found string \"disk1\""
    );
    assert_eq!(
        error(&with("{ \"CN=alice\" = [\"\"] }")),
        "bucketfs.toml: servers.nbd.allow: entry \"CN=alice\": expected export names (or \"*\"), \
         found string \"\""
    );
    assert!(error(&with("[\"disk1\"]"))
        .starts_with("bucketfs.toml: servers.nbd.allow: expected a table"));
    // Even an empty list needs verified certificates: it admits nobody.
    assert!(error(&format!("[servers.nbd]\n{TLS_FILES}allow = {{}}\n"))
        .starts_with("bucketfs.toml: servers.nbd.allow: an allow-list by certificate needs"));
}

#[test]
fn admin_tcp_needs_a_long_enough_token() {
    assert_eq!(
        error("[admin]\nlisten = \"127.0.0.1:10810\"\n"),
        "bucketfs.toml: admin.token: admin.listen serves the admin endpoint over TCP, where \
         only a token keeps others out: set admin.token too"
    );
    assert_eq!(
        error("[admin]\nlisten = \"127.0.0.1:10810\"\ntoken = \"short\"\n"),
        "bucketfs.toml: admin.token: a token needs at least 16 characters, this one has 5"
    );
    assert_eq!(
        error("[admin]\ntoken = \"0123456789abcdef\"\n"),
        "bucketfs.toml: admin.token: a token is only used with admin.listen (the socket is \
         protected by its file mode): set admin.listen, or remove the token"
    );
    let config = parse("[admin]\nsocket = \"/run/b/admin.sock\"\n").unwrap();
    assert_eq!(config.admin_socket(), PathBuf::from("/run/b/admin.sock"));
    let config = parse("[cache]\ndir = \"/var/cache/b\"\n").unwrap();
    assert_eq!(
        config.admin_socket(),
        PathBuf::from("/var/cache/b/admin.sock")
    );
}

#[test]
fn the_admin_token_is_redacted() {
    let config =
        parse("[admin]\nlisten = \"127.0.0.1:10810\"\ntoken = \"TOPSECRET-TOKEN-0123\"\n").unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("TOPSECRET"), "{debug}");
}

#[test]
fn non_loopback_nbd_warns_unless_tls_with_client_certificates_is_required() {
    let warning = |nbd: &str| {
        let config = parse(&format!(
            "[servers.nbd]\nlisten = [\"0.0.0.0:10809\", \"127.0.0.1:10811\"]\n{nbd}"
        ))
        .unwrap();
        let warnings = config.exposure_warnings();
        assert!(warnings.len() <= 1, "{warnings:?}");
        warnings.into_iter().next()
    };
    let off = warning("").unwrap();
    assert!(
        off.starts_with(
            "servers.nbd.listen: 0.0.0.0:10809 is not a loopback address, and TLS is off"
        ),
        "{off}"
    );
    let optional = warning(&format!("{TLS_FILES}tls = \"optional\"\n")).unwrap();
    assert!(optional.contains("TLS is only optional"), "{optional}");
    let no_ca = warning(TLS_FILES).unwrap();
    assert!(
        no_ca.contains("client certificates are not required"),
        "{no_ca}"
    );
    assert_eq!(
        warning(&format!("{TLS_FILES}tls_client_ca = \"/ca.pem\"\n")),
        None
    );
}

#[test]
fn journal_targets_and_their_quorum() {
    let config = parse(
        "[storage.journal]\npath = \"/nvme/j\"\nwrite_quorum = 2\n\
         [[storage.journal.targets]]\nurl = \"s3://zone-b/j\"\nendpoint = \"http://10.0.0.2:9000\"\n\
         [[storage.journal.targets]]\nurl = \"s3://zone-c/j\"\n",
    )
    .unwrap();
    let targets = config.storage.journal.all_targets();
    assert_eq!(targets.len(), 3);
    assert_eq!(targets[0].path, Some(PathBuf::from("/nvme/j")));
    assert_eq!(targets[1].endpoint.as_deref(), Some("http://10.0.0.2:9000"));
    assert_eq!(config.storage.journal.quorum(), 2);
    // Unset: a majority.
    let config = parse(
        "[[storage.journal.targets]]\npath = \"/a\"\n[[storage.journal.targets]]\npath = \"/b\"\n\
         [[storage.journal.targets]]\npath = \"/c\"\n",
    )
    .unwrap();
    assert_eq!(config.storage.journal.quorum(), 2);

    assert_eq!(
        error("[storage.journal]\npath = \"/a\"\nwrite_quorum = 2\n"),
        "bucketfs.toml: storage.journal.write_quorum: 2 with 1 journal targets \
         (storage.journal.path and storage.journal.targets): it must be between 1 and their number"
    );
    assert_eq!(
        error("[[storage.journal.targets]]\npath = \"/a\"\nurl = \"s3://b/j\"\n"),
        "bucketfs.toml: storage.journal.targets[0]: give either path (a local directory) or \
         url (an object store), not both"
    );
    assert_eq!(
        error("[[storage.journal.targets]]\nendpoint = \"http://x\"\n"),
        "bucketfs.toml: storage.journal.targets[0]: path or url is missing: every target names \
         a local directory or an object store"
    );
    assert_eq!(
        error("[[storage.journal.targets]]\nurl = \"s3://b/j\"\nregion = \"x\"\n"),
        "bucketfs.toml: storage.journal.targets[0]: unknown key \"region\" (a journal target \
         takes path, or url and endpoint)"
    );
    assert!(error("[[storage.journal.targets]]\nurl = \"ftp://b/j\"\n")
        .starts_with("bucketfs.toml: storage.journal.targets[0]: url: unsupported scheme"));
}
