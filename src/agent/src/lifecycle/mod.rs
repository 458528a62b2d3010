//! The sandbox lifecycle: one lease at a time, with the Klavis semantics.
//!
//! - **Acquire** checks the request against the manifest, places the
//!   benchmark's seed data, starts the servers and waits for readiness.
//!   On failure everything it did is undone and the sandbox stays idle.
//! - **Release** kills every execution, stops every server, deletes what the
//!   lease loaded through the operator's shared outside accounts, clears the
//!   workspace and the servers' state paths, and returns to idle. Idempotent.
//! - **Reset** goes back to the state right after Acquire, keeping the lease.
//! - **Narrow** hands a warm (pre-acquired) lease to a tenant: renamed,
//!   trimmed to the servers asked for; the rest stop after the answer.
//! - **TTL**: a timer releases the lease by itself (recorded as `is_ttl`).
//!
//! Operations are serialized by one async mutex; reads ([`Lifecycle::view`])
//! never wait for them.

mod acquire;
mod catalog;
mod discard;
mod error;
mod narrow;
mod release;
pub(crate) mod seed;
mod server_data;
mod servers;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use sandbox_client::limits::{DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, MIN_TTL_SECONDS};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::exec::Executions;
use crate::mail::{Account, Mail};
use crate::supervisor::manifest::{Benchmark, LaunchSpec, Manifest};
use crate::supervisor::{State, Supervisor};
use crate::workspace::{Fence, Workspace};

pub use acquire::{AcquireParams, Selection, Ttl};
pub use catalog::{Recorded, catalog_label};
pub use error::{LcError, MAX_LEASE_ID_LEN, ReadyError};
pub use narrow::{NarrowParams, Trim};
pub use servers::ServerView;

/// The most `server_data_max_bytes` may be: a dump travels in one gRPC
/// message.
pub const SERVER_DATA_MAX_BYTES_LIMIT: u64 = 256 << 20;

/// `[lifecycle]` in agent.toml.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Smallest TTL Acquire accepts. The Klavis API says 60; lower it only
    /// for tests.
    pub min_ttl_seconds: u32,
    /// Largest TTL Acquire accepts.
    pub max_ttl_seconds: u32,
    /// TTL when Acquire names none.
    pub default_ttl_seconds: u32,
    /// How long Acquire and Reset wait for all servers to become ready.
    pub ready_deadline_ms: u64,
    /// How long Release waits for a running workspace transfer to end
    /// before giving up (the client may retry; Release is idempotent).
    pub workspace_wait_ms: u64,
    /// Largest document a server's data_command loads or dumps.
    pub server_data_max_bytes: u64,
    /// How long one load or dump by a data_command may take.
    pub server_data_timeout_ms: u64,
    /// `[lifecycle.catalog]`: the discovery catalogs' bounds.
    pub catalog: crate::catalog::CatalogConfig,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            min_ttl_seconds: MIN_TTL_SECONDS,
            max_ttl_seconds: MAX_TTL_SECONDS,
            default_ttl_seconds: DEFAULT_TTL_SECONDS,
            ready_deadline_ms: 120_000,
            workspace_wait_ms: 30_000,
            server_data_max_bytes: 16 << 20,
            server_data_timeout_ms: 120_000,
            catalog: crate::catalog::CatalogConfig::default(),
        }
    }
}

impl LifecycleConfig {
    pub fn validate(&self) -> Result<(), LifecycleConfigError> {
        if self.min_ttl_seconds == 0 || self.min_ttl_seconds > self.max_ttl_seconds {
            return Err(LifecycleConfigError::MinTtl);
        }
        if !(self.min_ttl_seconds..=self.max_ttl_seconds).contains(&self.default_ttl_seconds) {
            return Err(LifecycleConfigError::DefaultTtl);
        }
        if self.ready_deadline_ms == 0
            || self.workspace_wait_ms == 0
            || self.server_data_timeout_ms == 0
            || self.catalog.record_timeout_ms == 0
        {
            return Err(LifecycleConfigError::ZeroWait);
        }
        if !(1..=SERVER_DATA_MAX_BYTES_LIMIT).contains(&self.server_data_max_bytes) {
            return Err(LifecycleConfigError::ServerDataBytes);
        }
        Ok(())
    }
}

