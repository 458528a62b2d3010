//! One run of an execution, in the background: wait for a slot, install
//! `packages.txt`, make the venv (a copy of the agent's base venv, see
//! [`super::venv`]), install `requirements.txt`, run `python main.py`.
//! Every step but the venv's copy is a supervisor job whose output goes to
//! the execution's log; a stop (cancel, release, timeout) kills the step's
//! whole tree.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::log::ExecLog;
use super::venv;
use super::{ExecConfig, ExecState, Execution, McpAccess, PACKAGES, REQUIREMENTS};
use crate::supervisor::Supervisor;
use crate::supervisor::job::{JobEnd, JobGroup, JobSpec, RunAs};
use crate::supervisor::manifest::ResourceLimits;
use crate::supervisor::now_ms;
use crate::supervisor::spawn::Exit;

/// PATH when the agent has none (as PID 1).
pub(super) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long the log pump may run on after a step's tree is gone (a
/// process outside the tree could hold the pipe open).
const PUMP_DRAIN: Duration = Duration::from_secs(2);

pub(super) struct RunCtx {
    pub cfg: ExecConfig,
    pub sup: Arc<Supervisor>,
    pub workspace: PathBuf,
    /// The data plane's address and the lease's token.
    pub mcp: Option<(McpAccess, String)>,
    pub servers: Vec<String>,
    pub slots: Arc<Semaphore>,
    pub prep: Arc<super::Prep>,
}

/// Why a run ended early.
enum Halt {
    /// Cancelled or released: the message says which.
    Stopped(String),
    /// A step failed.
    Failed(String),
}

pub(super) async fn run(
    ctx: RunCtx,
    exec: Arc<Execution>,
    log: Arc<ExecLog>,
    stop: CancellationToken,
) {
    // The timeout is a stop of its own, told apart by `timed_out`.
    let deadline = stop.child_token();
    let timeout = Duration::from_millis(ctx.cfg.timeout_ms);
    let timer = {
        let d = deadline.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            d.cancel();
        })
    };
    let r = steps(&ctx, &exec, &log, &deadline).await;
    timer.abort();
    let timed_out = deadline.is_cancelled() && !stop.is_cancelled();
    let (state, message, exit) = match r {
        Ok(exit) if exit == Exit::Code(0) => (ExecState::Completed, String::new(), Some(exit)),
        Ok(exit) => (
            ExecState::Failed,
            format!("{} ended with {exit}", super::MAIN_SCRIPT),
            Some(exit),
        ),
        Err(Halt::Stopped(_)) if timed_out => (
            ExecState::Failed,
            format!(
                "timed out after {} s (exec.timeout_ms); killed",
                timeout.as_secs()
            ),
            None,
        ),
        Err(Halt::Stopped(m)) | Err(Halt::Failed(m)) => (ExecState::Failed, m, None),
    };
    let line = match state {
        ExecState::Completed => {
            format!("[sandbox-agent] {} exited with code 0", super::MAIN_SCRIPT)
        }
        _ => format!("[sandbox-agent] failed: {message}"),
    };
    log.note(&line);
    tracing::info!(state = state.klavis(), %message, "execution ended");
    // The end state first, then the log's end: a reader that finds the log
    // closed also finds the end state.
    exec.set(|p| {
        p.state = state;
        p.message = message;
        p.finished_at_ms = now_ms();
        match exit {
            Some(Exit::Code(c)) => p.exit_code = Some(c),
            Some(Exit::Signal(s)) => p.signal = Some(s),
            None => {}
        }
    });
    log.close();
}

/// What every step of one run shares.
struct Steps<'a> {
    ctx: &'a RunCtx,
    exec: &'a Execution,
    log: &'a Arc<ExecLog>,
    stop: &'a CancellationToken,
    env: BTreeMap<String, String>,
    work: PathBuf,
}

