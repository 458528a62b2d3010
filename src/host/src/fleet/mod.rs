//! Where the host's sandboxes come from: one interface, one
//! implementation per kind of backend. `api/` asks this, never which
//! backend serves it.
//!
//! - [`Fleet::Local`]: the pool's slots (the process and qemu backends);
//!   a released slot goes back to the pool, or is replaced.
//! - [`Fleet::Claims`]: pods claimed from agent-sandbox's warm pools
//!   ([`crate::fleet::cluster`]); a released lease's claim is deleted, its pod
//!   with it.
//!
//! The leases themselves are kept by the backend's store
//! ([`crate::store::Store`]: SQLite, or the claims), behind one interface
//! too.

#[cfg(feature = "kubernetes")]
pub mod cluster;

use std::sync::Arc;
use std::time::Duration;

use sandbox_client::proto;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

#[cfg(feature = "kubernetes")]
use crate::fleet::cluster::Cluster;
use crate::pool::{OnRelease, Pool, Slot, Taken, Want};
use crate::store::SandboxRow;

/// Why the fleet could not give or reach a sandbox; `crate::error` maps
/// each to its status.
#[derive(Debug, thiserror::Error)]
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub enum FleetError {
    /// The pool has no sandbox to give.
    #[error("no sandbox available: {0}")]
    NoSandbox(crate::pool::PoolError),
    /// The sandbox's agent is not running any more.
    #[error("the sandbox's agent is gone")]
    AgentGone,
    /// The sandbox's agent does not answer.
    #[error("{0}")]
    AgentUnreachable(crate::pool::PoolError),
    /// The agent refused or failed `what`.
    #[error("{what}: {}", status.message())]
    Agent { what: String, status: tonic::Status },
    /// The owner's cap, decided across replicas.
    #[error("this API key already holds {held} sandbox(es) (limit {limit})")]
    OwnerFull { held: usize, limit: usize },
    /// The kubernetes backend: no pool for the benchmark, the pool empty
    /// past the wait, a failed claim, the API server unreachable.
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Cluster(sandbox_kube::KubeError),
    /// The leases' store.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Anything else of the fleet's own.
    #[error("{0}")]
    Internal(String),
}

#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
impl FleetError {
    /// The agent's gRPC failure of `what`.
    pub fn agent(what: impl Into<String>) -> impl FnOnce(tonic::Status) -> FleetError {
        let what = what.into();
        move |status| FleetError::Agent { what, status }
    }
}

pub type FleetResult<T> = Result<T, FleetError>;

pub enum Fleet {
    Local(Arc<Pool>),
    #[cfg(feature = "kubernetes")]
    Claims {
        cluster: Arc<Cluster>,
        pool: Arc<Pool>,
    },
}

/// What an Acquire asks of the fleet (a local pool reads `want` only).
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub struct Ask<'a> {
    /// The new lease's id.
    pub id: &'a str,
    pub owner: &'a str,
    pub want: Want,
    /// When the lease expires (unix ms), if it has a TTL.
    pub expires_at_ms: Option<i64>,
    /// RFC 3339 now.
    pub now: &'a str,
    /// The owner's cap of sandboxes.
    pub cap: usize,
}

impl Fleet {
    fn pool(&self) -> &Arc<Pool> {
        match self {
            Fleet::Local(pool) => pool,
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { pool, .. } => pool,
        }
    }

