//! Claiming, recording and releasing sandboxes of agent-sandbox's warm
//! pools. Every call goes to the API server: the claims are the state, so
//! any host replica sees what another one did.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease as KLease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tracing::{info, warn};

use crate::coord::{self, Admission, CoordConfig};
use crate::crd::{ClaimLifecycle, NameRef, Sandbox, SandboxClaim, SandboxClaimSpec};
use crate::error::KubeError;
use crate::lease::{self, FINALIZER, Lease};
use crate::retry::{Call, retried};

mod coordinate;
mod mirror;
mod ready;
pub use mirror::{Mirror, WATCH_SECONDS};

const CLAIMS: &str = "sandboxclaims";
const SANDBOXES: &str = "sandboxes";

/// How the fleet claims (the host's `--kube-*` flags).
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub namespace: String,
    /// Benchmark name → warm pool; the pool under [`DEFAULT_POOL`] serves
    /// requests without a benchmark and benchmarks without a pool.
    pub pools: BTreeMap<String, String>,
    /// How long a claim may take to give a Ready sandbox with a pod IP
    /// (watched: [`Fleet::claim`] reads no claim on a timer).
    pub claim_timeout: Duration,
    /// Added to a lease's expiry for its claim's `shutdownTime`: the
    /// hosts' reaper releases first; the controller's shutdown is the
    /// backstop when no host runs.
    pub shutdown_grace: Duration,
    /// Replicas' presence and admissions ([`crate::coord`]).
    pub coord: CoordConfig,
}

/// The key of the pool that serves everything no other pool does.
pub const DEFAULT_POOL: &str = "default";

/// A claim whose sandbox is Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub claim: String,
    pub sandbox: String,
    pub ip: String,
}

pub struct Fleet {
    client: kube::Client,
    claims: Api<SandboxClaim>,
    sandboxes: Api<Sandbox>,
    leases: Api<KLease>,
    cfg: FleetConfig,
    /// The replicas found live, and when ([`Fleet::live_replicas`]).
    replicas: std::sync::Mutex<Option<(Instant, std::collections::HashSet<String>)>>,
}

/// Whether `id` has the shape of the sandbox ids hosts make (a UUID in
/// its hyphenated lower-case form): only those name claims.
pub fn is_sandbox_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// The claim of sandbox `id`: one name per lease, so a retried call finds
/// it and every replica derives it.
pub fn claim_name(sandbox_id: &str) -> String {
    format!("sbx-{sandbox_id}")
}

impl Fleet {
    pub fn new(client: kube::Client, cfg: FleetConfig) -> Fleet {
        Fleet {
            claims: Api::namespaced(client.clone(), &cfg.namespace),
            sandboxes: Api::namespaced(client.clone(), &cfg.namespace),
            leases: Api::namespaced(client.clone(), &cfg.namespace),
            client,
            cfg,
            replicas: std::sync::Mutex::new(None),
        }
    }

    pub fn config(&self) -> &FleetConfig {
        &self.cfg
    }

    /// The warm pool for an Acquire of `benchmark`.
    pub fn pool_for(&self, benchmark: Option<&str>) -> Result<String, KubeError> {
        let p = benchmark.and_then(|b| self.cfg.pools.get(b));
        p.or_else(|| self.cfg.pools.get(DEFAULT_POOL))
            .cloned()
            .ok_or_else(|| KubeError::NoPool {
                benchmark: benchmark.unwrap_or("(none)").to_owned(),
            })
    }

    fn api(
        &self,
        verb: &'static str,
        resource: &'static str,
    ) -> impl FnOnce(kube::Error) -> KubeError {
        KubeError::api(verb, resource, &self.cfg.namespace)
    }

