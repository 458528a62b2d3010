//! One run of an execution, in the background: wait for a slot, install
//! `packages.txt`, make the venv (a copy of the agent's base venv, see
//! [`super::venv`]), install `requirements.txt`, run `python main.py`.
//! Every step but the venv's copy is a supervisor job whose output goes to
//! the execution's log; a stop (cancel, release, timeout) kills the step's
//! whole tree.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
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

mod packages;

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

    // packages.txt: read as the agent, by handle, a regular file only.
    let work = exec.open_work().map_err(|e| Halt::Failed(e.to_string()))?;
    let packages =
        packages::read_list(work.as_fd(), ctx.cfg.max_packages_bytes).map_err(Halt::Failed)?;
    drop(work);
    if !packages.is_empty() {
        exec.set(|p| p.message = format!("installing {PACKAGES}"));
        packages::install(&s, &packages).await?;
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
        // Installed by the tenant (it may read any file it can); the agent
        // only asks whether there is one, by handle, a regular file only.
        let work = self
            .exec
            .open_work()
            .map_err(|e| Halt::Failed(e.to_string()))?;
        let has_requirements =
            crate::tenant_file::regular_size(work.as_fd(), Path::new(REQUIREMENTS))
                .map_err(|e| Halt::Failed(e.to_string()))?
                .is_some_and(|n| n > 0);
        drop(work);
        // The execution directory is the agent's: the venv's own directory
        // is made here (a copy of the base venv, else empty) for the tenant.
        let (dir, base) = (self.exec.dir.clone(), prep.base.clone());
        let owner = self.ctx.sup.tenant().uid().zip(self.ctx.sup.tenant().gid());
        let name = venv.file_name().unwrap_or_default().to_owned();
        tokio::task::spawn_blocking(move || match &base {
            Some(base) => venv::clone_base(base, &dir, &name, owner),
            None => venv::empty_dir(&dir, &name, owner),
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| Halt::Failed(format!("creating the Python environment failed: {e}")))?;
        if prep.base.is_none() {
            let (cmd, args) = venv_command(&prep.python, uv, venv, has_requirements);
            self.must("venv", cmd, args, "creating the Python environment")
                .await?;
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

/// The command making the venv in its (empty) directory: `uv venv`, else
/// `python -m venv` (without pip when nothing is to be installed).
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
            strings(&["venv", "--quiet", "--python", python, &venv_s]),
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
        let (env, cwd, run_as) = if step == packages::APT_STEP {
            (
                packages::apt_env(&self.ctx.cfg),
                PathBuf::from("/"),
                RunAs::Agent,
            )
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
    // The sandbox's base, never the agent's PATH or user; of the agent's
    // environment only what exec.pass_env lists.
    let mut env = crate::tenant::env::base();
    for k in &ctx.cfg.pass_env {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.clone(), v);
        }
    }
    let path = crate::tenant::env::PATH;
    env.insert(
        "PATH".into(),
        format!("{}:{path}", venv.join("bin").display()),
    );
    // HOME, TMPDIR and the XDG directories: the lease's (JobSpec::tenant).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_become_variable_names() {
        assert_eq!(env_key("desktop-commander"), "DESKTOP_COMMANDER");
        assert_eq!(env_key("google_cloud"), "GOOGLE_CLOUD");
    }
}
