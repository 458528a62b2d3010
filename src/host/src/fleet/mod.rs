//! Where the host's sandboxes come from: one interface ([`Fleet`]), one
//! implementation per kind of backend. `api/` asks this, never which
//! backend serves it.
//!
//! - [`local::Local`]: the pool's slots (the process and qemu backends); a
//!   released slot goes back to the pool, or is replaced.
//! - `claims::Claims`: pods claimed from agent-sandbox's warm pools
//!   (`cluster`); a released lease's claim is deleted, its pod with it.
//!
//! The leases themselves are kept by the backend's store
//! ([`crate::store::Leases`]: SQLite, or the claims), behind one interface
//! too.

#[cfg(feature = "kubernetes")]
pub mod claims;
#[cfg(feature = "kubernetes")]
pub mod cluster;
pub mod local;

/// The kubernetes backend's cluster, or nothing in a build without it.
#[cfg(feature = "kubernetes")]
pub use cluster::Cluster;
#[cfg(not(feature = "kubernetes"))]
pub type Cluster = std::convert::Infallible;

use std::time::Duration;

use sandbox_client::proto;
use tokio_util::task::TaskTracker;

use crate::pool::{Deadlines, Slot, Taken, Want};
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

/// What the lease service asks of the sandboxes' backend.
#[async_trait::async_trait]
pub trait Fleet: Send + Sync {
    /// A sandbox for a new lease: a slot of the pool (perhaps holding a
    /// warm lease), or a claimed pod bound to the lease (the owner's cap
    /// decided across replicas first).
    async fn take(&self, ask: Ask<'_>) -> FleetResult<Taken>;

    /// Held from before [`Fleet::take`] until the lease is stored: dropped
    /// armed (the request abandoned mid-way), what was taken for lease
    /// `id` is given up in the background.
    fn guard(&self, _id: &str) -> Guard {
        Guard::default()
    }

    /// A sandbox whose Acquire failed after it was taken: a claim is
    /// deleted; a slot goes back to the pool idle, its warm lease ended
    /// first (replaced if that fails), in the background.
    async fn abandon(&self, slot: Slot);

    /// A sandbox leased whose record failed: a claim is deleted (a slot
    /// stays leased, ended by the reaper with its agent).
    async fn unrecorded(&self, _slot: &Slot) {}

    /// A sandbox just leased: a claimed pod teaches the pool its servers'
    /// catalog (the pool learns it from the slots it starts itself).
    async fn leased(&self, _slot: &Slot) {}

    /// The slot a live sandbox runs in: the pool's, or its claimed pod.
    fn slot_of(&self, s: &SandboxRow) -> FleetResult<Slot>;

    /// Whether other replicas serve the same leases (so this one learns of
    /// their releases from the store, not by itself).
    fn shared(&self) -> bool {
        false
    }

    /// Ends lease `s` (already recorded released) in the background,
    /// tracked by `releases`: the agent's Release, then the slot back to
    /// the pool (replaced if the Release failed, or by `--on-release
    /// replace`), or the claim deleted (whatever the pod's agent did).
    /// `until_clean` is dropped once the sandbox is clean (or gone).
    fn release(
        &self,
        s: &SandboxRow,
        is_ttl: bool,
        releases: &TaskTracker,
        until_clean: Box<dyn Send>,
    );

    /// Every agent call's deadline.
    fn deadlines(&self) -> Deadlines;

    /// The servers every sandbox has, when known.
    fn servers(&self) -> Option<Vec<String>>;

    /// Of `asked`, the servers no sandbox has, and the ones it has.
    fn missing_servers(&self, asked: &[String]) -> Option<(Vec<String>, Vec<String>)>;

    /// Leased sandboxes (their slot ids) whose agent has died.
    fn dead_leased(&self) -> Vec<String>;

    /// The leased sandboxes' slots, for the reaper's probes.
    fn leased_slots(&self) -> Vec<Slot>;

    /// Whether slot `id` is still leased.
    fn is_leased(&self, id: &str) -> bool;

    /// Replaces slot `id`, whose agent died or went mute.
    async fn discard(&self, id: String);

    /// Stops what serves the fleet (a replica's part of the cluster); the
    /// pool is closed by whoever made it.
    async fn stop(&self) {}
}

/// See [`Fleet::guard`]; [`Guard::keep`] disarms it.
#[derive(Default)]
pub struct Guard {
    /// What dropping it armed does (in the background).
    on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl Guard {
    /// Armed: dropped before [`Guard::keep`], it runs `undo`.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub fn armed(undo: impl FnOnce() + Send + 'static) -> Guard {
        Guard {
            on_drop: Some(Box::new(undo)),
        }
    }

    /// The lease is stored, or its Acquire gave up what it took itself.
    pub fn keep(&mut self) {
        self.on_drop = None;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(undo) = self.on_drop.take() {
            undo();
        }
    }
}

/// The Release of lease `id` by the agent of `slot`, a discard past
/// `discard_over_inodes` entries of its own file system (0: never);
/// whether it ended the lease for a discard (the slot is then dropped).
pub(super) async fn release_on(
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
