//! Discovery catalogs in the lifecycle: recorded here outside any lease
//! (no tenant has run: nothing of one can be in them), taken from the
//! host, and found for a lease's idle server by the key of its launch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tracing::{Instrument, info, warn};

use super::{LcError, Lifecycle};
use crate::catalog::{Catalog, key_of, record::record};
use crate::supervisor::manifest::{Benchmark, Credentials, LaunchSpec, Transport};

/// Servers recorded at once: each start is CPU-bound.
const RECORD_AT_ONCE: usize = 2;

/// What [`Lifecycle::record_catalogs`] made.
#[derive(Debug, Default)]
pub struct Recorded {
    pub catalogs: Vec<Catalog>,
    /// Launches not catalogued (`server` or `server@Profile`), and why.
    pub skipped: Vec<(String, String)>,
    /// Launches whose catalog the host already has under the same key.
    pub unchanged: usize,
}

/// `server` or `server@Profile`: how the host files a catalog.
pub fn label(server: &str, bench: Option<Benchmark>) -> String {
    match bench {
        Some(b) => format!("{server}@{}", b.as_str()),
        None => server.to_owned(),
    }
}

/// [`label`] of a recorded catalog.
pub fn catalog_label(c: &Catalog) -> String {
    match &c.benchmark {
        Some(b) => format!("{}@{b}", c.server),
        None => c.server.clone(),
    }
}

impl Lifecycle {
    /// Takes the host's catalogs in place of the ones held (all or none).
    pub fn put_catalogs(&self, given: &[bytes::Bytes]) -> Result<usize, LcError> {
        Ok(self.catalogs.replace(given, &self.cfg.catalog)?)
    }

    /// The catalog answering for server `name` of lease `lease`: the one
    /// recorded from the launch the lease runs (same key), if any.
    pub fn catalog_for(&self, name: &str, lease: &str) -> Option<Arc<Catalog>> {
        let (spec, bench) = {
            let cur = self.current();
            let c = cur.as_ref().filter(|c| c.lease.id == lease)?;
            let spec = c.specs.iter().find(|s| s.name == name)?.clone();
            (spec, c.lease.benchmark)
        };
        let version = self
            .manifest
            .get(name)?
            .metadata_for(bench)
            .remove("version");
        self.catalogs.get(&key_of(&spec, version.as_deref()))
    }

    /// Records the catalog of every installed server under every profile
    /// it has, except those `known` (label → key) already holds under the
    /// same key. Only outside a lease: each server is started, asked,
    /// stopped, and its state paths emptied.
    pub async fn record_catalogs(
        &self,
        known: &BTreeMap<String, String>,
    ) -> Result<Recorded, LcError> {
        let _op = self.op.lock().await;
        if let Some(c) = self.current().as_ref() {
            return Err(LcError::AlreadyLeased {
                lease: c.lease.id.clone(),
                acquired_at_ms: c.lease.acquired_at_ms,
            });
        }
        let mut out = Recorded::default();
        // Per profile, as an Acquire under it prepares the sandbox (its
        // data, seeds, directories, a fresh home), each launch once: a
        // profile that changes nothing of a server's launch shares its key
        // and its catalog.
        let mut by_profile: BTreeMap<Option<Benchmark>, Vec<Wanted>> = BTreeMap::new();
        let mut first: BTreeMap<String, String> = BTreeMap::new();
        let mut aliases = Vec::new();
        for w in self.wanted(&mut out) {
            if known.get(&w.label) == Some(&w.key) {
                out.unchanged += 1;
            } else if let Some(label) = first.get(&w.key) {
                aliases.push((w, label.clone()));
            } else {
                first.insert(w.key.clone(), w.label.clone());
                by_profile.entry(w.bench).or_default().push(w);
            }
        }
        for (bench, wanted) in by_profile {
            self.record_profile(bench, wanted, &mut out).await;
        }
        for (w, label) in aliases {
            match out.catalogs.iter().find(|c| c.key == w.key).cloned() {
                Some(mut c) => {
                    c.benchmark = w.bench.map(|b| b.as_str().to_owned());
                    out.catalogs.push(c);
                }
                None => out
                    .skipped
                    .push((w.label, format!("its launch is {label}'s, not catalogued"))),
            }
        }
        info!(
            recorded = out.catalogs.len(),
            skipped = out.skipped.len(),
            unchanged = out.unchanged,
            "catalogs recorded"
        );
        Ok(out)
    }

