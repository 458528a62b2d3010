//! `sandboxctl`: host-side command line client of a sandbox agent.
//!
//! Exit status: 0 on success, 1 when the operation failed (agent unreachable,
//! RPC error, health not SERVING), 2 for usage errors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::{Parser, Subcommand};
use sandbox_client::auth::Token;
use sandbox_client::proto;
use sandbox_client::proto::health::HealthCheckRequest;
use sandbox_client::proto::health::health_check_response::ServingStatus;
use sandbox_client::transport::HvsockOptions;
use sandbox_client::{Client, ConnectOptions, error_chain};
use serde_json::json;

/// Control a sandbox agent from the host.
#[derive(Parser, Debug)]
#[command(name = "sandboxctl", version)]
struct Args {
    /// Agent endpoint: vsock://CID:PORT, unix:///path, tcp://HOST:PORT or
    /// hvsock:///path/to/vsock.sock:PORT.
    #[arg(long, global = true, value_name = "URI", env = "SANDBOX_AGENT")]
    agent: Option<String>,

    /// The agent's MCP data plane (for `mcp`). Default: port 1025 of the
    /// --agent vsock/hvsock endpoint; required for unix:// and tcp:// agents.
    #[arg(long, global = true, value_name = "URI", env = "SANDBOX_AGENT_MCP")]
    mcp: Option<String>,