    /// A sandbox for a new lease: a slot of the pool (perhaps holding a
    /// warm lease), or a claimed pod bound to the lease (the owner's cap
    /// decided across replicas first).
    pub async fn take(&self, ask: Ask<'_>) -> FleetResult<Taken> {
        match self {
            Fleet::Local(pool) => pool.take(&ask.want).await.map_err(FleetError::NoSandbox),
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { cluster, .. } => {
                let slot = cluster
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
        }
    }

    /// Held from before [`Fleet::take`] until the lease is stored: dropped
    /// armed (the request abandoned mid-way), what was taken for lease
    /// `id` is given up in the background.
    pub fn guard(&self, id: &str) -> Guard {
        match self {
            Fleet::Local(_) => {
                let _ = id;
                Guard::default()
            }
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { cluster, .. } => Guard {
                cluster: Some(cluster.clone()),
                claim: sandbox_kube::fleet::claim_name(id),
            },
        }
    }

    /// A sandbox whose Acquire failed after it was taken: a claim is
    /// deleted; a slot goes back to the pool idle, its warm lease ended
    /// first (replaced if that fails), in the background.
    pub async fn abandon(&self, slot: Slot) {
        match self {
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { cluster, .. } => cluster.unclaim(&slot.id).await,
            Fleet::Local(pool) => settle_failed_lease(pool.clone(), slot),
        }
    }

    /// A sandbox leased whose record failed: a claim is deleted (a slot
    /// stays leased, ended by the reaper with its agent).
    pub async fn unrecorded(&self, slot: &Slot) {
        #[cfg(feature = "kubernetes")]
        if let Fleet::Claims { cluster, .. } = self {
            cluster.unclaim(&slot.id).await;
        }
        #[cfg(not(feature = "kubernetes"))]
        let _ = slot;
    }

    /// A sandbox just leased: a claimed pod teaches the pool its servers'
    /// catalog (the pool learns it from the slots it starts itself).
    pub async fn leased(&self, slot: &Slot) {
        #[cfg(feature = "kubernetes")]
        if let Fleet::Claims { pool, .. } = self {
            pool.learn_catalog(slot).await;
        }
        #[cfg(not(feature = "kubernetes"))]
        let _ = slot;
    }

    /// The slot a live sandbox runs in: the pool's, or its claimed pod.
    pub fn slot_of(&self, s: &SandboxRow) -> FleetResult<Slot> {
        match self {
            Fleet::Local(pool) => pool.leased_slot(&s.slot).ok_or(FleetError::AgentGone),
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { cluster, .. } => cluster.slot_of(s),
        }
    }

    /// Whether other replicas serve the same leases (so this one learns of
    /// their releases from the store, not by itself).
    pub fn shared(&self) -> bool {
        match self {
            Fleet::Local(_) => false,
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { .. } => true,
        }
    }

    /// Ends lease `s` (already recorded released) in the background,
    /// tracked by `releases`: the agent's Release, then the slot back to
    /// the pool (replaced if the Release failed, or by `--on-release
    /// replace`), or the claim deleted (whatever the pod's agent did).
    /// `until_clean` is dropped once the sandbox is clean (or gone).
    pub fn release(
        &self,
        s: &SandboxRow,
        is_ttl: bool,
        releases: &TaskTracker,
        until_clean: impl Send + 'static,
    ) {
        let (s, within) = (s.clone(), self.pool().deadlines().release);
        match self {
            Fleet::Local(pool) => {
                let pool = pool.clone();
                releases.spawn(async move {
                    release_slot(pool, s, is_ttl, within).await;
                    drop(until_clean);
                });
            }
            #[cfg(feature = "kubernetes")]
            Fleet::Claims { cluster, .. } => {
                let cluster = cluster.clone();
                releases.spawn(async move {
                    release_claim(cluster, s, is_ttl, within).await;
                    drop(until_clean);
                });
            }
        }
    }
}

/// See [`Fleet::guard`]; [`Guard::keep`] disarms it.
#[derive(Default)]
pub struct Guard {
    #[cfg(feature = "kubernetes")]
    cluster: Option<Arc<Cluster>>,
    #[cfg(feature = "kubernetes")]
    claim: String,
}

impl Guard {
    /// The lease is stored, or its Acquire gave up what it took itself.
    pub fn keep(&mut self) {
        #[cfg(feature = "kubernetes")]
        {
            self.cluster = None;
        }
    }
}

#[cfg(feature = "kubernetes")]
impl Drop for Guard {
    fn drop(&mut self) {
        let Some(c) = self.cluster.take() else {
            return;
        };
        let claim = std::mem::take(&mut self.claim);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { c.unclaim(&claim).await });
        }
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

/// The kubernetes backend's end of a lease: the pod's agent releases it
/// (servers stopped, outside accounts cleaned), then the claim is deleted
/// and its sandbox pod with it.
#[cfg(feature = "kubernetes")]
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

/// The Release of lease `id` by the agent of `slot`, a discard past
/// `discard_over_inodes` entries of its own file system (0: never);
/// whether it ended the lease for a discard (the slot is then dropped).
async fn release_on(
    slot: &Slot,
    id: &str,
    is_ttl: bool,
    discard_over_inodes: u64,
    within: Duration,
) -> Result<bool, String> {
    let c = slot.client(within).await.map_err(|e| e.to_string())?;
    c.agent()
        .release(proto::ReleaseRequest {
            lease_id: id.to_owned(),
            is_ttl,
            discard_over_inodes,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().discarded)
        .map_err(|s| s.to_string())
}
