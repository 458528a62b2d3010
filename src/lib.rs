//! sandbox-agent: the guest agent of an MCP sandbox VM, and the client side
//! a host orchestrator uses to talk to it.
//!
//! Host code normally needs only [`client`] (the [`client::connect`] helper
//! and the generated gRPC clients re-exported from [`proto`]). The `agent`
//! module is the guest side and is what the `sandbox-agent` binary runs.
//!
//! See `ARCHITECTURE.md` for how the modules fit together.
//!
//! Everything but the archive code sits behind the `agent` feature (on by
//! default). Without it, the library is [`workspace::extract`] and what it
//! needs (`codec`, `confine`, `limits`, `error`): the fuzz target's build.

#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "agent")]
pub mod auth;
#[cfg(feature = "agent")]
pub mod client;
#[cfg(feature = "agent")]
pub mod gateway;
#[cfg(feature = "agent")]
pub mod init;
#[cfg(feature = "agent")]
pub mod lifecycle;
#[cfg(feature = "agent")]
pub mod mcp_client;
#[cfg(feature = "agent")]
pub mod proto;
#[cfg(feature = "agent")]
pub mod supervisor;
#[cfg(feature = "agent")]
pub mod transport;
pub mod workspace;

#[cfg(feature = "agent")]
pub use client::{Client, ConnectError, ConnectOptions, connect};
#[cfg(feature = "agent")]
pub use transport::Endpoint;

/// Version of this crate, reported by `GetInfo` and `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
