//! `sandbox-host`: the reference host. Serves Klavis's Local Sandbox REST
//! API over a pool of sandbox agents, and their MCP endpoints.
//!
//! Modules: `api` (the REST endpoints and the TTL reaper), `mcp_proxy`
//! (MCP URLs → the agent's data plane), `pool` (the process and qemu
//! backends and the warm pool), `metrics` (`/metrics` for Prometheus),
//! `store` (SQLite state), `signed` (transfer URLs).

mod api;
mod mcp_proxy;
mod metrics;
mod pool;
mod signed;
mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post, put};
use clap::Parser;

/// The manifest a local agent reads when the host passes none.
const INSTALLED_MANIFEST: &str = "/etc/sandbox-agent/servers.toml";

/// How long a shutdown waits for releases already accepted (a Release
/// stops the sandbox's servers; in a VM under TCG that takes seconds).
const RELEASE_DRAIN: std::time::Duration = std::time::Duration::from_secs(60);
/// The largest per-server data document (`POST /local-sandbox/{server}/{id}/initialize`)
/// the host reads; the agent applies its own mail.max_data_bytes (16 MiB by default).
const MAX_SERVER_DATA_BYTES: usize = 64 << 20;

/// Reference host: the Klavis Local Sandbox REST API over a pool of
/// sandbox agents (local processes or QEMU VMs).
#[derive(Parser, Debug)]
#[command(name = "sandbox-host", version, args_override_self = true)]
struct Args {
    /// Address to serve the REST API and the MCP URLs on.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "HOST:PORT")]
    listen: String,
    /// Connections served at once; more wait in the kernel's backlog. The
    /// open-file limit is raised to fit (up to its hard limit).
    #[arg(long, default_value_t = 512, value_name = "N")]
    max_connections: usize,
    /// A connection must send a request head within this time (and each
    /// later head once begun), or it is closed: silent or trickling
    /// clients cannot hold the connection slots.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    header_timeout_ms: u64,
    /// State: the SQLite database, agents' directories, uploads.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Refused: a key on the command line is in every process listing.
    /// Use --api-key-file, or SANDBOX_HOST_API_KEY in the environment.
    #[arg(long = "api-key", value_name = "KEY", hide = true)]
    api_keys: Vec<String>,
    /// File with one API key per line, optionally followed by its owner
    /// (`key owner`); keys with the same owner share sandboxes.
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Where sandboxes run: `process` (a local sandbox-agent each), or
    /// `qemu` (a VM each, booted from --vm-image).
    #[arg(long, value_enum, default_value = "process")]
    backend: BackendKind,
    /// Idle sandboxes kept ready (warm or bare).
    #[arg(long, default_value_t = 2)]
    pool_size: usize,
    /// A warm profile (repeatable): `[BENCHMARK:]SERVERS[=COUNT]`, e.g.
    /// `ALL=2` or `MCP_Atlas:filesystem,git,terminal=1`. COUNT idle
    /// sandboxes (default 1) keep those servers started under the
    /// benchmark; an Acquire of any subset of them with the same benchmark
    /// is answered at once, the servers it did not ask for stopping after
    /// the answer. The counts must fit in --pool-size; the rest stay bare.
    #[arg(long = "warm", value_name = "SPEC")]
    warm: Vec<String>,
    /// Shorthand for `--warm NAMES=<pool-size>`: every idle sandbox warm
    /// with these servers (no benchmark). Empty: none.
    #[arg(long, default_value = "", value_name = "NAMES")]
    warm_servers: String,
    /// qemu backend: the initramfs from packaging/vm/build-initramfs.sh
    /// (its .vmlinuz beside it).
    #[arg(long, value_name = "FILE")]
    vm_image: Option<PathBuf>,
    /// qemu backend: guest memory of each VM, in MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    vm_memory: u32,
    /// qemu backend: packaging/vm/run-qemu.sh. Default: run-qemu.sh next
    /// to this binary (as installed), else the one in the source tree this
    /// binary was built from.
    #[arg(long, value_name = "FILE")]
    vm_runner: Option<PathBuf>,
    /// What a released sandbox becomes: `recycle` (the agent clears it and
    /// it returns to the pool) or `replace` (its agent or VM is stopped and
    /// a fresh one started: no tenant can leave anything for the next).
    #[arg(long, value_enum, default_value_t = pool::OnRelease::Recycle)]
    on_release: pool::OnRelease,
    /// Base of the URLs handed out (MCP and transfer URLs). Default:
    /// http://<listen>.
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// The agent binary. Default: sandbox-agent next to this binary.
    #[arg(long, value_name = "FILE")]
    agent_bin: Option<PathBuf>,
    /// The MCP server manifest the agents run (process backend). Required
    /// unless /etc/sandbox-agent/servers.toml exists.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Multiplies every TTL (0.05 makes 60 s last 3 s; for tests).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Log format: `text`, or `json` (one JSON object per line). Filter
    /// with RUST_LOG (default: info).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Largest archive a PUT may upload, in bytes.
    #[arg(long, default_value_t = 8 << 30)]
    max_upload_bytes: u64,
    /// How the process backend isolates its sandboxes: `namespaces` (each
    /// agent in its own user, mount, pid, ipc, uts, cgroup and network
    /// namespaces, tenants unprivileged; needs bubblewrap, util-linux,
    /// uidmap, passt and a subordinate id range in /etc/subuid and
    /// /etc/subgid) or `none` (development only: tenants run as this
    /// host's user and reach its files, processes and loopback).
    #[arg(long, value_enum, default_value = "namespaces")]
    isolation: pool::isolate::Mode,
    /// What an isolated sandbox may reach over the network: `outbound`
    /// (the internet through pasta; never this host's loopback services or
    /// link-local/cloud-metadata addresses) or `none` (its own loopback).
    #[arg(long, value_enum, default_value = "outbound")]
    sandbox_network: pool::isolate::Network,
    /// A path an isolated sandbox sees read-only at the same place
    /// (repeatable): interpreters or servers installed outside /usr, /etc
    /// and /opt. The agent binary and the manifest's directory always are.
    #[arg(long = "sandbox-ro", value_name = "PATH")]
    sandbox_ro: Vec<PathBuf>,
    /// A port of this host's loopback that isolated sandboxes reach at the
    /// same port of their own loopback (repeatable): a local package
    /// mirror or proxy. Never the host's own API port.
    #[arg(long = "sandbox-host-port", value_name = "PORT")]
    sandbox_host_ports: Vec<u16>,
    /// memory.max of each isolated sandbox (its agent, servers and
    /// scripts together), in bytes.
    #[arg(long, default_value_t = 8 << 30, value_name = "BYTES")]
    slot_memory_max: u64,
    /// How long a new sandbox (agent or VM) may take to report SERVING
    /// before it is discarded and its acquire fails (503), in seconds.
    /// Default: 60 on the process backend, 300 on qemu (TCG boots slowly
    /// on a busy machine).
    #[arg(long, value_name = "SECONDS")]
    slot_start_timeout: Option<u64>,
    /// pids.max of each isolated sandbox (processes and threads).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    slot_pids_max: u64,
    /// Execution archives one sandbox may hold in the upload store (one per
    /// name; uploading to a name again replaces it). The same as the
    /// agent's exec.max_executions (32 by default): a name beyond it could
    /// never run. A new name over it is refused at execution-upload-url and
    /// at the PUT (429).
    #[arg(long, default_value_t = 32, value_name = "N")]
    max_executions_per_sandbox: usize,
    /// Bytes of uploaded archives (workspace and executions) one sandbox may
    /// hold, counted while they stream; an upload over it is a 413 and
    /// keeps nothing. Release frees them.
    #[arg(long, default_value_t = 16 << 30, value_name = "BYTES")]
    max_stored_bytes_per_sandbox: u64,
    /// Bytes of uploaded archives all sandboxes of one owner (an API key,
    /// or the keys sharing an owner) may hold at once; over it: 413.
    #[arg(long, default_value_t = 64 << 30, value_name = "BYTES")]
    max_stored_bytes_per_key: u64,
    /// Live sandboxes one owner (an API key, or the keys sharing an owner in
    /// --api-key-file) may hold at once; one more Acquire is a 429.
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_sandboxes_per_key: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    Process,
    Qemu,
}

