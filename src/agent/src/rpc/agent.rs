//! `sandbox.agent.v1.Agent`: GetInfo and the lease lifecycle.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::lc_status;
use super::servers::server_status;
use crate::info;
use crate::lifecycle::{self, AcquireParams, Lifecycle, NarrowParams, Selection, Ttl};
use crate::supervisor::manifest::{Benchmark, Credentials};
use sandbox_client::proto;

pub struct AgentService {
    info: Arc<info::Collector>,
    lc: Arc<Lifecycle>,
    /// The agent's stop signal (the one SIGTERM cancels).
    shutdown: CancellationToken,
}

impl AgentService {
    pub fn new(
        info: Arc<info::Collector>,
        lc: Arc<Lifecycle>,
        shutdown: CancellationToken,
    ) -> AgentService {
        AgentService { info, lc, shutdown }
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
            status: status(st),
            message: format!(
                "{} server{} ready: {}{}",
                l.servers.len(),
                if l.servers.len() == 1 { "" } else { "s" },
                l.servers.join(", "),
                skipped_note(&l.skipped)
            ),
            lease: Some(lease(l)),
            servers: self.servers(&l.servers),
        }
    }
}

/// "; left out, ..." naming the servers an ALL Acquire did not start.
pub(crate) fn skipped_note(skipped: &[(String, String)]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = skipped.iter().map(|(n, _)| n.as_str()).collect();
    format!(
        "; left out, their outside service is not configured: {}",
        names.join(", ")
    )
}

/// AcquireRequest.ttl_seconds: absent is the default, 0 is none.
fn ttl(t: Option<u32>) -> Ttl {
    match t {
        None => Ttl::Default,
        Some(0) => Ttl::Never,
        Some(s) => Ttl::Seconds(s),
    }
}

pub(super) fn status(s: lifecycle::SandboxStatus) -> i32 {
    (match s {
        lifecycle::SandboxStatus::Idle => proto::SandboxStatus::Idle,
        lifecycle::SandboxStatus::Occupied => proto::SandboxStatus::Occupied,
        lifecycle::SandboxStatus::Error => proto::SandboxStatus::Error,
    }) as i32
}

pub(super) fn benchmark_to_proto(b: Option<Benchmark>) -> i32 {
    (match b {
        None => proto::Benchmark::Unspecified,
        Some(Benchmark::McpAtlas) => proto::Benchmark::McpAtlas,
        Some(Benchmark::Toolathlon) => proto::Benchmark::Toolathlon,
        Some(Benchmark::McpMark) => proto::Benchmark::McpMark,
    }) as i32
}

fn benchmark_from_proto(v: i32) -> Result<Option<Benchmark>, Status> {
    match proto::Benchmark::try_from(v) {
        Ok(proto::Benchmark::Unspecified) => Ok(None),
        Ok(proto::Benchmark::McpAtlas) => Ok(Some(Benchmark::McpAtlas)),
        Ok(proto::Benchmark::Toolathlon) => Ok(Some(Benchmark::Toolathlon)),
        Ok(proto::Benchmark::McpMark) => Ok(Some(Benchmark::McpMark)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown benchmark value {v}; use MCP_Atlas, Toolathlon or MCP_Mark"
        ))),
    }
}

fn lease(l: &lifecycle::Lease) -> proto::Lease {
    proto::Lease {
        lease_id: l.id.clone(),
        benchmark: benchmark_to_proto(l.benchmark),
        server_names: l.servers.clone(),
        acquired_at_ms: l.acquired_at_ms,
        ttl_seconds: l.ttl_seconds,
        expires_at_ms: l.expires_at_ms,
        test_account_email: l.test_account_email.clone(),
        skipped: l
            .skipped
            .iter()
            .map(|(name, reason)| proto::SkippedServer {
                name: name.clone(),
                reason: reason.clone(),
            })
            .collect(),
        auth_data: l
            .auth_data
            .iter()
            .map(|(server, fields)| {
                let fields = fields
                    .iter()
                    .map(|(k, v)| (k.clone(), json_value(v)))
                    .collect();
                (server.clone(), prost_types::Struct { fields })
            })
            .collect(),
    }
}

/// A JSON value as a protobuf one.
fn json_value(v: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// auth_data values as environment strings: strings as they are, numbers
/// and booleans in their JSON form; nested values are refused.
fn auth_strings(server: &str, s: &prost_types::Struct) -> Result<BTreeMap<String, String>, Status> {
    use prost_types::value::Kind;
    let mut out = BTreeMap::new();
    for (k, v) in &s.fields {
        let text = match &v.kind {
            Some(Kind::StringValue(t)) => t.clone(),
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 1e15 => {
                format!("{}", *n as i64)
            }
            Some(Kind::NumberValue(n)) => n.to_string(),
            Some(Kind::BoolValue(b)) => b.to_string(),
            Some(Kind::NullValue(_)) | None => continue,
            Some(_) => {
                return Err(Status::invalid_argument(format!(
                    "auth_data[{server:?}].{k}: only strings, numbers and booleans can be passed to a server"
                )));
            }
        };
        out.insert(k.clone(), text);
    }
    Ok(out)
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
        let view = self.lc.view();
        Ok(Response::new(proto::GetInfoResponse {
            agent_version: sandbox_client::VERSION.to_owned(),
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
            status: status(view.status),
            lease: view.lease.as_ref().map(lease),
            last_release: view.last_release.map(|r| proto::ReleaseRecord {
                lease_id: r.lease_id,
                is_ttl: r.is_ttl,
                released_at_ms: r.at_ms,
            }),
            manifest_path: self.lc.manifest_path().display().to_string(),
            manifest_servers: self.lc.catalog(),
        }))
    }

    async fn acquire(
        &self,
        req: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let r = req.into_inner();
        let servers = match (r.all_servers, r.no_servers, r.server_names.is_empty()) {
            (true, false, true) => Selection::All,
            (false, true, true) => Selection::Nothing,
            (false, false, false) => Selection::Names(r.server_names),
            (false, false, true) => {
                return Err(Status::invalid_argument(
                    "server_names is empty; name the servers to start, or set all_servers or no_servers",
                ));
            }
            _ => {
                return Err(Status::invalid_argument(
                    "give one of server_names, all_servers and no_servers",
                ));
            }
        };
        let mut credentials: BTreeMap<String, Credentials> = BTreeMap::new();
        for (server, s) in &r.auth_data {
            credentials.entry(server.clone()).or_default().auth = auth_strings(server, s)?;
        }
        for (server, e) in r.env {
            credentials.entry(server).or_default().env = e.vars.into_iter().collect();
        }
        let params = AcquireParams {
            lease_id: r.lease_id,
            servers,
            benchmark: benchmark_from_proto(r.benchmark)?,
            ttl: ttl(r.ttl_seconds),
            test_account_email: r.test_account_email,
            credentials,
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
        let r = req.into_inner();
        let message = self
            .lc
            .release(&r.lease_id, r.is_ttl)
            .await
            .map_err(lc_status)?;
        Ok(Response::new(proto::ReleaseResponse {
            status: status(self.lc.view().status),
            message,
        }))
    }

    async fn reset(
        &self,
        req: Request<proto::ResetRequest>,
    ) -> Result<Response<proto::ResetResponse>, Status> {
        let r = req.into_inner();
        let (l, st) = self.lc.reset(&r.lease_id).await.map_err(lc_status)?;
        Ok(Response::new(proto::ResetResponse {
            status: status(st),
            message: format!("lease {} reset; {} ready", l.id, l.servers.join(", ")),
            servers: self.servers(&l.servers),
            lease: Some(lease(&l)),
        }))
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
