//! Leasing and ending sandboxes, for both of Klavis's APIs
//! (`/local-sandbox` and `/sandbox/{server}`): a slot from the pool leased
//! under a new id (by narrowing a warm lease or a cold Acquire), stored,
//! counted against its owner's cap; reset; released in the background.

use std::collections::BTreeMap;

use sandbox_client::proto;
use serde_json::Value;
use tracing::{info, warn};

use crate::fleet::Ask;
use crate::pool::{Miss, Slot, Taken, Want, WarmLease};
use crate::store::{SandboxRow, ServerRow, Status};

use super::{LeaseError, LeaseResult, Shared, now_ms, struct_json, timestamp};

/// What an Acquire asks for, checked (`api::validation` makes it from
/// either API's body).
pub struct AcquireAsk {
    pub servers: Option<Vec<String>>,
    pub benchmark: Option<String>,
    /// `benchmark` as the agent's enum.
    pub benchmark_proto: i32,
    pub email: String,
    pub ttl: Option<u32>,
    /// Many servers a task uses few of (ALL, `local_dev`): under
    /// `--server-start auto` they start on first use.
    pub many: bool,
}

/// What a leased slot carries: its servers, the warm profile on a hit (or
/// why not), the servers of ALL not started, and each server's auth_data.
struct Leased {
    servers: Vec<String>,
    profile: Option<usize>,
    miss: Option<Miss>,
    skipped: Vec<proto::SkippedServer>,
    auth: BTreeMap<String, Value>,
}

/// A sandbox just leased.
pub struct NewLease {
    /// As stored.
    pub row: SandboxRow,
    /// The servers of ALL not started, with why.
    pub skipped: Vec<proto::SkippedServer>,
    /// Its servers start on first use.
    pub lazy: bool,
}

/// Leases a sandbox for `who` as `req` asks.
pub async fn lease(h: &Shared, who: String, req: &AcquireAsk) -> LeaseResult<NewLease> {
    check_servers_known(h, req)?;
    let _claim = OwnerClaim::take(h, &who).await?;
    let started = std::time::Instant::now();
    let id = uuid::Uuid::new_v4().to_string();
    // Dropped before the lease is stored (the client went away: while the
    // pod's agent is bound, acquires, or the lease is recorded), what was
    // taken is given up: no claim stays `acquiring`, reaped by no one.
    let mut guard = h.fleet.guard(&id);
    let ask = Ask {
        id: &id,
        owner: &who,
        want: Want {
            servers: req.servers.clone(),
            benchmark: req.benchmark.clone(),
        },
        expires_at_ms: expires_at(h, req),
        now: &timestamp(),
        cap: h.max_per_owner,
    };
    let taken = match h.fleet.take(ask).await {
        Ok(t) => t,
        Err(e) => {
            // A failed claim or bind deleted the claim already.
            guard.keep();
            h.metrics.failed();
            return Err(e.into());
        }
    };
    let slot = taken.slot.clone();
    let lazy = h.server_start.lazy(req.many);
    let mut leased = match lease_slot(&slot, taken, req, &id, lazy, h.fleet.deadlines()).await {
        Ok(l) => l,
        Err(e) => {
            h.metrics.failed();
            h.fleet.abandon(slot).await;
            guard.keep();
            return Err(e);
        }
    };
    h.fleet.leased(&slot).await;
    let (profile, miss) = (leased.profile, leased.miss.take());
    // A warm lease's servers are running, whatever was asked.
    let lazy = lazy && profile.is_none();
    let (row, skipped) = stored_row(h, req, id, who, &slot, leased);
    if let Err(e) = h.store.insert(&row).await {
        h.metrics.failed();
        h.fleet.unrecorded(&slot).await;
        guard.keep();
        return Err(e.into());
    }
    guard.keep();
    h.metrics.acquired(profile, miss, started.elapsed());
    info!(sandbox = %row.id, slot = %slot.id, servers = row.servers.len(), warm = profile.is_some(), lazy, "acquired");
    Ok(NewLease { row, skipped, lazy })
}

/// When a lease of `req` made now expires (unix ms), if it has a TTL.
fn expires_at(h: &Shared, req: &AcquireAsk) -> Option<i64> {
    req.ttl
        .map(|t| now_ms() + (f64::from(t) * 1000.0 * h.time_scale) as i64)
}

/// Names of the API that this host's sandboxes do not carry: a 400 naming
/// them and what they do carry.
fn check_servers_known(h: &Shared, req: &AcquireAsk) -> LeaseResult<()> {
    let Some((missing, known)) = req
        .servers
        .as_deref()
        .and_then(|asked| h.fleet.missing_servers(asked))
    else {
        return Ok(());
    };
    // The agents leave out the manifest's servers that are not installed.
    Err(LeaseError::BadRequest(format!(
        "acquire: unknown server{} {}; this host's sandboxes carry: {} (a server of the manifest that is not installed is left out: `packaging/install-servers.sh {}` installs it)",
        if missing.len() > 1 { "s" } else { "" },
        missing.join(", "),
        known.join(", "),
        missing.join(" ")
    )))
}

