//! The server manifest: which MCP servers this sandbox can run and how.
//!
//! A TOML file (`packaging/servers.toml` is the shipped one) with a
//! `[defaults]` table and one `[servers.NAME]` table per server. Loading
//! checks every entry and names the entry and field of the first problem.
//! [`ServerDef::launch`] turns an entry, a benchmark profile and the
//! lease's credentials into the exact [`LaunchSpec`] the supervisor runs.
//!
//! Strings may use `${workspace}`, `${install_dir}` and `${name}`; they are
//! expanded when the manifest is loaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Manifest read when `--manifest` is not given.
pub const DEFAULT_MANIFEST_PATH: &str = "/etc/sandbox-agent/servers.toml";

/// Environment variables a child gets from the agent's own environment when
/// neither the manifest nor the lease sets them.
const BASE_PASS_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"];

/// A manifest problem; the message names the file, entry and field.
#[derive(Debug, thiserror::Error)]
#[error("manifest {path}: {message}")]
pub struct ManifestError {
    pub path: String,
    pub message: String,
}

/// The benchmark profiles of the Klavis API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Benchmark {
    #[serde(rename = "MCP_Atlas")]
    McpAtlas,
    #[serde(rename = "Toolathlon")]
    Toolathlon,
    #[serde(rename = "MCP_Mark")]
    McpMark,
}

impl Benchmark {
    pub fn as_str(self) -> &'static str {
        match self {
            Benchmark::McpAtlas => "MCP_Atlas",
            Benchmark::Toolathlon => "Toolathlon",
            Benchmark::McpMark => "MCP_Mark",
        }
    }
}

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
    fn or(&self, d: &ResourceLimits) -> ResourceLimits {
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
    /// Merged over the server's env.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub seed: Vec<SeedFile>,
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
}

/// Resolved restart policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub policy: RestartPolicy,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub max_restarts: u32,
    pub window: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    Http { port: u16, path: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    pub from: PathBuf,
    /// `None`: the workspace.
    pub to: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct Override {
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub seed: Vec<Seed>,
}

/// One checked manifest entry.
#[derive(Debug, Clone)]
pub struct ServerDef {
    pub name: String,
    pub description: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub transport: Transport,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub state_paths: Vec<PathBuf>,
    pub restart: Restart,
    pub limits: ResourceLimits,
    pub pass_env: Vec<String>,
    pub requires: Vec<RequiredFile>,
    pub auth_env: BTreeMap<String, String>,
    pub benchmarks: BTreeMap<Benchmark, Override>,
    pub metadata: BTreeMap<String, String>,
}

/// Everything needed to start one server process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// The complete environment (the child's is cleared first).
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub transport: Transport,
    pub ready_timeout: Duration,
    pub stop_grace: Duration,
    pub restart: Restart,
    pub limits: ResourceLimits,
}

/// A lease's credentials and extra environment for one server.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// auth_data fields, already rendered as strings.
    pub auth: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
}

/// Why a server cannot be launched for a lease.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LaunchError(pub String);

/// The checked manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub servers: BTreeMap<String, ServerDef>,
    /// The file after expansion, printed by `--check-config`.
    pub file: ManifestFile,
}

impl Manifest {
    /// An empty manifest (no servers), used when the default file is absent.
    pub fn empty(path: &Path) -> Manifest {
        Manifest {
            path: path.to_owned(),
            servers: BTreeMap::new(),
            file: ManifestFile::default(),
        }
    }

