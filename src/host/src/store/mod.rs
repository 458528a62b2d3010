//! The host's state: its sandboxes (leases) and their owners, behind one
//! interface ([`Leases`]) with one implementation per place they are kept:
//! - `sqlite`: the local backends' database in the data dir (it survives
//!   a host restart; their agents, separate processes, survive it too);
//! - the kubernetes backend's claims (`crate::fleet::cluster` implements it):
//!   every replica reads and writes the same leases through the API server.

mod sqlite;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One server of a sandbox, as the REST API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerRow {
    pub name: String,
    pub id: String,
    /// What the sandbox gave the server to reach a service it runs (the
    /// mail account): Klavis's `auth_data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_data: Option<serde_json::Value>,
}

/// Klavis's `SandboxStatus`. A sandbox this host holds is `occupied`
/// until released, or `error` when its agent died; `idle` is what the pool
/// holds (Klavis lists it; no stored sandbox is idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = SandboxStatus)]
pub enum Status {
    Idle,
    Occupied,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::Occupied => "occupied",
            Status::Error => "error",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Status> {
        [Status::Idle, Status::Occupied, Status::Error]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    pub owner: String,
    pub slot: String,
    pub status: Status,
    pub benchmark: Option<String>,
    pub servers: Vec<ServerRow>,
    pub created_at: String,
    pub updated_at: String,
    /// Unix ms; None: no TTL.
    pub expires_at_ms: Option<i64>,
    /// A claimed pod's IP (the kubernetes backend; `None` elsewhere).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub endpoint: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("state database: bad JSON in a row: {0}")]
    Json(#[from] serde_json::Error),
    #[error("state database: unknown status {0:?} in a row")]
    Status(String),
    /// The kubernetes backend's state: the claims, through the API server.
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Cluster(#[from] sandbox_kube::KubeError),
    /// The claim of a lease being recorded is gone (deleted under it).
    #[cfg(feature = "kubernetes")]
    #[error("the claim {0} of this sandbox was deleted while it was acquired")]
    ClaimGone(String),
}

/// Where the leases are kept: what each backend's store does.
#[async_trait::async_trait]
pub trait Leases: Send + Sync {
    async fn insert(&self, s: &SandboxRow) -> Result<(), StoreError>;

    /// A live (not released) sandbox, whoever owns it.
    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError>;

    /// [`Leases::get_live`] for the MCP path's admissions (the claims reuse
    /// a lookup for `--kube-admit-cache-ms`; a release by this replica
    /// ends it at once).
    async fn admit_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        self.get_live(id).await
    }

    /// Whether `id` is live as far as this replica can tell without
    /// waiting (the upload store asks under its lock).
    fn live_now(&self, id: &str) -> bool;

    /// Live sandboxes; of one owner, or all.
    async fn list(&self, owner: Option<&str>) -> Result<Vec<SandboxRow>, StoreError>;

    /// The live sandboxes of `owner` that this replica counts against its
    /// cap before an Acquire starts. The claims count none: the cap is
    /// decided across replicas, every claim and admitted Acquire counted,
    /// before any claim is made (`Fleet::admit`, from `Cluster::claim`); a
    /// count here too would be a second list of the owner's claims per
    /// Acquire.
    async fn held(&self, owner: &str) -> Result<usize, StoreError>;

    async fn set_status(&self, id: &str, status: Status, now: &str) -> Result<(), StoreError>;

    async fn mark_released(&self, id: &str, now: &str) -> Result<(), StoreError>;

    /// Live sandboxes whose TTL has passed.
    async fn expired(&self, now_ms: i64) -> Result<Vec<SandboxRow>, StoreError>;
}

/// The host's leases, wherever they are kept.
#[derive(Clone)]
pub struct Store(Arc<dyn Leases>);

impl Store {
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub fn new(leases: Arc<dyn Leases>) -> Store {
        Store(leases)
    }

    /// The local backends' database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store(Arc::new(sqlite::Db::open(path)?)))
    }

    /// A live (not released) sandbox of `owner`.
    pub async fn get(&self, id: &str, owner: &str) -> Result<Option<SandboxRow>, StoreError> {
        let s = self.0.get_live(id).await?;
        Ok(s.filter(|s| s.owner == owner))
    }
}

impl std::ops::Deref for Store {
    type Target = dyn Leases;

    fn deref(&self) -> &(dyn Leases + 'static) {
        &*self.0
    }
}