    /// Claims a sandbox of `lease.pool` for `lease` (its record in the
    /// claim, phase acquiring) and waits until it is Ready with a pod IP,
    /// within the claim timeout. The owner's cap of `cap` sandboxes is
    /// decided first, across replicas ([`Fleet::admit`]): refused, no
    /// claim is made ([`KubeError::OwnerFull`]). On any failure, and when
    /// this future is dropped before it ends, the claim is deleted:
    /// nothing is leaked.
    pub async fn claim(&self, lease: &Lease, cap: usize) -> Result<Claimed, KubeError> {
        if !is_sandbox_id(&lease.sandbox_id) {
            return Err(KubeError::BadId(lease.sandbox_id.clone()));
        }
        let replica = lease.host.clone().unwrap_or_default();
        if let Admission::Full { held } = self
            .admit(&lease.owner, &lease.sandbox_id, cap, &replica)
            .await?
        {
            return Err(KubeError::OwnerFull { held, limit: cap });
        }
        let name = claim_name(&lease.sandbox_id);
        let claim = self.claim_object(&name, lease);
        let pp = PostParams::default();
        let created = retried(Call::Create, || self.claims.create(&pp, &claim)).await;
        // The claim counts by itself now (or was never made).
        let ledger = coord::ledger_name(&lease.owner);
        coord::unreserve(
            &self.leases,
            &self.cfg.namespace,
            &ledger,
            &lease.sandbox_id,
        )
        .await;
        created.map_err(self.api("create", CLAIMS))?;
        info!(sandbox = %lease.sandbox_id, claim = %name, pool = %lease.pool, "claimed");
        let mut guard = Unclaim {
            claims: Some(self.claims.clone()),
            name: name.clone(),
        };
        // Bounded as a whole: a call the API server never answers must not
        // hold the Acquire past the claim timeout.
        let started = Instant::now();
        let waited =
            tokio::time::timeout(self.cfg.claim_timeout, self.wait_ready(&name, &lease.pool))
                .await
                .unwrap_or_else(|_| {
                    Err(KubeError::PoolEmpty {
                        pool: lease.pool.clone(),
                        claim: name.clone(),
                        waited: started.elapsed(),
                    })
                });
        match waited {
            Ok(c) => {
                guard.claims = None;
                Ok(c)
            }
            Err(e) => {
                warn!(sandbox = %lease.sandbox_id, claim = %name, error = %e, "the claim failed; deleting it");
                // The guard stays armed while the claim is deleted: this
                // future dropped mid-delete still deletes it.
                if let Err(d) = self.release(&name).await {
                    warn!(claim = %name, error = %d, "cannot delete the failed claim");
                }
                guard.claims = None;
                Err(e)
            }
        }
    }

    fn claim_object(&self, name: &str, lease: &Lease) -> SandboxClaim {
        let shutdown = lease.expires_at_ms.and_then(|ms| {
            let at = ms + self.cfg.shutdown_grace.as_millis() as i64;
            k8s_openapi::jiff::Timestamp::from_millisecond(at)
                .ok()
                .map(Time)
        });
        SandboxClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(lease.labels()),
                annotations: Some(BTreeMap::from([(lease::RECORD.to_owned(), lease.record())])),
                finalizers: Some(vec![FINALIZER.to_owned()]),
                ..Default::default()
            },
            spec: SandboxClaimSpec {
                warm_pool_ref: NameRef {
                    name: lease.pool.clone(),
                },
                lifecycle: shutdown.map(|t| ClaimLifecycle {
                    shutdown_time: Some(t),
                    // Foreground: the sandbox (the claim's dependent)
                    // is deleted first, while this host's finalizer
                    // still holds the claim; with `Delete` nothing would
                    // end until a host came back to take the finalizer
                    // off (tests/real_api.rs).
                    shutdown_policy: Some("DeleteForeground".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
        .typed()
    }

    /// Deletes claim `name` and takes this host's finalizer off it, so the
    /// controller deletes its sandbox. Gone already is done.
    pub async fn release(&self, name: &str) -> Result<(), KubeError> {
        let dp = DeleteParams::background();
        match retried(Call::Repeatable, || self.claims.delete(name, &dp)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(self.api("delete", CLAIMS)(e)),
        }
        unfinalize(&self.claims, name)
            .await
            .map_err(self.api("patch", CLAIMS))
    }

    /// The leases the claims carry, of `owner` or of everyone, acquiring
    /// ones included; oldest first.
    pub async fn leases(&self, owner: Option<&str>) -> Result<Vec<Lease>, KubeError> {
        let mut selector = format!("{}={}", lease::MANAGED_BY, lease::MANAGER);
        if let Some(o) = owner {
            selector.push_str(&format!(",{}={}", lease::OWNER_HASH, lease::owner_hash(o)));
        }
        let mut claims = Vec::new();
        let mut params = ListParams::default().labels(&selector).limit(LIST_PAGE);
        loop {
            let page = retried(Call::Repeatable, || self.claims.list(&params))
                .await
                .map_err(self.api("list", CLAIMS))?;
            claims.extend(page.items);
            match page.metadata.continue_ {
                Some(next) if !next.is_empty() => params = params.continue_token(&next),
                _ => break,
            }
        }
        let mut out = Vec::new();
        for c in &claims {
            match Lease::of_claim(c) {
                Ok(Some(l)) if owner.is_none_or(|o| l.owner == o) => out.push(l),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "skipping a claim"),
            }
        }
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        Ok(out)
    }

    /// The lease of sandbox `id`, if its claim exists. An id that is not
    /// one this host makes (a UUID) names no claim, and never reaches the
    /// API server's path.
    pub async fn find(&self, sandbox_id: &str) -> Result<Option<Lease>, KubeError> {
        Ok(self.find_at(sandbox_id).await?.map(|(l, _)| l))
    }

    /// [`Fleet::find`], with the claim's `resourceVersion` for a write
    /// that must not overwrite another replica's ([`Fleet::update`]).
    async fn find_at(&self, sandbox_id: &str) -> Result<Option<(Lease, String)>, KubeError> {
        if !is_sandbox_id(sandbox_id) {
            return Ok(None);
        }
        let name = claim_name(sandbox_id);
        let c = retried(Call::Repeatable, || self.claims.get_opt(&name))
            .await
            .map_err(self.api("get", CLAIMS))?;
        let Some(c) = c else { return Ok(None) };
        let version = c.metadata.resource_version.clone().unwrap_or_default();
        Ok(Lease::of_claim(&c)?.map(|l| (l, version)))
    }

    /// Changes the lease of sandbox `id` with `change` and writes it back,
    /// a read-modify-write: the patch carries the `resourceVersion` read,
    /// so a write of another replica in between is not overwritten (409);
    /// read again and retried, [`RMW_ATTEMPTS`] times at most. `None` when
    /// the claim is gone.
    pub async fn update(
        &self,
        sandbox_id: &str,
        change: impl Fn(&mut Lease),
    ) -> Result<Option<Lease>, KubeError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some((mut l, version)) = self.find_at(sandbox_id).await? else {
                return Ok(None);
            };
            change(&mut l);
            let patch = serde_json::json!({ "metadata": {
                "annotations": { lease::RECORD: l.record() },
                "resourceVersion": version,
            }});
            let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
            match retried(Call::Repeatable, || {
                self.claims.patch(&l.claim, &pp, &merge)
            })
            .await
            {
                Ok(_) => return Ok(Some(l)),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < RMW_ATTEMPTS => {
                    info!(claim = %l.claim, attempt, "the claim changed since it was read; reading it again");
                }
                Err(e) => return Err(self.api("patch", CLAIMS)(e)),
            }
        }
    }
}