/// A `[lifecycle]` setting out of its bounds.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleConfigError {
    #[error("lifecycle.min_ttl_seconds must be 1..=max_ttl_seconds")]
    MinTtl,
    #[error("lifecycle.default_ttl_seconds must lie between min_ttl_seconds and max_ttl_seconds")]
    DefaultTtl,
    #[error(
        "lifecycle.ready_deadline_ms, workspace_wait_ms, server_data_timeout_ms and catalog.record_timeout_ms must be greater than 0"
    )]
    ZeroWait,
    #[error("lifecycle.server_data_max_bytes must be 1..={SERVER_DATA_MAX_BYTES_LIMIT}")]
    ServerDataBytes,
}

/// A lease as the outside sees it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub id: String,
    pub benchmark: Option<Benchmark>,
    pub servers: Vec<String>,
    /// Per-server id within this lease (Klavis server `id`).
    pub server_ids: BTreeMap<String, String>,
    pub acquired_at_ms: u64,
    /// 0: no automatic release.
    pub ttl_seconds: u32,
    pub expires_at_ms: u64,
    pub test_account_email: String,
    /// With `Selection::All`: servers left out because the outside service
    /// they need is not configured, each with what is missing.
    pub skipped: Vec<(String, String)>,
    /// What the agent gave a server to reach a service it runs for the
    /// lease (the mail account), by server: Klavis's `auth_data`.
    pub auth_data: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// The servers start on first use ([`Lifecycle::start_on_use`]), and
    /// Reset brings them back to idle.
    pub lazy: bool,
}

#[derive(Debug, Clone)]
pub struct ReleaseRecord {
    pub lease_id: String,
    pub is_ttl: bool,
    pub at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStatus {
    Idle,
    Occupied,
    Error,
}

/// What GetInfo and List report.
#[derive(Debug, Clone)]
pub struct View {
    pub status: SandboxStatus,
    pub lease: Option<Lease>,
    pub last_release: Option<ReleaseRecord>,
}

/// How a leased server with a `data_command` reaches its outside service.
#[derive(Debug, Clone)]
struct Outside {
    /// The lease brought every credential the server requires (auth_data
    /// or env): the account is its own, whole. Else it is the operator's,
    /// which every lease shares: what the lease loads is recorded in its
    /// ledger, its dump shows only that, Release and Reset delete it.
    own: bool,
    /// The server's environment for its data tool (its credentials).
    env: BTreeMap<String, String>,
}

struct Current {
    lease: Lease,
    specs: Vec<LaunchSpec>,
    ttl: CancellationToken,
    /// Set when Reset failed to bring the servers back.
    broken: Option<String>,
    /// Every server started under this lease, narrowed away or not: the
    /// state paths Release empties. Servers never leased are not touched
    /// (their paths may not even be writable by this agent).
    started: Vec<String>,
    /// The lease's mail account while a server of the lease uses mail.
    mail: Option<Account>,
    /// Every server of the lease with a data tool, narrowed away or not.
    outside: BTreeMap<String, Outside>,
}

pub struct Lifecycle {
    manifest: Arc<Manifest>,
    sup: Arc<Supervisor>,
    ws: Arc<Workspace>,
    exec: Arc<Executions>,
    /// The mail service, when the manifest has `[mail]`.
    mail: Option<Arc<Mail>>,
    cfg: LifecycleConfig,
    /// Where the lease's ledgers of what it created through a shared
    /// outside account live (`<state_root>/server-data`, private).
    ledgers: std::path::PathBuf,
    /// Serializes Acquire, Release and Reset.
    op: tokio::sync::Mutex<()>,
    current: Mutex<Option<Current>>,
    /// The workspace directories each server of the lease's profile
    /// makes when it starts (`Lifecycle::start_spec`), as the benchmark's
    /// own launch does: never for a server that does not run.
    server_dirs: Mutex<std::collections::BTreeMap<String, Vec<std::path::PathBuf>>>,
    last_release: Mutex<Option<ReleaseRecord>>,
    /// What idle servers answer to discovery, as the host gave them.
    catalogs: crate::catalog::Catalogs,
    me: Weak<Lifecycle>,
}

/// The Klavis status of one server: `error` when it failed, else
/// `occupied` while it belongs to the lease, else `idle`. The sandbox is
/// `error` when any of its lease's servers is.
pub fn server_status(state: State, in_lease: bool) -> SandboxStatus {
    match (state, in_lease) {
        (State::Failed, _) => SandboxStatus::Error,
        (_, true) => SandboxStatus::Occupied,
        (_, false) => SandboxStatus::Idle,
    }
}

impl Lifecycle {
    pub fn new(
        manifest: Arc<Manifest>,
        sup: Arc<Supervisor>,
        ws: Arc<Workspace>,
        exec: Arc<Executions>,
        cfg: LifecycleConfig,
        ledgers: std::path::PathBuf,
    ) -> Arc<Lifecycle> {
        let mail = manifest
            .mail
            .clone()
            .map(|def| Arc::new(Mail::new(def, sup.clone())));
        Arc::new_cyclic(|me| Lifecycle {
            manifest,
            sup,
            ws,
            exec,
            mail,
            cfg,
            ledgers,
            op: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
            server_dirs: Mutex::new(Default::default()),
            last_release: Mutex::new(None),
            catalogs: crate::catalog::Catalogs::default(),
            me: me.clone(),
        })
    }

