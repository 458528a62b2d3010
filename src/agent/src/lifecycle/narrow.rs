//! Narrow: hands a pre-acquired (warm) lease to its tenant. The lease gets
//! the tenant's id, TTL and email and keeps only the servers asked for;
//! the others leave the lease (no route, not listed) at once and are
//! stopped, and their own state paths wiped, after the answer.
//!
//! A lease that cannot be narrowed into what a cold Acquire would have
//! made is refused with [`LcError::NotNarrowable`]: a kept server that is
//! not ready, a benchmark other than the lease's, or a dropped server whose
//! profile seeded the workspace. The caller then releases the lease and
//! acquires cold.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::acquire::{expires_at, resolve_ttl, server_ids, valid_lease_id};
use super::{Current, LcError, Lease, Lifecycle, SandboxStatus, seed};
use crate::supervisor::State;
use crate::supervisor::manifest::Benchmark;
use crate::supervisor::now_ms;

/// How long after a Narrow's answer the dropped servers begin to stop.
/// Tearing down several servers takes both cores of a small VM for a few
/// milliseconds; this lets the answer (and the host's own answer after it)
/// go out first. The stop itself then takes each server's stop grace.
pub const TRIM_AFTER: Duration = Duration::from_millis(50);

/// What [`Lifecycle::narrow`] is asked.
#[derive(Debug, Clone)]
pub struct NarrowParams {
    /// The warm lease, which must be current.
    pub lease_id: String,
    /// The tenant's lease id (may equal `lease_id`).
    pub new_lease_id: String,
    /// The servers to keep, in the order the tenant asked for them.
    pub servers: Vec<String>,
    /// Must be the warm lease's benchmark.
    pub benchmark: Option<Benchmark>,
    pub ttl: super::Ttl,
    pub test_account_email: String,
}

/// The current lease, when it is `id`.
fn the_lease<'a>(cur: Option<&'a mut Current>, id: &str) -> Result<&'a mut Current, LcError> {
    match cur {
        None => Err(LcError::NoSuchLease {
            asked: id.to_owned(),
            current: None,
        }),
        Some(c) if c.lease.id != id => Err(LcError::NoSuchLease {
            asked: id.to_owned(),
            current: Some(c.lease.id.clone()),
        }),
        Some(c) => Ok(c),
    }
}

impl Lifecycle {
    /// Narrows the current warm lease. The servers that left it are
    /// stopped when the returned [`Trim`] is dropped: hold it until the
    /// answer is composed.
    pub async fn narrow(&self, p: NarrowParams) -> Result<(Lease, SandboxStatus, Trim), LcError> {
        let op = self.op.lock().await;
        if !valid_lease_id(&p.new_lease_id) {
            return Err(LcError::BadLeaseId);
        }
        let mut keep: Vec<String> = Vec::new();
        for n in &p.servers {
            if !keep.contains(n) {
                keep.push(n.clone());
            }
        }
        if keep.is_empty() {
            return Err(LcError::NoServersNamed);
        }
        let ttl_seconds = resolve_ttl(p.ttl, &self.cfg)?;
        let server_ids = server_ids(&keep)?;
        let started = Instant::now();
        let (lease, dropped, dropped_state) = {
            let mut cur = self.current();
            let c = the_lease(cur.as_mut(), &p.lease_id)?;
            self.narrowable(c, &keep, p.benchmark, &p.test_account_email)?;
            let dropped: Vec<String> = c
                .lease
                .servers
                .iter()
                .filter(|n| !keep.contains(n))
                .cloned()
                .collect();
            let dropped_state = self.only_state_of(&dropped, &keep);
            self.drop_workspace_dirs(&dropped, &keep, c.lease.benchmark);
            self.hand_over(c, &p, &keep, server_ids, ttl_seconds);
            (c.lease.clone(), dropped, dropped_state)
        };
        // Executions belong to the tenant's lease and see only its servers.
        self.exec.close().await;
        self.exec.open(&lease.id, &lease.servers);
        let span = tracing::info_span!("narrow", lease = %lease.id, from = %p.lease_id);
        span.in_scope(|| {
            info!(
                kept = %lease.servers.join(","),
                dropped = %dropped.join(","),
                ms = started.elapsed().as_millis() as u64,
                "warm lease handed over"
            )
        });
        drop(op);
        let trim = Trim {
            lc: self.me.clone(),
            lease: lease.id.clone(),
            servers: dropped,
            state: dropped_state,
            span,
        };
        Ok((lease, self.view().status, trim))
    }

