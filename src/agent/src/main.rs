//! `sandbox-agent`: the guest agent. Serves the control plane (gRPC) on the
//! configured listeners until SIGTERM, SIGINT or `Agent.Shutdown`.
//!
//! As PID 1 (the VM's init) it first mounts, names and prepares the machine
//! (`sandbox_agent::init`), and every way out (a stop, a fatal error, a
//! panic) ends in a sync and power-off instead of an exit, which would
//! panic the kernel.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use sandbox_agent::config::{Config, DEFAULT_STATE_ROOT, LogFormat, Overrides, TOKEN_ENV};
use sandbox_agent::server;
use sandbox_client::auth::Token;
use tokio_util::sync::CancellationToken;

/// Guest agent of an MCP sandbox VM.
///
/// Settings come from the config file, then environment variables, then
/// flags; later ones win.
#[derive(Parser, Debug)]
#[command(name = "sandbox-agent", version)]
struct Args {
    /// Listen on this endpoint (repeatable): vsock://CID:PORT, unix:///path, tcp://HOST:PORT.
    /// Default: vsock://any:1024.
    #[arg(
        long = "listen",
        value_name = "URI",
        env = "SANDBOX_AGENT_LISTEN",
        value_delimiter = ','
    )]
    listen: Vec<String>,

    /// Serve the MCP data plane (streamable HTTP at /<server>/mcp) on this
    /// endpoint (repeatable; same forms as --listen). Default: vsock://any:1025.
    #[arg(
        long = "mcp-listen",
        value_name = "URI",
        env = "SANDBOX_AGENT_MCP_LISTEN",
        value_delimiter = ','
    )]
    mcp_listen: Vec<String>,

    /// The workspace directory. Default: /workspace.
    #[arg(long, value_name = "DIR", env = "SANDBOX_AGENT_WORKSPACE")]
    workspace: Option<PathBuf>,

    /// File holding the bearer token (required for tcp:// listeners).
    /// The token itself may instead be given in SANDBOX_AGENT_TOKEN.
    #[arg(long, value_name = "FILE", env = "SANDBOX_AGENT_TOKEN_FILE")]
    token_file: Option<PathBuf>,

    /// Config file. Default: /etc/sandbox-agent/agent.toml when it exists.
    #[arg(long, value_name = "FILE", env = "SANDBOX_AGENT_CONFIG")]
    config: Option<PathBuf>,

    /// Validate the configuration, print the effective config and exit.
    #[arg(long)]
    check_config: bool,

    /// Print, as JSON, the exact process every installed server runs
    /// under a benchmark profile (MCP_Atlas, Toolathlon, MCP_Mark, or
    /// `none`) for an Acquire without credentials, from a sandbox's own base
    /// (the agent's environment is not read; a variable credentials would
    /// set reads `<credential>`, the lease's home `<lease home>`), and exit.
    #[arg(long, value_name = "BENCHMARK")]
    print_launch: Option<String>,

    /// Log format. Filter with RUST_LOG (default: info).
    #[arg(long, value_enum, env = "SANDBOX_AGENT_LOG_FORMAT")]
    log_format: Option<LogFormat>,

    /// Allow tcp:// listeners on non-loopback addresses.
    #[arg(long)]
    allow_remote_tcp: bool,

    /// Name of this sandbox in logs. Default: the hostname.
    #[arg(long, env = "SANDBOX_AGENT_NAME")]
    name: Option<String>,

    /// The MCP server manifest (TOML). Default: /etc/sandbox-agent/servers.toml
    /// when it exists, else no servers.
    #[arg(long, value_name = "FILE", env = "SANDBOX_AGENT_MANIFEST")]
    manifest: Option<PathBuf>,

    /// Where servers keep state outside the workspace (the manifest's
    /// ${state_root}). Default: /var/lib/sandbox-agent (with --dev: ./state).
    #[arg(long, value_name = "DIR", env = "SANDBOX_AGENT_STATE_ROOT")]
    state_root: Option<PathBuf>,

    /// Where the servers also see the workspace (data_path; the manifest's
    /// ${data}), e.g. /data, as Klavis's benchmark tasks cite it.
    #[arg(long, value_name = "DIR", env = "SANDBOX_AGENT_DATA_PATH")]
    data_path: Option<PathBuf>,

    /// How data_path shows the workspace: `symlink`, or `bind` (a bind
    /// mount, as root: servers that resolve paths see data_path itself).
    #[arg(long, value_name = "HOW", env = "SANDBOX_AGENT_DATA_LINK")]
    data_link: Option<sandbox_agent::config::DataLink>,

    /// The mail service's ports: `manifest` ([mail] in servers.toml) or
    /// `auto` (free loopback ports at every start, e.g. for several agents
    /// on one machine).
    #[arg(long, value_name = "MODE", env = "SANDBOX_AGENT_MAIL_PORTS")]
    mail_ports: Option<sandbox_agent::config::MailPorts>,

    /// Who MCP servers, executions and data tools run as
    /// (supervisor.tenant_user): `auto` (1000:1000 when the agent is root),
    /// `UID:GID`, or `none` (the agent's own user: development only).
    #[arg(long, value_name = "USER", env = "SANDBOX_AGENT_TENANT_USER")]
    tenant_user: Option<String>,

    /// Where script executions live (exec.root). Default:
    /// /var/lib/sandbox-agent/executions (with --dev: ./executions).
    #[arg(long, value_name = "DIR", env = "SANDBOX_AGENT_EXEC_ROOT")]
    exec_root: Option<PathBuf>,

    /// Local development defaults: listen on unix://./sandbox-agent.sock and
    /// tcp://127.0.0.1:7070, the MCP data plane on
    /// unix://./sandbox-agent-mcp.sock and tcp://127.0.0.1:7071, workspace ./workspace, token in
    /// ./sandbox-agent.token (created if missing), executions in
    /// ./executions, server state in ./state. Explicit settings win.
    #[arg(long)]
    dev: bool,
}

