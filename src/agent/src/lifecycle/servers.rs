//! The servers of the sandbox as the lease sees them: starting and waiting
//! for readiness, the Servers.Start/Stop/Restart operations, and the one
//! place a server's Klavis status and view are computed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::acquire::unknown_servers;
use super::{LcError, Lifecycle, ReadyError, SandboxStatus, server_status};
use crate::supervisor::logbuf::LogBuf;
use crate::supervisor::manifest::{Benchmark, Credentials, LaunchSpec, Transport};
use crate::supervisor::{State, Status, Usage};

/// One server as GetInfo and Servers.List report it.
#[derive(Debug, Clone)]
pub struct ServerView {
    pub name: String,
    pub status: Status,
    pub usage: Usage,
    /// Klavis's status of the server ([`server_status`]).
    pub klavis: SandboxStatus,
    pub in_lease: bool,
    /// The server's id within the lease (empty outside one).
    pub id: String,
    /// The lease's profile, when the server belongs to the lease.
    pub benchmark: Option<Benchmark>,
    pub transport: Transport,
    pub mcp_path: String,
    pub metadata: BTreeMap<String, String>,
    pub stderr_tail: String,
}

impl Lifecycle {
    /// The servers named (every server of the manifest for `None`), in
    /// that order; unknown names are left out. Blocking: reads the
    /// processes' usage.
    pub fn servers(&self, names: Option<&[String]>) -> Vec<ServerView> {
        let usage = self.sup.usage();
        let lease = self.view().lease;
        let all;
        let names = match names {
            Some(n) => n,
            None => {
                all = self.manifest.names();
                &all
            }
        };
        names
            .iter()
            .filter_map(|name| {
                let def = self.manifest.get(name)?;
                let status = self.sup.status(name).ok()?;
                let in_lease = lease
                    .as_ref()
                    .is_some_and(|l| l.servers.iter().any(|n| n == name));
                let benchmark = lease
                    .as_ref()
                    .filter(|_| in_lease)
                    .and_then(|l| l.benchmark);
                Some(ServerView {
                    name: name.clone(),
                    klavis: server_status(status.state, in_lease),
                    status,
                    usage: usage.get(name).copied().unwrap_or_default(),
                    in_lease,
                    id: lease
                        .as_ref()
                        .and_then(|l| l.server_ids.get(name).cloned())
                        .unwrap_or_default(),
                    benchmark,
                    transport: def.transport.clone(),
                    mcp_path: def.mcp_path(),
                    metadata: def.metadata_for(benchmark),
                    stderr_tail: self.sup.stderr_tail(name),
                })
            })
            .collect()
    }

    /// One server's view. Blocking, as [`Lifecycle::servers`].
    pub fn server(&self, name: &str) -> Result<ServerView, LcError> {
        self.known(name)?;
        self.servers(Some(&[name.to_owned()]))
            .pop()
            .ok_or_else(|| unknown_servers(&self.manifest, vec![name.to_owned()]))
    }

    /// A server's captured output.
    pub fn logs(&self, name: &str) -> Result<Arc<LogBuf>, LcError> {
        Ok(self.sup.logs(name)?)
    }

    /// The launch spec a server runs with now: the lease's if it belongs to
    /// it, else the manifest default (no benchmark, no credentials).
    pub fn spec_for(&self, name: &str) -> Result<LaunchSpec, LcError> {
        if let Some(c) = self.current().as_ref()
            && let Some(s) = c.specs.iter().find(|s| s.name == name)
        {
            return Ok(s.clone());
        }
        let def = self
            .manifest
            .get(name)
            .ok_or_else(|| unknown_servers(&self.manifest, vec![name.to_owned()]))?;
        Ok(def.launch(None, &Credentials::default(), &|k| std::env::var(k).ok())?)
    }

    /// A lease's servers after its seeding: started and waited for, or,
    /// `lazy`, marked idle (each starts on its first use).
    pub(super) async fn bring_servers_up(
        &self,
        specs: &[LaunchSpec],
        lazy: bool,
    ) -> Result<(), LcError> {
        if !lazy {
            return self.start_and_wait(specs).await;
        }
        for s in specs {
            self.sup.park(&s.name).await?;
        }
        Ok(())
    }

