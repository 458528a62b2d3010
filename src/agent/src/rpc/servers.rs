//! `sandbox.agent.v1.Servers`: the supervised MCP servers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::agent::benchmark_to_proto;
use super::{BoxStream, lc_status};
use crate::lifecycle::{Lifecycle, View};
use crate::supervisor::logbuf::Stream as LogStream;
use crate::supervisor::manifest::Transport;
use crate::supervisor::spawn::Exit;
use crate::supervisor::{State, Status as SupStatus, Usage};
use sandbox_client::proto;

pub struct ServersService {
    lc: Arc<Lifecycle>,
}

impl ServersService {
    pub fn new(lc: Arc<Lifecycle>) -> ServersService {
        ServersService { lc }
    }

    fn one(&self, s: &SupStatus) -> Result<proto::ServerStatus, Status> {
        let usage = self.lc.supervisor().usage();
        server_status(&self.lc, &self.lc.view(), &usage, &s.name)
            .ok_or_else(|| Status::not_found(format!("no server named {:?}", s.name)))
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

/// The full proto status of one server, or None for an unknown name.
pub(super) fn server_status(
    lc: &Lifecycle,
    view: &View,
    usage: &BTreeMap<String, Usage>,
    name: &str,
) -> Option<proto::ServerStatus> {
    let def = lc.manifest().get(name)?;
    let sup = lc.supervisor();
    let s = sup.status(name).ok()?;
    let u = usage.get(name).copied().unwrap_or_default();
    let lease = view.lease.as_ref();
    let in_lease = lease.is_some_and(|l| l.servers.iter().any(|n| n == name));
    let klavis = match (s.state, in_lease) {
        (State::Failed, _) => proto::SandboxStatus::Error,
        (_, true) => proto::SandboxStatus::Occupied,
        (_, false) => proto::SandboxStatus::Idle,
    };
    Some(proto::ServerStatus {
        name: name.to_owned(),
        state: state(s.state),
        status: klavis as i32,
        transport: match def.transport {
            Transport::Stdio => proto::ServerTransport::Stdio,
            Transport::Http { .. } => proto::ServerTransport::Http,
        } as i32,
        mcp_path: def.mcp_path(),
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
        cpu_time_ms: u.cpu_time_ms,
        rss_bytes: u.rss_bytes,
        processes: u.processes,
        stderr_tail: sup.stderr_tail(name),
        in_lease,
        id: lease
            .and_then(|l| l.server_ids.get(name).cloned())
            .unwrap_or_default(),
        benchmark: benchmark_to_proto(lease.filter(|_| in_lease).and_then(|l| l.benchmark)),
        metadata: def.metadata.clone().into_iter().collect(),
    })
}

#[tonic::async_trait]
impl proto::servers_server::Servers for ServersService {
    async fn list(
        &self,
        _req: Request<proto::ListServersRequest>,
    ) -> Result<Response<proto::ListServersResponse>, Status> {
        let lc = self.lc.clone();
        let servers = tokio::task::spawn_blocking(move || {
            let usage = lc.supervisor().usage();
            let view = lc.view();
            lc.manifest()
                .names()
                .iter()
                .filter_map(|n| server_status(&lc, &view, &usage, n))
                .collect()
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
        Ok(Response::new(self.one(&s)?))
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
        Ok(Response::new(self.one(&s)?))
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
        Ok(Response::new(self.one(&s)?))
    }

    type LogsStream = BoxStream<proto::LogLine>;

    async fn logs(
        &self,
        req: Request<proto::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let r = req.into_inner();
        let log = self
            .lc
            .supervisor()
            .logs(&r.name)
            .map_err(|e| Status::not_found(e.to_string()))?;
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
        let mut cursor = if r.cursor > 0 {
            r.cursor
        } else {
            log.tail_cursor(r.tail as usize)
        };
        let (tx, rx) = mpsc::channel(64);
        let name = r.name;
        tokio::spawn(async move {
            loop {
                let batch = log.read(cursor, 256, only);
                let mut dropped = batch.dropped;
                for l in batch.lines {
                    let line = proto::LogLine {
                        server: name.clone(),
                        stream: match l.stream {
                            LogStream::Stdout => proto::LogStream::Stdout,
                            LogStream::Stderr => proto::LogStream::Stderr,
                        } as i32,
                        timestamp_ms: l.at_ms,
                        line: l.text,
                        truncated: l.truncated,
                        dropped_before: std::mem::take(&mut dropped),
                        seq: l.seq,
                    };
                    if tx.send(Ok(line)).await.is_err() {
                        return;
                    }
                }
                let caught_up = batch.next == cursor || batch.next >= log.next_seq();
                cursor = batch.next;
                if caught_up {
                    if !r.follow {
                        return;
                    }
                    tokio::select! {
                        _ = log.wait_past(cursor) => {}
                        _ = tx.closed() => return,
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
