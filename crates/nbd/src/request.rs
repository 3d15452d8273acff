//! Validation of transmission requests: every client field is checked here, once, and turned
//! into a `Command` the export may trust (range inside the export, flags known, writes allowed).

use crate::limits::REQUEST_PAYLOAD_BYTES_MAX;
use crate::proto::{self, RequestHeader};

/// What validation checks a request against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub size_bytes: u64,
    pub read_only: bool,
    /// The `base:allocation` context id, when one was negotiated.
    pub block_status_context: Option<u32>,
}

/// A request that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// NBD_CMD_DISC: finish what is in flight, then close. It has no reply.
    Disconnect,
    Command(Command),
}

/// A valid command. Ranges lie within the export; zero lengths are possible and mean no-op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        may_punch: bool,
        fua: bool,
        /// NBD_CMD_FLAG_FAST_ZERO: fail with ENOTSUP rather than zero slowly.
        fast_only: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        one_extent: bool,
        context_id: u32,
    },
}

/// Why a request was refused: an NBD error value and a message for the human at the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub errno: u32,
    pub message: String,
}

impl Rejection {
    pub fn new(errno: u32, message: impl Into<String>) -> Self {
        Rejection {
            errno,
            message: message.into(),
        }
    }
}

pub(crate) fn command_name(command: u16) -> &'static str {
    match command {
        proto::CMD_READ => "read",
        proto::CMD_WRITE => "write",
        proto::CMD_DISC => "disconnect",
        proto::CMD_FLUSH => "flush",
        proto::CMD_TRIM => "trim",
        proto::CMD_CACHE => "cache",
        proto::CMD_WRITE_ZEROES => "write-zeroes",
        proto::CMD_BLOCK_STATUS => "block-status",
        _ => "unknown command",
    }
}

