//! `mcp` (talk MCP to one server through the data plane) and `mcp-proxy`
//! (expose the data plane on this host).

use crate::output::outln;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sandbox_client::auth::Token;
use sandbox_client::limits::MCP_VSOCK_PORT;
use serde_json::json;

use crate::cli::{Args, McpVerb};

/// `mcp` is dispatched before the control-plane connection is made.
pub(crate) fn unreachable_mcp() -> anyhow::Result<ExitCode> {
    anyhow::bail!("internal error: the mcp verb reached the control-plane dispatcher")
}

/// The data-plane endpoint: --mcp, or the MCP port (1025) of a vsock/hvsock
/// --agent.
pub(crate) fn mcp_endpoint(args: &Args) -> anyhow::Result<sandbox_client::Endpoint> {
    use sandbox_client::Endpoint;
    if let Some(m) = &args.mcp {
        return Ok(m.parse()?);
    }
    let agent: Endpoint = args
        .agent
        .as_deref()
        .context("no data plane given: pass --mcp URI (or --agent with a vsock:// or hvsock:// endpoint)")?
        .parse()?;
    match agent {
        Endpoint::Vsock { cid, .. } => Ok(Endpoint::Vsock {
            cid,
            port: MCP_VSOCK_PORT,
        }),
        Endpoint::HybridVsock { path, .. } => Ok(Endpoint::HybridVsock {
            path,
            port: MCP_VSOCK_PORT,
        }),
        other => {
            anyhow::bail!("--agent {other} says nothing about the MCP data plane; pass --mcp URI")
        }
    }
}

/// Forwards every connection on `listen` to the agent's data plane, byte
/// for byte (HTTP/1.1 or h2 alike). Clients send the agent's token
/// themselves when its data plane requires one.
pub(crate) async fn mcp_proxy(args: &Args, listen: &str) -> anyhow::Result<ExitCode> {
    use sandbox_client::Endpoint;
    use sandbox_client::transport::{HvsockOptions, Listener, dial};
    let target = mcp_endpoint(args)?;
    let ep: Endpoint = listen.parse()?;
    match &ep {
        Endpoint::Tcp { .. } if ep.is_loopback_tcp() => {}
        Endpoint::Unix { .. } => {}
        other => {
            anyhow::bail!("--listen {other}: the proxy listens on loopback tcp:// or unix:// only")
        }
    }
    let listener = Listener::bind(&ep).await?;
    eprintln!(
        "sandboxctl: MCP data plane {target} available at {} (endpoints /<server>/mcp)",
        listener.local_endpoint()
    );
    let (mut incoming, _accept) = listener.incoming(256);
    let timeout = Duration::from_secs_f64(args.timeout.max(0.001));
    let hv = HvsockOptions {
        retry_deadline: timeout,
        ..HvsockOptions::default()
    };
    use tokio_stream::StreamExt;
    loop {
        let conn = tokio::select! {
            c = incoming.next() => match c {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    eprintln!("sandboxctl: accept failed: {e}");
                    continue;
                }
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
        };
        let (target, hv) = (target.clone(), hv.clone());
        tokio::spawn(async move {
            let mut conn = conn;
            match dial(&target, timeout, &hv).await {
                Ok(mut up) => {
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                }
                Err(e) => eprintln!("sandboxctl: cannot reach the data plane {target}: {e}"),
            }
        });
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn mcp(args: &Args, name: &str, verb: &McpVerb) -> anyhow::Result<ExitCode> {
    let ep = mcp_endpoint(args)?;
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(Token::new(t, "--token")?),
        (None, Some(p)) => Some(Token::from_file(p)?),
        (None, None) => None,
    };
    let timeout = Duration::from_secs_f64(args.timeout.max(0.001));
    let mut c = sandbox_client::mcp_client::McpHttpClient::connect(&ep, name, token, timeout)
        .await
        .with_context(|| format!("MCP session with {name} at {ep}"))?;
    match verb {
        McpVerb::Tools => {
            let r = c.call("tools/list", json!({})).await?;
            if args.json {
                outln!("{}", json!({"ok": true, "tools": r["tools"]}));
            } else {
                for t in r["tools"].as_array().into_iter().flatten() {
                    let desc = t["description"].as_str().unwrap_or("");
                    let first = desc.lines().next().unwrap_or("");
                    outln!("{:<28} {first}", t["name"].as_str().unwrap_or("?"));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        McpVerb::Call { tool, args: a } => {
            let arguments: serde_json::Value =
                serde_json::from_str(a).with_context(|| format!("--args {a:?} is not JSON"))?;
            let r = c
                .call("tools/call", json!({"name": tool, "arguments": arguments}))
                .await?;
            let is_error = r["isError"].as_bool().unwrap_or(false);
            if args.json {
                outln!("{}", json!({"ok": !is_error, "result": r}));
            } else {
                for item in r["content"].as_array().into_iter().flatten() {
                    match item["text"].as_str() {
                        Some(t) => outln!("{t}"),
                        None => outln!("{item}"),
                    }
                }
            }
            Ok(if is_error {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
