//! Script executions inside the leased sandbox (Klavis's execution API).
//!
//! An execution is a named directory under `exec.root`:
//!
//! ```text
//! <root>/<name>/work/        the uploaded archive; the script's cwd; exported
//! <root>/<name>/venv/        its Python virtual environment
//! <root>/<name>/output.log   stdout+stderr, capped ([`log::ExecLog`])
//! ```
//!
//! - [`Executions::upload`] extracts an archive into a fresh directory and
//!   swaps it in for the name (killing a running execution of that name).
//! - [`Executions::start`] runs it in the background ([`run`]): packages,
//!   venv, requirements, `python main.py`, each step a supervisor
//!   [`crate::supervisor::job::Job`] so the supervisor's fork, reaping and
//!   tree kill apply.
//! - [`Executions::close`] (Release, Reset, TTL, agent stop) kills every
//!   execution's tree and removes every directory; [`Executions::open`]
//!   (Acquire) admits new ones for a lease.

pub mod log;
mod run;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::supervisor::{Supervisor, now_ms};
use crate::workspace::{ArchiveLimits, Compression, WsError, extract, pack};
use log::{ExecLog, ReadError};

/// The script every archive must hold at its top level.
pub const MAIN_SCRIPT: &str = "main.py";
/// Python requirements, installed into the execution's venv.
pub const REQUIREMENTS: &str = "requirements.txt";
/// Debian packages, one per line, installed with apt-get.
pub const PACKAGES: &str = "packages.txt";
pub use sandbox_client::limits::MAX_EXECUTION_NAME_LEN as MAX_NAME_LEN;
use sandbox_client::limits::valid_execution_name;

/// `[exec]` in agent.toml.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// Where execution directories live. Must be outside the workspace;
    /// everything in it is removed at Release.
    pub root: PathBuf,
    /// The interpreter venvs are made from.
    pub python: String,
    /// `uv` for venvs and installs: "auto" (uv on PATH if there is one),
    /// "off" (python -m venv + pip), or a path.
    pub uv: String,
    /// Installing packages.txt with apt-get: "auto" (when the agent is
    /// root and apt-get exists) or "off". Packages already installed are
    /// accepted either way.
    pub packages: String,
    /// An execution (installs included) is killed after this long.
    pub timeout_ms: u64,
    /// SIGTERM → SIGKILL grace when an execution is killed.
    pub stop_grace_ms: u64,
    /// Largest log kept per execution (on disk); later output is dropped
    /// after a marker line.
    pub log_max_bytes: u64,
    /// Largest part of a log one Logs answer carries.
    pub log_read_bytes: u32,
    /// Executions a lease may hold (uploaded, running or finished).
    pub max_executions: usize,
    /// Executions that run at once; more wait as QUEUED.
    pub max_running: usize,
    /// A loopback listener of the MCP data plane for scripts (token
    /// required, the token is in the script's environment); "" disables it.
    pub mcp_listen: String,
    /// Extra environment of every execution.
    pub env: BTreeMap<String, String>,
    /// Variables copied from the agent's own environment when set (package
    /// indexes and proxies).
    pub pass_env: Vec<String>,
    /// Limits of execution archives.
    pub archive: ArchiveLimits,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            root: PathBuf::from("/var/lib/sandbox-agent/executions"),
            python: "python3".into(),
            uv: "auto".into(),
            packages: "auto".into(),
            timeout_ms: 3_600_000,
            stop_grace_ms: 2_000,
            log_max_bytes: 16 << 20,
            log_read_bytes: 1 << 20,
            max_executions: 32,
            max_running: 4,
            mcp_listen: "tcp://127.0.0.1:0".into(),
            env: BTreeMap::new(),
            pass_env: [
                "PIP_INDEX_URL",
                "PIP_EXTRA_INDEX_URL",
                "PIP_FIND_LINKS",
                "PIP_NO_INDEX",
                "UV_INDEX_URL",
                "UV_DEFAULT_INDEX",
                "UV_EXTRA_INDEX_URL",
                "UV_FIND_LINKS",
                "UV_NO_INDEX",
                "UV_OFFLINE",
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "NO_PROXY",
                "http_proxy",
                "https_proxy",
                "no_proxy",
                "SSL_CERT_FILE",
            ]
            .map(String::from)
            .to_vec(),
            archive: ArchiveLimits {
                max_archive_bytes: 1 << 30,
                max_expanded_bytes: 4 << 30,
                max_entries: 100_000,
                ..ArchiveLimits::default()
            },
        }
    }
}