async fn steps(
    ctx: &RunCtx,
    exec: &Execution,
    log: &Arc<ExecLog>,
    stop: &CancellationToken,
) -> Result<Exit, Halt> {
    let _slot = tokio::select! {
        p = ctx.slots.clone().acquire_owned() => p.map_err(|_| Halt::Failed("the agent is shutting down".into()))?,
        _ = stop.cancelled() => return Err(Halt::Stopped("cancelled while queued".into())),
    };
    let venv = exec.dir.join("venv");
    let s = Steps {
        ctx,
        exec,
        log,
        stop,
        env: environment(ctx, exec, &venv),
        work: exec.work(),
    };
    exec.set(|p| {
        p.state = ExecState::Installing;
        p.message = String::new();
    });

    // packages.txt
    let packages = read_list(&s.work.join(PACKAGES)).map_err(Halt::Failed)?;
    if !packages.is_empty() {
        exec.set(|p| p.message = format!("installing {PACKAGES}"));
        install_packages(&s, &packages).await?;
    }

    let python = s.python_env(&venv).await?;

    exec.set(|p| {
        p.state = ExecState::Running;
        p.message = String::new();
    });
    s.run("main", python, vec![super::MAIN_SCRIPT.into()]).await
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

impl Steps<'_> {
    /// The venv, with requirements.txt installed in it (by uv when there is
    /// one, else by pip); its python. The venv is a copy of the agent's
    /// base venv when there is one, else made by `python -m venv`.
    async fn python_env(&self, venv: &Path) -> Result<String, Halt> {
        let cfg = &self.ctx.cfg;
        self.exec
            .set(|p| p.message = "creating the Python environment".into());
        let prep = self.ctx.prep.get(cfg, &self.ctx.sup).await;
        let uv = prep.uv.as_deref();
        let requirements = self.work.join(REQUIREMENTS);
        let has_requirements = std::fs::metadata(&requirements).is_ok_and(|m| m.len() > 0);
        match &prep.base {
            Some(base) => {
                let (base, dir) = (base.clone(), self.exec.dir.clone());
                let owner = self.ctx.sup.tenant().uid().zip(self.ctx.sup.tenant().gid());
                let name = venv.file_name().unwrap_or_default().to_owned();
                tokio::task::spawn_blocking(move || venv::clone_base(&base, &dir, &name, owner))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map_err(|e| {
                        Halt::Failed(format!("creating the Python environment failed: {e}"))
                    })?;
            }
            None => {
                let (cmd, args) = venv_command(&prep.python, uv, venv, has_requirements);
                self.must("venv", cmd, args, "creating the Python environment")
                    .await?;
            }
        }
        let python = venv.join("bin/python").display().to_string();
        if has_requirements {
            self.exec
                .set(|p| p.message = format!("installing {REQUIREMENTS}"));
            self.log.note(&format!(
                "[sandbox-agent] installing {REQUIREMENTS} with {}",
                if uv.is_some() { "uv" } else { "pip" }
            ));
            let (cmd, args) = requirements_command(uv, &python, &requirements);
            self.must(
                "requirements",
                cmd,
                args,
                &format!("installing {REQUIREMENTS}"),
            )
            .await?;
        }
        Ok(python)
    }
}

/// The command making the venv: `uv venv`, else `python -m venv` (without
/// pip when nothing is to be installed).
fn venv_command(
    python: &str,
    uv: Option<&str>,
    venv: &Path,
    has_requirements: bool,
) -> (String, Vec<String>) {
    let venv_s = venv.display().to_string();
    match uv {
        Some(uv) => (
            uv.to_owned(),
            strings(&["venv", "--quiet", "--clear", "--python", python, &venv_s]),
        ),
        None => {
            let mut a = strings(&["-m", "venv", "--clear"]);
            if !has_requirements {
                a.push("--without-pip".into());
            }
            a.push(venv_s);
            (python.to_owned(), a)
        }
    }
}

/// The command installing requirements.txt into the venv of `python`.
fn requirements_command(uv: Option<&str>, python: &str, req: &Path) -> (String, Vec<String>) {
    let req = req.display().to_string();
    match uv {
        Some(uv) => (
            uv.to_owned(),
            strings(&["pip", "install", "--python", python, "-r", &req]),
        ),
        None => (
            python.to_owned(),
            strings(&[
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                &req,
            ]),
        ),
    }
}

impl Steps<'_> {
    /// Runs one step as a job in the execution directory, its output into
    /// the log; the exit status.
    async fn run(&self, step: &str, command: String, args: Vec<String>) -> Result<Exit, Halt> {
        if self.stop.is_cancelled() {
            return Err(Halt::Stopped("cancelled".into()));
        }
        // Installing packages.txt is the agent's own step (as root, in a
        // VM): nothing of it is the tenant's, neither its environment (its
        // PATH starts with the tenant's venv) nor its directory. Every
        // other step runs as the tenant.
        let (env, cwd, run_as) = if step == APT_STEP {
            (apt_env(&self.ctx.cfg), PathBuf::from("/"), RunAs::Agent)
        } else {
            (self.env.clone(), self.work.clone(), RunAs::Tenant)
        };
        let spec = JobSpec {
            group: JobGroup::Exec(self.exec.name.clone()),
            command: command.clone(),
            args,
            env,
            cwd,
            limits: ResourceLimits::default(),
            run_as,
        };
        let mut job = self.ctx.sup.spawn_job(&spec).await.map_err(|e| {
            Halt::Failed(format!(
                "cannot start {command:?} ({step}): {e}; is it installed in the sandbox?"
            ))
        })?;
        tracing::debug!(step, pid = job.pid(), "step started");
        let pump = job
            .take_output()
            .map(|fd| tokio::spawn(pump(fd, self.log.clone())));
        let end = job.wait(self.stop, self.ctx.cfg.grace()).await;
        if let Some(mut p) = pump
            && tokio::time::timeout(PUMP_DRAIN, &mut p).await.is_err()
        {
            p.abort();
        }
        match end {
            JobEnd::Exited(e) => Ok(e),
            JobEnd::Stopped(_) => Err(Halt::Stopped("cancelled; its processes were killed".into())),
        }
    }

    /// [`Steps::run`], where anything but exit code 0 fails the run
    /// (`what` failed).
    async fn must(
        &self,
        step: &str,
        command: String,
        args: Vec<String>,
        what: &str,
    ) -> Result<(), Halt> {
        match self.run(step, command, args).await? {
            Exit::Code(0) => Ok(()),
            e => Err(Halt::Failed(format!("{what} failed ({e})"))),
        }
    }
}

