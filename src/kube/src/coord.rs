//! Coordination between host replicas, through `coordination.k8s.io`
//! Leases in the fleet's namespace (the shipped Role grants them):
//!
//! - **presence**: each replica holds `sandbox-host-replica-<instance>`,
//!   renewed by kube-lease-manager. A claim names the replica that made it
//!   ([`Lease::host`]), so a claim left `acquiring` by a replica whose
//!   presence lapsed (killed mid-Acquire) is known orphaned within
//!   [`CoordConfig::presence_ttl`] plus [`SKEW`]: it stops counting
//!   against its owner and the reaper deletes it.
//! - **the reaper**: `sandbox-host-reaper`, held by one replica at a time
//!   (leader election); only its holder releases expired leases.
//! - **admission**: an owner's ledger `sandbox-host-owner-<hash>` holds the
//!   Acquires admitted and not yet claimed. An Acquire counts the owner's
//!   claims and reservations, then writes its own reservation at the
//!   ledger's `resourceVersion`: of two replicas racing, the second write
//!   is refused (409) and counts again, so the cap is decided before any
//!   claim is made and a refused Acquire spends no warm pod.
//!
//! [`Lease::host`]: crate::Lease::host

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease as KLease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube_lease_manager::LeaseManagerBuilder;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::error::KubeError;
use crate::lease::{self, Lease, Phase};
use crate::retry::{Call, retried};

/// Presence Leases: this prefix and the replica's instance id.
pub const PRESENCE_PREFIX: &str = "sandbox-host-replica-";
/// The reaper's Lease.
pub const REAPER: &str = "sandbox-host-reaper";
/// Owner ledgers: this prefix and [`lease::owner_hash`].
pub const LEDGER_PREFIX: &str = "sandbox-host-owner-";
/// The ledger's annotation: sandbox id → [`Reservation`], as JSON.
pub const RESERVATIONS: &str = "sandbox-agent.dev/reservations";
/// Clocks of replicas may differ by this much: a presence is live until
/// its renewal plus its duration plus this.
pub const SKEW: Duration = Duration::from_secs(5);
/// How many times an admission counts again after another replica wrote
/// the ledger in between.
pub const ADMIT_ATTEMPTS: u32 = 20;

const LEASES: &str = "leases";

/// The coordination settings (the host's `--kube-*` flags).
#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// How long a replica's presence (and the reaper's lock) lasts past
    /// its last renewal; renewed a third of it before.
    pub presence_ttl: Duration,
    /// How long an admitted Acquire's reservation counts before its claim
    /// must exist (it is removed as soon as the claim is made or refused).
    pub reservation_ttl: Duration,
}

impl Default for CoordConfig {
    fn default() -> Self {
        CoordConfig {
            presence_ttl: Duration::from_secs(30),
            reservation_ttl: Duration::from_secs(60),
        }
    }
}

/// An Acquire admitted, or refused at the owner's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// The owner holds `held` sandboxes (claims and admitted Acquires).
    Full {
        held: usize,
    },
}

/// An admitted Acquire not yet claimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The replica that admitted it.
    pub replica: String,
    /// Unix ms after which it no longer counts.
    pub until_ms: i64,
}

/// A Lease kept by kube-lease-manager (renewed in the background) while
/// this lives; released when dropped.
pub struct Lock {
    held: watch::Receiver<bool>,
    task:
        JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
}

