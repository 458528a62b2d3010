//! The agent's `Agent` and `Servers` services as the tests drive them:
//! a client, Acquire requests, server lists and states.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_client::proto;

use super::{Agent, eventually_async};

/// A gRPC client of `agent` over its unix socket.
pub async fn client(agent: &Agent) -> sandbox_client::Client {
    sandbox_client::connect(&agent.unix_uri())
        .await
        .expect("connect")
}

/// An Acquire of `names` under lease `id` (servers started before the
/// answer; `lazy: true` for first use).
pub fn acquire_req(id: &str, names: &[&str]) -> proto::AcquireRequest {
    proto::AcquireRequest {
        lease_id: id.into(),
        server_names: names.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub async fn list(c: &sandbox_client::Client) -> Vec<proto::ServerStatus> {
    c.servers()
        .list(proto::ListServersRequest {})
        .await
        .expect("List")
        .into_inner()
        .servers
}

/// Each server's state and pid, by name.
pub async fn states(c: &sandbox_client::Client) -> BTreeMap<String, (i32, u32)> {
    list(c)
        .await
        .into_iter()
        .map(|s| (s.name, (s.state, s.pid)))
        .collect()
}

pub async fn server(c: &sandbox_client::Client, name: &str) -> proto::ServerStatus {
    list(c)
        .await
        .into_iter()
        .find(|s| s.name == name)
        .expect("server listed")
}

/// Waits until server `name` satisfies `pred`.
pub async fn wait_state(
    c: &sandbox_client::Client,
    name: &str,
    timeout: Duration,
    pred: impl Fn(&proto::ServerStatus) -> bool,
) -> proto::ServerStatus {
    let what = format!("{name} reaches the state");
    eventually_async(timeout, &what, async || {
        let s = server(c, name).await;
        if pred(&s) {
            Ok(s)
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await
}

/// The gRPC health of `service` (`""` for the agent, `mcp/NAME`).
pub async fn health(c: &sandbox_client::Client, service: &str) -> i32 {
    c.health()
        .check(proto::health::HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health")
        .into_inner()
        .status
}

/// The health of `service` once it is `want`, or what it still is after
/// 10 s: the agent mirrors a server's readiness into grpc.health.v1 from a
/// task of its own, so an Acquire's answer can come a moment before it.
pub async fn health_becomes(c: &sandbox_client::Client, service: &str, want: i32) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = health(c, service).await;
        if now == want || std::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Resets lease `id`; the agent's answer.
pub async fn reset(c: &sandbox_client::Client, id: &str) -> proto::ResetResponse {
    c.agent()
        .reset(proto::ResetRequest {
            lease_id: id.into(),
        })
        .await
        .expect("Reset")
        .into_inner()
}

/// Releases lease `id` (not by TTL).
pub async fn release(c: &sandbox_client::Client, id: &str) {
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: id.into(),
            is_ttl: false,
            ..Default::default()
        })
        .await
        .expect("Release");
}
