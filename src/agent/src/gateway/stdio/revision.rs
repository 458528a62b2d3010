//! What differs between protocol revisions: the session-less (2026-07-28)
//! envelope and its checks against the routing headers, the keys an older
//! child must not see, and the `initialize` / `server/discover` answers made
//! from the child's single handshake.

use base64::Engine;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::{header_str, method_of};
use crate::gateway::rpc_error;

use sandbox_client::mcp::{
    self, HANDSHAKE_VERSIONS, SESSIONLESS_VERSIONS as MODERN_VERSIONS, code, header as mcp_header,
    meta,
};

/// The HTTP status of a session-less error answer, by JSON-RPC code.
pub(super) fn modern_status(answer: &Value) -> StatusCode {
    match answer.pointer("/error/code").and_then(Value::as_i64) {
        Some(
            code::PARSE_ERROR
            | code::INVALID_REQUEST
            | code::INVALID_PARAMS
            | code::HEADER_MISMATCH
            | code::MISSING_HEADER
            | code::UNSUPPORTED_VERSION,
        ) => StatusCode::BAD_REQUEST,
        Some(code::METHOD_NOT_FOUND) => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// Removes the session-less envelope keys before a request reaches a child
/// that speaks an older revision.
pub(super) fn strip_envelope(params: &mut Value) {
    if let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.retain(|k, _| !k.starts_with(meta::PREFIX));
        if meta.is_empty()
            && let Some(p) = params.as_object_mut()
        {
            p.remove("_meta");
        }
    }
}

/// What a 2026-07-28 result must carry that older servers do not write.
pub(super) fn complete_result(answer: &mut Value, method: &str, init: Option<&Value>) {
    let Some(result) = answer.get_mut("result").and_then(Value::as_object_mut) else {
        return;
    };
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if method.ends_with("/list") || method == "resources/read" || method == "server/discover" {
        result.entry("ttlMs").or_insert_with(|| json!(0));
        result
            .entry("cacheScope")
            .or_insert_with(|| json!("private"));
    }
    if let Some(info) = init.and_then(|i| i.get("serverInfo")) {
        let meta = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.entry(meta::SERVER_INFO).or_insert_with(|| info.clone());
        }
    }
}

/// Checks a session-less request's envelope against its headers.
pub(super) fn check_envelope(msg: &Value, h: &HeaderMap) -> Result<(), (i64, String, Value)> {
    let bad = |code, m: String| Err((code, m, Value::Null));
    for name in [
        mcp_header::PROTOCOL_VERSION,
        mcp_header::METHOD,
        mcp_header::NAME,
    ] {
        if h.get_all(name).iter().count() > 1 {
            return bad(
                code::HEADER_MISMATCH,
                format!("the {name} header appears more than once"),
            );
        }
    }
    let Some(meta) = msg.pointer("/params/_meta").and_then(Value::as_object) else {
        return bad(
            code::INVALID_PARAMS,
            format!(
                "params._meta must be an object carrying {:?} and {:?}",
                meta::PROTOCOL_VERSION,
                meta::CLIENT_CAPABILITIES
            ),
        );
    };
    let missing: Vec<&str> = [meta::PROTOCOL_VERSION, meta::CLIENT_CAPABILITIES]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return bad(
            code::INVALID_PARAMS,
            format!("params._meta lacks {}", missing.join(" and ")),
        );
    }
    let version = &meta[meta::PROTOCOL_VERSION];
    if header_str(h, mcp_header::PROTOCOL_VERSION) != version.as_str() {
        return bad(
            code::HEADER_MISMATCH,
            "the MCP-Protocol-Version header does not match params._meta's protocol version".into(),
        );
    }
    let method = method_of(msg);
    if header_str(h, mcp_header::METHOD) != method {
        return bad(
            code::HEADER_MISMATCH,
            "the Mcp-Method header does not match the request's method".into(),
        );
    }
    let name_key = match method {
        Some("tools/call" | "prompts/get") => Some("name"),
        Some("resources/read") => Some("uri"),
        _ => None,
    };
    if let Some(k) = name_key
        && let Some(v) = msg.pointer(&format!("/params/{k}")).and_then(Value::as_str)
        && decode_header(header_str(h, mcp_header::NAME)).as_deref() != Some(v)
    {
        return bad(
            code::HEADER_MISMATCH,
            format!("the Mcp-Name header does not match the request's {k}"),
        );
    }
    let Some(v) = version.as_str() else {
        return bad(
            code::INVALID_PARAMS,
            "the protocol version must be a string".into(),
        );
    };
    if !MODERN_VERSIONS.contains(&v) {
        return Err((
            code::UNSUPPORTED_VERSION,
            format!("unsupported protocol version {v:?}"),
            json!({"supported": MODERN_VERSIONS, "requested": v}),
        ));
    }
    Ok(())
}