/// The backend the arguments describe, checked before anything starts.
fn backend(args: &Args) -> anyhow::Result<pool::Backend> {
    match args.backend {
        BackendKind::Process => {
            let agent_bin = match &args.agent_bin {
                Some(p) => p.clone(),
                None => std::env::current_exe()?
                    .parent()
                    .map(|d| d.join("sandbox-agent"))
                    .context("locating sandbox-agent")?,
            };
            anyhow::ensure!(
                agent_bin.is_file(),
                "no agent binary at {} (give --agent-bin)",
                agent_bin.display()
            );
            // Without a manifest every sandbox would carry no server.
            let installed = std::path::Path::new(INSTALLED_MANIFEST);
            anyhow::ensure!(
                args.manifest.is_some() || installed.is_file(),
                "no MCP server manifest: pass --manifest FILE (packaging/servers.toml in the \
                 source tree, with the servers packaging/install-servers.sh installs), or \
                 install one as {INSTALLED_MANIFEST}; without it the sandboxes carry no server"
            );
            if let Some(m) = &args.manifest {
                anyhow::ensure!(m.is_file(), "no manifest at {} (--manifest)", m.display());
            }
            // Absolute: the agents run elsewhere (their own root, when
            // isolated).
            let abs = |p: &std::path::Path| {
                std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()))
            };
            Ok(pool::Backend::Process {
                agent_bin: abs(&agent_bin)?,
                manifest: args.manifest.as_deref().map(abs).transpose()?,
            })
        }
        BackendKind::Qemu => {
            let image = args.vm_image.clone().context(
                "--backend qemu needs --vm-image (build one with packaging/vm/build-initramfs.sh)",
            )?;
            anyhow::ensure!(image.is_file(), "no VM image at {}", image.display());
            anyhow::ensure!(
                args.manifest.is_none(),
                "--manifest is for the process backend: a VM runs the manifest baked into its image"
            );
            anyhow::ensure!(
                args.vm_memory >= 256,
                "--vm-memory must be at least 256 MiB"
            );
            let run_script = match &args.vm_runner {
                Some(p) => p.clone(),
                None => std::env::current_exe()?
                    .parent()
                    .map(|d| d.join("run-qemu.sh"))
                    .filter(|p| p.is_file())
                    .unwrap_or_else(|| {
                        // The source tree's (this package is src/host).
                        PathBuf::from(concat!(
                            env!("CARGO_MANIFEST_DIR"),
                            "/../../packaging/vm/run-qemu.sh"
                        ))
                    }),
            };
            anyhow::ensure!(
                run_script.is_file(),
                "no run-qemu.sh at {} (give --vm-runner)",
                run_script.display()
            );
            let accel = pool::probe_accel(&run_script, &image)?;
            tracing::info!(%accel, "VMs will run with {accel}");
            Ok(pool::Backend::Qemu {
                run_script,
                image,
                memory_mib: args.vm_memory,
                accel,
            })
        }
    }
}