impl Lock {
    /// Takes Lease `name` for `identity` as soon as it is free, and keeps
    /// it, in the background.
    pub async fn take(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Lock, KubeError> {
        let secs = ttl.as_secs().max(3);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(secs)
            .with_grace((secs / 3).max(1))
            .with_field_manager(format!("sandbox-host-{identity}"))
            .build()
            .await
            .map_err(|source| KubeError::Coordination {
                lease: name.to_owned(),
                source: Box::new(source),
            })?;
        let (held, task) = manager.watch().await;
        Ok(Lock { held, task })
    }

    /// Whether this process holds it now.
    pub fn held(&self) -> bool {
        *self.held.borrow()
    }

    /// Gives it up (for the next holder at once, not after it lapses),
    /// within `within`.
    pub async fn release(self, within: Duration) {
        let Lock { held, task } = self;
        drop(held);
        if tokio::time::timeout(within, task).await.is_err() {
            warn!("a coordination Lease was not released in time; it lapses by itself");
        }
    }
}

/// Whether presence `l` is live at `now_ms`.
fn live(l: &KLease, now_ms: i64) -> bool {
    let Some(spec) = &l.spec else { return false };
    let holder = spec
        .holder_identity
        .as_deref()
        .is_some_and(|h| !h.is_empty());
    let (Some(renew), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return false;
    };
    let until = renew.0.as_millisecond() + i64::from(secs) * 1000 + SKEW.as_millis() as i64;
    holder && until > now_ms
}

/// The replicas whose presence is live.
pub(crate) async fn live_replicas(
    leases: &Api<KLease>,
    namespace: &str,
    now_ms: i64,
) -> Result<HashSet<String>, KubeError> {
    let lp = ListParams::default();
    let list = retried(Call::Repeatable, || leases.list(&lp))
        .await
        .map_err(KubeError::api("list", LEASES, namespace))?;
    Ok(list
        .items
        .iter()
        .filter(|l| live(l, now_ms))
        .filter_map(|l| l.metadata.name.as_deref()?.strip_prefix(PRESENCE_PREFIX))
        .map(str::to_owned)
        .collect())
}

/// Presence Leases that lapsed longer ago than `older`: deleted by the
/// reaper (a replica that stopped leaves its Lease released).
pub(crate) async fn stale_presences(
    leases: &Api<KLease>,
    namespace: &str,
    now_ms: i64,
    older: Duration,
) -> Result<Vec<String>, KubeError> {
    let lp = ListParams::default();
    let list = retried(Call::Repeatable, || leases.list(&lp))
        .await
        .map_err(KubeError::api("list", LEASES, namespace))?;
    let lapsed_at = |l: &KLease| {
        let spec = l.spec.as_ref()?;
        let renew = spec.renew_time.as_ref()?.0.as_millisecond();
        Some(renew + i64::from(spec.lease_duration_seconds.unwrap_or(0)) * 1000)
    };
    Ok(list
        .items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(PRESENCE_PREFIX))
        })
        .filter(|l| !live(l, now_ms))
        // Released (no renewal left) or lapsed long ago.
        .filter(|l| lapsed_at(l).is_none_or(|t| now_ms - t > older.as_millis() as i64))
        .filter_map(|l| l.metadata.name.clone())
        .collect())
}

/// Whether `l` was left `acquiring` by a replica gone: it names a replica
/// whose presence is not live, and was made more than `grace` before
/// `now_ms` (a presence's lifetime plus [`SKEW`]: a young claim may be
/// one of a replica that just started, or seen through a list of
/// replicas a moment old). A time that cannot be read is old.
pub fn orphaned(l: &Lease, replicas: &HashSet<String>, now_ms: i64, grace: Duration) -> bool {
    let gone = l.host.as_ref().is_some_and(|h| !replicas.contains(h));
    let old = match l.created_at.parse::<k8s_openapi::jiff::Timestamp>() {
        Err(_) => true,
        Ok(t) => now_ms - t.as_millisecond() > grace.as_millis() as i64,
    };
    l.phase == Phase::Acquiring && gone && old
}

/// Whether `l` holds a place against its owner's cap: not released, and
/// not [`orphaned`].
pub fn counts(l: &Lease, replicas: &HashSet<String>, now_ms: i64, grace: Duration) -> bool {
    l.phase != Phase::Released && !orphaned(l, replicas, now_ms, grace)
}

/// The owner's places: the claims that count, and the reservations still
/// valid whose claim is not among them; and those reservations.
pub(crate) fn places(
    claims: &[Lease],
    reservations: BTreeMap<String, Reservation>,
    replicas: &HashSet<String>,
    now_ms: i64,
    grace: Duration,
) -> (usize, BTreeMap<String, Reservation>) {
    let ids: HashSet<&str> = claims.iter().map(|l| l.sandbox_id.as_str()).collect();
    let counted = claims
        .iter()
        .filter(|l| counts(l, replicas, now_ms, grace))
        .count();
    let valid: BTreeMap<String, Reservation> = reservations
        .into_iter()
        .filter(|(id, r)| r.until_ms > now_ms && !ids.contains(id.as_str()))
        .collect();
    (counted + valid.len(), valid)
}

/// The ledger's name for `owner`.
pub fn ledger_name(owner: &str) -> String {
    format!("{LEDGER_PREFIX}{}", lease::owner_hash(owner))
}

/// The reservations a ledger holds (an unreadable annotation: none).
pub(crate) fn reservations_of(l: &KLease) -> BTreeMap<String, Reservation> {
    let raw = l
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESERVATIONS));
    match raw.map(|r| serde_json::from_str(r)) {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            warn!(error = %e, ledger = ?l.metadata.name, "an owner ledger's reservations cannot be read; counting none");
            BTreeMap::new()
        }
        None => BTreeMap::new(),
    }
}