/// Files `--dev` uses, relative to the current directory.
const DEV_SOCKET: &str = "unix://sandbox-agent.sock";
const DEV_TCP: &str = "tcp://127.0.0.1:7070";
const DEV_MCP_SOCKET: &str = "unix://sandbox-agent-mcp.sock";
const DEV_MCP_TCP: &str = "tcp://127.0.0.1:7071";
const DEV_WORKSPACE: &str = "workspace";
const DEV_TOKEN_FILE: &str = "sandbox-agent.token";
const DEV_EXEC_ROOT: &str = "executions";
const DEV_STATE_ROOT: &str = "state";

/// mimalloc rather than musl's allocator, which takes one lock for every
/// thread and returns each large buffer to the kernel on free (an unmap and
/// a TLB shootdown per gRPC chunk); see docs/benchmarks.md.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `arena_eager_commit` (its number in `mi_option_t`, which
/// the Rust bindings do not name).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Arenas committed on demand, not up front: with transparent huge pages
/// on (`always`, as on many hosts), an eagerly committed arena is faulted
/// in 2 MiB at a time, which took the idle agent from 7 to 19 MiB and made
/// extraction slower. Before the first allocation that needs an arena.
fn allocator_options() {
    // SAFETY: sets a process-wide option; no allocation is in flight.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
}

