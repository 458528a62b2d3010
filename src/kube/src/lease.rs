//! A lease as its claim carries it. Labels find it (`managed-by`, the
//! sandbox id, a hash of the owner); one annotation holds the whole record
//! as JSON. The claim is the only copy: any replica lists, reads, updates
//! and releases it, and a restarted replica finds it as it was.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crd::SandboxClaim;
use crate::error::KubeError;

/// Every claim a host makes carries this label (value [`MANAGER`]).
pub const MANAGED_BY: &str = "sandbox-agent.dev/managed-by";
pub const MANAGER: &str = "sandbox-host";
/// The sandbox id (a UUID) the claim's lease answers to.
pub const SANDBOX_ID: &str = "sandbox-agent.dev/sandbox-id";
/// The first 16 hex digits of the owner's SHA-256 (owners are free text;
/// label values are not).
pub const OWNER_HASH: &str = "sandbox-agent.dev/owner-hash";
/// The annotation holding the [`Lease`] as JSON.
pub const RECORD: &str = "sandbox-agent.dev/lease";
/// The finalizer a host puts on its claims: a claim deleted by anyone else
/// stays (terminating) until a host releases its lease, which shows the
/// sandbox as `error` meanwhile.
pub const FINALIZER: &str = "sandbox-agent.dev/lease";

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Claimed; its Acquire is running (listed by no one, counted against
    /// its owner).
    Acquiring,
    Occupied,
    /// Its sandbox failed, or its claim was deleted under it.
    Error,
    /// Released: its claim is being deleted (listed by no one).
    Released,
}

/// One lease, as the host shows it; `servers` is the host's own JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub sandbox_id: String,
    pub owner: String,
    pub pool: String,
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<String>,
    #[serde(default)]
    pub servers: Value,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// The claim, once made (not in the annotation: it is the claim's name).
    #[serde(skip)]
    pub claim: String,
    /// The pod's IP, once Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The host process that made the claim (an id of its own per start):
    /// it counts its own Acquires in flight itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The owner's label value.
pub fn owner_hash(owner: &str) -> String {
    use std::fmt::Write;
    let digest = sha256(owner.as_bytes());
    digest[..8].iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

impl Lease {
    /// The labels a claim of this lease carries.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (MANAGED_BY.to_owned(), MANAGER.to_owned()),
            (SANDBOX_ID.to_owned(), self.sandbox_id.clone()),
            (OWNER_HASH.to_owned(), owner_hash(&self.owner)),
        ])
    }

    /// The annotation value.
    pub fn record(&self) -> String {
        // A struct of strings, numbers and JSON values always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The lease a claim carries; `None` for a claim without one (not
    /// ours). A claim deleted by someone else (terminating while the lease
    /// is live) or whose sandbox is no longer Ready reads as
    /// [`Phase::Error`].
    pub fn of_claim(c: &SandboxClaim) -> Result<Option<Lease>, KubeError> {
        let name = c.metadata.name.clone().unwrap_or_default();
        let Some(raw) = c.metadata.annotations.as_ref().and_then(|a| a.get(RECORD)) else {
            return Ok(None);
        };
        let mut l: Lease = serde_json::from_str(raw).map_err(|source| KubeError::BadRecord {
            claim: name.clone(),
            source,
        })?;
        l.claim = name;
        // Deleted by someone else, or its sandbox no longer Ready (the pod
        // died, the sandbox was deleted or expired).
        let unready = c
            .status
            .as_ref()
            .and_then(|s| crate::crd::condition(&s.conditions, crate::crd::READY))
            .is_some_and(|r| r.status == "False");
        if l.phase == Phase::Occupied && (c.metadata.deletion_timestamp.is_some() || unready) {
            l.phase = Phase::Error;
        }
        Ok(Some(l))
    }
}