    /// Records one profile's launches in a sandbox prepared as its Acquire
    /// would, then empties what they touched.
    async fn record_profile(
        &self,
        bench: Option<Benchmark>,
        wanted: Vec<Wanted>,
        out: &mut Recorded,
    ) {
        let names: Vec<String> = wanted.iter().map(|w| w.spec.name.clone()).collect();
        if let Err(e) = self.prepare(&names, bench).await {
            let why = format!("its profile cannot be prepared: {e}");
            out.skipped
                .extend(wanted.into_iter().map(|w| (w.label, why.clone())));
            return;
        }
        let mut runs = futures_util::stream::iter(wanted)
            .map(|w| async {
                let label = w.label.clone();
                self.record_one(w).await.map_err(|why| (label, why))
            })
            .buffer_unordered(RECORD_AT_ONCE);
        while let Some(r) = runs.next().await {
            match r {
                Ok(c) => out.catalogs.push(c),
                Err(skip) => out.skipped.push(skip),
            }
        }
        drop(runs);
        if let Err(e) = self.wipe(&names, true).await {
            warn!(error = %e, "emptying after recording catalogs");
        }
    }

    /// Every launch a catalog can be recorded for; the others go to
    /// `out.skipped` with why.
    fn wanted(&self, out: &mut Recorded) -> Vec<Wanted> {
        let mut wanted = Vec::new();
        for (name, def) in &self.manifest.servers {
            let benches = std::iter::once(None).chain(def.benchmarks.keys().copied().map(Some));
            for bench in benches {
                let label = label(name, bench);
                let why = if self.manifest.not_installed(name, bench).is_some() {
                    Some("not installed".to_owned())
                } else if def.mail {
                    Some("its launch carries the lease's mail account".to_owned())
                } else if matches!(def.transport, Transport::Http { .. }) {
                    Some(
                        "an HTTP server's sessions are its own: the gateway proxies it whole"
                            .to_owned(),
                    )
                } else {
                    None
                };
                if let Some(why) = why {
                    out.skipped.push((label, why));
                    continue;
                }
                match def.launch(bench, &Credentials::default(), &|k| std::env::var(k).ok()) {
                    Ok(spec) => {
                        let version = def.metadata_for(bench).remove("version");
                        let key = key_of(&spec, version.as_deref());
                        wanted.push(Wanted {
                            label,
                            bench,
                            key,
                            spec,
                        });
                    }
                    Err(e) => out.skipped.push((
                        label,
                        format!("its launch needs the lease's credentials: {e}"),
                    )),
                }
            }
        }
        wanted
    }

    async fn record_one(&self, w: Wanted) -> Result<Catalog, String> {
        let span = tracing::info_span!("catalog", server = %w.spec.name, profile = %w.label);
        self.record_launch(w).instrument(span).await
    }

    /// Records a launch from two starts of it, and keeps the record only
    /// when both answered the same: a server whose discovery changes from
    /// one start to the next (a set printed in a description, a time)
    /// has no answer a catalog could give for it.
    async fn record_launch(&self, w: Wanted) -> Result<Catalog, String> {
        let first = self.record_start(&w).await?;
        let second = self.record_start(&w).await?;
        if first != second {
            return Err(
                "its discovery answers differ from one start to the next (say, a set printed in a description): it starts on its first listing"
                    .to_owned(),
            );
        }
        Ok(first)
    }

    /// One start of a launch: started, asked, stopped.
    async fn record_start(&self, w: &Wanted) -> Result<Catalog, String> {
        let name = w.spec.name.clone();
        self.sup
            .start(w.spec.clone())
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Duration::from_millis(self.cfg.ready_deadline_ms);
        let ready = self.wait_ready(&name, deadline).await;
        let recorded = match (ready, self.sup.conn(&name)) {
            (Ok(()), Some(conn)) => {
                let cfg = &self.cfg.catalog;
                record(
                    &conn,
                    w.key.clone(),
                    &name,
                    w.bench.map(|b| b.as_str().to_owned()),
                    cfg.max_pages,
                    Duration::from_millis(cfg.record_timeout_ms),
                )
                .await
                .map_err(|e| e.to_string())
            }
            (Err(e), _) => Err(e.to_string()),
            (Ok(()), None) => Err("it is not a stdio server".to_owned()),
        };
        if let Err(e) = self.sup.stop(&name, None).await {
            warn!(server = %name, error = %e, "stopping after recording");
        }
        recorded
    }
}

/// A launch to record.
struct Wanted {
    label: String,
    bench: Option<Benchmark>,
    key: String,
    spec: LaunchSpec,
}
