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
use axum::response::Response;
use serde_json::Value;

use crate::error::{HostError, HostResult};

use crate::api::common::{
    SignedQuery, URL_MINUTES, archive_response, check_signed, owner, sandbox_of, signed_url,
};
use crate::api::model::{
    DownloadUrlResponse, ExecuteResponse, ExecutionLogsResponse, ExecutionStatusResponse,
    UploadUrlResponse,
};
use crate::api::validation::{body_object, check_region, query_error, verr};
use crate::api::{Shared, inflight};
use crate::lease::executions;
use crate::uploads::Kind;

/// The signed-URL action for an execution `name` (the signature binds it).
fn action(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// Klavis's execution names are free strings; the agent takes
/// `[A-Za-z0-9._-]{1,128}`. Others are refused here with the 422 shape.
fn check_name(loc: &str, name: &str) -> HostResult<()> {
    if sandbox_client::limits::valid_execution_name(name) {
        return Ok(());
    }
    let msg = "String should match pattern '^[A-Za-z0-9._-]{1,128}$' (not '.' or '..')";
    Err(HostError::Validation(vec![verr(
        &[loc.into(), "execution_name".into()],
        msg,
        "string_pattern_mismatch",
        &Value::from(name),
    )]))
}

/// A name no execution can have names none: 404, as any other execution
/// the sandbox does not have (Klavis's schema takes any string there).
fn existing_name(name: &str, id: &str) -> HostResult<()> {
    if sandbox_client::limits::valid_execution_name(name) {
        return Ok(());
    }
    Err(HostError::NotFound(format!(
        "sandbox {id} has no execution named {name:?}"
    )))
}

/// `{"execution_name": str}`, checked as the Klavis (pydantic) models are
/// (the name's pattern is the caller's to check).
fn body_name(body: &Bytes) -> HostResult<String> {
    let v = body_object(body)?;
    let Some(o) = v.as_object() else {
        return Err(HostError::Internal("a checked body is an object".into()));
    };
    let name = match o.get("execution_name") {
        None => {
            return Err(HostError::Validation(vec![verr(
                &["body".into(), "execution_name".into()],
                "Field required",
                "missing",
                &v,
            )]));
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(HostError::Validation(vec![verr(
                &["body".into(), "execution_name".into()],
                "Input should be a valid string",
                "string_type",
                other,
            )]));
        }
    };
    Ok(name)
}

/// `?execution_name=`, required.
fn query_name(q: &HashMap<String, String>) -> HostResult<String> {
    let Some(name) = q.get("execution_name") else {
        return Err(HostError::Validation(vec![verr(
            &["query".into(), "execution_name".into()],
            "Field required",
            "missing",
            &Value::Null,
        )]));
    };
    Ok(name.clone())
}

/// `?cursor=`, a non-negative integer (default 0).
fn query_cursor(q: &HashMap<String, String>) -> HostResult<u64> {
    let Some(c) = q.get("cursor") else {
        return Ok(0);
    };
    let digits = c.trim().trim_start_matches('+');
    match c.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n as u64),
        // Past any log (pydantic's integers have no bound), answered as
        // any cursor past the end is.
        Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(u64::MAX),
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
) -> HostResult<Json<UploadUrlResponse>> {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    check_name("body", &name)?;
    sandbox_of(&h, &headers, &id).await?;
    h.uploads.check_exec_name(&id, &name)?;
    let url = signed_url(
        &h,
        &action("exec-upload", &name),
        &id,
        &format!("exec-upload/{id}/{name}"),
    );
    Ok(Json(UploadUrlResponse {
        upload_url: url,
        expires_in_minutes: URL_MINUTES,
    }))
}