    /// Reads and checks `path`. `workspace` is what `${workspace}` expands to.
    pub fn load(path: &Path, workspace: &Path) -> Result<Manifest, ManifestError> {
        let err = |message: String| ManifestError {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        Manifest::parse(&text, path, workspace)
    }

    pub fn parse(text: &str, path: &Path, workspace: &Path) -> Result<Manifest, ManifestError> {
        let err = |message: String| ManifestError {
            path: path.display().to_string(),
            message,
        };
        let file: ManifestFile = toml::from_str(text)
            .map_err(|e| err(e.to_string().trim_end().replace('\n', "\n  ")))?;
        let mut servers = BTreeMap::new();
        for (name, entry) in &file.servers {
            let def = check_entry(name, entry, &file, workspace)
                .map_err(|(field, m)| err(format!("servers.{name}.{field}: {m}")))?;
            servers.insert(name.clone(), def);
        }
        Ok(Manifest {
            path: path.to_owned(),
            servers,
            file,
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<&ServerDef> {
        self.servers.get(name)
    }
}

type FieldError = (String, String);

fn field(f: &str, m: impl Into<String>) -> FieldError {
    (f.to_owned(), m.into())
}

/// `${…}` expansion with the three known variables; anything else is an error.
fn expand(s: &str, vars: &[(&str, &str)], f: &str) -> Result<String, FieldError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| field(f, format!("unclosed '${{' in {s:?}")))?;
        let key = &after[..end];
        let val = vars
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let known: Vec<String> = vars.iter().map(|(k, _)| format!("${{{k}}}")).collect();
                field(
                    f,
                    format!("unknown variable ${{{key}}}; known: {}", known.join(", ")),
                )
            })?;
        out.push_str(val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn abs_path(p: &str, f: &str) -> Result<PathBuf, FieldError> {
    let path = PathBuf::from(p);
    if !path.is_absolute() {
        return Err(field(f, format!("{p:?} must be an absolute path")));
    }
    if path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(field(f, format!("{p:?} must not contain '..'")));
    }
    Ok(path)
}

fn check_env(env: &BTreeMap<String, String>, f: &str) -> Result<(), FieldError> {
    for k in env.keys() {
        if !valid_env_name(k) {
            return Err(field(
                f,
                format!("{k:?} is not a valid environment variable name"),
            ));
        }
    }
    Ok(())
}

fn resolve_user(user: &str, f: &str) -> Result<(u32, u32), FieldError> {
    if let Ok(uid) = user.parse::<u32>() {
        let gid = nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map_or(uid, |u| u.gid.as_raw());
        return Ok((uid, gid));
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok((u.uid.as_raw(), u.gid.as_raw())),
        Ok(None) => Err(field(f, format!("no such user {user:?}"))),
        Err(e) => Err(field(f, format!("looking up user {user:?}: {e}"))),
    }
}

fn resolve_group(group: &str, f: &str) -> Result<u32, FieldError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(field(f, format!("no such group {group:?}"))),
        Err(e) => Err(field(f, format!("looking up group {group:?}: {e}"))),
    }
}