fn main() -> ExitCode {
    allocator_options();
    // Run by the agent itself, as the tenant, at Release and Reset.
    if std::env::args().nth(1).as_deref() == Some(sandbox_agent::tenant::CLEAR_KEYRINGS_ARG) {
        return match sandbox_agent::tenant::clear_own_keyrings() {
            0 => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let pid1 = sandbox_agent::init::is_pid1();
    if !pid1 {
        return match run(Args::parse(), false) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandbox-agent: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // As init: the kernel passes its unknown command-line words as
    // arguments; they must not stop the machine from coming up.
    let args = Args::try_parse().unwrap_or_else(|e| {
        eprintln!("sandbox-agent: ignoring the command line as init: {e}");
        Args::parse_from(["sandbox-agent"])
    });
    match std::panic::catch_unwind(|| run(args, true)) {
        Ok(Ok(())) => eprintln!("sandbox-agent: stopped; powering off"),
        Ok(Err(e)) => eprintln!("sandbox-agent: {e:#}; powering off"),
        Err(_) => eprintln!("sandbox-agent: panicked; powering off"),
    }
    sandbox_agent::init::power_off()
}

fn run(args: Args, pid1: bool) -> anyhow::Result<()> {
    let loaded = Config::load(args.config.as_deref());
    let boot = if pid1 {
        // Even with a bad config, init mounts /dev first, so the error
        // reaches the console.
        let default = sandbox_agent::init::InitConfig::default();
        sandbox_agent::init::boot(loaded.as_ref().map_or(&default, |c| &c.init))
    } else {
        Vec::new()
    };
    let mut config = loaded?;
    let env_token = std::env::var(TOKEN_ENV).ok();
    let mut overrides = overrides(&args, env_token.clone());
    if args.dev {
        dev_defaults(&mut overrides, &config, env_token.is_some())?;
    }
    config.apply(&overrides);
    let settings = config.validate(env_token.as_deref(), args.token_file.is_some() || args.dev)?;
    if args.check_config {
        print!("{}", settings.render());
        return Ok(());
    }
    if let Some(b) = &args.print_launch {
        let b = sandbox_agent::supervisor::manifest::Benchmark::parse_profile(b)?;
        // Never the agent's own environment: it may hold secrets.
        let launches = settings.manifest.launches(b, &|_| None);
        println!("{}", serde_json::to_string_pretty(&launches)?);
        return Ok(());
    }
    let json_logs = settings.log_format == LogFormat::Json;
    // A VM's serial console is not a terminal worth colouring.
    init_logging(
        settings.log_format,
        !pid1 && std::io::stderr().is_terminal(),
    );
    for step in boot {
        match step.result {
            Ok(()) => tracing::info!(what = %step.what, "init"),
            Err(e) => tracing::warn!(what = %step.what, error = %e, "init step failed"),
        }
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("agent")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let bound = server::bind(&settings).await?;
        if args.dev {
            dev_banner(&bound, overrides.token_file.as_deref(), json_logs);
        }
        let shutdown = CancellationToken::new();
        // Installed before anything serves: a SIGTERM right after the
        // "serving" line must find the handler, not the default action.
        tokio::spawn(signals(shutdown.clone(), stop_signals()));
        server::serve(settings, bound, shutdown).await?;
        anyhow::Ok(())
    })
}

/// The command line's (and `SANDBOX_AGENT_TOKEN`'s) settings over the
/// config file's.
fn overrides(args: &Args, env_token: Option<String>) -> Overrides {
    Overrides {
        listen: args.listen.clone(),
        mcp_listen: args.mcp_listen.clone(),
        workspace: args.workspace.clone(),
        state_root: args.state_root.clone(),
        data_path: args.data_path.clone(),
        data_link: args.data_link,
        token_file: args.token_file.clone(),
        token: env_token,
        log_format: args.log_format,
        mail_ports: args.mail_ports,
        tenant_user: args.tenant_user.clone(),
        allow_remote_tcp: args.allow_remote_tcp,
        name: args.name.clone(),
        manifest: args.manifest.clone(),
        exec_root: args.exec_root.clone(),
    }
}

/// `--dev`: local paths and listeners wherever nothing explicit is set;
/// a token file made if there is no token.
fn dev_defaults(o: &mut Overrides, config: &Config, env_token: bool) -> anyhow::Result<()> {
    if o.listen.is_empty() {
        o.listen = vec![DEV_SOCKET.into(), DEV_TCP.into()];
    }
    if o.mcp_listen.is_empty() {
        o.mcp_listen = vec![DEV_MCP_SOCKET.into(), DEV_MCP_TCP.into()];
    }
    if o.workspace.is_none() {
        o.workspace = Some(DEV_WORKSPACE.into());
    }
    if o.exec_root.is_none() {
        o.exec_root = Some(DEV_EXEC_ROOT.into());
    }
    if o.state_root.is_none() && config.state_root == Path::new(DEFAULT_STATE_ROOT) {
        o.state_root = Some(DEV_STATE_ROOT.into());
    }
    if o.token_file.is_none() && !env_token && config.auth.token_file.is_none() {
        let path = Path::new(DEV_TOKEN_FILE);
        Token::load_or_create(path)?;
        o.token_file = Some(path.to_owned());
    }
    Ok(())
}

/// The `--dev` banner: for a person at a terminal; JSON logs stay JSON
/// lines only (the listeners are logged there anyway).
fn dev_banner(bound: &server::Bound, token_file: Option<&Path>, json_logs: bool) {
    if json_logs {
        if let Some(p) = token_file {
            tracing::info!(token_file = %p.display(), "token for tcp:// clients");
        }
        return;
    }
    for ep in bound.endpoints() {
        eprintln!("sandbox-agent: listening on {ep}");
    }
    if let Some(p) = token_file {
        eprintln!(
            "sandbox-agent: token in {} (for tcp:// clients: --token-file {})",
            p.display(),
            p.display()
        );
    }
}

type StopSignals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

/// The SIGTERM and SIGINT handlers, installed now (`None`: they could not be).
fn stop_signals() -> Option<StopSignals> {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        _ => None,
    }
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT.
async fn signals(shutdown: CancellationToken, installed: Option<StopSignals>) {
    let Some((mut term, mut int)) = installed else {
        tracing::error!("cannot install signal handlers; stop the agent with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    shutdown.cancel();
}

fn init_logging(format: LogFormat, ansi: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}