/// An `[exec]` setting out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum ExecConfigError {
    #[error("exec.{0} must be greater than 0")]
    Zero(&'static str),
    #[error("exec.log_max_bytes must be at least 4096")]
    SmallLog,
    #[error("exec.{key} must be \"auto\", \"off\"{paths}; got {got:?}")]
    Switch {
        key: &'static str,
        paths: &'static str,
        got: String,
    },
    #[error(
        "exec.root {root} and the workspace {workspace} overlap; executions must live outside the workspace"
    )]
    Overlap { root: String, workspace: String },
    #[error("exec.root must be an absolute path (got {0})")]
    Relative(String),
    #[error(transparent)]
    Archive(#[from] crate::workspace::limits::LimitsError),
}

impl ExecConfig {
    pub fn validate(&self, workspace: &Path) -> Result<(), ExecConfigError> {
        for (k, v) in [
            ("timeout_ms", self.timeout_ms),
            ("log_read_bytes", self.log_read_bytes.into()),
            ("max_executions", self.max_executions as u64),
            ("max_running", self.max_running as u64),
        ] {
            if v == 0 {
                return Err(ExecConfigError::Zero(k));
            }
        }
        if self.log_max_bytes < 4096 {
            return Err(ExecConfigError::SmallLog);
        }
        if !matches!(self.packages.as_str(), "auto" | "off") {
            return Err(ExecConfigError::Switch {
                key: "packages",
                paths: "",
                got: self.packages.clone(),
            });
        }
        if self.uv.is_empty() {
            return Err(ExecConfigError::Switch {
                key: "uv",
                paths: " or a path",
                got: self.uv.clone(),
            });
        }
        if self.root.is_relative() {
            return Err(ExecConfigError::Relative(self.root.display().to_string()));
        }
        if self.root.starts_with(workspace) || workspace.starts_with(&self.root) {
            return Err(ExecConfigError::Overlap {
                root: self.root.display().to_string(),
                workspace: workspace.display().to_string(),
            });
        }
        self.archive.validate()?;
        Ok(())
    }

    fn grace(&self) -> Duration {
        Duration::from_millis(self.stop_grace_ms)
    }
}

/// Where an execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    Uploaded,
    Queued,
    Installing,
    Running,
    Completed,
    Failed,
}

impl ExecState {
    /// Klavis's status word.
    pub fn klavis(self) -> &'static str {
        match self {
            ExecState::Uploaded | ExecState::Queued => "pending",
            ExecState::Installing | ExecState::Running => "running",
            ExecState::Completed => "completed",
            ExecState::Failed => "failed",
        }
    }

    pub fn active(self) -> bool {
        matches!(
            self,
            ExecState::Queued | ExecState::Installing | ExecState::Running
        )
    }
}

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

/// Why an execution request failed. `rpc::exec` maps each to a code.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the sandbox is not leased; acquire it before running executions")]
    NotLeased,
    #[error("lease {asked} is not this sandbox's lease{}", current.as_ref().map(|c| format!(" (it holds {c})")).unwrap_or_default())]
    OtherLease {
        asked: String,
        current: Option<String>,
    },
    #[error(
        "invalid execution name {0:?}: use 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ - (not \".\" or \"..\")"
    )]
    BadName(String),
    #[error("no execution named {name:?} in this sandbox{}", if known.is_empty() { "; upload its archive first".to_owned() } else { format!(" (it has: {known})") })]
    Unknown { name: String, known: String },
    #[error(
        "this lease already holds {max} executions (exec.max_executions); re-use a name to replace one"
    )]
    TooMany { max: usize },
    #[error("the archive has no regular file {MAIN_SCRIPT} at its top level")]
    NoMain,
    #[error("execution archive: {0}")]
    Archive(WsError),
    #[error(
        "execution {name:?} is {state}; cancel it or wait for it to end before starting it again"
    )]
    Active { name: String, state: &'static str },
    #[error(transparent)]
    Log(#[from] ReadError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the lease was released or reset meanwhile, which ends its executions; upload the archive again"
    )]
    Released,
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    let context = context.into();
    move |source| ExecError::Io { context, source }
}

