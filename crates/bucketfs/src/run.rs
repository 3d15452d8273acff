//! `bucketfs run`: wires the configured bucket, engine, filesystem and servers together.

use crate::admin::Admin;
use crate::config::{Compression, Config};
use crate::exports::BlockDevices;
use bucketfs_engine::bucket::{
    open_url, CountingBucket, JournalTier, JournaledBucket, RetryingBucket, SharedBucket,
    TargetSpec,
};
use bucketfs_engine::{Codec, Engine, EngineOptions, KdfCost, TaskSet};
use bucketfs_fs::Fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Used only by the embedded default (no -c) when BUCKETFS_PASSWORD is unset, so that a first
/// `bucketfs run` works; the log says loudly that such a bucket is not protected.
const EMBEDDED_DEFAULT_PASSWORD: &str = "bucketfs-embedded-default-password";

/// The encryption password: storage.encryption_password, else BUCKETFS_PASSWORD.
pub fn password(cfg: &Config, from_file: bool) -> Result<String, String> {
    let pw = match (&cfg.storage.encryption_password, std::env::var("BUCKETFS_PASSWORD")) {
        (Some(p), _) => p.clone(),
        (None, Ok(p)) => p,
        (None, Err(_)) if !from_file => {
            tracing::warn!("no encryption password configured: using the built-in development password; anyone with this binary can read the bucket. Run `bucketfs init` and set BUCKETFS_PASSWORD for real data.");
            EMBEDDED_DEFAULT_PASSWORD.to_string()
        }
        (None, Err(_)) => return Err("no encryption password: set storage.encryption_password in the config file or the BUCKETFS_PASSWORD environment variable".into()),
    };
    if pw.is_empty() {
        return Err(
            "the encryption password is empty (storage.encryption_password or BUCKETFS_PASSWORD)"
                .into(),
        );
    }
    Ok(pw)
}

fn store_options(cfg: &Config) -> Vec<(String, String)> {
    let mut o = Vec::new();
    let mut add = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            o.push((k.to_string(), v.clone()));
        }
    };
    add("aws_access_key_id", &cfg.aws.access_key_id);
    add("aws_secret_access_key", &cfg.aws.secret_access_key);
    add("aws_session_token", &cfg.aws.session_token);
    add("aws_region", &cfg.aws.region);
    add("aws_endpoint", &cfg.aws.endpoint);
    add("aws_allow_http", &cfg.aws.allow_http.map(|b| b.to_string()));
    add("google_service_account", &cfg.gcp.service_account_path);
    add("google_service_account_key", &cfg.gcp.service_account_key);
    add("azure_storage_account_name", &cfg.azure.account_name);
    add("azure_storage_account_key", &cfg.azure.access_key);
    add("azure_storage_endpoint", &cfg.azure.endpoint);
    add(
        "azure_allow_http",
        &cfg.azure.allow_http.map(|b| b.to_string()),
    );
    add(
        "azure_storage_use_emulator",
        &cfg.azure.use_emulator.map(|b| b.to_string()),
    );
    o
}

/// The bucket with its decorators: requests are counted (every attempt), then retried, and
/// the writer's changes go through the journal tier when `[storage.journal]` sets one (without
/// one it still checks that the bucket names no journal).
pub fn open_bucket(
    cfg: &Config,
    accept_journal_loss: bool,
) -> Result<(SharedBucket, Arc<CountingBucket>, Arc<JournaledBucket>), String> {
    let store = open_url(&cfg.storage.url, &store_options(cfg))?;
    let counting = Arc::new(CountingBucket::new(store));
    let retrying: SharedBucket = Arc::new(RetryingBucket::new(counting.clone()));
    let mut targets = Vec::new();
    for t in cfg.storage.journal.all_targets() {
        targets.push(match (t.path, t.url) {
            (Some(path), _) => TargetSpec::Dir(path),
            (None, Some(url)) => {
                let mut options = store_options(cfg);
                if let Some(endpoint) = &t.endpoint {
                    options.retain(|(k, _)| k != "aws_endpoint");
                    options.push(("aws_endpoint".into(), endpoint.clone()));
                }
                let store =
                    open_url(&url, &options).map_err(|e| format!("journal target {url}: {e}"))?;
                TargetSpec::Store { url, bucket: store }
            }
            (None, None) => {
                return Err("storage.journal.targets: a target names neither path nor url".into())
            }
        });
    }
    let journaled = Arc::new(JournaledBucket::new(
        retrying,
        JournalTier {
            targets,
            write_quorum: cfg.storage.journal.quorum(),
            accept_loss: accept_journal_loss,
            bucket_url: cfg.storage.url.clone(),
            ring_bytes: None,
            stop_wait: None,
        },
    ));
    Ok((journaled.clone(), counting, journaled))
}