/// Copies a step's output into the log until the pipe closes.
async fn pump(fd: OwnedFd, log: Arc<ExecLog>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Err(e) = log.append(&buf[..n]) {
                    tracing::warn!(error = %e, "writing the execution log");
                }
            }
        }
    }
}

/// The environment every step sees.
fn environment(ctx: &RunCtx, exec: &Execution, venv: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for k in &ctx.cfg.pass_env {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.clone(), v);
        }
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
    env.insert(
        "PATH".into(),
        format!("{}:{path}", venv.join("bin").display()),
    );
    // HOME, TMPDIR and the XDG directories: the lease's (JobSpec::tenant).
    env.insert("LANG".into(), "C.UTF-8".into());
    // Unbuffered: stdout and stderr reach the log in the order written.
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    env.insert("PYTHONIOENCODING".into(), "utf-8".into());
    env.insert("VIRTUAL_ENV".into(), venv.display().to_string());
    env.insert("UV_PYTHON_DOWNLOADS".into(), "never".into());
    env.insert("DEBIAN_FRONTEND".into(), "noninteractive".into());
    env.insert(
        "AGENT_WORKSPACE".into(),
        ctx.workspace.display().to_string(),
    );
    env.insert("SANDBOX_EXECUTION_NAME".into(), exec.name.clone());
    env.insert(
        "SANDBOX_EXECUTION_DIR".into(),
        exec.work().display().to_string(),
    );
    env.insert("SANDBOX_MCP_SERVERS".into(), ctx.servers.join(","));
    if let Some((m, token)) = &ctx.mcp {
        env.insert("SANDBOX_MCP_URL".into(), m.base_url.clone());
        env.insert("SANDBOX_MCP_TOKEN".into(), token.clone());
        for s in &ctx.servers {
            env.insert(
                format!("SANDBOX_MCP_URL_{}", env_key(s)),
                format!("{}/{s}/mcp", m.base_url),
            );
        }
    }
    for (k, v) in &ctx.cfg.env {
        env.insert(k.clone(), v.clone());
    }
    env
}

/// `desktop-commander` → `DESKTOP_COMMANDER`.
pub fn env_key(server: &str) -> String {
    server
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// `uv` to use: the configured path, the one on `path` ("auto"), or none.
pub(super) fn find_uv(setting: &str, path: &str) -> Option<String> {
    match setting {
        "off" => None,
        "auto" => which("uv", path),
        path => Some(path.to_owned()),
    }
}

fn which(name: &str, path: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
}

/// The non-empty, non-comment lines of a list file (absent: none).
fn read_list(path: &Path) -> Result<Vec<String>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        for word in l.split_whitespace() {
            if !valid_package(word) {
                return Err(format!(
                    "{PACKAGES}: {word:?} is not a Debian package name (lowercase letters, digits, + - . ; starting with a letter or digit)"
                ));
            }
            out.push(word.to_owned());
        }
    }
    Ok(out)
}

/// Debian policy §5.6.1: `[a-z0-9][a-z0-9+.-]+` (so never an option).
fn valid_package(p: &str) -> bool {
    p.len() >= 2
        && p.as_bytes()[0].is_ascii_alphanumeric()
        && p.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        })
}

