//! The MCP data plane: every server of the current lease as a
//! streamable-HTTP MCP endpoint at `/<name>/mcp`.
//!
//! A stdio server has one long-lived child shared by all client sessions.
//! The gateway answers `initialize` from the child's own (single) handshake,
//! forwards requests through the child's [`StdioConn`], which gives each a
//! connection-local id (so concurrent sessions never see each other's
//! responses), and puts the client's id back on the answer. When the child
//! dies, waiting requests get a JSON-RPC error at once; the supervisor
//! restarts it and later requests wait (bounded) for it to be ready again.
//!
//! Served over the same transports and token rules as the control plane,
//! HTTP/1.1 and h2 on every connection.
//!
//! [`StdioConn`]: crate::supervisor::mcp::StdioConn

mod session;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::auth::AuthPolicy;
use crate::lifecycle::Lifecycle;
use crate::supervisor::State;
use crate::supervisor::manifest::Transport;
use crate::supervisor::mcp::{McpError, StdioConn};
use crate::transport::{Endpoint, Listener};
use session::Sessions;

/// Protocol versions the gateway speaks with clients, newest first.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// `[gateway]` in agent.toml: limits and checks of the data plane.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
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
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_body_bytes: 4 << 20,
            max_sessions_per_server: 1024,
            session_idle_ms: 30 * 60 * 1000,
            strict_sessions: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            request_timeout_ms: 600_000,
            ready_wait_ms: 30_000,
            max_connections_per_listener: 256,
        }
    }
}

impl GatewayConfig {
    pub fn validate(&self) -> Result<(), String> {
        for (k, v) in [
            ("max_body_bytes", self.max_body_bytes as u64),
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
        ] {
            if v == 0 {
                return Err(format!("gateway.{k} must be greater than 0"));
            }
        }
        Ok(())
    }
}

/// The data plane.
pub struct Gateway {
    lc: Arc<Lifecycle>,
    cfg: GatewayConfig,
    sessions: Sessions,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response bodies: whole JSON documents, or a proxied server's stream.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Request headers not forwarded to an HTTP server: hop-by-hop ones, and
/// the agent's own token.
const NOT_FORWARDED: &[&str] = &[
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
];

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// An HTTP-level error with a JSON body that says what is wrong.
fn http_error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message.into()}}),
    )
}

fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// `/<name>/mcp` or `/<name>/mcp/` → name.
fn route(path: &str) -> Option<&str> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let name = rest.strip_suffix("/mcp")?;
    (!name.is_empty() && !name.contains('/')).then_some(name)
}

impl Gateway {
    pub fn new(lc: Arc<Lifecycle>, cfg: GatewayConfig) -> Arc<Gateway> {
        let sessions = Sessions::new(
            cfg.max_sessions_per_server,
            Duration::from_millis(cfg.session_idle_ms),
        );
        Arc::new(Gateway { lc, cfg, sessions })
    }

