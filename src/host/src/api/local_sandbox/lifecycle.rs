//! The `/local-sandbox` endpoints: acquire, list, get, reset and release.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};

use crate::error::HostResult;

use crate::api::Shared;
use crate::api::common::{info as sandbox_info, info_live, owner, sandbox_of};
use crate::api::model::{
    AcquireResponse, ListResponse, ReleaseResponse, ResetResponse, SandboxInfo,
};
use crate::api::validation::{is_ttl, parse_acquire};
use crate::lease;

/// `POST /local-sandbox`
pub async fn acquire(
    State(h): State<Shared>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> HostResult<(StatusCode, Json<AcquireResponse>)> {
    let who = owner(&h, &headers)?;
    let req = parse_acquire(&body)?;
    let new = lease::lease(&h, who, &req).await?;
    let row = &new.row;
    let SandboxInfo {
        local_sandbox_id,
        status,
        benchmark,
        servers,
        ..
    } = info_live(&h, row).await;
    let answer = AcquireResponse {
        local_sandbox_id,
        status,
        benchmark,
        servers,
        message: lease::acquire_message(&new),
    };
    Ok((StatusCode::CREATED, Json(answer)))
}

/// `GET /local-sandbox`
pub async fn list(State(h): State<Shared>, headers: HeaderMap) -> HostResult<Json<ListResponse>> {
    let who = owner(&h, &headers)?;
    let rows = h.store.list(Some(&who)).await?;
    let local_sandboxes: Vec<SandboxInfo> = rows.iter().map(|s| sandbox_info(&h, s)).collect();
    Ok(Json(ListResponse {
        total_count: local_sandboxes.len(),
        local_sandboxes,
    }))
}

/// `GET /local-sandbox/{id}`
pub async fn get(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> HostResult<Json<SandboxInfo>> {
    let s = sandbox_of(&h, &headers, &id).await?;
    Ok(Json(info_live(&h, &s).await))
}

/// `DELETE /local-sandbox/{id}?is_ttl=`
pub async fn release(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<ReleaseResponse>> {
    owner(&h, &headers)?;
    let is_ttl = is_ttl(&q)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    lease::release_in_background(&h, &s, is_ttl).await;
    Ok(Json(ReleaseResponse {
        message: format!(
            "Local sandbox release started for {id}: it will be released asynchronously in background."
        ),
    }))
}

/// `POST /local-sandbox/{id}/reset`
pub async fn reset(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> HostResult<Json<ResetResponse>> {
    let s = sandbox_of(&h, &headers, &id).await?;
    // Klavis declares any JSON object; the sandbox as it is after the
    // reset, which Klavis clients ignore, and a message.
    let s = lease::reset(&h, s).await?;
    Ok(Json(ResetResponse {
        sandbox: info_live(&h, &s).await,
        message: format!("Local sandbox {id} reset"),
    }))
}
