//! The Klavis Local Sandbox REST API over the pool of agents: the same
//! paths, JSON fields, statuses and 422 shape (FastAPI's
//! `HTTPValidationError`), so a Klavis client only changes its base URL.
//!
//! Every request carries `Authorization: Bearer <api key>`; keys map to
//! owners, and another owner's sandbox is answered 404, never 403. Archive
//! transfers go through expiring signed URLs that this host serves itself.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbox_client::proto;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tracing::{info, warn};

use crate::pool::{OnRelease, Pool};
use crate::signed::{Invalid, Signer};
use crate::store::{SandboxRow, ServerRow, Store};

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
const BENCHMARKS: &[&str] = &["MCP_Atlas", "Toolathlon", "MCP_Mark"];
/// Lifetime of the signed transfer URLs.
const URL_MINUTES: u64 = 30;

pub struct Host {
    pub store: Store,
    pub pool: Arc<Pool>,
    pub signer: Signer,
    /// API key → owner.
    pub keys: HashMap<String, String>,
    pub public_url: String,
    pub uploads: PathBuf,
    /// Multiplies TTLs (tests shorten the clock with it).
    pub time_scale: f64,
    pub max_upload_bytes: u64,
    /// Releases running in the background; a shutdown waits for them, so a
    /// released sandbox is back in the pool (and stopped with it), never
    /// left running outside it.
    pub releases: tokio_util::task::TaskTracker,
}

pub type Shared = Arc<Host>;

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

type ApiResult = Result<Response, ApiError>;

/// `{"detail": "..."}`, FastAPI's HTTPException body.
pub fn detail(status: StatusCode, msg: impl Into<String>) -> ApiError {
    ApiError {
        status,
        detail: Value::String(msg.into()),
    }
}

/// FastAPI's 422 body.
fn invalid(errors: Vec<Value>) -> ApiError {
    ApiError {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        detail: Value::Array(errors),
    }
}