/// Now, in unix ms.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// How many times a read-modify-write of a claim is tried when another
/// writer changed it in between.
pub const RMW_ATTEMPTS: u32 = 5;

/// How long a list of the live replicas is reused.
pub const REPLICAS_FRESH: Duration = Duration::from_secs(2);

/// Claims read per LIST request (the rest in further pages).
pub const LIST_PAGE: u32 = 500;

/// Takes [`FINALIZER`] off claim `name`: a merge patch of the other
/// finalizers at the `resourceVersion` read, so one added in between (the
/// API server's `foregroundDeletion`, another controller's) is never
/// dropped; on 409 read again, [`RMW_ATTEMPTS`] times at most.
async fn unfinalize(claims: &Api<SandboxClaim>, name: &str) -> Result<(), kube::Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(c) = retried(Call::Repeatable, || claims.get_opt(name)).await? else {
            return Ok(());
        };
        let rest: Vec<String> = c
            .metadata
            .finalizers
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FINALIZER)
            .collect();
        let patch = serde_json::json!({ "metadata": {
            "finalizers": rest,
            "resourceVersion": c.metadata.resource_version,
        }});
        let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
        match retried(Call::Repeatable, || claims.patch(name, &pp, &merge)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < RMW_ATTEMPTS => {}
            Err(e) => return Err(e),
        }
    }
}

/// Deletes a claim whose wait was dropped (the client went away, the host
/// stopped): in the background, as a drop cannot wait.
struct Unclaim {
    claims: Option<Api<SandboxClaim>>,
    name: String,
}

impl Drop for Unclaim {
    fn drop(&mut self) {
        let Some(claims) = self.claims.take() else {
            return;
        };
        let name = std::mem::take(&mut self.name);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                warn!(claim = %name, "the wait for a claim was abandoned; deleting it");
                let deleted = match claims.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) => s.code == 404,
                    Err(_) => false,
                };
                if !deleted || unfinalize(&claims, &name).await.is_err() {
                    warn!(claim = %name, "cannot delete an abandoned claim; delete it by hand");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_sandbox_id;

    #[test]
    fn only_lower_case_uuids_name_claims() {
        assert!(is_sandbox_id("6483c3d6-479c-4486-b74d-0a14678ac75f"));
        for bad in [
            "",
            "s1",
            "6483C3D6-479C-4486-B74D-0A14678AC75F",
            "6483c3d6479c4486b74d0a14678ac75f",
            "../../../../api/v1/secrets/x-0a14678ac75f",
            "6483c3d6-479c-4486-b74d-0a14678ac75f/",
            "6483c3d6-479c-4486-b74d/0a14678ac75",
        ] {
            assert!(!is_sandbox_id(bad), "{bad:?}");
        }
    }
}
