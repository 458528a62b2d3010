//! Every answer of the API, as Klavis's document names and shapes it.
//! These types are the only way a handler answers, and they generate the
//! schemas of `/openapi.json` (see `crate::openapi`), so the document and
//! the code cannot drift.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::store::Status;

/// One server of a sandbox (`LocalSandboxServerItem`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LocalSandboxServerItem)]
pub struct ServerItem {
    pub server_name: String,
    pub id: String,
    /// The server's streamable-HTTP MCP URL; its `mcp_token` admits the
    /// holder until the sandbox is released.
    pub mcp_server_url: String,
    pub status: Status,
    pub benchmark: Option<String>,
    pub updated_at: String,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// What the sandbox gave the server to reach a service it runs (the
    /// mail account).
    #[schema(value_type = Option<Object>)]
    pub auth_data: Option<Value>,
    pub tags: Option<Vec<String>>,
    /// This host's addition: the server's process state, where the answer
    /// asked the sandbox (Acquire, Get, Reset; not List).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<ServerState>,
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

/// `GET /local-sandbox/{id}` (`LocalSandboxInfo`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = LocalSandboxInfo)]
pub struct SandboxInfo {
    pub local_sandbox_id: String,
    pub created_at: String,
    pub status: Status,
    pub benchmark: Option<String>,
    pub servers: Vec<ServerItem>,
}

/// `POST /local-sandbox` (`AcquireLocalSandboxResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AcquireLocalSandboxResponse)]
pub struct AcquireResponse {
    pub local_sandbox_id: String,
    pub status: Status,
    pub benchmark: Option<String>,
    pub servers: Vec<ServerItem>,
    /// The servers started, and those of ALL not started with why.
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

/// Klavis's words for an execution's state, as the agent gives them
/// (`ExecStatus.klavis_status`); declares the answers' `status`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ExecutionState)]
#[allow(dead_code)] // the schema of a word the agent sends
pub enum ExecutionState {
    Pending,
    Running,
    Completed,
    Failed,
}

/// `GET /local-sandbox/{id}/execution-status` (`ExecutionStatusResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecutionStatusResponse)]
pub struct ExecutionStatusResponse {
    #[schema(value_type = ExecutionState)]
    pub status: String,
}

/// `GET /local-sandbox/{id}/execution-logs` (`ExecutionLogsResponse`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExecutionLogsResponse)]
pub struct ExecutionLogsResponse {
    #[schema(value_type = ExecutionState)]
    pub status: String,
    pub logs: String,
    /// The byte offset to ask from next.
    pub cursor: u64,
}

/// `GET /local-sandbox/{server}/{id}/dump` (`DumpSandboxResponse`): the
/// server's data in the shape its initialize takes.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DumpSandboxResponse)]
pub struct ServerDataDump<T: ToSchema> {
    pub sandbox_id: String,
    pub server_name: String,
    pub dumped_at: String,
    pub data: T,
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