    /// Serves `listener` until `shutdown`; each connection speaks HTTP/1.1
    /// or h2 (detected from its first bytes).
    pub async fn serve(
        self: Arc<Self>,
        listener: Listener,
        policy: AuthPolicy,
        shutdown: CancellationToken,
    ) {
        use tokio_stream::StreamExt;
        let endpoint = listener.local_endpoint().clone();
        info!(%endpoint, token_required = policy.required, "MCP data plane listening");
        let (mut incoming, accept_task) = listener.incoming(self.cfg.max_connections_per_listener);
        let policy = Arc::new(policy);
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let conn = tokio::select! {
                c = incoming.next() => match c {
                    Some(Ok(c)) => c,
                    Some(Err(e)) => {
                        warn!(%endpoint, error = %e, "accept failed");
                        continue;
                    }
                    None => break,
                },
                _ = shutdown.cancelled() => break,
            };
            let gw = self.clone();
            let policy = policy.clone();
            let stop = shutdown.clone();
            conns.spawn(
                async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let gw = gw.clone();
                        let policy = policy.clone();
                        async move { Ok::<_, Infallible>(gw.handle(req, &policy).await) }
                    });
                    let builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(conn), svc);
                    tokio::pin!(conn);
                    tokio::select! {
                        r = conn.as_mut() => if let Err(e) = r {
                            debug!(error = %e, "data-plane connection ended with an error");
                        },
                        _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
                    }
                }
                .in_current_span(),
            );
            while conns.try_join_next().is_some() {}
        }
        drop(incoming);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        conns.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(1), accept_task).await;
    }

    async fn handle(&self, req: http::Request<Incoming>, policy: &AuthPolicy) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if let Err(s) = policy.check(
            &path,
            req.headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        ) {
            return http_error(StatusCode::UNAUTHORIZED, s.message());
        }
        if let Some(r) = self.check_host_origin(req.headers()) {
            return r;
        }
        let Some(name) = route(&path).map(str::to_owned) else {
            return http_error(
                StatusCode::NOT_FOUND,
                format!(
                    "no MCP endpoint at {path}; endpoints are /<server>/mcp for the servers of the current lease"
                ),
            );
        };
        let view = self.lc.view();
        let leased = view
            .lease
            .as_ref()
            .is_some_and(|l| l.servers.contains(&name));
        if !leased {
            let detail = match &view.lease {
                None => "the sandbox has no lease; Acquire it first".to_owned(),
                Some(l) => format!("the lease's servers are: {}", l.servers.join(", ")),
            };
            return http_error(
                StatusCode::NOT_FOUND,
                format!("server {name:?} is not served here: {detail}"),
            );
        }
        let lease = view.lease.map(|l| l.id).unwrap_or_default();
        let span = tracing::debug_span!("mcp", server = %name);
        self.handle_server(req, &name, &lease)
            .instrument(span)
            .await
    }

    fn check_host_origin(&self, h: &HeaderMap) -> Option<Response<Body>> {
        if !self.cfg.allowed_hosts.is_empty() {
            let host = h
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let bare = host.rsplit_once(':').map_or(host, |(h, _)| h);
            if !self
                .cfg
                .allowed_hosts
                .iter()
                .any(|a| a == host || a == bare)
            {
                return Some(http_error(
                    StatusCode::FORBIDDEN,
                    format!("Host {host:?} is not in gateway.allowed_hosts"),
                ));
            }
        }
        if !self.cfg.allowed_origins.is_empty()
            && let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok())
            && !self.cfg.allowed_origins.iter().any(|a| a == origin)
        {
            return Some(http_error(
                StatusCode::FORBIDDEN,
                format!("Origin {origin:?} is not in gateway.allowed_origins"),
            ));
        }
        None
    }

    async fn handle_server(
        &self,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
    ) -> Response<Body> {
        let transport = self.lc.manifest().get(name).map(|d| d.transport.clone());
        if let Some(Transport::Http { port, path }) = transport {
            return self.proxy(req, name, port, &path).await;
        }
        if let Some(v) = req.headers().get(VERSION_HEADER) {
            let v = v.to_str().unwrap_or("");
            if !PROTOCOL_VERSIONS.contains(&v) {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unsupported MCP-Protocol-Version {v:?}; this gateway speaks {}",
                        PROTOCOL_VERSIONS.join(", ")
                    ),
                );
            }
        }
        let session = req
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match *req.method() {
            Method::POST => self.post(req, name, lease, session).await,
            Method::DELETE => match session {
                Some(id) if self.sessions.remove(&id, name) => Response::new(full(Bytes::new())),
                Some(_) => http_error(StatusCode::NOT_FOUND, "no such session"),
                None => http_error(
                    StatusCode::BAD_REQUEST,
                    "DELETE needs an Mcp-Session-Id header",
                ),
            },
            Method::GET => {
                let mut r = http_error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "server-to-client SSE streams (GET) are not built yet; POST requests get their answers directly",
                );
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
                r
            }
            _ => {
                let mut r = http_error(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE");
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
                r
            }
        }
    }

    /// Reverse-proxies a request to a server that speaks streamable HTTP
    /// itself. Bodies stream both ways, so SSE answers pass through as they
    /// are written; the request body is limited like any other.
    async fn proxy(
        &self,
        req: http::Request<Incoming>,
        name: &str,
        port: u16,
        path: &str,
    ) -> Response<Body> {
        if let Err(e) = self.conn_ready(name).await {
            return http_error(StatusCode::SERVICE_UNAVAILABLE, e);
        }
        let (parts, body) = req.into_parts();
        let mut up = http::Request::builder()
            .method(parts.method.clone())
            .uri(path)
            .header(header::HOST, format!("127.0.0.1:{port}"));
        for (k, v) in &parts.headers {
            if !NOT_FORWARDED.contains(&k.as_str()) {
                up = up.header(k, v);
            }
        }
        let body = Limited::new(body, self.cfg.max_body_bytes);
        let up = match up.body(body) {
            Ok(r) => r,
            Err(e) => {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot forward the request: {e}"),
                );
            }
        };
        let unreachable = |e: String| {
            http_error(
                StatusCode::BAD_GATEWAY,
                format!("server {name} is not answering on 127.0.0.1:{port}: {e}"),
            )
        };
        let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(t) => t,
            Err(e) => return unreachable(e.to_string()),
        };
        let (mut send, conn) =
            match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await {
                Ok(x) => x,
                Err(e) => return unreachable(e.to_string()),
            };
        tokio::spawn(conn);
        let resp = match send.send_request(up).await {
            Ok(r) => r,
            Err(e) => return unreachable(e.to_string()),
        };
        let (parts, body) = resp.into_parts();
        let mut r = Response::from_parts(parts, body.map_err(BoxError::from).boxed_unsync());
        for h in ["connection", "keep-alive", "transfer-encoding"] {
            r.headers_mut().remove(h);
        }
        r
    }

    /// Waits (bounded) until a server is ready (restarts included).
    async fn conn_ready(&self, name: &str) -> Result<(), String> {
        let wait = Duration::from_millis(self.cfg.ready_wait_ms);
        let settled = self
            .lc
            .supervisor()
            .wait_settled(name, wait)
            .await
            .map_err(|e| e.to_string())?;
        match settled {
            Some(s) if s.state == State::Ready => Ok(()),
            Some(s) => Err(format!("server {name} is {:?}: {}", s.state, s.message)),
            None => Err(format!(
                "server {name} was not ready within {} ms",
                wait.as_millis()
            )),
        }
    }

    /// The ready connection of a server, waiting (bounded) while it restarts.
    async fn conn(&self, name: &str) -> Result<Arc<StdioConn>, String> {
        if let Some(c) = self.lc.supervisor().conn(name) {
            return Ok(c);
        }
        self.conn_ready(name).await?;
        self.lc
            .supervisor()
            .conn(name)
            .ok_or_else(|| format!("server {name} is not ready"))
    }

    async fn post(
        &self,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        session: Option<String>,
    ) -> Response<Body> {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
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
                    &rpc_error(&Value::Null, -32700, format!("parse error: {e}")),
                );
            }
        };
        let (messages, batch) = match parsed {
            Value::Array(a) if !a.is_empty() => (a, true),
            Value::Object(_) => (vec![parsed], false),
            _ => {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &rpc_error(&Value::Null, -32600, "expected a JSON-RPC message object"),
                );
            }
        };
        let is_init = messages
            .iter()
            .any(|m| m.get("method").and_then(Value::as_str) == Some("initialize"));
        let mut new_session = None;
        if !is_init {
            match &session {
                Some(id) if self.sessions.touch(id, name, lease) => {}
                Some(_) if self.cfg.strict_sessions => {
                    return http_error(
                        StatusCode::NOT_FOUND,
                        "unknown or expired Mcp-Session-Id; initialize a new session",
                    );
                }
                Some(id) => self.sessions.insert(id, name, lease),
                None => {}
            }
        }
        let conn = match self.conn(name).await {
            Ok(c) => c,
            Err(e) => {
                let answers: Vec<Value> = messages
                    .iter()
                    .filter_map(|m| {
                        m.get("id")
                            .filter(|_| m.get("method").is_some())
                            .map(|id| rpc_error(id, -32603, &e))
                    })
                    .collect();
                return self.reply(answers, batch, &accept, None);
            }
        };
        let timeout = Duration::from_millis(self.cfg.request_timeout_ms);
        let mut answers = Vec::new();
        let calls = messages.into_iter().map(|m| {
            let conn = conn.clone();
            async move { forward(&conn, m, timeout).await }
        });
        for r in futures_util::future::join_all(calls).await {
            match r {
                Forwarded::Answer(a) => answers.push(a),
                Forwarded::Initialized(a) => {
                    let id = session::new_id();
                    self.sessions.insert(&id, name, lease);
                    new_session = Some(id);
                    answers.push(a);
                }
                Forwarded::Nothing => {}
            }
        }
        self.reply(answers, batch, &accept, new_session)
    }

    fn reply(
        &self,
        answers: Vec<Value>,
        batch: bool,
        accept: &str,
        session: Option<String>,
    ) -> Response<Body> {
        let mut r = if answers.is_empty() {
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        } else {
            let body = if batch {
                Value::Array(answers)
            } else {
                answers.into_iter().next().unwrap_or(Value::Null)
            };
            if accept.contains("application/json") || !accept.contains("text/event-stream") {
                json_response(StatusCode::OK, &body)
            } else {
                let mut r = Response::new(full(format!("event: message\ndata: {body}\n\n")));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                r.headers_mut()
                    .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                r
            }
        };
        if let Some(id) = session
            && let Ok(v) = HeaderValue::from_str(&id)
        {
            r.headers_mut().insert(SESSION_HEADER, v);
        }
        r
    }
}

