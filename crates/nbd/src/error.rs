//! Connection-level errors, and the one place where export errors become NBD error codes.

use crate::backend::ExportError;
use crate::proto;
use std::io;

/// Why a connection ended other than by the client's clean NBD_CMD_DISC or NBD_OPT_ABORT.
/// Each ends one connection only; the server keeps serving the others.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("connection i/o failed: {0}")]
    Io(#[from] io::Error),
    /// The client broke a rule the protocol makes mandatory, so the session was hard-disconnected.
    #[error("client broke the NBD protocol: {0}")]
    Protocol(String),
    #[error("client did not finish the handshake within {0} ms")]
    HandshakeTimeout(u64),
    /// The client asked for an export with NBD_OPT_EXPORT_NAME without starting TLS, which
    /// the server requires; that option cannot carry an error, so the session ends.
    #[error("client chose an export without starting TLS, which this server requires")]
    TlsRequired,
    /// The TLS handshake after NBD_OPT_STARTTLS failed (for instance a client certificate
    /// that the configured CA did not sign); too late to go on without TLS.
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(io::Error),
    /// NBD_OPT_EXPORT_NAME cannot carry an error, so a failed open ends the session.
    #[error("export {name:?} could not be opened: {source}")]
    Open { name: String, source: ExportError },
}

/// The NBD error value of an export error.
pub fn errno_of(error: &ExportError) -> u32 {
    match error {
        ExportError::Io(_) => proto::EIO,
        ExportError::NoSpace(_) => proto::ENOSPC,
        ExportError::Invalid(_) => proto::EINVAL,
        ExportError::Permission(_) => proto::EPERM,
        ExportError::NotSupported(_) => proto::ENOTSUP,
        // The export vanished under an open connection; to the client that is a bad request.
        ExportError::NotFound => proto::EINVAL,
    }
}

/// The option reply error for an export that could not be listed or opened during the handshake.
pub fn option_error_of(error: &ExportError) -> u32 {
    match error {
        ExportError::Permission(_) | ExportError::NotSupported(_) => proto::REP_ERR_POLICY,
        ExportError::Invalid(_) => proto::REP_ERR_INVALID,
        // "The requested export is not available" is the honest answer for a missing export and
        // for one the storage cannot open right now.
        ExportError::NotFound | ExportError::Io(_) | ExportError::NoSpace(_) => {
            proto::REP_ERR_UNKNOWN
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_errors_map_to_nbd_errno() {
        assert_eq!(errno_of(&ExportError::Io("x".into())), 5);
        assert_eq!(errno_of(&ExportError::NoSpace("x".into())), 28);
        assert_eq!(errno_of(&ExportError::Invalid("x".into())), 22);
        assert_eq!(errno_of(&ExportError::Permission("x".into())), 1);
        assert_eq!(errno_of(&ExportError::NotSupported("x".into())), 95);
        assert_eq!(errno_of(&ExportError::NotFound), 22);
    }

    #[test]
    fn open_errors_map_to_option_errors() {
        assert_eq!(
            option_error_of(&ExportError::NotFound),
            proto::REP_ERR_UNKNOWN
        );
        assert_eq!(
            option_error_of(&ExportError::Permission("x".into())),
            proto::REP_ERR_POLICY
        );
        assert_eq!(
            option_error_of(&ExportError::Invalid("x".into())),
            proto::REP_ERR_INVALID
        );
    }
}
