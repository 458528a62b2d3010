//! The claims as the leases' store ([`Leases`]): every replica reads and
//! writes the same leases through the API server; admissions reuse a
//! lookup for `--kube-admit-cache-ms`.

use std::collections::HashMap;
use std::time::Instant;

use sandbox_kube::Lease;
use sandbox_kube::lease::Phase;
use tracing::warn;

use super::{
    ACQUIRE_AFTER_CLAIM, CACHE_KEEP, Cluster, PRESENCE_KEPT, PRUNE_EVERY, RELEASED_CLAIM_LEFT,
    locked, log_cluster_error, older_than, phase_of, row_of,
};
use crate::store::{Leases, SandboxRow, Status, StoreError};

impl Cluster {
    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Option<SandboxRow>)>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn remember(&self, id: &str, row: Option<SandboxRow>) {
        let keep = self.cfg.admit_cache * CACHE_KEEP;
        let mut c = self.cache();
        c.retain(|_, (at, _)| at.elapsed() < keep);
        c.insert(id.to_owned(), (Instant::now(), row));
    }

    /// The lease of `id` as its claim says (`None`: no claim, or acquiring
    /// or released).
    async fn lease(&self, id: &str) -> Result<Option<Lease>, StoreError> {
        let l = self.fleet.find(id).await.inspect_err(log_cluster_error)?;
        Ok(l.filter(|l| matches!(l.phase, Phase::Occupied | Phase::Error)))
    }

    async fn update(&self, id: &str, now: &str, phase: Phase) -> Result<(), StoreError> {
        self.fleet
            .update(id, |l| {
                l.phase = phase;
                l.updated_at = now.to_owned();
            })
            .await
            .inspect_err(log_cluster_error)?;
        self.cache().remove(id);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Leases for Cluster {
    /// [`Cluster::get_live`], reusing a lookup younger than the cache's
    /// lifetime (the MCP path's admissions).
    async fn admit_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        if let Some((at, row)) = self.cache().get(id)
            && at.elapsed() < self.cfg.admit_cache
        {
            return Ok(row.clone());
        }
        self.get_live(id).await
    }

    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let row = match self.lease(id).await? {
            Some(l) => Some(row_of(l)?),
            None => None,
        };
        self.remember(id, row.clone());
        Ok(row)
    }

    /// Live unless this replica released it or saw it gone.
    fn live_now(&self, id: &str) -> bool {
        !matches!(self.cache().get(id), Some((_, None)))
    }

    async fn list(&self, owner: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        let leases = self
            .fleet
            .leases(owner)
            .await
            .inspect_err(log_cluster_error)?;
        leases
            .into_iter()
            .filter(|l| matches!(l.phase, Phase::Occupied | Phase::Error))
            .map(row_of)
            .collect()
    }

    async fn held(&self, _owner: &str) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// Records an acquired sandbox in its claim (made by [`Cluster::claim`]).
    async fn insert(&self, s: &SandboxRow) -> Result<(), StoreError> {
        let servers = serde_json::to_value(&s.servers)?;
        self.fleet
            .update(&s.id, |l| {
                l.phase = phase_of(s.status);
                l.servers = servers.clone();
                l.updated_at = s.updated_at.clone();
                l.pod_ip = s.endpoint.clone();
            })
            .await
            .inspect_err(log_cluster_error)?
            .ok_or_else(|| StoreError::ClaimGone(s.slot.clone()))?;
        self.remember(&s.id, Some(s.clone()));
        Ok(())
    }

    async fn set_status(&self, id: &str, status: Status, now: &str) -> Result<(), StoreError> {
        self.update(id, now, phase_of(status)).await
    }

    /// Marks the lease released (listed by no one from now on); its claim
    /// is deleted after the agent's Release (`api::leases`).
    async fn mark_released(&self, id: &str, now: &str) -> Result<(), StoreError> {
        self.remember(id, None);
        let written = self.update(id, now, Phase::Released).await;
        // After the write (which forgets what was cached): this replica
        // takes it as ended from now on, written or not.
        self.remember(id, None);
        written
    }

    /// Live leases whose TTL has passed, on the one replica that holds
    /// the reaper's Lease (none on the others). Claims left `acquiring` by
    /// a replica whose presence lapsed, or past any Acquire's time (their
    /// replica stopped mid-way: no guard ran, no one lists them, their
    /// owner cannot release them), released ones whose delete failed, and
    /// presences of replicas long gone, are deleted on the way.
    async fn expired(&self, now_ms: i64) -> Result<Vec<SandboxRow>, StoreError> {
        if !self.reaps() {
            // Not the reaper (any more): no watch kept for it.
            locked(&self.mirror).take();
            return Ok(Vec::new());
        }
        let watched = {
            let mut m = locked(&self.mirror);
            m.get_or_insert_with(|| self.fleet.mirror()).leases()
        };
        // Until the watch's first list is in: nothing to reap yet.
        let Some(leases) = watched else {
            return Ok(Vec::new());
        };
        let replicas = self
            .fleet
            .live_replicas()
            .await
            .inspect_err(log_cluster_error)?;
        let abandoned_after = self.fleet.config().claim_timeout + ACQUIRE_AFTER_CLAIM;
        let grace = self.fleet.orphan_grace();
        let orphaned = |l: &Lease| sandbox_kube::coord::orphaned(l, &replicas, now_ms, grace);
        let mut expired = Vec::new();
        for l in leases {
            match l.phase {
                Phase::Acquiring if orphaned(&l) => {
                    warn!(sandbox = %l.sandbox_id, claim = %l.claim, replica = ?l.host, "a claim left acquiring by a replica gone; deleting it");
                    self.unclaim(&l.claim).await;
                }
                Phase::Acquiring if older_than(&l.created_at, now_ms, abandoned_after) => {
                    warn!(sandbox = %l.sandbox_id, claim = %l.claim, "a claim left acquiring (its host stopped mid-Acquire); deleting it");
                    self.unclaim(&l.claim).await;
                }
                // Released, but its claim still here well past the
                // release's own bound: a delete that failed (the finalizer
                // left on), retried.
                Phase::Released if older_than(&l.updated_at, now_ms, RELEASED_CLAIM_LEFT) => {
                    warn!(sandbox = %l.sandbox_id, claim = %l.claim, "a released lease's claim is still there; deleting it again");
                    self.unclaim(&l.claim).await;
                }
                Phase::Occupied | Phase::Error if l.expires_at_ms.is_some_and(|t| t <= now_ms) => {
                    expired.push(row_of(l)?);
                }
                _ => {}
            }
        }
        let due = locked(&self.pruned).is_none_or(|at| at.elapsed() >= PRUNE_EVERY);
        if due {
            *locked(&self.pruned) = Some(Instant::now());
            if let Err(e) = self.fleet.prune_presences(PRESENCE_KEPT).await {
                log_cluster_error(&e);
                warn!(error = %e, "cannot delete the presence Leases of replicas gone");
            }
        }
        Ok(expired)
    }
}
