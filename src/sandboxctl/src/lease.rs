//! Lease and server verbs: acquire, release, reset, status, servers, logs.

use crate::output::outln;
use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{Context, bail};
use sandbox_client::Client;
use sandbox_client::proto;
use serde_json::{Value, json};

use crate::output::{benchmark_name, rpc_error, status_str};
use crate::servers::{print_servers, server_json};
/// `--auth NAME.KEY=VALUE` / `--env NAME.VAR=VALUE` → (server, key, value).
fn split_assignment(flag: &str, s: &str) -> anyhow::Result<(String, String, String)> {
    let (lhs, value) = s
        .split_once('=')
        .with_context(|| format!("{flag} {s:?}: expected SERVER.KEY=VALUE"))?;
    let (server, key) = lhs
        .split_once('.')
        .with_context(|| format!("{flag} {s:?}: expected SERVER.KEY=VALUE"))?;
    Ok((server.to_owned(), key.to_owned(), value.to_owned()))
}

pub struct AcquireArgs<'a> {
    pub servers: &'a [String],
    pub all: bool,
    pub benchmark: Option<&'a str>,
    pub ttl: Option<u32>,
    pub no_ttl: bool,
    pub lease_id: Option<&'a str>,
    pub email: Option<&'a str>,
    pub auth: &'a [String],
    pub env: &'a [String],
    pub lazy: bool,
}

fn benchmark(b: &str) -> anyhow::Result<proto::Benchmark> {
    match proto::Benchmark::from_klavis(b) {
        Some(p) => Ok(p),
        None => bail!("unknown benchmark {b:?}; use MCP_Atlas, Toolathlon or MCP_Mark"),
    }
}

fn new_lease_id() -> anyhow::Result<String> {
    let token = sandbox_client::random::hex_token(8).context("making a lease id")?;
    Ok(format!("lease-{token}"))
}

