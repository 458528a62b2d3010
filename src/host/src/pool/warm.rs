//! Warm leases: the profiles idle slots are pre-acquired with, which
//! requests a warm lease covers, and the task that keeps the pool full and
//! warm.
//!
//! A profile is a set of servers (or `ALL`) under a benchmark (or none),
//! kept on `count` idle slots. A warm lease *covers* an Acquire of the same
//! benchmark that asks for a subset of its servers (`ALL` only from an
//! `ALL` profile); the host then narrows it to what was asked (see the
//! agent's `Narrow`), so the sandbox answers at once and the servers
//! nobody asked for stop after the answer.

use std::sync::Arc;
use std::time::Duration;

use sandbox_client::proto;
use tracing::{info, warn};

use super::*;

/// The servers of a warm profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmServers {
    All,
    /// Sorted, without duplicates.
    Names(Vec<String>),
}

/// Idle slots pre-acquired with `servers` under `benchmark`, `count` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmProfile {
    /// Klavis's name (`MCP_Atlas`, `Toolathlon`, `MCP_Mark`); `None`: none.
    pub benchmark: Option<String>,
    pub servers: WarmServers,
    pub count: usize,
}

/// A `--warm` value that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WarmSpecError {
    #[error("{spec:?}: name the servers (`ALL` or names separated by commas)")]
    NoServers { spec: String },
    #[error("{spec:?}: the count after '=' must be a whole number of at least 1")]
    BadCount { spec: String },
    #[error("{spec:?}: {got:?} is not a benchmark; use MCP_Atlas, Toolathlon or MCP_Mark")]
    UnknownBenchmark { spec: String, got: String },
    #[error("{spec:?}: {got:?} is not a Local Sandbox server name ({known})")]
    UnknownServer {
        spec: String,
        got: String,
        known: String,
    },
    #[error(
        "the warm profiles keep {wanted} sandboxes warm but --pool-size is {size}; raise --pool-size or lower the counts"
    )]
    OverPool { wanted: usize, size: usize },
}

/// What an Acquire asks for, as far as warm leases are concerned.
#[derive(Debug, Clone, Default)]
pub struct Want {
    /// `None`: `ALL`.
    pub servers: Option<Vec<String>>,
    pub benchmark: Option<String>,
}

impl WarmProfile {
    /// Parses `[BENCHMARK:]SERVERS[=COUNT]`, e.g. `ALL=2` or
    /// `MCP_Atlas:filesystem,git,terminal`; the count defaults to
    /// `default_count`. `known` are the server names the API accepts.
    pub fn parse(
        spec: &str,
        default_count: usize,
        known: &[&str],
    ) -> Result<WarmProfile, WarmSpecError> {
        let s = spec.trim();
        let err_spec = || spec.to_owned();
        let (rest, count) = match s.rsplit_once('=') {
            Some((r, c)) => match c.trim().parse::<usize>() {
                Ok(n) if n >= 1 => (r, n),
                _ => return Err(WarmSpecError::BadCount { spec: err_spec() }),
            },
            None => (s, default_count),
        };
        let (benchmark, names) = match rest.split_once(':') {
            Some((b, n)) => {
                let b = b.trim();
                if proto::Benchmark::from_klavis(b).is_none() {
                    return Err(WarmSpecError::UnknownBenchmark {
                        spec: err_spec(),
                        got: b.to_owned(),
                    });
                }
                (Some(b.to_owned()), n)
            }
            None => (None, rest),
        };
        let names = names.trim();
        let servers = if names == "ALL" {
            WarmServers::All
        } else {
            let mut v: Vec<String> = names
                .split(',')
                .map(|n| n.trim().to_owned())
                .filter(|n| !n.is_empty())
                .collect();
            if v.is_empty() {
                return Err(WarmSpecError::NoServers { spec: err_spec() });
            }
            if let Some(bad) = v.iter().find(|n| !known.contains(&n.as_str())) {
                return Err(WarmSpecError::UnknownServer {
                    spec: err_spec(),
                    got: bad.clone(),
                    known: known.join(", "),
                });
            }
            v.sort();
            v.dedup();
            WarmServers::Names(v)
        };
        Ok(WarmProfile {
            benchmark,
            servers,
            count,
        })
    }

    /// Checks that the profiles fit in a pool of `size`.
    pub fn check_fit(profiles: &[WarmProfile], size: usize) -> Result<(), WarmSpecError> {
        let wanted: usize = profiles.iter().map(|p| p.count).sum();
        if wanted > size {
            return Err(WarmSpecError::OverPool { wanted, size });
        }
        Ok(())
    }

