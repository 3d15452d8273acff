//! The fixed-newstyle handshake: greeting, client flags, then option haggling until the client
//! picks an export (NBD_OPT_EXPORT_NAME or NBD_OPT_GO) or gives up (NBD_OPT_ABORT).
//!
//! Every option is read whole (bounded by `OPTION_DATA_BYTES_MAX`) before it is parsed, and every
//! malformed option is answered with an error reply rather than a disconnect, as the protocol
//! asks; only violations that leave no way to answer (bad magic, unknown client flags, a failed
//! NBD_OPT_EXPORT_NAME, an oversized option) end the session.
//!
//! TLS follows the protocol's TLS section: NBD_OPT_STARTTLS is refused when TLS is off (NOTLS);
//! when it is required (FORCEDTLS) every other option before TLS gets NBD_REP_ERR_TLS_REQD and
//! NBD_OPT_EXPORT_NAME ends the session. The switch itself happens in server.rs, between two
//! calls of `Handshake::haggle`. The allow-list of the `Policy` hides exports from LIST, and
//! INFO, GO and EXPORT_NAME answer a hidden export as they answer a missing one.

use crate::backend::{Export, ExportError, ExportSummary, Exports};
use crate::error::{option_error_of, NbdError};
use crate::limits::{
    BLOCK_SIZE_MIN_BYTES, BLOCK_SIZE_PREFERRED_BYTES, OPTIONS_PER_HANDSHAKE_MAX,
    OPTION_DATA_BYTES_MAX, REQUEST_PAYLOAD_BYTES_MAX, STRING_BYTES_MAX,
};
use crate::policy::{Policy, Tls};
use crate::proto::{self, InfoRequest, MetaContextRequest, OptionHeader};
use rustls::ServerConfig;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info, warn};

/// What transmission needs to know about the export and what was negotiated.
pub(crate) struct Session {
    pub export: Arc<dyn Export>,
    pub export_name: String,
    /// Read once at open: the size a connection sees is fixed for its lifetime.
    pub size_bytes: u64,
    pub read_only: bool,
    pub structured_replies: bool,
    /// Whether the session runs over TLS.
    pub tls: bool,
    /// The id of `base:allocation` when the client selected it; BLOCK_STATUS needs it.
    pub block_status_context: Option<u32>,
}

pub(crate) enum Outcome {
    Transmission(Session),
    /// The client ended the handshake with NBD_OPT_ABORT.
    Aborted,
    /// NBD_OPT_STARTTLS was acknowledged: the TLS handshake comes next on the same stream.
    StartTls,
}

/// The transmission flags we advertise for an export.
pub(crate) fn transmission_flags(read_only: bool) -> u16 {
    // Flush and FUA are promised across connections by `Export::flush`, hence CAN_MULTI_CONN.
    let mut flags = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_CACHE
        | proto::FLAG_CAN_MULTI_CONN;
    if read_only {
        // Write-only features are not advertised on a read-only export, so clients do not plan
        // around them; a client that sends them anyway gets EPERM.
        flags |= proto::FLAG_READ_ONLY;
    } else {
        flags |= proto::FLAG_SEND_FUA
            | proto::FLAG_SEND_TRIM
            | proto::FLAG_SEND_WRITE_ZEROES
            | proto::FLAG_SEND_FAST_ZERO;
    }
    flags
}

/// Options negotiated so far. NBD_OPT_STARTTLS forgets them: the protocol forbids carrying
/// negotiation state across the switch to TLS.
#[derive(Default)]
struct Negotiation {
    structured_replies: bool,
    base_allocation: bool,
}

/// What to do after answering an option.
enum Next {
    Continue,
    Done(Outcome),
}

/// One client's handshake. It lives across NBD_OPT_STARTTLS: the caller runs the TLS handshake
/// between two calls of [`Handshake::haggle`] and reports the client's certificate with
/// [`Handshake::tls_started`].
pub(crate) struct Handshake<'a> {
    exports: &'a dyn Exports,
    policy: &'a Policy,
    fixed_newstyle: bool,
    no_zeroes: bool,
    negotiation: Negotiation,
    /// Counted over the whole handshake, before and after TLS.
    options_seen: u32,
    /// `None` until TLS runs; then the subject CN of the client's verified certificate, if any.
    tls: Option<Option<String>>,
    /// The refusal of a client that does not start TLS is logged once per connection.
    plain_refusal_logged: bool,
}

