//! `sandbox.agent.v1.Servers`: the supervised MCP servers.

use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use super::BoxStream;
use super::convert::{self, server_status};
use super::status::lc_status;
use crate::lifecycle::Lifecycle;
use crate::server_data::Load;
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
        let only = convert::log_stream_filter(r.stream)?;
        let cursor = if r.cursor > 0 {
            r.cursor
        } else {
            log.tail_cursor(r.tail as usize)
        };
        let name = r.name;
        let lines = log
            .stream(cursor, only, r.follow)
            .map(move |f| Ok(convert::log_line(name.clone(), f)));
        Ok(Response::new(Box::pin(lines)))
    }

    async fn load_data(
        &self,
        req: Request<proto::LoadDataRequest>,
    ) -> Result<Response<proto::LoadDataResponse>, Status> {
        let lease = super::lease_of(&req)?;
        let r = req.into_inner();
        let what = if r.default_data {
            Load::Default
        } else {
            Load::Json(r.json.as_bytes())
        };
        let summary = self
            .lc
            .load_server_data(&lease, &r.server_name, what)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(proto::LoadDataResponse { summary }))
    }

    async fn dump_data(
        &self,
        req: Request<proto::DumpDataRequest>,
    ) -> Result<Response<proto::DumpDataResponse>, Status> {
        let lease = super::lease_of(&req)?;
        let name = req.into_inner().server_name;
        let json = self
            .lc
            .dump_server_data(&lease, &name)
            .await
            .map_err(lc_status)?;
        let json = String::from_utf8(json)
            .map_err(|e| Status::internal(format!("the dump of {name} is not UTF-8: {e}")))?;
        Ok(Response::new(proto::DumpDataResponse {
            json,
            dumped_at_ms: crate::supervisor::now_ms(),
        }))
    }

    async fn record_catalogs(
        &self,
        req: Request<proto::RecordCatalogsRequest>,
    ) -> Result<Response<proto::RecordCatalogsResponse>, Status> {
        let known = req.into_inner().known.into_iter().collect();
        let r = self.lc.record_catalogs(&known).await.map_err(lc_status)?;
        let mut catalogs = Vec::new();
        for c in r.catalogs {
            let json = serde_json::to_vec(&c).map_err(|e| {
                Status::internal(format!("writing the catalog of {}: {e}", c.server))
            })?;
            let label = crate::lifecycle::catalog_label(&c);
            catalogs.push(proto::ServerCatalog {
                label,
                key: c.key,
                json: json.into(),
            });
        }
        let skipped = r
            .skipped
            .into_iter()
            .map(|(label, why)| proto::SkippedCatalog { label, why })
            .collect();
        Ok(Response::new(proto::RecordCatalogsResponse {
            catalogs,
            skipped,
            unchanged: u32::try_from(r.unchanged).unwrap_or(u32::MAX),
        }))
    }

    async fn put_catalogs(
        &self,
        req: Request<proto::PutCatalogsRequest>,
    ) -> Result<Response<proto::PutCatalogsResponse>, Status> {
        let given = req.into_inner().catalogs;
        let taken = self.lc.put_catalogs(&given).map_err(lc_status)?;
        Ok(Response::new(proto::PutCatalogsResponse {
            taken: u32::try_from(taken).unwrap_or(u32::MAX),
        }))
    }
}
