//! Klavis's execution endpoints over the agent's `Exec` service:
//! execution-upload-url (a signed PUT this host serves), execute (the
//! stored archive streamed to the agent, then started), execution-status,
//! execution-logs (by byte cursor) and export-artifacts (a signed GET
//! streaming the agent's export).
//!
//! Archives wait in the upload store (`uploads`) until execute, at most
//! `--max-executions-per-sandbox` names per sandbox; Release removes them
//! with the sandbox's other uploads.

use std::collections::HashMap;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use futures_util::StreamExt;
use sandbox_client::proto;
use serde_json::{Value, json};

use super::sandboxes::agent_of;
use super::transfer::{SignedQuery, archive_response, check_signed, signed_url};
use super::uploads::Kind;
use super::validation::{body_object, check_region, query_error};
use super::*;

/// The signed-URL action for an execution `name` (the signature binds it).
fn action(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// Klavis's execution names are free strings; the agent takes
/// `[A-Za-z0-9._-]{1,128}`. Others are refused here with the 422 shape.
fn check_name(loc: &str, name: &str) -> Result<(), ApiError> {
    if sandbox_client::limits::valid_execution_name(name) {
        return Ok(());
    }
    let msg = "String should match pattern '^[A-Za-z0-9._-]{1,128}$' (not '.' or '..')";
    Err(if loc == "query" {
        query_error("execution_name", msg, "string_pattern_mismatch", name)
    } else {
        invalid(vec![verr(
            &[json!("body"), json!("execution_name")],
            msg,
            "string_pattern_mismatch",
            &json!(name),
        )])
    })
}

/// `{"execution_name": str}`, checked as the Klavis (pydantic) models are.
fn body_name(body: &Bytes) -> Result<String, ApiError> {
    let v = body_object(body)?;
    let Some(o) = v.as_object() else {
        return Err(internal("a checked body is an object"));
    };
    let name = match o.get("execution_name") {
        None => {
            return Err(invalid(vec![verr(
                &[json!("body"), json!("execution_name")],
                "Field required",
                "missing",
                &v,
            )]));
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(invalid(vec![verr(
                &[json!("body"), json!("execution_name")],
                "Input should be a valid string",
                "string_type",
                other,
            )]));
        }
    };
    check_name("body", &name)?;
    Ok(name)
}

/// `?execution_name=`, required.
fn query_name(q: &HashMap<String, String>) -> Result<String, ApiError> {
    let Some(name) = q.get("execution_name") else {
        return Err(invalid(vec![verr(
            &[json!("query"), json!("execution_name")],
            "Field required",
            "missing",
            &Value::Null,
        )]));
    };
    check_name("query", name)?;
    Ok(name.clone())
}

/// `?cursor=`, a non-negative integer (default 0).
fn query_cursor(q: &HashMap<String, String>) -> Result<u64, ApiError> {
    let Some(c) = q.get("cursor") else {
        return Ok(0);
    };
    match c.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n as u64),
        Ok(_) => Err(query_error(
            "cursor",
            "Input should be greater than or equal to 0",
            "greater_than_equal",
            c,
        )),
        Err(_) => Err(query_error(
            "cursor",
            "Input should be a valid integer, unable to parse string as an integer",
            "int_parsing",
            c,
        )),
    }
}

/// `POST /local-sandbox/{id}/execution-upload-url`
pub async fn execution_upload_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    sandbox_of(&h, &headers, &id)?;
    h.uploads.check_exec_name(&id, &name)?;
    let url = signed_url(
        &h,
        &action("exec-upload", &name),
        &id,
        &format!("exec-upload/{id}/{name}"),
    );
    Ok(Json(json!({"upload_url": url, "expires_in_minutes": URL_MINUTES})).into_response())
}

