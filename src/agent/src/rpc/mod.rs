//! gRPC service implementations: thin adapters from proto messages to the
//! agent's domain modules and back. No logic lives here beyond mapping
//! requests, results and errors (each domain error → one status code).

mod agent;
mod servers;
mod workspace;

use std::pin::Pin;

use tokio_stream::Stream;

pub use agent::AgentService;
pub use servers::ServersService;
pub use workspace::WorkspaceService;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

use crate::lifecycle::LcError;
use tonic::Status;

/// The gRPC status for a lifecycle error.
fn lc_status(e: LcError) -> Status {
    match e {
        LcError::Invalid(m) => Status::invalid_argument(m),
        LcError::Precondition(m) => Status::failed_precondition(m),
        LcError::NotFound(m) => Status::not_found(m),
        LcError::NotReady(m) => Status::unavailable(m),
        LcError::Workspace(w) => workspace::ws_status(w),
        LcError::Internal(m) => Status::internal(m),
    }
}
