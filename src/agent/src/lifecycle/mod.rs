//! The sandbox lifecycle: one lease at a time, with the Klavis semantics.
//!
//! - **Acquire** checks the request against the manifest, places the
//!   benchmark's seed data, starts the servers and waits for readiness.
//!   On failure everything it did is undone and the sandbox stays idle.
//! - **Release** stops every server, clears the workspace and the servers'
//!   state paths, and returns to idle. Idempotent.
//! - **Reset** goes back to the state right after Acquire, keeping the lease.
//! - **TTL**: a timer releases the lease by itself (recorded as `is_ttl`).
//!
//! Operations are serialized by one async mutex; reads ([`Lifecycle::view`])
//! never wait for them.

mod seed;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::supervisor::manifest::{Benchmark, Credentials, LaunchSpec, Manifest};
use crate::supervisor::{State, Supervisor, now_ms};
use crate::workspace::{Workspace, WsError};

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
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            min_ttl_seconds: 60,
            max_ttl_seconds: 86_400,
            default_ttl_seconds: 7_200,
            ready_deadline_ms: 120_000,
            workspace_wait_ms: 30_000,
        }
    }
}

impl LifecycleConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.min_ttl_seconds == 0 || self.min_ttl_seconds > self.max_ttl_seconds {
            return Err("lifecycle.min_ttl_seconds must be 1..=max_ttl_seconds".into());
        }
        if !(self.min_ttl_seconds..=self.max_ttl_seconds).contains(&self.default_ttl_seconds) {
            return Err(
                "lifecycle.default_ttl_seconds must lie between min_ttl_seconds and max_ttl_seconds"
                    .into(),
            );
        }
        if self.ready_deadline_ms == 0 || self.workspace_wait_ms == 0 {
            return Err(
                "lifecycle.ready_deadline_ms and workspace_wait_ms must be greater than 0".into(),
            );
        }
        Ok(())
    }
}

