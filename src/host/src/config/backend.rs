//! The backend the flags describe (the one place that names its kind),
//! checked before anything starts.

use std::path::PathBuf;

use anyhow::Context;

use std::sync::Arc;

use super::{Args, BackendKind, INSTALLED_MANIFEST, kube};
use crate::fleet::Fleet;
use crate::pool;

/// The fleet of the backend chosen: claimed pods when a cluster is
/// connected (`--backend kubernetes`), else the pool's own slots. The one
/// place a fleet's kind is chosen; everything above holds it as a
/// [`Fleet`].
pub fn fleet(
    cluster: Option<Arc<crate::fleet::Cluster>>,
    pool: &Arc<pool::Pool>,
) -> Arc<dyn Fleet> {
    match cluster {
        #[cfg(feature = "kubernetes")]
        Some(cluster) => Arc::new(crate::fleet::claims::Claims::new(cluster, pool.clone())),
        _ => Arc::new(crate::fleet::local::Local::new(pool.clone())),
    }
}

/// The backend the arguments describe, checked before anything starts.
pub fn backend(args: &Args) -> anyhow::Result<pool::Backend> {
    match args.backend {
        BackendKind::Process => process_backend(args),
        BackendKind::Kubernetes => kube::backend(args),
        BackendKind::Qemu => qemu_backend(args),
    }
}

/// The process backend: the agent binary and the manifest, checked.
fn process_backend(args: &Args) -> anyhow::Result<pool::Backend> {
    let agent_bin = match &args.agent_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("sandbox-agent"))
            .context("locating sandbox-agent")?,
    };
    anyhow::ensure!(
        agent_bin.is_file(),
        "no agent binary at {} (give --agent-bin)",
        agent_bin.display()
    );
    // Without a manifest every sandbox would carry no server.
    let installed = std::path::Path::new(INSTALLED_MANIFEST);
    anyhow::ensure!(
        args.manifest.is_some() || installed.is_file(),
        "no MCP server manifest: pass --manifest FILE (packaging/servers.toml in the \
         source tree, with the servers packaging/install-servers.sh installs), or \
         install one as {INSTALLED_MANIFEST}; without it the sandboxes carry no server"
    );
    if let Some(m) = &args.manifest {
        anyhow::ensure!(m.is_file(), "no manifest at {} (--manifest)", m.display());
    }
    // Absolute: the agents run elsewhere (their own root, when
    // isolated).
    let abs = |p: &std::path::Path| {
        std::fs::canonicalize(p).with_context(|| format!("resolving {}", p.display()))
    };
    Ok(pool::Backend::Process {
        agent_bin: abs(&agent_bin)?,
        manifest: args.manifest.as_deref().map(abs).transpose()?,
    })
}

/// The qemu backend: the VM image, the runner and their limits, checked.
fn qemu_backend(args: &Args) -> anyhow::Result<pool::Backend> {
    let image = args.vm_image.clone().context(
        "--backend qemu needs --vm-image (build one with packaging/vm/build-initramfs.sh)",
    )?;
    anyhow::ensure!(image.is_file(), "no VM image at {}", image.display());
    anyhow::ensure!(
        args.manifest.is_none(),
        "--manifest is for the process backend: a VM runs the manifest baked into its image"
    );
    anyhow::ensure!(
        args.vm_memory >= 256,
        "--vm-memory must be at least 256 MiB"
    );
    anyhow::ensure!(
        args.vm_cpus.is_none_or(|n| (1..=64).contains(&n)),
        "--vm-cpus must be from 1 to 64"
    );
    let run_script = match &args.vm_runner {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("run-qemu.sh"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| {
                // The source tree's (this package is src/host).
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../packaging/vm/run-qemu.sh"
                ))
            }),
    };
    anyhow::ensure!(
        run_script.is_file(),
        "no run-qemu.sh at {} (give --vm-runner)",
        run_script.display()
    );
    let accel = pool::probe_accel(&run_script, &image)?;
    tracing::info!(%accel, "VMs will run with {accel}");
    Ok(pool::Backend::Qemu {
        run_script,
        image,
        memory_mib: args.vm_memory,
        cpus: args.vm_cpus,
        accel,
    })
}
