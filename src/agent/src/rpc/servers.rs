//! `sandbox.agent.v1.Servers`: the supervised MCP servers.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use super::agent::benchmark_to_proto;
use super::{BoxStream, lc_status};
use crate::lifecycle::{Lifecycle, ServerView};
use crate::server_data::Load;
use crate::supervisor::State;
use crate::supervisor::logbuf::Stream as LogStream;
use crate::supervisor::manifest::Transport;
use crate::supervisor::spawn::Exit;
use sandbox_client::proto;

pub struct ServersService {
    lc: Arc<Lifecycle>,
}

impl ServersService {
    pub fn new(lc: Arc<Lifecycle>) -> ServersService {
        ServersService { lc }
    }

    /// One server's proto status (blocking work on a blocking thread).
    async fn one(&self, name: &str) -> Result<proto::ServerStatus, Status> {
        let (lc, name) = (self.lc.clone(), name.to_owned());
        tokio::task::spawn_blocking(move || lc.server(&name))
            .await
            .map_err(|e| Status::internal(format!("collecting server status failed: {e}")))?
            .map(server_status)
            .map_err(lc_status)
    }
}

fn state(s: State) -> i32 {
    (match s {
        State::Stopped => proto::ServerState::Stopped,
        State::Starting => proto::ServerState::Starting,
        State::Ready => proto::ServerState::Ready,
        State::Backoff => proto::ServerState::Backoff,
        State::Failed => proto::ServerState::Failed,
        State::Stopping => proto::ServerState::Stopping,
    }) as i32
}

/// The proto status of one server.
pub(super) fn server_status(v: ServerView) -> proto::ServerStatus {
    let s = v.status;
    proto::ServerStatus {
        name: v.name,
        state: state(s.state),
        status: super::agent::status(v.klavis),
        transport: match v.transport {
            Transport::Stdio => proto::ServerTransport::Stdio,
            Transport::Http { .. } => proto::ServerTransport::Http,
        } as i32,
        mcp_path: v.mcp_path,
        pid: s.pid.map_or(0, |p| p as u32),
        restarts: s.restarts,
        state_since_ms: s.state_since_ms,
        last_exit: s.last_exit.map(|(e, at)| proto::ExitStatus {
            how: Some(match e {
                Exit::Code(c) => proto::exit_status::How::Code(c),
                Exit::Signal(g) => proto::exit_status::How::Signal(g),
            }),
            at_ms: at,
        }),
        message: s.message,
        started_at_ms: if s.pid.is_some() { s.started_at_ms } else { 0 },
        updated_at_ms: s.updated_at_ms,
        cpu_time_ms: v.usage.cpu_time_ms,
        rss_bytes: v.usage.rss_bytes,
        processes: v.usage.processes,
        stderr_tail: v.stderr_tail,
        in_lease: v.in_lease,
        id: v.id,
        benchmark: benchmark_to_proto(v.benchmark),
        metadata: v.metadata.into_iter().collect(),
    }
}

#[tonic::async_trait]
impl proto::servers_server::Servers for ServersService {
    async fn list(
        &self,
        _req: Request<proto::ListServersRequest>,
    ) -> Result<Response<proto::ListServersResponse>, Status> {
        let lc = self.lc.clone();
        let servers = tokio::task::spawn_blocking(move || {
            lc.servers(None).into_iter().map(server_status).collect()
        })
        .await
        .map_err(|e| Status::internal(format!("collecting server status failed: {e}")))?;
        Ok(Response::new(proto::ListServersResponse { servers }))
    }

    async fn start(
        &self,
        req: Request<proto::ServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        let s = self
            .lc
            .start_server(&req.into_inner().name)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(self.one(&s.name).await?))
    }

    async fn stop(
        &self,
        req: Request<proto::StopServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        let r = req.into_inner();
        let grace = (r.grace_ms > 0).then(|| Duration::from_millis(r.grace_ms.into()));
        let s = self
            .lc
            .stop_server(&r.name, grace)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(self.one(&s.name).await?))
    }

    async fn restart(
        &self,
        req: Request<proto::ServerRequest>,
    ) -> Result<Response<proto::ServerStatus>, Status> {
        let s = self
            .lc
            .restart_server(&req.into_inner().name)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(self.one(&s.name).await?))
    }

    type LogsStream = BoxStream<proto::LogLine>;

    async fn logs(
        &self,
        req: Request<proto::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let r = req.into_inner();
        let log = self.lc.logs(&r.name).map_err(lc_status)?;
        let only = match proto::LogStream::try_from(r.stream) {
            Ok(proto::LogStream::All) => None,
            Ok(proto::LogStream::Stdout) => Some(LogStream::Stdout),
            Ok(proto::LogStream::Stderr) => Some(LogStream::Stderr),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "unknown stream value {}",
                    r.stream
                )));
            }
        };
        let cursor = if r.cursor > 0 {
            r.cursor
        } else {
            log.tail_cursor(r.tail as usize)
        };
        let name = r.name;
        let lines = log.stream(cursor, only, r.follow).map(move |f| {
            Ok(proto::LogLine {
                server: name.clone(),
                stream: match f.line.stream {
                    LogStream::Stdout => proto::LogStream::Stdout,
                    LogStream::Stderr => proto::LogStream::Stderr,
                } as i32,
                timestamp_ms: f.line.at_ms,
                line: f.line.text,
                truncated: f.line.truncated,
                dropped_before: f.dropped_before,
                seq: f.line.seq,
            })
        });
        Ok(Response::new(Box::pin(lines)))
    }

    async fn load_data(
        &self,
        req: Request<proto::LoadDataRequest>,
    ) -> Result<Response<proto::LoadDataResponse>, Status> {
        let r = req.into_inner();
        let what = if r.default_data {
            Load::Default
        } else {
            Load::Json(r.json.as_bytes())
        };
        let summary = self
            .lc
            .load_server_data(&r.server_name, what)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(proto::LoadDataResponse { summary }))
    }

    async fn dump_data(
        &self,
        req: Request<proto::DumpDataRequest>,
    ) -> Result<Response<proto::DumpDataResponse>, Status> {
        let name = req.into_inner().server_name;
        let json = self.lc.dump_server_data(&name).await.map_err(lc_status)?;
        let json = String::from_utf8(json)
            .map_err(|e| Status::internal(format!("the dump of {name} is not UTF-8: {e}")))?;
        Ok(Response::new(proto::DumpDataResponse {
            json,
            dumped_at_ms: crate::supervisor::now_ms(),
        }))
    }
}
