//! Errors of workspace operations. Each variant maps to one gRPC status code
//! (see `agent::rpc`), and every message says what to change.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// The archive or request is malformed or unsafe (INVALID_ARGUMENT).
    #[error("{0}")]
    Invalid(String),
    /// A configured limit was exceeded (RESOURCE_EXHAUSTED). `limit` is the
    /// config key under `[archive]`.
    #[error("limit archive.{limit} exceeded: {detail}")]
    Limit { limit: &'static str, detail: String },
    /// The filesystem is full (RESOURCE_EXHAUSTED).
    #[error("the workspace filesystem is full: {0}")]
    DiskFull(String),
    /// The bytes received are not the bytes announced (DATA_LOSS).
    #[error("{0}")]
    Integrity(String),
    /// Another operation holds the workspace (ABORTED).
    #[error("{0}")]
    Busy(String),
    /// The client went away (CANCELLED).
    #[error("{0}")]
    Cancelled(String),
    /// A requested path does not exist (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The workspace is not in a state the operation needs: an interrupted
    /// swap that cannot be completed, or an entry the agent cannot move
    /// (FAILED_PRECONDITION). The message says what to fix.
    #[error("{0}")]
    Stuck(String),
    /// Any other I/O failure (INTERNAL), with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl WsError {
    /// Wraps an I/O error with context; ENOSPC and EDQUOT become `DiskFull`.
    pub fn io(context: impl Into<String>, source: io::Error) -> WsError {
        let context = context.into();
        match source.raw_os_error() {
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) => {
                WsError::DiskFull(format!("{context}: {source}"))
            }
            _ => WsError::Io { context, source },
        }
    }

    pub fn invalid(msg: impl Into<String>) -> WsError {
        WsError::Invalid(msg.into())
    }
}

/// `rustix` errors as `std::io::Error` (for code that walks trees by fd).
pub fn sys(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}
