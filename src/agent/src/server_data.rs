//! A server's own data (Klavis `POST/GET /local-sandbox/{server}/{id}/
//! initialize|dump`), loaded and dumped by a data tool: a program run as a
//! supervised job with the server's environment (its credentials), which
//! speaks the outside service's API or the sandbox's own (the mail
//! service's `sandbox-mail`, canvas's `canvas-data`).
//!
//! The contract: `TOOL load [BASE_ARGS] (--file DATA.json | --default)`
//! prints a one-line summary; `TOOL dump [BASE_ARGS] --out DATA.json`
//! writes the data. Exit 2: the data is refused (nothing was loaded);
//! 3: the service refused the credentials; 4: the service is unreachable.
//! The last line of output is the message.
//!
//! Each run has a [`RunDir`] of its own: a directory with a random name,
//! made by `mkdir` (never an existing one, never through a planted
//! symlink), mode 0700, its files created `O_EXCL|O_NOFOLLOW`, and removed
//! with everything in it after the run. Nothing goes to a predictable name
//! in a shared directory.
//!
//! Whose account the credentials open is the tool's to know:
//! `SANDBOX_DATA_ACCOUNT=own` (the lease brought them: a dump shows the
//! whole account, nothing is deleted) or `shared` (the operator's, which
//! every lease uses): then `SANDBOX_DATA_LEDGER` names the lease's ledger,
//! where a load records what it created, a dump shows only that, and
//! `TOOL cleanup [BASE_ARGS]` deletes it (Release, Reset).

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use crate::supervisor::Supervisor;
use crate::supervisor::job::{JobEnd, JobGroup, JobSpec, RunAs};
use crate::supervisor::manifest::ResourceLimits;
use crate::supervisor::spawn::Exit;

/// The tool's exit codes with a meaning (see the module docs).
const EXIT_INVALID: i32 = 2;
const EXIT_REFUSED: i32 = 3;
const EXIT_UNREACHABLE: i32 = 4;
/// A tool's output kept for the answer (its last bytes).
pub(crate) const TAIL_BYTES: usize = 8 << 10;
/// The variables that tell a tool whose account it works in.
pub const ACCOUNT_ENV: &str = "SANDBOX_DATA_ACCOUNT";
pub const LEDGER_ENV: &str = "SANDBOX_DATA_LEDGER";
/// Time between SIGTERM and SIGKILL when a tool overruns.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);
/// The data file a load reads, and the one a dump writes, in the run's
/// directory.
const LOAD_FILE: &str = "load.json";
const DUMP_FILE: &str = "dump.json";

/// What to load.
pub enum Load<'a> {
    /// A JSON document in the server's data shape.
    Json(&'a [u8]),
    /// The tool's own sample data (`init_default_data`).
    Default,
}

