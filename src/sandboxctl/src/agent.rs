//! `health`, `info` and `bind-token`: the agent itself.

use crate::output::outln;
use std::process::ExitCode;

use sandbox_client::Client;
use sandbox_client::proto;
use sandbox_client::proto::health::HealthCheckRequest;
use sandbox_client::proto::health::health_check_response::ServingStatus;
use serde_json::json;

use crate::output::{bytes, duration, rpc_error, status_name};

pub(crate) async fn health(client: &Client, service: &str, json: bool) -> anyhow::Result<ExitCode> {
    let resp = client
        .health()
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Health.Check", s))?
        .into_inner();
    let status = ServingStatus::try_from(resp.status).unwrap_or(ServingStatus::Unknown);
    let name = status.as_str_name();
    // A server's health is SERVING only while ready: its state says
    // whether it is idle (lazy, not started yet), starting or failed.
    let state = match service.strip_prefix("mcp/") {
        Some(server) => server_state(client, server).await,
        None => None,
    };
    if json {
        let mut v = json!({ "ok": status == ServingStatus::Serving, "service": service, "status": name, "agent": client.endpoint().to_string() });
        if let Some(st) = state {
            v["state"] = json!(st);
        }
        outln!("{v}");
    } else if service.is_empty() {
        outln!("{name}");
    } else if let Some(st) = state {
        outln!("{service}: {name} ({st})");
    } else {
        outln!("{service}: {name}");
    }
    Ok(if status == ServingStatus::Serving {
        ExitCode::SUCCESS
    } else {
        if !json {
            eprintln!("sandboxctl: agent at {} is {name}", client.endpoint());
        }
        ExitCode::FAILURE
    })
}

/// `bind-token`: the new token is read (and checked, as the agent would)
/// from a file, never from argv.
pub(crate) async fn bind_token(
    client: &Client,
    new_token_file: &std::path::Path,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let token = sandbox_client::auth::Token::from_file(new_token_file)?;
    client
        .agent()
        .bind_token(proto::BindTokenRequest {
            token: token.expose().to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Agent.BindToken", s))?;
    let message = "token bound: the token of this call admits nothing now";
    if json {
        outln!("{}", json!({ "ok": true, "message": message }));
    } else {
        outln!("{message}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn info(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let i = client
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .map_err(|s| rpc_error("Agent.GetInfo", s))?
        .into_inner();
    let status = proto::SandboxStatus::try_from(i.status)
        .map(|s| status_name(s).to_owned())
        .unwrap_or_else(|_| format!("unknown ({})", i.status));
    if json {
        outln!("{}", info_json(&i, &status));
    } else {
        for (k, v) in info_rows(i, status) {
            outln!("{k:<10} {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `info --json`.
fn info_json(i: &proto::GetInfoResponse, status: &str) -> serde_json::Value {
    let load = i.load_average.unwrap_or_default();
    let ws = i.workspace.clone().unwrap_or_default();
    let lease = i.lease.as_ref().map(|l| {
        json!({
            "lease_id": l.lease_id,
            "benchmark": proto::Benchmark::try_from(l.benchmark).map(|b| b.as_str_name()).unwrap_or("unknown"),
            "server_names": l.server_names,
            "acquired_at_ms": l.acquired_at_ms,
            "ttl_seconds": l.ttl_seconds,
            "expires_at_ms": l.expires_at_ms,
            "test_account_email": l.test_account_email,
        })
    });
    json!({
        "ok": true,
        "agent_version": i.agent_version,
        "boot_id": i.boot_id,
        "system_uptime_seconds": i.system_uptime_seconds,
        "agent_uptime_ms": i.agent_uptime_ms,
        "agent_pid": i.agent_pid,
        "hostname": i.hostname,
        "kernel_release": i.kernel_release,
        "kernel_version": i.kernel_version,
        "arch": i.arch,
        "cpu_count": i.cpu_count,
        "load_average": [load.one, load.five, load.fifteen],
        "memory_total_bytes": i.memory_total_bytes,
        "memory_available_bytes": i.memory_available_bytes,
        "workspace": {
            "path": ws.path,
            "total_bytes": ws.total_bytes,
            "free_bytes": ws.free_bytes,
            "available_bytes": ws.available_bytes,
        },
        "agent_rss_bytes": i.agent_rss_bytes,
        "status": status,
        "lease": lease,
    })
}

/// `info` for people: one labelled row per fact.
fn info_rows(i: proto::GetInfoResponse, status: String) -> [(&'static str, String); 11] {
    let load = i.load_average.unwrap_or_default();
    let ws = i.workspace.unwrap_or_default();
    let lease = match &i.lease {
        None => "-".to_owned(),
        Some(l) => format!("{} ({} servers)", l.lease_id, l.server_names.len()),
    };
    [
        (
            "agent",
            format!(
                "sandbox-agent {} (pid {}, up {})",
                i.agent_version,
                i.agent_pid,
                duration(i.agent_uptime_ms / 1000)
            ),
        ),
        ("status", status),
        ("lease", lease),
        ("hostname", i.hostname),
        ("kernel", format!("{} {}", i.kernel_release, i.arch)),
        ("boot id", i.boot_id),
        ("uptime", duration(i.system_uptime_seconds)),
        (
            "cpus",
            format!(
                "{} (load {:.2} {:.2} {:.2})",
                i.cpu_count, load.one, load.five, load.fifteen
            ),
        ),
        (
            "memory",
            format!(
                "{} available of {}",
                bytes(i.memory_available_bytes),
                bytes(i.memory_total_bytes)
            ),
        ),
        (
            "workspace",
            format!(
                "{} ({} available of {})",
                ws.path,
                bytes(ws.available_bytes),
                bytes(ws.total_bytes)
            ),
        ),
        ("agent rss", bytes(i.agent_rss_bytes)),
    ]
}

/// A server's state (`idle`, `starting`, `ready`, …), if the agent lists it.
async fn server_state(client: &Client, server: &str) -> Option<&'static str> {
    let list = client
        .servers()
        .list(proto::ListServersRequest {})
        .await
        .ok()?
        .into_inner();
    list.servers
        .iter()
        .find(|s| s.name == server)
        .map(|s| crate::servers::state_str(s.state))
}
