//! `[limits]` in agent.toml: the control plane's resource limits.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Resource limits of the control plane.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Open connections per listener; more clients wait in the backlog.
    pub max_connections_per_listener: usize,
    /// Concurrent HTTP/2 streams (RPCs) per connection.
    pub max_concurrent_streams: u32,
    /// Largest gRPC message the agent decodes or encodes, in bytes.
    pub max_message_bytes: usize,
    /// How long shutdown waits for RPCs in flight before closing anyway.
    pub shutdown_grace_ms: u64,
    /// HTTP/2 keepalive ping interval; dead peers are dropped after
    /// a further interval without an answer.
    pub keepalive_interval_ms: u64,
    /// HTTP/2 flow-control window per stream: how much a client may send
    /// ahead before the agent reads it (bulk upload throughput).
    pub stream_window_bytes: u32,
    /// HTTP/2 flow-control window per connection.
    pub connection_window_bytes: u32,
    /// A connection must send its first bytes (the HTTP/2 preface) within
    /// this, else it is closed: idle or trickling clients cannot hold the
    /// `max_connections_per_listener` slots.
    pub handshake_timeout_ms: u64,
    /// How often the agent checks that its state root (and, when the
    /// control plane listens on unix sockets only, their directories)
    /// still exists; once one is deleted (the host removed the slot's
    /// directory, or its whole data dir), no host can reach or end the
    /// agent, so it shuts down.
    pub state_root_check_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections_per_listener: 64,
            max_concurrent_streams: 64,
            max_message_bytes: 4 << 20,
            shutdown_grace_ms: 10_000,
            keepalive_interval_ms: 30_000,
            stream_window_bytes: 2 << 20,
            connection_window_bytes: 8 << 20,
            handshake_timeout_ms: 10_000,
            state_root_check_ms: 5_000,
        }
    }
}

impl Limits {
    /// Every limit is at least 1.
    pub(super) fn check_nonzero(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            (
                "max_connections_per_listener",
                self.max_connections_per_listener as u64,
            ),
            ("max_concurrent_streams", self.max_concurrent_streams as u64),
            ("max_message_bytes", self.max_message_bytes as u64),
            ("shutdown_grace_ms", self.shutdown_grace_ms),
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("stream_window_bytes", self.stream_window_bytes as u64),
            (
                "connection_window_bytes",
                self.connection_window_bytes as u64,
            ),
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("state_root_check_ms", self.state_root_check_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::ZeroLimit(name));
            }
        }
        Ok(())
    }
}
