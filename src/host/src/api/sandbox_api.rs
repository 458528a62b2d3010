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
use serde_json::Value;

use crate::error::{HostError, HostResult};
use crate::store::{SandboxRow, Status};

use super::Shared;
use super::common::{mcp_url, owner, sandbox_of};
use super::leases;
use super::model::{CreateSandboxResponse, McpSandboxInfo, SandboxStatusResponse};
use super::validation::{parse_create, verr};

/// What `local_dev` holds: the local servers Klavis's integrations expect
/// in it (MCP_Atlas's list, and Toolathlon's `pdf-tools`).
pub const LOCAL_DEV: &[&str] = &[
    "filesystem",
    "git",
    "terminal",
    "desktop-commander",
    "arxiv",
    "excel",
    "word",
    "powerpoint",
    "code-executor",
    "code-runner",
    "pdf-tools",
];

/// Names the integrations send that mean a server of ours under another
/// name: (as sent, ours, Klavis's spelling if it has one).
const ALIASES: &[(&str, &str, Option<&str>)] = &[
    ("memory", "localmemory", Some("localmemory")),
    ("google-cloud", "google_cloud", Some("google_cloud")),
    ("emails", "poste_email_toolathlon", None),
    ("playwright_with_chunk", "playwright", None),
];

/// Klavis's names for servers backed by its own pre-made SaaS test
/// accounts, which a self-hosted sandbox cannot have.
const SAAS: &[&str] = &[
    "jira",
    "github",
    "salesforce",
    "hubspot",
    "notion",
    "airtable",
    "linear",
    "asana",
    "google_sheets",
    "google_drive",
    "google_docs",
    "gmail",
    "google_calendar",
    "google_forms",
    "clickup",
    "close",
    "monday",
    "motion",
    "onedrive",
    "microsoft_teams",
    "outlook_mail",
    "cal.com",
    "quickbooks",
    "moneybird",
    "dropbox",
    "shopify",
    "woocommerce",
    "outlook_calendar",
    "resend",
    "wordpress",
    "mem0",
    "supabase",
    "slack",
    "confluence",
    "discord",
    "snowflake",
    "postgres",
    "mongodb",
    "e2b",
    "weights_and_biases",
];

/// Klavis's names of servers that call public web APIs (no account).
const PUBLIC_DATA: &[&str] = &[
    "calculator",
    "clinicaltrialsgov",
    "us_weather",
    "context7",
    "met_museum",
    "open_library",
    "pubmed",
    "wikipedia",
    "osm",
    "whois",
    "arxiv_latex",
    "weather",
    "national_parks",
    "twelvedata",
    "lara_translate",
    "alchemy",
];

/// A `/sandbox/{server}` name, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The servers its sandbox holds (ours).
    pub servers: Vec<String>,
    /// The name answers carry: Klavis's spelling where it has one.
    pub answer_name: String,
}

/// Resolves a path's server name against what this host's sandboxes
/// carry (`known`): `local_dev`, a server of ours (under its name or an
/// integration's), else a clear error: 400 for names Klavis serves from
/// outside accounts or public-data servers this host does not carry, 422
/// (FastAPI's shape) for names nobody knows.
pub fn resolve(name: &str, known: &[String]) -> HostResult<Named> {
    let carries = |s: &str| known.iter().any(|k| k == s);
    if name == "local_dev" {
        let servers: Vec<String> = LOCAL_DEV
            .iter()
            .filter(|s| carries(s))
            .map(|s| (*s).to_owned())
            .collect();
        return Ok(Named {
            servers,
            answer_name: name.into(),
        });
    }
    let (ours, answer) = match ALIASES.iter().find(|(sent, _, _)| *sent == name) {
        Some((_, ours, klavis)) => (*ours, klavis.unwrap_or(name)),
        None => (name, name),
    };
    if carries(ours) {
        return Ok(Named {
            servers: vec![ours.to_owned()],
            answer_name: answer.to_owned(),
        });
    }
    if SAAS.contains(&name) {
        return Err(HostError::BadRequest(format!(
            "{name} is served by Klavis from its own test accounts of an outside service; this \
             self-hosted sandbox has none: use Klavis's API for it, or a local server"
        )));
    }
    if PUBLIC_DATA.contains(&name) || super::SERVER_NAMES.contains(&ours) {
        return Err(HostError::BadRequest(format!(
            "this host's sandboxes do not carry {name}; they carry: local_dev, {}",
            known.join(", ")
        )));
    }
    Err(HostError::Validation(vec![verr(
        &["path".into(), "server_name".into()],
        format!(
            "Input should be local_dev, one of this host's servers ({}) or a name of Klavis's \
             SandboxMcpServer",
            known.join(", ")
        ),
        "enum",
        &Value::from(name),
    )]))
}

