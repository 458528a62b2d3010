//! `/openapi.json`: the paths, parameters and request schemas written in
//! `openapi.json` beside this file, and every answer's and per-server
//! data document's schema generated from the types the handlers answer
//! with (`api::model`, `api::data::klavis`, `error`). A generated schema is
//! never also written by hand (a test checks), so the answers the document
//! declares are the answers the code gives.

mod pydantic;

use serde_json::Value;
use utoipa::OpenApi;

use crate::api::data::klavis::{CanvasData, GoogleCloudData, LocalMemoryData, PosteEmailData};
use crate::api::model::{
    AcquireResponse, CanvasDataOutput, CreateSandboxResponse, DownloadUrlResponse, ExecuteResponse,
    ExecutionLogsResponse, ExecutionStatusResponse, InitializeResponse, ListResponse,
    McpSandboxInfo, McpServerDataDump, PosteEmailDataOutput, ReleaseResponse, ResetResponse,
    SandboxInfo, SandboxStatusResponse, ServerDataDump, ServerItem, ServerState, UploadUrlResponse,
};
use crate::error::{ErrorBody, ValidationBody, ValidationItem};
use crate::store::Status;

#[derive(OpenApi)]
#[openapi(components(schemas(
    Status,
    ServerItem,
    ServerState,
    SandboxInfo,
    AcquireResponse,
    ListResponse,
    ResetResponse,
    ReleaseResponse,
    UploadUrlResponse,
    DownloadUrlResponse,
    InitializeResponse,
    ExecuteResponse,
    ExecutionStatusResponse,
    ExecutionLogsResponse,
    GoogleCloudData,
    PosteEmailData,
    CanvasData,
    ServerDataDump<GoogleCloudData>,
    ServerDataDump<PosteEmailDataOutput>,
    ServerDataDump<CanvasDataOutput>,
    LocalMemoryData,
    McpServerDataDump<GoogleCloudData>,
    McpServerDataDump<PosteEmailData>,
    McpServerDataDump<CanvasData>,
    McpServerDataDump<LocalMemoryData>,
    CreateSandboxResponse,
    McpSandboxInfo,
    SandboxStatusResponse,
    ErrorBody,
    ValidationBody,
    ValidationItem,
)))]
struct Generated;

/// The written part.
fn written() -> Value {
    // A unit test parses it: never fails at run time.
    serde_json::from_str(include_str!("openapi.json")).unwrap_or_default()
}

/// The generated schemas, by name, in the spelling of Klavis's document.
fn generated() -> serde_json::Map<String, Value> {
    let doc = Generated::openapi();
    let mut schemas = serde_json::to_value(doc.components)
        .ok()
        .and_then(|c| c.get("schemas").cloned())
        .unwrap_or_default();
    pydantic::respell(&mut schemas);
    schemas.as_object().cloned().unwrap_or_default()
}

/// The whole document.
pub fn document() -> Value {
    let mut doc = written();
    let schemas = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut);
    if let Some(schemas) = schemas {
        schemas.extend(generated());
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    out.push(r.clone());
                }
                o.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_and_no_answer_schema_is_written_by_hand() {
        let written = written();
        assert!(written.get("paths").is_some(), "{written}");
        let by_hand = written["components"]["schemas"]
            .as_object()
            .expect("written schemas");
        let made = generated();
        for name in made.keys() {
            assert!(
                !by_hand.contains_key(name),
                "{name} is generated from the code: remove it from openapi.json"
            );
        }
        let doc = document();
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(all.len() > 20, "{all:?}");
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").expect(&r);
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{r} does not resolve"
            );
        }
    }

    #[test]
    fn the_answers_are_declared_with_the_generated_schemas() {
        let doc = document();
        let answer = |path: &str, method: &str, code: &str| {
            doc["paths"][path][method]["responses"][code]["content"]["application/json"]["schema"]
                ["$ref"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(
            answer("/local-sandbox", "post", "201"),
            "#/components/schemas/AcquireLocalSandboxResponse"
        );
        assert_eq!(
            answer(
                "/local-sandbox/google_cloud/{sandbox_id}/dump",
                "get",
                "200"
            ),
            "#/components/schemas/DumpSandboxResponse_GoogleCloudData"
        );
        let dump = &doc["components"]["schemas"]["DumpSandboxResponse_GoogleCloudData"];
        let data = &dump["properties"]["data"]["properties"];
        assert!(
            data.get("datasets").is_some() && data.get("instances").is_some(),
            "{dump}"
        );
        let body =
            &doc["paths"]["/local-sandbox/canvas/{sandbox_id}/initialize"]["post"]["requestBody"];
        assert!(
            body.to_string().contains("#/components/schemas/CanvasData"),
            "{body}"
        );
    }
}