/// The warm profiles of `--warm` and `--warm-servers`, checked.
fn warm_profiles(args: &Args) -> anyhow::Result<Vec<pool::WarmProfile>> {
    let mut out = Vec::new();
    for spec in &args.warm {
        out.push(pool::WarmProfile::parse(spec, 1, api::SERVER_NAMES).context("--warm")?);
    }
    if !args.warm_servers.trim().is_empty() {
        out.push(
            pool::WarmProfile::parse(&args.warm_servers, args.pool_size, api::SERVER_NAMES)
                .context("--warm-servers")?,
        );
    }
    pool::WarmProfile::check_fit(&out, args.pool_size)?;
    Ok(out)
}

/// The environment variable that may hold API keys (comma- or
/// newline-separated). Read once at start, then removed, so no child
/// process inherits it.
pub(crate) const API_KEY_ENV: &str = "SANDBOX_HOST_API_KEY";

fn keys(args: &Args, from_env: Option<String>) -> anyhow::Result<HashMap<String, String>> {
    anyhow::ensure!(
        args.api_keys.is_empty(),
        "--api-key puts the key in every process listing (ps, /proc/<pid>/cmdline): put it in \
         --api-key-file FILE (one key per line, optionally followed by its owner) or in \
         {API_KEY_ENV}"
    );
    let mut keys = HashMap::new();
    for k in from_env
        .iter()
        .flat_map(|v| v.split([',', '\n']))
        .map(str::trim)
        .filter(|k| !k.is_empty())
    {
        keys.insert(k.to_owned(), owner_of_key(k));
    }
    if let Some(f) = &args.api_key_file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let mut it = line.split_whitespace();
            let key = it.next().unwrap_or_default().to_owned();
            let owner = it.next().map_or_else(|| owner_of_key(&key), str::to_owned);
            keys.insert(key, owner);
        }
    }
    for k in keys.keys() {
        anyhow::ensure!(k.len() >= 16, "API keys must be at least 16 characters");
    }
    Ok(keys)
}

