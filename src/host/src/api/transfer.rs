//! Workspace transfers: expiring signed URLs this host serves itself, the
//! archives they upload (into `uploads`), and the streams to and from the
//! agent.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbox_client::proto;
use serde::Deserialize;
use serde_json::json;

/// The `message` of Klavis's initialize answer.
const KLAVIS_INITIALIZE_MESSAGE: &str = "Extracted archive from GCS to workspace";
use tracing::info;

use crate::signed::Invalid;
use crate::store::SandboxRow;

use super::*;

use super::sandboxes::agent_of;
use super::uploads::Kind;
use super::validation::check_region;

fn unix_now() -> u64 {
    (now_ms() / 1000) as u64
}

/// `<public_url>/transfer/<path>?<signature of action on sandbox id>`.
pub(super) fn signed_url(h: &Host, action: &str, id: &str, path: &str) -> String {
    let expires = unix_now() + URL_MINUTES * 60;
    format!(
        "{}/transfer/{path}?{}",
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
    transfer_url(&h, &headers, &id, &q, "upload", "upload_url")
}

/// `GET /local-sandbox/{id}/dump`
pub async fn dump_url(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    transfer_url(&h, &headers, &id, &q, "dump", "download_url")
}

/// `{<key>: <signed URL for action>, "expires_in_minutes"}` for the caller's
/// sandbox `id`.
fn transfer_url(
    h: &Host,
    headers: &HeaderMap,
    id: &str,
    q: &HashMap<String, String>,
    action: &str,
    key: &str,
) -> ApiResult {
    owner(h, headers)?;
    check_region(q)?;
    sandbox_of(h, headers, id)?;
    Ok(
        Json(json!({key: signed_url(h, action, id, &format!("{action}/{id}")), "expires_in_minutes": URL_MINUTES}))
            .into_response(),
    )
}

#[derive(Deserialize)]
pub struct SignedQuery {
    expires: Option<u64>,
    signature: Option<String>,
}

/// The live sandbox a signed transfer URL names, or 403/404.
pub(super) fn check_signed(
    h: &Host,
    action: &str,
    id: &str,
    q: &SignedQuery,
) -> Result<SandboxRow, ApiError> {
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
    let s = check_signed(&h, "upload", &id, &q)?;
    let total = h
        .uploads
        .store(&id, &s.owner, Kind::Workspace, body, || is_live(&h, &id))
        .await?;
    info!(sandbox = %id, bytes = total, "archive uploaded");
    Ok(StatusCode::OK.into_response())
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
    let path = h.uploads.workspace_path(&id);
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
    info!(sandbox = %id, files = r.files, bytes = r.bytes_written, ms = r.duration_ms, "initialized");
    Ok(Json(json!({
        "sandbox_id": id,
        "status": s.status,
        // Klavis's own text, word for word (clients may match on it); the
        // archive comes from this host's upload store, not from GCS.
        "message": KLAVIS_INITIALIZE_MESSAGE,
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
    archive_response(stream, None)
}

/// An agent's archive stream (chunks, then a trailer) as a streamed
/// `application/gzip` answer; an error mid-stream breaks the body, so the
/// client never takes a truncated archive for a whole one.
pub(super) fn archive_response(
    stream: tonic::Streaming<proto::DumpResponse>,
    filename: Option<&str>,
) -> ApiResult {
    let bytes = stream.filter_map(|m| async move {
        match m {
            Ok(proto::DumpResponse {
                msg: Some(proto::dump_response::Msg::Chunk(b)),
            }) => Some(Ok::<_, std::io::Error>(b)),
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e.message().to_owned()))),
        }
    });
    let mut r = Response::builder().header(header::CONTENT_TYPE, "application/gzip");
    if let Some(f) = filename {
        r = r.header(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{f}\""),
        );
    }
    r.body(Body::from_stream(bytes)).map_err(internal)
}
