//! Errors of the archive code: extraction, packing and the byte streams
//! between them and the network. Each variant is one cause, which the agent
//! maps to one gRPC status code (`agent::rpc::workspace`), and every message
//! says what to change. What only the agent's workspace can fail at (another
//! operation running, an interrupted swap, a checksum, a missing sub_path)
//! is the agent's own `WorkspaceError`.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
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
    /// The client went away, or the reader of a dump stopped (CANCELLED).
    #[error("{0}")]
    Cancelled(String),
    /// Any other I/O failure (INTERNAL), with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl ArchiveError {
    /// Wraps an I/O error with context; ENOSPC and EDQUOT become `DiskFull`.
    pub fn io(context: impl Into<String>, source: io::Error) -> ArchiveError {
        let context = context.into();
        match source.raw_os_error() {
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT) => {
                ArchiveError::DiskFull(format!("{context}: {source}"))
            }
            _ => ArchiveError::Io { context, source },
        }
    }

    pub fn invalid(msg: impl Into<String>) -> ArchiveError {
        ArchiveError::Invalid(msg.into())
    }
}

/// `rustix` errors as `std::io::Error` (for code that walks trees by fd).
pub fn sys(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}