enum Forwarded {
    Answer(Value),
    /// An initialize answer: a new session starts.
    Initialized(Value),
    Nothing,
}

/// Sends one client message to the child and returns what goes back.
async fn forward(conn: &StdioConn, msg: Value, timeout: Duration) -> Forwarded {
    let id = msg.get("id").cloned();
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    match (method, id) {
        // A request.
        (Some(method), Some(id)) => {
            if method == "initialize" {
                return initialize(conn, &msg, &id);
            }
            let params = msg.get("params").cloned().unwrap_or(json!({}));
            match conn.request(&method, params, timeout).await {
                Ok(mut answer) => {
                    answer["id"] = id;
                    Forwarded::Answer(answer)
                }
                Err(McpError::Closed) => Forwarded::Answer(rpc_error(
                    &id,
                    -32603,
                    "the MCP server exited while handling this request; it is being restarted, retry shortly",
                )),
                Err(e) => Forwarded::Answer(rpc_error(&id, -32603, e.to_string())),
            }
        }
        // A notification. The child's own handshake already sent
        // `initialized`; cancellations name client ids the child never saw.
        (Some(method), None) => {
            if method != "notifications/initialized" && method != "notifications/cancelled" {
                let params = msg.get("params").cloned().unwrap_or(json!({}));
                if let Err(e) = conn.notify(&method, params).await {
                    debug!(error = %e, method, "notification not delivered");
                }
            }
            Forwarded::Nothing
        }
        // A response to a server-initiated request: the connection answers
        // those itself while no client stream is open, so nothing waits.
        (None, _) => Forwarded::Nothing,
    }
}

