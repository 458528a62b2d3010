//! The kubernetes backend (`--backend kubernetes`): sandboxes are pods
//! claimed from agent-sandbox's warm pools through `sandbox_kube`, and
//! their leases live in their claims, so every replica behind one Service
//! serves the same fleet.
//!
//! - Acquire: a claim of the benchmark's warm pool, its pod Ready with an
//!   IP ([`Cluster::claim`]); the pod's agent bound to this lease's token
//!   (`BindToken`, called with the pools' bootstrap secret, which admits
//!   nothing on that pod afterwards); then the Acquire every backend makes.
//! - A lease's agent token is derived from the signing key every replica
//!   shares, and the lease id: any replica reaches any lease's agent, and
//!   no token of one lease is another's.
//! - The store (its [`crate::store::Leases`]): reads and writes go to
//!   the claims; live lookups of the MCP path are cached for
//!   `--kube-admit-cache-ms`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandbox_client::auth::Token;
use sandbox_client::proto;
use sandbox_kube::coord::Lock;
use sandbox_kube::lease::Phase;
use sandbox_kube::{Claimed, Fleet, KubeError, Lease};
use tracing::{info, warn};

mod leases;

use crate::fleet::{FleetError, FleetResult};
use crate::pool::{PoolError, Remote, Slot};
use crate::signed::Signer;
use crate::store::{SandboxRow, ServerRow, Status, StoreError};

/// The signed action a lease's agent token is derived under.
const AGENT_TOKEN_ACTION: &str = "agent-token";

/// What the kubernetes backend needs beyond the fleet's own settings.
pub struct ClusterConfig {
    /// The warm pools' shared bootstrap secret (`--kube-bootstrap-token-file`).
    pub bootstrap: Token,
    pub agent_port: u16,
    pub mcp_port: u16,
    /// How long a live lookup is reused (`--kube-admit-cache-ms`).
    pub admit_cache: Duration,
    /// How long binding a claimed pod's agent may take
    /// (`--kube-bind-timeout`).
    pub bind_within: Duration,
    /// How long a claimed pod's agent may take to Release before its claim
    /// is deleted anyway (`--kube-release-timeout`).
    pub release_within: Duration,
}

pub struct Cluster {
    pub fleet: Fleet,
    cfg: ClusterConfig,
    signer: Signer,
    /// Live lookups: a sandbox id → when looked up and what was found
    /// (`None`: not live). Bounded by pruning entries past their use.
    cache: Mutex<HashMap<String, (Instant, Option<SandboxRow>)>>,
    /// This process's id in the claims it makes (`Lease::host`).
    instance: String,
    /// This replica's presence: its Acquires in flight count against
    /// their owners while it is held ([`Cluster::coordinate`]).
    presence: Mutex<Option<Lock>>,
    /// The reaper's Lease, held by one replica at a time.
    reaper: Mutex<Option<Lock>>,
    /// When the reaper last deleted lapsed presences.
    pruned: Mutex<Option<Instant>>,
    /// The claims as a watch keeps them, started with the reaper's first
    /// pass (what it reads instead of listing them each pass).
    mirror: Mutex<Option<sandbox_kube::fleet::Mirror>>,
}

/// Entries kept at most this many times the cache's lifetime.
const CACHE_KEEP: u32 = 10;

impl Cluster {
    pub fn new(fleet: Fleet, cfg: ClusterConfig, signing_key: Vec<u8>) -> Cluster {
        Cluster {
            fleet,
            cfg,
            signer: Signer::new(signing_key),
            cache: Mutex::new(HashMap::new()),
            instance: uuid::Uuid::new_v4().to_string(),
            presence: Mutex::new(None),
            reaper: Mutex::new(None),
            pruned: Mutex::new(None),
            mirror: Mutex::new(None),
        }
    }

    /// Announces this replica (its presence Lease, renewed in the
    /// background) and competes for the reaper's, in the background: tried
    /// again until the API server takes them (it may be down while the
    /// host starts). Until its presence is held this replica claims
    /// nothing (its claims would read as orphaned to the others).
    pub fn coordinate(self: &std::sync::Arc<Self>) {
        let c = self.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(500);
            loop {
                if locked(&c.presence).is_none() {
                    match c.fleet.announce(&c.instance).await {
                        Ok(l) => *locked(&c.presence) = Some(l),
                        Err(e) => {
                            warn!(error = %e, "cannot announce this replica (its presence Lease); trying again")
                        }
                    }
                }
                if locked(&c.reaper).is_none() {
                    match c.fleet.reaper_lock(&c.instance).await {
                        Ok(l) => *locked(&c.reaper) = Some(l),
                        Err(e) => {
                            warn!(error = %e, "cannot compete for the reaper's Lease; trying again")
                        }
                    }
                }
                if locked(&c.presence).is_some() && locked(&c.reaper).is_some() {
                    info!(replica = %c.instance, "this replica is announced (presence Lease held)");
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
        });
    }

