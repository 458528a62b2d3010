//! `mcp` (talk MCP to one server through the data plane) and `mcp-proxy`
//! (expose the data plane on this host).

use crate::output::outln;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use sandbox_client::auth::Token;
use sandbox_client::limits::MCP_VSOCK_PORT;
use sandbox_serve::listen::Conn;
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

/// Serves the agent's data plane on `listen` as an HTTP reverse proxy
/// (HTTP/1.1 or h2): each request to `/<server>/mcp` is checked (Host and
/// Origin local only, unless `--allow-host` says otherwise; the client's
/// token when `--require-token` is given) and forwarded with its body
/// streamed both ways.
pub(crate) async fn mcp_proxy(
    args: &Args,
    listen: &str,
    allow_hosts: &[String],
    require_token: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use sandbox_client::Endpoint;
    use sandbox_client::mcp_forward::Admit;
    use sandbox_client::transport::HvsockOptions;
    use sandbox_serve::listen::Listener;
    let target = mcp_endpoint(args)?;
    let ep: Endpoint = listen.parse()?;
    match &ep {
        Endpoint::Tcp { .. } if ep.is_loopback_tcp() => {}
        Endpoint::Unix { .. } => {}
        other => {
            anyhow::bail!("--listen {other}: the proxy listens on loopback tcp:// or unix:// only")
        }
    }
    let client_token = match require_token {
        Some(p) => Some(Token::load_or_create(p)?),
        None => None,
    };
    let upstream_token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(Token::new(t, "--token")?),
        (None, Some(p)) => Some(Token::from_file(p)?),
        (None, None) => None,
    };
    let admit = if allow_hosts.is_empty() {
        Admit::default()
    } else {
        Admit::hosts(allow_hosts.iter().cloned())
    };
    let listener = Listener::bind(&ep).await?;
    eprintln!(
        "sandboxctl: MCP data plane {target} available at {} (endpoints /<server>/mcp){}",
        listener.local_endpoint(),
        match require_token {
            Some(p) => format!("; clients send the token in {}", p.display()),
            None => String::new(),
        }
    );
    let (incoming, _accept) = listener.incoming(256);
    let timeout = Duration::from_secs_f64(args.timeout.max(0.001));
    let proxy = std::sync::Arc::new(Proxy {
        target,
        admit,
        client_token,
        upstream_token,
        timeout,
        hv: HvsockOptions {
            retry_deadline: timeout,
            ..HvsockOptions::default()
        },
    });
    serve_proxy(incoming, proxy).await;
    Ok(ExitCode::SUCCESS)
}

/// Serves each accepted connection (HTTP/1.1 or h2) through `proxy` until
/// Ctrl-C or the listener's end.
async fn serve_proxy(
    mut incoming: tokio_stream::wrappers::ReceiverStream<std::io::Result<Conn>>,
    proxy: std::sync::Arc<Proxy>,
) {
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
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
            });
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .await;
        });
    }
}

type ProxyBody = http_body_util::combinators::BoxBody<bytes::Bytes, hyper::Error>;

/// What `mcp-proxy` checks and where it forwards.
struct Proxy {
    target: sandbox_client::Endpoint,
    admit: sandbox_client::mcp_forward::Admit,
    client_token: Option<Token>,
    upstream_token: Option<Token>,
    timeout: Duration,
    hv: sandbox_client::transport::HvsockOptions,
}

impl Proxy {
    async fn handle(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<ProxyBody> {
        use http_body_util::BodyExt;
        use hyper::StatusCode;
        if let Err(e) = self.admit.check(req.uri(), req.headers()) {
            return refusal(StatusCode::FORBIDDEN, &e.to_string());
        }
        if let Some(want) = &self.client_token {
            let sent = req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                .filter(|(s, _)| s.eq_ignore_ascii_case("bearer"))
                .map(|(_, t)| t.trim());
            if !sent.is_some_and(|t| want.matches(t.as_bytes())) {
                return refusal(
                    StatusCode::UNAUTHORIZED,
                    "send Authorization: Bearer <the token of --require-token>",
                );
            }
        }
        let Some(server) = sandbox_client::mcp::server_of_path(req.uri().path()) else {
            return refusal(StatusCode::NOT_FOUND, "MCP endpoints are /<server>/mcp");
        };
        let path = format!("/{server}/mcp");
        let up = sandbox_client::mcp_forward::Upstream {
            token: self.upstream_token.as_ref().map(|t| t.expose()),
            lease: None,
        };
        match sandbox_client::mcp_forward::forward(
            &self.target,
            &path,
            req,
            up,
            self.timeout,
            &self.hv,
        )
        .await
        {
            Ok(resp) => resp.map(|b| b.boxed()),
            Err(e) => refusal(
                StatusCode::BAD_GATEWAY,
                &format!("cannot reach the data plane {}: {e}", self.target),
            ),
        }
    }
}

/// A JSON error answer of the proxy itself.
fn refusal(status: hyper::StatusCode, msg: &str) -> hyper::Response<ProxyBody> {
    use http_body_util::{BodyExt, Full};
    let body = json!({"error": msg}).to_string();
    let mut r = hyper::Response::new(
        Full::new(bytes::Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
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
