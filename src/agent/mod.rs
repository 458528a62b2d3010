//! The guest side: what the `sandbox-agent` binary runs inside the VM.
//!
//! - [`config`]: TOML file + env + flags → validated [`config::Settings`].
//! - [`server`]: binds listeners and serves the gRPC services.
//! - [`info`]: the machine and process facts behind `Agent.GetInfo`.
//! - `rpc`: the gRPC service impls, thin adapters over the modules above.

pub mod config;
pub mod info;
mod rpc;
pub mod server;