/// `PUT {upload_url}`: stores an execution archive.
pub async fn exec_upload(
    State(h): State<Shared>,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> ApiResult {
    check_name("path", &name)?;
    let s = check_signed(&h, &action("exec-upload", &name), &id, &q)?;
    let total = h
        .uploads
        .store(&id, &s.owner, Kind::Exec(&name), body, || is_live(&h, &id))
        .await?;
    tracing::info!(sandbox = %id, execution = %name, bytes = total, "execution archive uploaded");
    Ok(StatusCode::OK.into_response())
}

/// `POST /local-sandbox/{id}/execute`: the stored archive to the agent,
/// then the run starts in the background.
pub async fn execute(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    let s = sandbox_of(&h, &headers, &id)?;
    let path = h.uploads.exec_path(&id, &name);
    let file = tokio::fs::File::open(&path).await.map_err(|_| {
        detail(
            StatusCode::NOT_FOUND,
            format!(
                "no archive uploaded for execution '{name}': get a URL from POST /local-sandbox/{id}/execution-upload-url and PUT a tar.gz holding main.py to it first"
            ),
        )
    })?;
    let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let c = agent_of(&h, &s).await?;
    let head = proto::ExecUploadRequest {
        msg: Some(proto::exec_upload_request::Msg::Header(
            proto::ExecUploadHeader {
                lease_id: id.clone(),
                execution_name: name.clone(),
                compression: proto::Compression::Auto as i32,
                size_hint: size,
            },
        )),
    };
    let chunks = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10).map(|c| {
        proto::ExecUploadRequest {
            msg: c.ok().map(proto::exec_upload_request::Msg::Chunk),
        }
    });
    let stream = futures_util::stream::iter([head]).chain(chunks);
    let up = c
        .exec()
        .upload(stream)
        .await
        .map_err(|e| agent_error("execute", e))?
        .into_inner();
    c.exec()
        .start(proto::ExecStartRequest {
            lease_id: id.clone(),
            execution_name: name.clone(),
        })
        .await
        .map_err(|e| agent_error("execute", e))?;
    let replaced = match (up.replaced, up.killed_running) {
        (_, true) => " (replacing a running execution of that name, which was killed)",
        (true, false) => " (replacing the previous execution of that name)",
        _ => "",
    };
    Ok(Json(json!({
        "message": format!("Execution '{name}' started in the background{replaced}; poll /execution-logs for its output"),
        "execution_name": name,
    }))
    .into_response())
}

/// `GET /local-sandbox/{id}/execution-status?execution_name=`
pub async fn execution_status(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    let name = query_name(&q)?;
    let s = sandbox_of(&h, &headers, &id)?;
    let st = agent_of(&h, &s)
        .await?
        .exec()
        .status(proto::ExecStatusRequest {
            lease_id: id,
            execution_name: name,
        })
        .await
        .map_err(|e| agent_error("execution-status", e))?
        .into_inner();
    Ok(Json(json!({"status": st.klavis_status})).into_response())
}

/// `GET /local-sandbox/{id}/execution-logs?execution_name=&cursor=`
pub async fn execution_logs(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    owner(&h, &headers)?;
    let name = query_name(&q)?;
    let cursor = query_cursor(&q)?;
    let s = sandbox_of(&h, &headers, &id)?;
    let r = agent_of(&h, &s)
        .await?
        .exec()
        .logs(proto::ExecLogsRequest {
            lease_id: id,
            execution_name: name,
            cursor,
            max_bytes: 0,
        })
        .await
        .map_err(|e| agent_error("execution-logs", e))?
        .into_inner();
    Ok(Json(json!({
        "status": r.klavis_status,
        "logs": r.logs,
        "cursor": r.next_cursor,
    }))
    .into_response())
}

/// `POST /local-sandbox/{id}/export-artifacts`
pub async fn export_artifacts(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    let s = sandbox_of(&h, &headers, &id)?;
    // An unknown execution is a 404 now, not a broken download later.
    agent_of(&h, &s)
        .await?
        .exec()
        .status(proto::ExecStatusRequest {
            lease_id: id.clone(),
            execution_name: name.clone(),
        })
        .await
        .map_err(|e| agent_error("export-artifacts", e))?;
    let url = signed_url(
        &h,
        &action("exec-export", &name),
        &id,
        &format!("exec-export/{id}/{name}"),
    );
    Ok(Json(json!({"download_url": url, "expires_in_minutes": URL_MINUTES})).into_response())
}

/// `GET {download_url}`: the execution directory as tar.gz.
pub async fn exec_download(
    State(h): State<Shared>,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<SignedQuery>,
) -> ApiResult {
    check_name("path", &name)?;
    let s = check_signed(&h, &action("exec-export", &name), &id, &q)?;
    let stream = agent_of(&h, &s)
        .await?
        .exec()
        .export(proto::ExecExportRequest {
            lease_id: id,
            execution_name: name.clone(),
        })
        .await
        .map_err(|e| agent_error("export-artifacts", e))?
        .into_inner();
    archive_response(stream, Some(&format!("{name}-artifacts.tar.gz")))
}
