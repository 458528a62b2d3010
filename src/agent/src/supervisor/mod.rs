//! MCP server supervision: one runner task per started server keeps its
//! process alive according to the manifest's restart policy.
//!
//! - [`manifest`]: the TOML manifest and the launch spec of a server.
//! - [`spawn`]: fork/exec with session, death signal, rlimits, cgroup; the
//!   single `waitpid` owner ([`spawn::Reaper`]).
//! - [`cgroup`]: per-server cgroup v2 groups (kill-all, memory.max).
//! - [`mcp`]: the JSON-RPC connection to a stdio server (readiness
//!   handshake now, the gateway's multiplexing later).
//! - [`probe`]: readiness of HTTP servers.
//! - [`logbuf`]: bounded per-server log ring buffers.
//! - [`job`]: one-shot processes (script executions) with the same fork,
//!   reaping and tree kill as servers.
//!
//! State of each server is published on a `watch` channel; readers (List,
//! health, the lifecycle's readiness wait) never block the runner.

pub mod cgroup;
pub mod job;
pub mod logbuf;
pub mod manifest;
pub mod mcp;
pub mod probe;
pub mod restart;
mod runner;
pub mod spawn;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, warn};

use logbuf::{LogBuf, Stream};
use manifest::{LaunchSpec, Manifest};
use mcp::StdioConn;
use runner::{runner, set_state};
use spawn::{Exit, Reaper, Spawner};

use crate::tenant::Tenant;

/// Milliseconds since the Unix epoch.
pub use sandbox_client::{now_ms, when};

/// Limits and switches of the supervisor (`[supervisor]` in agent.toml).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisorConfig {
    /// Log ring buffer per server, in bytes (lines are dropped oldest first).
    pub log_buffer_bytes: usize,
    /// Longest log line kept; longer lines are cut and flagged.
    pub log_line_bytes: usize,
    /// Largest JSON-RPC message read from a stdio server's stdout.
    pub stdio_message_bytes: usize,
    /// Lines of stderr shown in `Servers.List` (at most 4 KiB).
    pub stderr_tail_lines: usize,
    /// cgroup v2 use: "auto" (a writable hierarchy if there is one), "off",
    /// or the directory to create server groups in.
    pub cgroup: String,
    /// Who MCP servers, executions and data tools run as: "auto" (uid and
    /// gid 1000 when the agent is root, else the agent's own), "none" (the
    /// agent's own: development only) or "UID:GID". Never root.
    pub tenant_user: String,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            log_buffer_bytes: 256 << 10,
            log_line_bytes: 8 << 10,
            stdio_message_bytes: 16 << 20,
            stderr_tail_lines: 20,
            cgroup: "auto".into(),
            tenant_user: crate::tenant::DEFAULT_TENANT_USER.into(),
        }
    }
}

impl SupervisorConfig {
    pub fn validate(&self) -> Result<(), SupervisorConfigError> {
        for (k, v) in [
            ("log_buffer_bytes", self.log_buffer_bytes),
            ("log_line_bytes", self.log_line_bytes),
            ("stdio_message_bytes", self.stdio_message_bytes),
        ] {
            if v == 0 {
                return Err(SupervisorConfigError::Zero(k));
            }
        }
        if self.log_line_bytes > self.log_buffer_bytes {
            return Err(SupervisorConfigError::LineOverBuffer);
        }
        crate::tenant::parse(&self.tenant_user)?;
        Ok(())
    }
}