    /// How metrics and logs name the profile: `[BENCHMARK:]SERVERS`.
    pub fn label(&self) -> String {
        let servers = match &self.servers {
            WarmServers::All => "ALL".to_owned(),
            WarmServers::Names(n) => n.join(","),
        };
        match &self.benchmark {
            Some(b) => format!("{b}:{servers}"),
            None => servers,
        }
    }

    /// Whether a warm lease of this profile could cover `want` (the lease
    /// itself decides: an `ALL` lease holds what its manifest carries).
    pub fn could_cover(&self, want: &Want) -> bool {
        self.benchmark == want.benchmark
            && match (&self.servers, &want.servers) {
                // No server at all: a bare sandbox, not a warm one to trim.
                (_, Some(asked)) if asked.is_empty() => false,
                (WarmServers::All, _) => true,
                (WarmServers::Names(have), Some(asked)) => asked.iter().all(|a| have.contains(a)),
                (WarmServers::Names(_), None) => false,
            }
    }
}

/// A lease an idle slot already holds: its id, the servers it runs and the
/// profile (index into the pool's profiles) it was made for.
#[derive(Debug, Clone)]
pub struct WarmLease {
    pub lease_id: String,
    pub servers: Vec<String>,
    pub profile: usize,
}

impl WarmLease {
    /// Whether narrowing this lease gives what `want` asks for.
    pub(super) fn covers(&self, profile: &WarmProfile, want: &Want) -> bool {
        profile.benchmark == want.benchmark
            && match &want.servers {
                None => profile.servers == WarmServers::All,
                Some(asked) if asked.is_empty() => false,
                Some(asked) => asked.iter().all(|a| self.servers.contains(a)),
            }
    }
}

/// Acquires a profile's servers on an idle slot, under a lease id nobody
/// else knows.
pub(super) async fn pre_acquire(
    slot: &Slot,
    profile: &WarmProfile,
    index: usize,
    deadlines: super::Deadlines,
) -> Result<WarmLease, super::PoolError> {
    let lease_id = uuid::Uuid::new_v4().to_string();
    let (names, all) = match &profile.servers {
        WarmServers::All => (Vec::new(), true),
        WarmServers::Names(n) => (n.clone(), false),
    };
    let r = slot
        .client(deadlines.acquire)
        .await?
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: lease_id.clone(),
            server_names: names,
            all_servers: all,
            benchmark: profile
                .benchmark
                .as_deref()
                .and_then(proto::Benchmark::from_klavis)
                .unwrap_or(proto::Benchmark::Unspecified) as i32,
            // The host's reaper owns TTLs.
            ttl_seconds: Some(0),
            ..Default::default()
        })
        .await
        .map_err(|s| super::PoolError::Warm(s.message().to_owned()))?
        .into_inner();
    Ok(WarmLease {
        lease_id,
        servers: r.servers.into_iter().map(|s| s.name).collect(),
        profile: index,
    })
}

impl Pool {
    /// The profile most in need of a warm slot: the first whose ready and
    /// warming slots number fewer than its count.
    fn short_profile(&self, idle: &[Idle]) -> Option<usize> {
        self.cfg.warm.iter().enumerate().find_map(|(k, p)| {
            let have = idle
                .iter()
                .filter(|i| i.warming == Some(k) || i.warm.as_ref().is_some_and(|w| w.profile == k))
                .count();
            (have < p.count).then_some(k)
        })
    }

