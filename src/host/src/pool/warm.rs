//! Warm leases: the profile idle slots are pre-acquired with, which
//! requests it serves, and the task that keeps the pool full and warm.

use std::sync::Arc;
use std::time::Duration;

use sandbox_client::proto;
use tracing::{info, warn};

use super::*;

/// The servers idle slots are pre-acquired with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmProfile {
    All,
    Servers(Vec<String>),
}

impl WarmProfile {
    /// Parses `--warm-servers`: `ALL` or a comma-separated list.
    pub fn parse(s: &str) -> Option<WarmProfile> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        if s == "ALL" {
            return Some(WarmProfile::All);
        }
        let mut names: Vec<String> = s
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        Some(WarmProfile::Servers(names))
    }

    /// Does an Acquire of `servers` (None: ALL) without benchmark, email or
    /// auth data match this profile?
    pub fn matches(&self, servers: Option<&[String]>) -> bool {
        match (self, servers) {
            (WarmProfile::All, None) => true,
            (WarmProfile::Servers(want), Some(asked)) => {
                let mut asked = asked.to_vec();
                asked.sort();
                asked.dedup();
                &asked == want
            }
            _ => false,
        }
    }
}

/// A lease an idle slot already holds: its id (the future sandbox id) and
/// the servers it runs.
#[derive(Debug, Clone)]
pub struct WarmLease {
    pub lease_id: String,
    pub servers: Vec<String>,
}

/// Acquires the warm profile's servers on an idle slot, under the id its
/// sandbox will have.
pub(super) async fn pre_acquire(slot: &Slot, profile: &WarmProfile) -> anyhow::Result<WarmLease> {
    let lease_id = uuid::Uuid::new_v4().to_string();
    let (names, all) = match profile {
        WarmProfile::All => (Vec::new(), true),
        WarmProfile::Servers(n) => (n.clone(), false),
    };
    let r = slot
        .client()
        .await?
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: lease_id.clone(),
            server_names: names,
            all_servers: all,
            // The host's reaper owns TTLs.
            ttl_seconds: Some(0),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    Ok(WarmLease {
        lease_id,
        servers: r.servers.into_iter().map(|s| s.name).collect(),
    })
}

impl Pool {
    /// Keeps `size` idle slots, each holding a warm lease when a profile is
    /// set, until the pool is closed.
    pub async fn keep_warm(self: Arc<Self>) {
        while !self.is_closed() {
            let short = self.idle().len() < self.cfg.size;
            if short {
                match self.spawn().await {
                    Ok(slot) => {
                        // A slot given back while this one started may have
                        // filled the pool already, or the pool closed.
                        if let Err(surplus) = self.put_idle(Idle::bare(slot)) {
                            let _ = tokio::task::spawn_blocking(move || discard(&surplus)).await;
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
            if let Some(profile) = self.cfg.warm.clone() {
                // The slot stays in the pool while its lease is acquired
                // (marked, so Acquire passes it over), so a close stops it.
                let bare = self
                    .idle()
                    .iter_mut()
                    .find(|i| i.warm.is_none() && !i.warming)
                    .map(|i| {
                        i.warming = true;
                        i.slot.clone()
                    });
                if let Some(slot) = bare {
                    let lease = pre_acquire(&slot, &profile).await;
                    let failed = {
                        let mut idle = self.idle();
                        // Gone: closed, or found dead by a sweep.
                        let entry = idle.iter_mut().find(|i| i.slot.id == slot.id);
                        match (lease, entry) {
                            (Ok(w), Some(i)) => {
                                info!(slot = %slot.id, lease = %w.lease_id, "warm lease ready");
                                i.warm = Some(w);
                                i.warming = false;
                                false
                            }
                            (Ok(_), None) => false,
                            (Err(e), entry) => {
                                warn!(slot = %slot.id, error = %format!("{e:#}"), "cannot pre-acquire the warm servers; the slot stays bare");
                                if let Some(i) = entry {
                                    i.warming = false;
                                }
                                true
                            }
                        }
                    };
                    if failed {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    continue;
                }
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {
                    self.idle().retain(|i| {
                        let ok = i.slot.alive();
                        if !ok {
                            let _ = std::fs::remove_dir_all(&i.slot.dir);
                        }
                        ok
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WarmProfile;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn profiles_parse_sorted_without_duplicates() {
        assert_eq!(WarmProfile::parse("  "), None);
        assert_eq!(WarmProfile::parse("ALL"), Some(WarmProfile::All));
        assert_eq!(
            WarmProfile::parse(" git, filesystem,,git "),
            Some(WarmProfile::Servers(names(&["filesystem", "git"])))
        );
    }

    #[test]
    fn a_warm_lease_serves_only_the_same_set() {
        let p = WarmProfile::parse("git,filesystem").unwrap();
        assert!(p.matches(Some(&names(&["filesystem", "git"]))));
        assert!(p.matches(Some(&names(&["git", "filesystem", "git"]))));
        assert!(!p.matches(Some(&names(&["git"]))));
        assert!(!p.matches(Some(&names(&["git", "filesystem", "terminal"]))));
        assert!(!p.matches(None));
        assert!(WarmProfile::All.matches(None));
        assert!(!WarmProfile::All.matches(Some(&names(&["git"]))));
    }
}