/// Checks an execution name (it becomes a directory name).
pub fn check_name(name: &str) -> Result<(), ExecError> {
    if valid_execution_name(name) {
        Ok(())
    } else {
        Err(ExecError::BadName(name.to_owned()))
    }
}

/// How a script reaches the lease's MCP servers.
#[derive(Debug, Clone)]
pub struct McpAccess {
    /// `http://127.0.0.1:PORT`
    pub base_url: String,
    pub token: String,
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

impl Execution {
    fn work(&self) -> PathBuf {
        self.dir.join("work")
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
}

/// The executions of the current lease.
pub struct Executions {
    cfg: ExecConfig,
    sup: Arc<Supervisor>,
    workspace: PathBuf,
    mcp: Mutex<Option<McpAccess>>,
    inner: Mutex<Inner>,
    slots: Arc<Semaphore>,
}

/// An upload in progress: its staging directory, removed unless committed.
pub struct Upload {
    name: String,
    generation: u64,
    stage: PathBuf,
    committed: bool,
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.stage);
        }
    }
}

/// What an upload replaced.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replaced {
    pub replaced: bool,
    pub killed_running: bool,
}

/// Result of extracting an upload.
#[derive(Debug, Clone, Default)]
pub struct Extracted {
    pub files: u64,
    pub bytes_written: u64,
}

impl Executions {
    pub fn new(cfg: ExecConfig, sup: Arc<Supervisor>, workspace: PathBuf) -> Arc<Executions> {
        let slots = Arc::new(Semaphore::new(cfg.max_running));
        Arc::new(Executions {
            cfg,
            sup,
            workspace,
            mcp: Mutex::new(None),
            inner: Mutex::new(Inner::default()),
            slots,
        })
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

    /// Admits executions for `lease` (Acquire).
    pub fn open(&self, lease: &str, servers: &[String]) {
        let mut i = self.inner();
        i.generation += 1;
        i.lease = Some(LeaseInfo {
            id: lease.to_owned(),
            servers: servers.to_vec(),
        });
    }

    /// Kills every execution (whole process trees, in parallel) and removes
    /// every execution directory; no execution is admitted until the next
    /// [`Executions::open`]. Returns how many were running.
    pub async fn close(&self) -> usize {
        let execs: Vec<Arc<Execution>> = {
            let mut i = self.inner();
            i.generation += 1;
            i.lease = None;
            std::mem::take(&mut i.execs).into_values().collect()
        };
        let stopped = futures_util::future::join_all(execs.iter().map(|e| e.stop())).await;
        let killed = stopped.into_iter().filter(|k| *k).count();
        let root = self.cfg.root.clone();
        let removed = tokio::task::spawn_blocking(move || clear_dir(&root)).await;
        match removed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(root = %self.cfg.root.display(), error = %e, "removing execution directories")
            }
            Err(e) => tracing::warn!(error = %e, "the task removing execution directories failed"),
        }
        if killed > 0 {
            tracing::info!(killed, "running executions killed");
        }
        killed
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

    /// Begins storing an archive for `name`: checks the lease, the name and
    /// the count, and makes a staging directory.
    pub fn begin_upload(&self, lease_id: &str, name: &str) -> Result<Upload, ExecError> {
        check_name(name)?;
        let generation = {
            let i = self.inner();
            self.check_lease(&i, lease_id)?;
            if !i.execs.contains_key(name) && i.execs.len() >= self.cfg.max_executions {
                return Err(ExecError::TooMany {
                    max: self.cfg.max_executions,
                });
            }
            i.generation
        };
        std::fs::create_dir_all(&self.cfg.root).map_err(io_err(format!(
            "creating exec.root {}",
            self.cfg.root.display()
        )))?;
        let mut rnd = [0u8; 8];
        let _ = getrandom::fill(&mut rnd);
        let stage = self
            .cfg
            .root
            .join(format!(".upload-{}-{}", name, hex::encode(rnd)));
        std::fs::create_dir_all(stage.join("work"))
            .map_err(io_err(format!("creating {}", stage.display())))?;
        Ok(Upload {
            name: name.to_owned(),
            generation,
            stage,
            committed: false,
        })
    }

