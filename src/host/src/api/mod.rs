//! The Klavis Local Sandbox REST API over the pool of agents: the same
//! paths, JSON fields, statuses and 422 shape (FastAPI's
//! `HTTPValidationError`), so a Klavis client only changes its base URL.
//!
//! Every request carries `Authorization: Bearer <api key>`; keys map to
//! owners, and another owner's sandbox is answered 404, never 403. Archive
//! transfers go through expiring signed URLs that this host serves itself.
//!
//! Handlers, a folder or file per resource, importing only what they
//! share, never each other:
//! - `local_sandbox/`: `/local-sandbox` (`lifecycle`: acquire, list, get,
//!   reset, release; `transfer`: the workspace's upload URL, initialize,
//!   dump, and the signed URLs and streams behind them).
//! - `sandbox/`: Klavis's `/sandbox/{server}` (`names`: its server names).
//! - `executions`: the execution endpoints over the agent's `Exec` service.
//! - `data/`: the per-server data of google_cloud, mail, canvas and
//!   localmemory (`klavis`: Klavis's models of them).
//! - `mcp_proxy` (MCP URLs), `metrics` (`/metrics`), `openapi`
//!   (`/openapi.json`).
//!
//! What they share:
//! - `common`: the caller, the sandbox and agent a request names, signed
//!   URLs, the streams between the upload store and an agent.
//! - `model`: every answer's type (they generate the document's schemas).
//! - `validation`: request bodies and queries checked as Klavis's pydantic
//!   models check them, with the same 422 bodies.
//! - `inflight`: a response body cut when its sandbox's lease ends.
//!
//! The rules (Acquire, Release, Reset, owner caps, TTL) are the lease
//! service's (`crate::lease`), with no HTTP in them.
//!
//! Errors are `crate::error::HostError`, whose one `status()` decides
//! every answer's status.

mod common;
mod data;
mod executions;
pub mod inflight;
mod local_sandbox;
mod mcp_proxy;
pub mod metrics;
pub mod model;
pub mod openapi;
mod sandbox;
mod validation;

use axum::Router;
use axum::routing::{get, post, put};

pub use crate::uploads::{UploadLimits, Uploads};
pub use common::{MCP_TOKEN_ACTION, MCP_TOKEN_PARAM, sandbox_of, timestamp};

/// The largest per-server data document (`POST /local-sandbox/{server}/{id}/initialize`)
/// the host reads; the agent applies its own mail.max_data_bytes (16 MiB by default).
const MAX_SERVER_DATA_BYTES: usize = 64 << 20;

/// Every route of the host: the REST API, the signed transfer URLs, the
/// OpenAPI document and metrics; anything else is an MCP URL.
pub fn router(host: Shared) -> Router {
    let sandbox = "/local-sandbox/{id}";
    Router::new()
        .route(
            "/local-sandbox",
            post(local_sandbox::lifecycle::acquire).get(local_sandbox::lifecycle::list),
        )
        .route(
            sandbox,
            get(local_sandbox::lifecycle::get).delete(local_sandbox::lifecycle::release),
        )
        .route(
            &format!("{sandbox}/reset"),
            post(local_sandbox::lifecycle::reset),
        )
        .route(
            &format!("{sandbox}/upload-url"),
            post(local_sandbox::transfer::upload_url),
        )
        // The multipart form counts its own bytes (--max-multipart-bytes).
        .route(
            &format!("{sandbox}/initialize"),
            post(local_sandbox::transfer::initialize)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            &format!("{sandbox}/dump"),
            get(local_sandbox::transfer::dump_url),
        )
        .route(
            "/local-sandbox/{server}/{id}/initialize",
            post(data::initialize)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_SERVER_DATA_BYTES)),
        )
        .route("/local-sandbox/{server}/{id}/dump", get(data::dump))
        .route(
            &format!("{sandbox}/execution-upload-url"),
            post(executions::execution_upload_url),
        )
        .route(&format!("{sandbox}/execute"), post(executions::execute))
        .route(
            &format!("{sandbox}/execution-status"),
            get(executions::execution_status),
        )
        .route(
            &format!("{sandbox}/execution-logs"),
            get(executions::execution_logs),
        )
        .route(
            &format!("{sandbox}/export-artifacts"),
            post(executions::export_artifacts),
        )
        .merge(sandbox_api_routes())
        .route(
            "/transfer/upload/{id}",
            put(local_sandbox::transfer::upload),
        )
        .route(
            "/transfer/exec-upload/{id}/{name}",
            put(executions::exec_upload),
        )
        .route(
            "/transfer/exec-export/{id}/{name}",
            get(executions::exec_download),
        )
        .route(
            "/transfer/dump/{id}",
            get(local_sandbox::transfer::download),
        )
        .route("/openapi.json", get(openapi))
        .route(
            "/metrics",
            get(metrics::unkeyed).layer(axum::middleware::from_fn_with_state(
                host.clone(),
                metrics::guard,
            )),
        )
        .fallback(mcp_proxy::proxy)
        .with_state(host)
}

/// Klavis's MCP Sandbox API over the same sandboxes (static segments win
/// over `{server}`), its answers in its own words.
fn sandbox_api_routes() -> Router<Shared> {
    Router::new()
        .route("/sandbox/{server}", post(sandbox::create))
        .route(
            "/sandbox/{server}/{id}",
            get(sandbox::get).delete(sandbox::delete),
        )
        .route("/sandbox/{server}/{id}/reset", post(sandbox::reset))
        .route(
            "/sandbox/local_dev/{id}/upload-url",
            post(local_sandbox::transfer::upload_url),
        )
        .route(
            "/sandbox/local_dev/{id}/initialize",
            post(local_sandbox::transfer::initialize)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            "/sandbox/local_dev/{id}/dump",
            get(local_sandbox::transfer::dump_url),
        )
        .route(
            "/sandbox/{server}/{id}/initialize",
            post(data::initialize)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_SERVER_DATA_BYTES)),
        )
        .route("/sandbox/{server}/{id}/dump", get(data::dump))
        .layer(axum::middleware::map_response(
            crate::error::in_sandbox_api_words,
        ))
}

/// `GET /openapi.json`: the document of what this host serves.
async fn openapi() -> axum::Json<serde_json::Value> {
    axum::Json(openapi::document())
}

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

pub use crate::lease::{Host, Shared};