    /// Whether this replica's presence is held now.
    fn present(&self) -> bool {
        locked(&self.presence).as_ref().is_some_and(Lock::held)
    }

    /// Whether this replica's presence is held, waiting `within` for it
    /// (a replica just started takes it in the background).
    async fn await_presence(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.present() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Gives up this replica's Leases (a graceful stop): the next reaper
    /// takes over at once, and its Acquires in flight stop counting.
    pub async fn stop(&self) {
        let locks = [locked(&self.reaper).take(), locked(&self.presence).take()];
        for lock in locks.into_iter().flatten() {
            lock.release(Duration::from_secs(5)).await;
        }
    }

    /// Whether this replica is the reaper now.
    fn reaps(&self) -> bool {
        locked(&self.reaper).as_ref().is_some_and(Lock::held)
    }

    /// The agent token of lease `id` (the same on every replica).
    fn token_for(&self, id: &str) -> FleetResult<Token> {
        Token::new(
            &self.signer.token(AGENT_TOKEN_ACTION, id),
            "a lease's agent token",
        )
        .map_err(|e| FleetError::Internal(e.to_string()))
    }

    fn remote(&self, ip: &str, id: &str) -> FleetResult<Remote> {
        Ok(Remote {
            host: ip.to_owned(),
            grpc_port: self.cfg.agent_port,
            mcp_port: self.cfg.mcp_port,
            token: self.token_for(id)?,
        })
    }

    /// The slot of a live sandbox: its pod's agent with its lease's token.
    /// How long a claimed pod's agent may take to Release.
    pub fn release_within(&self) -> Duration {
        self.cfg.release_within
    }

    pub fn slot_of(&self, s: &SandboxRow) -> FleetResult<Slot> {
        let ip = s.endpoint.as_deref().ok_or(FleetError::AgentGone)?;
        Ok(Slot::remote(s.slot.clone(), self.remote(ip, &s.id)?))
    }

    /// Claims a pod for lease `id` of `owner`, within the owner's `cap`
    /// across replicas (decided before the claim is made), and binds its
    /// agent to the lease's token. On any failure the claim is deleted.
    pub async fn claim(
        &self,
        id: &str,
        owner: &str,
        benchmark: Option<&str>,
        expires_at_ms: Option<i64>,
        now: &str,
        cap: usize,
    ) -> FleetResult<Slot> {
        if !self.await_presence(PRESENCE_WAIT).await {
            return Err(FleetError::Cluster(KubeError::Absent {
                replica: self.instance.clone(),
            }));
        }
        let lease = Lease {
            sandbox_id: id.to_owned(),
            owner: owner.to_owned(),
            pool: self.fleet.pool_for(benchmark).map_err(cluster_error)?,
            phase: Phase::Acquiring,
            benchmark: benchmark.map(str::to_owned),
            servers: serde_json::Value::Array(Vec::new()),
            created_at: now.to_owned(),
            updated_at: now.to_owned(),
            expires_at_ms,
            claim: String::new(),
            pod_ip: None,
            host: Some(self.instance.clone()),
        };
        let claimed = self.fleet.claim(&lease, cap).await.map_err(cluster_error)?;
        // Bounded: a pod that takes the connection and never answers must
        // not hold the Acquire (and the claim) for ever.
        let bound = tokio::time::timeout(self.cfg.bind_within, self.bind(&claimed, id))
            .await
            .unwrap_or_else(|_| {
                Err(FleetError::agent("binding the pod's agent to the lease")(
                    tonic::Status::deadline_exceeded(format!(
                        "the pod's agent at {} did not answer within {} s",
                        claimed.ip,
                        self.cfg.bind_within.as_secs()
                    )),
                ))
            });
        match bound {
            Ok(slot) => Ok(slot),
            Err(e) => {
                warn!(sandbox = %id, claim = %claimed.claim, error = %e, "cannot bind the pod's agent; deleting the claim");
                self.unclaim(&claimed.claim).await;
                Err(e)
            }
        }
    }

    /// Deletes a claim, logging a failure (the claim then waits for a
    /// host's release or its shutdown time).
    pub async fn unclaim(&self, claim: &str) {
        if let Err(e) = self.fleet.release(claim).await {
            log_cluster_error(&e);
            warn!(claim, error = %e, "cannot delete the claim");
        }
    }

    /// Gives the claimed pod's agent lease `id`'s token. With the
    /// bootstrap secret refused (a retried call bound it already), the
    /// lease's own token must then be the one it admits.
    async fn bind(&self, c: &Claimed, id: &str) -> FleetResult<Slot> {
        let slot = Slot::remote(c.claim.clone(), self.remote(&c.ip, id)?);
        let token = self.token_for(id)?;
        let boot = sandbox_client::ConnectOptions {
            token: Some(self.cfg.bootstrap.clone()),
            request_timeout: Some(self.cfg.bind_within),
            ..Default::default()
        }
        .connect(&slot.agent_uri())
        .await
        .map_err(|source| {
            FleetError::AgentUnreachable(PoolError::Connect {
                slot: c.claim.clone(),
                source,
            })
        })?;
        let bound = boot
            .agent()
            .bind_token(proto::BindTokenRequest {
                token: token.expose().to_owned(),
            })
            .await;
        match bound {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::Unauthenticated => {
                let c2 = slot
                    .client(self.cfg.bind_within)
                    .await
                    .map_err(FleetError::AgentUnreachable)?;
                c2.agent()
                    .get_info(proto::GetInfoRequest {})
                    .await
                    .map_err(FleetError::agent("binding the pod's agent to the lease"))?;
            }
            Err(s) => return Err(FleetError::agent("binding the pod's agent to the lease")(s)),
        }
        info!(sandbox = %id, claim = %c.claim, sandbox_pod = %c.sandbox, "the pod's agent is bound to the lease");
        Ok(slot)
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long an Acquire waits for this replica's presence (taken in the
/// background at start) before it is refused.
const PRESENCE_WAIT: Duration = Duration::from_secs(3);

/// How often the reaper looks for presences to delete.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// A presence Lease is kept this long after it lapsed (so a replica's
/// claims can be told orphaned), then deleted.
const PRESENCE_KEPT: Duration = Duration::from_secs(3600);

/// Longer than any Acquire takes once its claim is Ready (the bind, the
/// agent's Acquire starting its servers, the record).
const ACQUIRE_AFTER_CLAIM: Duration = Duration::from_secs(15 * 60);

/// Longer than a release takes from its record to its claim deleted (the
/// pod's Release is bounded by a minute).
const RELEASED_CLAIM_LEFT: Duration = Duration::from_secs(5 * 60);

/// Whether the RFC 3339 time `at` was more than `bound` before `now_ms`.
/// A record whose time cannot be read (no host wrote it so) is taken as
/// old: the reaper ends it rather than keep it for ever. A time later
/// than now (another replica's clock ahead) is not old.
fn older_than(at: &str, now_ms: i64, bound: Duration) -> bool {
    match chrono::DateTime::parse_from_rfc3339(at) {
        Err(_) => true,
        Ok(t) => u64::try_from(now_ms - t.timestamp_millis())
            .is_ok_and(|age| Duration::from_millis(age) > bound),
    }
}

fn phase_of(s: Status) -> Phase {
    match s {
        Status::Error => Phase::Error,
        Status::Occupied | Status::Idle => Phase::Occupied,
    }
}

/// A lease as the API shows it.
fn row_of(l: Lease) -> Result<SandboxRow, StoreError> {
    let servers: Vec<ServerRow> = serde_json::from_value(l.servers)?;
    Ok(SandboxRow {
        id: l.sandbox_id,
        owner: l.owner,
        slot: l.claim,
        status: match l.phase {
            Phase::Error => Status::Error,
            _ => Status::Occupied,
        },
        benchmark: l.benchmark,
        servers,
        created_at: l.created_at,
        updated_at: l.updated_at,
        expires_at_ms: l.expires_at_ms,
        endpoint: l.pod_ip,
    })
}

/// A fleet failure as the API answers it; a forbidden call is logged
/// naming the permission the host's Role lacks.
pub fn cluster_error(e: KubeError) -> FleetError {
    log_cluster_error(&e);
    match e {
        KubeError::OwnerFull { held, limit } => FleetError::OwnerFull { held, limit },
        e => FleetError::Cluster(e),
    }
}

fn log_cluster_error(e: &KubeError) {
    if let Some(permission) = e.permission() {
        warn!(%permission, error = %e, "the Kubernetes API server forbids this host a call it needs: add the permission to its Role");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_time_is_old_and_a_later_one_is_not() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .map(|t| t.timestamp_millis())
            .unwrap_or_default();
        let min = Duration::from_secs(60);
        assert!(older_than("2026-01-01T00:58:00Z", now, min));
        assert!(!older_than("2026-01-01T00:59:30Z", now, min));
        assert!(
            !older_than("2026-01-01T01:30:00Z", now, min),
            "a clock ahead"
        );
        assert!(older_than("yesterday", now, min));
        assert!(older_than("", now, min));
    }
}
