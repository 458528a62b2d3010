//! sandbox-client: what a host orchestrator links to talk to a sandbox-agent.
//!
//! - [`proto`]: the generated gRPC messages and clients (`proto/` at the
//!   repository root is the contract), plus `grpc.health.v1`.
//! - [`transport`]: endpoint URIs (`vsock://`, `hvsock://`, `unix://`,
//!   `tcp://`), dialing, the hybrid-vsock `CONNECT` handshake.
//! - [`auth`]: bearer tokens, and attaching them to requests.
//!
//! The servers' side (listeners, the per-listener auth policy, the HTTP
//! server loop) is the `sandbox-serve` crate, which builds on this one.
//! - [`connect`]: one call from a URI to a ready [`Client`].
//! - [`mcp`]: the MCP protocol facts (revisions, headers, paths, JSON-RPC
//!   shapes) shared by the agent's gateway, the host's proxy and clients.
//! - [`mcp_client`]: a small streamable-HTTP MCP client (used by sandboxctl).
//! - [`mcp_forward`]: forwarding MCP requests to a data plane, and the
//!   local-only Host/Origin rule of a proxy.
//! - [`lease`]: naming the lease a request was admitted under.
//! - [`limits`]: the numbers the agent and its hosts must agree on (ports,
//!   TTL bounds).
//! - [`random`]: random bytes and hex tokens from the OS (an error when it
//!   has none).
//!
//! ```no_run
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let client = sandbox_client::connect("unix:///run/sandbox-agent.sock").await?;
//! let info = client.agent().get_info(sandbox_client::proto::GetInfoRequest {}).await?;
//! # Ok(()) }
//! ```

pub mod auth;
mod connect;
pub mod lease;
pub mod limits;
pub mod mcp;
pub mod mcp_client;
pub mod mcp_forward;
pub mod proto;
pub mod random;
pub mod transport;

pub use connect::{Client, ConnectError, ConnectOptions, connect, error_chain, is_timeout};
pub use transport::Endpoint;

/// Version of this workspace, reported by `GetInfo` and `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Wall-clock milliseconds since the Unix epoch: the unit of the proto's
/// `*_at_ms` timestamps.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A `*_at_ms` timestamp for people: `at 2026-11-23T18:30:12Z (3m 12s ago)`.
pub fn when(at_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms);
    let age = now_ms().saturating_sub(at_ms) / 1000;
    let ago = if age == 0 {
        "just now".to_owned()
    } else {
        format!(
            "{} ago",
            humantime::format_duration(std::time::Duration::from_secs(age))
        )
    };
    format!("at {} ({ago})", humantime::format_rfc3339_seconds(t))
}
