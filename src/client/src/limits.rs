//! Numbers the agent, its hosts and its clients must agree on. Each is
//! defined once, here.

/// vsock port of the agent's gRPC control plane.
pub const AGENT_VSOCK_PORT: u32 = 1024;

/// vsock port of the agent's MCP data plane (streamable HTTP).
pub const MCP_VSOCK_PORT: u32 = 1025;

/// Lease TTL bounds and default, as Klavis's Local Sandbox API fixes them
/// (`ttl_seconds`: 60–86400, default 7200). The agent's configuration may
/// narrow or (for tests) lower them; the host's REST API enforces these.
pub const MIN_TTL_SECONDS: u32 = 60;
pub const MAX_TTL_SECONDS: u32 = 86_400;
pub const DEFAULT_TTL_SECONDS: u32 = 7_200;

/// The variables of package indexes and proxies that executions get from
/// the agent's environment by default (`exec.pass_env`), and so that a
/// host passes to its agents (its own environment is never passed whole).
pub const PACKAGE_ACCESS_ENV: &[&str] = &[
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_OFFLINE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
];

/// Longest execution name (the Exec service; Klavis `execution_name`).
pub const MAX_EXECUTION_NAME_LEN: usize = 128;

/// Whether `name` is an acceptable execution name: 1 to
/// [`MAX_EXECUTION_NAME_LEN`] bytes of `[A-Za-z0-9._-]`, not `.` or `..`
/// (it names a directory in the sandbox).
pub fn valid_execution_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_EXECUTION_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
