//! The admin endpoint: one JSON request per line, one JSON reply per line, over TCP on
//! localhost. It carries no authentication, like NBD: bind it to loopback (the default).

use crate::exports::fs_error_message;
use bucketfs_engine::bucket::CountingBucket;
use bucketfs_fs::Fs;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Longest request line accepted: requests are a few names and numbers.
const REQUEST_BYTES_MAX: u64 = 64 * 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Create { name: String, size_bytes: u64 },
    List,
    Resize { name: String, size_bytes: u64 },
    Delete { name: String },
    Status,
    CheckpointCreate { name: String },
    CheckpointList,
    CheckpointDelete { name: String },
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
            Request::Status => serde_json::json!({
                "object_store": self.counts.counts(),
                "engine": self.fs.engine().stats(),
                "store_outage": self.fs.engine().store_outage(),
                "block_devices": self.fs.block_devices().await.map_err(fs_error_message)?.into_iter().map(device).collect::<Vec<_>>(),
            }),
        })
    }

    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let admin = self.clone();
            tokio::spawn(async move {
                if let Err(e) = admin.connection(stream).await {
                    tracing::warn!(%peer, error = %e, "admin connection failed");
                }
            });
        }
    }

    async fn connection(&self, stream: TcpStream) -> std::io::Result<()> {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read.take(REQUEST_BYTES_MAX)).lines();
        while let Some(line) = lines.next_line().await? {
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(req) => match self.handle(req).await {
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

use tokio::io::AsyncReadExt;

/// Sends one request to a running server and returns its result.
pub async fn call(addr: SocketAddr, request: &Request) -> Result<serde_json::Value, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot reach the bucketfs admin endpoint at {addr} ({e}); is `bucketfs run` running with this config?"))?;
    let mut line = serde_json::to_vec(request).expect("requests serialise");
    line.push(b'\n');
    stream
        .write_all(&line)
        .await
        .map_err(|e| format!("admin endpoint {addr}: {e}"))?;
    let mut reader = BufReader::new(stream);
    let mut reply = String::new();
    reader
        .read_line(&mut reply)
        .await
        .map_err(|e| format!("admin endpoint {addr}: {e}"))?;
    let reply: Reply = serde_json::from_str(&reply)
        .map_err(|e| format!("admin endpoint {addr}: malformed reply: {e}"))?;
    if reply.ok {
        Ok(reply.result)
    } else {
        Err(reply.error)
    }
}
