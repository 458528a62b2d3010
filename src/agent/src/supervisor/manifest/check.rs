//! Checking a manifest entry: `${…}` expansion, names, paths, users,
//! transports, timings and profiles. Every problem is an [`EntryError`]
//! naming its field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::schema::{
    ManifestFile, OverrideFile, RestartPolicy, SeedFile, ServerFile, TransportKind,
};
use super::{Benchmark, Override, Restart, Seed, ServerDef, Transport};

/// Longest server name.
pub const MAX_NAME_LEN: usize = 64;

/// What is wrong with one field of a manifest entry.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("server names are 1-{MAX_NAME_LEN} characters of a-z, 0-9, '_' and '-'")]
    BadName,
    #[error("unclosed '${{' in {0:?}")]
    UnclosedVariable(String),
    #[error("unknown variable ${{{name}}}; known: {known}")]
    UnknownVariable { name: String, known: String },
    #[error("uses ${{install_dir}} but the manifest sets no install_dir")]
    NoInstallDir,
    #[error("must not be empty")]
    Empty,
    #[error("{0:?} must be an absolute path")]
    NotAbsolute(String),
    #[error("{0:?} must not contain '..'")]
    ParentDir(String),
    #[error("{0:?} is not a valid environment variable name")]
    BadEnvName(String),
    #[error("no such {kind} {name:?}")]
    NoSuch { kind: &'static str, name: String },
    #[error("looking up {kind} {name:?}: {source}")]
    Lookup {
        kind: &'static str,
        name: String,
        source: nix::Error,
    },
    #[error("is only meaningful with transport = \"http\"")]
    HttpTableWithoutHttp,
    #[error("transport = \"http\" needs http = {{ port = N, path = \"/mcp\" }}")]
    HttpWithoutTable,
    #[error("must be 1-65535")]
    BadPort,
    #[error("must start with '/'")]
    RelativeHttpPath,
    #[error("must be greater than 0")]
    Zero,
    #[error("must not be smaller than initial_backoff_ms")]
    BackoffOrder,
    #[error(
        "{} must be outside the workspace and not contain it (the workspace is cleared separately)",
        .0.display()
    )]
    StatePathOverlapsWorkspace(PathBuf),
    #[error("{} does not exist", .0.display())]
    SeedMissing(PathBuf),
    #[error(
        "{} must be the workspace or inside one of this server's state_paths",
        .0.display()
    )]
    SeedOutsideState(PathBuf),
    #[error("{0:?} must be a relative path inside the workspace ({1})")]
    BadWorkspaceDir(String, String),
    #[error("{0:?} is not a valid mail domain or local part")]
    BadMailName(String),
    #[error("must be {0}")]
    OutOfRange(String),
    #[error("mail = true needs the manifest's [mail] table (the mail service)")]
    NoMailService,
}

/// An [`EntryError`] and the field (`command`, `restart.window_ms`, …) it
/// is about.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {cause}")]
pub struct FieldError {
    pub field: String,
    pub cause: EntryError,
}

pub(super) fn field(f: &str, cause: EntryError) -> FieldError {
    FieldError {
        field: f.to_owned(),
        cause,
    }
}

/// `${…}` expansion with the known variables; anything else is an error.
pub(super) fn expand(s: &str, vars: &[(&str, &str)], f: &str) -> Result<String, FieldError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| field(f, EntryError::UnclosedVariable(s.to_owned())))?;
        let key = &after[..end];
        let val = vars
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let known: Vec<String> = vars.iter().map(|(k, _)| format!("${{{k}}}")).collect();
                field(
                    f,
                    EntryError::UnknownVariable {
                        name: key.to_owned(),
                        known: known.join(", "),
                    },
                )
            })?;
        out.push_str(val);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The variables a manifest string may use outside a server entry.
pub(super) fn file_vars(file: &ManifestFile, roots: &super::Roots) -> Vec<(&'static str, String)> {
    vec![
        ("workspace", roots.workspace.display().to_string()),
        (
            "data",
            roots.data.unwrap_or(roots.workspace).display().to_string(),
        ),
        ("state_root", roots.state_root.display().to_string()),
        ("install_dir", file.install_dir.clone().unwrap_or_default()),
    ]
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

pub(super) fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(super) fn abs_path(p: &str, f: &str) -> Result<PathBuf, FieldError> {
    let path = PathBuf::from(p);
    if !path.is_absolute() {
        return Err(field(f, EntryError::NotAbsolute(p.to_owned())));
    }
    if path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(field(f, EntryError::ParentDir(p.to_owned())));
    }
    Ok(path)
}

