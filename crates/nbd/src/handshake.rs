//! The fixed-newstyle handshake: greeting, client flags, then option haggling until the client
//! picks an export (NBD_OPT_EXPORT_NAME or NBD_OPT_GO) or gives up (NBD_OPT_ABORT).
//!
//! Every option is read whole (bounded by `OPTION_DATA_BYTES_MAX`) before it is parsed, and every
//! malformed option is answered with an error reply rather than a disconnect, as the protocol
//! asks; only violations that leave no way to answer (bad magic, unknown client flags, a failed
//! NBD_OPT_EXPORT_NAME, an oversized option) end the session.

use crate::backend::{Export, ExportError, Exports};
use crate::error::{option_error_of, NbdError};
use crate::limits::{
    BLOCK_SIZE_MIN_BYTES, BLOCK_SIZE_PREFERRED_BYTES, OPTIONS_PER_HANDSHAKE_MAX,
    OPTION_DATA_BYTES_MAX, REQUEST_PAYLOAD_BYTES_MAX, STRING_BYTES_MAX,
};
use crate::proto::{self, InfoRequest, MetaContextRequest, OptionHeader};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

/// What transmission needs to know about the export and what was negotiated.
pub(crate) struct Session {
    pub export: Arc<dyn Export>,
    pub export_name: String,
    /// Read once at open: the size a connection sees is fixed for its lifetime.
    pub size_bytes: u64,
    pub read_only: bool,
    pub structured_replies: bool,
    /// The id of `base:allocation` when the client selected it; BLOCK_STATUS needs it.
    pub block_status_context: Option<u32>,
}

pub(crate) enum Outcome {
    Transmission(Session),
    /// The client ended the handshake with NBD_OPT_ABORT.
    Aborted,
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

/// Options negotiated so far.
#[derive(Default)]
struct Negotiation {
    no_zeroes: bool,
    structured_replies: bool,
    base_allocation: bool,
}

/// What to do after answering an option.
enum Next {
    Continue,
    Done(Outcome),
}

pub(crate) async fn negotiate<S>(stream: &mut S, exports: &dyn Exports) -> Result<Outcome, NbdError>
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
    // protocol permits; a non-fixed client only ever sends NBD_OPT_EXPORT_NAME anyway.
    let mut negotiation = Negotiation {
        no_zeroes: client_flags & proto::FLAG_C_NO_ZEROES != 0,
        ..Negotiation::default()
    };

    for _ in 0..OPTIONS_PER_HANDSHAKE_MAX {
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

        match handle_option(stream, exports, &mut negotiation, header.option, &data).await? {
            Next::Continue => {}
            Next::Done(outcome) => return Ok(outcome),
        }
    }
    Err(NbdError::Protocol(format!(
        "still negotiating after {OPTIONS_PER_HANDSHAKE_MAX} options"
    )))
}

