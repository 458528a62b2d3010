//! The fleet's side of the replicas' coordination ([`crate::coord`]): an
//! owner's admission before a claim, the live replicas, this replica's
//! presence and the reaper's Lease, lapsed presences deleted.

use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use tracing::info;

use super::{Fleet, REPLICAS_FRESH, now_ms};
use crate::coord::{self, Admission, Reservation};
use crate::error::KubeError;
use crate::retry::{Call, retried};

impl Fleet {
    /// Admits an Acquire of `owner` (sandbox `sandbox_id`, by `replica`)
    /// if the owner holds fewer than `cap` places: its claims that count
    /// ([`coord`]: live, or acquiring on a replica still present) and the
    /// Acquires admitted but not claimed yet. Admitted, its reservation is
    /// in the owner's ledger, written at the version read: a write of
    /// another replica in between (409) makes it count again.
    pub async fn admit(
        &self,
        owner: &str,
        sandbox_id: &str,
        cap: usize,
        replica: &str,
    ) -> Result<Admission, KubeError> {
        let name = coord::ledger_name(owner);
        let ns = &self.cfg.namespace;
        for attempt in 1..=coord::ADMIT_ATTEMPTS {
            let ledger = retried(Call::Repeatable, || self.leases.get_opt(&name))
                .await
                .map_err(self.api("get", "leases"))?;
            let version = ledger
                .as_ref()
                .map(|l| l.metadata.resource_version.clone().unwrap_or_default());
            let reservations = ledger
                .as_ref()
                .map(coord::reservations_of)
                .unwrap_or_default();
            let claims = self.leases(Some(owner)).await?;
            let now = now_ms();
            let replicas = self.live_replicas().await?;
            let (held, mut kept) =
                coord::places(&claims, reservations, &replicas, now, self.orphan_grace());
            if held >= cap {
                return Ok(Admission::Full { held });
            }
            let until_ms = now + self.cfg.coord.reservation_ttl.as_millis() as i64;
            kept.insert(
                sandbox_id.to_owned(),
                Reservation {
                    replica: replica.to_owned(),
                    until_ms,
                },
            );
            if coord::write_ledger(&self.leases, ns, &name, version.as_deref(), &kept).await? {
                return Ok(Admission::Admitted);
            }
            info!(ledger = %name, attempt, "another replica admitted an Acquire of this owner meanwhile; counting again");
            // Apart, so two replicas retrying do not meet again at once.
            let spread = u64::from(sandbox_id.bytes().map(u32::from).sum::<u32>() % 20);
            tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt) + spread)).await;
        }
        Err(KubeError::Contended { ledger: name })
    }

    /// How old a claim left acquiring by a replica not present must be to
    /// be taken as orphaned ([`coord::orphaned`]).
    pub fn orphan_grace(&self) -> Duration {
        self.cfg.coord.presence_ttl + coord::SKEW
    }

    /// The replicas whose presence is live ([`coord`]), as listed at
    /// most [`REPLICAS_FRESH`] ago (a presence lapses over tens of
    /// seconds; each Acquire and reaper pass need not list them again).
    pub async fn live_replicas(&self) -> Result<std::collections::HashSet<String>, KubeError> {
        let cached = self
            .replicas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some((at, r)) = cached
            && at.elapsed() < REPLICAS_FRESH
        {
            return Ok(r);
        }
        let r = coord::live_replicas(&self.leases, &self.cfg.namespace, now_ms()).await?;
        *self
            .replicas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), r.clone()));
        Ok(r)
    }

    /// Holds this replica's presence (`instance`) while the lock lives.
    pub async fn announce(&self, instance: &str) -> Result<coord::Lock, KubeError> {
        let name = format!("{}{instance}", coord::PRESENCE_PREFIX);
        coord::Lock::take(
            self.client.clone(),
            &self.cfg.namespace,
            &name,
            instance,
            self.cfg.coord.presence_ttl,
        )
        .await
    }

    /// Competes for the reaper's Lease as `instance`.
    pub async fn reaper_lock(&self, instance: &str) -> Result<coord::Lock, KubeError> {
        coord::Lock::take(
            self.client.clone(),
            &self.cfg.namespace,
            coord::REAPER,
            instance,
            self.cfg.coord.presence_ttl,
        )
        .await
    }

    /// Deletes presence Leases lapsed for longer than `older` (replicas
    /// gone); returns how many.
    pub async fn prune_presences(&self, older: Duration) -> Result<usize, KubeError> {
        let ns = &self.cfg.namespace;
        let stale = coord::stale_presences(&self.leases, ns, now_ms(), older).await?;
        for name in &stale {
            let dp = DeleteParams::background();
            match retried(Call::Repeatable, || self.leases.delete(name, &dp)).await {
                Ok(_) => info!(lease = %name, "deleted the presence of a replica gone"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(self.api("delete", "leases")(e)),
            }
        }
        Ok(stale.len())
    }
}
