//! `sandbox.agent.v1.Exec`: messages ⇄ [`crate::exec::Executions`].

use std::sync::Arc;

use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use super::convert::{self, exec_state, exec_view};
use super::status::exec_status;
use super::upload::{Part, forward};
use crate::exec::log::ReadError;
use crate::exec::{ExecError, ExecState, Executions};
use crate::workspace::codec::Encoder;
use crate::workspace::stream::{ChannelReader, ChunkSink};
use crate::workspace::{ArchiveError, Compression, DumpSummary, MAX_CHUNK_BYTES};
use sandbox_client::proto;

pub struct ExecService {
    exec: Arc<Executions>,
}

impl ExecService {
    pub fn new(exec: Arc<Executions>) -> ExecService {
        ExecService { exec }
    }
}

/// A request's message with its one lease in `lease_id`: the message's,
/// or the call's `sandbox-lease` metadata (the host sends both).
fn bound<T: HasLease>(req: Request<T>) -> Result<T, Status> {
    let meta = super::lease_of(&req)?;
    let mut r = req.into_inner();
    let lease = super::one_lease(r.lease(), meta)?;
    *r.lease_mut() = lease;
    Ok(r)
}

/// The messages that name a lease.
trait HasLease {
    fn lease(&self) -> &str;
    fn lease_mut(&mut self) -> &mut String;
}

macro_rules! has_lease {
    ($($t:ty),*) => {$(
        impl HasLease for $t {
            fn lease(&self) -> &str {
                &self.lease_id
            }
            fn lease_mut(&mut self) -> &mut String {
                &mut self.lease_id
            }
        }
    )*};
}

has_lease!(
    proto::ExecStartRequest,
    proto::ExecStatusRequest,
    proto::ExecListRequest,
    proto::ExecLogsRequest,
    proto::ExecExportRequest,
    proto::ExecCancelRequest
);

/// One cursor read, as the answer to Logs (and each FollowLogs message).
fn read_logs(
    exec: &Executions,
    r: &proto::ExecLogsRequest,
    cursor: u64,
) -> Result<proto::ExecLogsResponse, ExecError> {
    let (view, log) = exec.log(&r.lease_id, &r.execution_name)?;
    let max = match r.max_bytes {
        0 => exec.config().log_read_bytes,
        n => n.min(exec.config().log_read_bytes),
    } as usize;
    let (logs, next, log_bytes, complete) = match log {
        // Not started yet: an empty log.
        None if cursor == 0 => (String::new(), 0, 0, false),
        None => {
            return Err(ExecError::Log(ReadError::PastEnd(
                crate::exec::log::PastEnd { cursor, len: 0 },
            )));
        }
        Some(l) => {
            let c = l.read(cursor, max)?;
            (c.text, c.next, l.state().len, c.complete)
        }
    };
    // A run publishes its end state before it closes its log, so a closed
    // log is always reported with the end state. Until this answer reaches
    // the end of the log, an ended run still reads as `running`: a client
    // that stops polling at `completed` or `failed` has then read it all.
    let (st, klavis) = match (
        complete,
        view.state.active() || view.state == ExecState::Uploaded,
    ) {
        (false, false) => (ExecState::Running, ExecState::Running.klavis()),
        (true, _) => {
            let v = exec.status(&r.lease_id, &r.execution_name)?;
            (v.state, v.state.klavis())
        }
        (false, true) => (view.state, view.state.klavis()),
    };
    Ok(proto::ExecLogsResponse {
        state: exec_state(st) as i32,
        klavis_status: klavis.into(),
        logs,
        next_cursor: next,
        log_bytes,
        complete,
    })
}