/// The sandbox as stored, its servers in the order asked for (a warm lease
/// lists its profile's order); and the servers of ALL not started.
fn stored_row(
    h: &Shared,
    req: &AcquireAsk,
    id: String,
    owner: String,
    slot: &Slot,
    leased: Leased,
) -> (SandboxRow, Vec<proto::SkippedServer>) {
    let Leased {
        mut servers,
        mut auth,
        skipped,
        ..
    } = leased;
    if let Some(asked) = &req.servers {
        servers.sort_by_key(|n| asked.iter().position(|a| a == n).unwrap_or(usize::MAX));
    }
    let now = timestamp();
    let row = SandboxRow {
        id,
        owner,
        slot: slot.id.clone(),
        status: Status::Occupied,
        benchmark: req.benchmark.clone(),
        servers: servers
            .into_iter()
            .map(|name| ServerRow {
                auth_data: auth.remove(&name),
                name,
                id: uuid::Uuid::new_v4().to_string(),
            })
            .collect(),
        created_at: now.clone(),
        updated_at: now,
        expires_at_ms: expires_at(h, req),
        endpoint: slot.pod().map(|r| r.host.clone()),
    };
    (row, skipped)
}

/// Acquire's message: the servers started (or, lazy, to start on first
/// use), and for ALL the servers whose outside service is not configured,
/// named with what they need.
pub fn acquire_message(l: &NewLease) -> String {
    let NewLease { row, skipped, lazy } = l;
    let names: Vec<&str> = row.servers.iter().map(|s| s.name.as_str()).collect();
    let mut message = format!(
        "Local sandbox acquired with {} server(s): {}",
        names.len(),
        names.join(", ")
    );
    if *lazy && !names.is_empty() {
        message.push_str("; each starts on its first MCP request");
    }
    if !skipped.is_empty() {
        let left: Vec<String> = skipped
            .iter()
            .map(|s| format!("{} ({})", s.name, s.reason))
            .collect();
        message.push_str(&format!(
            "; not started, their outside service is not configured: {}",
            left.join("; ")
        ));
    }
    message
}

/// One Acquire of an owner in flight, counted against the per-owner cap
/// together with its live sandboxes; released on drop (the sandbox, once
/// stored, counts by itself).
struct OwnerClaim {
    h: Shared,
    who: String,
}

impl OwnerClaim {
    /// Room for one more of `who`'s sandboxes. Where only its released
    /// sandboxes still being cleaned up are in the way, waits (at most
    /// `--agent-release-timeout`) for one of them to be clean.
    async fn take(h: &Shared, who: &str) -> LeaseResult<OwnerClaim> {
        let deadline = tokio::time::Instant::now() + h.fleet.deadlines().release;
        loop {
            let cleaned = h.cleaning.cleaned();
            tokio::pin!(cleaned);
            cleaned.as_mut().enable();
            let cleaning = match Self::try_take(h, who).await? {
                Ok(claim) => return Ok(claim),
                Err(cleaning) => cleaning,
            };
            if tokio::time::timeout_at(deadline, cleaned).await.is_err() {
                let live = h.store.held(who).await?;
                return Err(LeaseError::TooManySandboxes {
                    held: live,
                    cleaning,
                    limit: h.max_per_owner,
                });
            }
        }
    }

    /// The claim, or (`Err`) how many of `who`'s released sandboxes still
    /// being cleaned up are all that is in the way.
    async fn try_take(h: &Shared, who: &str) -> LeaseResult<Result<OwnerClaim, usize>> {
        // The live sandboxes the store counts here (where replicas share
        // the leases, the fleet decides the cap across them when it
        // takes the sandbox); this replica's Acquires are counted under
        // the lock, so two of them cannot both see room.
        let live = h.store.held(who).await?;
        let cleaning = h.cleaning.get(who);
        let mut acquiring = h.acquiring.lock().unwrap_or_else(|p| p.into_inner());
        let n = acquiring.entry(who.to_owned()).or_default();
        if live + *n >= h.max_per_owner {
            return Err(LeaseError::TooManySandboxes {
                held: live + *n,
                cleaning: 0,
                limit: h.max_per_owner,
            });
        }
        if live + cleaning + *n >= h.max_per_owner {
            return Ok(Err(cleaning));
        }
        *n += 1;
        Ok(Ok(OwnerClaim {
            h: h.clone(),
            who: who.to_owned(),
        }))
    }
}

impl Drop for OwnerClaim {
    fn drop(&mut self) {
        let mut acquiring = self.h.acquiring.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = acquiring.get_mut(&self.who) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                acquiring.remove(&self.who);
            }
        }
    }
}

