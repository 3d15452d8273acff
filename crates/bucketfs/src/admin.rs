//! The admin endpoint: one JSON request per line, one JSON reply per line. It listens on a unix
//! socket of mode 0600, so the file mode is the access control: only the user that runs the
//! server (and root) can connect. TCP is opt-in (`admin.listen`), and there every request must
//! carry the configured token (`{"op": "status", "token": "..."}`).

use crate::exports::fs_error_message;
use bucketfs_engine::bucket::{CountingBucket, JournaledBucket};
use bucketfs_fs::Fs;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};

/// Longest request line accepted: requests are a few names and numbers.
const REQUEST_BYTES_MAX: u64 = 64 * 1024;

/// Owner read and write: connecting to a unix socket needs write permission on it.
const ADMIN_SOCKET_MODE: u32 = 0o600;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Create {
        name: String,
        size_bytes: u64,
    },
    List,
    Resize {
        name: String,
        size_bytes: u64,
    },
    Delete {
        name: String,
    },
    Status,
    CheckpointCreate {
        name: String,
    },
    CheckpointList,
    CheckpointDelete {
        name: String,
    },
    /// The text of `/metrics` (docs/0008-metrics.md), as a JSON string.
    Metrics,
}

/// A request line: the request, and over TCP the token.
#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    token: Option<String>,
    #[serde(flatten)]
    request: Request,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default)]
    result: serde_json::Value,
    #[serde(default)]
    error: String,
}

pub struct Admin {
    pub fs: Arc<Fs>,
    pub counts: Arc<CountingBucket>,
    pub journal: Arc<JournaledBucket>,
}

/// What a connection must show before its requests are served.
#[derive(Clone)]
enum Gate {
    /// The unix socket: whoever could open it passed its file mode.
    Socket,
    /// TCP: every request carries this token.
    Token(Arc<str>),
}

impl Gate {
    fn admits(&self, token: Option<&str>) -> bool {
        match self {
            Gate::Socket => true,
            Gate::Token(expected) => token.is_some_and(|token| same_secret(token, expected)),
        }
    }
}

/// Compares without stopping at the first difference, so that the time taken does not tell a
/// guesser how much of the token was right.
fn same_secret(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |difference, (a, b)| difference | (a ^ b))
            == 0
}

/// Binds the admin socket at `path` with mode 0600. The socket is bound under a temporary name,
/// restricted, then renamed into place, so that it is never reachable with a wider mode. A
/// socket left by a server that died is replaced; one that a running server answers on, or a
/// file that is not a socket, is an error.
pub fn bind_socket(path: &Path) -> Result<UnixListener, String> {
    let context = |what: &str, error: std::io::Error| {
        format!("admin.socket {}: {what}: {error}", path.display())
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| context("cannot create its directory", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if !metadata.file_type().is_socket() => {
            return Err(format!(
                "admin.socket {}: exists and is not a socket; remove it or choose another path",
                path.display()
            ))
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "admin.socket {}: another bucketfs server answers there; stop it, or give \
                     this server its own admin.socket (or cache.dir)",
                    path.display()
                ));
            }
            std::fs::remove_file(path).map_err(|e| context("cannot remove the stale socket", e))?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(context("cannot inspect it", error)),
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.new", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary).map_err(|e| context("cannot bind", e))?;
    let placed = std::fs::set_permissions(
        &temporary,
        std::fs::Permissions::from_mode(ADMIN_SOCKET_MODE),
    )
    .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(error) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(context(
            "cannot set its mode to 0600 and move it into place",
            error,
        ));
    }
    Ok(listener)
}

