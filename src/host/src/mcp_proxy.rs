//! `{public_url}/{server}/mcp/?local_sandbox_id={id}`: the MCP endpoints of
//! a sandbox, reverse-proxied to its agent's data plane with bodies
//! streamed both ways (SSE answers pass through as they are written).
//! Either the URL's `mcp_token` (a capability for that sandbox while it is
//! live) or the API key of the sandbox's owner admits a request.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use sandbox_client::mcp;

use crate::api::Shared;

fn detail(status: StatusCode, msg: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"detail": msg.into()})),
    )
        .into_response()
}

/// The router's fallback: MCP endpoints, else 404.
pub async fn proxy(State(h): State<Shared>, req: Request<Body>) -> Response {
    let Some(server) = mcp::server_of_path(req.uri().path()).map(str::to_owned) else {
        return detail(StatusCode::NOT_FOUND, "Not Found");
    };
    let id = req
        .uri()
        .query()
        .and_then(|q| url_param(q, "local_sandbox_id"));
    let Some(id) = id else {
        return detail(
            StatusCode::BAD_REQUEST,
            "the MCP URL needs ?local_sandbox_id=<id> (use mcp_server_url from the acquire answer)",
        );
    };
    let token = req
        .uri()
        .query()
        .and_then(|q| url_param(q, crate::api::MCP_TOKEN_PARAM));
    let s = match token {
        // The URL's capability: valid for this sandbox while it is live.
        Some(t) if !req.headers().contains_key(header::AUTHORIZATION) => {
            if !h.signer.check_token(crate::api::MCP_TOKEN_ACTION, &id, &t) {
                return detail(
                    StatusCode::UNAUTHORIZED,
                    "invalid MCP token: use the mcp_server_url of the acquire answer, or send Authorization: Bearer <api key>",
                );
            }
            match h.store.get_live(&id) {
                Ok(Some(s)) => s,
                Ok(None) => {
                    return detail(
                        StatusCode::NOT_FOUND,
                        format!("Local sandbox {id} not found (released?)"),
                    );
                }
                Err(e) => return detail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        _ => match crate::api::sandbox_of(&h, req.headers(), &id) {
            Ok(s) => s,
            Err(e) => return e.into_response(),
        },
    };
    if !s.servers.iter().any(|sv| sv.name == server) {
        return detail(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} has no server {server}"),
        );
    }
    let Some(slot) = h.pool.leased_slot(&s.slot) else {
        return detail(
            StatusCode::SERVICE_UNAVAILABLE,
            "the sandbox's agent is gone",
        );
    };
    let forwarded = sandbox_client::mcp_forward::forward(
        &slot.mcp_endpoint(),
        &format!("/{server}/mcp"),
        req,
        None,
        std::time::Duration::from_secs(5),
        &sandbox_client::transport::HvsockOptions::default(),
    )
    .await;
    match forwarded {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body.map_err(axum::Error::new)))
        }
        Err(e) => detail(
            StatusCode::BAD_GATEWAY,
            format!("the sandbox's MCP data plane: {e}"),
        ),
    }
}

fn url_param(query: &str, key: &str) -> Option<String> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}
