//! Starting and stopping the host: the data dir, the pool, the store and
//! the listener ([`Host::start`]); and the stop, which lets accepted
//! releases finish before the pool closes ([`Started::stop`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sandbox_serve::listen::Listener;

use crate::api::{self, Host, Shared};
use crate::config::{self, Args};
use crate::store::Status;
use crate::{metrics, pool, signed, store};

/// How long a shutdown waits for releases already accepted (a Release
/// stops the sandbox's servers; in a VM under TCG that takes seconds).
mod listen;
use listen::{listen, listen_metrics, raise_open_files};

const RELEASE_DRAIN: Duration = Duration::from_secs(60);

/// A host that is ready to serve.
pub struct Started {
    pub host: Shared,
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
        let discovery = discovery(args, cluster.is_some())?;
        let pool = pool::Pool::new(pool::PoolConfig {
            backend: c.backend,
            dir: pool::slots_dir(&args.data_dir),
            // The kubernetes backend's warm pools are the cluster's.
            size: if cluster.is_some() { 0 } else { args.pool_size },
            warm: c.warm,
            on_release: args.on_release,
            recycle_max_inodes: args.recycle_max_inodes,
            isolation: c.isolation,
            start_timeout: args.slot_start_timeout.map(Duration::from_secs),
            agent_env: c.agent_env,
            max_slots: args.max_slots,
            deadlines: pool::Deadlines {
                call: Duration::from_secs(args.agent_call_timeout),
                acquire: Duration::from_secs(args.agent_acquire_timeout),
                release: Duration::from_secs(args.agent_release_timeout),
                transfer: Duration::from_secs(args.agent_transfer_timeout),
            },
            discovery,
        })?;
        // Sandboxes from before a restart keep their agents; those whose
        // agent is gone are marked error.
        let live = if cluster.is_some() {
            // The claims are the state; nothing of this host's to take back.
            Vec::new()
        } else {
            store.list(None).await?
        };
        let in_use: Vec<String> = live.iter().map(|s| s.slot.clone()).collect();
        let gone = pool.recover(&in_use).await;
        for s in live.iter().filter(|s| gone.contains(&s.slot)) {
            store
                .set_status(&s.id, Status::Error, &api::timestamp())
                .await?;
        }
        raise_open_files(args.max_connections);
        let (listener, public_url) = listen(args).await?;
        let metrics_listener = match &args.metrics_listen {
            Some(addr) => Some(listen_metrics(addr).await?),
            None => None,
        };
        // The upload store keeps the uploads of live sandboxes and removes
        // the rest. On the kubernetes backend the volume is shared by every
        // replica: the live sandboxes are the claims' (all replicas'), not
        // none, or a replica starting would delete every upload; without
        // the API server nothing is removed.
        let uploads_live = match &cluster {
            Some(_) => match store.list(None).await {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the live sandboxes: every stored upload is kept");
                    None
                }
            },
            None => Some(live.clone()),
        };
        let owners: Option<Vec<(String, String)>> =
            uploads_live.map(|l| l.iter().map(|s| (s.id.clone(), s.owner.clone())).collect());
        let local = cluster.is_none();
        #[cfg(feature = "kubernetes")]
        let fleet = match cluster {
            Some(cluster) => crate::fleet::Fleet::Claims {
                cluster,
                pool: pool.clone(),
            },
            None => crate::fleet::Fleet::Local(pool.clone()),
        };
        #[cfg(not(feature = "kubernetes"))]
        let fleet = crate::fleet::Fleet::Local(pool.clone());
        let host = Arc::new(Host {
            metrics: metrics::Metrics::new(&pool, args.metrics_listen.is_none()),
            store,
            pool: pool.clone(),
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
        tokio::spawn(api::reap(host.clone()));
        // The local slots' upkeep; on the kubernetes backend the pool
        // holds no slot (the warm pools are the cluster's) and none runs.
        if local {
            tokio::spawn(pool.clone().keep_warm());
            tokio::spawn(
                pool.clone()
                    .keep_reclaiming(Duration::from_secs(args.reclaim_interval)),
            );
            tokio::spawn(api::probe(host.clone()));
        }
        Ok(Started {
            host,
            listener,
            public_url,
            generated_key: c.generated_key,
            metrics_listener,
            record_catalogs: args.catalogs == pool::CatalogMode::Record && local,
        })
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
        self.host.pool.clone().record_catalogs().await;
        tracing::info!(
            took_ms = t.elapsed().as_millis() as u64,
            "discovery catalogs ready"
        );
    }

    /// After the listener stopped: releases already accepted finish first
    /// (their slots go back to the pool, and are stopped with it), then the
    /// pool closes: its idle and starting sandboxes stop, leased ones keep
    /// running for the next start.
    pub async fn stop(host: Shared) {
        #[cfg(feature = "kubernetes")]
        if let crate::fleet::Fleet::Claims { cluster, .. } = &host.fleet {
            cluster.stop().await;
        }
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
        let p = host.pool.clone();
        let stopped = tokio::task::spawn_blocking(move || p.close())
            .await
            .unwrap_or(0);
        tracing::info!(
            stopped,
            "stopped the pool's idle and starting sandboxes; leased ones keep running for the next start"
        );
    }
}

