//! gRPC service implementations: thin adapters from proto messages to the
//! agent's domain modules and back. No logic lives here beyond mapping
//! requests, results and errors (each domain error → one status code).
//!
//! - `convert`: proto ⇄ domain, every message and enum.
//! - `status`: domain errors → `tonic::Status`, the one place.
//! - `upload`: an upload stream's messages → the extractor's input.

mod agent;
mod convert;
mod exec;
mod servers;
mod status;
mod upload;
mod workspace;

use std::pin::Pin;

use tokio_stream::Stream;

pub use agent::AgentService;
pub use exec::ExecService;
pub use servers::ServersService;
pub use workspace::WorkspaceService;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// The lease a call was admitted under (`sandbox-lease` metadata, see
/// [`sandbox_client::lease`]), or `""`: bound to none.
fn lease_of<T>(req: &tonic::Request<T>) -> Result<String, tonic::Status> {
    match req.metadata().get(sandbox_client::lease::HEADER) {
        None => Ok(String::new()),
        Some(v) => v.to_str().map(str::to_owned).map_err(|_| {
            tonic::Status::invalid_argument("the sandbox-lease metadata is not printable ASCII")
        }),
    }
}

/// The one lease of a call whose message names one too (`lease_id`):
/// either may be empty; two different ones are refused.
fn one_lease(field: &str, meta: String) -> Result<String, tonic::Status> {
    match (field, meta) {
        (f, m) if m.is_empty() || f == m => Ok(f.to_owned()),
        ("", m) => Ok(m),
        (f, m) => Err(tonic::Status::invalid_argument(format!(
            "the message names lease {f:?} and the sandbox-lease metadata {m:?}: name one lease"
        ))),
    }
}