pub async fn acquire(
    client: &Client,
    a: AcquireArgs<'_>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    if a.all != a.servers.is_empty() {
        bail!("give --servers a,b,… or --all (one of the two)");
    }
    let mut auth: HashMap<String, prost_types::Struct> = HashMap::new();
    for s in a.auth {
        let (server, key, value) = split_assignment("--auth", s)?;
        auth.entry(server).or_default().fields.insert(
            key,
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(value)),
            },
        );
    }
    let mut env: HashMap<String, proto::EnvVars> = HashMap::new();
    for s in a.env {
        let (server, key, value) = split_assignment("--env", s)?;
        env.entry(server).or_default().vars.insert(key, value);
    }
    let req = proto::AcquireRequest {
        lease_id: match a.lease_id {
            Some(id) => id.to_owned(),
            None => new_lease_id()?,
        },
        server_names: a.servers.to_vec(),
        all_servers: a.all,
        benchmark: a.benchmark.map(benchmark).transpose()?.unwrap_or_default() as i32,
        ttl_seconds: if a.no_ttl { Some(0) } else { a.ttl },
        test_account_email: a.email.unwrap_or_default().to_owned(),
        auth_data: auth,
        env,
        no_servers: false,
        lazy: a.lazy,
    };
    let r = client
        .agent()
        .acquire(req)
        .await
        .map_err(|s| rpc_error("Agent.Acquire", s))?
        .into_inner();
    if json_out {
        outln!(
            "{}",
            outcome_json(r.status, r.lease.as_ref(), &r.servers, &r.message)
        );
    } else {
        if let Some(l) = &r.lease {
            outln!("lease {} ({})", l.lease_id, status_str(r.status));
        }
        outln!("{}", r.message);
        print_servers(&r.servers);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn release(
    client: &Client,
    lease_id: Option<&str>,
    is_ttl: bool,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let r = client
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: lease_id.unwrap_or_default().to_owned(),
            is_ttl,
            ..Default::default()
        })
        .await
        .map_err(|s| rpc_error("Agent.Release", s))?
        .into_inner();
    if json_out {
        outln!(
            "{}",
            json!({"ok": true, "status": status_str(r.status), "message": r.message})
        );
    } else {
        outln!("{}", r.message);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn shutdown(client: &Client, reason: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let r = client
        .agent()
        .shutdown(proto::ShutdownRequest {
            reason: reason.to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Agent.Shutdown", s))?
        .into_inner();
    let message = if r.power_off {
        "the agent is stopping; the VM powers off"
    } else {
        "the agent is stopping"
    };
    if json_out {
        outln!(
            "{}",
            json!({"ok": true, "power_off": r.power_off, "message": message})
        );
    } else {
        outln!("{message}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn reset(
    client: &Client,
    lease_id: Option<&str>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let r = client
        .agent()
        .reset(proto::ResetRequest {
            lease_id: lease_id.unwrap_or_default().to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Agent.Reset", s))?
        .into_inner();
    if json_out {
        outln!(
            "{}",
            outcome_json(r.status, r.lease.as_ref(), &r.servers, &r.message)
        );
    } else {
        outln!("{}", r.message);
        print_servers(&r.servers);
    }
    Ok(ExitCode::SUCCESS)
}

/// Sandbox status, lease and servers in one view.
pub async fn status(client: &Client, json_out: bool) -> anyhow::Result<ExitCode> {
    let info = client
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .map_err(|s| rpc_error("Agent.GetInfo", s))?
        .into_inner();
    let servers = client
        .servers()
        .list(proto::ListServersRequest {})
        .await
        .map_err(|s| rpc_error("Servers.List", s))?
        .into_inner()
        .servers;
    let last = info.last_release.as_ref().map(
        |r| json!({"lease_id": r.lease_id, "is_ttl": r.is_ttl, "released_at_ms": r.released_at_ms}),
    );
    if json_out {
        outln!(
            "{}",
            json!({
                "ok": true,
                "status": status_str(info.status),
                "lease": info.lease.as_ref().map(lease_json),
                "last_release": last,
                "servers": servers.iter().map(server_json).collect::<Vec<_>>(),
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    outln!("status     {}", status_str(info.status));
    match &info.lease {
        Some(l) => {
            outln!("lease      {}", l.lease_id);
            outln!(
                "benchmark  {}",
                benchmark_name(l.benchmark).as_str().unwrap_or("-")
            );
            outln!("servers    {}", l.server_names.join(", "));
            if l.expires_at_ms > 0 {
                let left = l.expires_at_ms.saturating_sub(sandbox_client::now_ms()) / 1000;
                outln!("expires in {left} s (ttl {} s)", l.ttl_seconds);
            } else {
                outln!("expires    never");
            }
        }
        None => outln!("lease      -"),
    }
    if let Some(r) = &info.last_release {
        outln!(
            "released   {}{}",
            r.lease_id,
            if r.is_ttl { " (TTL)" } else { "" }
        );
    }
    outln!();
    print_servers(&servers);
    Ok(ExitCode::SUCCESS)
}

/// What Acquire and Reset answer, as JSON.
fn outcome_json(
    status: i32,
    lease: Option<&proto::Lease>,
    servers: &[proto::ServerStatus],
    message: &str,
) -> Value {
    json!({
        "ok": true,
        "status": status_str(status),
        "lease": lease.map(lease_json),
        "servers": servers.iter().map(server_json).collect::<Vec<_>>(),
        "message": message,
    })
}

fn lease_json(l: &proto::Lease) -> Value {
    json!({
        "lease_id": l.lease_id,
        "benchmark": benchmark_name(l.benchmark),
        "server_names": l.server_names,
        "acquired_at_ms": l.acquired_at_ms,
        "ttl_seconds": l.ttl_seconds,
        "expires_at_ms": l.expires_at_ms,
        "test_account_email": l.test_account_email,
    })
}
