//! Who may do what: whether clients must (or may) switch to TLS with NBD_OPT_STARTTLS, and which
//! exports each client may see, by the certificate it presented. One `Policy` holds for every
//! connection of a listener.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::sync::Arc;

/// The name in an allow-list that stands for every export.
pub const EVERY_EXPORT: &str = "*";

/// The TLS mode of the server, in the terms of the protocol's TLS section.
#[derive(Clone, Default)]
pub enum Tls {
    /// NOTLS: NBD_OPT_STARTTLS is refused with NBD_REP_ERR_POLICY.
    #[default]
    Off,
    /// SELECTIVETLS with no TLS-only export: a client may start TLS, and is served without.
    Optional(Arc<ServerConfig>),
    /// FORCEDTLS: every option but STARTTLS and ABORT is refused with NBD_REP_ERR_TLS_REQD until
    /// TLS runs, and NBD_OPT_EXPORT_NAME before TLS ends the session.
    Required(Arc<ServerConfig>),
}

/// Which exports a client may list, query and open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// Every client may use every export.
    #[default]
    Everyone,
    /// Keyed by the subject common name of the client's verified certificate: the exports that
    /// name may use ([`EVERY_EXPORT`] for all). A client without a verified certificate, or
    /// whose name is not a key, may use none: an allow-list fails closed.
    ByCommonName(HashMap<String, Vec<String>>),
}

impl Access {
    /// Whether the client known by `common_name` (None: no verified certificate) may use `export`.
    pub fn permits(&self, common_name: Option<&str>, export: &str) -> bool {
        match self {
            Access::Everyone => true,
            Access::ByCommonName(allowed) => common_name
                .and_then(|name| allowed.get(name))
                .is_some_and(|exports| {
                    exports
                        .iter()
                        .any(|allowed| allowed == export || allowed == EVERY_EXPORT)
                }),
        }
    }
}

/// The policy of one server: its TLS mode and who sees which exports.
#[derive(Clone, Default)]
pub struct Policy {
    pub tls: Tls,
    pub access: Access,
}

/// Why a TLS configuration could not be built, by the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("not a usable CA certificate: {0}")]
    ClientCa(rustls::Error),
    #[error("cannot verify client certificates with these CA certificates: {0}")]
    ClientVerifier(String),
    /// The chain or the key is unusable, or the key does not belong to the first certificate.
    #[error("{0}")]
    Certificate(rustls::Error),
}

/// The server side of TLS: this certificate chain and its key, TLS 1.2 and 1.3 with rustls'
/// safe defaults (the protocol requires 1.2 and recommends later versions), and, with
/// `client_ca`, a client certificate signed by one of those CAs required in every handshake.
/// The crypto provider is named rather than taken from the process default, which depends on
/// the features other crates enable.
pub fn tls_server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca: Option<Vec<CertificateDer<'static>>>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Certificate)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(certificates) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates {
                roots.add(certificate).map_err(TlsSetupError::ClientCa)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| TlsSetupError::ClientVerifier(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(TlsSetupError::Certificate)?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_fail_closed() {
        assert!(Access::Everyone.permits(None, "disk"));
        let access = Access::ByCommonName(HashMap::from([
            ("alice".to_string(), vec!["disk1".to_string()]),
            ("backup".to_string(), vec![EVERY_EXPORT.to_string()]),
            ("nobody".to_string(), vec![]),
        ]));
        assert!(access.permits(Some("alice"), "disk1"));
        assert!(!access.permits(Some("alice"), "disk2"));
        assert!(!access.permits(Some("alice"), "*"));
        assert!(access.permits(Some("backup"), "disk2"));
        assert!(!access.permits(Some("nobody"), "disk1"));
        assert!(!access.permits(Some("mallory"), "disk1"));
        assert!(!access.permits(None, "disk1"));
    }
}