fn verr(loc: &[Value], msg: impl Into<String>, kind: &str, input: &Value) -> Value {
    json!({"loc": loc, "msg": msg.into(), "type": kind, "input": input})
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The owner of the request's API key.
fn owner(h: &Host, headers: &HeaderMap) -> Result<String, ApiError> {
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match key.and_then(|k| h.keys.get(k)) {
        Some(o) => Ok(o.clone()),
        None if key.is_none() => Err(detail(
            StatusCode::UNAUTHORIZED,
            "Not authenticated: send Authorization: Bearer <api key>",
        )),
        None => Err(detail(StatusCode::UNAUTHORIZED, "Invalid API key")),
    }
}

fn not_found(id: &str) -> ApiError {
    detail(
        StatusCode::NOT_FOUND,
        format!("Local sandbox {id} not found"),
    )
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

fn server_items(h: &Host, s: &SandboxRow) -> Vec<Value> {
    s.servers
        .iter()
        .map(|sv| {
            json!({
                "server_name": sv.name,
                "id": sv.id,
                "mcp_server_url": format!("{}/{}/mcp/?local_sandbox_id={}", h.public_url, sv.name, s.id),
                "status": s.status,
                "benchmark": s.benchmark,
                "updated_at": s.updated_at,
                "metadata": null,
                "auth_data": null,
                "tags": null,
            })
        })
        .collect()
}

fn info(h: &Host, s: &SandboxRow) -> Value {
    json!({
        "local_sandbox_id": s.id,
        "created_at": s.created_at,
        "status": s.status,
        "benchmark": s.benchmark,
        "servers": server_items(h, s),
    })
}

/// A gRPC failure of the agent as an HTTP answer.
fn agent_error(what: &str, s: tonic::Status) -> ApiError {
    let status = match s.code() {
        tonic::Code::InvalidArgument
        | tonic::Code::FailedPrecondition
        | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    detail(status, format!("{what}: {}", s.message()))
}

struct AcquireBody {
    servers: Option<Vec<String>>,
    benchmark: Option<String>,
    email: String,
    ttl: Option<u32>,
}

/// Validates `POST /local-sandbox` like the Klavis (pydantic) model does.
fn parse_acquire(body: &[u8]) -> Result<AcquireBody, ApiError> {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Err(invalid(vec![verr(
                &[json!("body"), json!(e.column())],
                format!("JSON decode error: {e}"),
                "json_invalid",
                &json!({}),
            )]));
        }
    };
    let Some(o) = v.as_object() else {
        return Err(invalid(vec![verr(
            &[json!("body")],
            "Input should be a valid dictionary or object to extract fields from",
            "model_attributes_type",
            &v,
        )]));
    };
    let mut errors = Vec::new();
    let servers = match o.get("server_names") {
        None => {
            errors.push(verr(
                &[json!("body"), json!("server_names")],
                "Field required",
                "missing",
                &v,
            ));
            None
        }
        Some(Value::String(s)) if s == "ALL" => None,
        Some(Value::Array(a)) => {
            let mut names = Vec::new();
            for (i, n) in a.iter().enumerate() {
                match n.as_str() {
                    Some(s) if SERVER_NAMES.contains(&s) => names.push(s.to_owned()),
                    _ => errors.push(verr(
                        &[json!("body"), json!("server_names"), json!(i)],
                        format!(
                            "Input should be {}",
                            SERVER_NAMES
                                .iter()
                                .map(|s| format!("'{s}'"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        "enum",
                        n,
                    )),
                }
            }
            if a.is_empty() {
                errors.push(verr(
                    &[json!("body"), json!("server_names")],
                    "List should have at least 1 item after validation, not 0",
                    "too_short",
                    &json!([]),
                ));
            }
            Some(names)
        }
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("server_names")],
                "Input should be a valid list, or the literal 'ALL'",
                "union_tag_invalid",
                other,
            ));
            None
        }
    };
    let benchmark = match o.get("benchmark") {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) if BENCHMARKS.contains(&b.as_str()) => Some(b.clone()),
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("benchmark")],
                "Input should be 'MCP_Atlas', 'Toolathlon' or 'MCP_Mark'",
                "enum",
                other,
            ));
            None
        }
    };
    let ttl = match o.get("ttl_seconds") {
        None => Some(7200),
        Some(Value::Null) => None,
        Some(t) => match t.as_i64() {
            Some(n) if (60..=86400).contains(&n) => Some(n as u32),
            Some(n) => {
                let (msg, kind) = if n < 60 {
                    (
                        "Input should be greater than or equal to 60",
                        "greater_than_equal",
                    )
                } else {
                    (
                        "Input should be less than or equal to 86400",
                        "less_than_equal",
                    )
                };
                errors.push(verr(&[json!("body"), json!("ttl_seconds")], msg, kind, t));
                None
            }
            None => {
                errors.push(verr(
                    &[json!("body"), json!("ttl_seconds")],
                    "Input should be a valid integer",
                    "int_type",
                    t,
                ));
                None
            }
        },
    };
    let email = match o.get("test_account_email") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            errors.push(verr(
                &[json!("body"), json!("test_account_email")],
                "Input should be a valid string",
                "string_type",
                other,
            ));
            String::new()
        }
    };
    if !errors.is_empty() {
        return Err(invalid(errors));
    }
    Ok(AcquireBody {
        servers,
        benchmark,
        email,
        ttl,
    })
}

fn benchmark_proto(b: &Option<String>) -> i32 {
    (match b.as_deref() {
        Some("MCP_Atlas") => proto::Benchmark::McpAtlas,
        Some("Toolathlon") => proto::Benchmark::Toolathlon,
        Some("MCP_Mark") => proto::Benchmark::McpMark,
        _ => proto::Benchmark::Unspecified,
    }) as i32
}