    /// The names of every server the manifest defines.
    pub fn catalog(&self) -> Vec<String> {
        self.manifest.names()
    }

    /// Where the manifest was read from.
    pub fn manifest_path(&self) -> &std::path::Path {
        &self.manifest.path
    }

    /// Current status, lease and last release. Never waits for an operation.
    pub fn view(&self) -> View {
        let cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let last_release = self
            .last_release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(c) = cur.as_ref() else {
            return View {
                status: SandboxStatus::Idle,
                lease: None,
                last_release,
            };
        };
        let failed = c.broken.is_some()
            || c.lease.servers.iter().any(|n| {
                self.sup
                    .status(n)
                    .is_ok_and(|s| server_status(s.state, true) == SandboxStatus::Error)
            });
        View {
            status: if failed {
                SandboxStatus::Error
            } else {
                SandboxStatus::Occupied
            },
            lease: Some(c.lease.clone()),
            last_release,
        }
    }

    /// Refuses a request bound to lease `lease` ([`sandbox_client::lease`])
    /// once that lease is not current; an unbound request (`""`) passes.
    /// Lease ids are never reused, so a lease current now was current
    /// all along since the request was admitted.
    pub fn check_lease(&self, lease: &str) -> Result<(), LcError> {
        if lease.is_empty() {
            return Ok(());
        }
        match self.current().as_ref() {
            Some(c) if c.lease.id == lease => Ok(()),
            _ => Err(LcError::LeaseEnded(lease.to_owned())),
        }
    }

    /// [`Self::check_lease`] as the workspace checks it: with the
    /// workspace claimed (a Release waits for the claim before the lease
    /// ends), before reading it and again before swapping in an archive
    /// whose last bytes came late. `None` for an unbound request.
    pub fn fence(&self, lease: &str) -> Option<Fence> {
        if lease.is_empty() {
            return None;
        }
        let (me, lease) = (self.me.clone(), lease.to_owned());
        Some(Fence::new(move || match me.upgrade() {
            Some(lc) => lc.check_lease(&lease).map_err(|e| e.to_string()),
            None => Err("the agent is stopping".into()),
        }))
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether server `name` gets a mail account.
    fn uses_mail(&self, name: &str) -> bool {
        self.manifest.get(name).is_some_and(|d| d.mail)
    }

    /// Stops the mail service (and empties its mailboxes), if there is one.
    async fn stop_mail(&self) {
        if let Some(m) = &self.mail {
            m.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_server_is_an_error_whether_leased_or_not() {
        assert_eq!(server_status(State::Failed, true), SandboxStatus::Error);
        assert_eq!(server_status(State::Failed, false), SandboxStatus::Error);
        assert_eq!(server_status(State::Ready, true), SandboxStatus::Occupied);
        assert_eq!(server_status(State::Backoff, true), SandboxStatus::Occupied);
        assert_eq!(server_status(State::Stopped, false), SandboxStatus::Idle);
    }
}
