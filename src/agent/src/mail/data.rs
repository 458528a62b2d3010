//! Loading and dumping the mailboxes in Klavis's `PosteEmailData` shape
//! (`{"users": {ADDRESS: {"emails": [...]}}}`), by the launcher's `load`
//! and `dump` over IMAP: flags, folders and dates go through Dovecot, so
//! a dump shows what the loaded data and the tools made of the mailboxes.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info};

use super::{Mail, MailError, STOP_GRACE, base_env, io, tail_text, write_private};
use crate::supervisor::job::{JobEnd, JobSpec};
use crate::supervisor::manifest::ResourceLimits;
use crate::supervisor::spawn::Exit;

/// The launcher's exit code for data it refuses.
const EXIT_INVALID: i32 = 2;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// What to load.
pub enum Load<'a> {
    /// A PosteEmailData JSON document.
    Json(&'a [u8]),
    /// The launcher's own sample mailbox (`init_default_data`).
    Default,
}

impl Mail {
    /// Loads mailboxes; returns the launcher's summary (`{"users": N,
    /// "emails": M}`). Bad data changes nothing (INVALID_ARGUMENT).
    pub async fn load(&self, what: Load<'_>) -> Result<String, MailError> {
        self.alive().await?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let file = self.def.dir.join(format!("load-{n}.json"));
        let mut args = vec!["load".into(), "--dir".into(), self.dir_arg()];
        match what {
            Load::Json(json) => {
                let size = json.len() as u64;
                if size > self.def.max_data_bytes {
                    return Err(MailError::TooLarge {
                        what: "data",
                        size,
                        limit: self.def.max_data_bytes,
                    });
                }
                serde_json::from_slice::<serde_json::Value>(json)
                    .map_err(|e| MailError::InvalidData(format!("not JSON: {e}")))?;
                write_private(&file, json).await?;
                args.extend(["--file".into(), file.display().to_string()]);
            }
            Load::Default => args.push("--default".into()),
        }
        let r = self.run("loading mailboxes", args).await;
        let _ = tokio::fs::remove_file(&file).await;
        r
    }

    /// Dumps every mailbox that holds mail, as PosteEmailData JSON.
    pub async fn dump(&self) -> Result<Vec<u8>, MailError> {
        self.alive().await?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let out = self.def.dir.join(format!("dump-{n}.json"));
        let args = vec![
            "dump".into(),
            "--dir".into(),
            self.dir_arg(),
            "--out".into(),
            out.display().to_string(),
        ];
        let r = async {
            self.run("dumping mailboxes", args).await?;
            let limit = self.def.max_data_bytes;
            let path = out.clone();
            tokio::task::spawn_blocking(move || {
                let f = std::fs::File::open(&path)
                    .map_err(io(format!("reading {}", path.display())))?;
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                if size > limit {
                    return Err(MailError::TooLarge {
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
            .map_err(|e| MailError::Failed {
                what: "reading the dump",
                detail: e.to_string(),
            })?
        }
        .await;
        let _ = tokio::fs::remove_file(&out).await;
        let _ = tokio::fs::remove_file(out.with_extension("json.part")).await;
        r
    }

    fn dir_arg(&self) -> String {
        self.def.dir.display().to_string()
    }

    /// Runs the launcher once, within op_timeout; its output is the answer
    /// (success) or the error's detail.
    async fn run(&self, what: &'static str, args: Vec<String>) -> Result<String, MailError> {
        let started = Instant::now();
        let spec = JobSpec {
            group: "mail-data".into(),
            command: self.def.command.clone(),
            args,
            env: base_env(),
            cwd: self.def.dir.clone(),
            limits: ResourceLimits::default(),
        };
        let span = tracing::info_span!("mail", op = what);
        let mut job = self
            .sup
            .spawn_job(&spec)
            .await
            .map_err(|e| MailError::Failed {
                what,
                detail: format!("cannot run {}: {e}", self.def.command),
            })?;
        let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let pump = job
            .take_output()
            .map(|fd| tokio::spawn(super::pump(fd, tail.clone()).instrument(span.clone())));
        let stop = CancellationToken::new();
        let timer = {
            let stop = stop.clone();
            let after = self.def.op_timeout;
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                stop.cancel();
            })
        };
        let end = job.wait(&stop, STOP_GRACE).await;
        timer.abort();
        if let Some(p) = pump {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), p).await;
        }
        let text = tail_text(&tail);
        match end {
            JobEnd::Exited(Exit::Code(0)) => {
                span.in_scope(|| info!(ms = started.elapsed().as_millis() as u64, "done"));
                Ok(text.lines().last().unwrap_or_default().to_owned())
            }
            JobEnd::Exited(Exit::Code(EXIT_INVALID)) => Err(MailError::InvalidData(
                strip(&text)
                    .trim_start_matches("invalid PosteEmailData: ")
                    .to_owned(),
            )),
            JobEnd::Exited(e) => Err(MailError::Failed {
                what,
                detail: format!("{e}: {}", strip(&text)),
            }),
            JobEnd::Stopped(_) => Err(MailError::Timeout {
                what,
                ms: self.def.op_timeout.as_millis(),
            }),
        }
    }
}

/// The launcher's last message without its `sandbox-mail: ` prefix.
fn strip(text: &str) -> &str {
    let last = text.lines().last().unwrap_or(text);
    last.strip_prefix("sandbox-mail: ").unwrap_or(last)
}
