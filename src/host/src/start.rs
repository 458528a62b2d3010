//! Starting and stopping the host: the data dir, the pool, the store and
//! the listener ([`Host::start`]); and the stop, which lets accepted
//! releases finish before the pool closes ([`Started::stop`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sandbox_serve::listen::Listener;

use crate::api;
use crate::config::{self, Args};
use crate::lease::{Host, Shared};
use crate::store::Status;
use crate::{metrics, pool, signed, store};

/// How long a shutdown waits for releases already accepted (a Release
/// stops the sandbox's servers; in a VM under TCG that takes seconds).
mod checks;
mod cluster;
mod keys;
mod listen;
use checks::{check_blocks, check_data_dir, check_limits, private_dirs};
use cluster::connect_cluster;
use keys::{shared_signing_key, signing_key};
use listen::{listen, listen_metrics, raise_open_files};

const RELEASE_DRAIN: Duration = Duration::from_secs(60);

/// A host that is ready to serve.
pub struct Started {
    pub host: Shared,
    /// The pool the fleet takes its sandboxes from (closed at the stop).
    pub pool: Arc<pool::Pool>,
    pub listener: Listener,
    pub public_url: String,
    /// The API key made at start when none was given (printed once).
    pub generated_key: Option<String>,
    /// `--metrics-listen`'s listener, serving `/metrics` alone, without a
    /// key.
    pub metrics_listener: Option<Listener>,
    /// Whether [`Started::record_catalogs`] records before serving.
    record_catalogs: bool,
}

/// What [`Host::start`] checks before anything runs: the flags, the keys,
/// the data dir; then it needs a runtime.
pub struct Checked {
    backend: pool::Backend,
    isolation: Option<Arc<pool::isolate::Isolation>>,
    warm: Vec<pool::WarmProfile>,
    keys: std::collections::HashMap<String, String>,
    generated_key: Option<String>,
    uploads: PathBuf,
    /// The local backends' database (`None` on kubernetes: the claims).
    store: Option<store::Store>,
    cluster: Option<config::ClusterPlan>,
    signing_key: Vec<u8>,
    agent_env: pool::AgentEnv,
}

impl Host {
    /// Checks the flags and prepares the data dir (before the runtime
    /// starts: it reads the key variable, which no thread may race).
    pub fn check(args: &Args, env_keys: Option<String>) -> anyhow::Result<Checked> {
        check_limits(args)?;
        let mut keys = config::keys(args, env_keys)?;
        let mut generated_key = None;
        if keys.is_empty() {
            let k = sandbox_client::auth::Token::generate().context("generating an API key")?;
            keys.insert(k.expose().to_owned(), config::owner_of_key(k.expose()));
            generated_key = Some(k.expose().to_owned());
        }
        let uploads = private_dirs(&args.data_dir).with_context(|| {
            format!(
                "--data-dir {}: the host cannot use it",
                args.data_dir.display()
            )
        })?;
        let backend = config::backend(args)?;
        check_data_dir(&args.data_dir, &backend)?;
        // The port asked for (0: the kernel's choice, which a forward of a
        // fixed port is checked against once bound).
        let api_port = args
            .listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or(0);
        let isolation = config::isolation(args, &backend, api_port)?;
        if let Some(iso) = &isolation {
            check_blocks(args, iso.block_counts().1)?;
        }
        let agent_env = config::agent_env(args, &backend)?;
        let warm = config::warm_profiles(args)?;
        let cluster = config::cluster(args)?;
        let store = match cluster {
            Some(_) => None,
            None => Some(store::Store::open(&args.data_dir.join("host.db"))?),
        };
        let signing_key = match &args.signing_key_file {
            Some(f) => shared_signing_key(f)?,
            None => signing_key(&args.data_dir)?,
        };
        Ok(Checked {
            backend,
            isolation,
            warm,
            keys,
            generated_key,
            uploads,
            store,
            cluster,
            signing_key,
            agent_env,
        })
    }

