//! Acquire: check the request, place the profile's seed data, start the
//! servers and wait until every one is ready; on any failure undo it all.
//! Plus the TTL timer an Acquire arms.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use super::{
    Current, LcError, Lease, Lifecycle, LifecycleConfig, MAX_LEASE_ID_LEN, Outside, SandboxStatus,
};
use crate::mail::Account;
use crate::supervisor::manifest::{
    Benchmark, Credentials, LaunchError, LaunchSpec, Manifest, NotInstalled, ServerDef,
};
use crate::supervisor::now_ms;

/// Which servers to acquire.
#[derive(Debug, Clone)]
pub enum Selection {
    All,
    Names(Vec<String>),
    /// No server: a lease of the workspace and executions only.
    Nothing,
}

/// First wait before retrying a TTL release that failed, and the longest.
const TTL_RETRY_FIRST: Duration = Duration::from_secs(2);
const TTL_RETRY_MAX: Duration = Duration::from_secs(60);

/// The TTL of an Acquire.
#[derive(Debug, Clone, Copy)]
pub enum Ttl {
    /// The configured default (Klavis: 7200 s).
    Default,
    /// No automatic release (Klavis `ttl_seconds: null`).
    Never,
    Seconds(u32),
}

#[derive(Debug, Clone)]
pub struct AcquireParams {
    pub lease_id: String,
    pub servers: Selection,
    pub benchmark: Option<Benchmark>,
    pub ttl: Ttl,
    pub test_account_email: String,
    pub credentials: BTreeMap<String, Credentials>,
    /// Start no server now: each starts on its first use.
    pub lazy: bool,
}

/// What a valid request resolves to: the servers in order (duplicates
/// dropped) and the TTL in seconds (0: none).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    pub names: Vec<String>,
    pub ttl_seconds: u32,
}

pub(super) fn valid_lease_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEASE_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Checks a request against the manifest and the TTL bounds. Pure: nothing
/// is started or changed.
pub(super) fn resolve(
    p: &AcquireParams,
    manifest: &Manifest,
    cfg: &LifecycleConfig,
) -> Result<Resolved, LcError> {
    if !valid_lease_id(&p.lease_id) {
        return Err(LcError::BadLeaseId);
    }
    let names: Vec<String> = match &p.servers {
        Selection::All => manifest.all_names(),
        Selection::Nothing => Vec::new(),
        Selection::Names(n) => {
            let mut out: Vec<String> = Vec::new();
            for name in n {
                if !out.contains(name) {
                    out.push(name.clone());
                }
            }
            out
        }
    };
    match p.servers {
        _ if !names.is_empty() => {}
        Selection::All => return Err(LcError::EmptyManifest),
        Selection::Names(_) => return Err(LcError::NoServersNamed),
        Selection::Nothing => {}
    }
    let absent: Vec<NotInstalled> = names
        .iter()
        .filter_map(|n| manifest.not_installed(n, p.benchmark).cloned())
        .collect();
    if !absent.is_empty() {
        return Err(LcError::NotInstalled(absent));
    }
    let unknown: Vec<String> = names
        .iter()
        .filter(|n| manifest.get(n).is_none())
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(unknown_servers(manifest, unknown));
    }
    let ttl_seconds = resolve_ttl(p.ttl, cfg)?;
    if let Some(extra) = p.credentials.keys().find(|k| !names.contains(k)) {
        return Err(LcError::CredentialsForOther {
            server: extra.clone(),
            acquired: names,
        });
    }
    Ok(Resolved { names, ttl_seconds })
}

/// The TTL in seconds (0: none) within the configured bounds.
pub(super) fn resolve_ttl(ttl: Ttl, cfg: &LifecycleConfig) -> Result<u32, LcError> {
    match ttl {
        Ttl::Default => Ok(cfg.default_ttl_seconds),
        Ttl::Never => Ok(0),
        Ttl::Seconds(s) if (cfg.min_ttl_seconds..=cfg.max_ttl_seconds).contains(&s) => Ok(s),
        Ttl::Seconds(got) => Err(LcError::TtlOutOfRange {
            got,
            min: cfg.min_ttl_seconds,
            max: cfg.max_ttl_seconds,
            default: cfg.default_ttl_seconds,
        }),
    }
}