/// The numeric flags that must be at least 1.
fn check_limits(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.time_scale > 0.0, "--time-scale must be positive");
    anyhow::ensure!(
        args.max_upload_bytes > 0
            && args.max_executions_per_sandbox > 0
            && args.max_stored_bytes_per_sandbox > 0
            && args.max_stored_bytes_per_key > 0
            && args.max_multipart_bytes > 0,
        "--max-upload-bytes, --max-executions-per-sandbox, --max-stored-bytes-per-sandbox, \
         --max-stored-bytes-per-key and --max-multipart-bytes must be at least 1"
    );
    anyhow::ensure!(
        args.max_connections > 0,
        "--max-connections must be at least 1"
    );
    anyhow::ensure!(
        args.slot_start_timeout != Some(0),
        "--slot-start-timeout must be at least 1 second"
    );
    anyhow::ensure!(
        args.max_slots.is_none_or(|m| m >= args.pool_size.max(1)),
        "--max-slots must be at least --pool-size (and 1)"
    );
    anyhow::ensure!(
        args.header_timeout_ms > 0,
        "--header-timeout-ms must be at least 1"
    );
    Ok(())
}

/// The longest unix socket path the kernel takes (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The data dir can hold slots: the sockets the host dials in a slot's
/// directory fit in a unix socket address, and the host can write there.
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