/// A `[supervisor]` setting out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorConfigError {
    #[error(transparent)]
    Tenant(#[from] crate::tenant::TenantError),
    #[error("supervisor.{0} must be greater than 0")]
    Zero(&'static str),
    #[error("supervisor.log_line_bytes must not exceed log_buffer_bytes")]
    LineOverBuffer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Stopped,
    Starting,
    Ready,
    Backoff,
    Failed,
    Stopping,
    /// In a lazy lease, not started yet ([`Supervisor::park`]): its first
    /// use starts it.
    Idle,
}

/// A server's published state.
#[derive(Debug, Clone)]
pub struct Status {
    pub name: String,
    pub state: State,
    pub pid: Option<i32>,
    pub restarts: u32,
    pub last_exit: Option<(Exit, u64)>,
    pub state_since_ms: u64,
    pub started_at_ms: u64,
    pub updated_at_ms: u64,
    pub message: String,
}

/// CPU and memory of a server's processes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_time_ms: u64,
    pub rss_bytes: u64,
    pub processes: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum SupError {
    #[error("no server named {name:?} in the manifest; known servers: {known}")]
    Unknown { name: String, known: String },
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

struct Server {
    name: String,
    log: Arc<LogBuf>,
    status: watch::Sender<Status>,
    /// Serializes start/stop of this server.
    run: tokio::sync::Mutex<Option<Running>>,
    /// Grace period of the stop in progress.
    stop_grace: Mutex<Option<Duration>>,
    conn: Mutex<Option<Arc<StdioConn>>>,
    /// The running process: pid and cgroup, for usage and stop.
    proc_: Mutex<Option<(i32, Option<Arc<cgroup::Cgroup>>)>>,
}

struct Shared {
    spawner: Spawner,
    cgroups: Option<cgroup::CgroupRoot>,
    cfg: SupervisorConfig,
    tenant: Tenant,
}

/// Supervises the servers of one manifest.
pub struct Supervisor {
    servers: BTreeMap<String, Arc<Server>>,
    shared: Arc<Shared>,
    reaper: Arc<Reaper>,
}

impl Supervisor {
    /// Starts the reaper and spawner. Must run inside the tokio runtime.
    /// `state_root` holds the tenant's per-lease home.
    pub fn new(
        manifest: &Manifest,
        cfg: SupervisorConfig,
        state_root: &std::path::Path,
    ) -> std::io::Result<Supervisor> {
        let ids = crate::tenant::parse(&cfg.tenant_user).map_err(std::io::Error::other)?;
        let tenant = Tenant::new(ids, state_root);
        if let Some(uid) = tenant.uid() {
            tracing::info!(uid, "servers, executions and data tools run unprivileged");
        } else {
            tracing::warn!(
                "servers, executions and data tools run as the agent's own user (supervisor.tenant_user)"
            );
        }
        let reaper = Reaper::start()?;
        let spawner = Spawner::start(reaper.clone())?;
        let cgroups = cgroup::CgroupRoot::detect(&cfg.cgroup).map_err(std::io::Error::other)?;
        let servers = manifest
            .servers
            .keys()
            .map(|name| {
                let now = now_ms();
                let status = Status {
                    name: name.clone(),
                    state: State::Stopped,
                    pid: None,
                    restarts: 0,
                    last_exit: None,
                    state_since_ms: now,
                    started_at_ms: 0,
                    updated_at_ms: now,
                    message: String::new(),
                };
                let server = Server {
                    name: name.clone(),
                    log: Arc::new(LogBuf::new(cfg.log_buffer_bytes, cfg.log_line_bytes)),
                    status: watch::channel(status).0,
                    run: tokio::sync::Mutex::new(None),
                    stop_grace: Mutex::new(None),
                    conn: Mutex::new(None),
                    proc_: Mutex::new(None),
                };
                (name.clone(), Arc::new(server))
            })
            .collect();
        Ok(Supervisor {
            servers,
            shared: Arc::new(Shared {
                spawner,
                cgroups,
                cfg,
                tenant,
            }),
            reaper,
        })
    }

    fn server(&self, name: &str) -> Result<&Arc<Server>, SupError> {
        self.servers.get(name).ok_or_else(|| SupError::Unknown {
            name: name.to_owned(),
            known: self.names().join(", "),
        })
    }

    /// Who tenant processes run as.
    pub fn tenant(&self) -> &Tenant {
        &self.shared.tenant
    }

    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    pub fn status(&self, name: &str) -> Result<Status, SupError> {
        Ok(self.server(name)?.status.borrow().clone())
    }

    /// Follows a server's state.
    pub fn watch(&self, name: &str) -> Result<watch::Receiver<Status>, SupError> {
        Ok(self.server(name)?.status.subscribe())
    }

    /// Waits until a server settles (ready, failed or stopped) and returns
    /// that status; `None` when `deadline` passes first.
    pub async fn wait_settled(
        &self,
        name: &str,
        deadline: Duration,
    ) -> Result<Option<Status>, SupError> {
        let mut rx = self.watch(name)?;
        let settled = rx.wait_for(|s| {
            matches!(
                s.state,
                State::Ready | State::Failed | State::Stopped | State::Idle
            )
        });
        match tokio::time::timeout(deadline, settled).await {
            Ok(Ok(s)) => Ok(Some(s.clone())),
            // The sender lives as long as the supervisor.
            Ok(Err(_)) => Ok(Some(self.status(name)?)),
            Err(_) => Ok(None),
        }
    }

    pub fn logs(&self, name: &str) -> Result<Arc<LogBuf>, SupError> {
        Ok(self.server(name)?.log.clone())
    }

    /// The MCP connection of a ready stdio server.
    pub fn conn(&self, name: &str) -> Option<Arc<StdioConn>> {
        self.servers
            .get(name)?
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Orphaned processes (not servers) the agent has reaped.
    pub fn orphans_reaped(&self) -> u64 {
        self.reaper.orphans_reaped()
    }

    /// The last stderr lines of a server, for error messages.
    pub fn stderr_tail(&self, name: &str) -> String {
        self.servers.get(name).map_or_else(String::new, |s| {
            s.log
                .tail_text(Stream::Stderr, self.shared.cfg.stderr_tail_lines, 4096)
        })
    }

    /// Starts `spec.name` unless it is already running. Returns at once;
    /// follow [`Supervisor::watch`] for readiness.
    pub async fn start(&self, spec: LaunchSpec) -> Result<Status, SupError> {
        let server = self.server(&spec.name)?.clone();
        let mut run = server.run.lock().await;
        if let Some(r) = run.as_ref()
            && !r.task.is_finished()
        {
            return Ok(server.status.borrow().clone());
        }
        if let Some(memory) = spec.limits.memory_bytes
            && !self
                .shared
                .cgroups
                .as_ref()
                .is_some_and(|c| c.memory_limits())
        {
            warn!(server = %spec.name, memory, "memory limit not enforced: no cgroup v2 memory controller available");
        }
        server.status.send_modify(|s| s.restarts = 0);
        // Starting from here on, so a waiter never sees the old Stopped.
        set_state(&server, State::Starting, String::new());
        let stop = CancellationToken::new();
        let span = tracing::info_span!("server", server = %spec.name);
        let fut = runner(server.clone(), self.shared.clone(), spec, stop.clone()).instrument(span);
        let s2 = server.clone();
        let task = tokio::spawn(async move {
            use futures_util::FutureExt;
            if std::panic::AssertUnwindSafe(fut)
                .catch_unwind()
                .await
                .is_err()
            {
                // Never leave a waiter looking at a state nobody updates.
                set_state(
                    &s2,
                    State::Failed,
                    "internal error: the supervisor task panicked".into(),
                );
            }
        });
        *run = Some(Running { stop, task });
        Ok(server.status.borrow().clone())
    }

    /// Marks a server that is not running [`State::Idle`]: in a lazy lease,
    /// started on its first use. A running server is left as it is.
    pub async fn park(&self, name: &str) -> Result<(), SupError> {
        let server = self.server(name)?.clone();
        let run = server.run.lock().await;
        if run.as_ref().is_none_or(|r| r.task.is_finished()) {
            set_state(&server, State::Idle, String::new());
        }
        Ok(())
    }

    /// Stops a server and waits until all of its processes are gone.
    /// `grace`: time between SIGTERM and SIGKILL (default: the manifest's).
    /// An idle server is just marked stopped.
    pub async fn stop(&self, name: &str, grace: Option<Duration>) -> Result<Status, SupError> {
        let server = self.server(name)?.clone();
        let mut run = server.run.lock().await;
        if server.status.borrow().state == State::Idle {
            set_state(&server, State::Stopped, String::new());
        }
        if let Some(r) = run.take() {
            *server.stop_grace.lock().unwrap_or_else(|p| p.into_inner()) = grace;
            r.stop.cancel();
            if let Err(e) = r.task.await {
                warn!(server = name, error = %e, "server runner ended abnormally");
                set_state(&server, State::Stopped, String::new());
            }
        }
        let s = server.status.borrow().clone();
        Ok(s)
    }

    /// Stops every running server, in parallel.
    pub async fn stop_all(&self) {
        let stops = self.servers.keys().map(|n| self.stop(n, None));
        futures_util::future::join_all(stops).await;
    }

    /// Stops everything and removes the agent's cgroup (agent exit).
    pub async fn shutdown(&self) {
        self.stop_all().await;
        if let Some(root) = &self.shared.cgroups {
            root.remove();
        }
    }

    /// Forgets a server's log and last exit (a new lease starts clean).
    pub fn forget(&self, name: &str) {
        if let Some(s) = self.servers.get(name) {
            s.log.clear();
            s.status.send_modify(|st| {
                st.last_exit = None;
                st.restarts = 0;
                st.message.clear();
                st.updated_at_ms = now_ms();
            });
        }
    }

    /// CPU time, RSS and process count of each running server.
    pub fn usage(&self) -> BTreeMap<String, Usage> {
        use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};
        let mut groups: Vec<(String, Vec<i32>)> = Vec::new();
        for (name, s) in &self.servers {
            let p = s.proc_.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some((pid, cg)) = p {
                groups.push((name.clone(), spawn::members(pid, cg.as_deref())));
            }
        }
        let pids: Vec<Pid> = groups
            .iter()
            .flat_map(|(_, m)| m.iter().map(|p| Pid::from_u32(*p as u32)))
            .collect();
        let Ok(mut sys) = System::new() else {
            return BTreeMap::new();
        };
        sys.refresh_processes_specifics(
            ProcessesToUpdate::Some(&pids),
            true,
            ProcessRefreshKind::nothing().with_cpu().with_memory(),
        );
        groups
            .into_iter()
            .map(|(name, members)| {
                let mut u = Usage::default();
                for m in members {
                    if let Some(p) = sys.process(Pid::from_u32(m as u32)) {
                        u.cpu_time_ms += p.accumulated_cpu_time();
                        u.rss_bytes += p.memory();
                        u.processes += 1;
                    }
                }
                (name, u)
            })
            .collect()
    }
}