/// `POST /local-sandbox`
pub async fn acquire(
    State(h): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult {
    let who = owner(&h, &headers)?;
    let req = parse_acquire(&body)?;
    if let Some((missing, known)) = req
        .servers
        .as_deref()
        .and_then(|asked| h.pool.missing_servers(asked))
    {
        return Err(detail(
            StatusCode::BAD_REQUEST,
            format!(
                "acquire: unknown server{} {}; this host's sandboxes carry: {}",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                known.join(", ")
            ),
        ));
    }
    // A warm lease serves only a plain Acquire of exactly its servers.
    let plain = req.benchmark.is_none() && req.email.is_empty();
    let matches_warm = plain
        && h.pool
            .warm_profile()
            .is_some_and(|p| p.matches(req.servers.as_deref()));
    let taken = h.pool.take(matches_warm).await.map_err(|e| {
        detail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no sandbox available: {e:#}"),
        )
    })?;
    let slot = taken.slot;
    let warm_hit = matches_warm && taken.warm.is_some();
    let result = match taken.warm {
        Some(w) if matches_warm => Ok((w.lease_id, w.servers)),
        other => {
            async {
                let c = slot
                    .client()
                    .await
                    .map_err(|e| detail(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))?;
                if let Some(w) = other {
                    // A warm lease of other servers: ended first.
                    c.agent()
                        .release(proto::ReleaseRequest {
                            lease_id: w.lease_id,
                            is_ttl: false,
                        })
                        .await
                        .map_err(|s| agent_error("releasing the warm lease", s))?;
                }
                let id = uuid::Uuid::new_v4().to_string();
                let r = c
                    .agent()
                    .acquire(proto::AcquireRequest {
                        lease_id: id.clone(),
                        server_names: req.servers.clone().unwrap_or_default(),
                        all_servers: req.servers.is_none(),
                        benchmark: benchmark_proto(&req.benchmark),
                        // The host's reaper owns the TTL (it survives host
                        // restarts in the database).
                        ttl_seconds: Some(0),
                        test_account_email: req.email.clone(),
                        ..Default::default()
                    })
                    .await
                    .map_err(|s| {
                        // A name of the API that this sandbox's manifest
                        // (or VM image) does not carry is the request's
                        // fault, not a missing resource.
                        if s.code() == tonic::Code::NotFound {
                            detail(StatusCode::BAD_REQUEST, format!("acquire: {}", s.message()))
                        } else {
                            agent_error("acquire", s)
                        }
                    })?
                    .into_inner();
                Ok((id, r.servers.into_iter().map(|s| s.name).collect()))
            }
            .await
        }
    };
    let (id, mut servers): (String, Vec<String>) = match result {
        Ok(a) => a,
        Err(e) => {
            // The agent stayed idle: it goes back to the pool.
            let pool = h.pool.clone();
            let slot_id = slot.id.clone();
            tokio::task::spawn_blocking(move || pool.give_back(&slot_id));
            return Err(e);
        }
    };
    // In the order asked for (a warm lease lists its profile's order).
    if let Some(asked) = &req.servers {
        servers.sort_by_key(|n| asked.iter().position(|a| a == n).unwrap_or(usize::MAX));
    }
    let now = timestamp();
    let row = SandboxRow {
        id: id.clone(),
        owner: who,
        slot: slot.id.clone(),
        status: "occupied".into(),
        benchmark: req.benchmark.clone(),
        servers: servers
            .into_iter()
            .map(|name| ServerRow {
                name,
                id: uuid::Uuid::new_v4().to_string(),
            })
            .collect(),
        created_at: now.clone(),
        updated_at: now,
        expires_at_ms: req
            .ttl
            .map(|t| now_ms() + (f64::from(t) * 1000.0 * h.time_scale) as i64),
    };
    h.store.insert(&row).map_err(internal)?;
    info!(sandbox = %id, slot = %slot.id, servers = row.servers.len(), warm = warm_hit, "acquired");
    let mut body = info(&h, &row);
    if let Some(o) = body.as_object_mut() {
        o.remove("created_at");
        let names: Vec<&str> = row.servers.iter().map(|s| s.name.as_str()).collect();
        o.insert(
            "message".into(),
            json!(format!(
                "Local sandbox acquired with {} server(s): {}",
                names.len(),
                names.join(", ")
            )),
        );
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /local-sandbox`
pub async fn list(State(h): State<Shared>, headers: HeaderMap) -> ApiResult {
    let who = owner(&h, &headers)?;
    let rows = h.store.list(Some(&who)).map_err(internal)?;
    let items: Vec<Value> = rows.iter().map(|s| info(&h, s)).collect();
    Ok(Json(json!({"total_count": items.len(), "local_sandboxes": items})).into_response())
}

/// `GET /local-sandbox/{id}`
pub async fn get(State(h): State<Shared>, headers: HeaderMap, Path(id): Path<String>) -> ApiResult {
    let s = sandbox_of(&h, &headers, &id)?;
    Ok(Json(info(&h, &s)).into_response())
}

/// A query parameter FastAPI would check: the 422 its validation gives.
fn query_error(name: &str, msg: &str, kind: &str, input: &str) -> ApiError {
    invalid(vec![verr(
        &[json!("query"), json!(name)],
        msg,
        kind,
        &json!(input),
    )])
}

/// `?is_ttl=`, parsed as pydantic parses a boolean.
fn is_ttl(q: &HashMap<String, String>) -> Result<bool, ApiError> {
    let Some(v) = q.get("is_ttl") else {
        return Ok(false);
    };
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Ok(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Ok(false),
        _ => Err(query_error(
            "is_ttl",
            "Input should be a valid boolean, unable to interpret input",
            "bool_parsing",
            v,
        )),
    }
}

/// `?region=` of the transfer endpoints (Klavis's `GCSRegion`): accepted
/// and checked; this host stores archives itself, so it changes nothing.
fn check_region(q: &HashMap<String, String>) -> Result<(), ApiError> {
    match q.get("region").map(String::as_str) {
        None | Some("us") | Some("asia") => Ok(()),
        Some(v) => Err(query_error(
            "region",
            "Input should be 'us' or 'asia'",
            "enum",
            v,
        )),
    }
}

/// Ends a sandbox: marked released now, the agent released in the
/// background, then back to the pool (or replaced if the release failed).
pub fn release_in_background(h: &Shared, s: &SandboxRow, is_ttl: bool) {
    if let Err(e) = h.store.mark_released(&s.id, &timestamp()) {
        warn!(sandbox = %s.id, error = %e, "cannot record the release");
    }
    let _ = std::fs::remove_file(h.uploads.join(format!("{}.tar.gz", s.id)));
    let (h, id, slot_id) = (h.clone(), s.id.clone(), s.slot.clone());
    let releases = h.releases.clone();
    releases.spawn(async move {
        if h.pool.on_release() == OnRelease::Replace {
            // Its agent or VM is stopped whole; nothing to release inside.
            let pool = h.pool.clone();
            let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot_id)).await;
            info!(sandbox = %id, is_ttl, "released; its sandbox is replaced");
            return;
        }
        let released = match h.pool.leased_slot(&slot_id) {
            Some(slot) => match slot.client().await {
                Ok(c) => c
                    .agent()
                    .release(proto::ReleaseRequest {
                        lease_id: id.clone(),
                        is_ttl,
                    })
                    .await
                    .map_err(|s| s.to_string()),
                Err(e) => Err(format!("{e:#}")),
            },
            None => Err("its agent is gone".into()),
        };
        let pool = h.pool.clone();
        match released {
            Ok(_) => {
                info!(sandbox = %id, is_ttl, "released");
                let _ = tokio::task::spawn_blocking(move || pool.give_back(&slot_id)).await;
            }
            Err(e) => {
                warn!(sandbox = %id, error = %e, "release failed; the agent is replaced");
                let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot_id)).await;
            }
        }
    });
}

/// `DELETE /local-sandbox/{id}?is_ttl=`
pub async fn release(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    let is_ttl = is_ttl(&q)?;
    let s = sandbox_of(&h, &headers, &id)?;
    release_in_background(&h, &s, is_ttl);
    Ok(Json(json!({"message": format!(
        "Local sandbox release started for {id}: it will be released asynchronously in background."
    )}))
    .into_response())
}

/// The agent of a live sandbox.
async fn agent_of(h: &Host, s: &SandboxRow) -> Result<sandbox_client::Client, ApiError> {
    let slot = h.pool.leased_slot(&s.slot).ok_or_else(|| {
        detail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the sandbox's agent is gone",
        )
    })?;
    slot.client()
        .await
        .map_err(|e| detail(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")))
}

/// `POST /local-sandbox/{id}/reset`
pub async fn reset(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult {
    let s = sandbox_of(&h, &headers, &id)?;
    agent_of(&h, &s)
        .await?
        .agent()
        .reset(proto::ResetRequest {
            lease_id: id.clone(),
        })
        .await
        .map_err(|s| agent_error("reset", s))?;
    h.store
        .set_status(&id, "occupied", &timestamp())
        .map_err(internal)?;
    let mut body = info(&h, &s);
    body["message"] = json!(format!("Local sandbox {id} reset"));
    Ok(Json(body).into_response())
}

fn unix_now() -> u64 {
    (now_ms() / 1000) as u64
}

fn signed_url(h: &Host, action: &str, id: &str) -> String {
    let expires = unix_now() + URL_MINUTES * 60;
    format!(
        "{}/transfer/{action}/{id}?{}",
        h.public_url,
        h.signer.sign(action, id, expires)
    )
}

/// `POST /local-sandbox/{id}/upload-url`
pub async fn upload_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    sandbox_of(&h, &headers, &id)?;
    Ok(Json(
        json!({"upload_url": signed_url(&h, "upload", &id), "expires_in_minutes": URL_MINUTES}),
    )
    .into_response())
}

/// `GET /local-sandbox/{id}/dump`
pub async fn dump_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    sandbox_of(&h, &headers, &id)?;
    Ok(Json(
        json!({"download_url": signed_url(&h, "dump", &id), "expires_in_minutes": URL_MINUTES}),
    )
    .into_response())
}

#[derive(Deserialize)]
pub struct SignedQuery {
    expires: Option<u64>,
    signature: Option<String>,
}

/// The live sandbox a signed transfer URL names, or 403/404.
fn check_signed(h: &Host, action: &str, id: &str, q: &SignedQuery) -> Result<SandboxRow, ApiError> {
    let (Some(expires), Some(sig)) = (q.expires, q.signature.as_deref()) else {
        return Err(detail(
            StatusCode::FORBIDDEN,
            "this URL is not signed; ask the API for one",
        ));
    };
    match h.signer.verify(action, id, expires, sig, unix_now()) {
        Ok(()) => {}
        Err(Invalid::Expired) => {
            return Err(detail(
                StatusCode::FORBIDDEN,
                "this signed URL has expired; ask the API for a new one",
            ));
        }
        Err(Invalid::BadSignature) => {
            return Err(detail(StatusCode::FORBIDDEN, "invalid signature"));
        }
    }
    h.store
        .list(None)
        .map_err(internal)?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| not_found(id))
}

/// `PUT {upload_url}`: stores the archive, streamed and bounded; a partial
/// upload never replaces the previous one.
pub async fn upload(
    State(h): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> ApiResult {
    check_signed(&h, "upload", &id, &q)?;
    let final_path = h.uploads.join(format!("{id}.tar.gz"));
    let part = h.uploads.join(format!("{id}.tar.gz.part"));
    let stored = async {
        let mut f = tokio::fs::File::create(&part).await.map_err(internal)?;
        let mut stream = body.into_data_stream();
        let mut total: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk
                .map_err(|e| detail(StatusCode::BAD_REQUEST, format!("reading the upload: {e}")))?;
            total += chunk.len() as u64;
            if total > h.max_upload_bytes {
                return Err(detail(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the archive is larger than {} bytes", h.max_upload_bytes),
                ));
            }
            f.write_all(&chunk)
                .await
                .map_err(|e| internal(format!("storing the upload: {e}")))?;
        }
        f.sync_all().await.map_err(internal)?;
        tokio::fs::rename(&part, &final_path)
            .await
            .map_err(internal)?;
        Ok(total)
    }
    .await;
    match stored {
        Ok(total) => {
            info!(sandbox = %id, bytes = total, "archive uploaded");
            Ok(StatusCode::OK.into_response())
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            Err(e)
        }
    }
}

/// `POST /local-sandbox/{id}/initialize`: streams the stored archive into
/// the agent.
pub async fn initialize(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    let s = sandbox_of(&h, &headers, &id)?;
    let path = h.uploads.join(format!("{id}.tar.gz"));
    let file = tokio::fs::File::open(&path).await.map_err(|_| {
        detail(
            StatusCode::BAD_REQUEST,
            "no archive uploaded for this sandbox: PUT a tar.gz to the upload URL first",
        )
    })?;
    let c = agent_of(&h, &s).await?;
    let header = proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Header(
            proto::InitializeHeader::default(),
        )),
    };
    let chunks = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10).map(|c| {
        proto::InitializeRequest {
            msg: c.ok().map(proto::initialize_request::Msg::Chunk),
        }
    });
    let stream = futures_util::stream::iter([header]).chain(chunks);
    let r = c
        .workspace()
        .initialize(stream)
        .await
        .map_err(|e| agent_error("initialize", e))?
        .into_inner();
    Ok(Json(json!({
        "sandbox_id": id,
        "status": s.status,
        "message": format!("Extracted archive to workspace ({} files)", r.files),
    }))
    .into_response())
}

/// `GET {download_url}`: the agent's Dump, streamed as tar.gz.
pub async fn download(
    State(h): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
) -> ApiResult {
    let s = check_signed(&h, "dump", &id, &q)?;
    let stream = agent_of(&h, &s)
        .await?
        .workspace()
        .dump(proto::DumpRequest {
            compression: proto::Compression::Gzip as i32,
            ..Default::default()
        })
        .await
        .map_err(|e| agent_error("dump", e))?
        .into_inner();
    let bytes = stream.filter_map(|m| async move {
        match m {
            Ok(proto::DumpResponse {
                msg: Some(proto::dump_response::Msg::Chunk(b)),
            }) => Some(Ok::<_, std::io::Error>(b)),
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e.message().to_owned()))),
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/gzip")
        .body(Body::from_stream(bytes))
        .map_err(internal)
}

/// The TTL reaper: releases sandboxes whose TTL passed.
pub async fn reap(h: Shared) {
    let tick = Duration::from_secs_f64((h.time_scale).clamp(0.05, 1.0));
    loop {
        tokio::time::sleep(tick).await;
        match h.store.expired(now_ms()) {
            Ok(rows) => {
                for s in rows {
                    info!(sandbox = %s.id, "TTL expired");
                    release_in_background(&h, &s, true);
                }
            }
            Err(e) => warn!(error = %e, "TTL reaper"),
        }
        for slot in h.pool.dead_leased() {
            if let Ok(rows) = h.store.list(None) {
                for s in rows.iter().filter(|s| s.slot == slot) {
                    warn!(sandbox = %s.id, "its agent died; marked error");
                    let _ = h.store.set_status(&s.id, "error", &timestamp());
                }
            }
            let pool = h.pool.clone();
            let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot)).await;
        }
    }
}
