//! Workspace transfers: expiring signed URLs this host serves itself, the
//! archives they upload (into `uploads`), and the streams to and from the
//! agent.

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use sandbox_client::proto;
use tracing::info;

use crate::error::{HostError, HostResult};

use crate::api::common::{
    SignedQuery, URL_MINUTES, agent_of, archive_response, check_signed, owner, sandbox_of,
    signed_url, stored_chunks, stream_to_agent,
};
use crate::api::model::{DownloadUrlResponse, InitializeResponse, UploadUrlResponse};
use crate::api::validation::check_region;
use crate::api::{Shared, inflight};
use crate::uploads::Kind;

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
        upload_url: transfer_url(&h, &headers, &id, &q, "upload").await?,
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
        download_url: transfer_url(&h, &headers, &id, &q, "dump").await?,
        expires_in_minutes: URL_MINUTES,
    }))
}

/// The signed URL for `action` on the caller's sandbox `id`.
async fn transfer_url(
    h: &Shared,
    headers: &HeaderMap,
    id: &str,
    q: &HashMap<String, String>,
    action: &str,
) -> HostResult<String> {
    owner(h, headers)?;
    check_region(q)?;
    sandbox_of(h, headers, id).await?;
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
    let s = check_signed(&h, "upload", &id, &q).await?;
    crate::api::common::forget_released_elsewhere(&h, &s.owner).await?;
    let total = h
        .uploads
        .store(
            &id,
            &s.owner,
            Kind::Workspace,
            body.into_data_stream(),
            || h.store.live_now(&id),
        )
        .await?;
    info!(sandbox = %id, bytes = total, "archive uploaded");
    Ok(StatusCode::OK)
}

/// `POST /local-sandbox/{id}/initialize` (and `/sandbox/local_dev/{id}/…`):
/// streams the stored archive into the agent; or, when the body is
/// `multipart/form-data` (the SDK's `initialize_local_dev`), its `files`
/// parts, each at the workspace path its filename names.
pub async fn initialize(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> HostResult<Json<InitializeResponse>> {
    owner(&h, &headers)?;
    check_region(&q)?;
    let s = sandbox_of(&h, &headers, &id).await?;
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("multipart/form-data"));
    // Under the sandbox's lease: a body still arriving when it ends is
    // stopped, and the agent refuses the archive (it names that lease).
    let r = inflight::run(&h, &s, async {
        if multipart {
            let archive = files_archive(req, h.uploads.limits().multipart_bytes).await?;
            let c = agent_of(&h, &s, h.fleet.deadlines().transfer).await?;
            let (chunks, failure) = chunked(archive);
            send_archive(&c, chunks, failure).await
        } else {
            let path = h.uploads.workspace_path(&id);
            let file = tokio::fs::File::open(&path).await.map_err(|_| {
                HostError::BadRequest(
                    "no archive uploaded for this sandbox: PUT a tar.gz to the upload URL first"
                        .into(),
                )
            })?;
            let c = agent_of(&h, &s, h.fleet.deadlines().transfer).await?;
            let (chunks, failure) = stored_chunks(file);
            send_archive(&c, chunks, failure).await
        }
    })
    .await?;
    info!(sandbox = %id, files = r.files, bytes = r.bytes_written, ms = r.duration_ms, "initialized");
    Ok(Json(InitializeResponse {
        sandbox_id: id,
        status: s.status,
        // Klavis's own text, word for word (clients may match on it); the
        // archive comes from this host, not from GCS.
        message: KLAVIS_INITIALIZE_MESSAGE.into(),
    }))
}

