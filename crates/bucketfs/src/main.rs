//! `bucketfs`: the one binary. `run` serves; the other commands talk to a running server's admin
//! endpoint or, for `init` and `change-password`, work on files and the bucket directly.

mod admin;
mod exports;
mod metrics;
mod mount;
mod run;
mod tls;

use bucketfs::{config, size};

use clap::{Parser, Subcommand};

/// Every request allocates and frees extent-sized buffers; glibc's allocator took 17 % of the
/// CPU of 1 MiB sequential reads (perf), mimalloc a fraction of that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "bucketfs",
    version,
    about = "A filesystem and block devices in an object-store bucket, served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a commented configuration file (default ./bucketfs.toml; `-` for stdout).
    Init {
        #[arg(short = 'o', long = "output", default_value = "bucketfs.toml")]
        output: String,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Serve until SIGTERM or SIGINT. Without -c: the embedded default (bucket in
    /// ./bucketfs-data, servers on localhost only).
    Run {
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Serve the bucket without writing to it (no writer lock is taken).
        #[arg(long)]
        read_only: bool,
        /// Serve this named checkpoint, read-only, beside or instead of the writer.
        #[arg(long, value_name = "NAME")]
        checkpoint: Option<String>,
        /// Start even though the journal this bucket was last written through
        /// ([storage.journal]) is missing: writes only that journal held are lost.
        #[arg(long)]
        accept_journal_loss: bool,
    },
    /// Named checkpoints of the running server: the state as of a moment, kept until deleted.
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
    /// Manage block devices (the files of /.nbd/) on the running server.
    #[command(subcommand)]
    Nbd(NbdCommand),
    /// Mount a 9P2000.L server's filesystem on DIR with FUSE (bucketfs's, or any other such
    /// as diod's), until SIGINT or SIGTERM. ADDR is HOST:PORT or the path of a unix socket.
    Mount {
        addr: String,
        dir: PathBuf,
        /// The tree to mount (9P's aname): a path in the server's filesystem.
        #[arg(long, default_value = "/")]
        aname: String,
        /// Let users other than the one mounting use it (each acts as itself on the server).
        #[arg(long)]
        allow_other: bool,
        /// What the kernel may cache, like v9fs's cache= modes.
        #[arg(long, value_enum, default_value = "mmap")]
        cache: mount::Cache,
        /// mount(8)-style options, comma-separated: cache=MODE, aname=PATH, allow_other.
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
    },
    /// Print the running server's counters as JSON.
    Status {
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Print the running server's metrics in Prometheus' text format: what GET /metrics on
    /// admin.metrics_listen answers.
    Metrics {
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Verify the whole bucket: every object's authentication and the metadata's invariants.
    /// Exit status 0: clean; 1: damage found; 2: the check could not run. Run it with the
    /// server stopped (beside a running one, what it collects meanwhile may show as missing).
    Fsck {
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also delete garbage (objects nothing needs); needs the writer lock, so the server
        /// must be stopped. Damage is never "repaired": it is reported.
        #[arg(long)]
        repair: bool,
    },
    /// Rewrap the data key under a new password, read from standard input. Data is not
    /// re-encrypted. Update storage.encryption_password afterwards.
    ChangePassword {
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// Checkpoint everything acknowledged so far under NAME (writes go on meanwhile).
    Create {
        name: String,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// List named checkpoints: name, log object, creation time (Unix seconds), log objects kept.
    List {
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Delete a named checkpoint; the collector reclaims what only it kept.
    Delete {
        name: String,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum NbdCommand {
    /// Create a block device.
    Create {
        name: String,
        /// Size, e.g. 20G, 512MiB, 1073741824.
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// List block devices.
    List {
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Change a block device's size (bytes cut off are deallocated).
    Resize {
        name: String,
        #[arg(long, value_parser = size::parse_size)]
        size: u64,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
    /// Delete a block device and its data.
    Delete {
        name: String,
        #[arg(short, long)]
        config: Option<PathBuf>,
    },
}

fn load_config(path: Option<&PathBuf>) -> Result<config::Config, String> {
    match path {
        Some(p) => config::Config::load(p).map_err(|e| e.to_string()),
        None => Ok(config::Config::embedded_default()),
    }
}

fn init(output: &str, force: bool) -> Result<(), String> {
    if output == "-" {
        print!("{}", config::init_template());
        return Ok(());
    }
    let path = PathBuf::from(output);
    if path.exists() && !force {
        return Err(format!(
            "{output} already exists; use --force to overwrite it"
        ));
    }
    std::fs::write(&path, config::init_template()).map_err(|e| format!("{output}: {e}"))?;
    eprintln!("wrote {output}; set BUCKETFS_PASSWORD (or storage.encryption_password) and run `bucketfs run -c {output}`");
    Ok(())
}

async fn admin_call(config: Option<&PathBuf>, request: admin::Request) -> Result<(), String> {
    let cfg = load_config(config)?;
    let reply = admin::call(&cfg.admin_socket(), &request).await?;
    match request {
        admin::Request::List => {
            if let Some(devs) = reply.as_array() {
                for d in devs {
                    let size = d["size_bytes"].as_u64().unwrap_or(0);
                    println!(
                        "{}\t{}\t{}",
                        d["name"].as_str().unwrap_or("?"),
                        size,
                        size::format_size(size)
                    );
                }
            }
        }
        admin::Request::CheckpointList => {
            for c in reply.as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    c["name"].as_str().unwrap_or("?"),
                    c["seq"].as_u64().unwrap_or(0),
                    c["created_unix_s"].as_u64().unwrap_or(0),
                    c["log_objects"].as_u64().unwrap_or(0)
                );
            }
        }
        admin::Request::CheckpointCreate { .. } => println!(
            "checkpoint {} created as of log object {}",
            reply["name"].as_str().unwrap_or("?"),
            reply["seq"].as_u64().unwrap_or(0)
        ),
        admin::Request::Status => println!(
            "{}",
            serde_json::to_string_pretty(&reply).unwrap_or_default()
        ),
        admin::Request::Metrics => print!("{}", reply.as_str().unwrap_or_default()),
        _ => {}
    }
    Ok(())
}

async fn change_password(config: Option<&PathBuf>) -> Result<(), String> {
    let cfg = load_config(config)?;
    let old = run::password(&cfg, config.is_some())?;
    let mut new = String::new();
    std::io::stdin()
        .read_to_string(&mut new)
        .map_err(|e| format!("reading the new password from standard input: {e}"))?;
    let new = new.trim_end_matches(['\n', '\r']);
    if new.is_empty() {
        return Err("the new password (read from standard input) is empty".into());
    }
    let (bucket, _, _) = run::open_bucket(&cfg, false)?;
    bucketfs_engine::change_password(&bucket, &old, new)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("password changed; now set storage.encryption_password (or BUCKETFS_PASSWORD) to the new one");
    Ok(())
}

/// Runs `bucketfs fsck`; Ok(true) when the bucket is clean.
async fn fsck(config: Option<&PathBuf>, json: bool, repair: bool) -> Result<bool, String> {
    let cfg = load_config(config)?;
    let password = run::password(&cfg, config.is_some())?;
    let (bucket, _, _) = run::open_bucket(&cfg, false)?;
    let opts = run::engine_options(&cfg, password, !repair);
    let engine = match bucketfs_engine::Engine::open(bucket, opts).await {
        Ok(e) => e,
        // Damaged metadata (a run, a manifest, a log object's records): named, as damage.
        Err(bucketfs_engine::EngineError::Corrupt(why)) => {
            if json {
                let report = serde_json::json!({
                    "opens": false,
                    "problems": [{"object": why.split(':').next().unwrap_or(""), "what": why}],
                });
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("serialises")
                );
            } else {
                println!("DAMAGED {why}");
                println!(
                    "DAMAGED: the bucket's metadata does not load, so nothing else was checked"
                );
            }
            return Ok(false);
        }
        Err(e) => {
            return Err(format!(
                "{}: the bucket does not open: {e}",
                cfg.storage.url
            ))
        }
    };
    let report = engine.fsck(repair).await.map_err(|e| e.to_string())?;
    if repair {
        engine.close().await.map_err(|e| e.to_string())?;
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("the report serialises")
        );
    } else {
        for p in &report.problems {
            let extents: Vec<String> = p
                .first_extents
                .iter()
                .map(|(ino, offset)| format!("inode {ino} at {offset}"))
                .collect();
            println!(
                "DAMAGED {}: {} ({} extents unreadable{}{})",
                p.object,
                p.what,
                p.extents_damaged,
                if extents.is_empty() { "" } else { ": " },
                extents.join(", ")
            );
        }
        if report.problems_not_listed > 0 {
            println!("... and {} more problems", report.problems_not_listed);
        }
        for g in &report.garbage {
            println!("garbage {g}{}", if repair { " (deleted)" } else { "" });
        }
        println!(
            "{}: {} log objects ({} bytes), {} read, {} extents verified, {} damaged; {} runs, {} named checkpoints; {} garbage objects{}",
            if report.is_clean() { "clean" } else { "DAMAGED" },
            report.log_objects,
            report.log_bytes,
            report.log_objects_read,
            report.extents_checked,
            report.extents_damaged,
            report.runs,
            report.named_checkpoints,
            report.garbage.len(),
            if repair { " deleted" } else { "" }
        );
    }
    Ok(report.is_clean())
}

/// Turns transparent huge pages off for this process. The allocator gives freed memory back to
/// the kernel and faults it in again as buffers churn; where THP is on for every mapping, each
/// such fault zeroes a 2 MiB page. Under a streaming writer that zeroing was half the server's
/// CPU and doubled the p99 of other clients' small fsyncs
/// (docs/benchmarks/2026-11-29-transparent-huge-pages.md). A kernel without the call changes
/// nothing.
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bucketfs: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let done = match cli.command {
            Command::Init { output, force } => init(&output, force),
            Command::Run {
                config,
                read_only,
                checkpoint,
                accept_journal_loss,
            } => {
                run::run(
                    config.as_ref(),
                    read_only,
                    checkpoint.as_deref(),
                    accept_journal_loss,
                )
                .await
            }
            Command::Checkpoint(CheckpointCommand::Create { name, config }) => {
                admin_call(config.as_ref(), admin::Request::CheckpointCreate { name }).await
            }
            Command::Checkpoint(CheckpointCommand::List { config }) => {
                admin_call(config.as_ref(), admin::Request::CheckpointList).await
            }
            Command::Checkpoint(CheckpointCommand::Delete { name, config }) => {
                admin_call(config.as_ref(), admin::Request::CheckpointDelete { name }).await
            }
            Command::Nbd(NbdCommand::Create { name, size, config }) => {
                admin_call(
                    config.as_ref(),
                    admin::Request::Create {
                        name,
                        size_bytes: size,
                    },
                )
                .await
            }
            Command::Nbd(NbdCommand::List { config }) => {
                admin_call(config.as_ref(), admin::Request::List).await
            }
            Command::Nbd(NbdCommand::Resize { name, size, config }) => {
                admin_call(
                    config.as_ref(),
                    admin::Request::Resize {
                        name,
                        size_bytes: size,
                    },
                )
                .await
            }
            Command::Nbd(NbdCommand::Delete { name, config }) => {
                admin_call(config.as_ref(), admin::Request::Delete { name }).await
            }
            Command::Mount {
                addr,
                dir,
                aname,
                allow_other,
                cache,
                options,
            } => {
                let mut o = mount::Options {
                    aname,
                    allow_other,
                    cache,
                };
                match options.iter().try_for_each(|list| o.apply(list)) {
                    Ok(()) => mount::mount(&addr, &dir, &o).await,
                    Err(e) => Err(e),
                }
            }
            Command::Status { config } => admin_call(config.as_ref(), admin::Request::Status).await,
            Command::Metrics { config } => {
                admin_call(config.as_ref(), admin::Request::Metrics).await
            }
            Command::ChangePassword { config } => change_password(config.as_ref()).await,
            Command::Fsck {
                config,
                json,
                repair,
            } => {
                return Ok(match fsck(config.as_ref(), json, repair).await {
                    Ok(true) => ExitCode::SUCCESS,
                    Ok(false) => ExitCode::from(1),
                    Err(e) => {
                        eprintln!("bucketfs fsck: {e}");
                        ExitCode::from(2)
                    }
                });
            }
        };
        done.map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bucketfs: {e}");
            ExitCode::FAILURE
        }
    }
}
