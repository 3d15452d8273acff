//! Listeners and the per-connection entry point. Each connection runs in its own task, so a
//! failing or misbehaving client (or a panic while serving it) ends that connection only.

use crate::backend::Exports;
use crate::error::NbdError;
use crate::handshake::{Handshake, Outcome, Session};
use crate::limits::{ACCEPT_RETRY_DELAY_MS, HANDSHAKE_TIMEOUT_MS, REQUEST_BUFFER_BYTES};
use crate::policy::Policy;
use crate::transmission;
use crate::x509;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, info_span, warn, Instrument};

/// Accepts NBD clients on a TCP listener forever, one task per connection. Accept failures
/// (such as running out of file descriptors) are logged and retried, never returned.
pub async fn serve_tcp(
    listener: TcpListener,
    exports: Arc<dyn Exports>,
    policy: Arc<Policy>,
) -> io::Result<()> {
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
                spawn_connection(stream, Arc::clone(&exports), Arc::clone(&policy), span);
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

/// Accepts NBD clients on a Unix socket listener forever, one task per connection. The policy
/// applies here as on TCP: the protocol allows TLS over any stream, and an allow-list that a
/// local socket bypassed would not be one.
pub async fn serve_unix(
    listener: UnixListener,
    exports: Arc<dyn Exports>,
    policy: Arc<Policy>,
) -> io::Result<()> {
    let mut connection_id: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                connection_id += 1;
                let span = info_span!("nbd", connection = connection_id, peer = "unix");
                spawn_connection(stream, Arc::clone(&exports), Arc::clone(&policy), span);
            }
            Err(error) => accept_failed(error).await,
        }
    }
}

async fn accept_failed(error: io::Error) {
    warn!(%error, "accepting an NBD connection failed; retrying");
    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_DELAY_MS)).await;
}

fn spawn_connection<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    policy: Arc<Policy>,
    span: tracing::Span,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = async move {
        debug!("client connected");
        match serve_connection(stream, exports, policy).await {
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

/// Serves one client over any byte stream: handshake (with TLS when the client starts it), then
/// transmission until the client disconnects. Returns `Ok` when the client left cleanly
/// (NBD_OPT_ABORT, NBD_CMD_DISC or a close between requests). For fuzzing and tests it runs over
/// stdin/stdout as `serve_connection(tokio::io::join(tokio::io::stdin(), tokio::io::stdout()),
/// exports, policy)`.
pub async fn serve_connection<S>(
    stream: S,
    exports: Arc<dyn Exports>,
    policy: Arc<Policy>,
) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The TLS handshake counts towards the handshake's time limit: a client that stalls it
    // holds a task and a socket as surely as one that stalls an option.
    let handshake_timeout = Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
    let negotiated = tokio::time::timeout(handshake_timeout, negotiate(stream, &*exports, &policy))
        .await
        .map_err(|_| NbdError::HandshakeTimeout(HANDSHAKE_TIMEOUT_MS))??;
    match negotiated {
        Negotiated::Aborted => {
            debug!("client aborted the handshake");
            Ok(())
        }
        Negotiated::Plain(stream, session) => transmit(stream, session).await,
        Negotiated::Tls(stream, session) => transmit(stream, session).await,
    }
}

/// How a handshake ended; the streams are buffered because requests a client pipelines right
/// behind its last option must be kept for transmission. The TLS state is large (over 1 KiB),
/// so it lives on the heap rather than in every connection's future.
enum Negotiated<S> {
    Aborted,
    Plain(BufReader<S>, Session),
    Tls(BufReader<Box<TlsStream<S>>>, Session),
}

async fn negotiate<S>(
    stream: S,
    exports: &dyn Exports,
    policy: &Policy,
) -> Result<Negotiated<S>, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = BufReader::with_capacity(REQUEST_BUFFER_BYTES, stream);
    let mut handshake = Handshake::new(exports, policy);
    handshake.greet(&mut stream).await?;
    match handshake.haggle(&mut stream).await? {
        Outcome::Aborted => return Ok(Negotiated::Aborted),
        Outcome::Transmission(session) => return Ok(Negotiated::Plain(stream, session)),
        Outcome::StartTls => {}
    }
    // The client must wait for our acknowledgement before its TLS handshake, so anything
    // already buffered was sent out of turn; it cannot be fed to TLS or to NBD.
    if !stream.buffer().is_empty() {
        return Err(NbdError::Protocol(
            "data sent after NBD_OPT_STARTTLS before its acknowledgement".into(),
        ));
    }
    let config = handshake
        .tls_config()
        .ok_or_else(|| NbdError::Protocol("STARTTLS acknowledged without TLS".into()))?;
    let tls = TlsAcceptor::from(config)
        .accept(stream.into_inner())
        .await
        .map_err(NbdError::TlsHandshake)?;
    let common_name = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|certificate| x509::subject_common_name(certificate));
    debug!(
        client = common_name.as_deref().unwrap_or("(no certificate)"),
        "TLS started"
    );
    handshake.tls_started(common_name);

    let mut stream = BufReader::with_capacity(REQUEST_BUFFER_BYTES, Box::new(tls));
    match handshake.haggle(&mut stream).await? {
        Outcome::Aborted => Ok(Negotiated::Aborted),
        Outcome::Transmission(session) => Ok(Negotiated::Tls(stream, session)),
        // The handshake refuses a second STARTTLS with NBD_REP_ERR_INVALID.
        Outcome::StartTls => Err(NbdError::Protocol("STARTTLS acknowledged twice".into())),
    }
}

async fn transmit<S>(stream: BufReader<S>, session: Session) -> Result<(), NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    debug!(
        export = %session.export_name,
        size_bytes = session.size_bytes,
        read_only = session.read_only,
        structured_replies = session.structured_replies,
        block_status = session.block_status_context.is_some(),
        tls = session.tls,
        "entering transmission"
    );
    let (reader, writer) = tokio::io::split(stream);
    transmission::serve(reader, writer, session).await
}