/// A key without a named owner is its own owner (named by a digest, so the
/// key itself is never stored).
fn owner_of_key(key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(key.as_bytes());
    format!("key-{}", &hex::encode(d)[..16])
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env_keys = std::env::var(API_KEY_ENV).ok();
    // SAFETY: no other thread runs yet (the runtime starts below).
    unsafe { std::env::remove_var(API_KEY_ENV) };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Colour only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().with_current_span(true).init(),
    }
    anyhow::ensure!(args.time_scale > 0.0, "--time-scale must be positive");
    let mut keys = keys(&args, env_keys)?;
    let mut generated = None;
    if keys.is_empty() {
        let k = sandbox_client::auth::Token::generate().context("generating an API key")?;
        keys.insert(k.expose().to_owned(), owner_of_key(k.expose()));
        generated = Some(k.expose().to_owned());
    }
    let uploads = private_dirs(&args.data_dir)?;
    anyhow::ensure!(
        args.max_upload_bytes > 0
            && args.max_executions_per_sandbox > 0
            && args.max_stored_bytes_per_sandbox > 0
            && args.max_stored_bytes_per_key > 0,
        "--max-upload-bytes, --max-executions-per-sandbox, --max-stored-bytes-per-sandbox \
         and --max-stored-bytes-per-key must be at least 1"
    );
    let backend = backend(&args)?;
    // The port asked for (0: the kernel's choice, which a forward of a
    // fixed port is checked against once bound).
    let api_port = args
        .listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(0);
    let isolation = isolation(&args, &backend, api_port)?;
    let warm = warm_profiles(&args)?;
    let store = store::Store::open(&args.data_dir.join("host.db"))?;
    let signing_key = signing_key(&args.data_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let pool = pool::Pool::new(pool::PoolConfig {
            backend,
            dir: pool::slots_dir(&args.data_dir),
            size: args.pool_size,
            warm,
            on_release: args.on_release,
            isolation,
            start_timeout: args.slot_start_timeout.map(std::time::Duration::from_secs),
        })?;
        // Sandboxes from before a restart keep their agents; those whose
        // agent is gone are marked error.
        let live = store.list(None)?;
        let in_use: Vec<String> = live.iter().map(|s| s.slot.clone()).collect();
        let gone = pool.recover(&in_use).await;
        for s in live.iter().filter(|s| gone.contains(&s.slot)) {
            store.set_status(&s.id, "error", &api::timestamp())?;
        }
        anyhow::ensure!(args.max_connections > 0, "--max-connections must be at least 1");
        anyhow::ensure!(
            args.slot_start_timeout != Some(0),
            "--slot-start-timeout must be at least 1 second"
        );
        anyhow::ensure!(args.header_timeout_ms > 0, "--header-timeout-ms must be at least 1");
        raise_open_files(args.max_connections);
        let endpoint: sandbox_client::transport::Endpoint = format!("tcp://{}", args.listen)
            .parse()
            .with_context(|| format!("--listen {}", args.listen))?;
        let listener = sandbox_serve::listen::Listener::bind(&endpoint)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        if let sandbox_client::transport::Endpoint::Tcp { port, .. } = listener.local_endpoint() {
            anyhow::ensure!(
                !args.sandbox_host_ports.contains(port),
                "--sandbox-host-port {port} is this host's own API port: never forwarded into a sandbox"
            );
        }
        let addr = match listener.local_endpoint() {
            sandbox_client::transport::Endpoint::Tcp { host, port } => {
                format!("{}:{port}", if host.contains(':') { format!("[{host}]") } else { host.clone() })
            }
            other => other.to_string(),
        };
        let public_url = args
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"))
            .trim_end_matches('/')
            .to_owned();
        let host = Arc::new(api::Host {
            metrics: metrics::Metrics::new(&pool),
            store,
            pool: pool.clone(),
            signer: signed::Signer::new(signing_key),
            keys,
            public_url: public_url.clone(),
            uploads: api::Uploads::open(
                uploads,
                api::UploadLimits {
                    archive_bytes: args.max_upload_bytes,
                    executions: args.max_executions_per_sandbox,
                    sandbox_bytes: args.max_stored_bytes_per_sandbox,
                    owner_bytes: args.max_stored_bytes_per_key,
                },
                &live
                    .iter()
                    .map(|s| (s.id.clone(), s.owner.clone()))
                    .collect::<Vec<_>>(),
            ),
            time_scale: args.time_scale,
            max_per_owner: args.max_sandboxes_per_key,
            acquiring: Default::default(),
            releases: tokio_util::task::TaskTracker::new(),
        });
        let releases = host.releases.clone();
        tokio::spawn(pool.clone().keep_warm());
        tokio::spawn(api::reap(host.clone()));
        let app = Router::new()
            .route("/local-sandbox", post(api::acquire).get(api::list))
            .route("/local-sandbox/{id}", get(api::get).delete(api::release))
            .route("/local-sandbox/{id}/reset", post(api::reset))
            .route("/local-sandbox/{id}/upload-url", post(api::upload_url))
            .route("/local-sandbox/{id}/initialize", post(api::initialize))
            .route("/local-sandbox/{id}/dump", get(api::dump_url))
            .route(
                "/local-sandbox/{server}/{id}/initialize",
                post(api::server_data::initialize)
                    .layer(axum::extract::DefaultBodyLimit::max(MAX_SERVER_DATA_BYTES)),
            )
            .route(
                "/local-sandbox/{server}/{id}/dump",
                get(api::server_data::dump),
            )
            .route(
                "/local-sandbox/{id}/execution-upload-url",
                post(api::execution_upload_url),
            )
            .route("/local-sandbox/{id}/execute", post(api::execute))
            .route(
                "/local-sandbox/{id}/execution-status",
                get(api::execution_status),
            )
            .route("/local-sandbox/{id}/execution-logs", get(api::execution_logs))
            .route(
                "/local-sandbox/{id}/export-artifacts",
                post(api::export_artifacts),
            )
            .route("/transfer/upload/{id}", put(api::upload))
            .route("/transfer/exec-upload/{id}/{name}", put(api::exec_upload))
            .route("/transfer/exec-export/{id}/{name}", get(api::exec_download))
            .route("/transfer/dump/{id}", get(api::download))
            .route("/openapi.json", get(openapi))
            .route("/metrics", get(api::metrics))
            .fallback(mcp_proxy::proxy)
            .with_state(host);
        println!("sandbox-host: base URL {public_url}");
        if let Some(k) = generated {
            println!("sandbox-host: API key {k}");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let limits = sandbox_serve::http::HttpLimits {
            max_connections: args.max_connections,
            header_timeout: std::time::Duration::from_millis(args.header_timeout_ms),
            // As axum::serve did: requests in flight finish (downloads too).
            drain: std::time::Duration::MAX,
        };
        let shutdown = async {
                use tokio::signal::unix::{SignalKind, signal};
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    },
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
        };
        let svc = hyper_util::service::TowerToHyperService::new(app);
        sandbox_serve::http::serve_http(listener, limits, shutdown, svc).await;
        // Releases already accepted finish first: their slots go back to the
        // pool, and are stopped with it.
        tracing::info!(
            releases = releases.len(),
            "stopping: waiting for the releases in flight"
        );
        releases.close();
        if tokio::time::timeout(RELEASE_DRAIN, releases.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = releases.len(),
                "releases still running after {} s; their sandboxes keep running, and the next start takes them back",
                RELEASE_DRAIN.as_secs()
            );
        }
        // Then the pool closes: no slot starts or turns idle after this, and
        // the idle and starting ones stop. Leased ones keep running.
        let p = pool.clone();
        let stopped = tokio::task::spawn_blocking(move || p.close())
            .await
            .unwrap_or(0);
        tracing::info!(
            stopped,
            "stopped the pool's idle and starting sandboxes; leased ones keep running for the next start"
        );
        anyhow::Ok(())
    })
}

