//! The sandbox's mail service: Dovecot (IMAP, `dovecot-lda` delivery) and an SMTP
//! submission server for one local domain, run by the `sandbox-mail`
//! launcher as a supervised job while the lease has a server with
//! `mail = true` (poste_email_toolathlon). Every address of the domains it
//! serves (`[mail] domains`: Toolathlon's `mcp.com` and `mcp1.com` …
//! `mcp110.com`) is an account, with the lease's one random password; mail
//! to any other domain is refused, so nothing leaves the sandbox.
//!
//! [`Mail::start`] empties the service's directory, starts it and waits
//! until both ports accept; [`Mail::stop`] kills its process tree and
//! empties the directory (the mailboxes go with the lease). Loading and
//! dumping mailboxes in Klavis's `PosteEmailData` shape is [`data`].

mod data;

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::server_data::{DataError, STOP_GRACE, io, pump, tail_text, write_new_file};
use crate::supervisor::Supervisor;
use crate::supervisor::job::{JobEnd, JobGroup, JobSpec, RunAs};
use crate::supervisor::manifest::{MailDef, ResourceLimits, local_part_ok};

/// Why the mail service cannot do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("the mail service did not start: {why}")]
    Start { why: String },
    #[error("the mail service did not accept connections within {ms} ms; its output: {tail}")]
    NotReady { ms: u128, tail: String },
    #[error("the mail service is not running: no server of the lease uses mail")]
    NotRunning,
    #[error("the mail service exited during the lease: {tail}")]
    Exited { tail: String },
    #[error("{0}")]
    Data(#[from] DataError),
}

/// The lease's account: what a mail-using server is given as auth_data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub address: String,
    pub password: String,
    pub imap_port: u16,
    pub smtp_port: u16,
}

impl Account {
    /// The auth_data fields (emails-mcp's account file, and what Klavis's
    /// acquire answer carries for poste_email_toolathlon).
    pub fn auth_data(&self) -> BTreeMap<String, serde_json::Value> {
        use serde_json::json;
        BTreeMap::from([
            ("email".into(), json!(self.address)),
            ("password".into(), json!(self.password)),
            ("imap_server".into(), json!("127.0.0.1")),
            ("imap_port".into(), json!(self.imap_port)),
            ("smtp_server".into(), json!("127.0.0.1")),
            ("smtp_port".into(), json!(self.smtp_port)),
            ("use_ssl".into(), json!(false)),
            ("use_starttls".into(), json!(false)),
        ])
    }
}

struct Running {
    account: Account,
    stop: CancellationToken,
    task: JoinHandle<JobEnd>,
    tail: Arc<Mutex<VecDeque<u8>>>,
}

/// The mail service of one agent (at most one instance at a time).
pub struct Mail {
    def: MailDef,
    sup: Arc<Supervisor>,
    running: tokio::sync::Mutex<Option<Running>>,
}

impl Mail {
    pub fn new(def: MailDef, sup: Arc<Supervisor>) -> Mail {
        Mail {
            def,
            sup,
            running: tokio::sync::Mutex::new(None),
        }
    }

    pub fn domain(&self) -> &str {
        &self.def.domain
    }

    /// The lease's address: its test_account_email when that is an address
    /// of a domain the service serves, else the configured account.
    pub fn address_for(&self, test_account_email: &str) -> String {
        match test_account_email.rsplit_once('@') {
            Some((local, dom)) if self.def.serves(dom) && local_part_ok(local) => {
                format!("{local}@{dom}").to_ascii_lowercase()
            }
            _ => format!("{}@{}", self.def.account, self.def.domain),
        }
    }

    /// A new account for a lease: `address`, a random password, and the
    /// ports the service will listen on.
    pub fn new_account(&self, address: String) -> Result<Account, MailError> {
        let password = sandbox_client::random::hex_token(18).map_err(|e| MailError::Start {
            why: format!("making the password: {e}"),
        })?;
        Ok(Account {
            address,
            password,
            imap_port: port_or_free(self.def.imap_port)?,
            smtp_port: port_or_free(self.def.smtp_port)?,
        })
    }

    /// The running service's account.
    pub async fn account(&self) -> Option<Account> {
        self.running
            .lock()
            .await
            .as_ref()
            .map(|r| r.account.clone())
    }

