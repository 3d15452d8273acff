//! NBD_OPT_STARTTLS and the export allow-list, driven byte by byte over an in-process stream
//! with a rustls client: what the protocol's TLS section requires in each mode, that client
//! certificates are verified, and that an allow-list hides exports. The certificates are in
//! tests/certs (written by tests/certs/make.sh).

use crate::common::{fixture, ro_pattern, Fixture};
use bucketfs_nbd::{tls_server_config, Access, NbdError, Policy, Tls};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_LIST: u32 = 3;
const OPT_STARTTLS: u32 = 5;
const OPT_INFO: u32 = 6;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const OPT_SET_META_CONTEXT: u32 = 10;
const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_POLICY: u32 = (1 << 31) + 2;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

fn cert_path(name: &str) -> String {
    format!("{}/tests/certs/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn certificates(name: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(cert_path(&format!("{name}.pem")))
        .expect("certificate file")
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

fn key(name: &str) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_file(cert_path(&format!("{name}.key"))).expect("PEM key")
}

/// The server's TLS configuration; with `verify_clients`, client certificates of tests/certs'
/// CA are required.
fn server_tls(verify_clients: bool) -> Arc<tokio_rustls::rustls::ServerConfig> {
    let client_ca = verify_clients.then(|| certificates("ca"));
    tls_server_config(certificates("server"), key("server"), client_ca).expect("server TLS")
}

fn client_tls(identity: Option<&str>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates("ca") {
        roots.add(certificate).expect("CA");
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let config = match identity {
        Some(name) => builder
            .with_client_auth_cert(certificates(name), key(name))
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

struct Reply {
    option: u32,
    reply_type: u32,
    data: Vec<u8>,
}

/// The client end of a session; generic so that it speaks before and after TLS alike.
struct Client<S> {
    stream: S,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    async fn try_option(&mut self, option: u32, data: &[u8]) -> std::io::Result<()> {
        let mut bytes = b"IHAVEOPT".to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(data);
        self.stream.write_all(&bytes).await?;
        self.stream.flush().await
    }

    async fn option(&mut self, option: u32, data: &[u8]) {
        self.try_option(option, data).await.expect("send option");
    }

    async fn try_reply(&mut self) -> std::io::Result<Reply> {
        assert_eq!(self.stream.read_u64().await?, OPTION_REPLY_MAGIC);
        let option = self.stream.read_u32().await?;
        let reply_type = self.stream.read_u32().await?;
        let mut data = vec![0u8; self.stream.read_u32().await? as usize];
        self.stream.read_exact(&mut data).await?;
        Ok(Reply {
            option,
            reply_type,
            data,
        })
    }

    async fn reply(&mut self) -> Reply {
        self.try_reply().await.expect("option reply")
    }

    /// Sends `option` and returns the type of its one reply, which must be for that option.
    async fn ask(&mut self, option: u32, data: &[u8]) -> u32 {
        self.option(option, data).await;
        let reply = self.reply().await;
        assert_eq!(reply.option, option);
        reply.reply_type
    }

    /// The export names of an NBD_OPT_LIST.
    async fn list(&mut self) -> Vec<String> {
        self.option(OPT_LIST, &[]).await;
        let mut names = Vec::new();
        loop {
            let reply = self.reply().await;
            match reply.reply_type {
                REP_SERVER => {
                    let length = u32::from_be_bytes(reply.data[0..4].try_into().unwrap());
                    names.push(
                        String::from_utf8(reply.data[4..4 + length as usize].to_vec()).unwrap(),
                    );
                }
                REP_ACK => return names,
                other => panic!("LIST failed with {other:#x}"),
            }
        }
    }

    /// INFO or GO on `name`: the final reply type, after any NBD_REP_INFO.
    async fn info(&mut self, option: u32, name: &str) -> u32 {
        self.option(option, &info_request(name)).await;
        loop {
            let reply = self.reply().await;
            if reply.reply_type != REP_INFO {
                return reply.reply_type;
            }
        }
    }

    /// READ `length` bytes at `offset` with a simple reply.
    async fn read(&mut self, offset: u64, length: u32) -> Vec<u8> {
        self.request(0, offset, length).await;
        assert_eq!(self.stream.read_u32().await.unwrap(), 0x6744_6698);
        assert_eq!(self.stream.read_u32().await.unwrap(), 0, "read error");
        assert_eq!(self.stream.read_u64().await.unwrap(), 9);
        let mut data = vec![0u8; length as usize];
        self.stream.read_exact(&mut data).await.unwrap();
        data
    }

    async fn request(&mut self, command: u16, offset: u64, length: u32) {
        let mut bytes = 0x2560_9513u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&0u16.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&9u64.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        self.stream.write_all(&bytes).await.unwrap();
        self.stream.flush().await.unwrap();
    }
}

fn info_request(name: &str) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    data
}

impl Client<DuplexStream> {
    /// NBD_OPT_STARTTLS, acknowledged, then the TLS handshake as `identity`.
    async fn start_tls(
        mut self,
        identity: Option<&str>,
    ) -> std::io::Result<Client<tokio_rustls::client::TlsStream<DuplexStream>>> {
        assert_eq!(self.ask(OPT_STARTTLS, &[]).await, REP_ACK);
        let server_name = ServerName::try_from("127.0.0.1").expect("server name");
        let stream = TlsConnector::from(client_tls(identity))
            .connect(server_name, self.stream)
            .await?;
        Ok(Client { stream })
    }
}

struct Session {
    client: Client<DuplexStream>,
    server: JoinHandle<Result<(), NbdError>>,
    _fixture: Fixture,
}

/// A server for one client with `policy`, greeted with client flags `client_flags`.
async fn connect_with_flags(policy: Policy, client_flags: u32) -> Session {
    let fixture = fixture();
    let (mut client, server_side) = tokio::io::duplex(1 << 20);
    let server = tokio::spawn(bucketfs_nbd::serve_connection(
        server_side,
        fixture.exports.clone(),
        Arc::new(policy),
    ));
    let mut greeting = [0u8; 18];
    client.read_exact(&mut greeting).await.expect("greeting");
    assert_eq!(&greeting[0..8], b"NBDMAGIC");
    client.write_all(&client_flags.to_be_bytes()).await.unwrap();
    Session {
        client: Client { stream: client },
        server,
        _fixture: fixture,
    }
}

/// FIXED_NEWSTYLE | NO_ZEROES.
async fn connect(policy: Policy) -> Session {
    connect_with_flags(policy, 3).await
}

fn required(verify_clients: bool) -> Policy {
    Policy {
        tls: Tls::Required(server_tls(verify_clients)),
        access: Access::Everyone,
    }
}

#[tokio::test]
async fn required_tls_refuses_every_option_but_starttls_and_abort() {
    let mut session = connect(required(true)).await;
    let client = &mut session.client;
    for option in [OPT_LIST, OPT_STRUCTURED_REPLY, 99] {
        assert_eq!(
            client.ask(option, &[]).await,
            REP_ERR_TLS_REQD,
            "option {option}"
        );
    }
    for option in [OPT_INFO, OPT_GO] {
        assert_eq!(
            client.ask(option, &info_request("ro")).await,
            REP_ERR_TLS_REQD,
            "option {option}: no NBD_REP_INFO may come before the refusal"
        );
    }
    assert_eq!(client.ask(OPT_ABORT, &[]).await, REP_ACK);
    session.server.await.unwrap().expect("a clean abort");
}

#[tokio::test]
async fn required_tls_ends_the_session_on_export_name_without_tls() {
    let mut session = connect(required(true)).await;
    session.client.option(OPT_EXPORT_NAME, b"ro").await;
    let mut rest = Vec::new();
    session.client.stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "the server answered: {rest:?}");
    let result = session.server.await.unwrap();
    assert!(matches!(result, Err(NbdError::TlsRequired)), "{result:?}");
}

#[tokio::test]
async fn tls_with_a_client_certificate_serves_the_export() {
    let mut session = connect(required(true)).await;
    assert_eq!(
        session.client.ask(OPT_STARTTLS, b"data").await,
        REP_ERR_INVALID,
        "STARTTLS carries no data"
    );
    let mut client = session.client.start_tls(Some("alice")).await.expect("TLS");
    assert_eq!(
        client.ask(OPT_STARTTLS, &[]).await,
        REP_ERR_INVALID,
        "a second STARTTLS"
    );
    assert_eq!(client.list().await, ["disk0", "ro", "slow"]);
    assert_eq!(client.info(OPT_GO, "ro").await, REP_ACK);
    let expected: Vec<u8> = (1000..1000 + 4096).map(ro_pattern).collect();
    assert_eq!(client.read(1000, 4096).await, expected);
    client.request(2, 0, 0).await; // NBD_CMD_DISC
    session.server.await.unwrap().expect("a clean disconnect");
}

#[tokio::test]
async fn starttls_forgets_what_was_negotiated_before() {
    let policy = Policy {
        tls: Tls::Optional(server_tls(false)),
        access: Access::Everyone,
    };
    let mut session = connect(policy).await;
    // Optional TLS: options work in plain text too.
    assert_eq!(session.client.list().await, ["disk0", "ro", "slow"]);
    assert_eq!(session.client.ask(OPT_STRUCTURED_REPLY, &[]).await, REP_ACK);
    let mut client = session.client.start_tls(None).await.expect("TLS");
    // Metadata contexts need structured replies, which STARTTLS made the server forget.
    let mut query = 2u32.to_be_bytes().to_vec();
    query.extend_from_slice(b"ro");
    query.extend_from_slice(&1u32.to_be_bytes());
    query.extend_from_slice(&15u32.to_be_bytes());
    query.extend_from_slice(b"base:allocation");
    assert_eq!(
        client.ask(OPT_SET_META_CONTEXT, &query).await,
        REP_ERR_INVALID
    );
    assert_eq!(client.ask(OPT_ABORT, &[]).await, REP_ACK);
    session.server.await.unwrap().expect("a clean abort");
}

/// A client whose certificate the server refuses, for the reason `why` (rustls' words): in
/// TLS 1.3 the client's handshake may finish before the server has checked its certificate, so
/// the refusal shows on the next read.
async fn assert_refused(identity: Option<&str>, why: &str) {
    let session = connect(required(true)).await;
    if let Ok(mut client) = session.client.start_tls(identity).await {
        // The write may fail too, once the server has hung up.
        let _ = client.try_option(OPT_LIST, &[]).await;
        assert!(
            client.try_reply().await.is_err(),
            "the server answered a client it should have refused"
        );
    }
    match session.server.await.unwrap() {
        Err(NbdError::TlsHandshake(error)) => {
            assert!(error.to_string().contains(why), "{error}")
        }
        other => panic!("expected a failed TLS handshake, got {other:?}"),
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    assert_refused(Some("mallory"), "invalid peer certificate: UnknownIssuer").await;
}

#[tokio::test]
async fn no_certificate_is_refused_when_client_certificates_are_required() {
    assert_refused(None, "peer sent no certificates").await;
}

#[tokio::test]
async fn the_allow_list_hides_exports_by_certificate_name() {
    let access = Access::ByCommonName(HashMap::from([
        ("alice".to_string(), vec!["ro".to_string()]),
        ("bob".to_string(), vec!["*".to_string()]),
    ]));
    let policy = || Policy {
        tls: Tls::Required(server_tls(true)),
        access: access.clone(),
    };

    let session = connect(policy()).await;
    let mut alice = session.client.start_tls(Some("alice")).await.unwrap();
    assert_eq!(alice.list().await, ["ro"]);
    for option in [OPT_INFO, OPT_GO] {
        assert_eq!(alice.info(option, "disk0").await, REP_ERR_UNKNOWN);
        assert_eq!(alice.info(option, "no-such-export").await, REP_ERR_UNKNOWN);
    }
    // The default export is the first one this client may see.
    assert_eq!(alice.info(OPT_INFO, "").await, REP_ACK);
    assert_eq!(alice.info(OPT_GO, "ro").await, REP_ACK);
    alice.request(2, 0, 0).await;
    session.server.await.unwrap().expect("a clean disconnect");

    let session = connect(policy()).await;
    let mut bob = session.client.start_tls(Some("bob")).await.unwrap();
    assert_eq!(bob.list().await, ["disk0", "ro", "slow"]);
    assert_eq!(bob.ask(OPT_ABORT, &[]).await, REP_ACK);
    session.server.await.unwrap().expect("a clean abort");

    // NBD_OPT_EXPORT_NAME cannot answer an error: a hidden export ends the session.
    let session = connect(policy()).await;
    let mut alice = session.client.start_tls(Some("alice")).await.unwrap();
    alice.option(OPT_EXPORT_NAME, b"disk0").await;
    assert!(alice.stream.read_u64().await.is_err());
    let result = session.server.await.unwrap();
    assert!(matches!(result, Err(NbdError::Open { .. })), "{result:?}");
}

#[tokio::test]
async fn a_client_without_fixed_newstyle_gets_policy_errors_not_tls_reqd() {
    // Without FLAG_C_FIXED_NEWSTYLE the protocol keeps the session in NOTLS mode, where
    // NBD_REP_ERR_TLS_REQD must not be sent.
    let mut session = connect_with_flags(required(true), 2).await;
    assert_eq!(session.client.ask(OPT_LIST, &[]).await, REP_ERR_POLICY);
    assert_eq!(session.client.ask(OPT_STARTTLS, &[]).await, REP_ERR_POLICY);
    assert_eq!(session.client.ask(OPT_ABORT, &[]).await, REP_ACK);
    session.server.await.unwrap().expect("a clean abort");
}