    /// Extracts the archive read from `src` into the upload's staging
    /// directory and checks it holds `main.py`. Blocking.
    pub fn extract(
        &self,
        up: &Upload,
        src: impl Read + Send + 'static,
        compression: Compression,
    ) -> Result<Extracted, ExecError> {
        let work = up.stage.join("work");
        let dir =
            std::fs::File::open(&work).map_err(io_err(format!("opening {}", work.display())))?;
        let opts = extract::ExtractOptions {
            limits: &self.cfg.archive,
            compression,
            owner: None,
            merge: false,
        };
        let stats = extract::extract(src, dir.as_fd(), &opts).map_err(ExecError::Archive)?;
        let main = std::fs::symlink_metadata(work.join(MAIN_SCRIPT));
        if !main.is_ok_and(|m| m.is_file()) {
            return Err(ExecError::NoMain);
        }
        Ok(Extracted {
            files: stats.files,
            bytes_written: stats.bytes_written,
        })
    }

    /// Puts an extracted upload in place of any execution of its name,
    /// killing that one first if it runs.
    pub async fn commit_upload(&self, mut up: Upload) -> Result<Replaced, ExecError> {
        let old = {
            let i = self.inner();
            if i.generation != up.generation || i.lease.is_none() {
                return Err(ExecError::Released);
            }
            i.execs.get(&up.name).cloned()
        };
        let mut out = Replaced::default();
        if let Some(old) = &old {
            out.replaced = true;
            out.killed_running = old.stop().await;
        }
        let dir = self.cfg.root.join(&up.name);
        let stage = up.stage.clone();
        let target = dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            match std::fs::remove_dir_all(&target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::rename(&stage, &target)
        })
        .await
        .map_err(|e| ExecError::Io {
            context: "replacing the execution directory".into(),
            source: std::io::Error::other(e),
        })?
        .map_err(io_err(format!("putting the upload at {}", dir.display())))?;
        up.committed = true;
        let exec = Arc::new(Execution {
            name: up.name.clone(),
            dir,
            uploaded_at_ms: now_ms(),
            progress: Mutex::new(Progress {
                state: ExecState::Uploaded,
                message: String::new(),
                exit_code: None,
                signal: None,
                started_at_ms: 0,
                finished_at_ms: 0,
            }),
            log: Mutex::new(None),
            running: tokio::sync::Mutex::new(None),
        });
        let mut i = self.inner();
        if i.generation != up.generation {
            // Released meanwhile: close() may have missed the directory.
            let _ = std::fs::remove_dir_all(&exec.dir);
            return Err(ExecError::Released);
        }
        i.execs.insert(up.name.clone(), exec);
        Ok(out)
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
        let log_path = exec.dir.join("output.log");
        let log = Arc::new(
            ExecLog::create(&log_path, self.cfg.log_max_bytes)
                .map_err(io_err(format!("creating {}", log_path.display())))?,
        );
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
            mcp: self.mcp.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            servers,
            slots: self.slots.clone(),
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

    /// The current view of an execution, for followers.
    pub fn view_of(&self, lease_id: &str, name: &str) -> Result<ExecView, ExecError> {
        self.status(lease_id, name)
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
        let work = e.work();
        let dir =
            std::fs::File::open(&work).map_err(io_err(format!("opening {}", work.display())))?;
        let opts = pack::PackOptions {
            cancelled,
            ..Default::default()
        };
        pack::pack(dir.as_fd(), &opts, out).map_err(ExecError::Archive)
    }
}

/// Removes everything inside `dir` (which may not exist).
fn clear_dir(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let p = e?.path();
        let r = if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(e) = r
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_safe_path_components() {
        for ok in ["init", "eval_1", "demo-run", "a.b", "X"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        for bad in ["", ".", "..", "a/b", "a b", "é", long.as_str()] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn klavis_sees_four_statuses() {
        use ExecState::*;
        let k: Vec<_> = [Uploaded, Queued, Installing, Running, Completed, Failed]
            .map(ExecState::klavis)
            .to_vec();
        assert_eq!(
            k,
            [
                "pending",
                "pending",
                "running",
                "running",
                "completed",
                "failed"
            ]
        );
    }

    #[test]
    fn the_root_must_lie_outside_the_workspace() {
        let mut c = ExecConfig {
            root: "/ws/exec".into(),
            ..ExecConfig::default()
        };
        assert!(matches!(
            c.validate(Path::new("/ws")),
            Err(ExecConfigError::Overlap { .. })
        ));
        c.root = "/var/x".into();
        assert!(c.validate(Path::new("/ws")).is_ok());
        c.packages = "yes".into();
        assert!(c.validate(Path::new("/ws")).is_err());
    }
}