async fn handle_option<S>(
    stream: &mut S,
    exports: &dyn Exports,
    negotiation: &mut Negotiation,
    option: u32,
    data: &[u8],
) -> Result<Next, NbdError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    let next = match option {
        proto::OPT_EXPORT_NAME => {
            let session = export_name(exports, negotiation, data).await?;
            out.extend_from_slice(
                &proto::encode_info_export(
                    session.size_bytes,
                    transmission_flags(session.read_only),
                )[2..],
            );
            if !negotiation.no_zeroes {
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
        proto::OPT_LIST => {
            list(exports, data, &mut out).await;
            Next::Continue
        }
        proto::OPT_INFO | proto::OPT_GO => match info(exports, negotiation, option, data, &mut out)
            .await
        {
            Some(session) if option == proto::OPT_GO => Next::Done(Outcome::Transmission(session)),
            _ => Next::Continue,
        },
        proto::OPT_STRUCTURED_REPLY => {
            if data.is_empty() {
                negotiation.structured_replies = true;
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
            meta_context(negotiation, option, data, &mut out);
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

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// NBD_OPT_EXPORT_NAME: no way to report an error except by closing the connection.
async fn export_name(
    exports: &dyn Exports,
    negotiation: &Negotiation,
    data: &[u8],
) -> Result<Session, NbdError> {
    let name = std::str::from_utf8(data)
        .ok()
        .filter(|name| name.len() <= STRING_BYTES_MAX && !name.contains('\0'))
        .ok_or_else(|| NbdError::Protocol("export name is not a valid NBD string".into()))?;
    let (canonical, export) = open(exports, name).await.map_err(|source| NbdError::Open {
        name: name.to_owned(),
        source,
    })?;
    Ok(session(canonical, export, negotiation))
}

fn session(export_name: String, export: Arc<dyn Export>, negotiation: &Negotiation) -> Session {
    Session {
        size_bytes: export.size_bytes(),
        read_only: export.read_only(),
        export,
        export_name,
        structured_replies: negotiation.structured_replies,
        // base:allocation exists on every export, so the selection holds whichever export the
        // client finally picks.
        block_status_context: negotiation
            .base_allocation
            .then_some(proto::BASE_ALLOCATION_ID),
    }
}

/// Opens `requested`, or the default export (the first one listed) for the empty name.
async fn open(
    exports: &dyn Exports,
    requested: &str,
) -> Result<(String, Arc<dyn Export>), ExportError> {
    let name = if requested.is_empty() {
        exports
            .list()
            .await?
            .into_iter()
            .next()
            .map(|summary| summary.name)
            .ok_or(ExportError::NotFound)?
    } else {
        requested.to_owned()
    };
    let export = exports.open(&name).await?;
    Ok((name, export))
}

async fn list(exports: &dyn Exports, data: &[u8], out: &mut Vec<u8>) {
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
    match exports.list().await {
        Ok(summaries) => {
            for summary in &summaries {
                let reply = proto::encode_rep_server(&summary.name, &summary.description);
                proto::encode_option_reply(out, option, proto::REP_SERVER, &reply);
            }
            proto::encode_option_reply(out, option, proto::REP_ACK, &[]);
        }
        Err(error) => {
            warn!(%error, "listing exports failed");
            proto::encode_option_error(out, option, option_error_of(&error), &error.to_string());
        }
    }
}

/// NBD_OPT_INFO and NBD_OPT_GO: writes the replies and returns the session on success.
async fn info(
    exports: &dyn Exports,
    negotiation: &Negotiation,
    option: u32,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Option<Session> {
    let request = match InfoRequest::decode(data) {
        Ok(request) => request,
        Err(malformed) => {
            proto::encode_option_error(out, option, proto::REP_ERR_INVALID, &malformed.0);
            return None;
        }
    };
    let (name, export) = match open(exports, &request.name).await {
        Ok(opened) => opened,
        Err(error) => {
            debug!(name = %request.name, %error, "export not available");
            let message = if request.name.is_empty() && error == ExportError::NotFound {
                "there is no default export: the server has no exports".to_owned()
            } else {
                format!("export {:?}: {error}", request.name)
            };
            proto::encode_option_error(out, option, option_error_of(&error), &message);
            return None;
        }
    };
    let session = session(name, export, negotiation);

    let export_info =
        proto::encode_info_export(session.size_bytes, transmission_flags(session.read_only));
    proto::encode_option_reply(out, option, proto::REP_INFO, &export_info);
    if request.info_types.contains(&proto::INFO_NAME) {
        let reply = proto::encode_info_string(proto::INFO_NAME, &session.export_name);
        proto::encode_option_reply(out, option, proto::REP_INFO, &reply);
    }
    if request.info_types.contains(&proto::INFO_DESCRIPTION) {
        let description = description(exports, &session.export_name).await;
        if !description.is_empty() {
            let reply = proto::encode_info_string(proto::INFO_DESCRIPTION, &description);
            proto::encode_option_reply(out, option, proto::REP_INFO, &reply);
        }
    }
    // Sent whether asked for or not: our maximum is below the protocol's default of "unlimited",
    // and a client that did not ask is free to ignore it.
    let sizes = proto::encode_info_block_size(
        BLOCK_SIZE_MIN_BYTES,
        BLOCK_SIZE_PREFERRED_BYTES,
        REQUEST_PAYLOAD_BYTES_MAX,
    );
    proto::encode_option_reply(out, option, proto::REP_INFO, &sizes);
    proto::encode_option_reply(out, option, proto::REP_ACK, &[]);
    Some(session)
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