    /// Starts the service for `account` with empty mailboxes (stopping and
    /// emptying a running one first) and waits until it accepts.
    pub async fn start(&self, account: &Account) -> Result<(), MailError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.take() {
            stop_running(r).await;
        }
        let span = tracing::info_span!("mail", domain = %self.def.domain);
        let r = self.launch(account).instrument(span.clone()).await;
        match r {
            Ok(r) => {
                *running = Some(r);
                Ok(())
            }
            Err(e) => {
                let _ = empty_dir(&self.def.dir).await;
                Err(e)
            }
        }
    }

    async fn launch(&self, account: &Account) -> Result<Running, MailError> {
        let dir = &self.def.dir;
        empty_dir(dir).await?;
        write_new_file(&dir.join("password"), account.password.as_bytes()).await?;
        let spec = JobSpec {
            group: JobGroup::Service("mail"),
            command: self.def.command.clone(),
            args: vec![
                "serve".into(),
                "--dir".into(),
                dir.display().to_string(),
                "--domains".into(),
                self.def.domains.join(","),
                "--dump-attachment-max-bytes".into(),
                self.def.dump_attachment_max_bytes.to_string(),
                "--imap-port".into(),
                account.imap_port.to_string(),
                "--smtp-port".into(),
                account.smtp_port.to_string(),
                "--max-message-bytes".into(),
                self.def.max_message_bytes.to_string(),
            ],
            env: base_env(),
            cwd: dir.clone(),
            limits: ResourceLimits::default(),
            run_as: RunAs::Agent,
        };
        let mut job = self
            .sup
            .spawn_job(&spec)
            .await
            .map_err(|e| MailError::Start {
                why: format!("cannot run {}: {e}", self.def.command),
            })?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(fd) = job.take_output() {
            tokio::spawn(pump(fd, tail.clone()).in_current_span());
        }
        let stop = CancellationToken::new();
        let st = stop.clone();
        let mut task = tokio::spawn(async move { job.wait(&st, STOP_GRACE).await });
        let started = Instant::now();
        let ready_file = dir.join("service.json");
        loop {
            if task.is_finished() {
                let end = (&mut task).await;
                tokio::time::sleep(Duration::from_millis(50)).await; // the last output
                return Err(MailError::Start {
                    why: format!("it exited ({}): {}", describe(end), tail_text(&tail)),
                });
            }
            if tokio::fs::try_exists(&ready_file).await.unwrap_or(false)
                && accepts(account.imap_port).await
                && accepts(account.smtp_port).await
            {
                break;
            }
            if started.elapsed() >= self.def.ready_timeout {
                stop.cancel();
                let _ = task.await;
                return Err(MailError::NotReady {
                    ms: self.def.ready_timeout.as_millis(),
                    tail: tail_text(&tail),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        info!(
            address = %account.address,
            imap = account.imap_port,
            smtp = account.smtp_port,
            ms = started.elapsed().as_millis() as u64,
            "mail service ready"
        );
        Ok(Running {
            account: account.clone(),
            stop,
            task,
            tail,
        })
    }

    /// Stops the service and empties its directory. Idempotent.
    pub async fn stop(&self) {
        let mut running = self.running.lock().await;
        if let Some(r) = running.take() {
            stop_running(r).await;
            info!(domain = %self.def.domain, "mail service stopped");
        }
        if let Err(e) = empty_dir(&self.def.dir).await {
            warn!(error = %e, "emptying the mail service's directory");
        }
    }

    /// Whether the service is still running (it stops only with the lease).
    pub async fn alive(&self) -> Result<(), MailError> {
        match self.running.lock().await.as_ref() {
            None => Err(MailError::NotRunning),
            Some(r) if r.task.is_finished() => Err(MailError::Exited {
                tail: tail_text(&r.tail),
            }),
            Some(_) => Ok(()),
        }
    }
}

async fn stop_running(r: Running) {
    r.stop.cancel();
    if let Err(e) = r.task.await {
        warn!(error = %e, "the mail service's wait task failed");
    }
}

fn describe(end: Result<JobEnd, tokio::task::JoinError>) -> String {
    match end {
        Ok(JobEnd::Exited(e)) | Ok(JobEnd::Stopped(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

/// A fixed port, or a free loopback port for 0.
fn port_or_free(port: u16) -> Result<u16, MailError> {
    if port != 0 {
        return Ok(port);
    }
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| MailError::Start {
            why: format!("no free loopback port: {e}"),
        })
}

async fn accepts(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
}

/// The sandbox's base for the launcher (its PATH has /usr/sbin, where it
/// finds Dovecot); never the agent's own environment.
fn base_env() -> BTreeMap<String, String> {
    crate::tenant::env::base()
}

/// Empties `dir` (creating it): the mailboxes never outlive their lease.
async fn empty_dir(dir: &Path) -> Result<(), DataError> {
    let d = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        sandbox_tree::remove_path(&d).map_err(std::io::Error::from)?;
        std::fs::create_dir_all(&d)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711))
    })
    .await
    .map_err(|e| io(format!("emptying {}", dir.display()))(std::io::Error::other(e)))?
    .map_err(io(format!("emptying {}", dir.display())))
}
