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

mod config;
mod proxy;
mod router;
mod session;
mod sse;
mod stdio;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info};

use crate::catalog::Catalog;
use crate::lifecycle::Lifecycle;
use crate::supervisor::manifest::Manifest;
use crate::supervisor::manifest::Transport;
use crate::supervisor::mcp::StdioConn;
use crate::supervisor::{State, Supervisor};
use router::Route;
use sandbox_client::mcp;
use sandbox_client::mcp::error as rpc_error;
use sandbox_client::transport::Endpoint;
use sandbox_serve::auth::AuthPolicy;
use sandbox_serve::listen::Listener;
use session::Sessions;

pub use config::{GatewayConfig, GatewayConfigError};

/// The data plane.
pub struct Gateway {
    /// Which servers the current lease has.
    lc: Arc<Lifecycle>,
    /// The servers' processes and stdio connections.
    sup: Arc<Supervisor>,
    /// How each server is reached (stdio or HTTP).
    manifest: Arc<Manifest>,
    cfg: GatewayConfig,
    sessions: Arc<Sessions>,
    /// Server name → routing state of the current lease.
    routes: Mutex<HashMap<String, Arc<Route>>>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response bodies: whole JSON documents, or a proxied server's stream.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    json_text(status, v.to_string())
}

/// A JSON document already serialized.
fn json_text(status: StatusCode, json: String) -> Response<Body> {
    let mut r = Response::new(full(json));
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
        &mcp::error(&Value::Null, mcp::code::INVALID_REQUEST, message),
    )
}

impl Gateway {
    pub fn new(
        lc: Arc<Lifecycle>,
        sup: Arc<Supervisor>,
        manifest: Arc<Manifest>,
        cfg: GatewayConfig,
    ) -> Arc<Gateway> {
        let sessions = Sessions::new(
            cfg.max_sessions_per_server,
            Duration::from_millis(cfg.session_idle_ms),
        );
        Arc::new(Gateway {
            lc,
            sup,
            manifest,
            cfg,
            sessions: Arc::new(sessions),
            routes: Mutex::new(HashMap::new()),
        })
    }

    /// Serves `listener` until `shutdown`; each connection speaks HTTP/1.1
    /// or h2 (detected from its first bytes).
    pub async fn serve(
        self: Arc<Self>,
        listener: Listener,
        policy: AuthPolicy,
        shutdown: CancellationToken,
    ) {
        let endpoint = listener.local_endpoint().clone();
        info!(%endpoint, token_required = policy.required, "MCP data plane listening");
        let limits = sandbox_serve::http::HttpLimits {
            max_connections: self.cfg.max_connections_per_listener,
            header_timeout: Duration::from_millis(self.cfg.header_timeout_ms),
            drain: Duration::from_secs(5),
        };
        let policy = Arc::new(policy);
        let svc = hyper::service::service_fn(move |req| {
            let gw = self.clone();
            let policy = policy.clone();
            async move { Ok::<_, Infallible>(gw.handle(req, &policy).await) }
        });
        sandbox_serve::http::serve_http(listener, limits, shutdown.cancelled_owned(), svc).await;
    }

    async fn handle(
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        policy: &AuthPolicy,
    ) -> Response<Body> {
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
        let Some(name) = mcp::server_of_path(&path).map(str::to_owned) else {
            return http_error(
                StatusCode::NOT_FOUND,
                format!(
                    "no MCP endpoint at {path}; endpoints are /<server>/mcp for the servers of the current lease"
                ),
            );
        };
        let view = self.lc.view();
        let current = view.lease.as_ref().map(|l| l.id.as_str());
        // The lease the host admitted the request under; else the current
        // one. Either way the request stays bound to it (`lease_ended`).
        let lease = match bound_lease(req.headers()) {
            Err(r) => return *r,
            Ok(Some(l)) if current != Some(l.as_str()) => return ended(&l),
            Ok(Some(l)) => l,
            Ok(None) => current.unwrap_or_default().to_owned(),
        };
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
        let span = tracing::debug_span!("mcp", server = %name);
        async {
            // A lazy lease's server starts on its first request, which
            // waits for it; one that cannot start answers with why. With
            // a catalog, discovery does not start it: the first request
            // beyond discovery does.
            let catalog = self.idle_catalog(&name, &lease);
            if catalog.is_none()
                && let Err(e) = self.lc.start_on_use(&name, &lease).await
            {
                return http_error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            }
            self.handle_server(req, &name, &lease, catalog).await
        }
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
        self: &Arc<Self>,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        catalog: Option<Arc<Catalog>>,
    ) -> Response<Body> {
        let transport = self.manifest.get(name).map(|d| d.transport.clone());
        match transport {
            Some(Transport::Http { port, path }) => self.proxy(req, name, lease, port, &path).await,
            _ => self.stdio(req, name, lease, catalog).await,
        }
    }

    /// The catalog of an idle stdio server of the lease, when one was
    /// recorded from the launch the lease runs.
    fn idle_catalog(&self, name: &str, lease: &str) -> Option<Arc<Catalog>> {
        let stdio = self
            .manifest
            .get(name)
            .is_some_and(|d| matches!(d.transport, Transport::Stdio));
        let idle = self.sup.status(name).is_ok_and(|s| s.state == State::Idle);
        if !(stdio && idle) {
            return None;
        }
        self.lc.catalog_for(name, lease)
    }

