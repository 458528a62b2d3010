//! The kubernetes backend's flags, checked into what it is built from.

use anyhow::Context;

use super::{Args, BackendKind};

/// The kubernetes backend: none of the local backends' flags.
pub fn backend(args: &Args) -> anyhow::Result<crate::pool::Backend> {
    anyhow::ensure!(
        args.manifest.is_none() && args.vm_image.is_none(),
        "--manifest and --vm-image are for the local backends: a pod runs its image's manifest"
    );
    anyhow::ensure!(
        args.warm.is_empty() && args.warm_servers.trim().is_empty(),
        "--warm is for the local backends: on kubernetes the SandboxWarmPools keep sandboxes warm (--kube-pool)"
    );
    Ok(crate::pool::Backend::Kubernetes)
}

/// The kubernetes backend's settings from the flags, checked (`None` for
/// the other backends).
pub fn cluster(args: &Args) -> anyhow::Result<Option<ClusterPlan>> {
    if args.backend != BackendKind::Kubernetes {
        return Ok(None);
    }
    let mut pools = std::collections::BTreeMap::new();
    for spec in &args.kube_pools {
        let (bench, pool) = spec
            .split_once('=')
            .unwrap_or((sandbox_kube::fleet::DEFAULT_POOL, spec.as_str()));
        anyhow::ensure!(
            !pool.is_empty() && !bench.is_empty(),
            "--kube-pool takes [BENCHMARK=]POOL, not {spec:?}"
        );
        anyhow::ensure!(
            pools.insert(bench.to_owned(), pool.to_owned()).is_none(),
            "--kube-pool: two pools for {bench}"
        );
    }
    anyhow::ensure!(
        !pools.is_empty(),
        "--backend kubernetes needs at least one --kube-pool [BENCHMARK=]SANDBOXWARMPOOL"
    );
    anyhow::ensure!(
        args.kube_claim_timeout > 0
            && args.kube_call_timeout > 0
            && args.kube_bind_timeout > 0
            && args.kube_release_timeout > 0,
        "--kube-claim-timeout, --kube-call-timeout, --kube-bind-timeout and --kube-release-timeout must be at least 1"
    );
    anyhow::ensure!(
        (3..=3600).contains(&args.kube_presence_ttl)
            && (5..=3600).contains(&args.kube_reservation_ttl),
        "--kube-presence-ttl must be from 3 to 3600 s and --kube-reservation-ttl from 5 to 3600 s"
    );
    anyhow::ensure!(
        args.signing_key_file.is_some(),
        "--backend kubernetes needs --signing-key-file: the replicas serving one fleet must share the key (a Secret)"
    );
    let file = args.kube_bootstrap_token_file.as_ref().context(
        "--backend kubernetes needs --kube-bootstrap-token-file: the warm pools' bootstrap secret",
    )?;
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading --kube-bootstrap-token-file {}", file.display()))?;
    let bootstrap = sandbox_client::auth::Token::new(&text, "--kube-bootstrap-token-file")?;
    Ok(Some(ClusterPlan {
        namespace: args.kube_namespace.clone(),
        pools,
        bootstrap,
    }))
}

/// What the kubernetes backend is built from once a runtime runs.
pub struct ClusterPlan {
    pub namespace: Option<String>,
    pub pools: std::collections::BTreeMap<String, String>,
    pub bootstrap: sandbox_client::auth::Token,
}