/// Why a load or dump failed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("invalid data: {0}")]
    InvalidData(String),
    #[error("the {what} is {size} bytes, over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{what} took longer than {ms} ms; it was stopped")]
    Timeout { what: &'static str, ms: u128 },
    #[error("{what}: the service refused: {detail}")]
    Refused { what: &'static str, detail: String },
    #[error("{what}: the service cannot be reached: {detail}")]
    Unreachable { what: &'static str, detail: String },
    #[error("{what} failed: {detail}")]
    Failed { what: &'static str, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DataError {
    let what = what.into();
    move |source| DataError::Io { what, source }
}

/// One server's data tool, ready to run.
pub struct DataTool {
    pub sup: Arc<Supervisor>,
    pub command: String,
    /// Arguments after the subcommand (e.g. `--dir DIR`).
    pub base_args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Where each run's private directory ([`RunDir`]) is made.
    pub parent: PathBuf,
    /// Who the tool runs as; each run's directory and files are theirs.
    pub run_as: RunAs,
    pub timeout: Duration,
    pub max_bytes: u64,
    /// The lease's ledger when the credentials are the operator's shared
    /// account; `None`: the lease's own account.
    pub ledger: Option<PathBuf>,
}

impl DataTool {
    /// The (uid, gid) the tool runs as, when not the agent's.
    fn owner(&self) -> Option<(u32, u32)> {
        let t = self.sup.tenant();
        match self.run_as {
            RunAs::Agent => None,
            RunAs::Tenant => t.uid().zip(t.gid()),
            RunAs::Service => t.service(),
        }
    }

    /// Loads `what`; returns the tool's summary. Refused data loads
    /// nothing (INVALID_ARGUMENT).
    pub async fn load(&self, what: Load<'_>) -> Result<String, DataError> {
        let mut args = vec!["load".to_owned()];
        args.extend(self.base_args.iter().cloned());
        if let Load::Json(json) = what {
            let size = json.len() as u64;
            if size > self.max_bytes {
                return Err(DataError::TooLarge {
                    what: "data",
                    size,
                    limit: self.max_bytes,
                });
            }
            serde_json::from_slice::<serde_json::Value>(json)
                .map_err(|e| DataError::InvalidData(format!("not JSON: {e}")))?;
        }
        let dir = RunDir::create(&self.parent, self.owner()).await?;
        let r = async {
            match what {
                Load::Json(json) => {
                    let file = dir.write_new(LOAD_FILE, json).await?;
                    args.extend(["--file".into(), file.display().to_string()]);
                }
                Load::Default => args.push("--default".into()),
            }
            self.run("loading data", args, dir.path()).await
        }
        .await;
        dir.remove().await;
        r
    }

    /// The data as JSON, at most `max_bytes`.
    pub async fn dump(&self) -> Result<Vec<u8>, DataError> {
        let dir = RunDir::create(&self.parent, self.owner()).await?;
        let out = dir.path().join(DUMP_FILE);
        let mut args = vec!["dump".to_owned()];
        args.extend(self.base_args.iter().cloned());
        args.extend(["--out".into(), out.display().to_string()]);
        let r = async {
            self.run("dumping data", args, dir.path()).await?;
            dir.read(DUMP_FILE, self.max_bytes).await
        }
        .await;
        dir.remove().await;
        r
    }

    /// Deletes what the lease's ledger records (shared account only);
    /// returns the tool's summary. A failure names what is left.
    pub async fn cleanup(&self) -> Result<String, DataError> {
        let mut args = vec!["cleanup".to_owned()];
        args.extend(self.base_args.iter().cloned());
        let dir = RunDir::create(&self.parent, self.owner()).await?;
        let r = self
            .run("deleting what the lease created", args, dir.path())
            .await;
        dir.remove().await;
        r
    }

    /// Runs the tool once, within the timeout; its last line of output is
    /// the answer (success) or the error's detail.
    async fn run(
        &self,
        what: &'static str,
        args: Vec<String>,
        cwd: &Path,
    ) -> Result<String, DataError> {
        let started = Instant::now();
        // Set last: the lease's own env cannot change the mode.
        let mut env = self.env.clone();
        env.remove(LEDGER_ENV);
        match &self.ledger {
            Some(l) => {
                env.insert(ACCOUNT_ENV.into(), "shared".into());
                env.insert(LEDGER_ENV.into(), l.display().to_string());
            }
            None => {
                env.insert(ACCOUNT_ENV.into(), "own".into());
            }
        }
        let spec = JobSpec {
            group: JobGroup::Service("server-data"),
            command: self.command.clone(),
            args,
            env,
            cwd: cwd.to_owned(),
            limits: ResourceLimits::default(),
            run_as: self.run_as,
        };
        let span = tracing::info_span!("server_data", op = what);
        let mut job = self
            .sup
            .spawn_job(&spec)
            .await
            .map_err(|e| DataError::Failed {
                what,
                detail: format!("cannot run {}: {e}", self.command),
            })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let pump = job
            .take_output()
            .map(|fd| tokio::spawn(pump(fd, tail.clone()).instrument(span.clone())));
        let stop = CancellationToken::new();
        let timer = {
            let stop = stop.clone();
            let after = self.timeout;
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                stop.cancel();
            })
        };
        let end = job.wait(&stop, STOP_GRACE).await;
        timer.abort();
        if let Some(p) = pump {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
        let text = tail_text(&tail);
        let last = last_line(&text).to_owned();
        match end {
            JobEnd::Exited(Exit::Code(0)) => {
                span.in_scope(|| info!(ms = started.elapsed().as_millis() as u64, "done"));
                Ok(last)
            }
            JobEnd::Exited(Exit::Code(EXIT_INVALID)) => Err(DataError::InvalidData(last)),
            JobEnd::Exited(Exit::Code(EXIT_REFUSED)) => {
                Err(DataError::Refused { what, detail: last })
            }
            JobEnd::Exited(Exit::Code(EXIT_UNREACHABLE)) => {
                Err(DataError::Unreachable { what, detail: last })
            }
            JobEnd::Exited(e) => Err(DataError::Failed {
                what,
                detail: format!("{e}: {last}"),
            }),
            JobEnd::Stopped(_) => Err(DataError::Timeout {
                what,
                ms: self.timeout.as_millis(),
            }),
        }
    }
}

/// The tool's last message without its `NAME: ` prefix or the
/// `invalid …: ` its own wording may add.
fn last_line(text: &str) -> &str {
    let last = text.lines().last().unwrap_or(text);
    let last = last.split_once(": ").map_or(last, |(prog, rest)| {
        let name = !prog.is_empty()
            && prog
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if name { rest } else { last }
    });
    last.strip_prefix("invalid ")
        .and_then(|r| r.split_once(": ").map(|(_, m)| m))
        .unwrap_or(last)
}

/// Collects a job's output: each line logged at debug, the last
/// TAIL_BYTES kept.
pub(crate) async fn pump(fd: OwnedFd, tail: Arc<Mutex<VecDeque<u8>>>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 8 << 10];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                for line in String::from_utf8_lossy(&buf[..n]).lines() {
                    tracing::debug!(target: "sandbox_agent::server_data::output", "{line}");
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend(&buf[..n]);
                let over = t.len().saturating_sub(TAIL_BYTES);
                t.drain(..over);
            }
        }
    }
}

