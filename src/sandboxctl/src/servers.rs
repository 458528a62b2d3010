//! `servers` (list, start, stop, restart) and `logs`.

use crate::output::outln;
use std::io::Write;
use std::process::ExitCode;

use anyhow::bail;
use sandbox_client::Client;
use sandbox_client::proto;
use serde_json::{Value, json};

use crate::output::{benchmark_name, bytes, rpc_error, status_str};

pub enum ServerVerb<'a> {
    List,
    Start(&'a str),
    Stop(&'a str, u32),
    Restart(&'a str),
}

pub async fn servers(
    client: &Client,
    verb: ServerVerb<'_>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let mut c = client.servers();
    let one = match verb {
        ServerVerb::List => {
            let list = c
                .list(proto::ListServersRequest {})
                .await
                .map_err(|s| rpc_error("Servers.List", s))?
                .into_inner()
                .servers;
            if json_out {
                outln!(
                    "{}",
                    json!({"ok": true, "servers": list.iter().map(server_json).collect::<Vec<_>>()})
                );
            } else {
                print_servers(&list);
            }
            return Ok(ExitCode::SUCCESS);
        }
        ServerVerb::Start(n) => c
            .start(proto::ServerRequest { name: n.into() })
            .await
            .map_err(|s| rpc_error("Servers.Start", s))?,
        ServerVerb::Stop(n, grace_ms) => c
            .stop(proto::StopServerRequest {
                name: n.into(),
                grace_ms,
            })
            .await
            .map_err(|s| rpc_error("Servers.Stop", s))?,
        ServerVerb::Restart(n) => c
            .restart(proto::ServerRequest { name: n.into() })
            .await
            .map_err(|s| rpc_error("Servers.Restart", s))?,
    }
    .into_inner();
    if json_out {
        let mut v = server_json(&one);
        v["ok"] = json!(true);
        outln!("{v}");
    } else {
        print_servers(std::slice::from_ref(&one));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn logs(
    client: &Client,
    name: &str,
    follow: bool,
    tail: u32,
    stream: Option<&str>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let stream = match stream {
        None | Some("all") => proto::LogStream::All,
        Some("stdout") => proto::LogStream::Stdout,
        Some("stderr") => proto::LogStream::Stderr,
        Some(o) => bail!("--stream {o:?}: use stdout, stderr or all"),
    };
    let mut s = client
        .servers()
        .logs(proto::LogsRequest {
            name: name.to_owned(),
            tail,
            follow,
            stream: stream as i32,
            cursor: 0,
        })
        .await
        .map_err(|s| rpc_error("Servers.Logs", s))?
        .into_inner();
    let mut out = std::io::stdout().lock();
    while let Some(line) = s
        .message()
        .await
        .map_err(|s| rpc_error("Servers.Logs", s))?
    {
        if json_out {
            writeln!(
                out,
                "{}",
                json!({
                    "seq": line.seq,
                    "stream": if line.stream == proto::LogStream::Stdout as i32 { "stdout" } else { "stderr" },
                    "timestamp_ms": line.timestamp_ms,
                    "line": String::from_utf8_lossy(&line.line),
                    "truncated": line.truncated,
                    "dropped_before": line.dropped_before,
                })
            )?;
        } else {
            if line.dropped_before > 0 {
                writeln!(out, "[… {} earlier lines dropped]", line.dropped_before)?;
            }
            out.write_all(&line.line)?;
            if line.truncated {
                out.write_all(" […]".as_bytes())?;
            }
            out.write_all(b"\n")?;
        }
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn state_str(v: i32) -> &'static str {
    match proto::ServerState::try_from(v) {
        Ok(proto::ServerState::Stopped) => "stopped",
        Ok(proto::ServerState::Starting) => "starting",
        Ok(proto::ServerState::Ready) => "ready",
        Ok(proto::ServerState::Backoff) => "backoff",
        Ok(proto::ServerState::Failed) => "failed",
        Ok(proto::ServerState::Stopping) => "stopping",
        Ok(proto::ServerState::Idle) => "idle",
        _ => "unknown",
    }
}

pub(crate) fn exit_str(e: &proto::ExitStatus) -> String {
    match e.how {
        Some(proto::exit_status::How::Code(c)) => format!("code {c}"),
        Some(proto::exit_status::How::Signal(s)) => format!("signal {s}"),
        None => "-".into(),
    }
}

pub(crate) fn server_json(s: &proto::ServerStatus) -> Value {
    json!({
        "name": s.name,
        "id": s.id,
        "state": state_str(s.state),
        "status": status_str(s.status),
        "pid": s.pid,
        "restarts": s.restarts,
        "last_exit": s.last_exit.as_ref().map(exit_str),
        "mcp_path": s.mcp_path,
        "started_at_ms": s.started_at_ms,
        "updated_at_ms": s.updated_at_ms,
        "cpu_time_ms": s.cpu_time_ms,
        "rss_bytes": s.rss_bytes,
        "processes": s.processes,
        "in_lease": s.in_lease,
        "benchmark": benchmark_name(s.benchmark),
        "message": s.message,
        "stderr_tail": s.stderr_tail,
        "metadata": s.metadata,
    })
}

pub(crate) fn print_servers(list: &[proto::ServerStatus]) {
    outln!(
        "{:<24} {:<9} {:>7} {:>8} {:>10} {:>9}  DETAIL",
        "NAME",
        "STATE",
        "PID",
        "RESTARTS",
        "RSS",
        "CPU"
    );
    for s in list {
        let mut detail = s.message.clone();
        if detail.is_empty()
            && let Some(e) = &s.last_exit
        {
            detail = format!("last exit: {}", exit_str(e));
        }
        outln!(
            "{:<24} {:<9} {:>7} {:>8} {:>10} {:>8}s  {}",
            format!("{}{}", s.name, if s.in_lease { "*" } else { "" }),
            state_str(s.state),
            if s.pid == 0 {
                "-".into()
            } else {
                s.pid.to_string()
            },
            s.restarts,
            if s.rss_bytes == 0 {
                "-".into()
            } else {
                bytes(s.rss_bytes)
            },
            format!("{:.1}", s.cpu_time_ms as f64 / 1000.0),
            detail
        );
    }
}
