//! `POST /local-sandbox/{server}/{id}/initialize?init_default_data=` and
//! `GET /local-sandbox/{server}/{id}/dump`: a server's own data (Klavis's
//! google_cloud, poste_email_toolathlon and canvas), through the agent's
//! `Servers.LoadData` / `DumpData`. A body is checked against Klavis's
//! model of the server's data first (`klavis_data`). The agent holds data
//! only for servers whose service it runs or reaches; the others answer
//! 501 naming why.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde_json::Value;

use crate::error::{HostError, HostResult};
use crate::store::SandboxRow;

use crate::api::Shared;
use crate::api::common::sandbox_of;
pub mod klavis;

use crate::api::model::{InitializeResponse, ServerDataDump};
use crate::api::sandbox::names;
use crate::api::validation;
use klavis as klavis_data;

/// The servers Klavis gives per-server data endpoints.
pub const DATA_SERVERS: [&str; 4] = [
    "google_cloud",
    "poste_email_toolathlon",
    "canvas",
    "localmemory",
];

fn check_server(server: &str, s: &SandboxRow) -> HostResult<()> {
    if !DATA_SERVERS.contains(&server) {
        return Err(HostError::NoRoute);
    }
    if !s.servers.iter().any(|sv| sv.name == server) {
        let names: Vec<&str> = s.servers.iter().map(|sv| sv.name.as_str()).collect();
        return Err(HostError::BadRequest(format!(
            "sandbox {} has no {server} server (it has: {}); acquire one with it",
            s.id,
            names.join(", ")
        )));
    }
    Ok(())
}

/// The body: the server's data document, or nothing (null or empty).
fn data_of(server: &str, body: &Bytes, default_data: bool) -> HostResult<Option<Value>> {
    if body.iter().all(u8::is_ascii_whitespace) || body.as_ref() == b"null" {
        if !default_data {
            return Err(HostError::BadRequest(format!(
                "no data to load: send the {server} data as the JSON body, or init_default_data=true"
            )));
        }
        return Ok(None);
    }
    let data = validation::body_object(body)?;
    klavis_data::check(server, &data)?;
    Ok(Some(data))
}

/// `POST /local-sandbox/{server}/{id}/initialize`
pub async fn initialize(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> HostResult<Json<InitializeResponse>> {
    let server = names::ours(&server).to_owned();
    let s = sandbox_of(&h, &headers, &id).await?;
    check_server(&server, &s)?;
    let default_data = validation::query_bool(&q, "init_default_data")?;
    let data = data_of(&server, &body, default_data)?;
    let summary = crate::lease::data::load(&h, &s, &server, data).await?;
    Ok(Json(InitializeResponse {
        sandbox_id: id,
        status: s.status,
        message: format!("{server} initialized: {summary}"),
    }))
}

/// `GET /local-sandbox/{server}/{id}/dump`
pub async fn dump(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((asked, id)): Path<(String, String)>,
) -> HostResult<Json<ServerDataDump<Value>>> {
    let server = names::ours(&asked).to_owned();
    let s = sandbox_of(&h, &headers, &id).await?;
    check_server(&server, &s)?;
    let (data, dumped_ms) = crate::lease::data::dump(&h, &s, &server).await?;
    let dumped_at = chrono::DateTime::from_timestamp_millis(dumped_ms as i64)
        .unwrap_or_else(chrono::Utc::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, false);
    Ok(Json(ServerDataDump {
        sandbox_id: id,
        // The name the path gave (`memory` for Toolathlon's memory).
        server_name: asked,
        dumped_at,
        data,
    }))
}