/// Raises the soft open-file limit to the hard one when the connection
/// cap (plus room for the store, the agents and the uploads) does not fit
/// in it, and warns when even the hard limit is too small: then an accept
/// may fail with EMFILE (it is retried; nothing else misjudges it).
fn raise_open_files(max_connections: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let want = max_connections as u64 + 512;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft >= want {
        return;
    }
    let new = want.min(hard);
    if new > soft && setrlimit(Resource::RLIMIT_NOFILE, new, hard).is_err() {
        tracing::warn!(soft, hard, "could not raise the open-file limit");
    }
    if new < want {
        tracing::warn!(
            limit = new,
            max_connections,
            "the open-file limit is below --max-connections + 512; lower --max-connections or raise `ulimit -n`"
        );
    }
}

/// The key that signs transfer URLs: random, kept in the data dir so URLs
/// stay valid across a restart.
/// The data dir and what in it only this host may read: the database,
/// the signing key and the uploads are its user's alone; isolated agents
/// only pass through the data dir to their own slot's directories.
/// Returns the uploads directory.
fn private_dirs(data: &std::path::Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .with_context(|| format!("chmod {m:o} {}", p.display()))
    };
    std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    mode(data, 0o711)?;
    let uploads = data.join("uploads");
    std::fs::create_dir_all(&uploads)?;
    mode(&uploads, 0o700)?;
    for f in ["host.db", "host.db-wal", "host.db-shm", "signing.key"] {
        let p = data.join(f);
        if p.exists() {
            mode(&p, 0o600)?;
        } else if f == "host.db" {
            // SQLite creates its WAL and shm files with the database's mode.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .with_context(|| format!("creating {}", p.display()))?;
        }
    }
    Ok(uploads)
}