    /// Bearer token (required by tcp:// listeners).
    #[arg(
        long,
        global = true,
        env = "SANDBOX_AGENT_TOKEN",
        hide_env_values = true,
        conflicts_with = "token_file"
    )]
    token: Option<String>,

    /// File holding the bearer token.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "SANDBOX_AGENT_TOKEN_FILE"
    )]
    token_file: Option<PathBuf>,

    /// Seconds to wait for a connection (for hvsock://, the retry deadline
    /// while the VM boots).
    #[arg(long, global = true, default_value_t = 5.0, value_name = "SECONDS")]
    timeout: f64,

    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Health of the agent (grpc.health.v1). Exit 0 only when SERVING.
    Health {
        /// Check one service (e.g. sandbox.agent.v1.Workspace) instead of
        /// the whole agent.
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Agent version, machine, resources and lease.
    Info,
    /// Load a directory (packed and compressed on the fly) or an archive file
    /// (.tar, .tar.gz, .tar.zst) into the workspace, atomically.
    Upload {
        /// Directory or archive file.
        path: PathBuf,
        /// Lay the contents over the workspace instead of replacing it.
        #[arg(long)]
        merge: bool,
    },
    /// Download the workspace as a tar.gz (or tar.zst) archive.
    Dump {
        /// Output file, or - for standard output. A file appears only once
        /// the whole archive arrived and its sha256 matched.
        #[arg(short, long, value_name = "FILE")]
        output: String,
        /// Leave out paths matching this glob (repeatable), e.g. 'node_modules' or '**/*.log'.
        #[arg(long, value_name = "GLOB")]
        exclude: Vec<String>,
        /// zstd instead of gzip.
        #[arg(long)]
        zstd: bool,
        /// Compression level (gzip 1-9, default 6; zstd 1-22, default 3).
        #[arg(long)]
        level: Option<i32>,
        /// Dump only this directory of the workspace.
        #[arg(long, value_name = "DIR")]
        path: Option<String>,
    },
    /// Empty the workspace, atomically.
    Clear,
    /// Lease the sandbox: start MCP servers and wait until they are ready.
    Acquire {
        /// Servers to start, comma-separated (names from the manifest).
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        servers: Vec<String>,
        /// Start every server in the manifest.
        #[arg(long, conflicts_with = "servers")]
        all: bool,
        /// Benchmark profile: MCP_Atlas, Toolathlon or MCP_Mark.
        #[arg(long)]
        benchmark: Option<String>,
        /// Release automatically after this many seconds (60-86400; default 7200).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<u32>,
        /// No automatic release.
        #[arg(long, conflicts_with = "ttl")]
        no_ttl: bool,
        /// Lease id (default: a random one).
        #[arg(long)]
        lease_id: Option<String>,
        /// Klavis test_account_email.
        #[arg(long)]
        email: Option<String>,
        /// Credential for a server: SERVER.KEY=VALUE (repeatable).
        #[arg(long, value_name = "SERVER.KEY=VALUE")]
        auth: Vec<String>,
        /// Environment variable for a server: SERVER.VAR=VALUE (repeatable).
        #[arg(long, value_name = "SERVER.VAR=VALUE")]
        env: Vec<String>,
    },
    /// End the lease: stop the servers, clear the workspace and their state.
    Release {
        /// The lease to release (default: the current one).
        #[arg(long)]
        lease_id: Option<String>,
        /// Record the release as a TTL expiry (Klavis is_ttl).
        #[arg(long)]
        is_ttl: bool,
    },
    /// Return the lease to its freshly-acquired state.
    Reset {
        #[arg(long)]
        lease_id: Option<String>,
    },
    /// Stop the agent (Agent.Shutdown): servers stopped, calls drained; as
    /// the VM's init it then powers the VM off.
    Shutdown {
        /// Why, for the agent's log.
        #[arg(long, default_value = "sandboxctl shutdown")]
        reason: String,
    },
    /// Sandbox status, lease and servers.
    Status,
    /// List, start, stop or restart MCP servers.
    Servers {
        #[command(subcommand)]
        verb: Option<ServersVerb>,
    },
    /// Talk MCP to one server of the lease through the agent's data plane.
    Mcp {
        /// Server name, e.g. filesystem.
        name: String,
        #[command(subcommand)]
        verb: McpVerb,
    },
    /// Expose the agent's MCP data plane on this host (e.g. a VM's, over
    /// vsock) for local MCP clients: every connection to --listen is
    /// forwarded to the data plane. Runs until interrupted.
    McpProxy {
        /// Where to listen: tcp://127.0.0.1:PORT (loopback only) or unix:///path.
        #[arg(long, value_name = "URI")]
        listen: String,
    },
    /// A server's captured output (stderr; stdout for http servers).
    Logs {
        name: String,
        /// Keep following new lines.
        #[arg(short, long)]
        follow: bool,
        /// Start with the last N lines (default: all buffered).
        #[arg(long, default_value_t = 0)]
        tail: u32,
        /// stdout, stderr or all.
        #[arg(long)]
        stream: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum McpVerb {
    /// List the server's tools.
    Tools,
    /// Call one tool and print its result.
    Call {
        tool: String,
        /// Tool arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
    },
}

#[derive(Subcommand, Debug)]
enum ServersVerb {
    /// Every server in the manifest with state, pid, restarts, CPU and RSS.
    List,
    /// Start a server and wait until it is ready.
    Start { name: String },
    /// Stop a server (SIGTERM to its processes, SIGKILL after the grace period).
    Stop {
        name: String,
        /// Milliseconds between SIGTERM and SIGKILL (default: the manifest's).
        #[arg(long, default_value_t = 0)]
        grace_ms: u32,
    },
    /// Stop and start a server, resetting its restart count.
    Restart { name: String },
}

mod lease;
mod transfer;

fn main() -> ExitCode {
    let args = Args::parse();
    let json = args.json;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(json, &anyhow!(e).context("starting the async runtime")),
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => fail(json, &e),
    }
}

fn fail(json: bool, e: &anyhow::Error) -> ExitCode {
    let msg = format!("{e:#}");
    if json {
        println!("{}", json!({ "ok": false, "error": msg }));
    }
    eprintln!("sandboxctl: {msg}");
    ExitCode::FAILURE
}

async fn connect(args: &Args) -> anyhow::Result<Client> {
    let uri = args
        .agent
        .as_deref()
        .context("no agent given: pass --agent URI or set SANDBOX_AGENT (e.g. unix:///run/sandbox-agent.sock)")?;
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(Token::new(t, "--token")?),
        (None, Some(p)) => Some(Token::from_file(p)?),
        (None, None) => None,
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        anyhow::bail!("--timeout must be a positive number of seconds");
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let opts = ConnectOptions {
        token,
        connect_timeout: timeout,
        hvsock: HvsockOptions {
            retry_deadline: timeout,
            ..HvsockOptions::default()
        },
    };
    Ok(opts.connect(uri).await?)
}

/// Formats a failed RPC as `Method: CODE: message`.
pub(crate) fn rpc_error(method: &str, s: tonic::Status) -> anyhow::Error {
    let detail = if s.message().is_empty() {
        error_chain(&s)
    } else {
        s.message().to_owned()
    };
    anyhow!("{method} failed: {:?}: {detail}", s.code())
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.verb {
        Verb::Mcp { name, verb } => return mcp(&args, name, verb).await,
        Verb::McpProxy { listen } => return mcp_proxy(&args, listen).await,
        _ => {}
    }
    let client = connect(&args).await?;
    match &args.verb {
        Verb::Health { service } => health(&client, service, args.json).await,
        Verb::Info => info(&client, args.json).await,
        Verb::Upload { path, merge } => transfer::upload(&client, path, *merge, args.json).await,
        Verb::Dump {
            output,
            exclude,
            zstd,
            level,
            path,
        } => {
            transfer::dump(
                &client,
                output,
                exclude.clone(),
                *zstd,
                level.unwrap_or(0),
                path.clone().unwrap_or_default(),
                args.json,
            )
            .await
        }
        Verb::Clear => {
            let r = client
                .workspace()
                .clear(proto::ClearRequest {})
                .await
                .map_err(|s| rpc_error("Workspace.Clear", s))?
                .into_inner();
            if args.json {
                println!(
                    "{}",
                    json!({ "ok": true, "removed_entries": r.removed_entries, "duration_ms": r.duration_ms })
                );
            } else {
                println!(
                    "cleared the workspace ({} top-level entries removed, {} ms)",
                    r.removed_entries, r.duration_ms
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Acquire {
            servers,
            all,
            benchmark,
            ttl,
            no_ttl,
            lease_id,
            email,
            auth,
            env,
        } => {
            let a = lease::AcquireArgs {
                servers,
                all: *all,
                benchmark: benchmark.as_deref(),
                ttl: *ttl,
                no_ttl: *no_ttl,
                lease_id: lease_id.as_deref(),
                email: email.as_deref(),
                auth,
                env,
            };
            lease::acquire(&client, a, args.json).await
        }
        Verb::Release { lease_id, is_ttl } => {
            lease::release(&client, lease_id.as_deref(), *is_ttl, args.json).await
        }
        Verb::Reset { lease_id } => lease::reset(&client, lease_id.as_deref(), args.json).await,
        Verb::Shutdown { reason } => lease::shutdown(&client, reason, args.json).await,
        Verb::Status => lease::status(&client, args.json).await,
        Verb::Servers { verb } => {
            let v = match verb {
                None | Some(ServersVerb::List) => lease::ServerVerb::List,
                Some(ServersVerb::Start { name }) => lease::ServerVerb::Start(name),
                Some(ServersVerb::Stop { name, grace_ms }) => {
                    lease::ServerVerb::Stop(name, *grace_ms)
                }
                Some(ServersVerb::Restart { name }) => lease::ServerVerb::Restart(name),
            };
            lease::servers(&client, v, args.json).await
        }
        Verb::Mcp { .. } | Verb::McpProxy { .. } => unreachable_mcp(),
        Verb::Logs {
            name,
            follow,
            tail,
            stream,
        } => lease::logs(&client, name, *follow, *tail, stream.as_deref(), args.json).await,
    }
}

/// `mcp` is dispatched before the control-plane connection is made.
fn unreachable_mcp() -> anyhow::Result<ExitCode> {
    anyhow::bail!("internal error: the mcp verb reached the control-plane dispatcher")
}

/// The data-plane endpoint: --mcp, or port 1025 of a vsock/hvsock --agent.
fn mcp_endpoint(args: &Args) -> anyhow::Result<sandbox_client::Endpoint> {
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
        Endpoint::Vsock { cid, .. } => Ok(Endpoint::Vsock { cid, port: 1025 }),
        Endpoint::HybridVsock { path, .. } => Ok(Endpoint::HybridVsock { path, port: 1025 }),
        other => {
            anyhow::bail!("--agent {other} says nothing about the MCP data plane; pass --mcp URI")
        }
    }
}

/// Forwards every connection on `listen` to the agent's data plane, byte
/// for byte (HTTP/1.1 or h2 alike). Clients send the agent's token
/// themselves when its data plane requires one.
async fn mcp_proxy(args: &Args, listen: &str) -> anyhow::Result<ExitCode> {
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

async fn mcp(args: &Args, name: &str, verb: &McpVerb) -> anyhow::Result<ExitCode> {
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
                println!("{}", json!({"ok": true, "tools": r["tools"]}));
            } else {
                for t in r["tools"].as_array().into_iter().flatten() {
                    let desc = t["description"].as_str().unwrap_or("");
                    let first = desc.lines().next().unwrap_or("");
                    println!("{:<28} {first}", t["name"].as_str().unwrap_or("?"));
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
                println!("{}", json!({"ok": !is_error, "result": r}));
            } else {
                for item in r["content"].as_array().into_iter().flatten() {
                    match item["text"].as_str() {
                        Some(t) => println!("{t}"),
                        None => println!("{item}"),
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

async fn health(client: &Client, service: &str, json: bool) -> anyhow::Result<ExitCode> {
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
    if json {
        println!(
            "{}",
            json!({ "ok": status == ServingStatus::Serving, "service": service, "status": name, "agent": client.endpoint().to_string() })
        );
    } else if service.is_empty() {
        println!("{name}");
    } else {
        println!("{service}: {name}");
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

async fn info(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let i = client
        .agent()
        .get_info(proto::GetInfoRequest {})
        .await
        .map_err(|s| rpc_error("Agent.GetInfo", s))?
        .into_inner();
    let status = proto::SandboxStatus::try_from(i.status)
        .map(|s| status_name(s).to_owned())
        .unwrap_or_else(|_| format!("unknown ({})", i.status));
    let load = i.load_average.unwrap_or_default();
    let ws = i.workspace.clone().unwrap_or_default();
    if json {
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
        println!(
            "{}",
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
        );
        return Ok(ExitCode::SUCCESS);
    }
    let lease = match &i.lease {
        None => "-".to_owned(),
        Some(l) => format!("{} ({} servers)", l.lease_id, l.server_names.len()),
    };
    let rows = [
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
    ];
    for (k, v) in rows {
        println!("{k:<10} {v}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Klavis spelling of a status.
pub(crate) fn status_name(s: proto::SandboxStatus) -> &'static str {
    match s {
        proto::SandboxStatus::Idle => "idle",
        proto::SandboxStatus::Occupied => "occupied",
        proto::SandboxStatus::Error => "error",
        proto::SandboxStatus::Unspecified => "unspecified",
    }
}

pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}
