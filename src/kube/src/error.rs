//! The fleet's errors, by cause. The host maps each to a status in its one
//! place (`HostError::status`): every one of these is a 503 but a lease
//! that is not there.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No sandbox of the pool became Ready with a pod IP within the wait.
    #[error(
        "no sandbox of warm pool {pool:?} was ready within {:.1} s (claim {claim}): the pool is empty or its pods are slow to start; raise its replicas or --kube-claim-timeout",
        waited.as_secs_f64()
    )]
    PoolEmpty {
        pool: String,
        claim: String,
        waited: Duration,
    },
    /// The controller gave up on the claim (a missing pool or template,
    /// refused metadata, expiry).
    #[error("claim {claim} of warm pool {pool:?} failed: {reason}")]
    ClaimFailed {
        pool: String,
        claim: String,
        reason: String,
    },
    /// No warm pool serves this benchmark.
    #[error(
        "no warm pool serves benchmark {benchmark:?} and no default pool is configured (--kube-pool)"
    )]
    NoPool { benchmark: String },
    /// The API server refused this host's service account.
    #[error(
        "the Kubernetes API server forbids {verb} on {resource} in namespace {namespace:?} to this host: grant it in the host's Role ({message})"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        namespace: String,
        message: String,
    },
    /// The API server could not be reached, or answered with an error.
    #[error("the Kubernetes API server failed {verb} on {resource}: {source}")]
    Api {
        verb: &'static str,
        resource: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    /// A watch the API server could not keep (it ended, or its events
    /// carried no resourceVersion to resume from).
    #[error("the Kubernetes API server's watch of {resource} {name} failed: {reason}")]
    Watch {
        resource: &'static str,
        name: String,
        reason: String,
    },
    /// The owner holds its cap of sandboxes (counted across replicas
    /// before any claim is made).
    #[error("the owner holds {held} sandboxes, its limit is {limit}")]
    OwnerFull { held: usize, limit: usize },
    /// Replicas kept writing the owner's ledger: the admission gave up.
    #[error(
        "too many Acquires of this owner at once across replicas (ledger {ledger} kept changing); try again"
    )]
    Contended { ledger: String },
    /// This replica does not hold its presence Lease (yet, or any more):
    /// it makes no claim, which the others would take as orphaned.
    #[error(
        "this host replica ({replica}) is not announced to the others yet (its presence Lease in coordination.k8s.io is not held: the API server is unreachable, or the host's Role lacks leases); try again"
    )]
    Absent { replica: String },
    /// kube-lease-manager could not set up a coordination Lease.
    #[error("cannot hold coordination Lease {lease}: {source}")]
    Coordination {
        lease: String,
        #[source]
        source: Box<kube_lease_manager::LeaseManagerError>,
    },
    /// A sandbox id that is not a UUID (hosts make only those).
    #[error("sandbox id {0:?} is not a UUID")]
    BadId(String),
    /// A claim's lease annotation that is not a lease.
    #[error("claim {claim} carries a lease annotation that cannot be read: {source}")]
    BadRecord {
        claim: String,
        #[source]
        source: serde_json::Error,
    },
}

impl KubeError {
    /// An API call's error, with what was asked: 403 is [`KubeError::Forbidden`].
    pub(crate) fn api(
        verb: &'static str,
        resource: &'static str,
        namespace: &str,
    ) -> impl FnOnce(kube::Error) -> KubeError {
        let namespace = namespace.to_owned();
        move |e| match &e {
            kube::Error::Api(s) if s.code == 403 => KubeError::Forbidden {
                verb,
                resource,
                namespace,
                message: s.message.clone(),
            },
            _ => KubeError::Api {
                verb,
                resource,
                source: Box::new(e),
            },
        }
    }

    /// The permission named in the log line of a forbidden call.
    pub fn permission(&self) -> Option<String> {
        match self {
            KubeError::Forbidden { verb, resource, .. } => Some(format!("{verb} {resource}")),
            _ => None,
        }
    }
}
