//! gRPC service implementations: thin adapters from proto messages to the
//! agent's domain modules and back. No logic lives here beyond mapping
//! requests, results and errors (each domain error → one status code).

mod agent;
mod exec;
mod servers;
mod workspace;

use std::pin::Pin;

use tokio_stream::Stream;

pub use agent::AgentService;
pub use exec::ExecService;
pub use servers::ServersService;
pub use workspace::WorkspaceService;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

use crate::lifecycle::LcError;
use crate::mail::MailError;
use crate::server_data::DataError;
use tonic::Status;

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

/// The gRPC status for a lifecycle error: the one place its causes meet
/// status codes.
fn lc_status(e: LcError) -> Status {
    let message = e.to_string();
    match e {
        LcError::BadLeaseId
        | LcError::NoServersNamed
        | LcError::EmptyManifest
        | LcError::UnknownServers { .. }
        | LcError::TtlOutOfRange { .. }
        | LcError::CredentialsForOther { .. } => Status::invalid_argument(message),
        LcError::AlreadyLeased { .. }
        | LcError::NotLeased
        | LcError::NotNarrowable { .. }
        | LcError::NoBenchmarkData { .. }
        | LcError::Launch(_)
        | LcError::MissingCredentials(_) => Status::failed_precondition(message),
        LcError::NoSuchLease { .. } | LcError::Supervisor(_) => Status::not_found(message),
        LcError::NotInLease { .. } => Status::failed_precondition(message),
        LcError::NoServerData { .. } => Status::unimplemented(message),
        LcError::Mail(MailError::Data(d)) | LcError::Data { source: d, .. } => {
            data_status(&d, message)
        }
        LcError::Mail(m) => match m {
            MailError::NotRunning => Status::failed_precondition(message),
            MailError::Start { .. } | MailError::NotReady { .. } | MailError::Exited { .. } => {
                Status::unavailable(message)
            }
            MailError::Data(_) => Status::internal(message),
        },
        LcError::NotReady(_) => Status::unavailable(message),
        LcError::Workspace(w) => workspace::ws_status(w),
        LcError::Seed { .. }
        | LcError::Wipe { .. }
        | LcError::NoRandomness(_)
        | LcError::Task { .. } => Status::internal(message),
    }
}
