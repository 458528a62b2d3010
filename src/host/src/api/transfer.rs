//! Workspace transfers: expiring signed URLs this host serves itself, the
//! archives they upload (into `uploads`), and the streams to and from the
//! agent.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;
use sandbox_client::proto;
use tracing::info;

use crate::error::{HostError, HostResult};

use super::Shared;
use super::common::{
    SignedQuery, URL_MINUTES, agent_of, archive_response, check_signed, is_live, owner, sandbox_of,
    signed_url, stored_chunks, stream_to_agent,
};
use super::model::{DownloadUrlResponse, InitializeResponse, UploadUrlResponse};
use super::uploads::Kind;
use super::validation::check_region;

/// The `message` of Klavis's initialize answer.
const KLAVIS_INITIALIZE_MESSAGE: &str = "Extracted archive from GCS to workspace";

/// `POST /local-sandbox/{id}/upload-url`
pub async fn upload_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<UploadUrlResponse>> {
    Ok(Json(UploadUrlResponse {
        upload_url: transfer_url(&h, &headers, &id, &q, "upload")?,
        expires_in_minutes: URL_MINUTES,
    }))
}

/// `GET /local-sandbox/{id}/dump`
pub async fn dump_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<DownloadUrlResponse>> {
    Ok(Json(DownloadUrlResponse {
        download_url: transfer_url(&h, &headers, &id, &q, "dump")?,
        expires_in_minutes: URL_MINUTES,
    }))
}

/// The signed URL for `action` on the caller's sandbox `id`.
fn transfer_url(
    h: &Shared,
    headers: &HeaderMap,
    id: &str,
    q: &HashMap<String, String>,
    action: &str,
) -> HostResult<String> {
    owner(h, headers)?;
    check_region(q)?;
    sandbox_of(h, headers, id)?;
    Ok(signed_url(h, action, id, &format!("{action}/{id}")))
}

/// `PUT {upload_url}`: stores the archive, streamed and bounded; a partial
/// upload never replaces the previous one.
pub async fn upload(
    State(h): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
    body: Body,
) -> HostResult<StatusCode> {
    let s = check_signed(&h, "upload", &id, &q)?;
    let total = h
        .uploads
        .store(&id, &s.owner, Kind::Workspace, body, || is_live(&h, &id))
        .await?;
    info!(sandbox = %id, bytes = total, "archive uploaded");
    Ok(StatusCode::OK)
}

/// `POST /local-sandbox/{id}/initialize`: streams the stored archive into
/// the agent.
pub async fn initialize(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> HostResult<Json<InitializeResponse>> {
    owner(&h, &headers)?;
    check_region(&q)?;
    let s = sandbox_of(&h, &headers, &id)?;
    let path = h.uploads.workspace_path(&id);
    let file = tokio::fs::File::open(&path).await.map_err(|_| {
        HostError::BadRequest(
            "no archive uploaded for this sandbox: PUT a tar.gz to the upload URL first".into(),
        )
    })?;
    let c = agent_of(&h, &s).await?;
    let header = proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Header(
            proto::InitializeHeader::default(),
        )),
    };
    let (chunks, failure) = stored_chunks(file);
    let chunks = chunks.map(|c| proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Chunk(c)),
    });
    let stream = futures_util::stream::iter([header]).chain(chunks);
    let mut workspace = c.workspace();
    let r = stream_to_agent("initialize", workspace.initialize(stream), failure).await?;
    info!(sandbox = %id, files = r.files, bytes = r.bytes_written, ms = r.duration_ms, "initialized");
    Ok(Json(InitializeResponse {
        sandbox_id: id,
        status: s.status,
        // Klavis's own text, word for word (clients may match on it); the
        // archive comes from this host's upload store, not from GCS.
        message: KLAVIS_INITIALIZE_MESSAGE.into(),
    }))
}

/// `GET {download_url}`: the agent's Dump, streamed as tar.gz.
pub async fn download(
    State(h): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
) -> HostResult<Response> {
    let s = check_signed(&h, "dump", &id, &q)?;
    let stream = agent_of(&h, &s)
        .await?
        .workspace()
        .dump(proto::DumpRequest {
            compression: proto::Compression::Gzip as i32,
            ..Default::default()
        })
        .await
        .map_err(HostError::agent("dump"))?
        .into_inner();
    archive_response(stream, None)
}
