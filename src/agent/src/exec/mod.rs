//! Script executions inside the leased sandbox (Klavis's execution API).
//!
//! An execution is a named directory under `exec.root`:
//!
//! ```text
//! <root>/                    the agent's (root), 0755, never the tenant's
//! <root>/<name>/             the agent's, 0755
//! <root>/<name>/work/        the tenant's: the uploaded archive; the
//!                            script's cwd; exported
//! <root>/<name>/venv/        the tenant's: its Python virtual environment
//!                            (a copy of the agent's base venv, see [`venv`])
//! <root>/<name>/output.log   the agent's: stdout+stderr, capped
//!                            ([`log::ExecLog`])
//! ```
//!
//! Only `work/` and `venv/` are the tenant's: the agent (root) never opens
//! a path below them but by handles, without following a symlink
//! ([`crate::tenant_file`], [`Executions::export`], [`venv::clone_base`]).
//!
//! - [`upload`]: [`Executions::begin_upload`], `extract`, `commit_upload`
//!   put an archive in a fresh directory and swap it in for the name
//!   (killing a running execution of that name).
//! - [`config`] (`[exec]`, limits beside their defaults) and [`error`]
//!   (`ExecError` by cause).
//! - [`Executions::start`] runs it in the background ([`run`]): packages,
//!   venv, requirements, `python main.py`, each step a supervisor
//!   [`crate::supervisor::job::Job`] so the supervisor's fork, reaping and
//!   tree kill apply.
//! - [`Executions::close`] (Release, Reset, TTL, agent stop) kills every
//!   execution's tree and removes every directory; [`Executions::open`]
//!   (Acquire) admits new ones for a lease.

mod config;
mod dirs;
mod error;
pub mod log;
mod prep;
use dirs::{check_agent_dir, clear_dir};
pub(crate) use prep::Prep;
mod run;
mod state;
pub use state::ExecState;
mod upload;
mod venv;

pub use config::{ExecConfig, ExecConfigError};
use error::io_err;
pub use error::{ExecError, check_name};
pub use upload::{Extracted, Replaced, Upload};

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{AtFlags, Mode, OFlags};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::supervisor::{Supervisor, now_ms};
use crate::workspace::pack;
use log::ExecLog;

/// The script every archive must hold at its top level.
pub const MAIN_SCRIPT: &str = "main.py";
/// Python requirements, installed into the execution's venv.
pub const REQUIREMENTS: &str = "requirements.txt";
/// Debian packages, one per line, installed with apt-get.
pub const PACKAGES: &str = "packages.txt";
/// The log in the execution directory.
const LOG: &str = "output.log";
pub use sandbox_client::limits::MAX_EXECUTION_NAME_LEN as MAX_NAME_LEN;

/// An execution as the outside sees it.
#[derive(Debug, Clone)]
pub struct ExecView {
    pub name: String,
    pub state: ExecState,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub uploaded_at_ms: u64,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub log_bytes: u64,
    pub log_capped: bool,
    pub directory: PathBuf,
}

/// How a script reaches the lease's MCP servers.
#[derive(Debug, Clone)]
pub struct McpAccess {
    /// `http://127.0.0.1:PORT`
    pub base_url: String,
}

struct Progress {
    state: ExecState,
    message: String,
    exit_code: Option<i32>,
    signal: Option<i32>,
    started_at_ms: u64,
    finished_at_ms: u64,
}

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

pub(crate) struct Execution {
    name: String,
    dir: PathBuf,
    uploaded_at_ms: u64,
    progress: Mutex<Progress>,
    log: Mutex<Option<Arc<ExecLog>>>,
    running: tokio::sync::Mutex<Option<Running>>,
}