impl<'a> Handshake<'a> {
    pub(crate) fn new(exports: &'a dyn Exports, policy: &'a Policy) -> Self {
        Handshake {
            exports,
            policy,
            fixed_newstyle: false,
            no_zeroes: false,
            negotiation: Negotiation::default(),
            options_seen: 0,
            tls: None,
            plain_refusal_logged: false,
        }
    }

    /// Sends the greeting and reads the client flags.
    pub(crate) async fn greet<S>(&mut self, stream: &mut S) -> Result<(), NbdError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        stream.write_all(&proto::encode_greeting()).await?;
        stream.flush().await?;

        let client_flags = stream.read_u32().await?;
        let known = proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES;
        if client_flags & !known != 0 {
            return Err(NbdError::Protocol(format!(
                "unknown client flags {client_flags:#x}"
            )));
        }
        // Clients that omit FLAG_C_FIXED_NEWSTYLE still get fixed-newstyle replies, which the
        // protocol permits; a non-fixed client only ever sends NBD_OPT_EXPORT_NAME anyway. TLS,
        // though, needs the flag (the protocol's TLS section).
        self.fixed_newstyle = client_flags & proto::FLAG_C_FIXED_NEWSTYLE != 0;
        self.no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
        Ok(())
    }

    /// The TLS configuration to accept with after [`Outcome::StartTls`].
    pub(crate) fn tls_config(&self) -> Option<Arc<ServerConfig>> {
        match &self.policy.tls {
            Tls::Off => None,
            Tls::Optional(config) | Tls::Required(config) => Some(Arc::clone(config)),
        }
    }

    /// TLS now runs; `common_name` is the subject CN of the client's verified certificate.
    pub(crate) fn tls_started(&mut self, common_name: Option<String>) {
        debug_assert!(self.tls.is_none(), "TLS started twice");
        self.negotiation = Negotiation::default();
        self.tls = Some(common_name);
    }

    fn common_name(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|name| name.as_deref())
    }

    /// Answers options until the client picks an export, aborts, or starts TLS.
    pub(crate) async fn haggle<S>(&mut self, stream: &mut S) -> Result<Outcome, NbdError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        while self.options_seen < OPTIONS_PER_HANDSHAKE_MAX {
            self.options_seen += 1;
            let mut header_bytes = [0u8; proto::OPTION_HEADER_BYTES];
            stream.read_exact(&mut header_bytes).await?;
            let header = OptionHeader::decode(&header_bytes)
                .ok_or_else(|| NbdError::Protocol("option without the IHAVEOPT magic".into()))?;

            if header.length > OPTION_DATA_BYTES_MAX {
                if header.option != proto::OPT_EXPORT_NAME {
                    let mut out = Vec::new();
                    let message = format!(
                        "option data of {} bytes is over the limit of {OPTION_DATA_BYTES_MAX}",
                        header.length
                    );
                    proto::encode_option_error(
                        &mut out,
                        header.option,
                        proto::REP_ERR_TOO_BIG,
                        &message,
                    );
                    // Best effort: we are about to disconnect whether or not the client reads it.
                    let _ = send(stream, &out).await;
                }
                return Err(NbdError::Protocol(format!(
                    "option {} with {} bytes of data, over the limit of {OPTION_DATA_BYTES_MAX}",
                    header.option, header.length
                )));
            }
            let mut data = vec![0u8; header.length as usize];
            stream.read_exact(&mut data).await?;

            match self.handle_option(stream, header.option, &data).await? {
                Next::Continue => {}
                Next::Done(outcome) => return Ok(outcome),
            }
        }
        Err(NbdError::Protocol(format!(
            "still negotiating after {OPTIONS_PER_HANDSHAKE_MAX} options"
        )))
    }

    async fn handle_option<S>(
        &mut self,
        stream: &mut S,
        option: u32,
        data: &[u8],
    ) -> Result<Next, NbdError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut out = Vec::new();
        let tls_missing = self.tls.is_none() && matches!(self.policy.tls, Tls::Required(_));
        if tls_missing && option != proto::OPT_STARTTLS && option != proto::OPT_ABORT {
            return self.refuse_without_tls(stream, option).await;
        }
        let next = match option {
            proto::OPT_EXPORT_NAME => {
                let session = self.export_name(data).await?;
                out.extend_from_slice(
                    &proto::encode_info_export(
                        session.size_bytes,
                        transmission_flags(session.read_only),
                    )[2..],
                );
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; proto::EXPORT_NAME_PADDING_BYTES]);
                }
                Next::Done(Outcome::Transmission(session))
            }
            proto::OPT_ABORT => {
                // The client may already have closed its end; it asked to leave, so a failed
                // acknowledgement changes nothing.
                proto::encode_option_reply(&mut out, option, proto::REP_ACK, &[]);
                let _ = send(stream, &out).await;
                return Ok(Next::Done(Outcome::Aborted));
            }
            proto::OPT_STARTTLS => match self.starttls_refusal(data) {
                Some((reply_type, message)) => {
                    proto::encode_option_error(&mut out, option, reply_type, message);
                    Next::Continue
                }
                None => {
                    // From the acknowledgement on, every byte is TLS.
                    proto::encode_option_reply(&mut out, option, proto::REP_ACK, &[]);
                    Next::Done(Outcome::StartTls)
                }
            },
            proto::OPT_LIST => {
                self.list(data, &mut out).await;
                Next::Continue
            }
            proto::OPT_INFO | proto::OPT_GO => match self.info(option, data, &mut out).await {
                Some(session) if option == proto::OPT_GO => {
                    Next::Done(Outcome::Transmission(session))
                }
                _ => Next::Continue,
            },
            proto::OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    self.negotiation.structured_replies = true;
                    proto::encode_option_reply(&mut out, option, proto::REP_ACK, &[]);
                } else {
                    proto::encode_option_error(
                        &mut out,
                        option,
                        proto::REP_ERR_INVALID,
                        "structured reply option carries no data",
                    );
                }
                Next::Continue
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                meta_context(&mut self.negotiation, option, data, &mut out);
                Next::Continue
            }
            _ => {
                debug!(option, "unsupported option");
                let message = format!("option {option} is not supported by this server");
                proto::encode_option_error(&mut out, option, proto::REP_ERR_UNSUP, &message);
                Next::Continue
            }
        };
        send(stream, &out).await?;
        Ok(next)
    }

    /// An option other than STARTTLS or ABORT before TLS, when TLS is required (FORCEDTLS).
    async fn refuse_without_tls<S>(&mut self, stream: &mut S, option: u32) -> Result<Next, NbdError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        if !self.plain_refusal_logged {
            self.plain_refusal_logged = true;
            warn!(
                option,
                "client negotiates without TLS, which this server requires: refused"
            );
        }
        // NBD_OPT_EXPORT_NAME cannot be answered with an error: the session ends.
        if option == proto::OPT_EXPORT_NAME {
            return Err(NbdError::TlsRequired);
        }
        // A client without fixed newstyle cannot start TLS, and the protocol keeps such a
        // session in NOTLS mode, where NBD_REP_ERR_TLS_REQD must not be sent.
        let (reply_type, message) = if self.fixed_newstyle {
            (
                proto::REP_ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            )
        } else {
            (
                proto::REP_ERR_POLICY,
                "this server requires TLS, which needs fixed newstyle negotiation",
            )
        };
        let mut out = Vec::new();
        proto::encode_option_error(&mut out, option, reply_type, message);
        send(stream, &out).await?;
        Ok(Next::Continue)
    }

    /// Why NBD_OPT_STARTTLS cannot be granted, as the option error and its message.
    fn starttls_refusal(&self, data: &[u8]) -> Option<(u32, &'static str)> {
        if matches!(self.policy.tls, Tls::Off) {
            return Some((
                proto::REP_ERR_POLICY,
                "TLS is not configured on this server",
            ));
        }
        if self.tls.is_some() {
            return Some((proto::REP_ERR_INVALID, "TLS is already running"));
        }
        if !data.is_empty() {
            return Some((proto::REP_ERR_INVALID, "STARTTLS carries no data"));
        }
        if !self.fixed_newstyle {
            return Some((
                proto::REP_ERR_POLICY,
                "TLS needs fixed newstyle negotiation",
            ));
        }
        None
    }

    /// NBD_OPT_EXPORT_NAME: no way to report an error except by closing the connection.
    async fn export_name(&self, data: &[u8]) -> Result<Session, NbdError> {
        let name = std::str::from_utf8(data)
            .ok()
            .filter(|name| name.len() <= STRING_BYTES_MAX && !name.contains('\0'))
            .ok_or_else(|| NbdError::Protocol("export name is not a valid NBD string".into()))?;
        let (canonical, export) = self.open(name).await.map_err(|source| NbdError::Open {
            name: name.to_owned(),
            source,
        })?;
        Ok(self.session(canonical, export))
    }

    fn session(&self, export_name: String, export: Arc<dyn Export>) -> Session {
        Session {
            size_bytes: export.size_bytes(),
            read_only: export.read_only(),
            export,
            export_name,
            structured_replies: self.negotiation.structured_replies,
            tls: self.tls.is_some(),
            // base:allocation exists on every export, so the selection holds whichever export
            // the client finally picks.
            block_status_context: self
                .negotiation
                .base_allocation
                .then_some(proto::BASE_ALLOCATION_ID),
        }
    }

    fn permits(&self, export: &str) -> bool {
        self.policy.access.permits(self.common_name(), export)
    }

    /// The exports this client may see.
    async fn visible(&self) -> Result<Vec<ExportSummary>, ExportError> {
        let mut summaries = self.exports.list().await?;
        summaries.retain(|summary| self.permits(&summary.name));
        Ok(summaries)
    }

    /// Opens `requested`, or the default export (the first one this client may see) for the
    /// empty name. An export the allow-list hides is reported as not found, as if it did not
    /// exist, so that a client cannot learn the names of exports it may not use.
    async fn open(&self, requested: &str) -> Result<(String, Arc<dyn Export>), ExportError> {
        let name = if requested.is_empty() {
            self.visible()
                .await?
                .into_iter()
                .next()
                .map(|summary| summary.name)
                .ok_or(ExportError::NotFound)?
        } else if self.permits(requested) {
            requested.to_owned()
        } else {
            info!(
                export = requested,
                client = self.common_name().unwrap_or("(no certificate)"),
                "export not in this client's allow-list: answered as unknown"
            );
            return Err(ExportError::NotFound);
        };
        let export = self.exports.open(&name).await?;
        Ok((name, export))
    }

    async fn list(&self, data: &[u8], out: &mut Vec<u8>) {
        let option = proto::OPT_LIST;
        if !data.is_empty() {
            proto::encode_option_error(
                out,
                option,
                proto::REP_ERR_INVALID,
                "list option carries no data",
            );
            return;
        }
        match self.visible().await {
            Ok(summaries) => {
                for summary in &summaries {
                    let reply = proto::encode_rep_server(&summary.name, &summary.description);
                    proto::encode_option_reply(out, option, proto::REP_SERVER, &reply);
                }
                proto::encode_option_reply(out, option, proto::REP_ACK, &[]);
            }
            Err(error) => {
                warn!(%error, "listing exports failed");
                proto::encode_option_error(
                    out,
                    option,
                    option_error_of(&error),
                    &error.to_string(),
                );
            }
        }
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: writes the replies and returns the session on success.
    async fn info(&self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Option<Session> {
        let request = match InfoRequest::decode(data) {
            Ok(request) => request,
            Err(malformed) => {
                proto::encode_option_error(out, option, proto::REP_ERR_INVALID, &malformed.0);
                return None;
            }
        };
        let (name, export) = match self.open(&request.name).await {
            Ok(opened) => opened,
            Err(error) => {
                debug!(name = %request.name, %error, "export not available");
                let message = if request.name.is_empty() && error == ExportError::NotFound {
                    "there is no default export: the server has no exports for this client"
                        .to_owned()
                } else {
                    format!("export {:?}: {error}", request.name)
                };
                proto::encode_option_error(out, option, option_error_of(&error), &message);
                return None;
            }
        };
        let session = self.session(name, export);

        let export_info =
            proto::encode_info_export(session.size_bytes, transmission_flags(session.read_only));
        proto::encode_option_reply(out, option, proto::REP_INFO, &export_info);
        if request.info_types.contains(&proto::INFO_NAME) {
            let reply = proto::encode_info_string(proto::INFO_NAME, &session.export_name);
            proto::encode_option_reply(out, option, proto::REP_INFO, &reply);
        }
        if request.info_types.contains(&proto::INFO_DESCRIPTION) {
            let description = description(self.exports, &session.export_name).await;
            if !description.is_empty() {
                let reply = proto::encode_info_string(proto::INFO_DESCRIPTION, &description);
                proto::encode_option_reply(out, option, proto::REP_INFO, &reply);
            }
        }
        // Sent whether asked for or not: our maximum is below the protocol's default of
        // "unlimited", and a client that did not ask is free to ignore it.
        let sizes = proto::encode_info_block_size(
            BLOCK_SIZE_MIN_BYTES,
            BLOCK_SIZE_PREFERRED_BYTES,
            REQUEST_PAYLOAD_BYTES_MAX,
        );
        proto::encode_option_reply(out, option, proto::REP_INFO, &sizes);
        proto::encode_option_reply(out, option, proto::REP_ACK, &[]);
        Some(session)
    }
}

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

async fn description(exports: &dyn Exports, name: &str) -> String {
    match exports.list().await {
        Ok(summaries) => summaries
            .into_iter()
            .find(|summary| summary.name == name)
            .map(|summary| summary.description)
            .unwrap_or_default(),
        Err(error) => {
            // A description is decoration; failing the whole option for it would be worse.
            debug!(%error, "no description: listing exports failed");
            String::new()
        }
    }
}

/// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT; `base:allocation` is our only context.
fn meta_context(negotiation: &mut Negotiation, option: u32, data: &[u8], out: &mut Vec<u8>) {
    let setting = option == proto::OPT_SET_META_CONTEXT;
    if setting {
        // A SET replaces the selection even when it fails.
        negotiation.base_allocation = false;
    }
    if !negotiation.structured_replies {
        let message = "metadata contexts need structured replies, negotiate them first";
        proto::encode_option_error(out, option, proto::REP_ERR_INVALID, message);
        return;
    }
    let request = match MetaContextRequest::decode(data) {
        Ok(request) => request,
        Err(malformed) => {
            proto::encode_option_error(out, option, proto::REP_ERR_INVALID, &malformed.0);
            return;
        }
    };
    if matches_base_allocation(&request.queries, setting) {
        if setting {
            negotiation.base_allocation = true;
        }
        // Listing ids are reserved and sent as zero; a selection gets the id BLOCK_STATUS uses.
        let id = if setting {
            proto::BASE_ALLOCATION_ID
        } else {
            0
        };
        let reply = proto::encode_meta_context(id, proto::BASE_ALLOCATION);
        proto::encode_option_reply(out, option, proto::REP_META_CONTEXT, &reply);
    }
    proto::encode_option_reply(out, option, proto::REP_ACK, &[]);
}

/// Whether the queries select `base:allocation`. Listing with no query lists everything and
/// `base:` is a wildcard when listing; selecting needs the exact name. Unknown namespaces and
/// leaf names are ignored, as the protocol requires.
fn matches_base_allocation(queries: &[String], setting: bool) -> bool {
    if setting {
        queries.iter().any(|query| query == proto::BASE_ALLOCATION)
    } else {
        queries.is_empty()
            || queries
                .iter()
                .any(|query| query == proto::BASE_ALLOCATION || query == "base:")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_exports_advertise_every_write_feature() {
        let flags = transmission_flags(false);
        for flag in [
            proto::FLAG_HAS_FLAGS,
            proto::FLAG_SEND_FLUSH,
            proto::FLAG_SEND_FUA,
            proto::FLAG_SEND_TRIM,
            proto::FLAG_SEND_WRITE_ZEROES,
            proto::FLAG_SEND_FAST_ZERO,
            proto::FLAG_SEND_CACHE,
            proto::FLAG_CAN_MULTI_CONN,
        ] {
            assert_ne!(flags & flag, 0, "flag {flag:#x} missing");
        }
        assert_eq!(flags & proto::FLAG_READ_ONLY, 0);
    }

    #[test]
    fn read_only_exports_advertise_no_write_feature() {
        let flags = transmission_flags(true);
        assert_ne!(flags & proto::FLAG_READ_ONLY, 0);
        assert_ne!(flags & proto::FLAG_HAS_FLAGS, 0);
        for flag in [
            proto::FLAG_SEND_FUA,
            proto::FLAG_SEND_TRIM,
            proto::FLAG_SEND_WRITE_ZEROES,
            proto::FLAG_SEND_FAST_ZERO,
        ] {
            assert_eq!(flags & flag, 0, "flag {flag:#x} present");
        }
    }

    #[test]
    fn meta_context_queries() {
        let q = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches_base_allocation(&q(&[]), false));
        assert!(!matches_base_allocation(&q(&[]), true));
        assert!(matches_base_allocation(&q(&["base:"]), false));
        assert!(!matches_base_allocation(&q(&["base:"]), true));
        assert!(matches_base_allocation(
            &q(&["x-foo:bar", "base:allocation"]),
            true
        ));
        assert!(!matches_base_allocation(
            &q(&["base:other", "qemu:dirty-bitmap:a"]),
            false
        ));
    }
}
