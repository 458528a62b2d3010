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
//!
//! - `exchange`: one POST's requests on the child (ids, cancellation).
//! - `revision`: what differs between protocol revisions (the session-less
//!   envelope, `initialize` and `server/discover` answers).

mod catalog;
mod exchange;
mod messages;
mod reply;
mod revision;
mod streamed;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use tracing::debug;

use super::router::Out;
use super::{Body, Gateway, full, http_error, json_response, json_text, rpc_error, session, sse};
use crate::catalog::Catalog;
use catalog::Target;

use sandbox_client::mcp::{
    self, HANDSHAKE_VERSIONS, SESSIONLESS_VERSIONS as MODERN_VERSIONS, code, header as mcp_header,
};

use exchange::{Exchange, call_child};
use reply::{Answer, Budget};
use revision::{check_envelope, discover, initialize, modern_status};
use streamed::St;

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

impl Gateway {
    /// `catalog`: an idle server's, for its discovery ([`catalog`]).
    pub(super) async fn stdio(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        catalog: Option<Arc<Catalog>>,
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
            (Method::POST, _) => {
                let at = Target::new(name, lease, catalog);
                self.post(req, at, session, modern).await
            }
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
        let messages = tokio_stream::wrappers::ReceiverStream::new(rx);
        let stream = futures_util::StreamExt::take_until(
            futures_util::StreamExt::map(messages, |m| m.to_string()),
            ended,
        );
        sse::response(stream, self.keep_alive())
    }

    fn keep_alive(&self) -> Duration {
        Duration::from_millis(self.cfg.sse_keep_alive_ms)
    }

    /// POST: one message or a batch (a single request in 2026-07-28).
    /// `initialize`, `server/discover` and subscriptions are answered here;
    /// requests go to the child ([`Self::run`]).
    async fn post(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        at: Target<'_>,
        session: Option<String>,
        modern: bool,
    ) -> Response<Body> {
        let (name, lease) = (at.name, at.lease);
        let headers = req.headers().clone();
        let accept = Accept::of(&headers);
        let body = match self.read_body(req.into_body()).await {
            Ok(b) => b,
            Err(refused) => return *refused,
        };
        let (messages, batch) = match messages::parse(&body, modern, self.cfg.max_batch_messages) {
            Ok(m) => m,
            Err(refused) => return *refused,
        };
        drop(body);
        let budget = Arc::new(Budget::new(self.cfg.max_reply_bytes));
        if modern && let Some(refused) = check_modern(&messages[0], &headers) {
            return refused;
        }
        let is_init = messages.iter().any(|m| method_of(m) == Some("initialize"));
        if !is_init
            && let Some(id) = &session
            && !self.admit(id, name, lease)
        {
            return unknown_session();
        }
        if let Some(cat) = at.catalog
            && let Some(answer) = self
                .discovery(
                    &cat,
                    &messages,
                    (name, lease),
                    &budget,
                    (batch, accept.json, modern),
                )
                .await
        {
            return answer;
        }
        let conn = match self.conn(name).await {
            Ok(c) => c,
            Err(e) => {
                let answers = not_connected(&messages, &e.to_string());
                let answers = answers.iter().map(|a| budget.admit(a)).collect();
                return self.reply(answers, batch, accept.json, None, modern);
            }
        };
        if let Some(refused) = self.lease_ended(name, lease) {
            return refused;
        }
        let route = self.route(name, lease);
        let generation = route.attach(&conn);
        let x = Arc::new(Exchange {
            route,
            conn,
            generation,
            session,
            modern,
            timeout: Duration::from_millis(self.cfg.request_timeout_ms),
        });
        let sorted = self.sort(&x, messages, name, lease).await;
        let local: Vec<Answer> = sorted.local.iter().map(|a| budget.admit(a)).collect();
        if sorted.requests.is_empty() {
            return if local.is_empty() {
                accepted()
            } else {
                self.reply(local, batch, accept.json, sorted.new_session, modern)
            };
        }
        let requests = (sorted.requests, budget);
        self.run(x, requests, local, batch, accept.sse, accept.json)
            .await
    }

