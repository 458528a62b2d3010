//! What the handlers share: who is asking, which sandbox and agent a
//! request names, the signed transfer URLs, the answer shapes of a
//! sandbox, and the streams between the upload store and an agent. The
//! handler modules import from here (and from `validation`, `uploads`,
//! `model`), never from each other.

use std::collections::{BTreeMap, HashSet};

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use futures_util::StreamExt;
use sandbox_client::proto;
use serde::Deserialize;

use super::model::{SandboxInfo, ServerItem, ServerState};
use crate::error::{HostError, HostResult};
use crate::lease::Host;
pub use crate::lease::stream::{stored_chunks, stream_to_agent};
pub use crate::lease::{agent_of, now_ms, timestamp};
use crate::signed::Invalid;
use crate::store::SandboxRow;

/// Lifetime of the signed transfer URLs.
pub const URL_MINUTES: u64 = 30;

/// The query parameter of the MCP URLs' capability token.
pub const MCP_TOKEN_PARAM: &str = "mcp_token";
/// What the capability token is signed for.
pub const MCP_TOKEN_ACTION: &str = "mcp";

fn unix_now() -> u64 {
    (now_ms() / 1000) as u64
}

/// The owner of the request's API key.
pub fn owner(h: &Host, headers: &HeaderMap) -> HostResult<String> {
    // The scheme is case-insensitive (RFC 9110 11.1): "bearer" works too.
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim());
    match key.and_then(|k| h.keys.get(k)) {
        Some(o) => Ok(o.clone()),
        None if key.is_none() => Err(HostError::NoKey),
        None => Err(HostError::BadKey),
    }
}

/// A live sandbox of the caller, or 404.
pub async fn sandbox_of(h: &Host, headers: &HeaderMap, id: &str) -> HostResult<SandboxRow> {
    let who = owner(h, headers)?;
    h.store
        .get(id, &who)
        .await?
        .ok_or_else(|| HostError::SandboxNotFound(id.to_owned()))
}

/// `<public_url>/transfer/<path>?<signature of action on sandbox id>`.
pub fn signed_url(h: &Host, action: &str, id: &str, path: &str) -> String {
    let expires = unix_now() + URL_MINUTES * 60;
    format!(
        "{}/transfer/{path}?{}",
        h.public_url,
        h.signer.sign(action, id, expires)
    )
}

#[derive(Deserialize)]
pub struct SignedQuery {
    expires: Option<u64>,
    signature: Option<String>,
}

/// The live sandbox a signed transfer URL names, or 403/404.
pub async fn check_signed(
    h: &Host,
    action: &str,
    id: &str,
    q: &SignedQuery,
) -> HostResult<SandboxRow> {
    let (Some(expires), Some(sig)) = (q.expires, q.signature.as_deref()) else {
        return Err(HostError::SignedUrl(
            "this URL is not signed; ask the API for one",
        ));
    };
    h.signer
        .verify(action, id, expires, sig, unix_now())
        .map_err(|e| {
            HostError::SignedUrl(match e {
                Invalid::Expired => "this signed URL has expired; ask the API for a new one",
                Invalid::BadSignature => "invalid signature",
            })
        })?;
    h.store
        .get_live(id)
        .await?
        .ok_or_else(|| HostError::SandboxNotFound(id.to_owned()))
}

/// Klavis's MCP URL, plus a capability token: whoever holds the URL may
/// use that sandbox's MCP servers (Klavis's notebooks call it without a
/// key) until the sandbox is released. The API key works as well.
pub fn mcp_url(h: &Host, server: &str, id: &str) -> String {
    format!(
        "{}/{server}/mcp/?local_sandbox_id={id}&{MCP_TOKEN_PARAM}={}",
        h.public_url,
        h.signer.token(MCP_TOKEN_ACTION, id)
    )
}

pub fn server_items(h: &Host, s: &SandboxRow) -> Vec<ServerItem> {
    s.servers
        .iter()
        .map(|sv| ServerItem {
            server_name: sv.name.clone(),
            id: sv.id.clone(),
            mcp_server_url: mcp_url(h, &sv.name, &s.id),
            status: s.status,
            benchmark: s.benchmark.clone(),
            updated_at: s.updated_at.clone(),
            metadata: None,
            auth_data: sv.auth_data.clone(),
            tags: None,
            state: None,
        })
        .collect()
}