    /// State paths only the `dropped` servers use: a kept server's state
    /// stays, whatever it shares.
    fn only_state_of(&self, dropped: &[String], keep: &[String]) -> Vec<PathBuf> {
        let kept_state: Vec<_> = keep
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .collect();
        dropped
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.state_paths.iter().cloned())
            .filter(|sp| {
                !kept_state
                    .iter()
                    .any(|k| k.starts_with(sp) || sp.starts_with(k))
            })
            .collect()
    }

    /// The workspace directories only dropped servers' profiles keep go
    /// too: a cold Acquire of `keep` would not have made them (nor does a
    /// kept server that has not started: its directories come with it).
    fn drop_workspace_dirs(&self, dropped: &[String], keep: &[String], b: Option<Benchmark>) {
        let made = self.ws.kept();
        let kept_dirs: Vec<_> = keep
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.dirs(b).iter().cloned())
            .filter(|d| made.contains(d))
            .collect();
        self.server_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|n, _| keep.contains(n));
        let dropped_dirs: Vec<_> = dropped
            .iter()
            .filter_map(|n| self.manifest.get(n))
            .flat_map(|d| d.dirs(b).iter().cloned())
            .filter(|d| !kept_dirs.iter().any(|k| k.starts_with(d)))
            .collect();
        self.ws.keep_dirs(kept_dirs);
        self.ws.remove_dirs(&dropped_dirs);
    }

    /// Makes the current lease the tenant's: its id, TTL (re-armed) and
    /// email, only the kept servers (new ids) and their auth_data.
    fn hand_over(
        &self,
        c: &mut Current,
        p: &NarrowParams,
        keep: &[String],
        server_ids: BTreeMap<String, String>,
        ttl_seconds: u32,
    ) {
        let now = now_ms();
        c.ttl.cancel();
        c.ttl = CancellationToken::new();
        c.specs.retain(|s| keep.contains(&s.name));
        c.lease = Lease {
            id: p.new_lease_id.clone(),
            benchmark: c.lease.benchmark,
            server_ids,
            servers: keep.to_vec(),
            acquired_at_ms: now,
            ttl_seconds,
            expires_at_ms: expires_at(now, ttl_seconds),
            test_account_email: p.test_account_email.clone(),
            skipped: Vec::new(),
            auth_data: c
                .lease
                .auth_data
                .iter()
                .filter(|(n, _)| keep.contains(n))
                .map(|(n, a)| (n.clone(), a.clone()))
                .collect(),
            lazy: c.lease.lazy,
        };
        if !keep.iter().any(|n| self.uses_mail(n)) {
            c.mail = None;
        }
        if ttl_seconds > 0 {
            self.arm_ttl(
                c.lease.id.clone(),
                Duration::from_secs(ttl_seconds.into()),
                c.ttl.clone(),
            );
        }
    }

    /// Whether the current (warm) lease narrowed to `keep` is what a cold
    /// Acquire of `keep` would give.
    fn narrowable(
        &self,
        c: &Current,
        keep: &[String],
        benchmark: Option<Benchmark>,
        test_account_email: &str,
    ) -> Result<(), LcError> {
        let refuse = |why: String| Err(LcError::NotNarrowable { why });
        if c.broken.is_some() {
            return refuse("the lease is broken".into());
        }
        if c.lease.benchmark != benchmark {
            return refuse(format!(
                "the lease was acquired for benchmark {}, not {}",
                bench_name(c.lease.benchmark),
                bench_name(benchmark)
            ));
        }
        let outside: Vec<&str> = keep
            .iter()
            .filter(|n| !c.lease.servers.contains(n))
            .map(String::as_str)
            .collect();
        if !outside.is_empty() {
            return refuse(format!(
                "{} not in the lease ({})",
                outside.join(", "),
                c.lease.servers.join(", ")
            ));
        }
        for n in keep {
            let state = self.sup.status(n).map(|s| s.state).ok();
            // A lazy lease's idle server starts on its first use, as
            // after a cold lazy Acquire.
            if !matches!(state, Some(State::Ready | State::Idle)) {
                return refuse(format!("server {n} is not ready ({state:?})"));
            }
        }
        // The mail account is the test_account_email's (or the default):
        // a warm lease made for another address is not what was asked.
        if let (Some(a), Some(m)) = (&c.mail, &self.mail)
            && keep.iter().any(|n| self.uses_mail(n))
            && a.address != m.address_for(test_account_email)
        {
            return refuse(format!(
                "its mail account is {}, not {}",
                a.address,
                m.address_for(test_account_email)
            ));
        }
        let seeding: Vec<&str> = c
            .lease
            .servers
            .iter()
            .filter(|n| !keep.contains(n))
            .filter(|n| {
                self.manifest
                    .get(n)
                    .is_some_and(|d| d.seeds(benchmark).iter().any(|s| s.to.is_none()))
            })
            .map(String::as_str)
            .collect();
        if !seeding.is_empty() {
            return refuse(format!(
                "{} placed seed data in the workspace",
                seeding.join(", ")
            ));
        }
        Ok(())
    }

    /// Stops servers that left lease `lease` and wipes their own state
    /// paths, under the operation lock (a Release waits for it). Nothing to
    /// do once that lease ended: its Release stopped and wiped everything,
    /// and a later lease's servers are not ours to stop.
    async fn drop_servers(&self, lease: &str, names: Vec<String>, state: Vec<std::path::PathBuf>) {
        let _op = self.op.lock().await;
        if self.current().as_ref().is_none_or(|c| c.lease.id != lease) {
            return;
        }
        let started = Instant::now();
        futures_util::future::join_all(names.iter().map(|n| self.sup.stop(n, None))).await;
        for n in &names {
            self.sup.forget(n);
        }
        if self.current().as_ref().is_some_and(|c| c.mail.is_none()) {
            self.stop_mail().await;
        }
        let wiped = tokio::task::spawn_blocking(move || {
            let mut failed = BTreeMap::new();
            for p in &state {
                if let Err(e) = seed::wipe(p) {
                    failed.insert(p.display().to_string(), e.to_string());
                }
            }
            failed
        })
        .await;
        match wiped {
            Ok(failed) if failed.is_empty() => {}
            Ok(failed) => warn!(?failed, "wiping the state of servers that left the lease"),
            Err(e) => warn!(error = %e, "the wipe task failed"),
        }
        info!(
            stopped = %names.join(","),
            ms = started.elapsed().as_millis() as u64,
            "servers outside the lease stopped"
        );
    }
}

/// The stop of the servers a narrowed lease dropped, started when this is
/// dropped (so a caller answers first, and nothing is left running if it
/// does not).
#[must_use = "the dropped servers stop when this is dropped"]
pub struct Trim {
    lc: std::sync::Weak<Lifecycle>,
    lease: String,
    servers: Vec<String>,
    state: Vec<std::path::PathBuf>,
    span: tracing::Span,
}

impl Drop for Trim {
    fn drop(&mut self) {
        let Some(lc) = self.lc.upgrade() else { return };
        if self.servers.is_empty() {
            return;
        }
        let (lease, servers, state) = (
            std::mem::take(&mut self.lease),
            std::mem::take(&mut self.servers),
            std::mem::take(&mut self.state),
        );
        tokio::spawn(
            async move {
                tokio::time::sleep(TRIM_AFTER).await;
                lc.drop_servers(&lease, servers, state).await
            }
            .instrument(self.span.clone()),
        );
    }
}

fn bench_name(b: Option<Benchmark>) -> &'static str {
    b.map_or("none", |b| b.as_str())
}
