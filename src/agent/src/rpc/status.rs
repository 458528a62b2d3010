//! Domain errors → `tonic::Status`: the one place each cause meets a gRPC
//! status code.

use tonic::Status;

use crate::agent_token::BindError;
use crate::exec::ExecError;
use crate::exec::log::ReadError;
use crate::lifecycle::LcError;
use crate::mail::MailError;
use crate::server_data::DataError;
use crate::workspace::{ArchiveError, TransferError, WorkspaceError};

/// The gRPC status for a workspace error.
pub(super) fn ws_status(e: WorkspaceError) -> Status {
    let msg = e.to_string();
    match e {
        WorkspaceError::Archive(a) => archive_status(a),
        WorkspaceError::Integrity(_) => Status::data_loss(msg),
        WorkspaceError::Busy(_) => Status::aborted(msg),
        WorkspaceError::NotFound(_) => Status::not_found(msg),
        WorkspaceError::Stuck(_) => Status::failed_precondition(msg),
        WorkspaceError::LeaseEnded(_) => Status::not_found(msg),
    }
}

/// The gRPC status for an archive error (a workspace's, or an execution
/// archive's).
pub(super) fn archive_status(e: ArchiveError) -> Status {
    let msg = e.to_string();
    match e {
        ArchiveError::Invalid(_) => Status::invalid_argument(msg),
        ArchiveError::Limit { .. } | ArchiveError::DiskFull(_) => Status::resource_exhausted(msg),
        ArchiveError::Cancelled(_) => Status::cancelled(msg),
        ArchiveError::Io { .. } => Status::internal(msg),
    }
}

/// The gRPC status for a streamed Initialize or Dump that did not finish.
pub(super) fn transfer_status(e: TransferError) -> Status {
    match e {
        TransferError::Workspace(w) => ws_status(w),
        TransferError::InitializeReleased | TransferError::DumpReleased => {
            Status::aborted(e.to_string())
        }
        TransferError::ExtractionTask(_) => Status::internal(e.to_string()),
    }
}

/// The gRPC status for an execution error.
pub(super) fn exec_status(e: ExecError) -> Status {
    let msg = e.to_string();
    match e {
        ExecError::NotLeased | ExecError::Released | ExecError::WorkReplaced { .. } => {
            Status::failed_precondition(msg)
        }
        // Busy: a retry later may pass (the host's 409).
        ExecError::Active { .. } => Status::aborted(msg),
        ExecError::OtherLease { .. } | ExecError::Unknown { .. } => Status::not_found(msg),
        ExecError::BadName(_) | ExecError::NoMain => Status::invalid_argument(msg),
        ExecError::TooMany { .. } => Status::resource_exhausted(msg),
        ExecError::Archive(a) => {
            let s = archive_status(a);
            Status::new(s.code(), format!("execution archive: {}", s.message()))
        }
        ExecError::Log(ReadError::PastEnd(_)) => Status::out_of_range(msg),
        ExecError::Log(ReadError::Io(_)) | ExecError::Io { .. } => Status::internal(msg),
    }
}

/// The gRPC status for a server-data error.
fn data_status(e: &DataError, message: String) -> Status {
    match e {
        DataError::InvalidData(_) => Status::invalid_argument(message),
        DataError::TooLarge { .. } => Status::resource_exhausted(message),
        DataError::Refused { .. } => Status::failed_precondition(message),
        DataError::Unreachable { .. } => Status::unavailable(message),
        DataError::Timeout { .. } => Status::deadline_exceeded(message),
        DataError::Failed { .. } | DataError::Io { .. } => Status::internal(message),
    }
}

/// The gRPC status for a mail service error (`message` is the whole
/// error's).
fn mail_status(m: MailError, message: String) -> Status {
    match m {
        MailError::NotRunning => Status::failed_precondition(message),
        MailError::Start { .. } | MailError::NotReady { .. } | MailError::Exited { .. } => {
            Status::unavailable(message)
        }
        MailError::Data(d) => data_status(&d, message),
    }
}

/// The gRPC status for a lifecycle error.
pub(super) fn lc_status(e: LcError) -> Status {
    let message = e.to_string();
    match e {
        LcError::BadLeaseId
        | LcError::NoServersNamed
        | LcError::EmptyManifest
        | LcError::UnknownServers { .. }
        | LcError::NotInstalled(_)
        | LcError::TtlOutOfRange { .. }
        | LcError::CredentialsForOther { .. }
        | LcError::Catalog(_) => Status::invalid_argument(message),
        LcError::AlreadyLeased { .. }
        | LcError::NotLeased
        | LcError::NotNarrowable { .. }
        | LcError::NoBenchmarkData { .. }
        | LcError::Launch(_)
        | LcError::MissingCredentials(_) => Status::failed_precondition(message),
        LcError::NoSuchLease { .. } | LcError::LeaseEnded(_) | LcError::Supervisor(_) => {
            Status::not_found(message)
        }
        LcError::NotInLease { .. } => Status::failed_precondition(message),
        LcError::NoServerData { .. } => Status::unimplemented(message),
        LcError::Data { source: d, .. } => data_status(&d, message),
        LcError::Mail(m) => mail_status(m, message),
        LcError::NotReady(_) => Status::unavailable(message),
        LcError::Workspace(w) => ws_status(w),
        LcError::Seed { .. }
        | LcError::Wipe { .. }
        | LcError::Cleanup { .. }
        | LcError::NoRandomness(_)
        | LcError::Task { .. } => Status::internal(message),
    }
}

/// The gRPC status for a refused BindToken (nothing changed).
pub(super) fn bind_status(e: BindError) -> Status {
    let message = e.to_string();
    match e {
        BindError::Invalid(_) | BindError::Unchanged => Status::invalid_argument(message),
        BindError::NoToken => Status::failed_precondition(message),
    }
}
