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
