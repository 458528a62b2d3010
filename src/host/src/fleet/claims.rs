//! The kubernetes backend's fleet: pods claimed from agent-sandbox's warm
//! pools ([`Cluster`]); a released lease's claim is deleted, its pod with
//! it. The pool (of no slots) keeps the servers' catalogs and deadlines.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::cluster::Cluster;
use super::{Ask, Fleet, FleetResult, Guard, release_on};
use crate::pool::{Deadlines, Pool, Slot, Taken};
use crate::store::SandboxRow;

pub struct Claims {
    cluster: Arc<Cluster>,
    pool: Arc<Pool>,
}

impl Claims {
    pub fn new(cluster: Arc<Cluster>, pool: Arc<Pool>) -> Claims {
        Claims { cluster, pool }
    }
}

#[async_trait::async_trait]
impl Fleet for Claims {
    async fn take(&self, ask: Ask<'_>) -> FleetResult<Taken> {
        let slot = self
            .cluster
            .claim(
                ask.id,
                ask.owner,
                ask.want.benchmark.as_deref(),
                ask.expires_at_ms,
                ask.now,
                ask.cap,
            )
            .await?;
        Ok(Taken {
            slot,
            warm: None,
            covers: false,
            miss: None,
        })
    }

    fn guard(&self, id: &str) -> Guard {
        let (c, claim) = (self.cluster.clone(), sandbox_kube::fleet::claim_name(id));
        Guard::armed(move || {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { c.unclaim(&claim).await });
            }
        })
    }

    async fn abandon(&self, slot: Slot) {
        self.cluster.unclaim(&slot.id).await;
    }

    async fn unrecorded(&self, slot: &Slot) {
        self.cluster.unclaim(&slot.id).await;
    }

    async fn leased(&self, slot: &Slot) {
        self.pool.learn_catalog(slot).await;
    }

    fn slot_of(&self, s: &SandboxRow) -> FleetResult<Slot> {
        self.cluster.slot_of(s)
    }

    fn shared(&self) -> bool {
        true
    }

    fn release(
        &self,
        s: &SandboxRow,
        is_ttl: bool,
        releases: &TaskTracker,
        until_clean: Box<dyn Send>,
    ) {
        let (cluster, s) = (self.cluster.clone(), s.clone());
        let within = self.pool.deadlines().release;
        releases.spawn(async move {
            release_claim(cluster, s, is_ttl, within).await;
            drop(until_clean);
        });
    }

    fn deadlines(&self) -> Deadlines {
        self.pool.deadlines()
    }

    fn servers(&self) -> Option<Vec<String>> {
        self.pool.servers()
    }

    fn missing_servers(&self, asked: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        self.pool.missing_servers(asked)
    }

    fn dead_leased(&self) -> Vec<String> {
        self.pool.dead_leased()
    }

    fn leased_slots(&self) -> Vec<Slot> {
        self.pool.leased_slots()
    }

    fn is_leased(&self, id: &str) -> bool {
        self.pool.leased_slot(id).is_some()
    }

    async fn discard(&self, id: String) {
        let pool = self.pool.clone();
        let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&id)).await;
    }

    async fn stop(&self) {
        self.cluster.stop().await;
    }
}

/// The kubernetes backend's end of a lease: the pod's agent releases it
/// (servers stopped, outside accounts cleaned), then the claim is deleted
/// and its sandbox pod with it.
async fn release_claim(cluster: Arc<Cluster>, s: SandboxRow, is_ttl: bool, within: Duration) {
    let released = async {
        let slot = cluster.slot_of(&s).map_err(|e| e.to_string())?;
        release_on(&slot, &s.id, is_ttl, 0, within)
            .await
            .map(|_| ())
    };
    match tokio::time::timeout(cluster.release_within(), released).await {
        Ok(Ok(())) => info!(sandbox = %s.id, is_ttl, "released"),
        Ok(Err(e)) => {
            warn!(sandbox = %s.id, error = %e, "the pod's agent did not release; its pod is deleted anyway")
        }
        Err(_) => {
            warn!(sandbox = %s.id, "the pod's agent did not release in time; its pod is deleted anyway")
        }
    }
    cluster.unclaim(&s.slot).await;
}
