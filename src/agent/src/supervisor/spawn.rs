//! Starting server processes and collecting their exits.
//!
//! - [`Reaper`] is the only caller of `waitpid` in the agent. It reaps every
//!   child (servers, and orphans re-parented to the agent, which is a child
//!   subreaper and may be PID 1) and hands each server's exit status to the
//!   one future waiting for it. A pid is registered while the reaper's lock
//!   is held across the fork, so an exit can never be reaped before its
//!   waiter exists.
//! - [`Spawner`] forks from one long-lived thread: `PR_SET_PDEATHSIG` fires
//!   when the *thread* that forked the child exits, so forking from a
//!   short-lived blocking-pool thread would kill servers at random.
//! - In the child, before exec: a new session (so its signals never reach
//!   the agent), the death signal, rlimits, and joining its cgroup.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::sync::oneshot;

use super::manifest::{LaunchSpec, ResourceLimits};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match Signal::try_from(*s) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
        }
    }
}

/// Owns `waitpid` for the whole process.
pub struct Reaper {
    waiters: Mutex<HashMap<i32, oneshot::Sender<Exit>>>,
    orphans: std::sync::atomic::AtomicU64,
}

impl Reaper {
    /// Starts reaping on SIGCHLD (and once a second, in case a signal is
    /// coalesced away). Makes the agent a child subreaper so orphaned
    /// grandchildren come back to it instead of lingering elsewhere.
    pub fn start() -> io::Result<Arc<Reaper>> {
        if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
            tracing::warn!(error = %e, "cannot become a child subreaper; orphaned server processes re-parent to init");
        }
        let reaper = Arc::new(Reaper {
            waiters: Mutex::new(HashMap::new()),
            orphans: 0.into(),
        });
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let r = reaper.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tick.tick() => {}
                }
                r.reap();
            }
        });
        Ok(reaper)
    }

    /// Orphans (not servers) reaped so far.
    pub fn orphans_reaped(&self) -> u64 {
        self.orphans.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn reap(&self) {
        loop {
            // Held across waitpid: the spawner holds it across a fork, and
            // a child whose exec failed is reaped by `Command::spawn` itself
            // (which panics if another waitpid took it first).
            let mut waiters = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let (pid, exit) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Exit::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => return,
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    return;
                }
            };
            let waiter = waiters.remove(&pid.as_raw());
            drop(waiters);
            match waiter {
                Some(tx) => {
                    let _ = tx.send(exit);
                }
                None => {
                    self.orphans
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(pid = pid.as_raw(), %exit, "reaped an orphan");
                }
            }
        }
    }
}

/// A started server process.
pub struct Spawned {
    pub pid: i32,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// Resolves with the exit status once the reaper collects it.
    pub exit: oneshot::Receiver<Exit>,
}

/// One fork for the spawner thread: the command, and where the child and
/// its exit receiver go.
struct Fork {
    cmd: Command,
    reply: oneshot::Sender<io::Result<(std::process::Child, oneshot::Receiver<Exit>)>>,
}

/// How a child's standard streams are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// stdin, stdout and stderr are three pipes (servers).
    Piped,
    /// stdin is /dev/null; stdout and stderr share one pipe, so the parent
    /// reads them interleaved as written (executions).
    Combined,
}

/// What to run: everything of a [`LaunchSpec`] the fork needs.
pub struct Launch<'a> {
    pub command: &'a str,
    pub args: &'a [String],
    /// The complete environment (the child's is cleared first).
    pub env: &'a std::collections::BTreeMap<String, String>,
    pub cwd: &'a std::path::Path,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub limits: &'a ResourceLimits,
    pub io: Io,
}

impl<'a> From<&'a LaunchSpec> for Launch<'a> {
    fn from(s: &'a LaunchSpec) -> Launch<'a> {
        Launch {
            command: &s.command,
            args: &s.args,
            env: &s.env,
            cwd: &s.cwd,
            uid: s.uid,
            gid: s.gid,
            limits: &s.limits,
            io: Io::Piped,
        }
    }
}

/// A started process whose stdout and stderr are one pipe ([`Io::Combined`]).
pub struct SpawnedCombined {
    pub pid: i32,
    /// The read end of the shared stdout/stderr pipe.
    pub output: OwnedFd,
    pub exit: oneshot::Receiver<Exit>,
}

/// Forks server processes from one dedicated thread.
#[derive(Clone)]
pub struct Spawner {
    jobs: std::sync::mpsc::Sender<Fork>,
}

