//! `{public_url}/{server}/mcp/?local_sandbox_id={id}`: the MCP endpoints of
//! a sandbox, reverse-proxied to its agent's data plane with bodies
//! streamed both ways (SSE answers pass through as they are written).
//! Either the URL's `mcp_token` (a capability for that sandbox while it is
//! live) or the API key of the sandbox's owner admits a request. The
//! request runs under its sandbox's lease: the agent is told which
//! (`sandbox_client::lease`) and refuses it once that lease has ended, and
//! the sandbox's Release or Reset stops it here, body and answer alike.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, header};
use axum::response::Response;
use http_body_util::BodyExt;

use sandbox_client::mcp;
use sandbox_client::mcp_forward::Upstream;

use crate::api::{Shared, inflight};
use crate::error::{HostError, HostResult};
use crate::store::SandboxRow;

/// The router's fallback: MCP endpoints, else 404.
pub async fn proxy(State(h): State<Shared>, req: Request<Body>) -> HostResult<Response> {
    let Some(server) = mcp::server_of_path(req.uri().path()).map(str::to_owned) else {
        return Err(HostError::NoRoute);
    };
    let s = admit(&h, req.uri(), req.headers()).await?;
    let id = &s.id;
    if !s.servers.iter().any(|sv| sv.name == server) {
        return Err(HostError::NotFound(format!(
            "sandbox {id} has no server {server}"
        )));
    }
    let slot = crate::lease::slot_of(&h, &s)?;
    let token = inflight::admit(&h, &s).await?;
    let up = Upstream {
        token: slot.mcp_token(),
        lease: Some(id),
    };
    let (endpoint, path) = (slot.mcp_endpoint(), format!("/{server}/mcp"));
    let hv = sandbox_client::transport::HvsockOptions::default();
    let timeout = std::time::Duration::from_secs(5);
    let forward = sandbox_client::mcp_forward::forward(&endpoint, &path, req, up, timeout, &hv);
    let resp = tokio::select! {
        r = forward => r.map_err(|e| HostError::DataPlane(format!("the sandbox's MCP data plane: {e}")))?,
        _ = token.cancelled() => return Err(inflight::ended(id)),
    };
    let (parts, body) = resp.into_parts();
    let body = Body::new(body.map_err(axum::Error::new));
    Ok(Response::from_parts(parts, inflight::body(body, token, id)))
}

/// The live sandbox the request may use: by the URL's `mcp_token` (when
/// it sends no key), else by its owner's API key.
async fn admit(
    h: &Shared,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> HostResult<SandboxRow> {
    let query = uri.query();
    let Some(id) = query.and_then(|q| url_param(q, "local_sandbox_id")) else {
        return Err(HostError::BadRequest(
            "the MCP URL needs ?local_sandbox_id=<id> (use mcp_server_url from the acquire answer)"
                .into(),
        ));
    };
    let token = query.and_then(|q| url_param(q, crate::api::MCP_TOKEN_PARAM));
    match token {
        // The URL's capability: valid for this sandbox while it is live.
        Some(t) if !headers.contains_key(header::AUTHORIZATION) => {
            if !h.signer.check_token(crate::api::MCP_TOKEN_ACTION, &id, &t) {
                return Err(HostError::BadMcpToken);
            }
            h.store.admit_live(&id).await?.ok_or_else(|| {
                HostError::NotFound(format!("Local sandbox {id} not found (released?)"))
            })
        }
        _ => crate::api::sandbox_of(h, headers, &id).await,
    }
}

fn url_param(query: &str, key: &str) -> Option<String> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}