/// The host's servers, for [`resolve`]: those its sandboxes carry, or
/// before any has served, Klavis's local and public-data names (the agent
/// refuses the ones it lacks).
fn known(h: &Shared) -> Vec<String> {
    h.pool.servers().unwrap_or_else(|| {
        super::SERVER_NAMES
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
    let req = parse_create(&body, named.servers.clone())?;
    let (row, skipped) = leases::lease(&h, who, &req).await?;
    Ok(Json(CreateSandboxResponse {
        server_urls: server_urls(&h, &row),
        sandbox_id: row.id.clone(),
        server_name: named.answer_name,
        status: row.status,
        message: leases::acquire_message(&row, &skipped),
    }))
}

/// The sandbox's MCP URLs by server name.
fn server_urls(h: &Shared, s: &SandboxRow) -> std::collections::BTreeMap<String, String> {
    s.servers
        .iter()
        .map(|sv| (sv.name.clone(), mcp_url(h, &sv.name, &s.id)))
        .collect()
}

/// The caller's sandbox `id`, which must hold what `server` names.
fn sandbox_named(
    h: &Shared,
    headers: &HeaderMap,
    server: &str,
    id: &str,
) -> HostResult<(SandboxRow, Named)> {
    let s = sandbox_of(h, headers, id)?;
    let named = resolve(server, &known(h))?;
    let holds = |n: &String| s.servers.iter().any(|sv| &sv.name == n);
    if server != "local_dev" && !named.servers.iter().all(holds) {
        return Err(HostError::SandboxNotFound(id.to_owned()));
    }
    Ok((s, named))
}

/// `GET /sandbox/{server}/{id}`
pub async fn get(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> HostResult<Json<McpSandboxInfo>> {
    let (s, named) = sandbox_named(&h, &headers, &server, &id)?;
    let urls = server_urls(&h, &s);
    let server_url = match named.servers.as_slice() {
        [one] if server != "local_dev" => urls.get(one).cloned(),
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
    }))
}

/// `DELETE /sandbox/{server}/{id}`: released in the background, as on
/// `/local-sandbox`.
pub async fn delete(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> HostResult<Json<SandboxStatusResponse>> {
    let (s, _) = sandbox_named(&h, &headers, &server, &id)?;
    leases::release_in_background(&h, &s, false);
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
    let (s, _) = sandbox_named(&h, &headers, &server, &id)?;
    let s = leases::reset(&h, s).await?;
    Ok(Json(SandboxStatusResponse {
        sandbox_id: s.id.clone(),
        status: s.status,
        message: format!("Sandbox {id} reset"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        ["filesystem", "git", "terminal", "localmemory", "playwright"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn names_resolve_as_the_integrations_send_them() {
        let r = resolve("local_dev", &known()).expect("local_dev");
        assert_eq!(r.servers, ["filesystem", "git", "terminal"]);
        let r = resolve("memory", &known()).expect("memory");
        assert_eq!(
            (r.servers[0].as_str(), r.answer_name.as_str()),
            ("localmemory", "localmemory")
        );
        let r = resolve("playwright_with_chunk", &known()).expect("alias");
        assert_eq!(
            (r.servers[0].as_str(), r.answer_name.as_str()),
            ("playwright", "playwright_with_chunk")
        );
        assert_eq!(resolve("git", &known()).expect("git").servers, ["git"]);
        // A public-data server the manifest carries: a sandbox of its own.
        let mut with = known();
        with.push("calculator".into());
        let r = resolve("calculator", &with).expect("calculator");
        assert_eq!(
            (r.servers, r.answer_name.as_str()),
            (vec!["calculator".to_owned()], "calculator")
        );
    }

    #[test]
    fn names_this_host_cannot_serve_are_refused_clearly() {
        match resolve("jira", &known()) {
            Err(HostError::BadRequest(m)) => assert!(m.contains("test accounts"), "{m}"),
            other => panic!("{other:?}"),
        }
        match resolve("wikipedia", &known()) {
            Err(HostError::BadRequest(m)) => assert!(m.contains("do not carry wikipedia"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve("nope", &known()),
            Err(HostError::Validation(_))
        ));
    }
}
