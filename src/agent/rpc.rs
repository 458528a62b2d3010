//! gRPC service implementations: thin adapters from proto messages to the
//! agent's domain modules and back. No logic lives here beyond mapping.
//!
//! Methods whose feature is not built yet answer `UNIMPLEMENTED` with a
//! message naming the missing feature; none pretends to succeed.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use tokio::sync::mpsc;

use super::info;
use crate::proto;
use crate::workspace::codec::Encoder;
use crate::workspace::stream::{ChannelReader, ChunkSink};
use crate::workspace::{DumpRequest, InitRequest, InitStats, MAX_CHUNK_BYTES, Workspace, WsError};

fn not_built(method: &str, feature: &str) -> Status {
    Status::unimplemented(format!(
        "{method} is not implemented in this agent build: {feature} is not built yet"
    ))
}

const LIFECYCLE: &str = "the sandbox lifecycle (leases, MCP server supervision)";
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
pub struct WorkspaceService {
    ws: Arc<Workspace>,
}

impl WorkspaceService {
    pub fn new(ws: Arc<Workspace>) -> WorkspaceService {
        WorkspaceService { ws }
    }
}

/// The gRPC status for a workspace error.
fn ws_status(e: WsError) -> Status {
    let msg = e.to_string();
    match e {
        WsError::Invalid(_) => Status::invalid_argument(msg),
        WsError::Limit { .. } | WsError::DiskFull(_) => Status::resource_exhausted(msg),
        WsError::Integrity(_) => Status::data_loss(msg),
        WsError::Busy(_) => Status::aborted(msg),
        WsError::Cancelled(_) => Status::cancelled(msg),
        WsError::NotFound(_) => Status::not_found(msg),
        WsError::Io { .. } => Status::internal(msg),
    }
}

fn compression(v: i32) -> Result<proto::Compression, Status> {
    proto::Compression::try_from(v)
        .map_err(|_| Status::invalid_argument(format!("unknown compression value {v}")))
}