impl Admin {
    async fn handle(&self, request: Request) -> Result<serde_json::Value, String> {
        let device = |d: bucketfs_fs::BlockDevice| serde_json::json!({"name": d.name, "size_bytes": d.size_bytes});
        Ok(match request {
            Request::Create { name, size_bytes } => device(
                self.fs
                    .create_block_device(&name, size_bytes)
                    .await
                    .map_err(fs_error_message)?,
            ),
            Request::Resize { name, size_bytes } => device(
                self.fs
                    .resize_block_device(&name, size_bytes)
                    .await
                    .map_err(fs_error_message)?,
            ),
            Request::Delete { name } => {
                self.fs
                    .delete_block_device(&name)
                    .await
                    .map_err(fs_error_message)?;
                serde_json::Value::Null
            }
            Request::List => serde_json::Value::Array(
                self.fs
                    .block_devices()
                    .await
                    .map_err(fs_error_message)?
                    .into_iter()
                    .map(device)
                    .collect(),
            ),
            Request::CheckpointCreate { name } => serde_json::to_value(
                self.fs
                    .engine()
                    .create_checkpoint(&name)
                    .await
                    .map_err(|e| e.to_string())?,
            )
            .expect("checkpoint info serialises"),
            Request::CheckpointList => serde_json::to_value(self.fs.engine().checkpoints())
                .expect("checkpoint info serialises"),
            Request::CheckpointDelete { name } => {
                self.fs
                    .engine()
                    .delete_checkpoint(&name)
                    .await
                    .map_err(|e| e.to_string())?;
                serde_json::Value::Null
            }
            Request::Metrics => serde_json::Value::String(
                crate::metrics::Sample::take(&self.counts, self.fs.engine(), &self.journal)
                    .render(),
            ),
            Request::Status => serde_json::json!({
                "object_store": self.counts.counts(),
                "engine": self.fs.engine().stats(),
                "store_outage": self.fs.engine().store_outage(),
                "journal": journal_status(&self.journal),
                "block_devices": self.fs.block_devices().await.map_err(fs_error_message)?.into_iter().map(device).collect::<Vec<_>>(),
            }),
        })
    }

    /// Serves the unix socket forever.
    pub async fn serve_socket(self: Arc<Self>, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => self.spawn_connection(stream, Gate::Socket, "unix".into()),
                Err(e) => accept_failed(e).await,
            }
        }
    }

    /// Serves TCP forever; every request must carry `token`.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener, token: String) {
        let gate = Gate::Token(token.into());
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => self.spawn_connection(stream, gate.clone(), peer.to_string()),
                Err(e) => accept_failed(e).await,
            }
        }
    }

    fn spawn_connection<S>(self: &Arc<Self>, stream: S, gate: Gate, peer: String)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let admin = self.clone();
        tokio::spawn(async move {
            if let Err(e) = admin.connection(stream, &gate, &peer).await {
                tracing::warn!(%peer, error = %e, "admin connection failed");
            }
        });
    }

    async fn connection<S>(&self, stream: S, gate: &Gate, peer: &str) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite,
    {
        let (read, mut write) = tokio::io::split(stream);
        let mut lines = BufReader::new(read.take(REQUEST_BYTES_MAX)).lines();
        while let Some(line) = lines.next_line().await? {
            let reply = match serde_json::from_str::<Envelope>(&line) {
                Ok(envelope) if !gate.admits(envelope.token.as_deref()) => {
                    tracing::warn!(%peer, "admin request without the right token: refused");
                    Reply {
                        ok: false,
                        result: serde_json::Value::Null,
                        error: "refused: this request needs the admin token (admin.token)"
                            .to_string(),
                    }
                }
                Ok(envelope) => match self.handle(envelope.request).await {
                    Ok(result) => Reply {
                        ok: true,
                        result,
                        error: String::new(),
                    },
                    Err(error) => Reply {
                        ok: false,
                        result: serde_json::Value::Null,
                        error,
                    },
                },
                Err(e) => Reply {
                    ok: false,
                    result: serde_json::Value::Null,
                    error: format!("malformed request: {e}"),
                },
            };
            let mut out = serde_json::to_vec(&reply).expect("replies serialise");
            out.push(b'\n');
            write.write_all(&out).await?;
        }
        Ok(())
    }
}