/// A new ledger holding `reservations`.
pub(crate) fn ledger(name: &str, reservations: &BTreeMap<String, Reservation>) -> KLease {
    KLease {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                lease::MANAGED_BY.to_owned(),
                lease::MANAGER.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                RESERVATIONS.to_owned(),
                serde_json::to_string(reservations).unwrap_or_default(),
            )])),
            ..Default::default()
        },
        spec: None,
    }
}

/// Writes `reservations` to ledger `name` at `version` (`None`: creates
/// it). `Ok(false)`: another replica wrote it first.
pub(crate) async fn write_ledger(
    leases: &Api<KLease>,
    namespace: &str,
    name: &str,
    version: Option<&str>,
    reservations: &BTreeMap<String, Reservation>,
) -> Result<bool, KubeError> {
    let written = match version {
        None => {
            let l = ledger(name, reservations);
            let pp = PostParams::default();
            retried(Call::Create, || leases.create(&pp, &l))
                .await
                .map(|_| ())
        }
        Some(v) => {
            let patch = serde_json::json!({ "metadata": {
                "annotations": { RESERVATIONS: serde_json::to_string(reservations).unwrap_or_default() },
                "resourceVersion": v,
            }});
            let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
            retried(Call::Repeatable, || leases.patch(name, &pp, &merge))
                .await
                .map(|_| ())
        }
    };
    match written {
        Ok(()) => Ok(true),
        // 409: changed since read, or created meanwhile; 404: deleted.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
        Err(e) => Err(KubeError::api(
            if version.is_some() { "patch" } else { "create" },
            LEASES,
            namespace,
        )(e)),
    }
}

/// Takes reservation `id` off ledger `name` (it counts no more: its claim
/// exists or was never made). Best effort: a failure leaves it to lapse.
pub(crate) async fn unreserve(leases: &Api<KLease>, namespace: &str, name: &str, id: &str) {
    for _ in 0..ADMIT_ATTEMPTS {
        let got = retried(Call::Repeatable, || leases.get_opt(name)).await;
        let l = match got {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                warn!(ledger = name, error = %e, "cannot read an owner ledger; the reservation lapses by itself");
                return;
            }
        };
        let mut r = reservations_of(&l);
        if r.remove(id).is_none() {
            return;
        }
        let version = l.metadata.resource_version.clone().unwrap_or_default();
        match write_ledger(leases, namespace, name, Some(&version), &r).await {
            Ok(true) => return,
            Ok(false) => info!(ledger = name, "the owner ledger changed since read; again"),
            Err(e) => {
                warn!(ledger = name, error = %e, "cannot write an owner ledger; the reservation lapses by itself");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: &str, phase: Phase, host: Option<&str>) -> Lease {
        Lease {
            sandbox_id: id.to_owned(),
            owner: "o".to_owned(),
            pool: "p".to_owned(),
            phase,
            benchmark: None,
            servers: serde_json::Value::Null,
            // 1 s after the epoch.
            created_at: "1970-01-01T00:00:01Z".to_owned(),
            updated_at: String::new(),
            expires_at_ms: None,
            claim: String::new(),
            pod_ip: None,
            host: host.map(str::to_owned),
        }
    }

    #[test]
    fn a_place_is_a_live_claim_a_claim_of_a_live_replica_or_a_valid_reservation() {
        let replicas = HashSet::from(["r1".to_owned()]);
        let claims = [
            claim("a", Phase::Occupied, Some("gone")),
            claim("b", Phase::Error, None),
            claim("c", Phase::Acquiring, Some("r1")),
            // Orphaned: its replica's presence lapsed, and it is older
            // than the grace.
            claim("d", Phase::Acquiring, Some("gone")),
            claim("e", Phase::Released, Some("r1")),
            claim("f", Phase::Acquiring, None),
            // A replica not seen yet (just started), its claim young.
            Lease {
                created_at: "1970-01-01T00:01:00Z".to_owned(),
                ..claim("g", Phase::Acquiring, Some("new"))
            },
        ];
        let r = |until_ms| Reservation {
            replica: "r1".to_owned(),
            until_ms,
        };
        let reservations = BTreeMap::from([
            // Its claim exists: counted once.
            ("c".to_owned(), r(90_000)),
            ("x".to_owned(), r(90_000)),
            // Lapsed.
            ("y".to_owned(), r(59_999)),
        ]);
        // At 61 s, with 30 s of grace.
        let grace = Duration::from_secs(30);
        let (held, kept) = places(&claims, reservations, &replicas, 61_000, grace);
        assert_eq!(held, 6, "a, b, c, f, g and x");
        assert_eq!(kept.keys().collect::<Vec<_>>(), ["x"]);
    }
}