pub(super) fn unknown_servers(manifest: &Manifest, names: Vec<String>) -> LcError {
    LcError::UnknownServers {
        names,
        manifest: manifest.path.clone(),
        known: manifest.names(),
    }
}

/// A random UUID (v4) naming one server within a lease (Klavis server `id`).
pub(super) fn random_id() -> Result<String, LcError> {
    // `Builder::from_random_bytes` is `Uuid::new_v4` with the bytes given:
    // no randomness is an error here, not a panic.
    let b = sandbox_client::random::bytes::<16>().map_err(LcError::NoRandomness)?;
    Ok(uuid::Builder::from_random_bytes(b).into_uuid().to_string())
}

/// A fresh id for each of `names`.
pub(super) fn server_ids(names: &[String]) -> Result<BTreeMap<String, String>, LcError> {
    names
        .iter()
        .map(|n| Ok((n.clone(), random_id()?)))
        .collect()
}

/// When a lease acquired at `now` with `ttl_seconds` expires (0: never).
pub(super) fn expires_at(now: u64, ttl_seconds: u32) -> u64 {
    if ttl_seconds == 0 {
        0
    } else {
        now + u64::from(ttl_seconds) * 1000
    }
}

/// What an Acquire starts, worked out before anything is started.
#[derive(Default)]
struct Plan {
    /// The servers to start, in order, and how.
    names: Vec<String>,
    specs: Vec<LaunchSpec>,
    /// ALL's servers left out (their outside service is not configured).
    skipped: Vec<(String, String)>,
    /// Named servers whose credentials are missing: the Acquire fails.
    missing: Vec<LaunchError>,
    /// The lease's account on the sandbox's mail service.
    account: Option<Account>,
    /// What the servers that use it get of the account (Klavis `auth_data`).
    auth_data: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// The servers with a data tool for an outside service.
    outside: BTreeMap<String, Outside>,
}

impl Lifecycle {
    /// Checks the request, seeds the workspace, starts the mail service
    /// and the servers and waits until each is ready; any failure undoes
    /// it all and leaves the sandbox idle.
    pub async fn acquire(&self, p: AcquireParams) -> Result<(Lease, SandboxStatus), LcError> {
        let _op = self.op.lock().await;
        if let Some(c) = self.current().as_ref() {
            return Err(LcError::AlreadyLeased {
                lease: c.lease.id.clone(),
                acquired_at_ms: c.lease.acquired_at_ms,
            });
        }
        let Resolved {
            names: wanted,
            ttl_seconds,
        } = resolve(&p, &self.manifest, &self.cfg)?;
        let plan = self.plan(&p, &wanted)?;
        let server_ids = server_ids(&plan.names)?;
        // Before anything is started or cleared.
        self.profile_data(p.benchmark)?;
        self.forget_ledgers().await;
        let span = tracing::info_span!("acquire", lease = %p.lease_id);
        let started = Instant::now();
        self.bring_up(&plan, p.benchmark, p.lazy)
            .instrument(span.clone())
            .await?;
        let now = now_ms();
        let lease = Lease {
            id: p.lease_id,
            benchmark: p.benchmark,
            server_ids,
            servers: plan.names,
            acquired_at_ms: now,
            ttl_seconds,
            expires_at_ms: expires_at(now, ttl_seconds),
            test_account_email: p.test_account_email,
            skipped: plan.skipped,
            auth_data: plan.auth_data,
            lazy: p.lazy,
        };
        let ttl = CancellationToken::new();
        if ttl_seconds > 0 {
            self.arm_ttl(
                lease.id.clone(),
                Duration::from_secs(ttl_seconds.into()),
                ttl.clone(),
            );
        }
        self.exec.open(&lease.id, &lease.servers);
        *self.current() = Some(Current {
            lease: lease.clone(),
            specs: plan.specs,
            ttl,
            broken: None,
            started: lease.servers.clone(),
            mail: plan.account,
            outside: plan.outside,
        });
        span.in_scope(|| {
            info!(
                servers = %lease.servers.join(","),
                ms = started.elapsed().as_millis() as u64,
                ttl_seconds,
                lazy = lease.lazy,
                "acquired"
            )
        });
        Ok((lease, self.view().status))
    }

