//! `sandbox.agent.v1.Workspace`: streams ⇄ [`crate::workspace::Workspace`].

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use crate::workspace::codec::Encoder;
use crate::workspace::stream::{ChannelReader, ChunkSink};
use crate::workspace::{
    ArchiveError, Compression, DumpRequest, InitRequest, InitStats, MAX_CHUNK_BYTES, Workspace,
    WorkspaceError,
};
use sandbox_client::proto;

/// `sandbox.agent.v1.Workspace`.
pub struct WorkspaceService {
    ws: Arc<Workspace>,
}

impl WorkspaceService {
    pub fn new(ws: Arc<Workspace>) -> WorkspaceService {
        WorkspaceService { ws }
    }
}

/// The gRPC status for a workspace error: the one place workspace and
/// archive causes meet status codes.
pub(super) fn ws_status(e: WorkspaceError) -> Status {
    let msg = e.to_string();
    match e {
        WorkspaceError::Archive(a) => archive_status(a),
        WorkspaceError::Integrity(_) => Status::data_loss(msg),
        WorkspaceError::Busy(_) => Status::aborted(msg),
        WorkspaceError::NotFound(_) => Status::not_found(msg),
        WorkspaceError::Stuck(_) => Status::failed_precondition(msg),
    }
}

/// The gRPC status for an archive error (a workspace's, or an execution
/// archive's).
pub(super) fn archive_status(e: ArchiveError) -> Status {
    let msg = e.to_string();
    match e {
        ArchiveError::Invalid(_) => Status::invalid_argument(msg),
        ArchiveError::Limit { .. } | ArchiveError::DiskFull(_) => Status::resource_exhausted(msg),
        ArchiveError::Cancelled(_) => Status::cancelled(msg),
        ArchiveError::Io { .. } => Status::internal(msg),
    }
}

pub(super) fn compression(v: i32) -> Result<Compression, Status> {
    match proto::Compression::try_from(v) {
        Ok(proto::Compression::Auto) => Ok(Compression::Auto),
        Ok(proto::Compression::Gzip) => Ok(Compression::Gzip),
        Ok(proto::Compression::Zstd) => Ok(Compression::Zstd),
        Ok(proto::Compression::None) => Ok(Compression::None),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown compression value {v}"
        ))),
    }
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
            durable: header.durable,
        };
        let limits = self.ws.limits().clone();
        if init.size_hint > limits.max_archive_bytes {
            return Err(archive_status(ArchiveError::Limit {
                limit: "max_archive_bytes",
                detail: format!(
                    "the announced archive size {} is larger than {} bytes",
                    init.size_hint, limits.max_archive_bytes
                ),
            }));
        }
        let guard = self.ws.begin("Initialize").map_err(ws_status)?;
        let cancel = guard.cancelled();
        let (tx, rx) = mpsc::channel(limits.queue_chunks);
        // Weak: the channel must still close when the client's stream ends.
        let cancel_tx = tx.downgrade();
        let span = tracing::info_span!("initialize", merge = init.merge);
        let task = tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            let (reader, outcome) = ChannelReader::new(rx, limits.max_archive_bytes);
            let r = guard.initialize(&init, reader, &outcome);
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
        let forward = forward(stream, tx, "InitializeHeader", |m| match m.msg {
            Some(Msg::Header(_)) => Part::Header,
            Some(Msg::Chunk(b)) => Part::Chunk(b),
            None => Part::Empty,
        });
        let result = tokio::select! {
            r = task => r,
            _ = forward => unreachable_forward(),
            _ = cancel.cancelled() => {
                // An error, not the end of the stream: what was read so far
                // is discarded, never committed.
                if let Some(tx) = cancel_tx.upgrade() {
                    let stop = tx.send(Err(ArchiveError::Cancelled(
                        "the lease was released while this Initialize ran".into(),
                    )));
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), stop).await;
                }
                return Err(Status::aborted(
                    "Initialize stopped: the lease was released while it ran; nothing was changed",
                ));
            }
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
            durable: stats.durable,
        }))
    }

    type DumpStream = BoxStream<proto::DumpResponse>;

    async fn dump(
        &self,
        req: Request<proto::DumpRequest>,
    ) -> Result<Response<Self::DumpStream>, Status> {
        let r = req.into_inner();
        let compression = match compression(r.compression)? {
            Compression::Auto => Compression::Gzip,
            c => c,
        };
        let level = r.level;
        let guard = self.ws.begin("Dump").map_err(ws_status)?;
        let cancel = guard.cancelled();
        let limits = self.ws.limits().clone();
        // The producer writes into `tx`; a relay passes the messages on to
        // the client's stream (`out`) until a Release cancels the Dump. A
        // client that stopped reading leaves the relay waiting, but dropping
        // `rx` then still unblocks the producer, which stops.
        let (tx, mut rx) =
            mpsc::channel::<Result<proto::DumpResponse, Status>>(limits.queue_chunks);
        let (out, out_rx) = mpsc::channel::<Result<proto::DumpResponse, Status>>(1);
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    m = rx.recv() => m,
                    _ = cancel.cancelled() => {
                        drop(rx);
                        let _ = out.try_send(Err(Status::aborted(
                            "Dump stopped: the lease was released while it ran",
                        )));
                        return;
                    }
                };
                let Some(m) = m else { return };
                tokio::select! {
                    sent = out.send(m) => if sent.is_err() { return },
                    _ = cancel.cancelled() => return,
                }
            }
        });
        let dreq = DumpRequest {
            exclude: r.exclude,
            sub_path: r.sub_path,
        };
        let span = tracing::info_span!("dump", ?compression, level);
        tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            let start = std::time::Instant::now();
            let sink = ChunkSink::new(tx.clone(), MAX_CHUNK_BYTES, |b| {
                Ok(proto::DumpResponse {
                    msg: Some(proto::dump_response::Msg::Chunk(b)),
                })
            });
            let closed = sink.closed();
            let result = Encoder::new(sink, compression, level, limits.dump_threads)
                .map_err(|e| WorkspaceError::invalid(e.to_string()))
                .and_then(|enc| guard.dump(&dreq, enc, Some(&closed)))
                .and_then(|(enc, stats)| {
                    Ok((
                        enc.finish()
                            .map_err(|e| WorkspaceError::io("finishing compression", e))?,
                        stats,
                    ))
                })
                .and_then(|(sink, stats)| {
                    let (bytes, sha, tx) = sink
                        .finish()
                        .map_err(|_| ArchiveError::Cancelled("the client went away".into()))?;
                    Ok((bytes, sha, tx, stats))
                });
            // The workspace is free before the last message goes out: a
            // client that has the trailer (or the error) may start the next
            // operation at once, and must not find this Dump still running.
            drop(guard);
            match result {
                Ok((bytes, sha, tx, stats)) => {
                    tracing::info!(
                        files = stats.files,
                        bytes,
                        ms = start.elapsed().as_millis() as u64,
                        changed = stats.changed.len(),
                        "workspace dumped"
                    );
                    let _ = tx.blocking_send(Ok(trailer(bytes, sha, stats, start)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dump failed");
                    let _ = tx.blocking_send(Err(ws_status(e)));
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out_rx),
        )))
    }

    async fn clear(
        &self,
        _req: Request<proto::ClearRequest>,
    ) -> Result<Response<proto::ClearResponse>, Status> {
        let guard = self.ws.begin("Clear").map_err(ws_status)?;
        let start = std::time::Instant::now();
        let removed = tokio::task::spawn_blocking(move || guard.clear())
            .await
            .map_err(|e| Status::internal(format!("the clear task failed: {e}")))?
            .map_err(ws_status)?;
        Ok(Response::new(proto::ClearResponse {
            removed_entries: removed,
            duration_ms: start.elapsed().as_millis() as u64,
        }))
    }
}

