//! `sandbox-host`'s command line: every flag with its default and limit
//! (`sandbox-host --help` prints them), and the checks that turn flags
//! into the pool's backend, its isolation, the warm profiles and the API
//! keys before anything starts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use crate::{api, pool};

/// The kubernetes backend's flags; a build without the `kubernetes`
/// feature refuses that backend at start, naming the feature.
mod backend;
#[cfg_attr(not(feature = "kubernetes"), path = "config/kube_off.rs")]
mod kube;
pub use backend::{backend, fleet};
pub use kube::{ClusterPlan, cluster};

/// The manifest a local agent reads when the host passes none.
pub const INSTALLED_MANIFEST: &str = "/etc/sandbox-agent/servers.toml";

/// Reference host: the Klavis Local Sandbox REST API over a pool of
/// sandbox agents (local processes or QEMU VMs).
#[derive(Parser, Debug)]
#[command(name = "sandbox-host", version, args_override_self = true)]
pub struct Args {
    /// Address to serve the REST API and the MCP URLs on.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "HOST:PORT")]
    pub listen: String,
    /// Connections served at once; more wait in the kernel's backlog. The
    /// open-file limit is raised to fit (up to its hard limit).
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub max_connections: usize,
    /// A connection must send a request head within this time (and each
    /// later head once begun), or it is closed: silent or trickling
    /// clients cannot hold the connection slots.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub header_timeout_ms: u64,
    /// State: the SQLite database, agents' directories, uploads.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Refused: a key on the command line is in every process listing.
    /// Use --api-key-file, or SANDBOX_HOST_API_KEY in the environment.
    #[arg(long = "api-key", value_name = "KEY", hide = true)]
    pub api_keys: Vec<String>,
    /// File with one API key per line, optionally followed by its owner
    /// (`key owner`); keys with the same owner share sandboxes.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Where sandboxes run: `process` (a local sandbox-agent each),
    /// `qemu` (a VM each, booted from --vm-image), or `kubernetes` (pods
    /// claimed from agent-sandbox's warm pools, --kube-*; several hosts
    /// may serve one fleet: docs/kubernetes.md).
    #[arg(long, value_enum, default_value = "process")]
    pub backend: BackendKind,
    /// Idle sandboxes kept ready (warm or bare).
    #[arg(long, default_value_t = 2)]
    pub pool_size: usize,
    /// A warm profile (repeatable): `[BENCHMARK:]SERVERS[=COUNT]`, e.g.
    /// `ALL=2` or `MCP_Atlas:filesystem,git,terminal=1`. COUNT idle
    /// sandboxes (default 1) keep those servers started under the
    /// benchmark; an Acquire of any subset of them with the same benchmark
    /// is answered at once, the servers it did not ask for stopping after
    /// the answer. The counts must fit in --pool-size; the rest stay bare.
    #[arg(long = "warm", value_name = "SPEC")]
    pub warm: Vec<String>,
    /// Shorthand for `--warm NAMES=<pool-size>`: every idle sandbox warm
    /// with these servers (no benchmark). Empty: none.
    #[arg(long, default_value = "", value_name = "NAMES")]
    pub warm_servers: String,
    /// qemu backend: the initramfs from packaging/vm/build-initramfs.sh
    /// (its .vmlinuz beside it).
    #[arg(long, value_name = "FILE")]
    pub vm_image: Option<PathBuf>,
    /// qemu backend: guest memory of each VM, in MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub vm_memory: u32,
    /// qemu backend: vCPUs of each VM (1 to 64). Default: 2 under KVM, 1
    /// under TCG (an emulated guest's second vCPU only makes its CPUs wait
    /// on each other when the host is busy; see run-qemu.sh).
    #[arg(long, value_name = "N")]
    pub vm_cpus: Option<u32>,
    /// qemu backend: packaging/vm/run-qemu.sh. Default: run-qemu.sh next
    /// to this binary (as installed), else the one in the source tree this
    /// binary was built from.
    #[arg(long, value_name = "FILE")]
    pub vm_runner: Option<PathBuf>,
    /// What a released sandbox becomes: `recycle` (the agent clears it and
    /// it returns to the pool) or `replace` (its agent or VM is stopped and
    /// a fresh one started: no tenant can leave anything for the next).
    #[arg(long, value_enum, default_value_t = pool::OnRelease::Recycle)]
    pub on_release: pool::OnRelease,
    /// Base of the URLs handed out (MCP and transfer URLs). Default:
    /// http://<listen>.
    #[arg(long, value_name = "URL")]
    pub public_url: Option<String>,
    /// The agent binary. Default: sandbox-agent next to this binary.
    #[arg(long, value_name = "FILE")]
    pub agent_bin: Option<PathBuf>,
    /// The MCP server manifest the agents run (process backend). Required
    /// unless /etc/sandbox-agent/servers.toml exists.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// When a sandbox's MCP servers start: `auto` (on their first MCP
    /// request for `server_names: "ALL"` and `/sandbox/local_dev`, which
    /// lease many servers of which a task uses a few; before the answer
    /// for an explicit list, as Klavis answers with ready servers),
    /// `eager` (always before the answer) or `lazy` (always on first use).
    /// A warm lease covering the request is used either way.
    #[arg(long, value_enum, default_value = "auto")]
    pub server_start: ServerStart,
    /// Discovery catalogs, from which agents answer an idle server's
    /// discovery without starting it (docs/host.md): `record` (at start,
    /// what --catalog-dir lacks or holds under an old key), `use`, `off`.
    #[arg(long, value_enum, default_value = "record")]
    pub catalogs: pool::CatalogMode,
    /// Where the discovery catalogs are kept. Default: DATA_DIR/catalogs.
    #[arg(long, value_name = "DIR")]
    pub catalog_dir: Option<PathBuf>,
    /// Multiplies every TTL (0.05 makes 60 s last 3 s; for tests).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Log format: `text`, or `json` (one JSON object per line). Filter
    /// with RUST_LOG (default: info).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Largest archive a PUT may upload, in bytes.
    #[arg(long, default_value_t = 8 << 30)]
    pub max_upload_bytes: u64,
    /// How the process backend isolates its sandboxes: `namespaces` (each
    /// agent in its own user, mount, pid, ipc, uts, cgroup and network
    /// namespaces, tenants unprivileged; needs bubblewrap, util-linux,
    /// uidmap, passt and a subordinate id range in /etc/subuid and
    /// /etc/subgid) or `none` (development only: tenants run as this
    /// host's user and reach its files, processes and loopback).
    #[arg(long, value_enum, default_value = "namespaces")]
    pub isolation: pool::isolate::Mode,
    /// What an isolated sandbox may reach over the network: `outbound`
    /// (the internet through pasta; never this host's loopback services or
    /// link-local/cloud-metadata addresses) or `none` (its own loopback).
    #[arg(long, value_enum, default_value = "outbound")]
    pub sandbox_network: pool::isolate::Network,
    /// A path an isolated sandbox sees read-only at the same place
    /// (repeatable): interpreters or servers installed outside /usr, /etc
    /// and /opt. The agent binary and the manifest's directory always are.
    #[arg(long = "sandbox-ro", value_name = "PATH")]
    pub sandbox_ro: Vec<PathBuf>,
    /// A port of this host's loopback that isolated sandboxes reach at the
    /// same port of their own loopback (repeatable): a local package
    /// mirror or proxy. Never the host's own API port.
    #[arg(long = "sandbox-host-port", value_name = "PORT")]
    pub sandbox_host_ports: Vec<u16>,
    /// memory.max of each isolated sandbox (its agent, servers and
    /// scripts together), in bytes.
    #[arg(long, default_value_t = 8 << 30, value_name = "BYTES")]
    pub slot_memory_max: u64,
    /// How long a new sandbox (agent or VM) may take to report SERVING
    /// before it is discarded and its acquire fails (503), in seconds.
    /// Default: 60 on the process backend, 300 on qemu (TCG boots slowly
    /// on a busy machine).
    #[arg(long, value_name = "SECONDS")]
    pub slot_start_timeout: Option<u64>,
    /// How long the host waits for an agent's answer to a short call (the
    /// catalog, server states, executions' status and logs, a new slot's
    /// serving probe), in seconds; past it the call fails (504).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub agent_call_timeout: u64,
    /// How long the host waits for an agent's Acquire, Narrow or Reset
    /// (they may start servers), in seconds; past it the Acquire fails and
    /// its sandbox is replaced, a Reset leaves the sandbox `error`.
    #[arg(long, value_name = "SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub agent_acquire_timeout: u64,
    /// How long the host waits for an agent's Release (servers stopped;
    /// workspace, home and temp dirs deleted), in seconds; past it the
    /// sandbox is replaced.
    #[arg(long, value_name = "SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub agent_release_timeout: u64,
    /// How long the host waits for an agent to begin answering a transfer
    /// (workspace Initialize and Dump, per-server data, execution uploads),
    /// in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub agent_transfer_timeout: u64,
    /// How often the host retries removing slot directories it could not
    /// remove, and ends the slots of its data dir it holds in no list
    /// (seen so at two passes in a row), in seconds. At least 1.
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub reclaim_interval: u64,
    /// pids.max of each isolated sandbox (processes and threads).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub slot_pids_max: u64,
    /// Size of each isolated sandbox's own file system (a tmpfs holding
    /// its workspace, state, executions and temporary directories; its
    /// pages count against --slot-memory-max too), in bytes: past it a
    /// tenant's writes fail with ENOSPC. 0: no file system of its own
    /// (the data dir's, unbounded; the host then deletes what a lease
    /// left file by file).
    #[arg(long, default_value_t = 4 << 30, value_name = "BYTES")]
    pub slot_disk_bytes: u64,
    /// Files and directories each isolated sandbox's file system can hold
    /// (the tmpfs's nr_inodes): past it ENOSPC.
    #[arg(long, default_value_t = 262_144, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub slot_inodes: u64,
    /// A released isolated sandbox whose file system holds more entries
    /// than this is discarded whole (unmounted; a fresh one takes its place)
    /// rather than emptied file by file and recycled.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub recycle_max_inodes: u64,
    /// Execution archives one sandbox may hold in the upload store (one per
    /// name; uploading to a name again replaces it). The same as the
    /// agent's exec.max_executions (32 by default): a name beyond it could
    /// never run. A new name over it is refused at execution-upload-url and
    /// at the PUT (429).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub max_executions_per_sandbox: usize,
    /// Bytes of uploaded archives (workspace and executions) one sandbox may
    /// hold, counted while they stream; an upload over it is a 413 and
    /// keeps nothing. Release frees them.
    #[arg(long, default_value_t = 16 << 30, value_name = "BYTES")]
    pub max_stored_bytes_per_sandbox: u64,
    /// Bytes of uploaded archives all sandboxes of one owner (an API key,
    /// or the keys sharing an owner) may hold at once; over it: 413.
    #[arg(long, default_value_t = 64 << 30, value_name = "BYTES")]
    pub max_stored_bytes_per_key: u64,
    /// Largest `multipart/form-data` initialize (the SDK's
    /// `initialize_local_dev` files), in bytes: it is held in memory while
    /// it is packed; larger workspaces go through upload-url. Over it: 413.
    #[arg(long, default_value_t = 256 << 20, value_name = "BYTES")]
    pub max_multipart_bytes: u64,
    /// Live sandboxes one owner (an API key, or the keys sharing an owner in
    /// --api-key-file) may hold at once, its released ones still being
    /// cleaned up counted too; one more Acquire is a 429 (or, when only
    /// those keep it out, waits up to --agent-release-timeout for one).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_sandboxes_per_key: usize,
    /// A variable of this host's environment its agents get too
    /// (repeatable; by name, its value read from this host's environment),
    /// e.g. PIP_INDEX_URL or HTTPS_PROXY for executions (exec.pass_env).
    /// Agents start with a cleared environment: PATH and HOME (for their
    /// own tools, never passed on to a sandbox's processes), RUST_LOG,
    /// RUST_BACKTRACE, SANDBOX_AGENT_*, the names the manifest's `pass_env`
    /// lists, and these; nothing else of this host's environment.
    #[arg(long = "agent-env", value_name = "NAME")]
    pub agent_env: Vec<String>,
    /// Serve `GET /metrics` on this address of its own, without a key
    /// (for a Prometheus that reaches only it); the API's address then
    /// answers it 404. Without it, `/metrics` is on the API's address and
    /// needs an API key, as every other route.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// kubernetes backend: the namespace of the warm pools and claims.
    /// Default: the namespace of the kubeconfig's context, or of this
    /// pod's service account.
    #[arg(long, value_name = "NS")]
    pub kube_namespace: Option<String>,
    /// kubernetes backend: the SandboxWarmPool an Acquire of a benchmark
    /// claims from (repeatable): `BENCHMARK=POOL`, or `POOL` for requests
    /// without a benchmark or of a benchmark without a pool of its own.
    #[arg(long = "kube-pool", value_name = "[BENCHMARK=]POOL")]
    pub kube_pools: Vec<String>,
    /// kubernetes backend: the port of the pods' agent (gRPC).
    #[arg(long, default_value_t = 7070, value_name = "PORT")]
    pub kube_agent_port: u16,
    /// kubernetes backend: the port of the pods' MCP data plane.
    #[arg(long, default_value_t = 7071, value_name = "PORT")]
    pub kube_mcp_port: u16,
    /// kubernetes backend: how long a claim may take to give a Ready
    /// sandbox with a pod IP; past it the Acquire is a 503 naming the pool
    /// and the claim is deleted.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub kube_claim_timeout: u64,
    /// kubernetes backend: how long one call to the API server may go
    /// unanswered (no watch runs: a longer silence is a stalled server).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub kube_call_timeout: u64,
    /// kubernetes backend: how long binding a claimed pod's agent to its
    /// lease may take (a connection and one call); past it the Acquire is
    /// a 503 and the claim is deleted.
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    pub kube_bind_timeout: u64,
    /// kubernetes backend: how long a claimed pod's agent may take to
    /// Release (its servers stopped, outside accounts cleaned) before its
    /// claim, and the pod, are deleted anyway.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub kube_release_timeout: u64,
    /// kubernetes backend: a claim's shutdownTime is its lease's expiry
    /// plus this: the hosts release first; the controller ends the claim
    /// should no host run.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub kube_shutdown_grace: u64,
    /// kubernetes backend: how long a replica's presence Lease lasts past
    /// its last renewal (renewed a third before). A replica killed
    /// mid-Acquire: its claims stop counting against their owners, and
    /// are deleted, this long (plus 5 s of clock skew) after;
    /// also the reaper's Lease, taken over this long after its holder
    /// died.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub kube_presence_ttl: u64,
    /// kubernetes backend: how long an admitted Acquire holds its place
    /// against its owner's cap before its claim must exist (removed as
    /// soon as the claim is made; this bounds an Acquire dropped between
    /// the two).
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub kube_reservation_ttl: u64,
    /// kubernetes backend: how long a sandbox found live is taken as live
    /// by the MCP URLs of this replica without asking the API server
    /// again (a release by this replica ends it at once).
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub kube_admit_cache_ms: u64,
    /// kubernetes backend: the warm pools' shared bootstrap secret (the
    /// Secret their pods' agents take as token file). Each claimed pod's
    /// agent is bound to its lease's own token with it, after which it
    /// admits nothing there.
    #[arg(long, value_name = "FILE")]
    pub kube_bootstrap_token_file: Option<PathBuf>,
    /// The key that signs transfer and MCP URLs (and, on the kubernetes
    /// backend, derives each lease's agent token): at least 32 bytes.
    /// Replicas serving one fleet share it (a Secret). Default: made once
    /// in the data dir. Required by the kubernetes backend.
    #[arg(long, value_name = "FILE")]
    pub signing_key_file: Option<PathBuf>,
    /// At most this many sandboxes at once, idle, starting and leased
    /// together (it bounds the sum of --slot-memory-max and
    /// --slot-pids-max); an Acquire that would need one more is a 503.
    /// At least --pool-size. Default: no bound.
    #[arg(long, value_name = "N")]
    pub max_slots: Option<usize>,
}