/// The agent's Initialize (replace) fed by `chunks`.
async fn send_archive(
    c: &sandbox_client::Client,
    chunks: impl futures_util::Stream<Item = axum::body::Bytes> + Send + 'static,
    failure: tokio::sync::oneshot::Receiver<std::io::Error>,
) -> HostResult<proto::InitializeResponse> {
    let header = proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Header(
            proto::InitializeHeader::default(),
        )),
    };
    let chunks = chunks.map(|c| proto::InitializeRequest {
        msg: Some(proto::initialize_request::Msg::Chunk(c)),
    });
    let stream = futures_util::stream::iter([header]).chain(chunks);
    let mut workspace = c.workspace();
    Ok(stream_to_agent("initialize", workspace.initialize(stream), failure).await?)
}

/// An archive in memory as agent-sized chunks (nothing can fail reading it).
fn chunked(
    archive: Vec<u8>,
) -> (
    impl futures_util::Stream<Item = axum::body::Bytes> + Send + 'static,
    tokio::sync::oneshot::Receiver<std::io::Error>,
) {
    let archive = axum::body::Bytes::from(archive);
    let parts: Vec<axum::body::Bytes> = (0..archive.len())
        .step_by(CHUNK_BYTES)
        .map(|at| archive.slice(at..archive.len().min(at + CHUNK_BYTES)))
        .collect();
    // The sender goes at once: no read failure can come.
    let (_, failure) = tokio::sync::oneshot::channel();
    (futures_util::stream::iter(parts), failure)
}

/// The agent's largest chunk.
const CHUNK_BYTES: usize = 256 << 10;

/// The `files` parts of a multipart body as one tar archive, each at its
/// filename (the agent's extractor confines and checks every path), at
/// most `limit` bytes of files in all.
async fn files_archive(req: Request, limit: u64) -> HostResult<Vec<u8>> {
    let bad = |e: axum::extract::multipart::MultipartError| {
        HostError::BadRequest(format!("reading the multipart body: {}", e.body_text()))
    };
    let mut form = Multipart::from_request(req, &())
        .await
        .map_err(|e| HostError::BadRequest(format!("a multipart body: {}", e.body_text())))?;
    let mut tar = tar::Builder::new(Vec::new());
    let (mut total, mut count) = (0u64, 0usize);
    while let Some(mut field) = form.next_field().await.map_err(bad)? {
        if field.name() != Some("files") {
            continue;
        }
        let Some(name) = field.file_name().map(str::to_owned) else {
            return Err(HostError::BadRequest(
                "a files part without a filename: each part's filename is its path in the workspace"
                    .into(),
            ));
        };
        let mut data = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(bad)? {
            total += chunk.len() as u64;
            if total > limit {
                return Err(HostError::Upload(
                    crate::uploads::UploadError::MultipartTooLarge { limit },
                ));
            }
            data.extend_from_slice(&chunk);
        }
        let mut head = tar::Header::new_gnu();
        head.set_size(data.len() as u64);
        head.set_mode(0o644);
        head.set_mtime(crate::api::common::now_ms() as u64 / 1000);
        tar.append_data(&mut head, name.trim_start_matches('/'), data.as_slice())
            .map_err(|e| HostError::BadRequest(format!("the file {name:?}: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(HostError::BadRequest(
            "no files parts: send the workspace's files as multipart parts named files".into(),
        ));
    }
    tar.into_inner()
        .map_err(|e| HostError::Internal(format!("packing the files: {e}")))
}

/// `GET {download_url}`: the agent's Dump, streamed as tar.gz.
pub async fn download(
    State(h): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<SignedQuery>,
) -> HostResult<Response> {
    let s = check_signed(&h, "dump", &id, &q).await?;
    let token = inflight::admit(&h, &s).await?;
    let dump = async {
        agent_of(&h, &s, h.fleet.deadlines().transfer)
            .await?
            .workspace()
            .dump(proto::DumpRequest {
                compression: proto::Compression::Gzip as i32,
                ..Default::default()
            })
            .await
            .map_err(HostError::agent("dump"))
    };
    let stream = tokio::select! {
        r = dump => r?.into_inner(),
        _ = token.cancelled() => return Err(inflight::ended(&id)),
    };
    Ok(inflight::response(
        archive_response(stream, None)?,
        token,
        &id,
    ))
}