/// Header values that are not plain ASCII travel as `=?base64?…?=`.
fn decode_header(v: Option<&str>) -> Option<String> {
    let v = v?;
    match v
        .strip_prefix("=?base64?")
        .and_then(|s| s.strip_suffix("?="))
    {
        None => Some(v.to_owned()),
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok()),
    }
}

/// The `server/discover` answer, from the child's own handshake. Change
/// notifications need `subscriptions/listen`, which the gateway does not
/// serve, so they are not advertised.
pub(super) fn discover(init: Option<&Value>, id: &Value) -> Value {
    let Some(init) = init else {
        return rpc_error(
            id,
            code::INTERNAL_ERROR,
            "the MCP server has not finished initializing",
        );
    };
    let mut caps = init.get("capabilities").cloned().unwrap_or(json!({}));
    if let Some(c) = caps.as_object_mut() {
        for (_, v) in c.iter_mut() {
            if let Some(o) = v.as_object_mut() {
                o.remove("listChanged");
                o.remove("subscribe");
            }
        }
    }
    let mut result = json!({
        "supportedVersions": MODERN_VERSIONS,
        "capabilities": caps,
    });
    if let Some(i) = init.get("instructions") {
        result["instructions"] = i.clone();
    }
    let mut answer = mcp::result(id, result);
    complete_result(&mut answer, "server/discover", Some(init));
    answer
}

/// Answers `initialize` from the child's single handshake (or its
/// catalog's record of it): its capabilities and server info, with the
/// protocol version negotiated for this client.
pub(super) fn initialize(init: Option<&Value>, msg: &Value, id: &Value) -> Option<Value> {
    let result = init?;
    let requested = msg
        .pointer("/params/protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let version = if HANDSHAKE_VERSIONS.contains(&requested) {
        requested
    } else {
        HANDSHAKE_VERSIONS[0]
    };
    let mut result = result.clone();
    result["protocolVersion"] = json!(version);
    Some(mcp::result(id, result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn call(name: &str) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": name, "arguments": {},
            "_meta": {meta::PROTOCOL_VERSION: "2026-07-28", meta::CLIENT_CAPABILITIES: {}}}})
    }

    #[test]
    fn envelope_must_match_headers() {
        let ok = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "read_graph"),
        ]);
        assert!(check_envelope(&call("read_graph"), &ok).is_ok());
        let b64 = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?w6lsw6k=?="),
        ]);
        assert!(check_envelope(&call("élé"), &b64).is_ok());
        let wrong_name = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "other"),
        ]);
        assert_eq!(
            check_envelope(&call("read_graph"), &wrong_name)
                .unwrap_err()
                .0,
            code::HEADER_MISMATCH
        );
        let no_method = headers(&[("mcp-protocol-version", "2026-07-28")]);
        assert_eq!(
            check_envelope(&call("x"), &no_method).unwrap_err().0,
            code::HEADER_MISMATCH
        );
        let mut no_meta = call("x");
        no_meta["params"].as_object_mut().unwrap().remove("_meta");
        assert_eq!(
            check_envelope(&no_meta, &ok).unwrap_err().0,
            code::INVALID_PARAMS
        );
        let twice = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
        ]);
        assert_eq!(
            check_envelope(&call("x"), &twice).unwrap_err().0,
            code::HEADER_MISMATCH
        );
    }

    #[test]
    fn envelope_keys_are_stripped_for_the_child() {
        let mut p = json!({"_meta": {meta::PROTOCOL_VERSION: "2026-07-28", "progressToken": 3}});
        strip_envelope(&mut p);
        assert_eq!(p, json!({"_meta": {"progressToken": 3}}));
        let mut p = json!({"name": "x", "_meta": {meta::PROTOCOL_VERSION: "2026-07-28"}});
        strip_envelope(&mut p);
        assert_eq!(p, json!({"name": "x"}));
    }
}