async fn accept_failed(error: std::io::Error) {
    tracing::warn!(%error, "admin accept failed");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

/// Sends one request to a running server's admin socket and returns its result.
pub async fn call(path: &Path, request: &Request) -> Result<serde_json::Value, String> {
    let endpoint = path.display();
    let stream = UnixStream::connect(path).await.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
            "only the user that runs the server can use it (mode 0600)"
        } else {
            "is `bucketfs run` running with this config?"
        };
        format!("cannot reach the bucketfs admin endpoint at {endpoint} ({e}); {hint}")
    })?;
    let mut line = serde_json::to_vec(request).expect("requests serialise");
    line.push(b'\n');
    let (read, mut write) = stream.into_split();
    write
        .write_all(&line)
        .await
        .map_err(|e| format!("admin endpoint {endpoint}: {e}"))?;
    let mut reader = BufReader::new(read);
    let mut reply = String::new();
    reader
        .read_line(&mut reply)
        .await
        .map_err(|e| format!("admin endpoint {endpoint}: {e}"))?;
    let reply: Reply = serde_json::from_str(&reply)
        .map_err(|e| format!("admin endpoint {endpoint}: malformed reply: {e}"))?;
    if reply.ok {
        Ok(reply.result)
    } else {
        Err(reply.error)
    }
}

/// The journal tier's backlog and targets as `bucketfs status` shows them; null without a
/// journal.
fn journal_status(journal: &JournaledBucket) -> serde_json::Value {
    if !journal.journaling() {
        return serde_json::Value::Null;
    }
    let b = journal.backlog();
    let targets: Vec<serde_json::Value> = journal
        .target_states()
        .into_iter()
        .map(|(name, state)| serde_json::json!({ "name": name, "state": state }))
        .collect();
    serde_json::json!({
        "backlog_objects": b.objects,
        "backlog_bytes": b.bytes,
        "backlog_seconds": b.oldest.as_secs_f64(),
        "targets": targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_secret("0123456789abcdef", "0123456789abcdef"));
        assert!(!same_secret("0123456789abcdeF", "0123456789abcdef"));
        assert!(!same_secret("0123456789abcde", "0123456789abcdef"));
        assert!(!same_secret("", "0123456789abcdef"));
        let gate = Gate::Token("0123456789abcdef".into());
        assert!(gate.admits(Some("0123456789abcdef")));
        assert!(!gate.admits(Some("0123456789abcdeg")));
        assert!(!gate.admits(None));
        assert!(Gate::Socket.admits(None));
    }

    #[test]
    fn requests_may_carry_a_token() {
        let envelope: Envelope =
            serde_json::from_str(r#"{"op":"create","name":"d","size_bytes":5,"token":"t"}"#)
                .unwrap();
        assert_eq!(envelope.token.as_deref(), Some("t"));
        assert!(matches!(
            envelope.request,
            Request::Create { size_bytes: 5, .. }
        ));
        let envelope: Envelope = serde_json::from_str(r#"{"op":"status"}"#).unwrap();
        assert!(envelope.token.is_none());
    }

    #[tokio::test]
    async fn the_socket_is_private_and_a_live_one_is_not_taken_over() {
        let dir = tempfile::TempDir::with_prefix("bucketfs-admin-test-").unwrap();
        let path = dir.path().join("sub/admin.sock");
        let listener = bind_socket(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, ADMIN_SOCKET_MODE, "mode {mode:o}");
        let second = bind_socket(&path).expect_err("a live socket must not be replaced");
        assert!(second.contains("another bucketfs server"), "{second}");
        // Once its server is gone the socket is stale and is replaced.
        drop(listener);
        bind_socket(&path).unwrap();
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, b"x").unwrap();
        let refused = bind_socket(&file).expect_err("a file must not be replaced");
        assert!(refused.contains("not a socket"), "{refused}");
    }
}