fn check_data_dir(data: &std::path::Path, backend: &pool::Backend) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let slots = pool::slots_dir(data);
    // A slot's directory is named by 32 hex digits.
    let slot = slots.join("0".repeat(32));
    let sockets: &[&str] = match backend.kind() {
        pool::Kind::Process => &["run/agent.sock", "run/mcp.sock"],
        pool::Kind::Qemu => &["vsock.sock"],
        pool::Kind::Kubernetes => &[],
    };
    for s in sockets {
        let p = slot.join(s);
        let len = p.as_os_str().as_bytes().len();
        anyhow::ensure!(
            len <= MAX_SOCKET_PATH,
            "--data-dir {} is too long for this backend's sockets: a slot's {} would be {} ({len} bytes), past the {MAX_SOCKET_PATH}-byte limit of a unix socket path; use a data dir of at most {} bytes",
            data.display(),
            s,
            p.display(),
            data.as_os_str().as_bytes().len() - (len - MAX_SOCKET_PATH),
        );
    }
    if sockets.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(&slots)
        .with_context(|| format!("--data-dir: creating {}", slots.display()))?;
    let probe = slots.join(format!(".probe-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .and_then(|()| std::fs::remove_dir(&probe))
        .with_context(|| {
            format!(
                "--data-dir {}: the host cannot make a slot's directory in {}",
                data.display(),
                slots.display()
            )
        })
}

/// The pool fits in the subordinate id blocks this host may use (one per
/// slot).
fn check_blocks(args: &Args, blocks: u32) -> anyhow::Result<()> {
    let blocks = blocks as usize;
    anyhow::ensure!(
        args.pool_size <= blocks,
        "--pool-size {} needs {} subordinate id blocks (one per isolated sandbox); this host may use {blocks} (65,536 ids each, from /etc/subuid and /etc/subgid): lower --pool-size or grant more ids",
        args.pool_size,
        args.pool_size
    );
    if let Some(m) = args.max_slots {
        anyhow::ensure!(
            m <= blocks,
            "--max-slots {m} is more than the {blocks} subordinate id blocks this host may use (one per isolated sandbox): lower --max-slots or grant more ids in /etc/subuid and /etc/subgid"
        );
    }
    Ok(())
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

/// The data dir and what in it only this host may read: the database,
/// the signing key and the uploads are its user's alone; isolated agents
/// only pass through the data dir to their own slot's directories.
/// Returns the uploads directory.
fn private_dirs(data: &std::path::Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .with_context(|| format!("chmod {m:o} {}", p.display()))
    };
    std::fs::create_dir_all(data).with_context(|| format!("creating {}", data.display()))?;
    mode(data, 0o711)?;
    let uploads = data.join("uploads");
    std::fs::create_dir_all(&uploads)?;
    mode(&uploads, 0o700)?;
    for f in ["host.db", "host.db-wal", "host.db-shm", "signing.key"] {
        let p = data.join(f);
        if p.exists() {
            mode(&p, 0o600)?;
        } else if f == "host.db" {
            // SQLite creates its WAL and shm files with the database's mode.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .with_context(|| format!("creating {}", p.display()))?;
        }
    }
    Ok(uploads)
}

/// The kubernetes backend's fleet, or nothing in a build without it.
#[cfg(feature = "kubernetes")]
use crate::fleet::cluster::Cluster;
#[cfg(not(feature = "kubernetes"))]
type Cluster = std::convert::Infallible;

#[cfg(not(feature = "kubernetes"))]
async fn connect_cluster(
    _: &Args,
    plan: config::ClusterPlan,
    _: &[u8],
) -> anyhow::Result<Arc<Cluster>> {
    match plan {}
}

/// The kubernetes backend's fleet, coordinating with the other replicas:
/// a client of the API server (the kubeconfig of KUBECONFIG or ~/.kube,
/// else the pod's service account).
#[cfg(feature = "kubernetes")]
async fn connect_cluster(
    args: &Args,
    plan: config::ClusterPlan,
    signing_key: &[u8],
) -> anyhow::Result<Arc<Cluster>> {
    let mut kube_config = sandbox_kube::kube::Config::infer()
        .await
        .context("--backend kubernetes: no Kubernetes API server configured (KUBECONFIG, ~/.kube/config, or the pod's service account)")?;
    // No watch runs: a call unanswered this long is a stalled API server,
    // not kube's default of 295 s for watches.
    let call = Duration::from_secs(args.kube_call_timeout);
    kube_config.read_timeout = Some(call);
    kube_config.write_timeout = Some(call);
    // The API server's audit log and metrics name the caller.
    kube_config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("sandbox-host/", env!("CARGO_PKG_VERSION"))),
    ));
    let client = sandbox_kube::kube::Client::try_from(kube_config).context(
        "--backend kubernetes: cannot make a client of the Kubernetes API server's configuration",
    )?;
    let namespace = plan
        .namespace
        .unwrap_or_else(|| client.default_namespace().to_owned());
    tracing::info!(%namespace, pools = ?plan.pools, "serving the sandboxes of agent-sandbox's warm pools");
    let fleet = sandbox_kube::Fleet::new(
        client,
        sandbox_kube::FleetConfig {
            namespace,
            pools: plan.pools,
            claim_timeout: Duration::from_secs(args.kube_claim_timeout),
            shutdown_grace: Duration::from_secs(args.kube_shutdown_grace),
            coord: sandbox_kube::coord::CoordConfig {
                presence_ttl: Duration::from_secs(args.kube_presence_ttl),
                reservation_ttl: Duration::from_secs(args.kube_reservation_ttl),
            },
        },
    );
    let cluster = Arc::new(Cluster::new(
        fleet,
        crate::fleet::cluster::ClusterConfig {
            bootstrap: plan.bootstrap,
            agent_port: args.kube_agent_port,
            mcp_port: args.kube_mcp_port,
            admit_cache: Duration::from_millis(args.kube_admit_cache_ms),
            bind_within: Duration::from_secs(args.kube_bind_timeout),
            release_within: Duration::from_secs(args.kube_release_timeout),
        },
        signing_key.to_vec(),
    ));
    cluster.coordinate();
    Ok(cluster)
}

/// A signing key every replica shares (`--signing-key-file`): at least 32
/// bytes, the file's own.
fn shared_signing_key(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let k = std::fs::read(path)
        .with_context(|| format!("reading --signing-key-file {}", path.display()))?;
    anyhow::ensure!(
        k.len() >= 32,
        "--signing-key-file {}: the key is {} bytes; use at least 32 random bytes (head -c 32 /dev/urandom)",
        path.display(),
        k.len()
    );
    Ok(k)
}

/// The key that signs transfer URLs: random, kept in the data dir so URLs
/// stay valid across a restart.
fn signing_key(dir: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("signing.key");
    if let Ok(k) = std::fs::read(&path) {
        return Ok(k);
    }
    let k = sandbox_client::random::bytes::<32>()
        .context("making the key that signs transfer URLs")?
        .to_vec();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::io::Write::write_all(&mut f, &k)?;
    Ok(k)
}