#[tonic::async_trait]
impl proto::exec_server::Exec for ExecService {
    async fn upload(
        &self,
        req: Request<Streaming<proto::ExecUploadRequest>>,
    ) -> Result<Response<proto::ExecUploadResponse>, Status> {
        use proto::exec_upload_request::Msg;
        let meta = super::lease_of(&req)?;
        let mut stream = req.into_inner();
        let mut header = match stream.message().await? {
            Some(proto::ExecUploadRequest {
                msg: Some(Msg::Header(h)),
            }) => h,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be an ExecUploadHeader, then the archive as chunks",
                ));
            }
        };
        header.lease_id = super::one_lease(&header.lease_id, meta)?;
        let comp = convert::compression(header.compression)?;
        let limits = self.exec.config().archive.clone();
        if header.size_hint > limits.max_archive_bytes {
            return Err(exec_status(ExecError::Archive(ArchiveError::Limit {
                limit: "max_archive_bytes",
                detail: format!(
                    "the announced archive size {} is larger than {} bytes (exec.archive)",
                    header.size_hint, limits.max_archive_bytes
                ),
            })));
        }
        let up = self
            .exec
            .begin_upload(&header.lease_id, &header.execution_name)
            .map_err(exec_status)?;
        let (tx, rx) = mpsc::channel(limits.queue_chunks);
        let exec = self.exec.clone();
        let span = tracing::info_span!("exec_upload", execution = %header.execution_name);
        let task = tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            let (reader, outcome) = ChannelReader::new(rx, limits.max_archive_bytes);
            let r = exec.extract(&up, reader, comp);
            let mut o = outcome.lock().unwrap_or_else(|p| p.into_inner());
            // A broken stream or the size limit is the real cause of a
            // failed extraction, not the truncated archive it left.
            let r = match (r, o.failure.take()) {
                (Err(_), Some(cause)) => Err(ExecError::Archive(cause)),
                (r, _) => r.map(|x| (x, o.count)),
            };
            drop(o);
            (up, r)
        });
        let forward = forward(stream, tx, "ExecUploadHeader", |m| match m.msg {
            Some(Msg::Header(_)) => Part::Header,
            Some(Msg::Chunk(b)) => Part::Chunk(b),
            None => Part::Empty,
        });
        let (up, extracted) = tokio::select! {
            r = task => r.map_err(|e| Status::internal(format!("the extraction task failed: {e}")))?,
            _ = forward => return Err(Status::internal("the upload stream ended unexpectedly")),
        };
        let (x, archive_bytes) = extracted.map_err(exec_status)?;
        let replaced = self.exec.commit_upload(up).await.map_err(exec_status)?;
        tracing::info!(
            execution = %header.execution_name,
            files = x.files,
            replaced = replaced.replaced,
            killed_running = replaced.killed_running,
            "execution uploaded"
        );
        Ok(Response::new(proto::ExecUploadResponse {
            execution_name: header.execution_name,
            files: x.files,
            bytes_written: x.bytes_written,
            archive_bytes,
            replaced: replaced.replaced,
            killed_running: replaced.killed_running,
        }))
    }

    async fn start(
        &self,
        req: Request<proto::ExecStartRequest>,
    ) -> Result<Response<proto::ExecStatus>, Status> {
        let r = bound(req)?;
        let v = self
            .exec
            .start(&r.lease_id, &r.execution_name)
            .await
            .map_err(exec_status)?;
        Ok(Response::new(exec_view(v)))
    }

    async fn status(
        &self,
        req: Request<proto::ExecStatusRequest>,
    ) -> Result<Response<proto::ExecStatus>, Status> {
        let r = bound(req)?;
        let v = self
            .exec
            .status(&r.lease_id, &r.execution_name)
            .map_err(exec_status)?;
        Ok(Response::new(exec_view(v)))
    }

    async fn list(
        &self,
        req: Request<proto::ExecListRequest>,
    ) -> Result<Response<proto::ExecListResponse>, Status> {
        let r = bound(req)?;
        let v = self.exec.list(&r.lease_id).map_err(exec_status)?;
        Ok(Response::new(proto::ExecListResponse {
            executions: v.into_iter().map(exec_view).collect(),
        }))
    }

    async fn logs(
        &self,
        req: Request<proto::ExecLogsRequest>,
    ) -> Result<Response<proto::ExecLogsResponse>, Status> {
        let r = bound(req)?;
        let exec = self.exec.clone();
        let out = tokio::task::spawn_blocking(move || read_logs(&exec, &r, r.cursor))
            .await
            .map_err(|e| Status::internal(format!("the log read failed: {e}")))?
            .map_err(exec_status)?;
        Ok(Response::new(out))
    }

    type FollowLogsStream = BoxStream<proto::ExecLogsResponse>;

    async fn follow_logs(
        &self,
        req: Request<proto::ExecLogsRequest>,
    ) -> Result<Response<Self::FollowLogsStream>, Status> {
        let r = bound(req)?;
        // Fail at once for an unknown execution or lease.
        self.exec
            .status(&r.lease_id, &r.execution_name)
            .map_err(exec_status)?;
        let (tx, rx) = mpsc::channel(4);
        let exec = self.exec.clone();
        tokio::spawn(async move {
            let mut cursor = r.cursor;
            loop {
                // Subscribe before reading, so no append is missed.
                let watch = exec
                    .log(&r.lease_id, &r.execution_name)
                    .ok()
                    .and_then(|(_, l)| l.map(|l| l.subscribe()));
                let (e2, r2) = (exec.clone(), r.clone());
                let chunk = tokio::task::spawn_blocking(move || read_logs(&e2, &r2, cursor)).await;
                let chunk = match chunk {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(exec_status(e))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                        return;
                    }
                };
                let progressed = chunk.next_cursor != cursor;
                let complete = chunk.complete;
                cursor = chunk.next_cursor;
                if (progressed || complete) && tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                if complete {
                    return;
                }
                if progressed {
                    continue;
                }
                match watch {
                    Some(mut w) => {
                        tokio::select! {
                            c = w.changed() => if c.is_err() { return; },
                            _ = tx.closed() => return,
                        }
                    }
                    // Not started yet: look again shortly.
                    None => {
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                            _ = tx.closed() => return,
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type ExportStream = BoxStream<proto::DumpResponse>;

    async fn export(
        &self,
        req: Request<proto::ExecExportRequest>,
    ) -> Result<Response<Self::ExportStream>, Status> {
        let r = bound(req)?;
        self.exec
            .status(&r.lease_id, &r.execution_name)
            .map_err(exec_status)?;
        let limits = self.exec.config().archive.clone();
        let (tx, rx) = mpsc::channel::<Result<proto::DumpResponse, Status>>(limits.queue_chunks);
        let exec = self.exec.clone();
        let span = tracing::info_span!("exec_export", execution = %r.execution_name);
        tokio::task::spawn_blocking(move || {
            let _e = span.enter();
            let start = std::time::Instant::now();
            let sink = ChunkSink::new(tx.clone(), MAX_CHUNK_BYTES, |b| Ok(convert::chunk(b)));
            let closed = sink.closed();
            let result = Encoder::new(sink, Compression::Gzip, 0, limits.dump_threads)
                .map_err(|e| ExecError::Archive(ArchiveError::invalid(e.to_string())))
                .and_then(|enc| exec.export(&r.lease_id, &r.execution_name, enc, Some(&closed)))
                .and_then(|(enc, stats)| {
                    let sink = enc.finish().map_err(|e| {
                        ExecError::Archive(ArchiveError::io("finishing compression", e))
                    })?;
                    let (bytes, sha, tx) = sink.finish().map_err(|_| {
                        ExecError::Archive(ArchiveError::Cancelled("the client went away".into()))
                    })?;
                    Ok((bytes, sha, tx, stats))
                });
            match result {
                Ok((archive_bytes, sha256, tx, stats)) => {
                    let _ = tx.blocking_send(Ok(convert::trailer(DumpSummary {
                        archive_bytes,
                        sha256,
                        stats,
                        duration: start.elapsed(),
                    })));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "export failed");
                    let _ = tx.blocking_send(Err(exec_status(e)));
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn cancel(
        &self,
        req: Request<proto::ExecCancelRequest>,
    ) -> Result<Response<proto::ExecStatus>, Status> {
        let r = bound(req)?;
        let v = self
            .exec
            .cancel(&r.lease_id, &r.execution_name)
            .await
            .map_err(exec_status)?;
        Ok(Response::new(exec_view(v)))
    }
}
