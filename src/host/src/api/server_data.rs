//! `POST /local-sandbox/{server}/{id}/initialize?init_default_data=` and
//! `GET /local-sandbox/{server}/{id}/dump`: a server's own data (Klavis's
//! google_cloud, poste_email_toolathlon and canvas), through the agent's
//! `Servers.LoadData` / `DumpData`. The agent holds data only for servers
//! whose service it runs (the mail service); the others answer 501 naming
//! why.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use sandbox_client::proto;
use serde_json::{Value, json};
use tracing::info;

use super::sandboxes::agent_of;
use super::*;

/// The servers Klavis gives per-server data endpoints.
pub const DATA_SERVERS: [&str; 3] = ["google_cloud", "poste_email_toolathlon", "canvas"];

/// The largest dump the host takes from an agent (the agent's own
/// mail.max_data_bytes bounds it first).
const MAX_DUMP_BYTES: usize = 256 << 20;

fn check_server(server: &str, s: &crate::store::SandboxRow) -> Result<(), ApiError> {
    if !DATA_SERVERS.contains(&server) {
        return Err(detail(StatusCode::NOT_FOUND, "Not Found"));
    }
    if !s.servers.iter().any(|sv| sv.name == server) {
        let names: Vec<&str> = s.servers.iter().map(|sv| sv.name.as_str()).collect();
        return Err(detail(
            StatusCode::BAD_REQUEST,
            format!(
                "sandbox {} has no {server} server (it has: {}); acquire one with it",
                s.id,
                names.join(", ")
            ),
        ));
    }
    Ok(())
}

/// `POST /local-sandbox/{server}/{id}/initialize`
pub async fn initialize(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult {
    let s = sandbox_of(&h, &headers, &id)?;
    check_server(&server, &s)?;
    let default_data = validation::query_bool(&q, "init_default_data")?;
    // The body is PosteEmailData (or the other servers' shape) or null.
    let data: Value = if body.iter().all(u8::is_ascii_whitespace) || body.as_ref() == b"null" {
        Value::Null
    } else {
        validation::body_object(&body)?
    };
    if data.is_null() && !default_data {
        return Err(detail(
            StatusCode::BAD_REQUEST,
            format!(
                "no data to load: send the {server} data as the JSON body, or init_default_data=true"
            ),
        ));
    }
    let c = agent_of(&h, &s).await?;
    let r = c
        .servers()
        .load_data(proto::LoadDataRequest {
            server_name: server.clone(),
            json: if data.is_null() {
                String::new()
            } else {
                data.to_string()
            },
            default_data: default_data && data.is_null(),
        })
        .await
        .map_err(|e| agent_error(&format!("initializing {server}"), e))?
        .into_inner();
    info!(sandbox = %id, server = %server, summary = %r.summary, "server data loaded");
    Ok(Json(json!({
        "sandbox_id": id,
        "status": s.status,
        "message": format!("{server} initialized: {}", r.summary),
    }))
    .into_response())
}

/// `GET /local-sandbox/{server}/{id}/dump`
pub async fn dump(
    State(h): State<Shared>,
    headers: HeaderMap,
    Path((server, id)): Path<(String, String)>,
) -> ApiResult {
    let s = sandbox_of(&h, &headers, &id)?;
    check_server(&server, &s)?;
    let c = agent_of(&h, &s).await?;
    let r = c
        .servers()
        .max_decoding_message_size(MAX_DUMP_BYTES)
        .dump_data(proto::DumpDataRequest {
            server_name: server.clone(),
        })
        .await
        .map_err(|e| agent_error(&format!("dumping {server}"), e))?
        .into_inner();
    let data: Value = serde_json::from_str(&r.json).map_err(|e| {
        detail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the sandbox's {server} dump is not JSON: {e}"),
        )
    })?;
    let dumped_at = chrono::DateTime::from_timestamp_millis(r.dumped_at_ms as i64)
        .unwrap_or_else(chrono::Utc::now)
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, false);
    Ok(Json(json!({
        "sandbox_id": id,
        "server_name": server,
        "dumped_at": dumped_at,
        "data": data,
    }))
    .into_response())
}

/// A protobuf Struct as JSON.
pub fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => json!(*n as i64),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}