    /// Sorts a POST's messages: answered here (`initialize`,
    /// `server/discover`, subscriptions the child need not hear of, errors),
    /// requests for the child, and what is delivered at once (the client's
    /// notifications and its answers to the child's requests).
    async fn sort(&self, x: &Exchange, messages: Vec<Value>, name: &str, lease: &str) -> Sorted {
        let mut s = Sorted::default();
        for m in messages {
            let id = m.get("id").cloned();
            match (method_of(&m), id) {
                (Some("initialize"), Some(id)) if !x.modern => {
                    let init = x.conn.init_result();
                    let (answer, sid) = self.open_session(init, &m, &id, name, lease);
                    s.local.push(answer);
                    if sid.is_some() {
                        s.new_session = sid;
                    }
                }
                (Some("server/discover"), Some(id)) => {
                    s.local.push(discover(x.conn.init_result(), &id))
                }
                (Some("subscriptions/listen"), Some(id)) => s.local.push(rpc_error(
                    &id,
                    code::METHOD_NOT_FOUND,
                    "subscriptions/listen is not served by this gateway; poll the lists instead",
                )),
                (Some(method @ ("resources/subscribe" | "resources/unsubscribe")), Some(id))
                    if x.session.is_some() =>
                {
                    if subscription(x, method, &m) {
                        s.requests.push(m);
                    } else {
                        s.local.push(mcp::result(&id, json!({})));
                    }
                }
                (Some(_), Some(_)) => s.requests.push(m),
                (Some(method), None) => self.client_notification(x, method, &m).await,
                (None, Some(id)) => client_answer(x, &m, &id).await,
                (None, None) => s.local.push(rpc_error(
                    &Value::Null,
                    code::INVALID_REQUEST,
                    "a message without method or id",
                )),
            }
        }
        s
    }

