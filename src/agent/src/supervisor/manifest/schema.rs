//! The manifest file as written: the serde schema of `servers.toml`.
//! Nothing here is checked; [`super::check`] turns an entry into a
//! [`super::ServerDef`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Benchmark;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Restart after every exit, clean or not.
    Always,
    /// Restart unless the server exited with code 0.
    OnFailure,
    /// Never restart; an exit leaves the server stopped (code 0) or failed.
    Never,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartFile {
    pub policy: Option<RestartPolicy>,
    pub initial_backoff_ms: Option<u64>,
    pub max_backoff_ms: Option<u64>,
    /// More restarts than this within `window_ms` mark the server failed.
    pub max_restarts: Option<u32>,
    pub window_ms: Option<u64>,
}

/// Per-process limits. rlimits apply to the child and are inherited by its
/// descendants; `memory_bytes` is a cgroup v2 `memory.max` for the whole
/// server, applied when the agent can manage cgroups.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    pub nofile: Option<u64>,
    pub nproc: Option<u64>,
    pub cpu_seconds: Option<u64>,
    pub fsize_bytes: Option<u64>,
    pub address_space_bytes: Option<u64>,
    pub core_bytes: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl ResourceLimits {
    pub(super) fn or(&self, d: &ResourceLimits) -> ResourceLimits {
        ResourceLimits {
            nofile: self.nofile.or(d.nofile),
            nproc: self.nproc.or(d.nproc),
            cpu_seconds: self.cpu_seconds.or(d.cpu_seconds),
            fsize_bytes: self.fsize_bytes.or(d.fsize_bytes),
            address_space_bytes: self.address_space_bytes.or(d.address_space_bytes),
            core_bytes: self.core_bytes.or(d.core_bytes),
            memory_bytes: self.memory_bytes.or(d.memory_bytes),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// How long a server may take to pass its readiness check.
    pub ready_timeout_ms: Option<u64>,
    /// Time between SIGTERM and SIGKILL when a server is stopped.
    pub stop_grace_ms: Option<u64>,
    #[serde(default)]
    pub restart: RestartFile,
    #[serde(default)]
    pub limits: ResourceLimits,
    /// Environment for every server (a server's own env wins).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Agent environment variables passed through to every server.
    #[serde(default)]
    pub pass_env: Vec<String>,
    pub user: Option<String>,
    pub group: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// JSON-RPC lines over stdin/stdout.
    #[default]
    Stdio,
    /// The server speaks streamable HTTP on a loopback port.
    Http,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpFile {
    pub port: u16,
    /// Default `/mcp`.
    pub path: Option<String>,
}

/// Seed data: an archive (tar, tar.gz, tar.zst) or a directory, placed
/// before the server starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedFile {
    pub from: String,
    /// Default: the workspace. Otherwise a directory inside one of the
    /// server's state paths.
    pub to: Option<String>,
}

/// What a benchmark profile changes for one server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideFile {
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    /// The working directory instead of the server's (an absolute path).
    pub cwd: Option<String>,
    /// Merged over the server's env.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub seed: Vec<SeedFile>,
    /// Directories inside the workspace the server writes into (relative
    /// paths), present for the whole lease: created at Acquire, and kept by
    /// every Initialize and Clear.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Merged over the server's metadata (the implementation and version
    /// the profile runs, shown in server listings).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A variable the server cannot start without.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredFile {
    pub var: String,
    /// What it is, for the error message, e.g. "Canvas LMS API token".
    pub what: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    pub description: Option<String>,
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Default: the workspace.
    pub cwd: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    #[serde(default)]
    pub transport: TransportKind,
    pub http: Option<HttpFile>,
    pub ready_timeout_ms: Option<u64>,
    pub stop_grace_ms: Option<u64>,
    /// Directories outside the workspace the server writes: created before
    /// it starts, emptied on release and reset.
    #[serde(default)]
    pub state_paths: Vec<String>,
    #[serde(default)]
    pub restart: RestartFile,
    #[serde(default)]
    pub limits: ResourceLimits,
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Variables that must be set (by auth_data, the lease's env, the
    /// manifest, or pass_env) for the server to start.
    #[serde(default)]
    pub requires: Vec<RequiredFile>,
    /// auth_data field → environment variable. Fields not listed map to
    /// their upper-cased name.
    #[serde(default)]
    pub auth_env: BTreeMap<String, String>,
    #[serde(default)]
    pub benchmarks: BTreeMap<Benchmark, OverrideFile>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The server reads and sends mail through the sandbox's mail service
    /// (`[mail]`): a lease that names it without auth_data gets an account
    /// there, passed as auth_data fields (email, password, imap_server, …).
    #[serde(default)]
    pub mail: bool,
    /// Loads and dumps the server's data in its outside service (Klavis's
    /// per-server initialize/dump), run with the server's environment:
    /// `CMD load (--file F | --default)`, `CMD dump --out F`, and, when the
    /// credentials are the operator's shared account
    /// (`SANDBOX_DATA_ACCOUNT=shared`, `SANDBOX_DATA_LEDGER`), `CMD cleanup`
    /// at Release and Reset (see `server_data`).
    pub data_command: Option<String>,
    /// Who runs `data_command`: `service` (default: an unprivileged user of
    /// its own, for tools that hold an outside service's credentials) or
    /// `tenant` (for data in the tenant's own files, e.g. the memory
    /// server's graph).
    #[serde(default)]
    pub data_user: DataUser,
    /// Started by an Acquire of all servers (`all_servers`; Klavis's `ALL`).
    /// Default true; false: only when named, e.g. a public-data server that
    /// Klavis serves as a sandbox of its own rather than a local one.
    pub in_all: Option<bool>,
}

/// See [`ServerFile::data_user`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataUser {
    #[default]
    Service,
    Tenant,
}

/// `[mail]`: the sandbox's own mail service (IMAP + SMTP submission for one
/// local domain), run while a lease has a server with `mail = true`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailFile {
    /// The `sandbox-mail` launcher (packaging/launchers).
    pub command: String,
    /// Default `mcp.com` (Toolathlon's): the domain of the default account.
    pub domain: Option<String>,
    /// Every domain the service serves (`domain` is always one); a name
    /// may hold one numeric range, `mcp{1..110}.com`. Default: `domain`.
    pub domains: Option<Vec<String>>,
    /// Local part of the lease's account when its test_account_email is not
    /// an address of the domain. Default `sandbox`.
    pub account: Option<String>,
    /// Default 1143 and 1587 (Toolathlon's); 0: a free loopback port at
    /// every start (`--mail-ports auto` sets both to 0).
    pub imap_port: Option<u16>,
    pub smtp_port: Option<u16>,
    /// Where the mailboxes and the service's files live, emptied at every
    /// start and stop. Default `${state_root}/mail`.
    pub dir: Option<String>,
    /// How long the service may take to accept connections. Default 20000.
    pub ready_timeout_ms: Option<u64>,
    /// How long loading or dumping mailboxes may take. Default 120000.
    pub op_timeout_ms: Option<u64>,
    /// Largest message SMTP accepts. Default 25 MiB.
    pub max_message_bytes: Option<u64>,
    /// Largest PosteEmailData JSON loaded or dumped. Default 16 MiB.
    pub max_data_bytes: Option<u64>,
    /// Largest attachment a dump carries the bytes of (`content`, base64);
    /// a larger one is dumped by name, type and size. Default 4 MiB.
    pub dump_attachment_max_bytes: Option<u64>,
}

/// The file as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestFile {
    /// Where `install-servers.sh` put the servers; `${install_dir}`.
    pub install_dir: Option<String>,
    #[serde(default)]
    pub defaults: Defaults,
    #[serde(default)]
    pub servers: BTreeMap<String, ServerFile>,
    pub mail: Option<MailFile>,
    /// What a benchmark profile brings whatever servers are leased.
    #[serde(default)]
    pub benchmarks: BTreeMap<Benchmark, ProfileFile>,
}

/// `[benchmarks.X]`: a profile's own data.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// A directory (or archive) merged into the workspace at every Acquire
    /// and Reset with this benchmark: data its harness never uploads
    /// (MCP_Atlas's CSV files, memory graph and repositories), installed by
    /// packaging/install-benchmark-data.sh. An Acquire with the benchmark
    /// fails while it is missing.
    pub data: Option<String>,
}