    /// Starts an idle server of lease `lease` on its first use, and waits
    /// (within `ready_deadline_ms`) until it is ready. Nothing to do for a
    /// server that is not idle (running, starting, failed: the caller's
    /// own wait handles those) or once the lease has ended.
    pub async fn start_on_use(&self, name: &str, lease: &str) -> Result<(), LcError> {
        if self.sup.status(name)?.state != State::Idle {
            return Ok(());
        }
        let started = std::time::Instant::now();
        {
            let _op = self.op.lock().await;
            let spec = self
                .current()
                .as_ref()
                .filter(|c| c.lease.id == lease)
                .and_then(|c| c.specs.iter().find(|s| s.name == name).cloned());
            // Checked again under the lock: another request may have
            // started it, or a Release ended the lease.
            if let Some(spec) = spec
                && self.sup.status(name)?.state == State::Idle
            {
                self.start_spec(spec).await?;
            }
        }
        let deadline = Duration::from_millis(self.cfg.ready_deadline_ms);
        self.wait_ready(name, deadline)
            .await
            .map_err(|e| LcError::NotReady(vec![e]))?;
        tracing::info!(
            server = name,
            lease,
            ms = started.elapsed().as_millis() as u64,
            "started on first use"
        );
        Ok(())
    }

    /// Starts `spec`'s server, the workspace directories its profile keeps
    /// made first (as the benchmark's own launch makes them: only for a
    /// server that runs).
    async fn start_spec(&self, spec: LaunchSpec) -> Result<Status, LcError> {
        let dirs = self
            .server_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&spec.name)
            .cloned()
            .unwrap_or_default();
        if !dirs.is_empty() {
            let ws = self.ws.clone();
            tokio::task::spawn_blocking(move || ws.keep_more(&dirs))
                .await
                .map_err(|source| LcError::Task {
                    what: "making a server's workspace directories",
                    source,
                })?;
        }
        Ok(self.sup.start(spec).await?)
    }

    /// Starts every server and waits until all are ready, one fails, or
    /// the deadline passes.
    pub(super) async fn start_and_wait(&self, specs: &[LaunchSpec]) -> Result<(), LcError> {
        for s in specs {
            self.start_spec(s.clone()).await?;
        }
        let deadline = Duration::from_millis(self.cfg.ready_deadline_ms);
        let waits = specs.iter().map(|s| self.wait_ready(&s.name, deadline));
        let results = futures_util::future::join_all(waits).await;
        let failures: Vec<ReadyError> = results.into_iter().filter_map(Result::err).collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(LcError::NotReady(failures))
        }
    }

    pub(super) async fn wait_ready(
        &self,
        name: &str,
        deadline: Duration,
    ) -> Result<(), ReadyError> {
        let settled = self.sup.wait_settled(name, deadline).await?;
        match settled {
            Some(s) if s.state == State::Ready => Ok(()),
            Some(s) => Err(ReadyError::Exited {
                name: name.to_owned(),
                why: if s.message.is_empty() {
                    "it exited".to_owned()
                } else {
                    s.message.clone()
                },
                tail: self.sup.stderr_tail(name),
            }),
            None => {
                let now = self.sup.status(name)?;
                Err(ReadyError::Timeout {
                    name: name.to_owned(),
                    within: deadline,
                    state: format!("{:?}", now.state),
                    message: now.message,
                    tail: self.sup.stderr_tail(name),
                })
            }
        }
    }

    /// Fails with the supervisor's "no server named …" for an unknown name.
    fn known(&self, name: &str) -> Result<(), LcError> {
        self.sup.status(name)?;
        Ok(())
    }

    /// Servers.Start: starts one server (with the lease's settings if it
    /// belongs to the lease) and waits for it to be ready.
    pub async fn start_server(&self, name: &str) -> Result<Status, LcError> {
        self.known(name)?;
        let _op = self.op.lock().await;
        let spec = self.spec_for(name)?;
        let wait = spec.ready_timeout + Duration::from_secs(1);
        self.start_spec(spec).await?;
        self.wait_ready(name, wait)
            .await
            .map_err(|e| LcError::NotReady(vec![e]))?;
        Ok(self.sup.status(name)?)
    }

    /// Servers.Stop.
    pub async fn stop_server(
        &self,
        name: &str,
        grace: Option<Duration>,
    ) -> Result<Status, LcError> {
        self.known(name)?;
        let _op = self.op.lock().await;
        Ok(self.sup.stop(name, grace).await?)
    }

    /// Servers.Restart: stop, then start with a fresh restart counter.
    pub async fn restart_server(&self, name: &str) -> Result<Status, LcError> {
        self.known(name)?;
        {
            let _op = self.op.lock().await;
            self.sup.stop(name, None).await?;
        }
        self.start_server(name).await
    }

    /// Kills every execution and stops every server (agent shutdown). The lease is kept in memory
    /// only, so it ends with the agent.
    pub async fn shutdown(&self) {
        self.exec.close().await;
        self.sup.shutdown().await;
    }
}
