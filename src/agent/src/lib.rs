//! sandbox-agent: the guest side of an MCP sandbox, what the `sandbox-agent`
//! binary runs inside the VM.
//!
//! - [`workspace`]: `/workspace` ⇄ archives (on `sandbox-archive`), the
//!   journaled swap ([`workspace::txn`]), one operation at a time.
//! - [`supervisor`]: MCP server processes: manifest, spawn, readiness,
//!   restart, stop, logs.
//! - [`lifecycle`]: the lease: Acquire/Release/Reset, TTL, seeds, state paths.
//! - [`gateway`]: the MCP data plane over streamable HTTP.
//! - [`exec`]: script executions (Klavis's execution API) as supervisor jobs.
//! - [`config`], [`server`], `info`, `rpc`: configuration layering, serving
//!   and drain, `GetInfo`, and the gRPC adapters (thin: convert, call a
//!   domain module, map its error to a status in one place).
//! - [`agent_token`]: the token the agent's listeners admit, which a host
//!   binds to its lease (`BindToken`).
//! - [`init`]: PID 1 duties.
//!
//! The wire contract, transports and tokens come from `sandbox-client`; see
//! `ARCHITECTURE.md` for how the crates fit together.

pub mod agent_token;
pub mod catalog;
pub mod config;
pub mod exec;
pub mod gateway;
mod info;
pub mod init;
pub mod lifecycle;
pub mod mail;
mod rpc;
pub mod server;
pub mod server_data;
pub mod supervisor;
pub mod tenant;
pub mod tenant_file;
pub mod workspace;

pub use sandbox_client::VERSION;