/// apt-get's environment: the system's PATH, and what the operator passes
/// to executions from the agent's own environment (exec.pass_env: proxies).
fn apt_env(cfg: &ExecConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = cfg
        .pass_env
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
        .collect();
    env.insert("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into());
    env.insert("DEBIAN_FRONTEND".into(), "noninteractive".into());
    env.insert("LANG".into(), "C.UTF-8".into());
    env
}

/// The step that installs packages.txt: the only one run as the agent.
const APT_STEP: &str = "apt";
/// dpkg's database: writable where packages can be installed.
const DPKG_DIR: &str = "/var/lib/dpkg";

async fn install_packages(s: &Steps<'_>, packages: &[String]) -> Result<(), Halt> {
    let status = tokio::fs::read_to_string(DPKG_STATUS)
        .await
        .unwrap_or_default();
    let installed = installed_packages(&status);
    let missing: Vec<String> = packages
        .iter()
        .filter(|p| !installed.contains(p.as_str()))
        .cloned()
        .collect();
    if missing.is_empty() {
        s.log.note(&format!(
            "[sandbox-agent] {PACKAGES}: already installed: {}",
            packages.join(" ")
        ));
        return Ok(());
    }
    let why_not = if s.ctx.cfg.packages == "off" {
        Some("exec.packages is \"off\" in this sandbox".to_owned())
    } else if !rustix::process::geteuid().is_root() {
        Some("the agent does not run as root".to_owned())
    } else if !s.ctx.cfg.apt_get.is_file() {
        Some(format!(
            "there is no {} in this sandbox",
            s.ctx.cfg.apt_get.display()
        ))
    } else if rustix::fs::access(DPKG_DIR, rustix::fs::Access::WRITE_OK).is_err() {
        // The process backend shows the host's system read-only: a tenant
        // never changes the host.
        Some(format!(
            "its system directories ({DPKG_DIR}) are read-only; only packages already installed can be listed"
        ))
    } else {
        None
    };
    if let Some(why) = why_not {
        return Err(Halt::Failed(format!(
            "{PACKAGES} asks for {} (not installed), but this sandbox cannot install Debian packages: {why}",
            missing.join(" ")
        )));
    }
    s.log.note(&format!(
        "[sandbox-agent] installing Debian packages: {}",
        missing.join(" ")
    ));
    let mut install = strings(&["install", "-y", "-q", "--no-install-recommends", "--"]);
    install.extend(missing.iter().cloned());
    // By absolute path, with the agent's own environment (Steps::run gives
    // this step no part of the execution's): the execution's PATH starts
    // with its venv, which the tenant writes.
    let apt = || s.ctx.cfg.apt_get.display().to_string();
    if s.run(APT_STEP, apt(), install.clone()).await? == Exit::Code(0) {
        return Ok(());
    }
    // A fresh image has no package lists yet: update once, then retry.
    s.log
        .note("[sandbox-agent] apt-get install failed; running apt-get update and retrying");
    s.must(
        APT_STEP,
        apt(),
        strings(&["update", "-q"]),
        "apt-get update",
    )
    .await?;
    s.must(APT_STEP, apt(), install, &format!("installing {PACKAGES}"))
        .await
}

/// dpkg's database of installed packages.
const DPKG_STATUS: &str = "/var/lib/dpkg/status";

/// The packages dpkg's status file lists as installed. (Read directly: a
/// `dpkg-query` child would race the agent's reaper for its exit status.)
fn installed_packages(status: &str) -> std::collections::HashSet<&str> {
    let mut out = std::collections::HashSet::new();
    for para in status.split("\n\n") {
        let mut name = None;
        let mut installed = false;
        for line in para.lines() {
            if let Some(n) = line.strip_prefix("Package: ") {
                name = Some(n.trim());
            } else if let Some(st) = line.strip_prefix("Status: ") {
                installed = st.trim_end().ends_with(" installed");
            }
        }
        if let (Some(n), true) = (name, installed) {
            out.insert(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_follow_debian_policy() {
        for ok in ["curl", "jq", "libc6", "g++", "python3.11", "lib32z1-dev"] {
            assert!(valid_package(ok), "{ok}");
        }
        for bad in [
            "-o",
            "--allow-unauthenticated",
            "Curl",
            "a",
            "x;rm",
            "c url",
        ] {
            assert!(!valid_package(bad), "{bad}");
        }
    }

    #[test]
    fn installed_means_the_status_says_so() {
        let st = "Package: curl\nStatus: install ok installed\nVersion: 1\n\nPackage: jq\nStatus: deinstall ok config-files\n\nPackage: git\nArchitecture: amd64\nStatus: install ok installed\n";
        let i = installed_packages(st);
        assert!(i.contains("curl") && i.contains("git") && !i.contains("jq"));
    }

    #[test]
    fn server_names_become_variable_names() {
        assert_eq!(env_key("desktop-commander"), "DESKTOP_COMMANDER");
        assert_eq!(env_key("google_cloud"), "GOOGLE_CLOUD");
    }
}