/// Lifecycle errors; each maps to one gRPC status code in `agent::rpc`.
#[derive(Debug, thiserror::Error)]
pub enum LcError {
    /// INVALID_ARGUMENT
    #[error("{0}")]
    Invalid(String),
    /// FAILED_PRECONDITION
    #[error("{0}")]
    Precondition(String),
    /// NOT_FOUND
    #[error("{0}")]
    NotFound(String),
    /// UNAVAILABLE: a server did not become ready.
    #[error("{0}")]
    NotReady(String),
    /// A workspace step failed (mapped like the Workspace service's errors).
    #[error("{0}")]
    Workspace(#[from] WsError),
    /// INTERNAL
    #[error("{0}")]
    Internal(String),
}

/// Which servers to acquire.
#[derive(Debug, Clone)]
pub enum Selection {
    All,
    Names(Vec<String>),
}

/// The TTL of an Acquire.
#[derive(Debug, Clone, Copy)]
pub enum Ttl {
    /// The configured default (Klavis: 7200 s).
    Default,
    /// No automatic release (Klavis `ttl_seconds: null`).
    Never,
    Seconds(u32),
}

#[derive(Debug, Clone)]
pub struct AcquireParams {
    pub lease_id: String,
    pub servers: Selection,
    pub benchmark: Option<Benchmark>,
    pub ttl: Ttl,
    pub test_account_email: String,
    pub credentials: BTreeMap<String, Credentials>,
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

struct Current {
    lease: Lease,
    specs: Vec<LaunchSpec>,
    ttl: CancellationToken,
    /// Set when Reset failed to bring the servers back.
    broken: Option<String>,
}

pub struct Lifecycle {
    manifest: Arc<Manifest>,
    sup: Arc<Supervisor>,
    ws: Arc<Workspace>,
    cfg: LifecycleConfig,
    /// Serializes Acquire, Release and Reset.
    op: tokio::sync::Mutex<()>,
    current: Mutex<Option<Current>>,
    last_release: Mutex<Option<ReleaseRecord>>,
    me: Weak<Lifecycle>,
}

fn valid_lease_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn random_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // Only identifies a server within a lease; uniqueness, not secrecy.
        b[..8].copy_from_slice(&now_ms().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Lifecycle {
    pub fn new(
        manifest: Arc<Manifest>,
        sup: Arc<Supervisor>,
        ws: Arc<Workspace>,
        cfg: LifecycleConfig,
    ) -> Arc<Lifecycle> {
        Arc::new_cyclic(|me| Lifecycle {
            manifest,
            sup,
            ws,
            cfg,
            op: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
            last_release: Mutex::new(None),
            me: me.clone(),
        })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.sup
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
            || c.lease
                .servers
                .iter()
                .any(|n| self.sup.status(n).is_ok_and(|s| s.state == State::Failed));
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

    /// The launch spec a server runs with now: the lease's if it belongs to
    /// it, else the manifest default (no benchmark, no credentials).
    pub fn spec_for(&self, name: &str) -> Result<LaunchSpec, LcError> {
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            && let Some(s) = c.specs.iter().find(|s| s.name == name)
        {
            return Ok(s.clone());
        }
        let def = self
            .manifest
            .get(name)
            .ok_or_else(|| self.unknown(&[name]))?;
        def.launch(None, &Credentials::default(), &|k| std::env::var(k).ok())
            .map_err(|e| LcError::Precondition(e.0))
    }

    fn unknown(&self, names: &[&str]) -> LcError {
        LcError::Invalid(format!(
            "unknown server{} {}; this sandbox's manifest ({}) has: {}",
            if names.len() > 1 { "s" } else { "" },
            names.join(", "),
            self.manifest.path.display(),
            self.manifest.names().join(", ")
        ))
    }

    pub async fn acquire(&self, p: AcquireParams) -> Result<(Lease, SandboxStatus), LcError> {
        let _op = self.op.lock().await;
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Err(LcError::Precondition(format!(
                "the sandbox is already leased (lease {}, acquired at {} ms); Release it before acquiring again",
                c.lease.id, c.lease.acquired_at_ms
            )));
        }
        if !valid_lease_id(&p.lease_id) {
            return Err(LcError::Invalid(
                "lease_id must be 1-128 characters of A-Z, a-z, 0-9, '.', '_' and '-'".into(),
            ));
        }
        let names: Vec<String> = match &p.servers {
            Selection::All => self.manifest.names(),
            Selection::Names(n) => {
                let mut out: Vec<String> = Vec::new();
                for name in n {
                    if !out.contains(name) {
                        out.push(name.clone());
                    }
                }
                out
            }
        };
        if names.is_empty() {
            return Err(LcError::Invalid(match p.servers {
                Selection::All => "the manifest has no servers to acquire".into(),
                Selection::Names(_) => {
                    "name at least one server in server_names, or ask for all".into()
                }
            }));
        }
        let unknown: Vec<&str> = names
            .iter()
            .filter(|n| self.manifest.get(n).is_none())
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(self.unknown(&unknown));
        }
        let ttl_seconds = match p.ttl {
            Ttl::Default => self.cfg.default_ttl_seconds,
            Ttl::Never => 0,
            Ttl::Seconds(s) => {
                if !(self.cfg.min_ttl_seconds..=self.cfg.max_ttl_seconds).contains(&s) {
                    return Err(LcError::Invalid(format!(
                        "ttl_seconds must be between {} and {} (or absent for the default of {}, or 0 for none); got {s}",
                        self.cfg.min_ttl_seconds,
                        self.cfg.max_ttl_seconds,
                        self.cfg.default_ttl_seconds
                    )));
                }
                s
            }
        };
        if let Some(extra) = p.credentials.keys().find(|k| !names.contains(k)) {
            return Err(LcError::Invalid(format!(
                "auth_data/env given for {extra:?}, which is not one of the servers acquired ({})",
                names.join(", ")
            )));
        }
        let mut specs = Vec::new();
        for name in &names {
            let def = self
                .manifest
                .get(name)
                .ok_or_else(|| self.unknown(&[name]))?;
            let creds = p.credentials.get(name).cloned().unwrap_or_default();
            let spec = def
                .launch(p.benchmark, &creds, &|k| std::env::var(k).ok())
                .map_err(|e| LcError::Precondition(e.0))?;
            specs.push(spec);
        }
        let span = tracing::info_span!("acquire", lease = %p.lease_id);
        let started = Instant::now();
        async {
            let seeded = self.prepare(&names, p.benchmark).await;
            let r = match seeded {
                Ok(()) => self.start_and_wait(&specs).await,
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                warn!(error = %e, "acquire failed; undoing it");
                self.teardown(&names, true).await;
                return Err(e);
            }
            Ok(())
        }
        .instrument(span.clone())
        .await?;
        let now = now_ms();
        let lease = Lease {
            id: p.lease_id.clone(),
            benchmark: p.benchmark,
            server_ids: names.iter().map(|n| (n.clone(), random_id())).collect(),
            servers: names,
            acquired_at_ms: now,
            ttl_seconds,
            expires_at_ms: if ttl_seconds == 0 {
                0
            } else {
                now + u64::from(ttl_seconds) * 1000
            },
            test_account_email: p.test_account_email,
        };
        let ttl = CancellationToken::new();
        if ttl_seconds > 0 {
            self.arm_ttl(
                lease.id.clone(),
                Duration::from_secs(ttl_seconds.into()),
                ttl.clone(),
            );
        }
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Current {
            lease: lease.clone(),
            specs,
            ttl,
            broken: None,
        });
        span.in_scope(|| {
            info!(
                servers = %lease.servers.join(","),
                ms = started.elapsed().as_millis() as u64,
                ttl_seconds,
                "acquired"
            )
        });
        Ok((lease, self.view().status))
    }

