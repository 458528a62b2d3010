//! sandbox-serve: listeners and auth for the agent's and host's servers.
//!
//! - [`listen`]: a bound [`Listener`] (`vsock://`, `unix://` with mode 0600,
//!   `tcp://`) and its stream of accepted [`Conn`]ections for tonic, at
//!   most `max_connections` at a time, each closed unless its client speaks
//!   within the opening timeout.
//! - [`auth`]: the per-listener bearer-token policy ([`AuthPolicy`], a
//!   lease's [`LeaseToken`]) and the tower layer that enforces it
//!   ([`AuthLayer`]).
//! - [`http`]: the one HTTP server loop (HTTP/1.1 or h2) of the agent's MCP
//!   data plane and of sandbox-host's API, on a [`Listener`].
//!
//! What clients need too (endpoint URIs, the connection type [`Io`], tokens)
//! is `sandbox-client`'s; this crate builds on it and nothing depends on it
//! but the servers' binaries.
//!
//! [`Io`]: sandbox_client::transport::Io

pub mod auth;
pub mod http;
pub mod listen;

pub use auth::{AuthLayer, AuthPolicy, AuthService, LeaseToken};
pub use http::{HttpLimits, serve_http};
pub use listen::{Conn, ConnInfo, ListenError, Listener, OPENING_BYTES};