    /// Starts the pool (taking back the sandboxes of a previous run), the
    /// reaper and the warm-keeper, and binds the listener.
    pub async fn start(args: &Args, c: Checked) -> anyhow::Result<Started> {
        let cluster = match c.cluster {
            Some(plan) => Some(connect_cluster(args, plan, &c.signing_key).await?),
            None => None,
        };
        let store = match (c.store, &cluster) {
            (Some(db), _) => db,
            #[cfg(feature = "kubernetes")]
            (None, Some(k)) => store::Store::new(k.clone()),
            (None, _) => anyhow::bail!("no state store"),
        };
        let local = cluster.is_none();
        let discovery = discovery(args, !local)?;
        // The kubernetes backend's warm pools are the cluster's.
        let size = if local { args.pool_size } else { 0 };
        let pool = open_pool(
            args,
            c.backend,
            c.warm,
            c.isolation,
            c.agent_env,
            discovery,
            size,
        )?;
        let live = take_back(&store, &pool, local).await?;
        raise_open_files(args.max_connections);
        let (listener, public_url) = listen(args).await?;
        let metrics_listener = match &args.metrics_listen {
            Some(addr) => Some(listen_metrics(addr).await?),
            None => None,
        };
        let owners = upload_owners(&store, live, local).await;
        let fleet = config::fleet(cluster, &pool);
        let host = Arc::new(Host {
            metrics: metrics::Metrics::new(&pool, args.metrics_listen.is_none()),
            store,
            fleet,
            signer: signed::Signer::new(c.signing_key),
            keys: c.keys,
            public_url: public_url.clone(),
            uploads: api::Uploads::open(c.uploads, upload_limits(args), owners.as_deref()),
            time_scale: args.time_scale,
            server_start: args.server_start,
            max_per_owner: args.max_sandboxes_per_key,
            acquiring: Default::default(),
            cleaning: Default::default(),
            releases: tokio_util::task::TaskTracker::new(),
            inflight: Default::default(),
        });
        upkeep(args, &host, &pool, local);
        Ok(Started {
            host,
            pool,
            listener,
            public_url,
            generated_key: c.generated_key,
            metrics_listener,
            record_catalogs: args.catalogs == pool::CatalogMode::Record && local,
        })
    }
}

/// The pool of `size` sandboxes of `backend`, as the flags configure it.
fn open_pool(
    args: &Args,
    backend: pool::Backend,
    warm: Vec<pool::WarmProfile>,
    isolation: Option<Arc<pool::isolate::Isolation>>,
    agent_env: pool::AgentEnv,
    discovery: Option<Arc<pool::Discovery>>,
    size: usize,
) -> anyhow::Result<Arc<pool::Pool>> {
    Ok(pool::Pool::new(pool::PoolConfig {
        backend,
        dir: pool::slots_dir(&args.data_dir),
        size,
        warm,
        on_release: args.on_release,
        recycle_max_inodes: args.recycle_max_inodes,
        isolation,
        start_timeout: args.slot_start_timeout.map(Duration::from_secs),
        agent_env,
        max_slots: args.max_slots,
        deadlines: pool::Deadlines {
            call: Duration::from_secs(args.agent_call_timeout),
            acquire: Duration::from_secs(args.agent_acquire_timeout),
            release: Duration::from_secs(args.agent_release_timeout),
            transfer: Duration::from_secs(args.agent_transfer_timeout),
        },
        discovery,
    })?)
}

/// Sandboxes from before a restart keep their agents; those whose agent
/// is gone are marked error. The live ones (none on the kubernetes
/// backend: the claims are the state, nothing of this host's to take
/// back).
async fn take_back(
    store: &store::Store,
    pool: &pool::Pool,
    local: bool,
) -> anyhow::Result<Vec<store::SandboxRow>> {
    if !local {
        return Ok(Vec::new());
    }
    let live = store.list(None).await?;
    let in_use: Vec<String> = live.iter().map(|s| s.slot.clone()).collect();
    let gone = pool.recover(&in_use).await;
    for s in live.iter().filter(|s| gone.contains(&s.slot)) {
        store
            .set_status(&s.id, Status::Error, &api::timestamp())
            .await?;
    }
    Ok(live)
}