    /// `initialize` (handshake era): answered from the child's handshake,
    /// with a new session (its id second).
    fn open_session(
        &self,
        init: Option<&Value>,
        m: &Value,
        id: &Value,
        name: &str,
        lease: &str,
    ) -> (Value, Option<String>) {
        let Some(answer) = initialize(init, m, id) else {
            let why = "the MCP server has not finished initializing";
            return (rpc_error(id, code::INTERNAL_ERROR, why), None);
        };
        let sid = match session::new_id() {
            Ok(sid) => sid,
            Err(e) => {
                let why = format!("no session id: {e}");
                return (rpc_error(id, code::INTERNAL_ERROR, why), None);
            }
        };
        let caps = m
            .pointer("/params/capabilities")
            .cloned()
            .unwrap_or(Value::Null);
        self.sessions.insert(&sid, name, lease, caps);
        (answer, Some(sid))
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
    /// Each answer is counted against `budget` as it comes.
    async fn run(
        &self,
        x: Arc<Exchange>,
        (requests, budget): (Vec<Value>, Arc<Budget>),
        local: Vec<Answer>,
        batch: bool,
        accepts_sse: bool,
        wants_json: bool,
    ) -> Response<Body> {
        let modern = x.modern;
        let (tx, mut rx) = mpsc::channel::<Out>(self.cfg.stream_buffer_messages);
        let sink = accepts_sse.then(|| tx.clone());
        let mut work = Box::pin(futures_util::future::join_all(requests.into_iter().map(
            |m| {
                let (x, sink, budget) = (x.clone(), sink.clone(), budget.clone());
                async move { budget.admit(&call_child(x, m, sink).await) }
            },
        )));
        drop(sink);
        let (first, tail, task) = tokio::select! {
            biased;
            answers = &mut work => match rx.try_recv() {
                // The child sent something for the requests before their
                // answers (the answers wait for it to be routed): stream
                // it, then the answers.
                Ok(Out::Message(first)) => {
                    drop(tx);
                    (first, answers.into_iter().map(|a| a.json).collect(), None)
                }
                _ => {
                    let mut all = local;
                    all.extend(answers);
                    return self.reply(all, batch, wants_json, None, modern);
                }
            },
            Some(Out::Message(first)) = rx.recv() => {
                // The child spoke first: stream. The work moves to a task
                // that ends (cancelling the requests on the child) if the
                // client goes away.
                let task = AbortOnDropHandle::new(tokio::spawn(async move {
                    let answers = work.await.into_iter().map(|a| a.json).collect();
                    let _ = tx.send(Out::Done(answers)).await;
                }));
                (first, Vec::new(), Some(task))
            }
        };
        let mut queue = VecDeque::from([first.to_string()]);
        queue.extend(local.into_iter().map(|a| a.json));
        let st = St::new(queue, rx, tail, task);
        sse::response(
            futures_util::stream::unfold(st, St::next),
            self.keep_alive(),
        )
    }

    fn reply(
        &self,
        answers: Vec<Answer>,
        batch: bool,
        wants_json: bool,
        session: Option<String>,
        modern: bool,
    ) -> Response<Body> {
        let mut r = match answers.first() {
            None => accepted(),
            Some(first) => {
                let status = if modern && !batch {
                    first.status
                } else {
                    StatusCode::OK
                };
                let body = reply::body(answers, batch);
                if wants_json {
                    json_text(status, body)
                } else {
                    sse::response(futures_util::stream::iter([body]), self.keep_alive())
                }
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

/// What a POST's Accept header allows.
struct Accept {
    /// An SSE stream.
    sse: bool,
    /// A JSON answer (also when SSE is not accepted).
    json: bool,
}

impl Accept {
    fn of(headers: &HeaderMap) -> Accept {
        let accept = header_str(headers, header::ACCEPT.as_str()).unwrap_or("");
        let sse = accept.contains("text/event-stream");
        Accept {
            sse,
            json: accept.contains("application/json") || !sse,
        }
    }
}

/// A POST's messages, sorted by [`Gateway::sort`].
#[derive(Default)]
struct Sorted {
    /// Answers made here.
    local: Vec<Value>,
    /// Requests for the child.
    requests: Vec<Value>,
    /// The session an `initialize` opened.
    new_session: Option<String>,
}

/// A 2026-07-28 message: a request with its envelope matching the headers
/// (`None`), or the answer refusing it. A notification is accepted and
/// dropped, as the spec allows (there are none client-to-server).
fn check_modern(m: &Value, headers: &HeaderMap) -> Option<Response<Body>> {
    if m.get("id").is_none() {
        return Some(accepted());
    }
    if method_of(m).is_none() {
        return Some(json_response(
            StatusCode::BAD_REQUEST,
            &rpc_error(
                &Value::Null,
                code::INVALID_REQUEST,
                "2026-07-28 has no server-to-client requests to answer",
            ),
        ));
    }
    let (code, message, data) = check_envelope(m, headers).err()?;
    let mut answer = rpc_error(&m["id"], code, message);
    if !data.is_null() {
        answer["error"]["data"] = data;
    }
    Some(json_response(modern_status(&answer), &answer))
}

/// The answers to a POST's requests when the child cannot be reached.
fn not_connected(messages: &[Value], why: &str) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m.get("method").is_some())
        .filter_map(|m| {
            m.get("id")
                .map(|id| rpc_error(id, code::INTERNAL_ERROR, why.to_owned()))
        })
        .collect()
}

/// `resources/subscribe` or `unsubscribe` on the session's route; whether
/// the child must hear of it (the first subscriber, the last to leave).
fn subscription(x: &Exchange, method: &str, m: &Value) -> bool {
    let uri = m
        .pointer("/params/uri")
        .and_then(Value::as_str)
        .unwrap_or("");
    let s = x.session.as_deref().unwrap_or("");
    if method == "resources/subscribe" {
        x.route.subscribe(s, uri)
    } else {
        x.route.unsubscribe(s, uri)
    }
}

/// The client's answer to one of the child's requests: delivered when the
/// child is waiting for it.
async fn client_answer(x: &Exchange, m: &Value, id: &Value) {
    if x.route.take_server_request(x.session.as_deref(), id) {
        if let Err(e) = x.conn.send_message(m).await {
            debug!(error = %e, "answer to a server request not delivered");
        }
    } else {
        debug!(%id, "an answer to no waiting server request; ignored");
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