    /// A request's body, within `gateway.max_body_bytes` (413 beyond it).
    async fn read_body(&self, body: Incoming) -> Result<Bytes, Box<Response<Body>>> {
        let max = self.cfg.max_body_bytes;
        match http_body_util::Limited::new(body, max).collect().await {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) => {
                let status = if e
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::BAD_REQUEST
                };
                Err(Box::new(http_error(
                    status,
                    format!("reading the body: {e} (limit gateway.max_body_bytes = {max})"),
                )))
            }
        }
    }

    /// A request of lease `lease` whose body is read and whose server's
    /// connection is in hand: refused (404) unless that lease is still
    /// current. Lease ids are never reused, so the connection was taken
    /// while the lease was current: it is that lease's server, never the
    /// next lease's.
    fn lease_ended(&self, name: &str, lease: &str) -> Option<Response<Body>> {
        (!self.leased(name, lease)).then(|| ended(lease))
    }

    /// Whether `name` is a server of lease `lease`, which is current.
    fn leased(&self, name: &str, lease: &str) -> bool {
        self.lc
            .view()
            .lease
            .is_some_and(|l| l.id == lease && l.servers.iter().any(|s| s == name))
    }

    /// The routing state of a server in this lease; made (with the task
    /// that reads the child's messages) on first use.
    fn route(self: &Arc<Self>, name: &str, lease: &str) -> Arc<Route> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = routes.get(name)
            && r.lease == lease
            && !r.ended.is_cancelled()
        {
            return r.clone();
        }
        if let Some(old) = routes.remove(name) {
            old.retire();
        }
        let r = Arc::new(Route::new(
            name,
            lease,
            self.sessions.clone(),
            self.cfg.stream_buffer_messages,
            Duration::from_millis(self.cfg.request_timeout_ms),
        ));
        routes.insert(name.to_owned(), r.clone());
        let span = tracing::debug_span!("mcp-route", server = %name, lease = %lease);
        tokio::spawn(self.clone().drive(r.clone()).instrument(span));
        r
    }

    /// Follows a server's child across restarts, routing its messages,
    /// until the server leaves the lease.
    async fn drive(self: Arc<Self>, route: Arc<Route>) {
        while !route.ended.is_cancelled() && self.leased(&route.name, &route.lease) {
            match self.conn(&route.name).await {
                Ok(conn) => {
                    let generation = route.attach(&conn);
                    router::pump(&route, &conn, generation).await;
                }
                Err(e) => {
                    debug!(error = %e, "no connection to route");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = route.ended.cancelled() => {}
                    }
                }
            }
        }
        route.retire();
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if routes
            .get(&route.name)
            .is_some_and(|r| Arc::ptr_eq(r, &route))
        {
            routes.remove(&route.name);
        }
    }

    /// Waits (bounded) until a server is ready (restarts included).
    async fn conn_ready(&self, name: &str) -> Result<(), NotReady> {
        let wait = Duration::from_millis(self.cfg.ready_wait_ms);
        match self.sup.wait_settled(name, wait).await? {
            Some(s) if s.state == State::Ready => Ok(()),
            Some(s) => Err(NotReady::Down {
                name: name.to_owned(),
                state: s.state,
                message: s.message,
            }),
            None => Err(NotReady::Timeout {
                name: name.to_owned(),
                within: wait,
            }),
        }
    }

    /// The ready connection of a server, waiting (bounded) while it restarts.
    async fn conn(&self, name: &str) -> Result<Arc<StdioConn>, NotReady> {
        if let Some(c) = self.sup.conn(name) {
            return Ok(c);
        }
        self.conn_ready(name).await?;
        self.sup
            .conn(name)
            .ok_or_else(|| NotReady::Gone(name.to_owned()))
    }
}

/// The lease a request names (`sandbox-lease`, set by the host that
/// admitted it), if any.
fn bound_lease(h: &HeaderMap) -> Result<Option<String>, Box<Response<Body>>> {
    match h.get(sandbox_client::lease::HEADER) {
        None => Ok(None),
        Some(v) => v.to_str().map(|s| Some(s.to_owned())).map_err(|_| {
            Box::new(http_error(
                StatusCode::BAD_REQUEST,
                "the sandbox-lease header is not printable ASCII",
            ))
        }),
    }
}

/// The answer to a request whose lease has ended (never naming the lease
/// that holds the sandbox now).
fn ended(lease: &str) -> Response<Body> {
    let e = crate::lifecycle::LcError::LeaseEnded(lease.to_owned());
    http_error(StatusCode::NOT_FOUND, e.to_string())
}

/// Why a request cannot reach a server now (the client gets a 503 saying
/// so).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    #[error(transparent)]
    Unknown(#[from] crate::supervisor::SupError),
    #[error("server {name} is {state:?}: {message}")]
    Down {
        name: String,
        state: State,
        message: String,
    },
    #[error("server {name} was not ready within {} ms", within.as_millis())]
    Timeout { name: String, within: Duration },
    #[error("server {0} is not ready")]
    Gone(String),
}

/// Binds the data-plane listeners.
pub async fn bind(
    endpoints: &[Endpoint],
) -> Result<Vec<Listener>, sandbox_serve::listen::ListenError> {
    let mut out = Vec::new();
    for ep in endpoints {
        out.push(Listener::bind(ep).await?);
    }
    Ok(out)
}