/// Answers `initialize` from the child's single handshake: its capabilities
/// and server info, with the protocol version negotiated for this client.
fn initialize(conn: &StdioConn, msg: &Value, id: &Value) -> Forwarded {
    let Some(result) = conn.init_result() else {
        return Forwarded::Answer(rpc_error(
            id,
            -32603,
            "the MCP server has not finished initializing",
        ));
    };
    let requested = msg
        .pointer("/params/protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let version = if PROTOCOL_VERSIONS.contains(&requested) {
        requested
    } else {
        PROTOCOL_VERSIONS[0]
    };
    let mut result = result.clone();
    result["protocolVersion"] = json!(version);
    Forwarded::Initialized(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// Binds the data-plane listeners.
pub async fn bind(endpoints: &[Endpoint]) -> Result<Vec<Listener>, crate::transport::ListenError> {
    let mut out = Vec::new();
    for ep in endpoints {
        out.push(Listener::bind(ep).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routes() {
        assert_eq!(route("/filesystem/mcp"), Some("filesystem"));
        assert_eq!(route("/filesystem/mcp/"), Some("filesystem"));
        assert_eq!(route("/a/b/mcp"), None);
        assert_eq!(route("/mcp"), None);
        assert_eq!(route("/filesystem"), None);
    }
}
