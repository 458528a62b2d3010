//! `sandbox.agent.v1.Agent`: GetInfo, the lease lifecycle and the agent's
//! token (BindToken).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::convert::{self, benchmark_from_proto, lease, sandbox_status, server_status, ttl};
use super::status::{bind_status, lc_status};
use crate::agent_token::AgentToken;
use crate::info;
use crate::lifecycle::{self, AcquireParams, Lifecycle, NarrowParams};
use sandbox_client::proto;

pub struct AgentService {
    info: Arc<info::Collector>,
    lc: Arc<Lifecycle>,
    /// What every token-checked listener admits (BindToken replaces it).
    token: AgentToken,
    /// The agent's stop signal (the one SIGTERM cancels).
    shutdown: CancellationToken,
}

impl AgentService {
    pub fn new(
        info: Arc<info::Collector>,
        lc: Arc<Lifecycle>,
        token: AgentToken,
        shutdown: CancellationToken,
    ) -> AgentService {
        AgentService {
            info,
            lc,
            token,
            shutdown,
        }
    }

    fn servers(&self, names: &[String]) -> Vec<proto::ServerStatus> {
        self.lc
            .servers(Some(names))
            .into_iter()
            .map(server_status)
            .collect()
    }
}

impl AgentService {
    /// The answer to an Acquire or a Narrow.
    fn acquired(
        &self,
        l: &lifecycle::Lease,
        st: lifecycle::SandboxStatus,
    ) -> proto::AcquireResponse {
        proto::AcquireResponse {
            status: sandbox_status(st),
            message: convert::acquired_message(l),
            lease: Some(lease(l)),
            servers: self.servers(&l.servers),
        }
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
        Ok(Response::new(convert::info(
            s,
            self.lc.view(),
            self.lc.manifest_path().display().to_string(),
            self.lc.catalog(),
        )))
    }

    async fn acquire(
        &self,
        req: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let mut r = req.into_inner();
        let servers = convert::selection(&mut r)?;
        let credentials = convert::credentials(&r.auth_data, r.env)?;
        let params = AcquireParams {
            lease_id: r.lease_id,
            servers,
            benchmark: benchmark_from_proto(r.benchmark)?,
            ttl: ttl(r.ttl_seconds),
            test_account_email: r.test_account_email,
            credentials,
            lazy: r.lazy,
        };
        let (l, st) = self.lc.acquire(params).await.map_err(lc_status)?;
        Ok(Response::new(self.acquired(&l, st)))
    }

    async fn narrow(
        &self,
        req: Request<proto::NarrowRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let r = req.into_inner();
        let params = NarrowParams {
            lease_id: r.lease_id,
            new_lease_id: r.new_lease_id,
            servers: r.server_names,
            benchmark: benchmark_from_proto(r.benchmark)?,
            ttl: ttl(r.ttl_seconds),
            test_account_email: r.test_account_email,
        };
        let (l, st, trim) = self.lc.narrow(params).await.map_err(lc_status)?;
        let answer = self.acquired(&l, st);
        // The servers that left the lease stop once the answer is ready.
        drop(trim);
        Ok(Response::new(answer))
    }

    async fn release(
        &self,
        req: Request<proto::ReleaseRequest>,
    ) -> Result<Response<proto::ReleaseResponse>, Status> {
        let meta = super::lease_of(&req)?;
        let r = req.into_inner();
        let lease = super::one_lease(&r.lease_id, meta)?;
        let (message, discarded) = if r.discard {
            let m = self.lc.release_for_discard(&lease, r.is_ttl).await;
            m.map(|m| (m, true))
        } else {
            let over = r.discard_over_inodes;
            self.lc.release_or_discard(&lease, r.is_ttl, over).await
        }
        .map_err(lc_status)?;
        Ok(Response::new(proto::ReleaseResponse {
            status: sandbox_status(self.lc.view().status),
            message,
            discarded,
        }))
    }

    async fn reset(
        &self,
        req: Request<proto::ResetRequest>,
    ) -> Result<Response<proto::ResetResponse>, Status> {
        let meta = super::lease_of(&req)?;
        let r = req.into_inner();
        let lease_id = super::one_lease(&r.lease_id, meta)?;
        let (l, st) = self.lc.reset(&lease_id).await.map_err(lc_status)?;
        Ok(Response::new(proto::ResetResponse {
            status: sandbox_status(st),
            message: format!(
                "lease {} reset; {} {}",
                l.id,
                l.servers.join(", "),
                convert::servers_are(&l)
            ),
            servers: self.servers(&l.servers),
            lease: Some(lease(&l)),
        }))
    }

    async fn bind_token(
        &self,
        req: Request<proto::BindTokenRequest>,
    ) -> Result<Response<proto::BindTokenResponse>, Status> {
        self.token
            .bind(&req.into_inner().token)
            .map_err(bind_status)?;
        Ok(Response::new(proto::BindTokenResponse {}))
    }

    async fn shutdown(
        &self,
        req: Request<proto::ShutdownRequest>,
    ) -> Result<Response<proto::ShutdownResponse>, Status> {
        let reason = req.into_inner().reason;
        let power_off = crate::init::is_pid1();
        tracing::info!(%reason, power_off, "Shutdown requested");
        // Answer first: the stop begins once this response is on its way.
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            stop.cancel();
        });
        Ok(Response::new(proto::ShutdownResponse { power_off }))
    }
}