/// How long an answer waits for the agent's list of server states; past
/// it (or when the agent cannot be reached) the states are left out.
const STATES_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Each server's process state, asked of the sandbox's agent; empty when
/// it does not answer within [`STATES_WITHIN`].
pub async fn live_states(h: &Host, s: &SandboxRow) -> BTreeMap<String, ServerState> {
    let ask = async {
        let c = agent_of(h, s, STATES_WITHIN).await.ok()?;
        let list = c
            .servers()
            .list(proto::ListServersRequest {})
            .await
            .ok()?
            .into_inner();
        Some(
            list.servers
                .into_iter()
                .filter(|sv| s.servers.iter().any(|r| r.name == sv.name))
                .filter_map(|sv| Some((sv.name, server_state(sv.state)?)))
                .collect(),
        )
    };
    tokio::time::timeout(STATES_WITHIN, ask)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// The answer's name of an agent's server state.
fn server_state(v: i32) -> Option<ServerState> {
    use proto::ServerState as P;
    Some(match P::try_from(v).ok()? {
        P::Idle => ServerState::Idle,
        P::Starting => ServerState::Starting,
        P::Ready => ServerState::Ready,
        P::Backoff => ServerState::Backoff,
        P::Failed => ServerState::Failed,
        P::Stopping => ServerState::Stopping,
        P::Stopped => ServerState::Stopped,
        P::Unspecified => return None,
    })
}

/// [`info`] with each server's live state.
pub async fn info_live(h: &Host, s: &SandboxRow) -> SandboxInfo {
    let mut i = info(h, s);
    let mut states = live_states(h, s).await;
    for sv in &mut i.servers {
        sv.state = states.remove(&sv.server_name);
    }
    i
}

pub fn info(h: &Host, s: &SandboxRow) -> SandboxInfo {
    SandboxInfo {
        local_sandbox_id: s.id.clone(),
        created_at: s.created_at.clone(),
        status: s.status,
        benchmark: s.benchmark.clone(),
        servers: server_items(h, s),
    }
}

/// An agent's archive stream (chunks, then a trailer) as a streamed
/// `application/gzip` answer; an error mid-stream breaks the body, so the
/// client never takes a truncated archive for a whole one.
pub fn archive_response(
    stream: tonic::Streaming<proto::DumpResponse>,
    filename: Option<&str>,
) -> HostResult<Response> {
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
    r.body(Body::from_stream(bytes))
        .map_err(|e| HostError::Internal(e.to_string()))
}

/// Where replicas share the leases (the kubernetes backend), before an
/// upload is counted: what this replica counts for `owner`'s sandboxes
/// that another replica released stops counting
/// (`Uploads::forget_released`), the live ones read from the store.
pub async fn forget_released_elsewhere(
    h: &super::Host,
    owner: &str,
) -> crate::error::HostResult<()> {
    if !h.fleet.shared() {
        return Ok(());
    }
    let live = h.store.list(Some(owner)).await?;
    let ids: HashSet<&str> = live.iter().map(|s| s.id.as_str()).collect();
    h.uploads.forget_released(owner, &ids);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use futures_util::Stream;

    /// A stand-in agent: reads the whole client stream, then answers how
    /// many chunks it got (as a real one takes a clean end for a whole
    /// archive).
    async fn agent(
        chunks: impl Stream<Item = Bytes>,
    ) -> Result<tonic::Response<usize>, tonic::Status> {
        Ok(tonic::Response::new(chunks.count().await))
    }

    #[tokio::test]
    async fn a_whole_archive_reaches_the_agent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.tar.gz");
        std::fs::write(&path, vec![7u8; 600 << 10]).expect("write");
        let (chunks, failure) = stored_chunks(tokio::fs::File::open(&path).await.expect("open"));
        let n = stream_to_agent("initialize", agent(chunks), failure)
            .await
            .expect("the call");
        assert!(n >= 3, "{n} chunks");
    }

    #[tokio::test]
    async fn a_read_error_fails_the_request_instead_of_ending_the_archive() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Reading a directory fails (EISDIR) on the first read.
        let file = tokio::fs::File::open(dir.path()).await.expect("open");
        let (chunks, failure) = stored_chunks(file);
        match stream_to_agent("initialize", agent(chunks), failure).await {
            Err(crate::lease::LeaseError::Internal(m)) => {
                assert!(m.contains("reading the uploaded archive"), "{m}")
            }
            Ok(n) => panic!("the agent took a {n}-chunk archive for whole"),
            Err(e) => panic!("{e}"),
        }
    }

    /// A bare HTTP/2 server standing in for the agent: reads a request body
    /// to its end and reports how it ended (cleanly, or reset).
    async fn body_ends() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use http_body_util::BodyExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let tx = tx.clone();
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let mut body = req.into_body();
                            let end = loop {
                                match body.frame().await {
                                    Some(Ok(_)) => continue,
                                    Some(Err(e)) => break format!("reset: {e}"),
                                    None => break "clean end".to_owned(),
                                }
                            };
                            let _ = tx.send(end);
                            // Never answers: the host decides.
                            std::future::pending::<
                                Result<hyper::Response<String>, std::convert::Infallible>,
                            >()
                            .await
                        }
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
                );
            }
        });
        (port, rx)
    }

    /// Over a real gRPC connection, the read error resets the call's
    /// stream: the agent sees an error, never a clean end it could take
    /// for a whole archive.
    #[tokio::test]
    async fn a_read_error_resets_the_agent_call() {
        let (port, mut ends) = body_ends().await;
        let c = sandbox_client::connect(&format!("tcp://127.0.0.1:{port}"))
            .await
            .expect("connect");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = tokio::fs::File::open(dir.path()).await.expect("open");
        let (chunks, failure) = stored_chunks(file);
        let header = proto::InitializeRequest {
            msg: Some(proto::initialize_request::Msg::Header(
                proto::InitializeHeader::default(),
            )),
        };
        let chunks = chunks.map(|c| proto::InitializeRequest {
            msg: Some(proto::initialize_request::Msg::Chunk(c)),
        });
        let stream = futures_util::stream::iter([header]).chain(chunks);
        let mut ws = c.workspace();
        let wait = std::time::Duration::from_secs(10);
        let r = tokio::time::timeout(
            wait,
            stream_to_agent("initialize", ws.initialize(stream), failure),
        )
        .await
        .expect("the request ends");
        assert!(
            matches!(r, Err(crate::lease::LeaseError::Internal(_))),
            "{r:?}"
        );
        let end = tokio::time::timeout(wait, ends.recv())
            .await
            .expect("the agent sees the stream end")
            .expect("an end");
        assert!(end.starts_with("reset"), "{end}");
    }
}
