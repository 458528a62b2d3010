//! Every answer of the API, as Klavis's document names and shapes it.
//! These types are the only way a handler answers, and they generate the
//! schemas of `/openapi.json` (see `crate::openapi`), so the document and
//! the code cannot drift.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::store::Status;

/// One server of a sandbox (`LocalSandboxServerItem`). Its schema is
/// Klavis's, field for field (only `id` required, the rest nullable),
/// though this host always sends them.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LocalSandboxServerItem)]
pub struct ServerItem {
    #[schema(required = false, nullable)]
    pub server_name: String,
    pub id: String,
    /// The server's streamable-HTTP MCP URL; its `mcp_token` admits the
    /// holder until the sandbox is released.
    #[schema(required = false, nullable)]
    pub mcp_server_url: String,
    #[schema(required = false, nullable)]
    pub status: Status,
    #[schema(required = false)]
    pub benchmark: Option<String>,
    #[schema(required = false, nullable)]
    pub updated_at: String,
    #[schema(required = false, schema_with = any_object_or_null)]
    pub metadata: Option<Value>,
    /// What the sandbox gave the server to reach a service it runs (the
    /// mail account).
    #[schema(required = false, schema_with = any_object_or_null)]
    pub auth_data: Option<Value>,
    #[schema(required = false)]
    pub tags: Option<Vec<String>>,
    /// This host's addition, sent but not in Klavis's schema: the server's
    /// process state (`idle`, `starting`, `ready`, `backoff`, `failed`,
    /// `stopping`, `stopped`), where the answer asked the sandbox
    /// (Acquire, Get, Reset; not List).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub state: Option<ServerState>,
}

/// Any JSON object, or null (pydantic's `Optional[Dict[str, Any]]`).
pub fn any_object_or_null() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            utoipa::openapi::Type::Object,
            utoipa::openapi::Type::Null,
        ]))
        .additional_properties(Some(
            utoipa::openapi::schema::AdditionalProperties::FreeForm(true),
        ))
        .build()
}

/// Any JSON object (pydantic's `Dict[str, Any]`).
pub fn any_object() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::Object)
        .additional_properties(Some(
            utoipa::openapi::schema::AdditionalProperties::FreeForm(true),
        ))
        .build()
}

/// A server's process state (this host's addition to Klavis's shapes):
/// `idle` is a server of a lazy lease not started yet, which its first MCP
/// request starts (`--server-start`); `failed` is Klavis's `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    Idle,
    Starting,
    Ready,
    Backoff,
    Failed,
    Stopping,
    Stopped,
}

/// `PosteEmailData` as Klavis's dump declares it (`PosteEmailData-Output`):
/// any object (the data is a `PosteEmailData`).
pub struct PosteEmailDataOutput;

/// `CanvasData` as Klavis's dump declares it (`CanvasData-Output`): any
/// object (the data is a `CanvasData`).
pub struct CanvasDataOutput;

impl utoipa::PartialSchema for PosteEmailDataOutput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        any_object().into()
    }
}

impl ToSchema for PosteEmailDataOutput {
    fn name() -> std::borrow::Cow<'static, str> {
        "PosteEmailData-Output".into()
    }
}

impl utoipa::PartialSchema for CanvasDataOutput {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        any_object().into()
    }
}

impl ToSchema for CanvasDataOutput {
    fn name() -> std::borrow::Cow<'static, str> {
        "CanvasData-Output".into()
    }
}

/// A list of any JSON objects, or null.
pub fn objects_or_null() -> utoipa::openapi::schema::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            utoipa::openapi::Type::Array,
            utoipa::openapi::Type::Null,
        ]))
        .items(any_object())
        .build()
}

/// `GET /local-sandbox/{id}` (`LocalSandboxInfo`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LocalSandboxInfo)]
pub struct SandboxInfo {
    pub local_sandbox_id: String,
    pub created_at: String,
    #[schema(required = false, nullable)]
    pub status: Status,
    #[schema(required = false)]
    pub benchmark: Option<String>,
    pub servers: Vec<ServerItem>,
}

/// `POST /local-sandbox` (`AcquireLocalSandboxResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AcquireLocalSandboxResponse)]
pub struct AcquireResponse {
    pub local_sandbox_id: String,
    #[schema(required = false, nullable)]
    pub status: Status,
    #[schema(required = false)]
    pub benchmark: Option<String>,
    pub servers: Vec<ServerItem>,
    /// The servers started, and those of ALL not started with why.
    #[schema(required = false, nullable)]
    pub message: String,
}

/// `GET /local-sandbox` (`ListLocalSandboxesResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ListLocalSandboxesResponse)]
pub struct ListResponse {
    pub total_count: usize,
    pub local_sandboxes: Vec<SandboxInfo>,
}