pub(crate) fn tail_text(tail: &Mutex<VecDeque<u8>>) -> String {
    let t = tail.lock().unwrap_or_else(|p| p.into_inner());
    let (a, b) = t.as_slices();
    let s = String::from_utf8_lossy(&[a, b].concat()).trim().to_owned();
    if s.is_empty() {
        "(no output)".into()
    } else {
        s
    }
}

/// One data-tool run's private directory (see the module docs). Removed by
/// [`RunDir::remove`], or when dropped, with `sandbox_tree` (no recursion,
/// bounded descriptors: the tool runs as the tenant, which may leave a
/// chain of any depth there; `TempDir`'s removal recursed per level).
pub struct RunDir {
    dir: Option<PathBuf>,
    /// The directory itself, opened: files are made relative to it.
    fd: Arc<OwnedFd>,
    owner: Option<(u32, u32)>,
}

impl RunDir {
    /// Makes a new directory in `parent`: a random name, mode 0700, owned
    /// by `owner` (uid, gid) when given (set through the opened directory,
    /// never by a path that could be swapped), else by the agent.
    pub async fn create(parent: &Path, owner: Option<(u32, u32)>) -> Result<RunDir, DataError> {
        let p = parent.to_owned();
        blocking(
            format!("making a private directory in {}", parent.display()),
            move || {
                use std::os::unix::fs::PermissionsExt;
                let made = tempfile::Builder::new()
                    .prefix("sandbox-data-")
                    .permissions(std::fs::Permissions::from_mode(0o700))
                    .tempdir_in(&p)?;
                // Still empty and the agent's: removed by TempDir if this
                // fails; kept (for sandbox_tree's removal) only once it is
                // the tool's.
                let fd = open_dir(made.path())?;
                if let Some((uid, gid)) = owner {
                    rustix::fs::fchown(
                        &fd,
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                    )?;
                }
                Ok(RunDir {
                    dir: Some(made.keep()),
                    fd: Arc::new(fd),
                    owner,
                })
            },
        )
        .await
    }

    pub fn path(&self) -> &Path {
        self.dir.as_deref().unwrap_or(Path::new(""))
    }