impl Spawner {
    pub fn start(reaper: Arc<Reaper>) -> io::Result<Spawner> {
        let (jobs, rx) = std::sync::mpsc::channel::<Fork>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                for job in rx {
                    // Held across fork + registration: see the module docs.
                    let mut waiters = reaper.waiters.lock().unwrap_or_else(|p| p.into_inner());
                    let mut cmd = job.cmd;
                    let result = cmd.spawn().map(|child| {
                        let (tx, rx) = oneshot::channel();
                        waiters.insert(child.id() as i32, tx);
                        (child, rx)
                    });
                    drop(waiters);
                    // The command holds the parent's copies of the child's
                    // pipe ends; they must close now, so a reader sees EOF
                    // when the child's side closes.
                    drop(cmd);
                    let _ = job.reply.send(result);
                }
            })?;
        Ok(Spawner { jobs })
    }

    /// Starts `spec`'s process. `cgroup_procs` is the server's
    /// `cgroup.procs`, joined before exec.
    pub async fn spawn(
        &self,
        spec: &LaunchSpec,
        cgroup_procs: Option<OwnedFd>,
    ) -> io::Result<Spawned> {
        let (mut child, exit) = self.fork(&Launch::from(spec), cgroup_procs).await?;
        let missing = || io::Error::other("child stdio was not piped");
        Ok(Spawned {
            pid: child.id() as i32,
            stdin: child.stdin.take().ok_or_else(missing)?.into(),
            stdout: child.stdout.take().ok_or_else(missing)?.into(),
            stderr: child.stderr.take().ok_or_else(missing)?.into(),
            exit,
        })
    }

    /// Starts a process whose stdout and stderr share one pipe and whose
    /// stdin is /dev/null (`launch.io` is ignored).
    pub async fn spawn_combined(
        &self,
        launch: &Launch<'_>,
        cgroup_procs: Option<OwnedFd>,
    ) -> io::Result<SpawnedCombined> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let launch = Launch {
            io: Io::Combined,
            ..*launch
        };
        let mut cmd_io = Some((w.try_clone()?, w));
        let (child, exit) = self.fork_with(&launch, cgroup_procs, &mut cmd_io).await?;
        Ok(SpawnedCombined {
            pid: child.id() as i32,
            output: r,
            exit,
        })
    }

    async fn fork(
        &self,
        launch: &Launch<'_>,
        cgroup_procs: Option<OwnedFd>,
    ) -> io::Result<(std::process::Child, oneshot::Receiver<Exit>)> {
        self.fork_with(launch, cgroup_procs, &mut None).await
    }

    /// Forks `launch` on the spawner thread. `combined`: the write ends of
    /// the shared output pipe, for [`Io::Combined`].
    async fn fork_with(
        &self,
        launch: &Launch<'_>,
        cgroup_procs: Option<OwnedFd>,
        combined: &mut Option<(OwnedFd, OwnedFd)>,
    ) -> io::Result<(std::process::Child, oneshot::Receiver<Exit>)> {
        let mut cmd = Command::new(launch.command);
        cmd.args(launch.args)
            .env_clear()
            .envs(launch.env)
            .current_dir(launch.cwd);
        match (launch.io, combined.take()) {
            (Io::Combined, Some((out, err))) => {
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::from(out))
                    .stderr(Stdio::from(err));
            }
            _ => {
                cmd.stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
            }
        }
        if let Some(gid) = launch.gid {
            cmd.gid(gid);
        }
        if let Some(uid) = launch.uid {
            cmd.uid(uid);
        }
        let rlimits = rlimits(launch.limits);
        let parent = rustix::process::getpid();
        let procs = cgroup_procs.as_ref().map(|fd| fd.as_raw_fd());
        // SAFETY: the closure runs between fork and exec and makes only
        // async-signal-safe system calls; it allocates nothing (the rlimit
        // list and the fd were prepared before the fork).
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setsid()?;
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
                // The agent may have died between fork and prctl.
                if rustix::process::getppid() != Some(parent) {
                    return Err(io::Error::other("the agent exited during spawn"));
                }
                for (res, v) in &rlimits {
                    rustix::process::setrlimit(
                        *res,
                        rustix::process::Rlimit {
                            current: Some(*v),
                            maximum: Some(*v),
                        },
                    )?;
                }
                if let Some(fd) = procs {
                    let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                    rustix::io::write(fd, b"0")?;
                }
                Ok(())
            });
        }
        let (reply, rx) = oneshot::channel();
        self.jobs
            .send(Fork { cmd, reply })
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        // `cgroup_procs` must stay open until the fork happened.
        let r = rx
            .await
            .map_err(|_| io::Error::other("the spawner thread is gone"))?;
        drop(cgroup_procs);
        r
    }
}

