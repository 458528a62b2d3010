//! sandbox-agent: the guest agent of an MCP sandbox VM, and the client side
//! a host orchestrator uses to talk to it.
//!
//! Host code normally needs only [`client`] (the [`client::connect`] helper
//! and the generated gRPC clients re-exported from [`proto`]). The `agent`
//! module is the guest side and is what the `sandbox-agent` binary runs.
//!
//! See `ARCHITECTURE.md` for how the modules fit together.

pub mod agent;
pub mod auth;
pub mod client;
pub mod gateway;
pub mod init;
pub mod lifecycle;
pub mod mcp_client;
pub mod proto;
pub mod supervisor;
pub mod transport;
pub mod workspace;

pub use client::{Client, ConnectError, ConnectOptions, connect};
pub use transport::Endpoint;

/// Version of this crate, reported by `GetInfo` and `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