/// `PUT {upload_url}`: stores an execution archive.
pub async fn exec_upload(
    State(h): State<Shared>,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> HostResult<StatusCode> {
    check_name("path", &name)?;
    let s = check_signed(&h, &action("exec-upload", &name), &id, &q).await?;
    crate::api::common::forget_released_elsewhere(&h, &s.owner).await?;
    let total = h
        .uploads
        .store(
            &id,
            &s.owner,
            Kind::Exec(&name),
            body.into_data_stream(),
            || h.store.live_now(&id),
        )
        .await?;
    tracing::info!(sandbox = %id, execution = %name, bytes = total, "execution archive uploaded");
    Ok(StatusCode::OK)
}

/// `POST /local-sandbox/{id}/execute`: the stored archive to the agent,
/// then the run starts in the background.
pub async fn execute(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> HostResult<Json<ExecuteResponse>> {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    // Never uploaded, as no upload URL is given for such a name.
    existing_name(&name, &id)?;
    let file = stored_archive(&h, &id, &name).await?;
    let up = executions::start(&h, &s, &name, file).await?;
    let replaced = match (up.replaced, up.killed_running) {
        (_, true) => " (replacing a running execution of that name, which was killed)",
        (true, false) => " (replacing the previous execution of that name)",
        _ => "",
    };
    Ok(Json(ExecuteResponse {
        message: format!(
            "Execution '{name}' started in the background{replaced}; poll /execution-logs for its output"
        ),
        execution_name: name,
    }))
}

/// Execution `name`'s archive in the upload store, or 404.
async fn stored_archive(h: &Shared, id: &str, name: &str) -> HostResult<tokio::fs::File> {
    let path = h.uploads.exec_path(id, name);
    tokio::fs::File::open(&path).await.map_err(|_| {
        HostError::NotFound(format!(
            "no archive uploaded for execution '{name}': get a URL from POST /local-sandbox/{id}/execution-upload-url and PUT a tar.gz holding main.py to it first"
        ))
    })
}

/// `GET /local-sandbox/{id}/execution-status?execution_name=`
pub async fn execution_status(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<ExecutionStatusResponse>> {
    owner(&h, &headers)?;
    let name = query_name(&q)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    existing_name(&name, &id)?;
    let st = executions::status(&h, &s, &name, "execution-status").await?;
    Ok(Json(ExecutionStatusResponse {
        status: st.klavis_status,
    }))
}

/// `GET /local-sandbox/{id}/execution-logs?execution_name=&cursor=`
pub async fn execution_logs(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<ExecutionLogsResponse>> {
    owner(&h, &headers)?;
    let name = query_name(&q)?;
    let cursor = query_cursor(&q)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    existing_name(&name, &id)?;
    let r = executions::logs(&h, &s, &name, cursor).await?;
    Ok(Json(ExecutionLogsResponse {
        status: r.klavis_status,
        logs: r.logs,
        cursor: r.next_cursor,
    }))
}

/// `POST /local-sandbox/{id}/export-artifacts`
pub async fn export_artifacts(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> HostResult<Json<DownloadUrlResponse>> {
    owner(&h, &headers)?;
    check_region(&q)?;
    let name = body_name(&body)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    existing_name(&name, &id)?;
    // An unknown execution is a 404 now, not a broken download later.
    executions::status(&h, &s, &name, "export-artifacts").await?;
    let url = signed_url(
        &h,
        &action("exec-export", &name),
        &id,
        &format!("exec-export/{id}/{name}"),
    );
    Ok(Json(DownloadUrlResponse {
        download_url: url,
        expires_in_minutes: URL_MINUTES,
    }))
}

/// `GET {download_url}`: the execution directory as tar.gz.
pub async fn exec_download(
    State(h): State<Shared>,
    Path((id, name)): Path<(String, String)>,
    Query(q): Query<SignedQuery>,
) -> HostResult<Response> {
    check_name("path", &name)?;
    let s = check_signed(&h, &action("exec-export", &name), &id, &q).await?;
    let token = inflight::admit(&h, &s).await?;
    let stream = executions::export(&h, &s, &name).await?.into_inner();
    let resp = archive_response(stream, Some(&format!("{name}-artifacts.tar.gz")))?;
    Ok(inflight::response(resp, token, &id))
}