/// The rlimits to set. A value above the agent's own hard limit is
/// lowered to it: raising a hard limit needs CAP_SYS_RESOURCE, which a
/// container rarely grants.
fn rlimits(l: &ResourceLimits) -> Vec<(rustix::process::Resource, u64)> {
    use rustix::process::Resource;
    let clamp = |r: Resource, v: u64| match rustix::process::getrlimit(r).maximum {
        Some(hard) if v > hard => {
            tracing::debug!(resource = ?r, requested = v, hard, "rlimit lowered to the agent's hard limit");
            (r, hard)
        }
        _ => (r, v),
    };
    [
        (Resource::Nofile, l.nofile),
        (Resource::Nproc, l.nproc),
        (Resource::Cpu, l.cpu_seconds),
        (Resource::Fsize, l.fsize_bytes),
        (Resource::As, l.address_space_bytes),
        (Resource::Core, l.core_bytes),
    ]
    .into_iter()
    .filter_map(|(r, v)| v.map(|v| clamp(r, v)))
    .collect()
}

/// Processes that belong to the server whose first process is `pid`: its
/// cgroup members if it has a group, otherwise every process of its
/// session or process group, and every descendant of `pid`.
pub fn members(pid: i32, cgroup: Option<&super::cgroup::Cgroup>) -> Vec<i32> {
    members_tracked(pid, cgroup, &mut std::collections::HashSet::new())
}

/// [`members`], also counting every process of a session or process group
/// a member was seen leading in an earlier call (`seen`, kept by the
/// caller across the rounds of one kill): a child forked just as its parent
/// (a `setsid` shell) was killed is reparented to the agent, out of the
/// parent chain, but stays in that session.
pub fn members_tracked(
    pid: i32,
    cgroup: Option<&super::cgroup::Cgroup>,
    seen: &mut std::collections::HashSet<i32>,
) -> Vec<i32> {
    if let Some(cg) = cgroup {
        return cg.pids();
    }
    seen.insert(pid);
    use sysinfo::{ProcessRefreshKind, ProcessStatus, ProcessesToUpdate, System};
    let Ok(mut sys) = System::new() else {
        return vec![pid];
    };
    sys.refresh_processes_specifics(ProcessesToUpdate::All, true, ProcessRefreshKind::nothing());
    let procs = sys.processes();
    let mut out: Vec<i32> = Vec::new();
    for (p, proc_) in procs {
        // sysinfo lists threads as processes too; count processes only.
        if proc_.status() == ProcessStatus::Zombie || proc_.thread_kind().is_some() {
            continue;
        }
        let raw = p.as_u32() as i32;
        let session = proc_.session_id().map(|s| s.as_u32() as i32);
        let group = nix::unistd::getpgid(Some(Pid::from_raw(raw)))
            .ok()
            .map(|g| g.as_raw());
        let in_session = session.is_some_and(|s| seen.contains(&s));
        let in_group = group.is_some_and(|g| seen.contains(&g));
        let mut descendant = false;
        let mut cur = proc_.parent();
        let mut hops = 0;
        while let Some(pp) = cur {
            if pp.as_u32() as i32 == pid {
                descendant = true;
                break;
            }
            hops += 1;
            if hops > 64 {
                break;
            }
            cur = procs.get(&pp).and_then(|x| x.parent());
        }
        if raw == pid || in_session || in_group || descendant {
            out.push(raw);
        }
    }
    // Sessions and groups the members lead are the server's own (the
    // server itself leads its session: setsid at spawn).
    for &m in &out {
        if let Some(p) = procs.get(&sysinfo::Pid::from_u32(m as u32))
            && p.session_id().is_some_and(|s| s.as_u32() as i32 == m)
        {
            seen.insert(m);
        }
        if nix::unistd::getpgid(Some(Pid::from_raw(m))).is_ok_and(|g| g.as_raw() == m) {
            seen.insert(m);
        }
    }
    out
}

/// Sends `sig` to the server's process group and to every member.
pub fn signal_all(pid: i32, members: &[i32], sig: Signal) {
    let _ = kill(Pid::from_raw(-pid), sig);
    for m in members {
        let _ = kill(Pid::from_raw(*m), sig);
    }
}

/// Whether `pid` still runs (a zombie does not).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
