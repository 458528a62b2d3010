//! The Model Context Protocol facts every part of the project agrees on:
//! revisions, HTTP headers, `_meta` keys, JSON-RPC error codes and message
//! shapes, and the `/<server>/mcp` path.
//!
//! The agent's gateway and stdio connection, the host's reverse proxy and
//! [`crate::mcp_client`] all take these from here, so they cannot drift.

use serde_json::{Value, json};

/// The revision the agent (and [`crate::mcp_client`]) offers in its own
/// `initialize` to a server or a gateway.
pub const CLIENT_VERSION: &str = "2025-06-18";

/// Revisions with an `initialize` handshake and `Mcp-Session-Id` sessions,
/// newest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

/// Session-less revisions: every POST is one self-contained request.
pub const SESSIONLESS_VERSIONS: &[&str] = &["2026-07-28"];

/// HTTP headers of the streamable-HTTP transport (lower case, as `http`
/// header names are).
pub mod header {
    pub const SESSION: &str = "mcp-session-id";
    pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
    pub const METHOD: &str = "mcp-method";
    pub const NAME: &str = "mcp-name";
}

/// `_meta` keys of the session-less revision.
pub mod meta {
    /// Keys under this prefix are the protocol's own.
    pub const PREFIX: &str = "io.modelcontextprotocol/";
    pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
    pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
    pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
}

/// JSON-RPC error codes: the standard ones and MCP's own.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// A routing header (`Mcp-Method`, `Mcp-Name`) disagrees with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// A required routing header is missing.
    pub const MISSING_HEADER: i64 = -32021;
    /// The request's protocol revision is not one the server speaks.
    pub const UNSUPPORTED_VERSION: i64 = -32022;
}

/// Request headers a proxy must not forward: the hop-by-hop ones (RFC 9110
/// §7.6.1), `host` (the proxy's client addressed the proxy, not the
/// upstream), `authorization` (each hop has its own credentials) and the
/// lease a request was admitted under ([`crate::lease::HEADER`]: each hop
/// that admits names it itself).
pub const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    crate::lease::HEADER,
];

/// The server an MCP endpoint path names: `/<name>/mcp` or `/<name>/mcp/`
/// → `name` (one path segment, not empty).
pub fn server_of_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let name = rest.strip_suffix("/mcp")?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

/// A JSON-RPC error answer to `id`.
pub fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// A JSON-RPC result answer to `id`.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC request.
pub fn request(id: &Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A JSON-RPC notification.
pub fn notification(method: &str, params: Option<Value>) -> Value {
    match params {
        Some(p) => json!({"jsonrpc": "2.0", "method": method, "params": p}),
        None => json!({"jsonrpc": "2.0", "method": method}),
    }
}

/// The code and message of a JSON-RPC error answer, if it is one.
pub fn error_of(msg: &Value) -> Option<(i64, String)> {
    let e = msg.get("error")?;
    Some((
        e.get("code").and_then(Value::as_i64).unwrap_or(0),
        e.get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_one_server() {
        assert_eq!(server_of_path("/git/mcp"), Some("git"));
        assert_eq!(server_of_path("/git/mcp/"), Some("git"));
        assert_eq!(server_of_path("/mcp"), None);
        assert_eq!(server_of_path("//mcp"), None);
        assert_eq!(server_of_path("/a/b/mcp"), None);
        assert_eq!(server_of_path("git/mcp"), None);
        assert_eq!(server_of_path("/git/mcpx"), None);
    }

    #[test]
    fn answers_have_the_json_rpc_shape() {
        let e = error(&json!(3), code::METHOD_NOT_FOUND, "no");
        assert_eq!(error_of(&e), Some((-32601, "no".into())));
        assert_eq!(e["id"], 3);
        assert_eq!(error_of(&result(&json!(1), json!({}))), None);
        assert_eq!(
            notification("notifications/initialized", None),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        );
    }
}
