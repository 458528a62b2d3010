//! `sandbox.agent.v1.Workspace`: streams ⇄ [`crate::workspace::Workspace`].

use std::sync::Arc;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::BoxStream;
use super::convert;
use super::status::{lc_status, transfer_status, ws_status};
use super::upload::{Part, forward};
use crate::lifecycle::Lifecycle;
use crate::workspace::{Fence, Workspace};
use sandbox_client::proto;

/// `sandbox.agent.v1.Workspace`.
pub struct WorkspaceService {
    ws: Arc<Workspace>,
    /// Whose lease a call names (`sandbox-lease`): refused once it ended.
    lc: Arc<Lifecycle>,
}

impl WorkspaceService {
    pub fn new(ws: Arc<Workspace>, lc: Arc<Lifecycle>) -> WorkspaceService {
        WorkspaceService { ws, lc }
    }

    /// The call's lease as a fence, refused now if it already ended.
    fn fence<T>(&self, req: &Request<T>) -> Result<Option<Fence>, Status> {
        let lease = super::lease_of(req)?;
        self.lc.check_lease(&lease).map_err(lc_status)?;
        Ok(self.lc.fence(&lease))
    }
}

#[tonic::async_trait]
impl proto::workspace_server::Workspace for WorkspaceService {
    async fn initialize(
        &self,
        req: Request<Streaming<proto::InitializeRequest>>,
    ) -> Result<Response<proto::InitializeResponse>, Status> {
        use proto::initialize_request::Msg;
        let fence = self.fence(&req)?;
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
        let mut init = convert::init_request(header)?;
        init.fence = fence;
        let part = |m: proto::InitializeRequest| match m.msg {
            Some(Msg::Header(_)) => Part::Header,
            Some(Msg::Chunk(b)) => Part::Chunk(b),
            None => Part::Empty,
        };
        let stats = self
            .ws
            .initialize_streamed(init, |tx| forward(stream, tx, "InitializeHeader", part))
            .await
            .map_err(transfer_status)?;
        Ok(Response::new(convert::init_response(stats)))
    }

    type DumpStream = BoxStream<proto::DumpResponse>;

    async fn dump(
        &self,
        req: Request<proto::DumpRequest>,
    ) -> Result<Response<Self::DumpStream>, Status> {
        let fence = self.fence(&req)?;
        let r = req.into_inner();
        let compression = convert::compression(r.compression)?;
        let level = r.level;
        let mut dump = convert::dump_request(r);
        dump.fence = fence;
        let rx = self
            .ws
            .dump_streamed(dump, compression, level)
            .map_err(ws_status)?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|m| m.map(convert::dump_response).map_err(transfer_status));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn clear(
        &self,
        req: Request<proto::ClearRequest>,
    ) -> Result<Response<proto::ClearResponse>, Status> {
        let fence = self.fence(&req)?;
        let guard = self.ws.begin("Clear").map_err(ws_status)?;
        let start = std::time::Instant::now();
        let removed = tokio::task::spawn_blocking(move || guard.clear_for(&fence))
            .await
            .map_err(|e| Status::internal(format!("the clear task failed: {e}")))?
            .map_err(ws_status)?;
        Ok(Response::new(proto::ClearResponse {
            removed_entries: removed,
            duration_ms: start.elapsed().as_millis() as u64,
        }))
    }
}
