//! Errors of workspace operations: the archive code's own
//! ([`ArchiveError`]), and what only the workspace around it can fail at.
//! `rpc::workspace::ws_status` maps each variant to one gRPC status code;
//! every message says what to change.

pub use sandbox_archive::error::{ArchiveError, sys};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// Extraction, packing or the byte stream failed: the archive code's
    /// causes (malformed or unsafe input, limits, a full disk, a client
    /// gone, I/O), its messages unchanged.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The bytes received are not the bytes announced (DATA_LOSS).
    #[error("{0}")]
    Integrity(String),
    /// Another operation holds the workspace (ABORTED).
    #[error("{0}")]
    Busy(String),
    /// A requested path does not exist (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The workspace is not in a state the operation needs: an interrupted
    /// swap that cannot be completed, or an entry the agent cannot move
    /// (FAILED_PRECONDITION). The message says what to fix.
    #[error("{0}")]
    Stuck(String),
    /// The lease the request was admitted under has ended
    /// (`sandbox_client::lease`): nothing was read or changed (NOT_FOUND).
    #[error("{0}")]
    LeaseEnded(String),
}

impl WorkspaceError {
    /// [`ArchiveError::io`]: ENOSPC and EDQUOT become `DiskFull`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> WorkspaceError {
        ArchiveError::io(context, source).into()
    }

    /// [`ArchiveError::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> WorkspaceError {
        ArchiveError::invalid(msg).into()
    }
}

/// An I/O error's context: what was being done.
pub(super) fn ctx(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WorkspaceError {
    let what = what.into();
    move |e| WorkspaceError::io(what, e)
}