#[tonic::async_trait]
impl proto::workspace_server::Workspace for WorkspaceService {
    async fn initialize(
        &self,
        req: Request<Streaming<proto::InitializeRequest>>,
    ) -> Result<Response<proto::InitializeResponse>, Status> {
        use proto::initialize_request::Msg;
        let mut stream = req.into_inner();
        let header = match stream.message().await? {
            Some(proto::InitializeRequest {
                msg: Some(Msg::Header(h)),
            }) => h,
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message must be an InitializeHeader, then chunks",
                ));
            }
            None => {
                return Err(Status::invalid_argument(
                    "empty stream: send an InitializeHeader, then the archive as chunks",
                ));
            }
        };
        let mode = proto::InitializeMode::try_from(header.mode)
            .map_err(|_| Status::invalid_argument(format!("unknown mode value {}", header.mode)))?;
        let init = InitRequest {
            compression: compression(header.compression)?,
            merge: mode == proto::InitializeMode::Merge,
            expected_sha256: header.expected_sha256,
            size_hint: header.size_hint,
        };
        let limits = self.ws.limits().clone();
        if init.size_hint > limits.max_archive_bytes {
            return Err(ws_status(WsError::Limit {
                limit: "max_archive_bytes",
                detail: format!(
                    "the announced archive size {} is larger than {} bytes",
                    init.size_hint, limits.max_archive_bytes
                ),
            }));
        }
        let guard = self.ws.begin("Initialize").map_err(ws_status)?;
        let (tx, rx) = mpsc::channel(limits.queue_chunks);
        let ws = self.ws.clone();
        let span = tracing::info_span!("initialize", merge = init.merge);
        let task = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let _e = span.enter();
            let (reader, outcome) = ChannelReader::new(rx, limits.max_archive_bytes);
            let r = ws.initialize(&init, reader, &outcome);
            match &r {
                Ok(s) => tracing::info!(
                    files = s.extract.files,
                    bytes = s.extract.bytes_written,
                    archive_bytes = s.archive_bytes,
                    ms = s.duration.as_millis() as u64,
                    sync_ms = s.sync.as_millis() as u64,
                    "workspace initialized"
                ),
                Err(e) => tracing::warn!(error = %e, "initialize failed; workspace unchanged"),
            }
            r
        });
        let forward = async move {
            loop {
                let feed = match stream.message().await {
                    Ok(Some(proto::InitializeRequest {
                        msg: Some(Msg::Chunk(b)),
                    })) if b.len() > MAX_CHUNK_BYTES => Err(WsError::invalid(format!(
                        "a chunk of {} bytes is larger than the {MAX_CHUNK_BYTES}-byte limit",
                        b.len()
                    ))),
                    Ok(Some(proto::InitializeRequest {
                        msg: Some(Msg::Chunk(b)),
                    })) => Ok(b),
                    Ok(Some(proto::InitializeRequest {
                        msg: Some(Msg::Header(_)),
                    })) => Err(WsError::invalid(
                        "a second InitializeHeader arrived; send one header, then chunks",
                    )),
                    Ok(Some(proto::InitializeRequest { msg: None })) => continue,
                    Ok(None) => break,
                    Err(s) => Err(WsError::Cancelled(format!(
                        "the upload stream broke: {}",
                        s.message()
                    ))),
                };
                let stop = feed.is_err();
                if tx.send(feed).await.is_err() || stop {
                    break;
                }
            }
            // End of input for the extractor; then wait for its result.
            drop(tx);
            std::future::pending::<()>().await
        };
        let result = tokio::select! {
            r = task => r,
            _ = forward => unreachable_forward(),
        };
        let stats = result
            .map_err(|e| Status::internal(format!("the extraction task failed: {e}")))?
            .map_err(ws_status)?;
        let x = stats.extract;
        Ok(Response::new(proto::InitializeResponse {
            files: x.files,
            dirs: x.dirs,
            symlinks: x.symlinks,
            hardlinks: x.hardlinks,
            bytes_written: x.bytes_written,
            archive_bytes: stats.archive_bytes,
            archive_sha256: stats.archive_sha256,
            duration_ms: stats.duration.as_millis() as u64,
        }))
    }

    type DumpStream = BoxStream<proto::DumpResponse>;

    async fn dump(
        &self,
        req: Request<proto::DumpRequest>,
    ) -> Result<Response<Self::DumpStream>, Status> {
        let r = req.into_inner();
        let compression = match compression(r.compression)? {
            proto::Compression::Auto => proto::Compression::Gzip,
            c => c,
        };
        let level = r.level;
        let guard = self.ws.begin("Dump").map_err(ws_status)?;
        let limits = self.ws.limits().clone();
        let (tx, rx) = mpsc::channel::<Result<proto::DumpResponse, Status>>(limits.queue_chunks);
        let ws = self.ws.clone();
        let dreq = DumpRequest {
            exclude: r.exclude,
            sub_path: r.sub_path,
        };
        let span = tracing::info_span!("dump", ?compression, level);
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let _e = span.enter();
            let start = std::time::Instant::now();
            let sink = ChunkSink::new(tx.clone(), MAX_CHUNK_BYTES, |b| {
                Ok(proto::DumpResponse {
                    msg: Some(proto::dump_response::Msg::Chunk(b)),
                })
            });
            let closed = sink.closed();
            let result = Encoder::new(sink, compression, level, limits.dump_threads)
                .map_err(|e| WsError::invalid(e.to_string()))
                .and_then(|enc| ws.dump(&dreq, enc, Some(&closed)))
                .and_then(|(enc, stats)| {
                    Ok((
                        enc.finish()
                            .map_err(|e| WsError::io("finishing compression", e))?,
                        stats,
                    ))
                })
                .and_then(|(sink, stats)| {
                    let (bytes, sha, tx) = sink
                        .finish()
                        .map_err(|_| WsError::Cancelled("the client went away".into()))?;
                    Ok((bytes, sha, tx, stats))
                });
            match result {
                Ok((bytes, sha, tx, stats)) => {
                    tracing::info!(
                        files = stats.files,
                        bytes,
                        ms = start.elapsed().as_millis() as u64,
                        changed = stats.changed.len(),
                        "workspace dumped"
                    );
                    let trailer = proto::DumpTrailer {
                        sha256: sha,
                        archive_bytes: bytes,
                        files: stats.files,
                        dirs: stats.dirs,
                        symlinks: stats.symlinks,
                        skipped_special: stats.skipped_special,
                        changed_files: stats.changed,
                        changed_truncated: stats.changed_truncated,
                        content_bytes: stats.content_bytes,
                        duration_ms: start.elapsed().as_millis() as u64,
                    };
                    let _ = tx.blocking_send(Ok(proto::DumpResponse {
                        msg: Some(proto::dump_response::Msg::Trailer(trailer)),
                    }));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dump failed");
                    let _ = tx.blocking_send(Err(ws_status(e)));
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn clear(
        &self,
        _req: Request<proto::ClearRequest>,
    ) -> Result<Response<proto::ClearResponse>, Status> {
        let guard = self.ws.begin("Clear").map_err(ws_status)?;
        let ws = self.ws.clone();
        let start = std::time::Instant::now();
        let removed = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            ws.clear()
        })
        .await
        .map_err(|e| Status::internal(format!("the clear task failed: {e}")))?
        .map_err(ws_status)?;
        Ok(Response::new(proto::ClearResponse {
            removed_entries: removed,
            duration_ms: start.elapsed().as_millis() as u64,
        }))
    }
}

/// The forwarding future never completes (it parks after the stream ends).
fn unreachable_forward() -> Result<Result<InitStats, WsError>, tokio::task::JoinError> {
    Ok(Err(WsError::Cancelled(
        "the upload stream ended unexpectedly".into(),
    )))
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
