//! `sandboxctl`: host-side command line client of a sandbox agent.
//!
//! Exit status: 0 on success, 1 when the operation failed (agent unreachable,
//! RPC error, health not SERVING), 2 for usage errors.
//!
//! One module per verb group: `agent` (health, info, bind-token), `transfer` (upload,
//! dump, clear), `lease` (acquire, release, reset, status, shutdown),
//! `exec` (script executions), `servers` (servers, logs), `mcp` (mcp,
//! mcp-proxy); `cli` is the command line and `output` the shared
//! formatting.

mod agent;
mod cli;
mod exec;
mod lease;
mod mcp;
mod output;
mod servers;
mod transfer;

use crate::output::outln;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Parser;
use cli::{Args, ExecVerb, ServersVerb, Verb};
use sandbox_client::auth::Token;
use sandbox_client::transport::HvsockOptions;
use sandbox_client::{Client, ConnectOptions};
use serde_json::json;

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
    if output::is_closed_pipe(e) {
        return ExitCode::from(output::CLOSED_PIPE);
    }
    let msg = format!("{e:#}");
    if json {
        outln!("{}", json!({ "ok": false, "error": msg }));
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
        ..ConnectOptions::default()
    };
    Ok(opts.connect(uri).await?)
}

/// `exec …`: script executions.
async fn run_exec(client: &Client, verb: &ExecVerb, json: bool) -> anyhow::Result<ExitCode> {
    match verb {
        ExecVerb::Upload { name, path } => exec::upload(client, name, path, json).await,
        ExecVerb::Run { name, path, follow } => {
            exec::run(client, name, path.as_deref(), *follow, json).await
        }
        ExecVerb::Status { name } => exec::status(client, name.as_deref(), json).await,
        ExecVerb::Logs {
            name,
            follow,
            cursor,
        } => exec::logs(client, name, *cursor, *follow, json).await,
        ExecVerb::Export { name, output } => exec::export(client, name, output, json).await,
        ExecVerb::Cancel { name } => exec::cancel(client, name, json).await,
    }
}

/// `servers [list|start|stop|restart]`.
fn server_verb(verb: &Option<ServersVerb>) -> servers::ServerVerb<'_> {
    match verb {
        None | Some(ServersVerb::List) => servers::ServerVerb::List,
        Some(ServersVerb::Start { name }) => servers::ServerVerb::Start(name),
        Some(ServersVerb::Stop { name, grace_ms }) => servers::ServerVerb::Stop(name, *grace_ms),
        Some(ServersVerb::Restart { name }) => servers::ServerVerb::Restart(name),
    }
}

/// Runs one verb: the MCP ones on their own, every other on a connected
/// client.
async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.verb {
        Verb::Mcp { name, verb } => mcp::mcp(&args, name, verb).await,
        Verb::McpProxy {
            listen,
            allow_hosts,
            require_token,
        } => mcp::mcp_proxy(&args, listen, allow_hosts, require_token.as_deref()).await,
        _ => run_on(&connect(&args).await?, &args).await,
    }
}

/// Runs a verb of the agent's API on `client`.
async fn run_on(client: &Client, args: &Args) -> anyhow::Result<ExitCode> {
    match &args.verb {
        Verb::Health { service } => agent::health(client, service, args.json).await,
        Verb::Info => agent::info(client, args.json).await,
        Verb::BindToken { new_token_file } => {
            agent::bind_token(client, new_token_file, args.json).await
        }
        Verb::Upload {
            path,
            merge,
            durable,
        } => transfer::upload(client, path, *merge, *durable, args.json).await,
        Verb::Dump {
            output,
            exclude,
            zstd,
            level,
            path,
        } => {
            transfer::dump(
                client,
                output,
                exclude.clone(),
                *zstd,
                level.unwrap_or(0),
                path.clone().unwrap_or_default(),
                args.json,
            )
            .await
        }
        Verb::Clear => transfer::clear(client, args.json).await,
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
            lazy,
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
                lazy: *lazy,
            };
            lease::acquire(client, a, args.json).await
        }
        Verb::Release { lease_id, is_ttl } => {
            lease::release(client, lease_id.as_deref(), *is_ttl, args.json).await
        }
        Verb::Reset { lease_id } => lease::reset(client, lease_id.as_deref(), args.json).await,
        Verb::Shutdown { reason } => lease::shutdown(client, reason, args.json).await,
        Verb::Status => lease::status(client, args.json).await,
        Verb::Exec { verb } => run_exec(client, verb, args.json).await,
        Verb::Servers { verb } => servers::servers(client, server_verb(verb), args.json).await,
        Verb::Mcp { .. } | Verb::McpProxy { .. } => mcp::unreachable_mcp(),
        Verb::Logs {
            name,
            follow,
            tail,
            stream,
        } => servers::logs(client, name, *follow, *tail, stream.as_deref(), args.json).await,
    }
}