fn check_entry(
    name: &str,
    e: &ServerFile,
    file: &ManifestFile,
    workspace: &Path,
) -> Result<ServerDef, FieldError> {
    if !valid_name(name) {
        return Err(field(
            "name",
            "server names are 1-64 characters of a-z, 0-9, '_' and '-'",
        ));
    }
    let ws = workspace.display().to_string();
    let install = file.install_dir.clone().unwrap_or_default();
    let vars = [
        ("workspace", ws.as_str()),
        ("install_dir", install.as_str()),
        ("name", name),
    ];
    if install.is_empty() && e.command.contains("${install_dir}") {
        return Err(field(
            "command",
            "uses ${install_dir} but the manifest sets no install_dir",
        ));
    }
    let x = |s: &str, f: &str| expand(s, &vars, f);
    let command = x(&e.command, "command")?;
    if command.trim().is_empty() {
        return Err(field("command", "must not be empty"));
    }
    let args = e
        .args
        .iter()
        .map(|a| x(a, "args"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut env = BTreeMap::new();
    for (k, v) in file.defaults.env.iter().chain(e.env.iter()) {
        env.insert(k.clone(), x(v, "env")?);
    }
    check_env(&env, "env")?;
    let cwd = match &e.cwd {
        Some(c) => abs_path(&x(c, "cwd")?, "cwd")?,
        None => workspace.to_owned(),
    };
    let (mut uid, mut gid) = (None, None);
    if let Some(u) = e.user.as_ref().or(file.defaults.user.as_ref()) {
        let (u, g) = resolve_user(u, "user")?;
        uid = Some(u);
        gid = Some(g);
    }
    if let Some(g) = e.group.as_ref().or(file.defaults.group.as_ref()) {
        gid = Some(resolve_group(g, "group")?);
    }
    let transport = match (e.transport, &e.http) {
        (TransportKind::Stdio, None) => Transport::Stdio,
        (TransportKind::Stdio, Some(_)) => {
            return Err(field(
                "http",
                "is only meaningful with transport = \"http\"",
            ));
        }
        (TransportKind::Http, None) => {
            return Err(field(
                "http",
                "transport = \"http\" needs http = { port = N, path = \"/mcp\" }",
            ));
        }
        (TransportKind::Http, Some(h)) => {
            let path = h.path.clone().unwrap_or_else(|| "/mcp".into());
            if h.port == 0 {
                return Err(field("http.port", "must be 1-65535"));
            }
            if !path.starts_with('/') {
                return Err(field("http.path", "must start with '/'"));
            }
            Transport::Http { port: h.port, path }
        }
    };
    let ms = |v: Option<u64>, d: Option<u64>, dflt: u64, f: &str| -> Result<Duration, FieldError> {
        let v = v.or(d).unwrap_or(dflt);
        if v == 0 {
            return Err(field(f, "must be greater than 0"));
        }
        Ok(Duration::from_millis(v))
    };
    let ready_timeout = ms(
        e.ready_timeout_ms,
        file.defaults.ready_timeout_ms,
        60_000,
        "ready_timeout_ms",
    )?;
    let stop_grace = ms(
        e.stop_grace_ms,
        file.defaults.stop_grace_ms,
        5_000,
        "stop_grace_ms",
    )?;
    let r = &e.restart;
    let d = &file.defaults.restart;
    let restart = Restart {
        policy: r.policy.or(d.policy).unwrap_or(RestartPolicy::OnFailure),
        initial_backoff: ms(
            r.initial_backoff_ms,
            d.initial_backoff_ms,
            250,
            "restart.initial_backoff_ms",
        )?,
        max_backoff: ms(
            r.max_backoff_ms,
            d.max_backoff_ms,
            10_000,
            "restart.max_backoff_ms",
        )?,
        max_restarts: r.max_restarts.or(d.max_restarts).unwrap_or(5),
        window: ms(r.window_ms, d.window_ms, 60_000, "restart.window_ms")?,
    };
    if restart.max_backoff < restart.initial_backoff {
        return Err(field(
            "restart.max_backoff_ms",
            "must not be smaller than initial_backoff_ms",
        ));
    }
    let mut state_paths = Vec::new();
    for p in &e.state_paths {
        let path = abs_path(&x(p, "state_paths")?, "state_paths")?;
        if path.parent().is_none() || path.starts_with(workspace) || workspace.starts_with(&path) {
            return Err(field(
                "state_paths",
                format!(
                    "{} must be outside the workspace and not contain it (the workspace is cleared separately)",
                    path.display()
                ),
            ));
        }
        state_paths.push(path);
    }
    let limits = e.limits.or(&file.defaults.limits);
    let mut pass_env: Vec<String> = BASE_PASS_ENV.iter().map(|s| s.to_string()).collect();
    pass_env.extend(file.defaults.pass_env.iter().cloned());
    pass_env.extend(e.pass_env.iter().cloned());
    for v in &pass_env {
        if !valid_env_name(v) {
            return Err(field(
                "pass_env",
                format!("{v:?} is not a valid environment variable name"),
            ));
        }
    }
    for r in &e.requires {
        if !valid_env_name(&r.var) {
            return Err(field(
                "requires",
                format!("{:?} is not a valid environment variable name", r.var),
            ));
        }
    }
    for v in e.auth_env.values() {
        if !valid_env_name(v) {
            return Err(field(
                "auth_env",
                format!("{v:?} is not a valid environment variable name"),
            ));
        }
    }
    let mut benchmarks = BTreeMap::new();
    for (b, o) in &e.benchmarks {
        let f = |s: &str| format!("benchmarks.{}.{s}", b.as_str());
        let mut env = BTreeMap::new();
        for (k, v) in &o.env {
            env.insert(k.clone(), x(v, &f("env"))?);
        }
        check_env(&env, &f("env"))?;
        let mut seed = Vec::new();
        for s in &o.seed {
            let from = abs_path(&x(&s.from, &f("seed.from"))?, &f("seed.from"))?;
            if !from.exists() {
                return Err(field(
                    &f("seed.from"),
                    format!("{} does not exist", from.display()),
                ));
            }
            let to = match &s.to {
                None => None,
                Some(t) => {
                    let to = abs_path(&x(t, &f("seed.to"))?, &f("seed.to"))?;
                    if to == workspace {
                        None
                    } else if state_paths.iter().any(|sp| to.starts_with(sp)) {
                        Some(to)
                    } else {
                        return Err(field(
                            &f("seed.to"),
                            format!(
                                "{} must be the workspace or inside one of this server's state_paths",
                                to.display()
                            ),
                        ));
                    }
                }
            };
            seed.push(Seed { from, to });
        }
        benchmarks.insert(
            *b,
            Override {
                command: o
                    .command
                    .as_deref()
                    .map(|c| x(c, &f("command")))
                    .transpose()?,
                args: o
                    .args
                    .as_ref()
                    .map(|a| {
                        a.iter()
                            .map(|s| x(s, &f("args")))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .transpose()?,
                env,
                seed,
            },
        );
    }
    Ok(ServerDef {
        name: name.to_owned(),
        description: e.description.clone().unwrap_or_default(),
        command,
        args,
        env,
        cwd,
        uid,
        gid,
        transport,
        ready_timeout,
        stop_grace,
        state_paths,
        restart,
        limits,
        pass_env,
        requires: e.requires.clone(),
        auth_env: e.auth_env.clone(),
        benchmarks,
        metadata: e.metadata.clone(),
    })
}

impl ServerDef {
    /// Seed data of a benchmark profile, in order.
    pub fn seeds(&self, benchmark: Option<Benchmark>) -> &[Seed] {
        benchmark
            .and_then(|b| self.benchmarks.get(&b))
            .map_or(&[], |o| o.seed.as_slice())
    }

    /// The exact process to run for a lease with `benchmark` and `creds`.
    /// `agent_env` is the agent's own environment (for pass_env).
    pub fn launch(
        &self,
        benchmark: Option<Benchmark>,
        creds: &Credentials,
        agent_env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<LaunchSpec, LaunchError> {
        let o = benchmark.and_then(|b| self.benchmarks.get(&b));
        let mut env = BTreeMap::new();
        for k in &self.pass_env {
            if let Some(v) = agent_env(k) {
                env.insert(k.clone(), v);
            }
        }
        env.extend(self.env.clone());
        if let Some(o) = o {
            env.extend(o.env.clone());
        }
        for (k, v) in &creds.auth {
            let var = self
                .auth_env
                .get(k)
                .cloned()
                .unwrap_or_else(|| k.to_ascii_uppercase());
            if !valid_env_name(&var) {
                return Err(LaunchError(format!(
                    "auth_data.{}: field {k:?} does not map to an environment variable; use one of: {}",
                    self.name,
                    self.auth_env.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            env.insert(var, v.clone());
        }
        for (k, v) in &creds.env {
            if !valid_env_name(k) {
                return Err(LaunchError(format!(
                    "env.{}: {k:?} is not a valid environment variable name",
                    self.name
                )));
            }
            env.insert(k.clone(), v.clone());
        }
        let missing: Vec<&RequiredFile> = self
            .requires
            .iter()
            .filter(|r| env.get(&r.var).is_none_or(|v| v.is_empty()))
            .collect();
        if !missing.is_empty() {
            let list: Vec<String> = missing
                .iter()
                .map(|r| format!("{} ({})", r.var, r.what))
                .collect();
            let fields: Vec<String> = missing
                .iter()
                .map(|r| {
                    self.auth_env
                        .iter()
                        .find(|(_, v)| **v == r.var)
                        .map_or_else(|| r.var.to_ascii_lowercase(), |(k, _)| k.clone())
                })
                .collect();
            return Err(LaunchError(format!(
                "server {} needs {}; pass them in auth_data[\"{}\"] as {{{}}}, in the lease's env, or in the agent's environment",
                self.name,
                list.join(" and "),
                self.name,
                fields
                    .iter()
                    .map(|f| format!("\"{f}\": …"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(LaunchSpec {
            name: self.name.clone(),
            command: o
                .and_then(|o| o.command.clone())
                .unwrap_or_else(|| self.command.clone()),
            args: o
                .and_then(|o| o.args.clone())
                .unwrap_or_else(|| self.args.clone()),
            env,
            cwd: self.cwd.clone(),
            uid: self.uid,
            gid: self.gid,
            transport: self.transport.clone(),
            ready_timeout: self.ready_timeout,
            stop_grace: self.stop_grace,
            restart: self.restart.clone(),
            limits: self.limits.clone(),
        })
    }

    /// The endpoint path of this server on the MCP data plane.
    pub fn mcp_path(&self) -> String {
        format!("/{}/mcp", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, Path::new("m.toml"), Path::new("/ws"))
    }

    #[test]
    fn errors_name_entry_and_field() {
        let e =
            parse("[servers.a]\ncommand = \"x\"\n[servers.a.restart]\npolicy = \"sometimes\"\n")
                .expect_err("bad policy")
                .to_string();
        assert!(e.contains("m.toml") && e.contains("policy"), "{e}");
        let e = parse("[servers.a]\ncommand = \"x\"\ntransport = \"http\"\n")
            .expect_err("http without port")
            .to_string();
        assert!(e.contains("servers.a.http"), "{e}");
        let e = parse("[servers.a]\ncommand = \"${nope}/x\"\n")
            .expect_err("unknown var")
            .to_string();
        assert!(
            e.contains("servers.a.command") && e.contains("${nope}"),
            "{e}"
        );
        let e = parse("[servers.a]\ncommand = \"x\"\nstate_paths = [\"/ws/x\"]\n")
            .expect_err("state path inside ws")
            .to_string();
        assert!(e.contains("servers.a.state_paths"), "{e}");
        let e = parse("[servers.A]\ncommand = \"x\"\n")
            .expect_err("bad name")
            .to_string();
        assert!(e.contains("servers.A.name"), "{e}");
    }

    #[test]
    fn launch_applies_profile_and_credentials() {
        let m = parse(
            r#"
install_dir = "/opt/s"
[servers.c]
command = "${install_dir}/bin/c"
args = ["${workspace}"]
env = { A = "1" }
requires = [{ var = "TOKEN", what = "an API token" }]
auth_env = { api_token = "TOKEN" }
[servers.c.benchmarks.Toolathlon]
args = ["--bench"]
env = { A = "2" }
"#,
        )
        .expect("valid");
        let def = m.get("c").expect("entry");
        let none = |_: &str| None;
        let e = def
            .launch(None, &Credentials::default(), &none)
            .expect_err("token missing")
            .to_string();
        assert!(
            e.contains("TOKEN (an API token)") && e.contains("api_token"),
            "{e}"
        );
        let creds = Credentials {
            auth: [("api_token".to_owned(), "t".to_owned())].into(),
            env: BTreeMap::new(),
        };
        let s = def.launch(None, &creds, &none).expect("launch");
        assert_eq!(s.command, "/opt/s/bin/c");
        assert_eq!(s.args, vec!["/ws"]);
        assert_eq!(s.env.get("TOKEN").map(String::as_str), Some("t"));
        let s = def
            .launch(Some(Benchmark::Toolathlon), &creds, &none)
            .expect("launch");
        assert_eq!(s.args, vec!["--bench"]);
        assert_eq!(s.env.get("A").map(String::as_str), Some("2"));
    }
}