    /// Writes `bytes` to a new file `name` (0600, `O_EXCL|O_NOFOLLOW`, the
    /// directory's owner); its path.
    pub async fn write_new(&self, name: &'static str, bytes: &[u8]) -> Result<PathBuf, DataError> {
        let path = self.path().join(name);
        let (fd, owner, b) = (self.fd.clone(), self.owner, bytes.to_vec());
        blocking(format!("writing {}", path.display()), move || {
            use rustix::fs::{Mode, OFlags};
            let f = rustix::fs::openat(
                &*fd,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            if let Some((uid, gid)) = owner {
                rustix::fs::fchown(
                    &f,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                )?;
            }
            std::io::Write::write_all(&mut std::fs::File::from(f), &b)
        })
        .await?;
        Ok(path)
    }

    /// Reads the regular file `name` the tool wrote (never through a
    /// symlink), at most `limit` bytes.
    pub async fn read(&self, name: &'static str, limit: u64) -> Result<Vec<u8>, DataError> {
        let path = self.path().join(name);
        let fd = self.fd.clone();
        let what = format!("reading {}", path.display());
        let opened = blocking(what.clone(), move || {
            use rustix::fs::{Mode, OFlags};
            let f = rustix::fs::openat(
                &*fd,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let f = std::fs::File::from(f);
            let md = f.metadata()?;
            if !md.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            Ok((f, md.len()))
        })
        .await;
        let (f, size) = opened?;
        if size > limit {
            return Err(DataError::TooLarge {
                what: "dump",
                size,
                limit,
            });
        }
        blocking(what, move || {
            let mut buf = Vec::with_capacity(size as usize);
            f.take(limit + 1).read_to_end(&mut buf)?;
            Ok(buf)
        })
        .await
    }

    /// Removes the directory and everything in it.
    pub async fn remove(mut self) {
        if let Some(d) = self.dir.take() {
            let _ = tokio::task::spawn_blocking(move || remove_run_dir(&d)).await;
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let Some(d) = self.dir.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || remove_run_dir(&d))),
            Err(_) => remove_run_dir(&d),
        }
    }
}

/// Removes a run's directory whatever the tool left in it (logged).
fn remove_run_dir(d: &Path) {
    if let Err(e) = sandbox_tree::remove_path(d) {
        tracing::warn!(dir = %d.display(), error = %e, "removing a data tool's directory");
    }
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Runs blocking file work off the runtime; its errors as [`DataError::Io`].
async fn blocking<T: Send + 'static>(
    what: String,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, DataError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(io(what)),
        Err(e) => Err(io(what)(std::io::Error::other(e))),
    }
}

/// Writes `bytes` to a new file at `path` (0600): `O_EXCL|O_NOFOLLOW`, so
/// an existing file or a planted symlink fails it instead of being written
/// through.
pub(crate) async fn write_new_file(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = path.to_owned();
    let b = bytes.to_vec();
    blocking(format!("writing {}", path.display()), move || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .mode(0o600)
            .open(&p)
            .and_then(|mut f| f.write_all(&b))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{RunDir, last_line};

    /// A tenant's tool leaves a 10,000-level chain in its run directory:
    /// removing it (dropped, or by `remove`) takes no stack per level. On
    /// a 128 KiB thread a removal that recursed (as `TempDir`'s did)
    /// overflows it and aborts the test binary.
    #[test]
    fn a_deep_chain_in_a_run_directory_is_removed_without_recursion() {
        let parent = tempfile::tempdir().expect("tempdir");
        let p = parent.path().to_owned();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for by_drop in [true, false] {
            let dir = rt.block_on(RunDir::create(&p, None)).expect("run dir");
            use rustix::fs::{Mode, OFlags};
            let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
            let mut fd = rustix::fs::open(dir.path(), flags, Mode::empty()).expect("open");
            for _ in 0..10_000 {
                rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).expect("mkdir");
                fd = rustix::fs::openat(&fd, "d", flags, Mode::empty()).expect("open");
            }
            drop(fd);
            let top = dir.path().to_owned();
            std::thread::Builder::new()
                .stack_size(128 << 10)
                .spawn(move || {
                    if by_drop {
                        drop(dir);
                    } else {
                        tokio::runtime::Builder::new_current_thread()
                            .build()
                            .expect("runtime")
                            .block_on(dir.remove());
                    }
                })
                .expect("thread")
                .join()
                .expect("the removal");
            assert!(!top.exists(), "{} is left", top.display());
        }
    }

    #[test]
    fn the_message_is_the_last_line_without_prefixes() {
        assert_eq!(
            last_line(
                "log\nsandbox-mail: invalid PosteEmailData: users['a'].emails[1].subject is required"
            ),
            "users['a'].emails[1].subject is required"
        );
        assert_eq!(
            last_line("canvas-data: Canvas answered 401"),
            "Canvas answered 401"
        );
        assert_eq!(
            last_line("{\"users\": 1, \"emails\": 2}"),
            "{\"users\": 1, \"emails\": 2}"
        );
    }
}