/// One message of an upload stream (Initialize, Exec.Upload).
pub(super) enum Part {
    Header,
    Chunk(bytes::Bytes),
    Empty,
}

/// Feeds an upload stream's chunks to the blocking extractor through
/// `tx`, turning a second header, an oversized chunk or a broken stream
/// into the extractor's error; then closes `tx` and never completes (the
/// caller selects it against the extractor's result).
pub(super) async fn forward<M>(
    mut stream: Streaming<M>,
    tx: mpsc::Sender<crate::workspace::stream::Feed>,
    header: &'static str,
    part: fn(M) -> Part,
) {
    loop {
        let feed = match stream.message().await {
            Ok(Some(m)) => match part(m) {
                Part::Chunk(b) if b.len() > MAX_CHUNK_BYTES => Err(ArchiveError::invalid(format!(
                    "a chunk of {} bytes is larger than the {MAX_CHUNK_BYTES}-byte limit",
                    b.len()
                ))),
                Part::Chunk(b) => Ok(b),
                Part::Header => Err(ArchiveError::invalid(format!(
                    "a second {header} arrived; send one header, then chunks"
                ))),
                Part::Empty => continue,
            },
            Ok(None) => break,
            Err(s) => Err(ArchiveError::Cancelled(format!(
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
}

/// The last message of an archive stream (Dump, and Exec.Export).
pub(super) fn trailer(
    bytes: u64,
    sha256: String,
    stats: crate::workspace::pack::PackStats,
    start: std::time::Instant,
) -> proto::DumpResponse {
    proto::DumpResponse {
        msg: Some(proto::dump_response::Msg::Trailer(proto::DumpTrailer {
            sha256,
            archive_bytes: bytes,
            files: stats.files,
            dirs: stats.dirs,
            symlinks: stats.symlinks,
            skipped_special: stats.skipped_special,
            changed_files: stats.changed,
            changed_truncated: stats.changed_truncated,
            content_bytes: stats.content_bytes,
            duration_ms: start.elapsed().as_millis() as u64,
        })),
    }
}

/// The forwarding future never completes (it parks after the stream ends).
fn unreachable_forward() -> Result<Result<InitStats, WorkspaceError>, tokio::task::JoinError> {
    Ok(Err(ArchiveError::Cancelled(
        "the upload stream ended unexpectedly".into(),
    )
    .into()))
}