fn check_env(env: &BTreeMap<String, String>, f: &str) -> Result<(), FieldError> {
    for k in env.keys() {
        if !valid_env_name(k) {
            return Err(field(f, EntryError::BadEnvName(k.clone())));
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
        Ok(None) => Err(field(f, no_such("user", user))),
        Err(e) => Err(field(f, lookup("user", user, e))),
    }
}

fn resolve_group(group: &str, f: &str) -> Result<u32, FieldError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(field(f, no_such("group", group))),
        Err(e) => Err(field(f, lookup("group", group, e))),
    }
}

fn no_such(kind: &'static str, name: &str) -> EntryError {
    EntryError::NoSuch {
        kind,
        name: name.to_owned(),
    }
}

fn lookup(kind: &'static str, name: &str, source: nix::Error) -> EntryError {
    EntryError::Lookup {
        kind,
        name: name.to_owned(),
        source,
    }
}

/// Checks one `[servers.NAME]` entry and resolves it against the defaults:
/// variables expanded, users looked up, every limit and path checked.
/// Fields are checked in the file's order; the first problem is the error.
pub(super) fn check_entry(
    name: &str,
    e: &ServerFile,
    file: &ManifestFile,
    roots: &super::Roots,
) -> Result<ServerDef, FieldError> {
    if !valid_name(name) {
        return Err(field("name", EntryError::BadName));
    }
    let owned = file_vars(file, roots);
    let mut vars: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("name", name));
    let c = Entry {
        e,
        file,
        workspace: roots.workspace,
        vars: &vars,
    };
    let (command, args) = c.command()?;
    let env = c.env()?;
    let cwd = match &e.cwd {
        Some(d) => abs_path(&c.x(d, "cwd")?, "cwd")?,
        None => roots.workspace.to_owned(),
    };
    let (uid, gid) = c.ids()?;
    let transport = transport(e)?;
    let (ready_timeout, stop_grace) = c.timeouts()?;
    let restart = c.restart()?;
    let state_paths = c.state_paths()?;
    let limits = e.limits.or(&file.defaults.limits);
    let pass_env = c.env_names()?;
    let benchmarks = c.benchmarks(&state_paths)?;
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
        mail: e.mail,
        data_command: e
            .data_command
            .as_deref()
            .map(|d| c.x(d, "data_command"))
            .transpose()?,
        data_user: e.data_user,
        in_all: e.in_all.unwrap_or(true),
    })
}

/// One `[servers.NAME]` entry being checked, with the manifest's defaults
/// and the `${…}` variables its strings may use.
struct Entry<'a> {
    e: &'a ServerFile,
    file: &'a ManifestFile,
    workspace: &'a Path,
    vars: &'a [(&'a str, &'a str)],
}

