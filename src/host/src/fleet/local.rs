//! The local backends' fleet (process and qemu): the pool's slots. A
//! released slot goes back to the pool, or is replaced.

use std::sync::Arc;
use std::time::Duration;

use sandbox_client::proto;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::{Ask, Fleet, FleetError, FleetResult, release_on};
use crate::pool::{Deadlines, OnRelease, Pool, Slot, Taken};
use crate::store::SandboxRow;

pub struct Local {
    pool: Arc<Pool>,
}

impl Local {
    pub fn new(pool: Arc<Pool>) -> Local {
        Local { pool }
    }
}

#[async_trait::async_trait]
impl Fleet for Local {
    async fn take(&self, ask: Ask<'_>) -> FleetResult<Taken> {
        self.pool
            .take(&ask.want)
            .await
            .map_err(FleetError::NoSandbox)
    }

    async fn abandon(&self, slot: Slot) {
        settle_failed_lease(self.pool.clone(), slot);
    }

    fn slot_of(&self, s: &SandboxRow) -> FleetResult<Slot> {
        self.pool.leased_slot(&s.slot).ok_or(FleetError::AgentGone)
    }

    fn release(
        &self,
        s: &SandboxRow,
        is_ttl: bool,
        releases: &TaskTracker,
        until_clean: Box<dyn Send>,
    ) {
        let (pool, s) = (self.pool.clone(), s.clone());
        let within = pool.deadlines().release;
        releases.spawn(async move {
            release_slot(pool, s, is_ttl, within).await;
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
}

/// A failed Acquire leaves the agent idle, but a warm lease the failure
/// left behind (a Narrow that failed for another reason) is ended before
/// the sandbox goes back to the pool bare; one that cannot be ended is
/// replaced. In the background.
fn settle_failed_lease(pool: Arc<Pool>, slot: Slot) {
    tokio::spawn(async move {
        let idle = match slot.client(pool.deadlines().release).await {
            Ok(c) => c
                .agent()
                .release(proto::ReleaseRequest::default())
                .await
                .is_ok(),
            Err(_) => false,
        };
        let _ = tokio::task::spawn_blocking(move || {
            if idle {
                pool.give_back(&slot.id)
            } else {
                pool.drop_slot(&slot.id)
            }
        })
        .await;
    });
}

/// A local slot's end of a lease.
async fn release_slot(pool: Arc<Pool>, s: SandboxRow, is_ttl: bool, within: Duration) {
    let (id, slot_id) = (s.id, s.slot);
    if pool.on_release() == OnRelease::Replace {
        // Its agent or VM is stopped whole; nothing to release inside.
        let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot_id)).await;
        info!(sandbox = %id, is_ttl, "released; its sandbox is replaced");
        return;
    }
    let over = pool.discard_over_inodes(&slot_id);
    let released = match pool.leased_slot(&slot_id) {
        Some(slot) => release_on(&slot, &id, is_ttl, over, within).await,
        None => Err("its agent is gone".to_owned()),
    };
    match released {
        Ok(false) => {
            info!(sandbox = %id, is_ttl, "released");
            let _ = tokio::task::spawn_blocking(move || pool.give_back(&slot_id)).await;
        }
        Ok(true) => {
            // What the lease left is dropped with the slot's own file
            // system: an unmount, whatever the tenant made.
            info!(sandbox = %id, is_ttl, "released; its sandbox is discarded with what it held");
            let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot_id)).await;
        }
        Err(e) => {
            warn!(sandbox = %id, error = %e, "release failed; the agent is replaced");
            let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot_id)).await;
        }
    }
}
