//! The NBD server's policy from `[servers.nbd]`: the PEM files are read and checked once, at
//! start, and every failure names the config key and the file, so that a bad certificate stops
//! `bucketfs run` with a sentence instead of failing each client's handshake later.

use crate::config::{NbdServerConfig, TlsMode, ALLOW_COMMON_NAME_PREFIX};
use bucketfs_nbd::rustls::pki_types::pem::{self, PemObject};
use bucketfs_nbd::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use bucketfs_nbd::{tls_server_config, Access, Policy, Tls, TlsSetupError};
use std::path::Path;

/// The TLS mode and the allow-list of the NBD listeners.
pub fn nbd_policy(nbd: &NbdServerConfig) -> Result<Policy, String> {
    // An empty allow-list admits nobody, like any list that does not name a client.
    let access = match &nbd.allow {
        Some(allow) => Access::ByCommonName(
            allow
                .iter()
                .map(|(identity, exports)| {
                    let name = identity
                        .strip_prefix(ALLOW_COMMON_NAME_PREFIX)
                        .expect("the config check accepts only CN= entries");
                    (name.to_string(), exports.clone())
                })
                .collect(),
        ),
        None => Access::Everyone,
    };
    let mode = nbd.tls_mode();
    let (Some(cert_path), Some(key_path)) = (&nbd.tls_cert, &nbd.tls_key) else {
        // The config check refuses TLS without a certificate and key.
        debug_assert_eq!(mode, TlsMode::Off);
        return Ok(Policy {
            tls: Tls::Off,
            access,
        });
    };
    if mode == TlsMode::Off {
        return Ok(Policy {
            tls: Tls::Off,
            access,
        });
    }
    let chain = read_certificates("servers.nbd.tls_cert", cert_path)?;
    let key = read_key("servers.nbd.tls_key", key_path)?;
    let client_ca = nbd
        .tls_client_ca
        .as_deref()
        .map(|path| read_certificates("servers.nbd.tls_client_ca", path).map(|ca| (path, ca)))
        .transpose()?;
    let ca_path = client_ca
        .as_ref()
        .map(|(path, _)| path.display().to_string());
    let config =
        tls_server_config(chain, key, client_ca.map(|(_, ca)| ca)).map_err(
            |error| match error {
                TlsSetupError::ClientCa(_) | TlsSetupError::ClientVerifier(_) => format!(
                    "servers.nbd.tls_client_ca: {}: {error}",
                    ca_path.unwrap_or_default()
                ),
                TlsSetupError::Certificate(_) => format!(
                    "servers.nbd.tls_cert and tls_key: {} with {}: {error} (is the key the one of \
                 the certificate?)",
                    cert_path.display(),
                    key_path.display()
                ),
            },
        )?;
    let tls = match mode {
        TlsMode::Required => Tls::Required(config),
        TlsMode::Optional => Tls::Optional(config),
        TlsMode::Off => unreachable!("handled above"),
    };
    Ok(Policy { tls, access })
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("{key}: cannot read {}: {error}", path.display()))
}

fn read_certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(key, path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{key}: {} is not valid PEM: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{key}: {} holds no certificate (expected PEM blocks \"BEGIN CERTIFICATE\")",
            path.display()
        ));
    }
    Ok(certificates)
}

fn read_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        pem::Error::NoItemsFound => format!(
            "{key}: {} holds no private key (expected a PEM block \"BEGIN PRIVATE KEY\", \
             \"BEGIN RSA PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\")",
            path.display()
        ),
        error => format!("{key}: {} is not valid PEM: {error}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The NBD crate's test certificates.
    fn certs(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../nbd/tests/certs/{name}"))
    }

    fn nbd(cert: &str, key: &str, ca: Option<&str>) -> NbdServerConfig {
        NbdServerConfig {
            listen: vec![],
            unix_socket: None,
            tls: None,
            tls_cert: Some(certs(cert)),
            tls_key: Some(certs(key)),
            tls_client_ca: ca.map(certs),
            allow: None,
        }
    }

    fn error(config: &NbdServerConfig) -> String {
        match nbd_policy(config) {
            Ok(_) => panic!("expected an error for {config:?}"),
            Err(message) => message,
        }
    }

    #[test]
    fn a_certificate_turns_tls_on_as_required() {
        let policy = nbd_policy(&nbd("server.pem", "server.key", Some("ca.pem"))).unwrap();
        assert!(matches!(policy.tls, Tls::Required(_)));
        assert_eq!(policy.access, Access::Everyone);
    }

    #[test]
    fn allow_list_keys_lose_their_cn_prefix() {
        let mut config = nbd("server.pem", "server.key", Some("ca.pem"));
        config.allow = Some([("CN=alice".to_string(), vec!["disk1".to_string()])].into());
        let policy = nbd_policy(&config).unwrap();
        assert!(policy.access.permits(Some("alice"), "disk1"));
        assert!(!policy.access.permits(Some("CN=alice"), "disk1"));
        config.allow = Some(Default::default());
        let policy = nbd_policy(&config).unwrap();
        assert!(!policy.access.permits(Some("alice"), "disk1"));
    }

    #[test]
    fn bad_pem_files_name_the_key_and_the_file() {
        let missing = error(&nbd("no-such.pem", "server.key", None));
        assert!(
            missing.starts_with("servers.nbd.tls_cert: cannot read ")
                && missing.contains("no-such.pem"),
            "{missing}"
        );
        // A key where the certificate belongs, and the other way round.
        let swapped = error(&nbd("server.key", "server.pem", None));
        assert!(
            swapped.starts_with("servers.nbd.tls_cert: ")
                && swapped.contains("server.key")
                && swapped.contains("holds no certificate"),
            "{swapped}"
        );
        let no_key = error(&nbd("server.pem", "server.pem", None));
        assert!(
            no_key.starts_with("servers.nbd.tls_key: ") && no_key.contains("holds no private key"),
            "{no_key}"
        );
        let not_ca = error(&nbd("server.pem", "server.key", Some("alice.key")));
        assert!(
            not_ca.starts_with("servers.nbd.tls_client_ca: ") && not_ca.contains("alice.key"),
            "{not_ca}"
        );
        // A key that is not the certificate's.
        let mismatch = error(&nbd("server.pem", "alice.key", None));
        assert!(
            mismatch.starts_with("servers.nbd.tls_cert and tls_key: ")
                && mismatch.contains("alice.key"),
            "{mismatch}"
        );
    }

    #[test]
    fn a_damaged_pem_block_is_reported_as_such() {
        let dir = tempfile::TempDir::with_prefix("bucketfs-tls-test-").unwrap();
        let path = dir.path().join("truncated.pem");
        let text = std::fs::read_to_string(certs("server.pem")).unwrap();
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        let mut config = nbd("server.pem", "server.key", None);
        config.tls_cert = Some(path.clone());
        let message = error(&config);
        assert!(
            message.starts_with("servers.nbd.tls_cert: ") && message.contains("not valid PEM"),
            "{message}"
        );
    }
}
