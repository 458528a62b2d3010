//! Streamable HTTP in front of a stdio server's shared child.
//!
//! - **Handshake era** (2025-03-26, 2025-06-18, 2025-11-25): `initialize`
//!   is answered from the child's single handshake and issues an
//!   `Mcp-Session-Id`; POST carries requests, notifications and answers to
//!   the child's requests; GET opens the session's server-to-client stream;
//!   DELETE ends the session.
//! - **Session-less 2026-07-28**: every POST is one self-contained request
//!   whose `params._meta` carries the protocol version and client
//!   capabilities (checked against the `MCP-Protocol-Version`, `Mcp-Method`
//!   and `Mcp-Name` headers); `server/discover` replaces the handshake;
//!   there is no GET, no session and no server-to-client request.
//!
//! A POST answers JSON unless the child sends something for its requests
//! (progress, a log line, a request of its own) before they finish: then the
//! answer becomes an SSE stream carrying those messages and finally the
//! answers. A client that goes away cancels its requests on the child.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::debug;

use super::router::{Out, Route};
use super::{Body, Gateway, full, http_error, json_response, rpc_error, session, sse};
use crate::supervisor::mcp::{McpError, StdioConn};

use sandbox_client::mcp::{
    self, HANDSHAKE_VERSIONS, SESSIONLESS_VERSIONS as MODERN_VERSIONS, code, header as mcp_header,
    meta,
};