impl Entry<'_> {
    /// `s` with its variables expanded (`f` names the field).
    fn x(&self, s: &str, f: &str) -> Result<String, FieldError> {
        expand(s, self.vars, f)
    }

    /// `command` and `args`.
    fn command(&self) -> Result<(String, Vec<String>), FieldError> {
        let e = self.e;
        let no_install_dir = self
            .file
            .install_dir
            .as_deref()
            .unwrap_or_default()
            .is_empty();
        if no_install_dir && e.command.contains("${install_dir}") {
            return Err(field("command", EntryError::NoInstallDir));
        }
        let command = self.x(&e.command, "command")?;
        if command.trim().is_empty() {
            return Err(field("command", EntryError::Empty));
        }
        let args = e
            .args
            .iter()
            .map(|a| self.x(a, "args"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((command, args))
    }

    /// `env`: the defaults', then the entry's.
    fn env(&self) -> Result<BTreeMap<String, String>, FieldError> {
        let mut env = BTreeMap::new();
        for (k, v) in self.file.defaults.env.iter().chain(self.e.env.iter()) {
            env.insert(k.clone(), self.x(v, "env")?);
        }
        check_env(&env, "env")?;
        Ok(env)
    }

    /// `user` and `group` (or the defaults'): uid and gid, looked up.
    fn ids(&self) -> Result<(Option<u32>, Option<u32>), FieldError> {
        let (e, d) = (self.e, &self.file.defaults);
        let (mut uid, mut gid) = (None, None);
        if let Some(u) = e.user.as_ref().or(d.user.as_ref()) {
            let (u, g) = resolve_user(u, "user")?;
            uid = Some(u);
            gid = Some(g);
        }
        if let Some(g) = e.group.as_ref().or(d.group.as_ref()) {
            gid = Some(resolve_group(g, "group")?);
        }
        Ok((uid, gid))
    }

    /// `ready_timeout_ms` and `stop_grace_ms`.
    fn timeouts(&self) -> Result<(Duration, Duration), FieldError> {
        let (e, d) = (self.e, &self.file.defaults);
        Ok((
            millis(
                e.ready_timeout_ms,
                d.ready_timeout_ms,
                60_000,
                "ready_timeout_ms",
            )?,
            millis(e.stop_grace_ms, d.stop_grace_ms, 5_000, "stop_grace_ms")?,
        ))
    }

    /// The `restart` table over the defaults'.
    fn restart(&self) -> Result<Restart, FieldError> {
        let r = &self.e.restart;
        let d = &self.file.defaults.restart;
        let restart = Restart {
            policy: r.policy.or(d.policy).unwrap_or(RestartPolicy::OnFailure),
            initial_backoff: millis(
                r.initial_backoff_ms,
                d.initial_backoff_ms,
                250,
                "restart.initial_backoff_ms",
            )?,
            max_backoff: millis(
                r.max_backoff_ms,
                d.max_backoff_ms,
                10_000,
                "restart.max_backoff_ms",
            )?,
            max_restarts: r.max_restarts.or(d.max_restarts).unwrap_or(5),
            window: millis(r.window_ms, d.window_ms, 60_000, "restart.window_ms")?,
        };
        if restart.max_backoff < restart.initial_backoff {
            return Err(field("restart.max_backoff_ms", EntryError::BackoffOrder));
        }
        Ok(restart)
    }

    /// `state_paths`: absolute, neither in the workspace nor containing it.
    fn state_paths(&self) -> Result<Vec<PathBuf>, FieldError> {
        let ws = self.workspace;
        let mut state_paths = Vec::new();
        for p in &self.e.state_paths {
            let path = abs_path(&self.x(p, "state_paths")?, "state_paths")?;
            if path.parent().is_none() || path.starts_with(ws) || ws.starts_with(&path) {
                return Err(field(
                    "state_paths",
                    EntryError::StatePathOverlapsWorkspace(path),
                ));
            }
            state_paths.push(path);
        }
        Ok(state_paths)
    }

    /// The variables a child may take from the agent's environment (only
    /// what the manifest lists: the defaults', the entry's); checks the
    /// names `requires` and `auth_env` use too.
    fn env_names(&self) -> Result<Vec<String>, FieldError> {
        let e = self.e;
        let mut pass_env: Vec<String> = self.file.defaults.pass_env.clone();
        pass_env.extend(e.pass_env.iter().cloned());
        let named = [
            ("pass_env", pass_env.iter().collect::<Vec<_>>()),
            ("requires", e.requires.iter().map(|r| &r.var).collect()),
            ("auth_env", e.auth_env.values().collect()),
        ];
        for (f, names) in named {
            if let Some(v) = names.into_iter().find(|v| !valid_env_name(v)) {
                return Err(field(f, EntryError::BadEnvName(v.clone())));
            }
        }
        Ok(pass_env)
    }

    /// The `[servers.NAME.benchmarks.*]` profiles.
    fn benchmarks(
        &self,
        state_paths: &[PathBuf],
    ) -> Result<BTreeMap<Benchmark, Override>, FieldError> {
        let mut benchmarks = BTreeMap::new();
        for (b, o) in &self.e.benchmarks {
            benchmarks.insert(*b, self.profile(b.as_str(), o, state_paths)?);
        }
        Ok(benchmarks)
    }

    /// One benchmark's profile (`bench`: its name in field names).
    fn profile(
        &self,
        bench: &str,
        o: &OverrideFile,
        state_paths: &[PathBuf],
    ) -> Result<Override, FieldError> {
        let f = |s: &str| format!("benchmarks.{bench}.{s}");
        let mut env = BTreeMap::new();
        for (k, v) in &o.env {
            env.insert(k.clone(), self.x(v, &f("env"))?);
        }
        check_env(&env, &f("env"))?;
        let seed = o
            .seed
            .iter()
            .map(|s| self.seed(s, &f, state_paths))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Override {
            command: o
                .command
                .as_deref()
                .map(|c| self.x(c, &f("command")))
                .transpose()?,
            args: o
                .args
                .as_ref()
                .map(|a| {
                    a.iter()
                        .map(|s| self.x(s, &f("args")))
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()?,
            cwd: o
                .cwd
                .as_deref()
                .map(|d| abs_path(&self.x(d, &f("cwd"))?, &f("cwd")))
                .transpose()?,
            env,
            seed,
            metadata: o.metadata.clone(),
            dirs: o
                .dirs
                .iter()
                .map(|d| workspace_dir(d, &f("dirs")))
                .collect::<Result<Vec<_>, _>>()?,
        })
    }

    /// One `seed` of a profile: `from` exists; `to` is the workspace or in
    /// one of the server's state paths.
    fn seed(
        &self,
        s: &SeedFile,
        f: &impl Fn(&str) -> String,
        state_paths: &[PathBuf],
    ) -> Result<Seed, FieldError> {
        let from = abs_path(&self.x(&s.from, &f("seed.from"))?, &f("seed.from"))?;
        if !from.exists() {
            return Err(field(&f("seed.from"), EntryError::SeedMissing(from)));
        }
        let Some(t) = &s.to else {
            return Ok(Seed { from, to: None });
        };
        let to = abs_path(&self.x(t, &f("seed.to"))?, &f("seed.to"))?;
        if to == self.workspace {
            Ok(Seed { from, to: None })
        } else if state_paths.iter().any(|sp| to.starts_with(sp)) {
            Ok(Seed { from, to: Some(to) })
        } else {
            Err(field(&f("seed.to"), EntryError::SeedOutsideState(to)))
        }
    }
}

/// `transport` and its `http` table.
fn transport(e: &ServerFile) -> Result<Transport, FieldError> {
    match (e.transport, &e.http) {
        (TransportKind::Stdio, None) => Ok(Transport::Stdio),
        (TransportKind::Stdio, Some(_)) => Err(field("http", EntryError::HttpTableWithoutHttp)),
        (TransportKind::Http, None) => Err(field("http", EntryError::HttpWithoutTable)),
        (TransportKind::Http, Some(h)) => {
            let path = h.path.clone().unwrap_or_else(|| "/mcp".into());
            if h.port == 0 {
                return Err(field("http.port", EntryError::BadPort));
            }
            if !path.starts_with('/') {
                return Err(field("http.path", EntryError::RelativeHttpPath));
            }
            Ok(Transport::Http { port: h.port, path })
        }
    }
}

/// A duration in ms: the entry's, else the defaults', else `dflt`; never 0.
fn millis(v: Option<u64>, d: Option<u64>, dflt: u64, f: &str) -> Result<Duration, FieldError> {
    let v = v.or(d).unwrap_or(dflt);
    if v == 0 {
        return Err(field(f, EntryError::Zero));
    }
    Ok(Duration::from_millis(v))
}

/// A profile's workspace directory: relative, inside, not the workspace.
fn workspace_dir(d: &str, f: &str) -> Result<PathBuf, FieldError> {
    let comps = sandbox_archive::confine::normalize(Path::new(d))
        .map_err(|r| field(f, EntryError::BadWorkspaceDir(d.to_owned(), r.to_string())))?;
    if comps.is_empty() {
        return Err(field(
            f,
            EntryError::BadWorkspaceDir(d.to_owned(), "it names the workspace itself".into()),
        ));
    }
    Ok(comps.iter().collect::<PathBuf>())
}