/// The process backend's isolation, checked (`None` for the qemu backend,
/// whose VMs isolate, and for `--isolation none`, said loudly).
fn isolation(
    args: &Args,
    backend: &pool::Backend,
    api_port: u16,
) -> anyhow::Result<Option<Arc<pool::isolate::Isolation>>> {
    if !matches!(backend, pool::Backend::Process { .. }) {
        return Ok(None);
    }
    match args.isolation {
        pool::isolate::Mode::None => {
            tracing::warn!(
                "--isolation none: sandboxes are NOT isolated; tenants run as this host's user and can read its data dir (API keys, signing key, database), other sandboxes and its loopback services. Use it for development only."
            );
            Ok(None)
        }
        pool::isolate::Mode::Namespaces => {
            let iso = pool::isolate::Isolation::new(pool::isolate::IsolationConfig {
                read_only: args.sandbox_ro.clone(),
                memory_max: args.slot_memory_max,
                pids_max: args.slot_pids_max,
                network: args.sandbox_network,
                host_ports: args.sandbox_host_ports.clone(),
                data_dir: args.data_dir.clone(),
                api_port,
            })?;
            Ok(Some(Arc::new(iso)))
        }
    }
}

fn signing_key(dir: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("signing.key");
    if let Ok(k) = std::fs::read(&path) {
        return Ok(k);
    }
    let mut k = vec![0u8; 32];
    getrandom::fill(&mut k).map_err(|e| anyhow::anyhow!("random: {e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::io::Write::write_all(&mut f, &k)?;
    Ok(k)
}

/// The OpenAPI document of what this host serves.
async fn openapi() -> axum::Json<serde_json::Value> {
    axum::Json(include_openapi())
}

fn include_openapi() -> serde_json::Value {
    let text = include_str!("openapi.json");
    serde_json::from_str(text).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
}