    fn arm_ttl(&self, lease_id: String, after: Duration, cancel: CancellationToken) {
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => {}
                _ = cancel.cancelled() => return,
            }
            let Some(lc) = me.upgrade() else { return };
            info!(lease = %lease_id, "TTL expired; releasing");
            if let Err(e) = lc.release(&lease_id, true).await {
                warn!(lease = %lease_id, error = %e, "TTL release failed");
            }
        });
    }

    /// Releases the lease. Returns the message to show.
    pub async fn release(&self, lease_id: &str, is_ttl: bool) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        let cur_id = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.lease.id.clone());
        let Some(cur_id) = cur_id else {
            let last = self
                .last_release
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            return match last {
                _ if lease_id.is_empty() => Ok("the sandbox is already idle".into()),
                Some(r) if r.lease_id == lease_id => Ok(format!(
                    "lease {lease_id} was already released{}",
                    if r.is_ttl {
                        " when its TTL expired"
                    } else {
                        ""
                    }
                )),
                _ => Err(LcError::NotFound(format!(
                    "no lease {lease_id:?}: the sandbox is idle"
                ))),
            };
        };
        if !lease_id.is_empty() && lease_id != cur_id {
            return Err(LcError::NotFound(format!(
                "no lease {lease_id:?}: the sandbox is leased as {cur_id:?}"
            )));
        }
        let span = tracing::info_span!("release", lease = %cur_id, is_ttl);
        let started = Instant::now();
        let all = self.manifest.names();
        async {
            self.sup.stop_all().await;
            self.wipe(&all, true).await
        }
        .instrument(span.clone())
        .await?;
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            c.ttl.cancel();
        }
        for n in &all {
            self.sup.forget(n);
        }
        *self.last_release.lock().unwrap_or_else(|p| p.into_inner()) = Some(ReleaseRecord {
            lease_id: cur_id.clone(),
            is_ttl,
            at_ms: now_ms(),
        });
        span.in_scope(|| info!(ms = started.elapsed().as_millis() as u64, "released"));
        Ok(format!(
            "lease {cur_id} released{}; the sandbox is idle",
            if is_ttl { " (TTL expired)" } else { "" }
        ))
    }

    /// Back to the state right after Acquire, keeping the lease.
    pub async fn reset(&self, lease_id: &str) -> Result<(Lease, SandboxStatus), LcError> {
        let _op = self.op.lock().await;
        let (lease, specs) = {
            let cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
            match cur.as_ref() {
                None => {
                    return Err(LcError::Precondition(
                        "the sandbox is idle; there is no lease to reset".into(),
                    ));
                }
                Some(c) if !lease_id.is_empty() && c.lease.id != lease_id => {
                    return Err(LcError::NotFound(format!(
                        "no lease {lease_id:?}: the sandbox is leased as {:?}",
                        c.lease.id
                    )));
                }
                Some(c) => (c.lease.clone(), c.specs.clone()),
            }
        };
        let span = tracing::info_span!("reset", lease = %lease.id);
        let r = async {
            self.sup.stop_all().await;
            for n in &lease.servers {
                self.sup.forget(n);
            }
            self.prepare(&lease.servers, lease.benchmark).await?;
            self.start_and_wait(&specs).await
        }
        .instrument(span)
        .await;
        if let Some(c) = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            c.broken = r.as_ref().err().map(|e| e.to_string());
        }
        r?;
        Ok((lease, self.view().status))
    }

    /// Clears the workspace and state paths, then places the seed data.
    async fn prepare(&self, names: &[String], benchmark: Option<Benchmark>) -> Result<(), LcError> {
        self.wipe(names, true).await?;
        let seeds: Vec<_> = names
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.seeds(benchmark).iter().cloned())
            .collect();
        if seeds.is_empty() {
            return Ok(());
        }
        let ws = self.ws.clone();
        tokio::task::spawn_blocking(move || {
            for s in &seeds {
                seed::place(&ws, s).map_err(|e| {
                    LcError::Internal(format!("placing seed data {}: {e}", s.from.display()))
                })?;
            }
            Ok(())
        })
        .await
        .map_err(|e| LcError::Internal(format!("the seeding task failed: {e}")))?
    }

    /// Wipes the state paths of `names` and, with `workspace`, clears the
    /// workspace (waiting for a running transfer up to workspace_wait_ms).
    async fn wipe(&self, names: &[String], workspace: bool) -> Result<(), LcError> {
        let paths: Vec<_> = names
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .collect();
        let ws = self.ws.clone();
        let wait = Duration::from_millis(self.cfg.workspace_wait_ms);
        let deadline = Instant::now() + wait;
        let guard = if workspace {
            loop {
                match ws.begin("Clear") {
                    Ok(g) => break Some(g),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(LcError::Workspace(WsError::Busy(format!(
                            "waited {} s for the workspace: {e}",
                            wait.as_secs()
                        ))));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        } else {
            None
        };
        tokio::task::spawn_blocking(move || {
            for p in &paths {
                seed::wipe(p).map_err(|e| {
                    LcError::Internal(format!("wiping state path {}: {e}", p.display()))
                })?;
            }
            if let Some(g) = guard {
                ws.clear()?;
                drop(g);
            }
            Ok(())
        })
        .await
        .map_err(|e| LcError::Internal(format!("the wipe task failed: {e}")))?
    }

    /// Stops the servers of a failed Acquire and wipes what it placed.
    async fn teardown(&self, names: &[String], workspace: bool) {
        for n in names {
            let _ = self.sup.stop(n, None).await;
            self.sup.forget(n);
        }
        if let Err(e) = self.wipe(names, workspace).await {
            warn!(error = %e, "cleaning up after a failed acquire");
        }
    }

    /// Starts every server and waits until all are ready, one fails, or
    /// the deadline passes.
    async fn start_and_wait(&self, specs: &[LaunchSpec]) -> Result<(), LcError> {
        for s in specs {
            self.sup
                .start(s.clone())
                .await
                .map_err(|e| LcError::Invalid(e.to_string()))?;
        }
        let deadline = Duration::from_millis(self.cfg.ready_deadline_ms);
        let waits = specs.iter().map(|s| self.wait_ready(&s.name, deadline));
        let results = futures_util::future::join_all(waits).await;
        let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(LcError::NotReady(failures.join("\n")))
        }
    }

    async fn wait_ready(&self, name: &str, deadline: Duration) -> Result<(), String> {
        let settled = self
            .sup
            .wait_settled(name, deadline)
            .await
            .map_err(|e| e.to_string())?;
        let tail = || {
            let t = self.sup.stderr_tail(name);
            if t.is_empty() {
                String::new()
            } else {
                format!("; stderr tail:\n{t}")
            }
        };
        match settled {
            Some(s) if s.state == State::Ready => Ok(()),
            Some(s) => Err(format!(
                "server {name} did not become ready: {}{}",
                if s.message.is_empty() {
                    "it exited".to_owned()
                } else {
                    s.message.clone()
                },
                tail()
            )),
            None => {
                let now = self.sup.status(name).map_err(|e| e.to_string())?;
                Err(format!(
                    "server {name} was not ready within {} ms (state {:?}, {}){}",
                    deadline.as_millis(),
                    now.state,
                    now.message,
                    tail()
                ))
            }
        }
    }

    fn known(&self, name: &str) -> Result<(), LcError> {
        if self.manifest.get(name).is_some() {
            Ok(())
        } else {
            Err(LcError::NotFound(format!(
                "no server named {name:?}; this sandbox's manifest has: {}",
                self.manifest.names().join(", ")
            )))
        }
    }

    /// Servers.Start: starts one server (with the lease's settings if it
    /// belongs to the lease) and waits for it to be ready.
    pub async fn start_server(&self, name: &str) -> Result<crate::supervisor::Status, LcError> {
        self.known(name)?;
        let _op = self.op.lock().await;
        let spec = self.spec_for(name)?;
        let wait = spec.ready_timeout + Duration::from_secs(1);
        self.sup
            .start(spec)
            .await
            .map_err(|e| LcError::NotFound(e.to_string()))?;
        self.wait_ready(name, wait)
            .await
            .map_err(LcError::NotReady)?;
        self.sup
            .status(name)
            .map_err(|e| LcError::NotFound(e.to_string()))
    }

    /// Servers.Stop.
    pub async fn stop_server(
        &self,
        name: &str,
        grace: Option<Duration>,
    ) -> Result<crate::supervisor::Status, LcError> {
        self.known(name)?;
        let _op = self.op.lock().await;
        self.sup
            .stop(name, grace)
            .await
            .map_err(|e| LcError::NotFound(e.to_string()))
    }

    /// Servers.Restart: stop, then start with a fresh restart counter.
    pub async fn restart_server(&self, name: &str) -> Result<crate::supervisor::Status, LcError> {
        self.known(name)?;
        {
            let _op = self.op.lock().await;
            self.sup
                .stop(name, None)
                .await
                .map_err(|e| LcError::NotFound(e.to_string()))?;
        }
        self.start_server(name).await
    }

    /// Stops every server (agent shutdown). The lease is kept in memory
    /// only, so it ends with the agent.
    pub async fn shutdown(&self) {
        self.sup.shutdown().await;
    }
}
