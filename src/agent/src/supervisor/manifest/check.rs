//! Checking a manifest entry: `${…}` expansion, names, paths, users,
//! transports, timings and profiles. Every problem is an [`EntryError`]
//! naming its field.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::schema::{ManifestFile, RestartPolicy, ServerFile, TransportKind};
use super::{Override, Restart, Seed, ServerDef, Transport};

/// Environment variables a child gets from the agent's own environment when
/// neither the manifest nor the lease sets them.
const BASE_PASS_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"];

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
pub(super) fn check_entry(
    name: &str,
    e: &ServerFile,
    file: &ManifestFile,
    roots: &super::Roots,
) -> Result<ServerDef, FieldError> {
    if !valid_name(name) {
        return Err(field("name", EntryError::BadName));
    }
    let workspace = roots.workspace;
    let ws = workspace.display().to_string();
    let state_root = roots.state_root.display().to_string();
    let install = file.install_dir.clone().unwrap_or_default();
    let data = roots.data.unwrap_or(workspace).display().to_string();
    let vars = [
        ("workspace", ws.as_str()),
        ("data", data.as_str()),
        ("state_root", state_root.as_str()),
        ("install_dir", install.as_str()),
        ("name", name),
    ];
    if install.is_empty() && e.command.contains("${install_dir}") {
        return Err(field("command", EntryError::NoInstallDir));
    }
    let x = |s: &str, f: &str| expand(s, &vars, f);
    let command = x(&e.command, "command")?;
    if command.trim().is_empty() {
        return Err(field("command", EntryError::Empty));
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
            return Err(field("http", EntryError::HttpTableWithoutHttp));
        }
        (TransportKind::Http, None) => {
            return Err(field("http", EntryError::HttpWithoutTable));
        }
        (TransportKind::Http, Some(h)) => {
            let path = h.path.clone().unwrap_or_else(|| "/mcp".into());
            if h.port == 0 {
                return Err(field("http.port", EntryError::BadPort));
            }
            if !path.starts_with('/') {
                return Err(field("http.path", EntryError::RelativeHttpPath));
            }
            Transport::Http { port: h.port, path }
        }
    };
    let ms = |v: Option<u64>, d: Option<u64>, dflt: u64, f: &str| -> Result<Duration, FieldError> {
        let v = v.or(d).unwrap_or(dflt);
        if v == 0 {
            return Err(field(f, EntryError::Zero));
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
        return Err(field("restart.max_backoff_ms", EntryError::BackoffOrder));
    }
    let mut state_paths = Vec::new();
    for p in &e.state_paths {
        let path = abs_path(&x(p, "state_paths")?, "state_paths")?;
        if path.parent().is_none() || path.starts_with(workspace) || workspace.starts_with(&path) {
            return Err(field(
                "state_paths",
                EntryError::StatePathOverlapsWorkspace(path),
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
            return Err(field("pass_env", EntryError::BadEnvName(v.clone())));
        }
    }
    for r in &e.requires {
        if !valid_env_name(&r.var) {
            return Err(field("requires", EntryError::BadEnvName(r.var.clone())));
        }
    }
    for v in e.auth_env.values() {
        if !valid_env_name(v) {
            return Err(field("auth_env", EntryError::BadEnvName(v.clone())));
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
                return Err(field(&f("seed.from"), EntryError::SeedMissing(from)));
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
                        return Err(field(&f("seed.to"), EntryError::SeedOutsideState(to)));
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
                metadata: o.metadata.clone(),
                dirs: o
                    .dirs
                    .iter()
                    .map(|d| {
                        let comps = sandbox_archive::confine::normalize(std::path::Path::new(d))
                            .map_err(|r| {
                                field(
                                    &f("dirs"),
                                    EntryError::BadWorkspaceDir(d.clone(), r.to_string()),
                                )
                            })?;
                        if comps.is_empty() {
                            return Err(field(
                                &f("dirs"),
                                EntryError::BadWorkspaceDir(
                                    d.clone(),
                                    "it names the workspace itself".into(),
                                ),
                            ));
                        }
                        Ok(comps.iter().collect::<PathBuf>())
                    })
                    .collect::<Result<Vec<_>, _>>()?,
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
        mail: e.mail,
        data_command: e
            .data_command
            .as_deref()
            .map(|c| x(c, "data_command"))
            .transpose()?,
    })
}