/// The HTTP status of a session-less error answer, by JSON-RPC code.
fn modern_status(answer: &Value) -> StatusCode {
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

fn method_of(m: &Value) -> Option<&str> {
    m.get("method").and_then(Value::as_str)
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn not_allowed(allow: &'static str, message: &str) -> Response<Body> {
    let mut r = http_error(StatusCode::METHOD_NOT_ALLOWED, message);
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// One POST's requests on one child.
struct Exchange {
    route: Arc<Route>,
    conn: Arc<StdioConn>,
    generation: u64,
    session: Option<String>,
    modern: bool,
    timeout: Duration,
}

/// Removes a request from the route when it ends, and tells the child to
/// cancel it when its client went away first.
struct InflightGuard<'a> {
    x: &'a Exchange,
    child_id: u64,
    done: bool,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.x.route.end(self.x.generation, self.child_id);
        if !self.done {
            let cancel = mcp::notification(
                "notifications/cancelled",
                Some(json!({"requestId": self.child_id, "reason": "the client went away"})),
            );
            self.x.conn.try_send_message(&cancel);
        }
    }
}

/// Sends one client request to the child and returns the answer under the
/// client's id.
async fn call_child(x: Arc<Exchange>, mut msg: Value, sink: Option<mpsc::Sender<Out>>) -> Value {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = method_of(&msg).unwrap_or("").to_owned();
    let mut params = msg
        .get_mut("params")
        .map(Value::take)
        .unwrap_or_else(|| json!({}));
    if x.modern {
        strip_envelope(&mut params);
    }
    let child_id = x.conn.alloc_id();
    let back_channel = !x.modern;
    if !x.route.begin(
        x.generation,
        child_id,
        x.session.as_deref(),
        &id,
        &mut params,
        sink,
        back_channel,
    ) {
        return rpc_error(
            &id,
            code::INTERNAL_ERROR,
            "the MCP server restarted while this request was sent; retry",
        );
    }
    let mut guard = InflightGuard {
        x: &x,
        child_id,
        done: false,
    };
    let r = x
        .conn
        .request_with_id(child_id, &method, params, x.timeout)
        .await;
    guard.done = true;
    drop(guard);
    match r {
        Ok(mut answer) => {
            answer["id"] = id;
            if x.modern {
                complete_result(&mut answer, &method, &x.conn);
            }
            answer
        }
        Err(McpError::Closed) => rpc_error(
            &id,
            code::INTERNAL_ERROR,
            "the MCP server exited while handling this request; it is being restarted, retry shortly",
        ),
        Err(e) => rpc_error(&id, code::INTERNAL_ERROR, e.to_string()),
    }
}

/// Removes the session-less envelope keys before a request reaches a child
/// that speaks an older revision.
fn strip_envelope(params: &mut Value) {
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
fn complete_result(answer: &mut Value, method: &str, conn: &StdioConn) {
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
    if let Some(info) = conn.init_result().and_then(|i| i.get("serverInfo")) {
        let meta = result.entry("_meta").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            m.entry(meta::SERVER_INFO).or_insert_with(|| info.clone());
        }
    }
}

/// Checks a session-less request's envelope against its headers.
fn check_envelope(msg: &Value, h: &HeaderMap) -> Result<(), (i64, String, Value)> {
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
fn discover(conn: &StdioConn, id: &Value) -> Value {
    let Some(init) = conn.init_result() else {
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
    complete_result(&mut answer, "server/discover", conn);
    answer
}

/// Answers `initialize` from the child's single handshake: its capabilities
/// and server info, with the protocol version negotiated for this client.
fn initialize(conn: &StdioConn, msg: &Value, id: &Value) -> Option<Value> {
    let result = conn.init_result()?;
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

impl Gateway {
    pub(super) async fn stdio(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
    ) -> Response<Body> {
        let modern = match header_str(req.headers(), mcp_header::PROTOCOL_VERSION) {
            None => false,
            Some(v) if HANDSHAKE_VERSIONS.contains(&v) => false,
            Some(v) if MODERN_VERSIONS.contains(&v) => true,
            Some(v) => {
                let all: Vec<&str> = HANDSHAKE_VERSIONS
                    .iter()
                    .chain(MODERN_VERSIONS)
                    .copied()
                    .collect();
                let mut answer = rpc_error(
                    &Value::Null,
                    code::UNSUPPORTED_VERSION,
                    format!(
                        "unsupported MCP-Protocol-Version {v:?}; this gateway speaks {}",
                        all.join(", ")
                    ),
                );
                answer["error"]["data"] = json!({"supported": all, "requested": v});
                return json_response(StatusCode::BAD_REQUEST, &answer);
            }
        };
        let session = (!modern)
            .then(|| header_str(req.headers(), mcp_header::SESSION).map(str::to_owned))
            .flatten();
        match (req.method().clone(), modern) {
            (Method::POST, _) => self.post(req, name, lease, session, modern).await,
            (_, true) => not_allowed(
                "POST",
                "protocol 2026-07-28 is session-less: every request is a POST",
            ),
            (Method::GET, false) => self.get_stream(req, name, lease, session).await,
            (Method::DELETE, false) => match session {
                Some(id) if self.sessions.remove(&id, name) => {
                    self.route(name, lease).close_session(&id);
                    Response::new(full(Bytes::new()))
                }
                Some(_) => http_error(StatusCode::NOT_FOUND, "no such session"),
                None => http_error(
                    StatusCode::BAD_REQUEST,
                    "DELETE needs an Mcp-Session-Id header",
                ),
            },
            _ => not_allowed("GET, POST, DELETE", "use POST, GET or DELETE"),
        }
    }

    /// Accepts a request for a session: known, or created under the
    /// client's id unless `strict_sessions`.
    /// Returns false (answer 404) for an unknown session under
    /// `strict_sessions`.
    fn admit(&self, id: &str, name: &str, lease: &str) -> bool {
        if self.sessions.touch(id, name, lease) {
            return true;
        }
        if self.cfg.strict_sessions {
            return false;
        }
        self.sessions.insert(id, name, lease, Value::Null);
        true
    }

    /// GET: the session's server-to-client stream, where the child's
    /// requests and global notifications arrive.
    async fn get_stream(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        session: Option<String>,
    ) -> Response<Body> {
        let accept = header_str(req.headers(), header::ACCEPT.as_str()).unwrap_or("");
        if !accept.contains("text/event-stream") {
            return http_error(
                StatusCode::NOT_ACCEPTABLE,
                "GET opens an SSE stream: send Accept: text/event-stream",
            );
        }
        let Some(session) = session else {
            return http_error(
                StatusCode::BAD_REQUEST,
                "GET needs the Mcp-Session-Id issued at initialize",
            );
        };
        if !self.admit(&session, name, lease) {
            return unknown_session();
        }
        let route = self.route(name, lease);
        let rx = route.open_stream(&session);
        let ended = route.ended.clone().cancelled_owned();
        let stream = futures_util::StreamExt::take_until(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            ended,
        );
        sse::response(stream, self.keep_alive())
    }

    fn keep_alive(&self) -> Duration {
        Duration::from_millis(self.cfg.sse_keep_alive_ms)
    }

    async fn post(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        session: Option<String>,
        modern: bool,
    ) -> Response<Body> {
        let headers = req.headers().clone();
        let accept = header_str(&headers, header::ACCEPT.as_str()).unwrap_or("");
        let accepts_sse = accept.contains("text/event-stream");
        let wants_json = accept.contains("application/json") || !accepts_sse;
        let body = match Limited::new(req.into_body(), self.cfg.max_body_bytes)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                let status = if e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::BAD_REQUEST
                };
                return http_error(
                    status,
                    format!(
                        "reading the body: {e} (limit gateway.max_body_bytes = {})",
                        self.cfg.max_body_bytes
                    ),
                );
            }
        };
        let parsed: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &rpc_error(&Value::Null, code::PARSE_ERROR, format!("parse error: {e}")),
                );
            }
        };
        let (messages, batch) = match parsed {
            Value::Array(a) if !a.is_empty() && !modern => (a, true),
            Value::Object(_) => (vec![parsed], false),
            _ => {
                let what = if modern {
                    "the body must be one JSON-RPC request or notification object (2026-07-28 has no batches)"
                } else {
                    "expected a JSON-RPC message object or a batch"
                };
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &rpc_error(&Value::Null, code::INVALID_REQUEST, what),
                );
            }
        };
        if modern {
            let m = &messages[0];
            if m.get("id").is_none() {
                // No client-to-server notifications in this revision;
                // accepted and dropped, as the spec allows.
                return accepted();
            }
            if method_of(m).is_none() {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &rpc_error(
                        &Value::Null,
                        code::INVALID_REQUEST,
                        "2026-07-28 has no server-to-client requests to answer",
                    ),
                );
            }
            if let Err((code, message, data)) = check_envelope(m, &headers) {
                let mut answer = rpc_error(&m["id"], code, message);
                if !data.is_null() {
                    answer["error"]["data"] = data;
                }
                return json_response(modern_status(&answer), &answer);
            }
        }
        let is_init = messages.iter().any(|m| method_of(m) == Some("initialize"));
        if !is_init
            && let Some(id) = &session
            && !self.admit(id, name, lease)
        {
            return unknown_session();
        }
        let conn = match self.conn(name).await {
            Ok(c) => c,
            Err(e) => {
                let answers: Vec<Value> = messages
                    .iter()
                    .filter(|m| m.get("method").is_some())
                    .filter_map(|m| {
                        m.get("id")
                            .map(|id| rpc_error(id, code::INTERNAL_ERROR, &e))
                    })
                    .collect();
                return self.reply(answers, batch, wants_json, None, modern);
            }
        };
        let route = self.route(name, lease);
        let generation = route.attach(&conn);
        let session_for_route = session.clone();
        let x = Arc::new(Exchange {
            route: route.clone(),
            conn: conn.clone(),
            generation,
            session: session_for_route,
            modern,
            timeout: Duration::from_millis(self.cfg.request_timeout_ms),
        });

        // Messages answered here; requests left for the child.
        let mut local = Vec::new();
        let mut requests = Vec::new();
        let mut new_session = None;
        for m in messages {
            let id = m.get("id").cloned();
            match (method_of(&m), id) {
                (Some("initialize"), Some(id)) if !modern => match initialize(&conn, &m, &id) {
                    Some(a) => {
                        let sid = session::new_id();
                        let caps = m
                            .pointer("/params/capabilities")
                            .cloned()
                            .unwrap_or(Value::Null);
                        self.sessions.insert(&sid, name, lease, caps);
                        new_session = Some(sid);
                        local.push(a);
                    }
                    None => local.push(rpc_error(
                        &id,
                        code::INTERNAL_ERROR,
                        "the MCP server has not finished initializing",
                    )),
                },
                (Some("server/discover"), Some(id)) => local.push(discover(&conn, &id)),
                (Some("subscriptions/listen"), Some(id)) => local.push(rpc_error(
                    &id,
                    code::METHOD_NOT_FOUND,
                    "subscriptions/listen is not served by this gateway; poll the lists instead",
                )),
                (Some(method @ ("resources/subscribe" | "resources/unsubscribe")), Some(id))
                    if session.is_some() =>
                {
                    let uri = m
                        .pointer("/params/uri")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let s = session.as_deref().unwrap_or("");
                    let tell_child = if method == "resources/subscribe" {
                        route.subscribe(s, uri)
                    } else {
                        route.unsubscribe(s, uri)
                    };
                    if tell_child {
                        requests.push(m);
                    } else {
                        local.push(mcp::result(&id, json!({})));
                    }
                }
                (Some(_), Some(_)) => requests.push(m),
                (Some(method), None) => self.client_notification(&x, method, &m).await,
                (None, Some(id)) => {
                    // The client's answer to one of the child's requests.
                    if route.take_server_request(session.as_deref(), &id) {
                        if let Err(e) = conn.send_message(&m).await {
                            debug!(error = %e, "answer to a server request not delivered");
                        }
                    } else {
                        debug!(%id, "an answer to no waiting server request; ignored");
                    }
                }
                (None, None) => local.push(rpc_error(
                    &Value::Null,
                    code::INVALID_REQUEST,
                    "a message without method or id",
                )),
            }
        }
        if requests.is_empty() {
            return if local.is_empty() {
                accepted()
            } else {
                self.reply(local, batch, wants_json, new_session, modern)
            };
        }
        self.run(x, requests, local, batch, accepts_sse, wants_json)
            .await
    }

    /// A client notification: `cancelled` names the client's request id,
    /// which is mapped to the child's; `initialized` was the child's own
    /// handshake's business. Others go to the child as they are.
    async fn client_notification(&self, x: &Exchange, method: &str, m: &Value) {
        match method {
            "notifications/initialized" => {}
            "notifications/cancelled" => {
                let client_id = m.pointer("/params/requestId").cloned().unwrap_or_default();
                if let Some(child_id) = x.route.child_id_of(x.session.as_deref(), &client_id) {
                    let mut params = m.get("params").cloned().unwrap_or_else(|| json!({}));
                    params["requestId"] = json!(child_id);
                    let _ = x.conn.notify(method, params).await;
                }
            }
            _ => {
                if x.modern {
                    return;
                }
                let params = m.get("params").cloned().unwrap_or_else(|| json!({}));
                if let Err(e) = x.conn.notify(method, params).await {
                    debug!(error = %e, method, "notification not delivered");
                }
            }
        }
    }

    /// Runs requests on the child. Answers JSON when they finish before the
    /// child sends anything for them; otherwise switches to SSE.
    async fn run(
        &self,
        x: Arc<Exchange>,
        requests: Vec<Value>,
        local: Vec<Value>,
        batch: bool,
        accepts_sse: bool,
        wants_json: bool,
    ) -> Response<Body> {
        let modern = x.modern;
        let (tx, mut rx) = mpsc::channel::<Out>(self.cfg.stream_buffer_messages);
        let sink = accepts_sse.then(|| tx.clone());
        let mut work = Box::pin(futures_util::future::join_all(
            requests
                .into_iter()
                .map(|m| call_child(x.clone(), m, sink.clone())),
        ));
        drop(sink);
        let first = tokio::select! {
            biased;
            answers = &mut work => {
                let mut all = local;
                all.extend(answers);
                return self.reply(all, batch, wants_json, None, modern);
            }
            Some(Out::Message(first)) = rx.recv() => first,
        };
        // The child spoke first: stream. The work moves to a task that ends
        // (cancelling the requests on the child) if the client goes away.
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            let answers = work.await;
            let _ = tx.send(Out::Done(answers)).await;
        }));
        struct St {
            queue: VecDeque<Value>,
            rx: mpsc::Receiver<Out>,
            done: bool,
            _task: AbortOnDropHandle<()>,
        }
        let mut queue = VecDeque::from([first]);
        queue.extend(local);
        let st = St {
            queue,
            rx,
            done: false,
            _task: task,
        };
        let stream = futures_util::stream::unfold(st, |mut st| async move {
            loop {
                if let Some(m) = st.queue.pop_front() {
                    return Some((m, st));
                }
                if st.done {
                    return None;
                }
                match st.rx.recv().await {
                    Some(Out::Message(m)) => st.queue.push_back(m),
                    Some(Out::Done(answers)) => {
                        st.done = true;
                        st.queue.extend(answers);
                    }
                    None => return None,
                }
            }
        });
        sse::response(stream, self.keep_alive())
    }

    fn reply(
        &self,
        answers: Vec<Value>,
        batch: bool,
        wants_json: bool,
        session: Option<String>,
        modern: bool,
    ) -> Response<Body> {
        let mut r = if answers.is_empty() {
            accepted()
        } else {
            let status = if modern && !batch {
                modern_status(&answers[0])
            } else {
                StatusCode::OK
            };
            let body = if batch {
                Value::Array(answers)
            } else {
                answers.into_iter().next().unwrap_or(Value::Null)
            };
            if wants_json {
                json_response(status, &body)
            } else {
                sse::response(futures_util::stream::iter([body]), self.keep_alive())
            }
        };
        if let Some(id) = session
            && let Ok(v) = HeaderValue::from_str(&id)
        {
            r.headers_mut().insert(mcp_header::SESSION, v);
        }
        r
    }
}

fn unknown_session() -> Response<Body> {
    http_error(
        StatusCode::NOT_FOUND,
        "unknown or expired Mcp-Session-Id; initialize a new session",
    )
}

fn accepted() -> Response<Body> {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

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
