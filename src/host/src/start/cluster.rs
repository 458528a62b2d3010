//! The kubernetes backend's cluster, connected at start.

use std::sync::Arc;
#[cfg(feature = "kubernetes")]
use std::time::Duration;

#[cfg(feature = "kubernetes")]
use anyhow::Context;

use crate::config::{self, Args};

use crate::fleet::Cluster;

#[cfg(not(feature = "kubernetes"))]
pub(super) async fn connect_cluster(
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
pub(super) async fn connect_cluster(
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