/// The (sandbox, owner) pairs whose uploads the upload store keeps (it
/// removes the rest). On the kubernetes backend the volume is shared by
/// every replica: the live sandboxes are the claims' (all replicas'), not
/// none, or a replica starting would delete every upload; without the API
/// server nothing is removed (`None`).
async fn upload_owners(
    store: &store::Store,
    live: Vec<store::SandboxRow>,
    local: bool,
) -> Option<Vec<(String, String)>> {
    let live = if local {
        live
    } else {
        match store.list(None).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the live sandboxes: every stored upload is kept");
                return None;
            }
        }
    };
    Some(live.into_iter().map(|s| (s.id, s.owner)).collect())
}

/// The reaper; and the local slots' upkeep (on the kubernetes backend the
/// pool holds no slot: the warm pools are the cluster's, and none runs).
fn upkeep(args: &Args, host: &Shared, pool: &Arc<pool::Pool>, local: bool) {
    tokio::spawn(crate::lease::reap(host.clone()));
    if local {
        tokio::spawn(pool.clone().keep_warm());
        tokio::spawn(
            pool.clone()
                .keep_reclaiming(Duration::from_secs(args.reclaim_interval)),
        );
        tokio::spawn(crate::lease::probe(host.clone()));
    }
}

impl Started {
    /// With `--catalogs record` on a local backend: records the discovery
    /// catalogs the directory lacks, before the host serves (the caller
    /// serves after this). So no Acquire meets a sandbox without them: a
    /// benchmark's discovery right after a start is answered from them,
    /// nothing started. A restart finds them made and records only a
    /// server whose launch changed. The pool warms meanwhile; its
    /// sandboxes are given the catalogs when the recording ends.
    pub async fn record_catalogs(&self) {
        if !self.record_catalogs {
            return;
        }
        let t = std::time::Instant::now();
        tracing::info!("recording discovery catalogs before serving");
        self.pool.clone().record_catalogs().await;
        tracing::info!(
            took_ms = t.elapsed().as_millis() as u64,
            "discovery catalogs ready"
        );
    }

    /// After the listener stopped: releases already accepted finish first
    /// (their slots go back to the pool, and are stopped with it), then the
    /// pool closes: its idle and starting sandboxes stop, leased ones keep
    /// running for the next start.
    pub async fn stop(host: Shared, pool: Arc<pool::Pool>) {
        host.fleet.stop().await;
        let releases = host.releases.clone();
        tracing::info!(
            releases = releases.len(),
            "stopping: waiting for the releases in flight"
        );
        releases.close();
        if tokio::time::timeout(RELEASE_DRAIN, releases.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                left = releases.len(),
                "releases still running after {} s; their sandboxes keep running, and the next start takes them back",
                RELEASE_DRAIN.as_secs()
            );
        }
        let stopped = tokio::task::spawn_blocking(move || pool.close())
            .await
            .unwrap_or(0);
        tracing::info!(
            stopped,
            "stopped the pool's idle and starting sandboxes; leased ones keep running for the next start"
        );
    }
}

/// The discovery catalogs the agents get (`--catalogs`, `--catalog-dir`).
/// None on the kubernetes backend: its pods are claimed per lease from
/// the cluster's warm pools, never started by the pool that gives them.
fn discovery(args: &Args, cluster: bool) -> anyhow::Result<Option<Arc<pool::Discovery>>> {
    if args.catalogs == pool::CatalogMode::Off || cluster {
        return Ok(None);
    }
    let dir = args
        .catalog_dir
        .clone()
        .unwrap_or_else(|| args.data_dir.join("catalogs"));
    let record = args.catalogs == pool::CatalogMode::Record;
    let d = pool::Discovery::open(&dir, record)
        .with_context(|| format!("opening the catalog dir {} (--catalog-dir)", dir.display()))?;
    Ok(Some(Arc::new(d)))
}

fn upload_limits(args: &Args) -> api::UploadLimits {
    api::UploadLimits {
        archive_bytes: args.max_upload_bytes,
        executions: args.max_executions_per_sandbox,
        sandbox_bytes: args.max_stored_bytes_per_sandbox,
        owner_bytes: args.max_stored_bytes_per_key,
        multipart_bytes: args.max_multipart_bytes,
    }
}