    /// Keeps `size` idle slots, each profile's count of them warm, until
    /// the pool is closed.
    pub async fn keep_warm(self: Arc<Self>) {
        while !self.is_closed() {
            let short = self.idle().len() < self.cfg.size;
            // At --max-slots, wait for a slot to be given back or dropped.
            let room = if short { self.reserve() } else { None };
            if let Some(room) = room {
                match self.spawn().await {
                    Ok(slot) => {
                        // A slot given back while this one started may have
                        // filled the pool already, or the pool closed.
                        let placed = self.put_idle(Idle::bare(slot));
                        drop(room);
                        if let Err(surplus) = placed {
                            self.reclaim.discard_off_runtime(surplus).await;
                        }
                    }
                    Err(_) if self.is_closed() => return,
                    Err(e) => {
                        warn!(error = %format!("{e:#}"), "cannot start a pool sandbox");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
                continue;
            }
            // The slot stays in the pool while its lease is acquired
            // (marked, so Acquire passes it over), so a close stops it.
            let next = {
                let mut idle = self.idle();
                self.short_profile(&idle).and_then(|k| {
                    idle.iter_mut()
                        .find(|i| i.warm.is_none() && i.warming.is_none())
                        .map(|i| {
                            i.warming = Some(k);
                            (k, i.slot.clone())
                        })
                })
            };
            if let Some((k, slot)) = next {
                let profile = &self.cfg.warm[k];
                let lease = pre_acquire(&slot, profile, k, self.cfg.deadlines).await;
                let failed = {
                    let mut idle = self.idle();
                    // Gone: closed, or found dead by a sweep.
                    let entry = idle.iter_mut().find(|i| i.slot.id == slot.id);
                    match (lease, entry) {
                        (Ok(w), Some(i)) => {
                            info!(slot = %slot.id, profile = %profile.label(), "warm lease ready");
                            i.warm = Some(w);
                            i.warming = None;
                            false
                        }
                        (Ok(_), None) => false,
                        (Err(e), entry) => {
                            warn!(slot = %slot.id, profile = %profile.label(), error = %format!("{e:#}"), "cannot pre-acquire the warm servers; the slot stays bare");
                            if let Some(i) = entry {
                                i.warming = None;
                            }
                            true
                        }
                    }
                };
                self.warmed.notify_waiters();
                if failed {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                continue;
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => self.sweep(),
            }
        }
    }
}

/// `--server-start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerStart {
    Auto,
    Eager,
    Lazy,
}

impl ServerStart {
    /// Whether an Acquire starts its servers on first use; `many` is
    /// `auto`'s case for it (ALL, `local_dev`).
    pub fn lazy(self, many: bool) -> bool {
        match self {
            ServerStart::Auto => many,
            ServerStart::Eager => false,
            ServerStart::Lazy => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["filesystem", "git", "terminal"];

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn want(servers: Option<&[&str]>, benchmark: Option<&str>) -> Want {
        Want {
            servers: servers.map(names),
            benchmark: benchmark.map(str::to_owned),
        }
    }

    #[test]
    fn profiles_parse_sorted_without_duplicates() {
        let p = WarmProfile::parse(" git, filesystem,,git ", 2, KNOWN).unwrap();
        assert_eq!(p.servers, WarmServers::Names(names(&["filesystem", "git"])));
        assert_eq!((p.count, p.benchmark), (2, None));
        let p = WarmProfile::parse("MCP_Atlas:ALL=3", 1, KNOWN).unwrap();
        assert_eq!(p.servers, WarmServers::All);
        assert_eq!((p.count, p.benchmark.as_deref()), (3, Some("MCP_Atlas")));
        assert_eq!(p.label(), "MCP_Atlas:ALL");
        for (bad, what) in [
            ("", "NoServers"),
            ("git=0", "BadCount"),
            ("git=x", "BadCount"),
            ("Atlas:git", "UnknownBenchmark"),
            ("git,nope", "UnknownServer"),
        ] {
            let e = WarmProfile::parse(bad, 1, KNOWN).unwrap_err();
            assert!(format!("{e:?}").starts_with(what), "{bad}: {e:?}");
        }
        let two = [
            WarmProfile::parse("ALL=2", 1, KNOWN).unwrap(),
            WarmProfile::parse("git", 1, KNOWN).unwrap(),
        ];
        assert!(WarmProfile::check_fit(&two, 3).is_ok());
        assert_eq!(
            WarmProfile::check_fit(&two, 2),
            Err(WarmSpecError::OverPool { wanted: 3, size: 2 })
        );
    }

    #[test]
    fn a_warm_lease_covers_subsets_of_its_servers_under_its_benchmark() {
        let p = WarmProfile::parse("git,filesystem,terminal", 1, KNOWN).unwrap();
        let w = WarmLease {
            lease_id: "w".into(),
            servers: names(&["filesystem", "git", "terminal"]),
            profile: 0,
        };
        assert!(w.covers(&p, &want(Some(&["git"]), None)));
        assert!(w.covers(&p, &want(Some(&["terminal", "git", "filesystem"]), None)));
        assert!(!w.covers(&p, &want(Some(&["git", "excel"]), None)));
        assert!(!w.covers(&p, &want(Some(&["git"]), Some("MCP_Atlas"))));
        assert!(!w.covers(&p, &want(None, None)), "ALL needs an ALL profile");
        let all = WarmProfile::parse("Toolathlon:ALL", 1, KNOWN).unwrap();
        assert!(w.covers(&all, &want(None, Some("Toolathlon"))));
        assert!(!w.covers(&all, &want(None, None)));
        assert!(p.could_cover(&want(Some(&["git"]), None)));
        assert!(!p.could_cover(&want(Some(&["git"]), Some("MCP_Mark"))));
        assert!(all.could_cover(&want(Some(&["excel"]), Some("Toolathlon"))));
    }
}