/// `POST /local-sandbox/{id}/reset`: the sandbox after the reset, and a
/// message (Klavis declares any object).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ResetResponse)]
pub struct ResetResponse {
    #[serde(flatten)]
    pub sandbox: SandboxInfo,
    pub message: String,
}

/// `DELETE /local-sandbox/{id}` (Klavis declares any object).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ReleaseResponse)]
pub struct ReleaseResponse {
    pub message: String,
}

/// `POST /local-sandbox/{id}/upload-url` and `.../execution-upload-url`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = UploadUrlResponse)]
pub struct UploadUrlResponse {
    /// A signed URL to PUT a tar.gz to.
    pub upload_url: String,
    pub expires_in_minutes: u64,
}

/// `GET /local-sandbox/{id}/dump` and `.../export-artifacts`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DumpUrlResponse)]
pub struct DownloadUrlResponse {
    /// A signed URL to GET the tar.gz from.
    pub download_url: String,
    pub expires_in_minutes: u64,
}

/// `POST /local-sandbox/{id}/initialize` and the per-server initialize
/// (`InitializeSandboxResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = InitializeSandboxResponse)]
pub struct InitializeResponse {
    pub sandbox_id: String,
    pub status: Status,
    pub message: String,
}

/// `POST /local-sandbox/{id}/execute` (`ExecuteResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecuteResponse)]
pub struct ExecuteResponse {
    pub message: String,
    pub execution_name: String,
}

/// `GET /local-sandbox/{id}/execution-status` (`ExecutionStatusResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecutionStatusResponse)]
pub struct ExecutionStatusResponse {
    /// `pending`, `running`, `completed` or `failed` (Klavis types it a
    /// plain string).
    pub status: String,
}

/// `GET /local-sandbox/{id}/execution-logs` (`ExecutionLogsResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecutionLogsResponse)]
pub struct ExecutionLogsResponse {
    /// As in `ExecutionStatusResponse`.
    pub status: String,
    #[schema(required = false, default = "")]
    pub logs: String,
    /// The byte offset to ask from next.
    #[schema(required = false, default = 0)]
    pub cursor: u64,
}

/// `GET /local-sandbox/{server}/{id}/dump` (`DumpSandboxResponse`): the
/// server's data in the shape its initialize takes. Klavis types
/// `server_name` with its `SandboxMCPServer` enum (which, in its document,
/// lacks the very names of its per-server data endpoints; the answer
/// carries the name of the path).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DumpSandboxResponse)]
pub struct ServerDataDump<T: ToSchema> {
    pub sandbox_id: String,
    #[schema(schema_with = klavis_server_name)]
    pub server_name: String,
    #[schema(format = DateTime)]
    pub dumped_at: String,
    pub data: T,
}

/// `GET /sandbox/{server}/{id}/dump`: the same answer as
/// [`ServerDataDump`], declared by this host (the `/sandbox` API is
/// beyond Klavis's document): `server_name` is the name of the path, and
/// `data` the server's data document.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = SandboxDumpResponse)]
pub struct McpServerDataDump<T: ToSchema> {
    pub sandbox_id: String,
    pub server_name: String,
    #[schema(format = DateTime)]
    pub dumped_at: String,
    pub data: T,
}

/// Klavis's `SandboxMCPServer` enum (written in `openapi.json`: it is
/// Klavis's list of names, not one this host serves).
fn klavis_server_name() -> utoipa::openapi::Ref {
    utoipa::openapi::Ref::from_schema_name("SandboxMCPServer")
}

/// `POST /sandbox/{server}` (`CreateSandboxResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CreateSandboxResponse)]
pub struct CreateSandboxResponse {
    pub sandbox_id: String,
    /// Each server's MCP URL, by server name (`local_dev`: one each).
    pub server_urls: std::collections::BTreeMap<String, String>,
    pub server_name: String,
    pub status: Status,
    pub message: String,
    /// This host's addition: each server's process state, by server name.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub server_states: std::collections::BTreeMap<String, ServerState>,
}

/// `GET /sandbox/{server}/{id}` (`SandboxInfo`, with `server_urls` and
/// `benchmark` besides).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = SandboxInfo)]
pub struct McpSandboxInfo {
    pub sandbox_id: String,
    /// The server's MCP URL (a one-server sandbox).
    pub server_url: Option<String>,
    pub server_urls: std::collections::BTreeMap<String, String>,
    pub server_name: String,
    pub status: Status,
    pub updated_at: String,
    pub benchmark: Option<String>,
    /// This host's addition: each server's process state, by server name.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub server_states: std::collections::BTreeMap<String, ServerState>,
}

/// `DELETE /sandbox/{server}/{id}` and `POST …/reset`
/// (`ReleaseSandboxResponse`, `ResetSandboxResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = SandboxStatusResponse)]
pub struct SandboxStatusResponse {
    pub sandbox_id: String,
    pub status: Status,
    pub message: String,
}
