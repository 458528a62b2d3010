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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use crate::supervisor::Supervisor;
use crate::supervisor::job::{JobEnd, JobSpec};
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

static SEQ: AtomicU64 = AtomicU64::new(0);

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
    /// Where the data files go (private, removed after each run).
    pub dir: PathBuf,
    pub timeout: Duration,
    pub max_bytes: u64,
    /// The lease's ledger when the credentials are the operator's shared
    /// account; `None`: the lease's own account.
    pub ledger: Option<PathBuf>,
}

impl DataTool {
    /// Loads `what`; returns the tool's summary. Refused data loads
    /// nothing (INVALID_ARGUMENT).
    pub async fn load(&self, what: Load<'_>) -> Result<String, DataError> {
        let file = self.file("load");
        let mut args = vec!["load".to_owned()];
        args.extend(self.base_args.iter().cloned());
        match what {
            Load::Json(json) => {
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
                write_private(&file, json).await?;
                args.extend(["--file".into(), file.display().to_string()]);
            }
            Load::Default => args.push("--default".into()),
        }
        let r = self.run("loading data", args).await;
        let _ = tokio::fs::remove_file(&file).await;
        r
    }

    /// The data as JSON, at most `max_bytes`.
    pub async fn dump(&self) -> Result<Vec<u8>, DataError> {
        let out = self.file("dump");
        let mut args = vec!["dump".to_owned()];
        args.extend(self.base_args.iter().cloned());
        args.extend(["--out".into(), out.display().to_string()]);
        let r = async {
            self.run("dumping data", args).await?;
            let limit = self.max_bytes;
            let path = out.clone();
            tokio::task::spawn_blocking(move || {
                let f = std::fs::File::open(&path)
                    .map_err(io(format!("reading {}", path.display())))?;
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                if size > limit {
                    return Err(DataError::TooLarge {
                        what: "dump",
                        size,
                        limit,
                    });
                }
                let mut buf = Vec::with_capacity(size as usize);
                f.take(limit + 1)
                    .read_to_end(&mut buf)
                    .map_err(io(format!("reading {}", path.display())))?;
                Ok(buf)
            })
            .await
            .map_err(|e| DataError::Failed {
                what: "reading the dump",
                detail: e.to_string(),
            })?
        }
        .await;
        let _ = tokio::fs::remove_file(&out).await;
        let _ = tokio::fs::remove_file(out.with_extension("json.part")).await;
        r
    }

    /// Deletes what the lease's ledger records (shared account only);
    /// returns the tool's summary. A failure names what is left.
    pub async fn cleanup(&self) -> Result<String, DataError> {
        let mut args = vec!["cleanup".to_owned()];
        args.extend(self.base_args.iter().cloned());
        self.run("deleting what the lease created", args).await
    }

    fn file(&self, what: &str) -> PathBuf {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{what}-{}-{n}.json", std::process::id()))
    }

    /// Runs the tool once, within the timeout; its last line of output is
    /// the answer (success) or the error's detail.
    async fn run(&self, what: &'static str, args: Vec<String>) -> Result<String, DataError> {
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
            group: "server-data".into(),
            command: self.command.clone(),
            args,
            env,
            cwd: self.dir.clone(),
            limits: ResourceLimits::default(),
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

pub(crate) async fn write_private(path: &Path, bytes: &[u8]) -> Result<(), DataError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = path.to_owned();
    let b = bytes.to_vec();
    tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .and_then(|mut f| f.write_all(&b))
    })
    .await
    .map_err(|e| DataError::Io {
        what: format!("writing {}", path.display()),
        source: std::io::Error::other(e),
    })?
    .map_err(io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::last_line;

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
