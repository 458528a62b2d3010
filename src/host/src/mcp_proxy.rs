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
use hyper_util::rt::TokioIo;

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
    let (parts, body) = req.into_parts();
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(format!("/{server}/mcp"))
        .header(header::HOST, "localhost");
    for (k, v) in &parts.headers {
        // Not the hop-by-hop headers, the client's Host, nor the API key
        // (the agent's data plane has its own rules).
        if !mcp::NOT_FORWARDED.contains(&k.as_str()) {
            up = up.header(k, v);
        }
    }
    let up = match up.body(body) {
        Ok(r) => r,
        Err(e) => return detail(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let sock = match sandbox_client::transport::dial(
        &slot.mcp_endpoint(),
        std::time::Duration::from_secs(5),
        &sandbox_client::transport::HvsockOptions::default(),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            return detail(
                StatusCode::BAD_GATEWAY,
                format!("the sandbox's MCP data plane: {e}"),
            );
        }
    };
    let (mut send, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(sock)).await {
        Ok(x) => x,
        Err(e) => return detail(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    tokio::spawn(conn);
    match send.send_request(up).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let mut r = Response::from_parts(parts, Body::new(body.map_err(axum::Error::new)));
            for h in ["connection", "keep-alive", "transfer-encoding"] {
                r.headers_mut().remove(h);
            }
            r
        }
        Err(e) => detail(StatusCode::BAD_GATEWAY, e.to_string()),
    }
}

fn url_param(query: &str, key: &str) -> Option<String> {
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}