pub(crate) fn validate(header: &RequestHeader, target: &Target) -> Result<Request, Rejection> {
    let name = command_name(header.command);
    // FUA is accepted on every command: the protocol says servers advertising it must, since
    // clients are known to set it on commands that write nothing.
    let flags_allowed = |allowed: u16| {
        let unknown = header.flags & !(allowed | proto::CMD_FLAG_FUA);
        if unknown == 0 {
            Ok(())
        } else {
            Err(Rejection::new(
                proto::EINVAL,
                format!("flags {unknown:#x} are not valid for {name}"),
            ))
        }
    };
    let flag = |bit: u16| header.flags & bit != 0;
    let (offset, length) = (header.offset, header.length);

    let writable = || {
        if target.read_only {
            Err(Rejection::new(
                proto::EPERM,
                format!("{name} on a read-only export"),
            ))
        } else {
            Ok(())
        }
    };
    // Bounds what one request makes us (or the export) hold in memory.
    let payload_limit = || {
        if length > REQUEST_PAYLOAD_BYTES_MAX {
            Err(Rejection::new(
                proto::EINVAL,
                format!(
                    "{name} of {length} bytes is over the maximum of {REQUEST_PAYLOAD_BYTES_MAX}"
                ),
            ))
        } else {
            Ok(())
        }
    };
    // The protocol asks for ENOSPC when a write goes past the end and EINVAL for the rest.
    let in_range = |errno: u32| {
        let inside = offset
            .checked_add(u64::from(length))
            .is_some_and(|end| end <= target.size_bytes);
        if inside {
            Ok(())
        } else {
            Err(Rejection::new(
                errno,
                format!(
                    "{name} of {length} bytes at offset {offset} goes past the end of the export ({} bytes)",
                    target.size_bytes
                ),
            ))
        }
    };

    let command = match header.command {
        // Disconnect has no reply, so there is nothing to refuse.
        proto::CMD_DISC => return Ok(Request::Disconnect),
        proto::CMD_READ => {
            flags_allowed(0)?;
            payload_limit()?;
            in_range(proto::EINVAL)?;
            Command::Read { offset, length }
        }
        proto::CMD_WRITE => {
            flags_allowed(0)?;
            writable()?;
            payload_limit()?;
            in_range(proto::ENOSPC)?;
            Command::Write {
                offset,
                length,
                fua: flag(proto::CMD_FLAG_FUA),
            }
        }
        proto::CMD_FLUSH => {
            flags_allowed(0)?;
            if offset != 0 || length != 0 {
                return Err(Rejection::new(
                    proto::EINVAL,
                    "flush must have zero offset and length",
                ));
            }
            Command::Flush
        }
        proto::CMD_TRIM => {
            flags_allowed(0)?;
            writable()?;
            in_range(proto::EINVAL)?;
            Command::Trim {
                offset,
                length,
                fua: flag(proto::CMD_FLAG_FUA),
            }
        }
        proto::CMD_CACHE => {
            flags_allowed(0)?;
            payload_limit()?;
            in_range(proto::EINVAL)?;
            Command::Cache { offset, length }
        }
        proto::CMD_WRITE_ZEROES => {
            flags_allowed(proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO)?;
            writable()?;
            in_range(proto::ENOSPC)?;
            Command::WriteZeroes {
                offset,
                length,
                may_punch: !flag(proto::CMD_FLAG_NO_HOLE),
                fua: flag(proto::CMD_FLAG_FUA),
                fast_only: flag(proto::CMD_FLAG_FAST_ZERO),
            }
        }
        proto::CMD_BLOCK_STATUS => {
            flags_allowed(proto::CMD_FLAG_REQ_ONE)?;
            let context_id = target.block_status_context.ok_or_else(|| {
                Rejection::new(
                    proto::EINVAL,
                    "block status needs the base:allocation context, select it first",
                )
            })?;
            // A successful reply needs at least one descriptor of nonzero length, within the
            // request when REQ_ONE is set, which a zero-length request cannot have.
            if length == 0 {
                return Err(Rejection::new(proto::EINVAL, "block status of zero bytes"));
            }
            in_range(proto::EINVAL)?;
            Command::BlockStatus {
                offset,
                length,
                one_extent: flag(proto::CMD_FLAG_REQ_ONE),
                context_id,
            }
        }
        other => {
            return Err(Rejection::new(
                proto::EINVAL,
                format!("unknown command {other}"),
            ))
        }
    };
    Ok(Request::Command(command))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 1 << 20;

    fn target() -> Target {
        Target {
            size_bytes: SIZE,
            read_only: false,
            block_status_context: Some(proto::BASE_ALLOCATION_ID),
        }
    }

    fn header(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            handle: 1,
            offset,
            length,
        }
    }

    fn errno(result: Result<Request, Rejection>) -> u32 {
        result.expect_err("should be rejected").errno
    }

    #[test]
    fn valid_requests_become_commands() {
        let t = target();
        assert_eq!(
            validate(&header(proto::CMD_READ, 0, 512, 4096), &t),
            Ok(Request::Command(Command::Read {
                offset: 512,
                length: 4096
            }))
        );
        assert_eq!(
            validate(
                &header(proto::CMD_WRITE, proto::CMD_FLAG_FUA, SIZE - 1, 1),
                &t
            ),
            Ok(Request::Command(Command::Write {
                offset: SIZE - 1,
                length: 1,
                fua: true
            }))
        );
        assert_eq!(
            validate(
                &header(
                    proto::CMD_WRITE_ZEROES,
                    proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO,
                    0,
                    8
                ),
                &t
            ),
            Ok(Request::Command(Command::WriteZeroes {
                offset: 0,
                length: 8,
                may_punch: false,
                fua: false,
                fast_only: true
            }))
        );
        assert_eq!(
            validate(
                &header(proto::CMD_BLOCK_STATUS, proto::CMD_FLAG_REQ_ONE, 0, 8),
                &t
            ),
            Ok(Request::Command(Command::BlockStatus {
                offset: 0,
                length: 8,
                one_extent: true,
                context_id: proto::BASE_ALLOCATION_ID
            }))
        );
        assert_eq!(
            validate(&header(proto::CMD_FLUSH, 0, 0, 0), &t),
            Ok(Request::Command(Command::Flush))
        );
        assert_eq!(
            validate(&header(proto::CMD_DISC, 0, 0, 0), &t),
            Ok(Request::Disconnect)
        );
    }

    #[test]
    fn zero_length_requests_are_valid() {
        let t = target();
        for command in [
            proto::CMD_READ,
            proto::CMD_WRITE,
            proto::CMD_TRIM,
            proto::CMD_CACHE,
            proto::CMD_WRITE_ZEROES,
        ] {
            assert!(
                validate(&header(command, 0, SIZE, 0), &t).is_ok(),
                "command {command}"
            );
        }
    }

    #[test]
    fn ranges_past_the_end_are_refused() {
        let t = target();
        assert_eq!(
            errno(validate(&header(proto::CMD_READ, 0, SIZE, 1), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_READ, 0, u64::MAX, 2), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_TRIM, 0, SIZE - 1, 2), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_CACHE, 0, SIZE + 1, 0), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_BLOCK_STATUS, 0, SIZE, 1), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_WRITE, 0, SIZE, 1), &t)),
            proto::ENOSPC
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_WRITE, 0, u64::MAX, 1), &t)),
            proto::ENOSPC
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_WRITE_ZEROES, 0, SIZE, 1), &t)),
            proto::ENOSPC
        );
    }

    #[test]
    fn oversized_payloads_are_refused() {
        let t = Target {
            size_bytes: u64::MAX,
            ..target()
        };
        let over = REQUEST_PAYLOAD_BYTES_MAX + 1;
        assert_eq!(
            errno(validate(&header(proto::CMD_READ, 0, 0, over), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_WRITE, 0, 0, over), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_CACHE, 0, 0, over), &t)),
            proto::EINVAL
        );
        // Commands without a payload may cover more.
        assert!(validate(&header(proto::CMD_TRIM, 0, 0, u32::MAX), &t).is_ok());
        assert!(validate(&header(proto::CMD_WRITE_ZEROES, 0, 0, u32::MAX), &t).is_ok());
        assert!(validate(
            &header(proto::CMD_READ, 0, 0, REQUEST_PAYLOAD_BYTES_MAX),
            &t
        )
        .is_ok());
    }

    #[test]
    fn unknown_commands_and_flags_are_refused() {
        let t = target();
        assert_eq!(errno(validate(&header(42, 0, 0, 0), &t)), proto::EINVAL);
        assert_eq!(errno(validate(&header(8, 0, 0, 0), &t)), proto::EINVAL);
        assert_eq!(
            errno(validate(&header(proto::CMD_READ, 1 << 7, 0, 1), &t)),
            proto::EINVAL
        );
        // DF is not advertised.
        assert_eq!(
            errno(validate(&header(proto::CMD_READ, 1 << 2, 0, 1), &t)),
            proto::EINVAL
        );
        // Flags documented for other commands.
        assert_eq!(
            errno(validate(
                &header(proto::CMD_WRITE, proto::CMD_FLAG_NO_HOLE, 0, 1),
                &t
            )),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(
                &header(proto::CMD_READ, proto::CMD_FLAG_REQ_ONE, 0, 1),
                &t
            )),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(
                &header(proto::CMD_TRIM, proto::CMD_FLAG_FAST_ZERO, 0, 1),
                &t
            )),
            proto::EINVAL
        );
        // FUA is accepted everywhere.
        assert!(validate(&header(proto::CMD_READ, proto::CMD_FLAG_FUA, 0, 1), &t).is_ok());
        assert!(validate(&header(proto::CMD_FLUSH, proto::CMD_FLAG_FUA, 0, 0), &t).is_ok());
    }

    #[test]
    fn read_only_exports_refuse_writes() {
        let t = Target {
            read_only: true,
            ..target()
        };
        for command in [proto::CMD_WRITE, proto::CMD_TRIM, proto::CMD_WRITE_ZEROES] {
            assert_eq!(
                errno(validate(&header(command, 0, 0, 1), &t)),
                proto::EPERM,
                "command {command}"
            );
        }
        assert!(validate(&header(proto::CMD_READ, 0, 0, 1), &t).is_ok());
        assert!(validate(&header(proto::CMD_FLUSH, 0, 0, 0), &t).is_ok());
        assert!(validate(&header(proto::CMD_CACHE, 0, 0, 1), &t).is_ok());
    }

    #[test]
    fn block_status_needs_a_context_and_a_length() {
        let t = Target {
            block_status_context: None,
            ..target()
        };
        assert_eq!(
            errno(validate(&header(proto::CMD_BLOCK_STATUS, 0, 0, 512), &t)),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(
                &header(proto::CMD_BLOCK_STATUS, 0, 0, 0),
                &target()
            )),
            proto::EINVAL
        );
    }

    #[test]
    fn flush_must_not_carry_a_range() {
        assert_eq!(
            errno(validate(&header(proto::CMD_FLUSH, 0, 1, 0), &target())),
            proto::EINVAL
        );
        assert_eq!(
            errno(validate(&header(proto::CMD_FLUSH, 0, 0, 1), &target())),
            proto::EINVAL
        );
    }
}
