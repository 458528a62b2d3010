//! Klavis's MCP Sandbox API, `/sandbox/{server}`: what Klavis's Python
//! SDK and its integrations of Toolathlon, MCP_Atlas and MCP_Mark call.
//! One sandbox per server name, `local_dev` being the local sandbox
//! under its older name (the local servers together). The sandboxes are
//! those of `/local-sandbox` (one id space, one owner check, one list);
//! `local_dev`'s transfers and the per-server data are routed to the same
//! handlers (see `api::router`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;

use crate::error::{HostError, HostResult};
use crate::store::{SandboxRow, Status};

use crate::api::Shared;
use crate::api::common::{live_states, mcp_url, owner, sandbox_of};
use crate::api::model::{CreateSandboxResponse, McpSandboxInfo, SandboxStatusResponse};
use crate::lease;
pub mod names;

use crate::api::validation::parse_create;
use names::{Named, PUBLIC_DATA, resolve};

/// The host's servers, for [`resolve`]: those its sandboxes carry, or
/// before any has served, Klavis's local and public-data names (the agent
/// refuses the ones it lacks).
fn known(h: &Shared) -> Vec<String> {
    h.fleet.servers().unwrap_or_else(|| {
        crate::api::SERVER_NAMES
            .iter()
            .chain(PUBLIC_DATA)
            .map(|s| (*s).to_owned())
            .collect()
    })
}

/// `POST /sandbox/{server}`: a new sandbox holding the server (or
/// `local_dev`'s servers), its MCP URLs by server name.
pub async fn create(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path(server): Path<String>,
    body: axum::body::Bytes,
) -> HostResult<Json<CreateSandboxResponse>> {
    let who = owner(&h, &headers)?;
    let named = resolve(&server, &known(&h))?;
    let req = parse_create(&body, named.servers.clone(), named.local_dev)?;
    let new = lease::lease(&h, who, &req).await?;
    let row = &new.row;
    Ok(Json(CreateSandboxResponse {
        server_urls: server_urls(&h, row, &named),
        sandbox_id: row.id.clone(),
        server_name: named.answer_name,
        status: row.status,
        message: lease::acquire_message(&new),
        server_states: live_states(&h, row).await,
    }))
}

/// The sandbox's MCP URLs by server name; the server a path named under
/// another name (`memory`, `google-cloud`) is keyed by the name sent, as
/// Toolathlon looks its URL up by the name it asked for.
fn server_urls(
    h: &Shared,
    s: &SandboxRow,
    named: &Named,
) -> std::collections::BTreeMap<String, String> {
    let asked = |name: &str| match named.servers.as_slice() {
        [one] if !named.local_dev && one == name => named.answer_name.clone(),
        _ => name.to_owned(),
    };
    s.servers
        .iter()
        .map(|sv| (asked(&sv.name), mcp_url(h, &sv.name, &s.id)))
        .collect()
}

/// The caller's sandbox `id`, which must hold what `server` names.
async fn sandbox_named(
    h: &Shared,
    headers: &HeaderMap,
    server: &str,
    id: &str,
) -> HostResult<(SandboxRow, Named)> {
    let s = sandbox_of(h, headers, id).await?;
    let named = resolve(server, &known(h))?;
    let holds = |n: &String| s.servers.iter().any(|sv| &sv.name == n);
    if server != "local_dev" && !named.servers.iter().all(holds) {
        return Err(HostError::McpSandboxNotFound(id.to_owned()));
    }
    Ok((s, named))
}

/// `GET /sandbox/{server}/{id}`
pub async fn get(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> HostResult<Json<McpSandboxInfo>> {
    let (s, named) = sandbox_named(&h, &headers, &server, &id).await?;
    let urls = server_urls(&h, &s, &named);
    let server_url = match named.servers.as_slice() {
        [_] if !named.local_dev => urls.get(&named.answer_name).cloned(),
        _ => None,
    };
    Ok(Json(McpSandboxInfo {
        sandbox_id: s.id.clone(),
        server_url,
        server_urls: urls,
        server_name: named.answer_name,
        status: s.status,
        updated_at: s.updated_at.clone(),
        benchmark: s.benchmark.clone(),
        server_states: live_states(&h, &s).await,
    }))
}

/// `DELETE /sandbox/{server}/{id}`: released in the background, as on
/// `/local-sandbox`.
pub async fn delete(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> HostResult<Json<SandboxStatusResponse>> {
    let (s, _) = sandbox_named(&h, &headers, &server, &id).await?;
    lease::release_in_background(&h, &s, false).await;
    Ok(Json(SandboxStatusResponse {
        sandbox_id: id.clone(),
        status: Status::Idle,
        message: format!("Sandbox {id} released: it is being returned to the pool"),
    }))
}

/// `POST /sandbox/{server}/{id}/reset`
pub async fn reset(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> HostResult<Json<SandboxStatusResponse>> {
    let (s, _) = sandbox_named(&h, &headers, &server, &id).await?;
    let s = lease::reset(&h, s).await?;
    Ok(Json(SandboxStatusResponse {
        sandbox_id: s.id.clone(),
        status: s.status,
        message: format!("Sandbox {id} reset"),
    }))
}
