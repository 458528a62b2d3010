//! What an operator reads on `GET /metrics` (OpenMetrics text, which
//! Prometheus scrapes): pool sizes per state and warm profile, warm hits
//! and misses, and the latency of Acquire.
//!
//! | metric | labels |
//! |---|---|
//! | `sandbox_host_pool_sandboxes` (gauge) | `state` = `warm`, `warming`, `bare`, `starting`, `leased`; `profile` (warm states only) |
//! | `sandbox_host_warm_hits_total` | `profile` |
//! | `sandbox_host_warm_misses_total` | `reason` = `uncovered` (no profile warms it), `empty` (none ready), `refused` (the agent would not narrow) |
//! | `sandbox_host_acquire_seconds` (histogram) | `path` = `warm`, `cold` |
//! | `sandbox_host_acquire_failures_total` | — |
//! | `sandbox_host_uid_blocks` (gauge) | — (subordinate id blocks this host may use; isolated process backend only) |
//! | `sandbox_host_uid_blocks_claimed` (gauge) | — (blocks claimed machine-wide, by any host) |
//! | `sandbox_host_uid_blocks_exhausted_total` | — (sandbox starts refused: no free block) |
//! | `sandbox_host_slots_reclaim_pending` (gauge) | — (slot directories whose removal failed, tried again every `--reclaim-interval`) |
//! | `sandbox_host_slot_removals_failed_total` | — (removals of a slot directory that failed) |
//! | `sandbox_host_slots_reclaimed_total` | — (slots ended because nothing of this host could adopt them) |
//! | `sandbox_host_discovery_catalogs` (gauge) | — (discovery catalogs held and given to every agent) |
//! | `sandbox_host_discovery_recording` (gauge) | — (1 until the recording at start has ended) |
//!
//! Aggregates only (no ids, owners or keys), yet pool and lease counts are
//! the operator's: on the API's address `/metrics` needs an API key; with
//! `--metrics-listen` it is served without one on that address alone and
//! the API's address answers 404 (`api::metrics`, the HTTP side).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::pool::{Miss, Pool};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    state: &'static str,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabel {
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

type HistogramFamily = Family<PathLabel, Histogram, fn() -> Histogram>;

/// Acquire latency buckets, in seconds: 1 ms to about 65 s.
fn acquire_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

pub struct Metrics {
    registry: Registry,
    /// What it observes (its sizes are read at each scrape).
    source: Arc<Pool>,
    pool: Family<PoolLabels, Gauge>,
    hits: Family<ProfileLabel, Counter>,
    misses: Family<ReasonLabel, Counter>,
    acquire: HistogramFamily,
    failures: Counter,
    blocks: Gauge,
    blocks_claimed: Gauge,
    blocks_exhausted: Counter,
    reclaim_pending: Gauge,
    removals_failed: Counter,
    reclaimed: Counter,
    catalogs: Gauge,
    recording: Gauge,
    /// Profile labels, in the pool's order.
    profiles: Vec<String>,
    /// Whether `/metrics` is on the API's address, behind its keys (else
    /// on `--metrics-listen`'s).
    pub keyed: bool,
}