/// Flags opening a directory by handle, never through a symlink.
const DIR_FLAGS: OFlags = OFlags::DIRECTORY
    .union(OFlags::RDONLY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

/// The script's directory in an execution directory (the tenant's).
const WORK: &str = "work";

impl Execution {
    fn work(&self) -> PathBuf {
        self.dir.join(WORK)
    }

    /// The execution directory (the agent's), by handle.
    fn open_dir(&self) -> Result<OwnedFd, ExecError> {
        rustix::fs::open(&self.dir, DIR_FLAGS, Mode::empty()).map_err(|e| ExecError::Io {
            context: format!("opening {}", self.dir.display()),
            source: e.into(),
        })
    }

    /// `work/` (the tenant's), by handle relative to the execution
    /// directory's: a `work` the script replaced with a symlink or
    /// anything but a directory is refused.
    fn open_work(&self) -> Result<OwnedFd, ExecError> {
        let dir = self.open_dir()?;
        match rustix::fs::openat(&dir, WORK, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(fd),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR | rustix::io::Errno::NOENT) => {
                let what = rustix::fs::statat(&dir, WORK, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| {
                        crate::tenant_file::describe(rustix::fs::FileType::from_raw_mode(
                            st.st_mode,
                        ))
                    })
                    .unwrap_or("missing");
                Err(ExecError::WorkReplaced {
                    name: self.name.clone(),
                    what,
                })
            }
            Err(e) => Err(ExecError::Io {
                context: format!("opening {}", self.work().display()),
                source: e.into(),
            }),
        }
    }

    fn set(&self, f: impl FnOnce(&mut Progress)) {
        f(&mut self.progress.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn log(&self) -> Option<Arc<ExecLog>> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn view(&self) -> ExecView {
        let p = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let st = self.log().map(|l| l.state()).unwrap_or_default();
        ExecView {
            name: self.name.clone(),
            state: p.state,
            message: p.message.clone(),
            exit_code: p.exit_code,
            signal: p.signal,
            uploaded_at_ms: self.uploaded_at_ms,
            started_at_ms: p.started_at_ms,
            finished_at_ms: p.finished_at_ms,
            log_bytes: st.len,
            log_capped: st.dropped > 0,
            directory: self.work(),
        }
    }

    /// Kills a queued or running run and waits until its tree is gone.
    async fn stop(&self) -> bool {
        let run = self.running.lock().await.take();
        let Some(r) = run else {
            return false;
        };
        let was_running = !r.task.is_finished();
        r.stop.cancel();
        if let Err(e) = r.task.await {
            tracing::warn!(execution = %self.name, error = %e, "execution task ended abnormally");
        }
        was_running
    }
}

struct LeaseInfo {
    id: String,
    servers: Vec<String>,
}

#[derive(Default)]
struct Inner {
    lease: Option<LeaseInfo>,
    /// Bumped by every open and close: an upload that began under another
    /// generation is discarded.
    generation: u64,
    execs: BTreeMap<String, Arc<Execution>>,
    /// Names whose upload is being put in place.
    committing: std::collections::HashSet<String>,
}

/// What [`Executions::close`] did.
#[derive(Debug, Default)]
pub struct Closed {
    /// Executions that were running and were killed.
    pub killed: usize,
    /// Clean-ups that failed, each with its cause: the sandbox must not go
    /// back to the pool as if clean.
    pub failed: Vec<String>,
}

/// The executions of the current lease.
pub struct Executions {
    cfg: ExecConfig,
    sup: Arc<Supervisor>,
    workspace: PathBuf,
    mcp: Mutex<Option<McpAccess>>,
    /// The scripts' data-plane token of the current lease.
    token: sandbox_serve::auth::LeaseToken,
    inner: Mutex<Inner>,
    slots: Arc<Semaphore>,
    prep: Arc<Prep>,
}

impl Executions {
    /// `base_venv`: where the agent makes the venv every run copies (in
    /// its state root, outside `exec.root`, which Release empties).
    pub fn new(
        cfg: ExecConfig,
        sup: Arc<Supervisor>,
        workspace: PathBuf,
        base_venv: PathBuf,
    ) -> Arc<Executions> {
        let slots = Arc::new(Semaphore::new(cfg.max_running));
        Arc::new(Executions {
            cfg,
            sup,
            workspace,
            mcp: Mutex::new(None),
            token: Default::default(),
            inner: Mutex::new(Inner::default()),
            slots,
            prep: Arc::new(Prep::new(base_venv)),
        })
    }

    /// Prepares the runs' Python in the background unless done (the first
    /// run waits for it): at the agent's first upload, so neither an idle
    /// agent nor a lease that runs no script pays for it.
    pub(crate) fn prepare_soon(&self) {
        if self.prep.initialized() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (prep, cfg, sup) = (self.prep.clone(), self.cfg.clone(), self.sup.clone());
        rt.spawn(async move {
            prep.get(&cfg, &sup).await;
        });
    }

    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }

    /// Where scripts find the MCP data plane (set once it is bound).
    pub fn set_mcp_access(&self, access: McpAccess) {
        *self.mcp.lock().unwrap_or_else(|p| p.into_inner()) = Some(access);
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token the scripts' MCP listener checks.
    pub fn lease_token(&self) -> sandbox_serve::auth::LeaseToken {
        self.token.clone()
    }

    /// The current lease's data-plane token, if any.
    pub(crate) fn current_token(&self) -> Option<String> {
        self.token.get().map(|t| t.expose().to_owned())
    }

    /// Admits executions for `lease` (Acquire, Narrow, Reset), with a new
    /// data-plane token: no earlier lease's token opens this one.
    pub fn open(&self, lease: &str, servers: &[String]) {
        match sandbox_client::auth::Token::generate() {
            Ok(t) => self.token.set(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot make the scripts' token; their MCP listener refuses all");
                self.token.revoke();
            }
        }
        let mut i = self.inner();
        i.generation += 1;
        i.lease = Some(LeaseInfo {
            id: lease.to_owned(),
            servers: servers.to_vec(),
        });
    }

    /// Kills every execution (whole process trees, in parallel) and removes
    /// every execution directory (by handles, never following a symlink);
    /// no execution is admitted until the next [`Executions::open`].
    /// Returns how many were running and what could not be cleaned.
    pub async fn close(&self) -> Closed {
        let execs: Vec<Arc<Execution>> = {
            self.token.revoke();
            let mut i = self.inner();
            i.generation += 1;
            i.lease = None;
            std::mem::take(&mut i.execs).into_values().collect()
        };
        let stopped = futures_util::future::join_all(execs.iter().map(|e| e.stop())).await;
        let killed = stopped.into_iter().filter(|k| *k).count();
        let mut failed = Vec::new();
        let root = self.cfg.root.clone();
        let removed = tokio::task::spawn_blocking(move || clear_dir(&root)).await;
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(root = %self.cfg.root.display(), error = %e, "removing execution directories");
                failed.push(format!(
                    "removing the execution directories in {}: {e}",
                    self.cfg.root.display()
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the task removing execution directories failed");
                failed.push(format!(
                    "the task removing execution directories failed: {e}"
                ));
            }
        }
        if let Err(e) = self.prep.verify().await {
            tracing::error!(error = %e, "the executions' base venv");
            failed.push(e);
        }
        if killed > 0 {
            tracing::info!(killed, "running executions killed");
        }
        Closed { killed, failed }
    }

    /// `exec.root`, made if missing, by handle: it must be the agent's
    /// (owned by its uid) and is made writable by it alone (0755): the
    /// tenant never creates or renames anything in it.
    fn open_root(&self) -> Result<OwnedFd, ExecError> {
        let root = &self.cfg.root;
        let err = |what: &str, e: std::io::Error| ExecError::Io {
            context: format!("{what} exec.root {}", root.display()),
            source: e,
        };
        std::fs::create_dir_all(root).map_err(|e| err("creating", e))?;
        let fd = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
            .map_err(|e| err("opening", e.into()))?;
        check_agent_dir(&fd).map_err(|e| err("checking", e))?;
        Ok(fd)
    }

    /// Checks `lease_id` (empty: the current lease) and returns the
    /// current lease's id.
    fn check_lease(&self, i: &Inner, lease_id: &str) -> Result<(), ExecError> {
        match &i.lease {
            None if lease_id.is_empty() => Err(ExecError::NotLeased),
            None => Err(ExecError::OtherLease {
                asked: lease_id.to_owned(),
                current: None,
            }),
            Some(l) if !lease_id.is_empty() && l.id != lease_id => Err(ExecError::OtherLease {
                asked: lease_id.to_owned(),
                current: Some(l.id.clone()),
            }),
            Some(_) => Ok(()),
        }
    }

    fn get(&self, lease_id: &str, name: &str) -> Result<Arc<Execution>, ExecError> {
        check_name(name)?;
        let i = self.inner();
        self.check_lease(&i, lease_id)?;
        i.execs
            .get(name)
            .cloned()
            .ok_or_else(|| ExecError::Unknown {
                name: name.to_owned(),
                known: i.execs.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// Starts an uploaded (or finished) execution in the background.
    pub async fn start(&self, lease_id: &str, name: &str) -> Result<ExecView, ExecError> {
        let exec = self.get(lease_id, name)?;
        let mut running = exec.running.lock().await;
        // A close() that took the executions before this point would not
        // see this run; one after it waits for `running` and stops it.
        if !self
            .inner()
            .execs
            .get(name)
            .is_some_and(|e| Arc::ptr_eq(e, &exec))
        {
            return Err(ExecError::Released);
        }
        let state = exec
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state;
        if state.active() {
            return Err(ExecError::Active {
                name: name.to_owned(),
                state: state.klavis(),
            });
        }
        let log_path = exec.dir.join(LOG);
        let log = exec
            .open_dir()
            .and_then(|dir| {
                ExecLog::create(dir.as_fd(), LOG, self.cfg.log_max_bytes)
                    .map_err(io_err(format!("creating {}", log_path.display())))
            })
            .map_err(|e| self.why_gone(name, &exec).unwrap_or(e))?;
        let log = Arc::new(log);
        *exec.log.lock().unwrap_or_else(|p| p.into_inner()) = Some(log.clone());
        exec.set(|p| {
            *p = Progress {
                state: ExecState::Queued,
                message: "waiting for a free slot (exec.max_running)".into(),
                exit_code: None,
                signal: None,
                started_at_ms: now_ms(),
                finished_at_ms: 0,
            }
        });
        let servers = self
            .inner()
            .lease
            .as_ref()
            .map(|l| l.servers.clone())
            .unwrap_or_default();
        let ctx = run::RunCtx {
            cfg: self.cfg.clone(),
            sup: self.sup.clone(),
            workspace: self.workspace.clone(),
            mcp: self
                .mcp
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .zip(self.current_token()),
            servers,
            slots: self.slots.clone(),
            prep: self.prep.clone(),
        };
        let stop = CancellationToken::new();
        let span = tracing::info_span!("execution", execution = %name);
        let task = tokio::spawn(tracing::Instrument::instrument(
            run::run(ctx, exec.clone(), log, stop.clone()),
            span,
        ));
        *running = Some(Running { stop, task });
        drop(running);
        Ok(exec.view())
    }

    /// Why execution `exec` of `name` is no longer there to start, if it
    /// is not: the lease ended (Release, Reset), or another upload of the
    /// name is replacing it (its directory moved aside meanwhile).
    fn why_gone(&self, name: &str, exec: &Arc<Execution>) -> Option<ExecError> {
        let i = self.inner();
        if i.lease.is_none() {
            return Some(ExecError::Released);
        }
        let replaced =
            i.committing.contains(name) || !i.execs.get(name).is_some_and(|e| Arc::ptr_eq(e, exec));
        replaced.then(|| ExecError::Active {
            name: name.to_owned(),
            state: "being replaced by another upload",
        })
    }

    pub fn status(&self, lease_id: &str, name: &str) -> Result<ExecView, ExecError> {
        Ok(self.get(lease_id, name)?.view())
    }

    pub fn list(&self, lease_id: &str) -> Result<Vec<ExecView>, ExecError> {
        let i = self.inner();
        self.check_lease(&i, lease_id)?;
        Ok(i.execs.values().map(|e| e.view()).collect())
    }

    /// The status and log of an execution (None until it was started).
    pub fn log(
        &self,
        lease_id: &str,
        name: &str,
    ) -> Result<(ExecView, Option<Arc<ExecLog>>), ExecError> {
        let e = self.get(lease_id, name)?;
        Ok((e.view(), e.log()))
    }

    /// Kills a queued or running execution; it ends failed ("cancelled").
    pub async fn cancel(&self, lease_id: &str, name: &str) -> Result<ExecView, ExecError> {
        let e = self.get(lease_id, name)?;
        e.stop().await;
        Ok(e.view())
    }

    /// Packs an execution's directory as a tar stream to `out`. Blocking.
    pub fn export<W: std::io::Write>(
        &self,
        lease_id: &str,
        name: &str,
        out: W,
        cancelled: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<(W, pack::PackStats), ExecError> {
        let e = self.get(lease_id, name)?;
        let dir = e.open_work()?;
        let opts = pack::PackOptions {
            cancelled,
            ..Default::default()
        };
        pack::pack(dir.as_fd(), &opts, out).map_err(ExecError::Archive)
    }
}