    /// How each wanted server is started (its credentials, the lease's mail
    /// account); fails naming every server whose credentials are missing.
    fn plan(&self, p: &AcquireParams, wanted: &[String]) -> Result<Plan, LcError> {
        let mut plan = Plan::default();
        for name in wanted {
            self.plan_server(p, name, &mut plan)?;
        }
        if !plan.skipped.is_empty() {
            let left: Vec<&str> = plan.skipped.iter().map(|(n, _)| n.as_str()).collect();
            info!(skipped = %left.join(","), "ALL: servers whose outside service is not configured are left out");
        }
        if !plan.missing.is_empty() {
            return Err(LcError::MissingCredentials(std::mem::take(
                &mut plan.missing,
            )));
        }
        Ok(plan)
    }

    fn plan_server(&self, p: &AcquireParams, name: &str, plan: &mut Plan) -> Result<(), LcError> {
        let def = self
            .manifest
            .get(name)
            .ok_or_else(|| unknown_servers(&self.manifest, vec![name.to_owned()]))?;
        let mut creds = p.credentials.get(name).cloned().unwrap_or_default();
        // Before the mail account: that one is the sandbox's own.
        let own = def.lease_account(&creds);
        self.give_mail_account(p, def, name, &mut creds, plan)?;
        match def.launch(p.benchmark, &creds, &|k| std::env::var(k).ok()) {
            Ok(spec) => {
                if def.data_command.is_some() && !def.mail {
                    let env = spec.env.clone();
                    plan.outside.insert(name.to_owned(), Outside { own, env });
                }
                plan.specs.push(spec);
                plan.names.push(name.to_owned());
            }
            // ALL means every server that can run here: one whose outside
            // service is not configured is left out, by name.
            Err(e @ LaunchError::MissingCredentials { .. })
                if matches!(p.servers, Selection::All) =>
            {
                plan.skipped.push((name.to_owned(), e.to_string()));
            }
            Err(e @ LaunchError::MissingCredentials { .. }) => plan.missing.push(e),
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// A mail-using server named without an account of its own gets the
    /// lease's account on the sandbox's mail service (made for the first).
    fn give_mail_account(
        &self,
        p: &AcquireParams,
        def: &ServerDef,
        name: &str,
        creds: &mut Credentials,
        plan: &mut Plan,
    ) -> Result<(), LcError> {
        let Some(mail) = self
            .mail
            .as_ref()
            .filter(|_| def.mail && creds.auth.is_empty())
        else {
            return Ok(());
        };
        if plan.account.is_none() {
            plan.account = Some(mail.new_account(mail.address_for(&p.test_account_email))?);
        }
        if let Some(a) = &plan.account {
            let fields = a.auth_data();
            creds.auth = fields
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                    )
                })
                .collect();
            plan.auth_data.insert(name.to_owned(), fields);
        }
        Ok(())
    }

    /// Seeds the workspace, starts the mail service and the servers (or,
    /// `lazy`, marks them idle), and waits until they are ready; on a
    /// failure tears it all down.
    async fn bring_up(
        &self,
        plan: &Plan,
        benchmark: Option<Benchmark>,
        lazy: bool,
    ) -> Result<(), LcError> {
        let seeded = self.prepare(&plan.names, benchmark).await;
        let r = match (seeded, &plan.account, &self.mail) {
            (Ok(()), Some(a), Some(m)) => match m.start(a).await {
                Ok(()) => self.bring_servers_up(&plan.specs, lazy).await,
                Err(e) => Err(e.into()),
            },
            (Ok(()), _, _) => self.bring_servers_up(&plan.specs, lazy).await,
            (Err(e), _, _) => Err(e),
        };
        if let Err(e) = r {
            warn!(error = %e, "acquire failed; undoing it");
            self.teardown(&plan.names, true).await;
            return Err(e);
        }
        Ok(())
    }

    pub(super) fn arm_ttl(&self, lease_id: String, after: Duration, cancel: CancellationToken) {
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(after) => {}
                _ = cancel.cancelled() => return,
            }
            info!(lease = %lease_id, "TTL expired; releasing");
            // A failed release is retried (with backoff, up to a minute
            // apart) until it succeeds or the lease is gone.
            let mut wait = TTL_RETRY_FIRST;
            loop {
                let Some(lc) = me.upgrade() else { return };
                match lc.release(&lease_id, true).await {
                    Ok(_) | Err(LcError::NoSuchLease { .. }) => return,
                    Err(e) => {
                        warn!(lease = %lease_id, error = %e, retry_in_s = wait.as_secs(), "TTL release failed; retrying");
                    }
                }
                drop(lc);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = cancel.cancelled() => return,
                }
                wait = (wait * 2).min(TTL_RETRY_MAX);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn manifest() -> Manifest {
        Manifest::parse(
            "[servers.git]\ncommand = \"g\"\n[servers.memory]\ncommand = \"m\"\n\
             [servers.solo]\ncommand = \"s\"\nin_all = false\n",
            Path::new("m.toml"),
            &crate::supervisor::manifest::Roots {
                workspace: Path::new("/ws"),
                state_root: Path::new("/st"),
                data: None,
            },
        )
        .unwrap()
    }

    fn params(servers: Selection, ttl: Ttl) -> AcquireParams {
        AcquireParams {
            lease_id: "l-1".into(),
            servers,
            benchmark: None,
            ttl,
            test_account_email: String::new(),
            credentials: BTreeMap::new(),
            lazy: false,
        }
    }

    fn names(n: &[&str]) -> Selection {
        Selection::Names(n.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn names_keep_their_order_without_duplicates() {
        let r = resolve(
            &params(names(&["memory", "git", "memory"]), Ttl::Default),
            &manifest(),
            &LifecycleConfig::default(),
        )
        .unwrap();
        assert_eq!(r.names, ["memory", "git"]);
        assert_eq!(r.ttl_seconds, 7200);
        let all = resolve(
            &params(Selection::All, Ttl::Never),
            &manifest(),
            &LifecycleConfig::default(),
        )
        .unwrap();
        // `in_all = false`: only when named.
        assert_eq!(all.names, ["git", "memory"]);
        assert_eq!(all.ttl_seconds, 0);
        let solo = resolve(
            &params(names(&["solo"]), Ttl::Default),
            &manifest(),
            &LifecycleConfig::default(),
        )
        .unwrap();
        assert_eq!(solo.names, ["solo"]);
    }

    #[test]
    fn each_bad_request_has_its_own_cause() {
        let (m, cfg) = (manifest(), LifecycleConfig::default());
        let e = resolve(
            &params(names(&["git", "nope", "x"]), Ttl::Default),
            &m,
            &cfg,
        );
        let Err(LcError::UnknownServers {
            names: unknown,
            known,
            ..
        }) = e
        else {
            panic!("{e:?}")
        };
        assert_eq!(unknown, ["nope", "x"]);
        assert_eq!(known, m.names());
        assert!(matches!(
            resolve(&params(names(&[]), Ttl::Default), &m, &cfg),
            Err(LcError::NoServersNamed)
        ));
        assert!(matches!(
            resolve(&params(names(&["git"]), Ttl::Seconds(59)), &m, &cfg),
            Err(LcError::TtlOutOfRange {
                got: 59,
                min: 60,
                max: 86400,
                ..
            })
        ));
        assert!(resolve(&params(names(&["git"]), Ttl::Seconds(86_400)), &m, &cfg).is_ok());
        let mut p = params(names(&["git"]), Ttl::Default);
        p.lease_id = "a b".into();
        assert!(matches!(resolve(&p, &m, &cfg), Err(LcError::BadLeaseId)));
        let mut p = params(names(&["git"]), Ttl::Default);
        p.credentials
            .insert("memory".into(), Credentials::default());
        assert!(matches!(
            resolve(&p, &m, &cfg),
            Err(LcError::CredentialsForOther { .. })
        ));
    }

    #[test]
    fn lease_ids_are_uuids_of_version_4() {
        let id = random_id().unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, random_id().unwrap());
    }
}
