//! gRPC service implementations: thin adapters from proto messages to the
//! agent's domain modules and back. No logic lives here beyond mapping.
//!
//! Methods whose feature is not built yet answer `UNIMPLEMENTED` with a
//! message naming the missing feature; none pretends to succeed.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::info;
use crate::proto;

fn not_built(method: &str, feature: &str) -> Status {
    Status::unimplemented(format!(
        "{method} is not implemented in this agent build: {feature} is not built yet"
    ))
}

const LIFECYCLE: &str = "the sandbox lifecycle (leases, MCP server supervision)";
const WORKSPACE: &str = "workspace transfer (tar streaming into and out of the workspace)";
const SUPERVISOR: &str = "MCP server supervision";

/// `sandbox.agent.v1.Agent`.
pub struct AgentService {
    info: Arc<info::Collector>,
}

impl AgentService {
    pub fn new(info: Arc<info::Collector>) -> AgentService {
        AgentService { info }
    }
}

#[tonic::async_trait]
impl proto::agent_server::Agent for AgentService {
    async fn get_info(
        &self,
        _req: Request<proto::GetInfoRequest>,
    ) -> Result<Response<proto::GetInfoResponse>, Status> {
        let info = self.info.clone();
        let s = tokio::task::spawn_blocking(move || info.snapshot())
            .await
            .map_err(|e| Status::internal(format!("collecting system information failed: {e}")))?;
        Ok(Response::new(proto::GetInfoResponse {
            agent_version: crate::VERSION.to_owned(),
            boot_id: s.boot_id,
            system_uptime_seconds: s.system_uptime_seconds,
            agent_uptime_ms: s.agent_uptime_ms,
            agent_pid: s.agent_pid,
            hostname: s.hostname,
            kernel_release: s.kernel_release,
            kernel_version: s.kernel_version,
            arch: s.arch,
            cpu_count: s.cpu_count,
            load_average: Some(proto::LoadAverage {
                one: s.load[0],
                five: s.load[1],
                fifteen: s.load[2],
            }),
            memory_total_bytes: s.memory_total_bytes,
            memory_available_bytes: s.memory_available_bytes,
            workspace: Some(proto::FilesystemUsage {
                path: s.workspace.path.display().to_string(),
                total_bytes: s.workspace.total_bytes,
                free_bytes: s.workspace.free_bytes,
                available_bytes: s.workspace.available_bytes,
            }),
            agent_rss_bytes: s.agent_rss_bytes,
            // No lease can exist until the lifecycle is built: the sandbox
            // is truthfully idle.
            status: proto::SandboxStatus::Idle as i32,
            lease: None,
        }))
    }

    async fn acquire(
        &self,
        _req: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        Err(not_built("Agent.Acquire", LIFECYCLE))
    }

    async fn release(
        &self,
        _req: Request<proto::ReleaseRequest>,
    ) -> Result<Response<proto::ReleaseResponse>, Status> {
        Err(not_built("Agent.Release", LIFECYCLE))
    }

    async fn reset(
        &self,
        _req: Request<proto::ResetRequest>,
    ) -> Result<Response<proto::ResetResponse>, Status> {
        Err(not_built("Agent.Reset", LIFECYCLE))
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// `sandbox.agent.v1.Workspace`.
pub struct WorkspaceService;

#[tonic::async_trait]
impl proto::workspace_server::Workspace for WorkspaceService {
    async fn initialize(
        &self,
        _req: Request<Streaming<proto::InitializeRequest>>,
    ) -> Result<Response<proto::InitializeResponse>, Status> {
        Err(not_built("Workspace.Initialize", WORKSPACE))
    }

    type DumpStream = BoxStream<proto::DumpResponse>;

    async fn dump(
        &self,
        _req: Request<proto::DumpRequest>,
    ) -> Result<Response<Self::DumpStream>, Status> {
        Err(not_built("Workspace.Dump", WORKSPACE))
    }

    async fn clear(
        &self,
        _req: Request<proto::ClearRequest>,
    ) -> Result<Response<proto::ClearResponse>, Status> {
        Err(not_built("Workspace.Clear", WORKSPACE))
    }
}

/// `sandbox.agent.v1.Servers`.
pub struct ServersService;

#[tonic::async_trait]
impl proto::servers_server::Servers for ServersService {
    async fn list(
        &self,
        _req: Request<proto::ListServersRequest>,
    ) -> Result<Response<proto::ListServersResponse>, Status> {
        Err(not_built("Servers.List", SUPERVISOR))
    }

    async fn start(
        &self,
        _req: Request<proto::ServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        Err(not_built("Servers.Start", SUPERVISOR))
    }

    async fn stop(
        &self,
        _req: Request<proto::StopServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        Err(not_built("Servers.Stop", SUPERVISOR))
    }

    async fn restart(
        &self,
        _req: Request<proto::ServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        Err(not_built("Servers.Restart", SUPERVISOR))
    }

    type LogsStream = BoxStream<proto::LogLine>;

    async fn logs(
        &self,
        _req: Request<proto::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        Err(not_built("Servers.Logs", SUPERVISOR))
    }
}
