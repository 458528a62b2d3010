//! The Klavis Local Sandbox REST API over the pool of agents: the same
//! paths, JSON fields, statuses and 422 shape (FastAPI's
//! `HTTPValidationError`), so a Klavis client only changes its base URL.
//!
//! Every request carries `Authorization: Bearer <api key>`; keys map to
//! owners, and another owner's sandbox is answered 404, never 403. Archive
//! transfers go through expiring signed URLs that this host serves itself.
//!
//! - `validation`: request bodies and queries checked as Klavis's pydantic
//!   models check them, with the same 422 bodies.
//! - `sandboxes`: acquire, list, get, reset, release.
//! - `transfer`: signed upload/download URLs and the streams behind them.
//! - `exec`: the execution endpoints over the agent's `Exec` service.
//! - `uploads`: the bounded store of uploaded archives.
//! - `reaper`: TTL expiry and dead agents.

mod exec;
mod reaper;
mod sandboxes;
pub mod server_data;
mod transfer;
mod uploads;
mod validation;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::pool::Pool;
use crate::signed::Signer;
use crate::store::{SandboxRow, Store};

pub use exec::{
    exec_download, exec_upload, execute, execution_logs, execution_status, execution_upload_url,
    export_artifacts,
};
pub use reaper::reap;
pub use sandboxes::{acquire, get, list, release, release_in_background, reset};
pub use transfer::{download, dump_url, initialize, upload, upload_url};
pub use uploads::{UploadLimits, Uploads};

/// The server names of Klavis's `LocalSandboxMCPServer` enum.
pub const SERVER_NAMES: &[&str] = &[
    "filesystem",
    "git",
    "terminal",
    "desktop-commander",
    "arxiv",
    "excel",
    "word",
    "powerpoint",
    "code-executor",
    "code-runner",
    "pdf-tools",
    "google_cloud",
    "poste_email_toolathlon",
    "canvas",
    "localmemory",
    "playwright",
];

/// Lifetime of the signed transfer URLs.
pub(super) const URL_MINUTES: u64 = 30;

pub struct Host {
    pub metrics: crate::metrics::Metrics,
    pub store: Store,
    pub pool: Arc<Pool>,
    pub signer: Signer,
    /// API key → owner.
    pub keys: HashMap<String, String>,
    pub public_url: String,
    pub uploads: Uploads,
    /// Multiplies TTLs (tests shorten the clock with it).
    pub time_scale: f64,
    /// Live sandboxes per owner (`--max-sandboxes-per-key`).
    pub max_per_owner: usize,
    /// Acquires in flight per owner, counted against `max_per_owner`
    /// until their sandbox is stored.
    pub acquiring: std::sync::Mutex<HashMap<String, usize>>,
    /// Releases running in the background; a shutdown waits for them, so a
    /// released sandbox is back in the pool (and stopped with it), never
    /// left running outside it.
    pub releases: tokio_util::task::TaskTracker,
}

pub type Shared = Arc<Host>;

/// `GET /metrics`: the pool and Acquire metrics, for Prometheus. No key:
/// aggregates only.
pub async fn metrics(axum::extract::State(h): axum::extract::State<Shared>) -> Response {
    match h.metrics.render(&h.pool) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed",
        )
            .into_response(),
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, false)
}

/// An error answer: a status and FastAPI's body shape (`{"detail": ...}`).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    detail: Value,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"detail": self.detail}))).into_response()
    }
}

pub(super) type ApiResult = Result<Response, ApiError>;

/// `{"detail": "..."}`, FastAPI's HTTPException body.
pub fn detail(status: StatusCode, msg: impl Into<String>) -> ApiError {
    ApiError {
        status,
        detail: Value::String(msg.into()),
    }
}

/// FastAPI's 422 body.
pub(super) fn invalid(errors: Vec<Value>) -> ApiError {
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        detail: Value::Array(errors),
    }
}

pub(super) fn verr(loc: &[Value], msg: impl Into<String>, kind: &str, input: &Value) -> Value {
    json!({"loc": loc, "msg": msg.into(), "type": kind, "input": input})
}

/// [`verr`] with pydantic's `ctx` (the constraint that failed).
pub(super) fn verr_ctx(
    loc: &[Value],
    msg: impl Into<String>,
    kind: &str,
    input: &Value,
    ctx: Value,
) -> Value {
    json!({"loc": loc, "msg": msg.into(), "type": kind, "input": input, "ctx": ctx})
}

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The owner of the request's API key.
pub(super) fn owner(h: &Host, headers: &HeaderMap) -> Result<String, ApiError> {
    // The scheme is case-insensitive (RFC 9110 11.1): "bearer" works too.
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    match key.and_then(|k| h.keys.get(k)) {
        Some(o) => Ok(o.clone()),
        None if key.is_none() => Err(detail(
            StatusCode::UNAUTHORIZED,
            "Not authenticated: send Authorization: Bearer <api key>",
        )),
        None => Err(detail(StatusCode::UNAUTHORIZED, "Invalid API key")),
    }
}

pub(super) fn not_found(id: &str) -> ApiError {
    detail(
        StatusCode::NOT_FOUND,
        format!("Local sandbox {id} not found"),
    )
}

/// Whether sandbox `id` is still live (not released).
pub(super) fn is_live(h: &Host, id: &str) -> bool {
    matches!(h.store.get_live(id), Ok(Some(_)))
}

/// A sandbox of the caller, or 404.
pub fn sandbox_of(h: &Host, headers: &HeaderMap, id: &str) -> Result<SandboxRow, ApiError> {
    let who = owner(h, headers)?;
    match h.store.get(id, &who) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(not_found(id)),
        Err(e) => Err(internal(e)),
    }
}

/// The query parameter of the MCP URLs' capability token.
pub const MCP_TOKEN_PARAM: &str = "mcp_token";
/// What the capability token is signed for.
pub const MCP_TOKEN_ACTION: &str = "mcp";

/// Klavis's MCP URL, plus a capability token: whoever holds the URL may
/// use that sandbox's MCP servers (Klavis's notebooks call it without a
/// key) until the sandbox is released. The API key works as well.
fn mcp_url(h: &Host, server: &str, id: &str) -> String {
    format!(
        "{}/{server}/mcp/?local_sandbox_id={id}&{MCP_TOKEN_PARAM}={}",
        h.public_url,
        h.signer.token(MCP_TOKEN_ACTION, id)
    )
}

pub(super) fn server_items(h: &Host, s: &SandboxRow) -> Vec<Value> {
    s.servers
        .iter()
        .map(|sv| {
            json!({
                "server_name": sv.name,
                "id": sv.id,
                "mcp_server_url": mcp_url(h, &sv.name, &s.id),
                "status": s.status,
                "benchmark": s.benchmark,
                "updated_at": s.updated_at,
                "metadata": null,
                "auth_data": sv.auth_data,
                "tags": null,
            })
        })
        .collect()
}

pub(super) fn info(h: &Host, s: &SandboxRow) -> Value {
    json!({
        "local_sandbox_id": s.id,
        "created_at": s.created_at,
        "status": s.status,
        "benchmark": s.benchmark,
        "servers": server_items(h, s),
    })
}

/// A gRPC failure of the agent as an HTTP answer.
pub(super) fn agent_error(what: &str, s: tonic::Status) -> ApiError {
    let status = match s.code() {
        tonic::Code::InvalidArgument
        | tonic::Code::FailedPrecondition
        | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        // The workspace is busy with another transfer: retry later.
        tonic::Code::Aborted => StatusCode::CONFLICT,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    detail(status, format!("{what}: {}", s.message()))
}