/// The engine's options as the config sets them.
pub fn engine_options(cfg: &Config, password: String, read_only: bool) -> EngineOptions {
    EngineOptions {
        password,
        codec: match cfg.storage.compression {
            Compression::Zstd => Codec::Zstd,
            Compression::Lz4 => Codec::Lz4,
            Compression::None => Codec::None,
        },
        flush_interval: Duration::from_millis(cfg.storage.flush_interval_ms),
        memory_cache_bytes_max: cfg.cache.memory_bytes_max,
        metadata_cache_bytes_max: cfg.cache.metadata_bytes_max,
        // A file:// bucket is already on local disk: a second local copy would only cost writes.
        disk_cache_dir: (!cfg.storage.url.starts_with("file://")).then(|| cfg.cache.dir.clone()),
        disk_cache_bytes_max: cfg.cache.disk_bytes_max,
        read_only,
        outage_timeout: Duration::from_secs(cfg.storage.outage_timeout_s),
        checkpoint: None,
        tuning: cfg.tuning.clone(),
        kdf_cost: KdfCost::default(),
        tasks: TaskSet::default(),
        // A reader never writes; a writer's tier journals records only with targets.
        journaled_barriers: !read_only && !cfg.storage.journal.all_targets().is_empty(),
    }
}

pub async fn run(
    config: Option<&PathBuf>,
    read_only: bool,
    checkpoint: Option<&str>,
    accept_journal_loss: bool,
) -> Result<(), String> {
    let cfg = crate::load_config(config)?;
    for w in cfg.exposure_warnings() {
        tracing::warn!("{w}");
    }
    // Certificates are read before the bucket is opened, so that a bad one fails at once.
    let policy = Arc::new(crate::tls::nbd_policy(&cfg.servers.nbd)?);
    let password = password(&cfg, config.is_some())?;
    let (bucket, counting, journaled) = open_bucket(&cfg, accept_journal_loss)?;
    if !read_only && checkpoint.is_none() {
        tracing::info!("durability: {}", journaled.guarantee());
    }
    let mut opts = engine_options(&cfg, password, read_only || checkpoint.is_some());
    opts.checkpoint = checkpoint.map(str::to_string);
    if let Some(name) = checkpoint {
        bucketfs_engine::check_checkpoint_name(name).map_err(|e| format!("--checkpoint: {e}"))?;
    }
    let engine = Engine::open(bucket, opts)
        .await
        .map_err(|e| format!("{}: {e}", cfg.storage.url))?;
    let fs = Arc::new(Fs::open(engine.clone()).await.map_err(|e| e.to_string())?);
    fs.set_quota(cfg.filesystem.quota_bytes);
    let exports = Arc::new(BlockDevices { fs: fs.clone() });

    let admin = Arc::new(Admin {
        fs: fs.clone(),
        counts: counting,
        journal: journaled,
    });
    let admin_socket = cfg.admin_socket();
    let admin_listener = crate::admin::bind_socket(&admin_socket)?;
    tokio::spawn(admin.clone().serve_socket(admin_listener));
    if let (Some(addr), Some(token)) = (cfg.admin.listen, &cfg.admin.token) {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("admin.listen {addr}: {e}"))?;
        tracing::info!(%addr, "serving the admin endpoint over TCP (requests need admin.token)");
        tokio::spawn(admin.clone().serve_tcp(l, token.clone()));
    }
    if let Some(addr) = cfg.admin.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("admin.metrics_listen {addr}: {e}"))?;
        tracing::info!(%addr, "serving GET /metrics (Prometheus text format, no authentication)");
        let (counts, engine, journal) =
            (admin.counts.clone(), engine.clone(), admin.journal.clone());
        let sample = Arc::new(move || crate::metrics::Sample::take(&counts, &engine, &journal));
        tokio::spawn(crate::metrics::serve(l, sample));
    }

    let tls_mode = cfg.servers.nbd.tls_mode();
    let client_certificates = cfg.servers.nbd.tls_client_ca.is_some();
    for addr in &cfg.servers.nbd.listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("servers.nbd.listen {addr}: {e}"))?;
        tracing::info!(%addr, tls = tls_mode.as_str(), client_certificates, "serving NBD");
        let exports = exports.clone();
        let policy = policy.clone();
        tokio::spawn(async move {
            if let Err(e) = bucketfs_nbd::serve_tcp(l, exports, policy).await {
                tracing::error!(error = %e, "NBD TCP server stopped");
            }
        });
    }
    if let Some(path) = &cfg.servers.nbd.unix_socket {
        let _ = std::fs::remove_file(path);
        let l = tokio::net::UnixListener::bind(path)
            .map_err(|e| format!("servers.nbd.unix_socket {}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), tls = tls_mode.as_str(), "serving NBD on a unix socket");
        let exports = exports.clone();
        let policy = policy.clone();
        tokio::spawn(async move {
            if let Err(e) = bucketfs_nbd::serve_unix(l, exports, policy).await {
                tracing::error!(error = %e, "NBD unix-socket server stopped");
            }
        });
    }
    let ninep = bucketfs_ninep::Server::new(fs.clone());
    for addr in &cfg.servers.ninep.listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("servers.ninep.listen {addr}: {e}"))?;
        tracing::info!(%addr, "serving 9P2000.L");
        let server = ninep.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve_tcp(l).await {
                tracing::error!(error = %e, "9P TCP server stopped");
            }
        });
    }
    if let Some(path) = &cfg.servers.ninep.unix_socket {
        let _ = std::fs::remove_file(path);
        let l = tokio::net::UnixListener::bind(path)
            .map_err(|e| format!("servers.ninep.unix_socket {}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), "serving 9P2000.L on a unix socket");
        let server = ninep.clone();
        tokio::spawn(async move {
            if let Err(e) = server.serve_unix(l).await {
                tracing::error!(error = %e, "9P unix-socket server stopped");
            }
        });
    }
    if !cfg.servers.nfs.listen.is_empty() {
        use bucketfs_nfs::{export::Exports, mount::MountProgram, nfs3::Nfs3Program};
        let rules = cfg.servers.nfs.exports.iter().flatten();
        let rules = rules
            .map(|e| e.rule())
            .collect::<Result<Vec<_>, _>>()
            .and_then(|rules| Exports::new(&fs, rules))
            .map_err(|e| format!("servers.nfs.exports: {e}"))?;
        let exports = Arc::new(rules);
        for e in exports.iter() {
            tracing::info!(path = %e.rule.path, clients = ?e.rule.clients, read_only = e.rule.read_only, root_squash = e.rule.root_squash, "NFS export");
        }
        // A record holds at most one WRITE of IO_BYTES_MAX and its headers.
        let record_bytes_max = bucketfs_nfs::nfs3::IO_BYTES_MAX as usize + 64 * 1024;
        let nfs = bucketfs_nfs::server::Dispatcher::new(
            vec![
                Arc::new(MountProgram::new(fs.clone(), exports.clone())),
                Arc::new(Nfs3Program::new(fs.clone(), exports)),
            ],
            record_bytes_max,
        );
        for addr in &cfg.servers.nfs.listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("servers.nfs.listen {addr}: {e}"))?;
            tracing::info!(%addr, "serving NFSv3 and MOUNT v3");
            let server = nfs.clone();
            tokio::spawn(async move {
                if let Err(e) = server.serve_tcp(l).await {
                    tracing::error!(error = %e, "NFS server stopped");
                }
            });
        }
    }
    let read_only = engine.read_only();
    tracing::info!(url = %cfg.storage.url, admin = %admin_socket.display(), read_only, checkpoint = checkpoint.unwrap_or(""), "bucketfs is serving");

    wait_for_shutdown().await;
    tracing::info!("shutting down: flushing");
    engine
        .close()
        .await
        .map_err(|e| format!("final flush failed: {e}"))?;
    // A socket left behind would only be replaced at the next start, but it would make a
    // client's "is the server running?" check lie until then.
    let _ = std::fs::remove_file(&admin_socket);
    tracing::info!("stopped cleanly");
    Ok(())
}

pub(crate) async fn wait_for_shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
