//! A build without the `kubernetes` feature: no cluster is ever planned,
//! and `--backend kubernetes` is refused at start, naming the feature.

/// No cluster can be planned in this build.
pub type ClusterPlan = std::convert::Infallible;

pub fn cluster(_: &super::Args) -> anyhow::Result<Option<ClusterPlan>> {
    Ok(None)
}

pub fn backend(_: &super::Args) -> anyhow::Result<crate::pool::Backend> {
    anyhow::bail!(
        "--backend kubernetes: this sandbox-host was built without its `kubernetes` feature; \
         build it with `cargo build --release -p sandbox-host --features kubernetes` \
         (the packaged image has it)"
    )
}
