//! Release (back to idle: servers stopped, what the lease loaded through a
//! shared outside account deleted, workspace and state paths cleared;
//! idempotent) and Reset (back to right after Acquire, keeping the
//! lease), and the clearing and seeding both share with Acquire.

use std::time::{Duration, Instant};

use tracing::{Instrument, info, warn};

use super::{LcError, Lease, Lifecycle, ReleaseRecord, SandboxStatus, seed};
use crate::supervisor::manifest::{Benchmark, Seed};
use crate::supervisor::now_ms;

/// What a Release answers, naming what it could not empty or delete.
fn released_message(
    cur_id: &str,
    is_ttl: bool,
    unwiped: &[String],
    undeleted: &[String],
) -> String {
    let mut msg = format!(
        "lease {cur_id} released{}; the sandbox is idle",
        if is_ttl { " (TTL expired)" } else { "" }
    );
    if !unwiped.is_empty() {
        msg.push_str(&format!(
            "; could not empty {} (the next Acquire of its server empties it again)",
            unwiped.join("; ")
        ));
    }
    if !undeleted.is_empty() {
        msg.push_str(&format!(
            "; could not delete what the lease loaded into the shared account of {}",
            undeleted.join("; ")
        ));
    }
    msg
}

impl Lifecycle {
    /// Releases the lease. Returns the message to show.
    pub async fn release(&self, lease_id: &str, is_ttl: bool) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        let cur_id = self.current().as_ref().map(|c| c.lease.id.clone());
        let Some(cur_id) = cur_id else {
            return self.already_released(lease_id);
        };
        if !lease_id.is_empty() && lease_id != cur_id {
            return Err(LcError::NoSuchLease {
                asked: lease_id.to_owned(),
                current: Some(cur_id),
            });
        }
        let span = tracing::info_span!("release", lease = %cur_id, is_ttl);
        let started = Instant::now();
        let (touched, outside) = self
            .current()
            .as_ref()
            .map(|c| (c.started.clone(), c.outside.clone()))
            .unwrap_or_default();
        // A state path that cannot be emptied does not keep the lease: the
        // next Acquire of that server empties it again before starting it
        // (and fails there, by name, if it still cannot).
        let (unwiped, undeleted) = async {
            // A transfer in flight (a stalled Dump reader, a 1 B/s upload)
            // stops now instead of holding the workspace.
            if let Some(op) = self.ws.cancel_transfers() {
                info!(op, "stopping a workspace transfer for the release");
            }
            // A clean-up that fails does not stop the others; it fails
            // the Release at the end (the sandbox is not clean).
            let mut failed = self.exec.close().await.failed;
            self.sup.stop_all().await;
            self.stop_mail().await;
            failed.extend(self.end_tenant(true).await);
            // Before the state goes, with the servers stopped: what the
            // lease loaded into the operator's shared accounts. A failure
            // is logged and named; it does not keep the lease.
            let undeleted = self.clean_outside(&outside).await;
            self.wipe(&[], true).await?;
            // The old tree is deleted before the Release answers: the host
            // gives the sandbox to the next tenant only then, so no Acquire
            // ever waits for the last tenant's trash (and one that cannot
            // be deleted fails the Release: the host replaces the sandbox).
            failed.extend(self.trash_gone().await);
            let unwiped = self.wipe_state(&touched).await;
            if !failed.is_empty() {
                return Err(LcError::Cleanup { failed });
            }
            Ok::<_, LcError>((unwiped, undeleted))
        }
        .instrument(span.clone())
        .await
        .inspect_err(|e| {
            // The lease stays, in error: the host replaces the sandbox
            // instead of leasing it again.
            if let LcError::Cleanup { .. } = e
                && let Some(c) = self.current().as_mut()
            {
                c.broken = Some(e.to_string());
            }
            span.in_scope(|| warn!(error = %e, "release failed"));
        })?;
        // The record first: whoever sees the sandbox idle also sees how
        // its last lease ended.
        *self.last_release.lock().unwrap_or_else(|p| p.into_inner()) = Some(ReleaseRecord {
            lease_id: cur_id.clone(),
            is_ttl,
            at_ms: now_ms(),
        });
        for n in &touched {
            self.sup.forget(n);
        }
        if let Some(c) = self.current().take() {
            c.ttl.cancel();
        }
        span.in_scope(|| info!(ms = started.elapsed().as_millis() as u64, "released"));
        Ok(released_message(&cur_id, is_ttl, &unwiped, &undeleted))
    }

    /// A Release of an idle sandbox: fine when it names no lease or the
    /// last one (Release is idempotent).
    fn already_released(&self, lease_id: &str) -> Result<String, LcError> {
        let last = self
            .last_release
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match last {
            _ if lease_id.is_empty() => Ok("the sandbox is already idle".into()),
            Some(r) if r.lease_id == lease_id => Ok(format!(
                "lease {lease_id} was already released{}",
                if r.is_ttl {
                    " when its TTL expired"
                } else {
                    ""
                }
            )),
            _ => Err(LcError::NoSuchLease {
                asked: lease_id.to_owned(),
                current: None,
            }),
        }
    }

    /// Back to the state right after Acquire, keeping the lease.
    pub async fn reset(&self, lease_id: &str) -> Result<(Lease, SandboxStatus), LcError> {
        let _op = self.op.lock().await;
        let (lease, specs, account, outside) = {
            let cur = self.current();
            match cur.as_ref() {
                None => return Err(LcError::NotLeased),
                Some(c) if !lease_id.is_empty() && c.lease.id != lease_id => {
                    return Err(LcError::NoSuchLease {
                        asked: lease_id.to_owned(),
                        current: Some(c.lease.id.clone()),
                    });
                }
                Some(c) => (
                    c.lease.clone(),
                    c.specs.clone(),
                    c.mail.clone(),
                    c.outside.clone(),
                ),
            }
        };
        let span = tracing::info_span!("reset", lease = %lease.id);
        let r = async {
            // Executions end with the state they ran against; none is
            // admitted again before root has prepared the home and the
            // seeds (a running script could change their paths meanwhile).
            let mut failed = self.exec.close().await.failed;
            self.sup.stop_all().await;
            failed.extend(self.end_tenant(false).await);
            for n in &lease.servers {
                self.sup.forget(n);
            }
            if !failed.is_empty() {
                return Err(LcError::Cleanup { failed });
            }
            // As after Acquire: nothing of the lease's in the shared
            // accounts (a failure is logged).
            self.clean_outside(&outside).await;
            self.prepare(&lease.servers, lease.benchmark).await?;
            self.exec.open(&lease.id, &lease.servers);
            // The mailboxes go back to empty, with the same account.
            if let (Some(a), Some(m)) = (&account, &self.mail) {
                m.start(a).await?;
            }
            self.bring_servers_up(&specs, lease.lazy).await
        }
        .instrument(span)
        .await;
        if let Some(c) = self.current().as_mut() {
            c.broken = r.as_ref().err().map(|e| e.to_string());
        }
        r?;
        Ok((lease, self.view().status))
    }

    /// Clears the workspace and state paths, then places the seed data.
    pub(super) async fn prepare(
        &self,
        names: &[String],
        benchmark: Option<Benchmark>,
    ) -> Result<(), LcError> {
        self.wipe(names, true).await?;
        // The previous tenant's old trees may still be being deleted inside
        // the workspace's state directory: a new lease starts after that
        // (after a Release they are gone already; a Reset's are the lease's).
        let failed = self.trash_gone().await;
        if !failed.is_empty() {
            return Err(LcError::Cleanup { failed });
        }
        // The profile's own data first; the servers' seeds go over it.
        let profile = self
            .profile_data(benchmark)?
            .map(|from| Seed { from, to: None });
        let seeds: Vec<_> = profile
            .into_iter()
            .chain(
                names
                    .iter()
                    .filter_map(|n| self.manifest.get(n))
                    .flat_map(|d| d.seeds(benchmark).iter().cloned()),
            )
            .collect();
        // Each server's profile directories are made when it starts.
        *self.server_dirs.lock().unwrap_or_else(|p| p.into_inner()) = names
            .iter()
            .filter_map(|n| Some((n.clone(), self.manifest.get(n)?.dirs(benchmark).to_vec())))
            .collect();
        let ws = self.ws.clone();
        let tenant = self.sup.tenant().clone();
        let state: Vec<_> = names
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .collect();
        tokio::task::spawn_blocking(move || {
            ws.keep_dirs(Vec::new());
            for s in &seeds {
                seed::place(&ws, s).map_err(|source| LcError::Seed {
                    from: s.from.clone(),
                    source,
                })?;
            }
            // The servers run as the tenant: their state and a fresh home
            // are the tenant's.
            for p in &state {
                tenant.own_tree(p).map_err(|source| LcError::Wipe {
                    path: p.clone(),
                    source,
                })?;
            }
            tenant.fresh_home().map_err(|source| LcError::Wipe {
                path: tenant.home().to_owned(),
                source,
            })
        })
        .await
        .map_err(|source| LcError::Task {
            what: "seeding",
            source,
        })?
    }

    /// The benchmark's preloaded data, which must be installed when the
    /// manifest names it.
    pub(super) fn profile_data(
        &self,
        benchmark: Option<Benchmark>,
    ) -> Result<Option<std::path::PathBuf>, LcError> {
        let Some(b) = benchmark else { return Ok(None) };
        let Some(path) = self.manifest.profile_data.get(&b) else {
            return Ok(None);
        };
        if !path.exists() {
            return Err(LcError::NoBenchmarkData {
                benchmark: b.as_str(),
                path: path.clone(),
            });
        }
        Ok(Some(path.clone()))
    }

    /// Waits until the old workspace trees are deleted; returns what could
    /// not be.
    async fn trash_gone(&self) -> Vec<String> {
        let ws = self.ws.clone();
        match tokio::task::spawn_blocking(move || ws.wait_trash()).await {
            Ok(Ok(())) => Vec::new(),
            Ok(Err(failed)) => failed
                .into_iter()
                .map(|f| format!("old workspace contents: {f}"))
                .collect(),
            Err(e) => vec![format!("waiting for old contents to be deleted: {e}")],
        }
    }

    /// Wipes the state paths of `names` and, with `workspace`, clears the
    /// workspace (waiting for a running transfer up to workspace_wait_ms).
    pub(super) async fn wipe(&self, names: &[String], workspace: bool) -> Result<(), LcError> {
        let paths: Vec<_> = names
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .collect();
        let guard = if workspace {
            // The lease's profile directories go with it, and no server
            // started later (Servers.Start of an idle sandbox) makes them.
            self.ws.keep_dirs(Vec::new());
            self.server_dirs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            let wait = Duration::from_millis(self.cfg.workspace_wait_ms);
            Some(self.ws.begin_within("Clear", wait).await?)
        } else {
            None
        };
        tokio::task::spawn_blocking(move || {
            for p in &paths {
                seed::wipe(p).map_err(|source| LcError::Wipe {
                    path: p.clone(),
                    source,
                })?;
            }
            if let Some(g) = guard {
                g.clear()?;
            }
            Ok(())
        })
        .await
        .map_err(|source| LcError::Task {
            what: "wipe",
            source,
        })?
    }

    /// Empties the state paths of `names` as far as it can; returns what
    /// could not be emptied, each with its error, and logs it.
    pub(super) async fn wipe_state(&self, names: &[String]) -> Vec<String> {
        let paths: Vec<_> = names
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .collect();
        let failed = tokio::task::spawn_blocking(move || {
            paths
                .iter()
                .filter_map(|p| {
                    seed::wipe(p)
                        .err()
                        .map(|e| format!("state path {}: {e}", p.display()))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|e| vec![format!("the wipe task failed: {e}")]);
        for f in &failed {
            warn!(error = %f, "release could not empty a state path");
        }
        failed
    }

    /// Ends every process the tenant still has (whatever it did to leave
    /// its session or cgroup), empties the shared temporary directories
    /// and the tenant's keyrings; at a Release (`release`) its home goes
    /// too (Acquire and Reset make a fresh one in `prepare`). Returns what
    /// failed, each with its cause (logged too).
    pub(super) async fn end_tenant(&self, release: bool) -> Vec<String> {
        let tenant = self.sup.tenant().clone();
        let r = tokio::task::spawn_blocking(move || {
            let mut failed = Vec::new();
            match tenant.kill_all() {
                Ok(0) => {}
                Ok(killed) => info!(killed, "tenant processes left over were killed"),
                Err(killed) => failed.push(format!(
                    "tenant processes were still appearing after every kill round ({killed} killed)"
                )),
            }
            failed.extend(tenant.clear_shared_tmp());
            let ipc = crate::tenant::clear_ipc();
            if ipc > 0 {
                info!(objects = ipc, "IPC objects the tenant left were removed");
            }
            if release && let Err(e) = tenant.clear_home() {
                failed.push(format!("emptying the tenant's home: {e}"));
            }
            failed
        })
        .await;
        let mut failed =
            r.unwrap_or_else(|e| vec![format!("the task ending tenant processes failed: {e}")]);
        if let Err(e) = self.clear_keyrings().await {
            failed.push(e);
        }
        for f in &failed {
            warn!(error = %f, "ending the tenant's lease");
        }
        failed
    }

    /// Empties the tenant's keyrings (the kernel keeps them per uid, past
    /// its processes) by running the agent's own binary as the tenant.
    async fn clear_keyrings(&self) -> Result<(), String> {
        if self.sup.tenant().uid().is_none() || !crate::init::is_pid1() {
            return Ok(());
        }
        // The child runs the agent's own binary through its own
        // /proc/self/exe: the path the agent was started from may be hidden
        // (a tmpfs the agent mounted on /tmp as PID 1) or replaced since.
        let spec = crate::supervisor::job::JobSpec {
            group: crate::supervisor::job::JobGroup::Service("keyrings"),
            command: "/proc/self/exe".into(),
            args: vec![crate::tenant::CLEAR_KEYRINGS_ARG.into()],
            env: Default::default(),
            cwd: std::path::PathBuf::from("/"),
            limits: Default::default(),
            run_as: crate::supervisor::job::RunAs::Tenant,
        };
        let mut job = self
            .sup
            .spawn_job(&spec)
            .await
            .map_err(|e| format!("cannot clear the tenant's keyrings: {e}"))?;
        let stop = tokio_util::sync::CancellationToken::new();
        match job.wait(&stop, Duration::from_secs(1)).await {
            crate::supervisor::job::JobEnd::Exited(crate::supervisor::spawn::Exit::Code(0)) => {
                info!("the tenant's keyrings were cleared");
                Ok(())
            }
            end => Err(format!("clearing the tenant's keyrings failed ({end:?})")),
        }
    }

    /// Stops the servers of a failed Acquire and wipes what it placed.
    pub(super) async fn teardown(&self, names: &[String], workspace: bool) {
        for n in names {
            let _ = self.sup.stop(n, None).await;
            self.sup.forget(n);
        }
        self.stop_mail().await;
        self.end_tenant(false).await;
        if let Err(e) = self.wipe(names, workspace).await {
            warn!(error = %e, "cleaning up after a failed acquire");
        }
    }
}
