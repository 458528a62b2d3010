//! One-shot processes that are not MCP servers (script executions): the
//! same fork ([`super::spawn::Spawner`]), reaping ([`super::spawn::Reaper`]),
//! cgroup and process-tree kill as servers, without restarts or readiness.
//!
//! A [`Job`] owns its process tree: [`Job::wait`] ends when the main
//! process exits *and* whatever it left running has been killed, so
//! nothing a job started outlives it; dropping a `Job` kills the tree too.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::cgroup::Cgroup;
use super::manifest::ResourceLimits;
use super::runner::kill_tree;
use super::spawn::{self, Exit, Launch};
use super::{Shared, Supervisor};

/// The cgroup name space of a job. The agent's own jobs (`job.<name>`)
/// and a tenant's executions (`exec.<name>`) are apart, and server groups
/// have no dot (manifest names are `[a-z0-9_-]`), so no execution name
/// can take a server's or a service's group: creating a group empties a
/// leftover one of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobGroup {
    /// The agent's own jobs: the mail service (`mail`), data tools
    /// (`server-data`).
    Service(&'static str),
    /// A tenant's execution, by its name.
    Exec(String),
}

impl JobGroup {
    /// The job's cgroup (below the agent's).
    pub fn cgroup_name(&self) -> String {
        match self {
            JobGroup::Service(n) => format!("job.{n}"),
            JobGroup::Exec(n) => format!("exec.{n}"),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Names the job's cgroup.
    pub group: JobGroup,
    pub command: String,
    pub args: Vec<String>,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub limits: ResourceLimits,
    /// Whose process it is.
    pub run_as: RunAs,
}

/// Who a job runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAs {
    /// The agent itself: the mail service and its data tool (they keep the
    /// lease's account in the agent's own files), packages.txt's install.
    Agent,
    /// The tenant, with its per-lease home: executions.
    Tenant,
    /// The agent's unprivileged service user, neither root nor the tenant:
    /// data tools of outside services, which keep the lease's ledger where
    /// the tenant cannot change it (nor trace them, another uid).
    Service,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// The main process exited by itself.
    Exited(Exit),
    /// The stop token was cancelled first; the tree was killed.
    Stopped(Exit),
}

/// A running job. Its combined stdout+stderr is [`Job::take_output`].
pub struct Job {
    pid: i32,
    cg: Option<Arc<Cgroup>>,
    exit: oneshot::Receiver<Exit>,
    output: Option<OwnedFd>,
    done: bool,
}

impl Supervisor {
    /// Starts `spec` in its own session (and cgroup when the agent has
    /// them), with stdin from /dev/null and stdout+stderr on one pipe.
    pub async fn spawn_job(&self, spec: &JobSpec) -> std::io::Result<Job> {
        spawn_job(&self.shared, spec).await
    }
}

async fn spawn_job(shared: &Shared, spec: &JobSpec) -> std::io::Result<Job> {
    let cg = shared
        .cgroups
        .as_ref()
        .and_then(|root| match root.create(&spec.group.cgroup_name()) {
            Ok(cg) => Some(Arc::new(cg)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot create the job's cgroup; using its session only");
                None
            }
        });
    if let (Some(cg), Some(mem)) = (&cg, spec.limits.memory_bytes)
        && shared.cgroups.as_ref().is_some_and(|r| r.memory_limits())
        && let Err(e) = cg.set_memory_max(mem)
    {
        tracing::warn!(error = %e, "cannot set the job's memory.max");
    }
    let procs = cg.as_ref().and_then(|c| c.procs_fd().ok());
    let (mut uid, mut gid, mut env) = (None, None, std::borrow::Cow::Borrowed(&spec.env));
    match spec.run_as {
        RunAs::Agent => {}
        RunAs::Tenant => shared.tenant.apply(&mut uid, &mut gid, env.to_mut()),
        RunAs::Service => {
            if let Some((u, g)) = shared.tenant.service() {
                (uid, gid) = (Some(u), Some(g));
            }
            // Nothing of the tenant's home: the job's own directory.
            let here = spec.cwd.display().to_string();
            let env = env.to_mut();
            for k in ["HOME", "TMPDIR"] {
                env.insert(k.into(), here.clone());
            }
        }
    }
    let launch = Launch {
        command: &spec.command,
        args: &spec.args,
        env: &env,
        cwd: &spec.cwd,
        uid,
        gid,
        limits: &spec.limits,
        io: spawn::Io::Combined,
    };
    match shared.spawner.spawn_combined(&launch, procs).await {
        Ok(s) => Ok(Job {
            pid: s.pid,
            cg,
            exit: s.exit,
            output: Some(s.output),
            done: false,
        }),
        Err(e) => {
            if let Some(cg) = &cg {
                cg.remove();
            }
            Err(e)
        }
    }
}

impl Job {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The read end of the job's stdout+stderr pipe (once).
    pub fn take_output(&mut self) -> Option<OwnedFd> {
        self.output.take()
    }

    /// Waits for the main process to exit, or for `stop`; either way the
    /// whole tree is gone when this returns (SIGTERM, then SIGKILL after
    /// `grace`, for a stop; SIGKILL at once for what an exited main process
    /// left behind).
    pub async fn wait(&mut self, stop: &CancellationToken, grace: Duration) -> JobEnd {
        let end = tokio::select! {
            e = &mut self.exit => {
                let exit = e.unwrap_or(Exit::Signal(0));
                let _ = kill_tree(self.pid, self.cg.as_deref(), Duration::ZERO, Some(exit), &mut self.exit).await;
                JobEnd::Exited(exit)
            }
            _ = stop.cancelled() => {
                JobEnd::Stopped(kill_tree(self.pid, self.cg.as_deref(), grace, None, &mut self.exit).await)
            }
        };
        self.done = true;
        if let Some(cg) = &self.cg {
            cg.remove();
        }
        end
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped while running (its task was aborted): kill the tree now;
        // the reaper collects the exits.
        let members = spawn::members(self.pid, self.cg.as_deref());
        if let Some(cg) = &self.cg {
            cg.kill();
        }
        spawn::signal_all(self.pid, &members, nix::sys::signal::Signal::SIGKILL);
    }
}
