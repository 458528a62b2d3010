//! `[gateway]` in agent.toml: the data plane's limits and checks.

use serde::{Deserialize, Serialize};

/// `[gateway]` in agent.toml: limits and checks of the data plane.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Most messages in one JSON-RPC batch; a larger batch is refused (400)
    /// before any of it is answered.
    pub max_batch_messages: usize,
    /// Most bytes of one POST's answers, counted as each answer is made
    /// (never after building the whole): an answer past it is replaced by a
    /// JSON-RPC error saying so. Keep it above
    /// `supervisor.stdio_message_bytes`, so one answer of the largest
    /// message a server may send fits.
    pub max_reply_bytes: usize,
    /// Sessions kept per server; beyond it the least recently used is
    /// dropped (its next request starts a new session).
    pub max_sessions_per_server: usize,
    /// A session unused for this long is forgotten.
    pub session_idle_ms: u64,
    /// Answer an unknown Mcp-Session-Id with 404 (the spec's strict
    /// behaviour). Default false: a new session is created under that id,
    /// because the Python SDK client does not recover from a 404.
    pub strict_sessions: bool,
    /// Host header values accepted (host or host:port); empty accepts any,
    /// which is what a host proxy with a public name needs.
    pub allowed_hosts: Vec<String>,
    /// Origin header values accepted when a request carries one; empty
    /// accepts any.
    pub allowed_origins: Vec<String>,
    /// How long one JSON-RPC request may wait for the server's answer.
    pub request_timeout_ms: u64,
    /// How long a request waits for a restarting server to be ready.
    pub ready_wait_ms: u64,
    /// Open connections per data-plane listener.
    pub max_connections_per_listener: usize,
    /// A connection must send its first bytes, and an HTTP/1.1 request its
    /// whole head, within this; else it is closed (idle or trickling
    /// clients would hold the connection slots).
    pub header_timeout_ms: u64,
    /// Messages queued for one client stream (a GET stream, or a POST
    /// answered as SSE); beyond it messages for that stream are dropped
    /// rather than stall the server's other clients.
    pub stream_buffer_messages: usize,
    /// Interval of keep-alive comments on idle SSE streams.
    pub sse_keep_alive_ms: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_body_bytes: 4 << 20,
            max_batch_messages: 100,
            max_reply_bytes: 20 << 20,
            max_sessions_per_server: 1024,
            session_idle_ms: 30 * 60 * 1000,
            strict_sessions: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            request_timeout_ms: 600_000,
            ready_wait_ms: 30_000,
            max_connections_per_listener: 256,
            header_timeout_ms: 10_000,
            stream_buffer_messages: 256,
            sse_keep_alive_ms: 15_000,
        }
    }
}

impl GatewayConfig {
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        for (k, v) in [
            ("max_body_bytes", self.max_body_bytes as u64),
            ("max_batch_messages", self.max_batch_messages as u64),
            ("max_reply_bytes", self.max_reply_bytes as u64),
            (
                "max_sessions_per_server",
                self.max_sessions_per_server as u64,
            ),
            ("session_idle_ms", self.session_idle_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("ready_wait_ms", self.ready_wait_ms),
            (
                "max_connections_per_listener",
                self.max_connections_per_listener as u64,
            ),
            ("header_timeout_ms", self.header_timeout_ms),
            ("stream_buffer_messages", self.stream_buffer_messages as u64),
            ("sse_keep_alive_ms", self.sse_keep_alive_ms),
        ] {
            if v == 0 {
                return Err(GatewayConfigError::Zero(k));
            }
        }
        Ok(())
    }
}

/// A `[gateway]` setting out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum GatewayConfigError {
    #[error("gateway.{0} must be greater than 0")]
    Zero(&'static str),
}