/// Leases `slot` as sandbox `id`: by narrowing the warm lease it holds
/// when that covers the request, else by a cold Acquire (after ending a
/// warm lease that does not cover it, or that the agent would not narrow).
/// Returns the servers, the warm profile on a hit, and why not otherwise.
async fn lease_slot(
    slot: &Slot,
    taken: Taken,
    req: &AcquireAsk,
    id: &str,
    lazy: bool,
    deadlines: crate::pool::Deadlines,
) -> LeaseResult<Leased> {
    let c = slot
        .client(deadlines.acquire)
        .await
        .map_err(LeaseError::AgentUnreachable)?;
    let mut miss = taken.miss;
    let to_end = match taken.warm {
        Some(w) if taken.covers => match narrow(&c, &w, req, id).await? {
            Ok(leased) => return Ok(leased),
            Err(why) => {
                warn!(slot = %slot.id, error = %why, "the warm lease cannot serve this Acquire; starting cold");
                miss = Some(Miss::Refused);
                Some(w)
            }
        },
        other => other,
    };
    if let Some(w) = to_end {
        end_warm(&c, w).await?;
    }
    cold(&c, req, id, lazy, miss).await
}

/// Narrows warm lease `w` to sandbox `id`; `Err` with the agent's words
/// when it will not (the lease cannot serve the request).
async fn narrow(
    c: &sandbox_client::Client,
    w: &WarmLease,
    req: &AcquireAsk,
    id: &str,
) -> LeaseResult<Result<Leased, String>> {
    let narrowed = c
        .agent()
        .narrow(proto::NarrowRequest {
            lease_id: w.lease_id.clone(),
            new_lease_id: id.to_owned(),
            // ALL: every server the warm lease holds.
            server_names: req.servers.clone().unwrap_or_else(|| w.servers.clone()),
            benchmark: req.benchmark_proto,
            ttl_seconds: Some(0),
            test_account_email: req.email.clone(),
        })
        .await;
    match narrowed {
        Ok(r) => {
            let r = r.into_inner();
            let auth = auth_data(r.lease.as_ref());
            Ok(Ok(Leased {
                servers: r.servers.into_iter().map(|s| s.name).collect(),
                profile: Some(w.profile),
                miss: None,
                skipped: Vec::new(),
                auth,
            }))
        }
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::FailedPrecondition | tonic::Code::NotFound
            ) =>
        {
            Ok(Err(s.message().to_owned()))
        }
        Err(s) => Err(LeaseError::agent("acquire")(s)),
    }
}

/// Ends a warm lease of other servers before a cold Acquire (gone already
/// is fine).
async fn end_warm(c: &sandbox_client::Client, w: WarmLease) -> LeaseResult<()> {
    let ended = c
        .agent()
        .release(proto::ReleaseRequest {
            lease_id: w.lease_id,
            is_ttl: false,
            ..Default::default()
        })
        .await;
    match ended {
        Err(s) if s.code() != tonic::Code::NotFound => {
            Err(LeaseError::agent("releasing the warm lease")(s))
        }
        _ => Ok(()),
    }
}

/// A cold Acquire of sandbox `id` (its servers started now, or on first
/// use when `lazy`).
async fn cold(
    c: &sandbox_client::Client,
    req: &AcquireAsk,
    id: &str,
    lazy: bool,
    miss: Option<Miss>,
) -> LeaseResult<Leased> {
    let r = c
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: id.to_owned(),
            server_names: req.servers.clone().unwrap_or_default(),
            all_servers: req.servers.is_none(),
            no_servers: req.servers.as_ref().is_some_and(Vec::is_empty),
            benchmark: req.benchmark_proto,
            // The host's reaper owns the TTL (it survives host restarts in
            // the database).
            ttl_seconds: Some(0),
            test_account_email: req.email.clone(),
            lazy,
            ..Default::default()
        })
        .await
        .map_err(|s| {
            // A name of the API that this sandbox's manifest (or VM image)
            // does not carry is the request's fault, not a missing resource.
            if s.code() == tonic::Code::NotFound {
                LeaseError::BadRequest(format!("acquire: {}", s.message()))
            } else {
                LeaseError::agent("acquire")(s)
            }
        })?
        .into_inner();
    let auth = auth_data(r.lease.as_ref());
    Ok(Leased {
        servers: r.servers.into_iter().map(|s| s.name).collect(),
        profile: None,
        miss,
        skipped: r.lease.map(|l| l.skipped).unwrap_or_default(),
        auth,
    })
}

/// The lease's per-server auth_data as JSON.
fn auth_data(lease: Option<&proto::Lease>) -> BTreeMap<String, Value> {
    lease
        .map(|l| {
            l.auth_data
                .iter()
                .map(|(server, s)| (server.clone(), struct_json(s)))
                .collect()
        })
        .unwrap_or_default()
}
