//! Listeners and the per-connection entry point. Each connection runs in its own task, so a
//! failing or misbehaving client (or a panic while serving it) ends that connection only.

use crate::backend::Exports;
use crate::error::NbdError;
use crate::handshake::{self, Outcome};
use crate::limits::{ACCEPT_RETRY_DELAY_MS, HANDSHAKE_TIMEOUT_MS, REQUEST_BUFFER_BYTES};
use crate::transmission;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tracing::{debug, info, info_span, warn, Instrument};

/// Accepts NBD clients on a TCP listener forever, one task per connection. Accept failures
/// (such as running out of file descriptors) are logged and retried, never returned.
pub async fn serve_tcp(listener: TcpListener, exports: Arc<dyn Exports>) -> io::Result<()> {
    let mut connection_id: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                connection_id += 1;
                // Replies are often small and latency-bound; the protocol recommends TCP_NODELAY.
                if let Err(error) = stream.set_nodelay(true) {
                    debug!(%error, %peer, "could not set TCP_NODELAY");
                }
                let span = info_span!("nbd", connection = connection_id, %peer);
                spawn_connection(stream, Arc::clone(&exports), span);
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

/// Accepts NBD clients on a Unix socket listener forever, one task per connection.
pub async fn serve_unix(listener: UnixListener, exports: Arc<dyn Exports>) -> io::Result<()> {
    let mut connection_id: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                connection_id += 1;
                let span = info_span!("nbd", connection = connection_id, peer = "unix");
                spawn_connection(stream, Arc::clone(&exports), span);
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

async fn accept_failed(error: io::Error) {
    warn!(%error, "accepting an NBD connection failed; retrying");
    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_DELAY_MS)).await;
}

fn spawn_connection<S>(stream: S, exports: Arc<dyn Exports>, span: tracing::Span)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = async move {
        debug!("client connected");
        match serve_connection(stream, exports).await {
            Ok(()) => debug!("client disconnected"),
            Err(NbdError::Io(error)) if client_went_away(&error) => {
                info!(%error, "client went away");
            }
            Err(error) => warn!(%error, "connection closed"),
        }
    };
    tokio::spawn(connection.instrument(span));
}

fn client_went_away(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

/// Serves one client over any byte stream: handshake, then transmission until the client
/// disconnects. Returns `Ok` when the client left cleanly (NBD_OPT_ABORT, NBD_CMD_DISC or a close
/// between requests). For fuzzing and tests it runs over stdin/stdout as
/// `serve_connection(tokio::io::join(tokio::io::stdin(), tokio::io::stdout()), exports)`.
pub async fn serve_connection<S>(stream: S, exports: Arc<dyn Exports>) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The buffer outlives the handshake, so requests a client pipelines right behind its last
    // option are kept for transmission.
    let mut stream = BufReader::with_capacity(REQUEST_BUFFER_BYTES, stream);
    let handshake_timeout = Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
    let outcome = tokio::time::timeout(
        handshake_timeout,
        handshake::negotiate(&mut stream, &*exports),
    )
    .await
    .map_err(|_| NbdError::HandshakeTimeout(HANDSHAKE_TIMEOUT_MS))??;
    let session = match outcome {
        Outcome::Aborted => {
            debug!("client aborted the handshake");
            return Ok(());
        }
        Outcome::Transmission(session) => session,
    };
    debug!(
        export = %session.export_name,
        size_bytes = session.size_bytes,
        read_only = session.read_only,
        structured_replies = session.structured_replies,
        block_status = session.block_status_context.is_some(),
        "entering transmission"
    );
    let (reader, writer) = tokio::io::split(stream);
    transmission::serve(reader, writer, session).await
}