pub use crate::pool::ServerStart;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--backend`: the one enum of the backends' kinds (`pool::Kind`).
pub use crate::pool::Kind as BackendKind;

/// The environment the slots' main processes get (see
/// [`pool::AgentEnv`]), from this host's own, checked.
pub fn agent_env(args: &Args, backend: &pool::Backend) -> anyhow::Result<pool::AgentEnv> {
    for n in &args.agent_env {
        anyhow::ensure!(
            !n.is_empty() && !n.contains('=') && !n.contains('\0'),
            "--agent-env takes a variable's name (its value is read from this host's \
             environment), not {n:?}"
        );
        anyhow::ensure!(
            n != API_KEY_ENV,
            "--agent-env {API_KEY_ENV}: the API keys never reach a sandbox"
        );
    }
    let manifest_names = match backend {
        pool::Backend::Process { manifest, .. } => pool::manifest_pass_env(
            manifest
                .as_deref()
                .unwrap_or(std::path::Path::new(INSTALLED_MANIFEST)),
        ),
        pool::Backend::Qemu { .. } | pool::Backend::Kubernetes => Default::default(),
    };
    let env = pool::AgentEnv::new(std::env::vars_os(), &manifest_names, &args.agent_env);
    tracing::info!(names = ?env.names(), "agents get only these variables of this host's environment");
    Ok(env)
}

/// The warm profiles of `--warm` and `--warm-servers`, checked.
pub fn warm_profiles(args: &Args) -> anyhow::Result<Vec<pool::WarmProfile>> {
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

pub(crate) use crate::pool::API_KEY_ENV;

pub fn keys(args: &Args, from_env: Option<String>) -> anyhow::Result<HashMap<String, String>> {
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
pub fn owner_of_key(key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(key.as_bytes());
    format!("key-{}", &hex::encode(d)[..16])
}

/// The process backend's isolation, checked (`None` for the qemu backend,
/// whose VMs isolate, and for `--isolation none`, said loudly).
pub fn isolation(
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
                slot_fs: (args.slot_disk_bytes > 0).then_some(pool::isolate::slot_fs::SlotFs {
                    bytes: args.slot_disk_bytes,
                    inodes: args.slot_inodes,
                }),
            })?;
            Ok(Some(Arc::new(iso)))
        }
    }
}