impl Metrics {
    pub fn new(pool: &Arc<Pool>, keyed: bool) -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            source: pool.clone(),
            pool: Family::default(),
            hits: Family::default(),
            misses: Family::default(),
            acquire: HistogramFamily::new_with_constructor(acquire_buckets),
            failures: Counter::default(),
            blocks: Gauge::default(),
            blocks_claimed: Gauge::default(),
            blocks_exhausted: Counter::default(),
            reclaim_pending: Gauge::default(),
            removals_failed: Counter::default(),
            reclaimed: Counter::default(),
            catalogs: Gauge::default(),
            recording: Gauge::default(),
            profiles: pool.profiles().iter().map(|p| p.label()).collect(),
            keyed,
        };
        m.register(pool.isolation().is_some());
        // Every label a scrape should see, at 0 until it moves.
        for p in &m.profiles {
            let _ = m.hits.get_or_create(&ProfileLabel { profile: p.clone() });
        }
        for r in [Miss::Uncovered, Miss::Empty, Miss::Refused] {
            let _ = m.misses.get_or_create(&ReasonLabel { reason: r.name() });
        }
        m
    }

    /// Registers every metric (the id blocks' only with `isolated` slots).
    fn register(&mut self, isolated: bool) {
        let r = &mut self.registry;
        r.register(
            "sandbox_host_pool_sandboxes",
            "Sandboxes of the pool by state (warm: holding a ready warm lease of the profile)",
            self.pool.clone(),
        );
        r.register(
            "sandbox_host_warm_hits",
            "Acquires answered by narrowing a warm lease of the profile",
            self.hits.clone(),
        );
        r.register(
            "sandbox_host_warm_misses",
            "Acquires that started their servers (no warm lease covered them)",
            self.misses.clone(),
        );
        r.register(
            "sandbox_host_acquire_seconds",
            "Time from an Acquire request to its answer",
            self.acquire.clone(),
        );
        r.register(
            "sandbox_host_acquire_failures",
            "Acquires answered with an error",
            self.failures.clone(),
        );
        if isolated {
            r.register(
                "sandbox_host_uid_blocks",
                "Subordinate id blocks this host may give its sandboxes (one each)",
                self.blocks.clone(),
            );
            r.register(
                "sandbox_host_uid_blocks_claimed",
                "Subordinate id blocks claimed on this machine, by any host",
                self.blocks_claimed.clone(),
            );
            r.register(
                "sandbox_host_uid_blocks_exhausted",
                "Sandbox starts refused because every id block was claimed",
                self.blocks_exhausted.clone(),
            );
        }
        r.register(
            "sandbox_host_slots_reclaim_pending",
            "Slot directories whose removal failed, removed again at the next reclaim pass",
            self.reclaim_pending.clone(),
        );
        r.register(
            "sandbox_host_slot_removals_failed",
            "Removals of a slot directory that failed",
            self.removals_failed.clone(),
        );
        r.register(
            "sandbox_host_slots_reclaimed",
            "Slots ended because nothing of this host could adopt them",
            self.reclaimed.clone(),
        );
        r.register(
            "sandbox_host_discovery_catalogs",
            "Discovery catalogs held and given to every agent",
            self.catalogs.clone(),
        );
        r.register(
            "sandbox_host_discovery_recording",
            "1 until the recording of discovery catalogs at start has ended",
            self.recording.clone(),
        );
    }

    /// One Acquire answered: from the warm lease of `profile`, or cold
    /// for `miss`.
    pub fn acquired(&self, profile: Option<usize>, miss: Option<Miss>, took: Duration) {
        let path = match profile.and_then(|k| self.profiles.get(k)) {
            Some(p) => {
                self.hits
                    .get_or_create(&ProfileLabel { profile: p.clone() })
                    .inc();
                "warm"
            }
            None => {
                if let Some(m) = miss {
                    self.misses
                        .get_or_create(&ReasonLabel { reason: m.name() })
                        .inc();
                }
                "cold"
            }
        };
        self.acquire
            .get_or_create(&PathLabel { path })
            .observe(took.as_secs_f64());
    }

    pub fn failed(&self) {
        self.failures.inc();
    }

    /// The text a scrape gets, with the pool's sizes as of now.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let pool = &*self.source;
        let c = pool.counts();
        let set = |state: &'static str, profile: &str, n: usize| {
            self.pool
                .get_or_create(&PoolLabels {
                    state,
                    profile: profile.to_owned(),
                })
                .set(n as i64);
        };
        for (label, (ready, warming)) in self.profiles.iter().zip(c.warm) {
            set("warm", label, ready);
            set("warming", label, warming);
        }
        set("bare", "", c.bare);
        set("starting", "", c.starting);
        set("leased", "", c.leased);
        if let Some(iso) = pool.isolation() {
            let (claimed, total) = iso.block_counts();
            self.blocks.set(total.into());
            self.blocks_claimed.set(claimed.into());
            let seen = self.blocks_exhausted.get();
            self.blocks_exhausted
                .inc_by(iso.blocks_exhausted().saturating_sub(seen));
        }
        let r = pool.reclaim_counts();
        self.reclaim_pending.set(r.pending as i64);
        let seen = self.removals_failed.get();
        self.removals_failed.inc_by(r.failed.saturating_sub(seen));
        let seen = self.reclaimed.get();
        self.reclaimed.inc_by(r.orphans.saturating_sub(seen));
        let (held, recording) = pool.discovery_counts();
        self.catalogs.set(held as i64);
        self.recording.set(i64::from(recording));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
