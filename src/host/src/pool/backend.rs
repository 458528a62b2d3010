//! How slots are made: a local agent process, or a QEMU VM whose agent
//! is reached over hybrid vsock; and the accelerator probe.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

/// The VM image's agent ports (`packaging/vm/build-initramfs.sh`).
pub(super) const VM_AGENT_PORT: u32 = sandbox_client::limits::AGENT_VSOCK_PORT;
pub(super) const VM_MCP_PORT: u32 = sandbox_client::limits::MCP_VSOCK_PORT;

/// How slots are made.
#[derive(Debug, Clone)]
pub enum Backend {
    Process {
        agent_bin: PathBuf,
        manifest: Option<PathBuf>,
    },
    Qemu {
        /// `packaging/vm/run-qemu.sh`.
        run_script: PathBuf,
        /// An initramfs from `build-initramfs.sh` (its kernel beside it).
        image: PathBuf,
        memory_mib: u32,
        /// `kvm` or `tcg`, decided once (see [`probe_accel`]).
        accel: String,
    },
}

impl Backend {
    pub(super) fn kind(&self) -> Kind {
        match self {
            Backend::Process { .. } => Kind::Process,
            Backend::Qemu { .. } => Kind::Qemu,
        }
    }
    /// How long a new slot may take to serve.
    pub(super) fn start_deadline(&self) -> Duration {
        match self {
            Backend::Process { .. } => Duration::from_secs(20),
            // A VM under TCG boots in seconds, but slowly on a busy machine.
            Backend::Qemu { .. } => Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Process,
    Qemu,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Process => "process",
            Kind::Qemu => "qemu",
        }
    }
}

/// The command line of a local agent in slot `dir`.
pub(super) fn process_command(
    dir: &Path,
    id: &str,
    agent_bin: &Path,
    manifest: Option<&Path>,
) -> anyhow::Result<std::process::Command> {
    std::fs::create_dir_all(dir.join("ws"))?;
    let mut cmd = std::process::Command::new(agent_bin);
    cmd.arg("--listen")
        .arg(format!("unix://{}", dir.join("agent.sock").display()))
        .arg("--mcp-listen")
        .arg(format!("unix://{}", dir.join("mcp.sock").display()))
        .arg("--workspace")
        .arg(dir.join("ws"))
        .arg("--exec-root")
        .arg(dir.join("exec"))
        // Agents on one machine must not share server state.
        .arg("--state-root")
        .arg(dir.join("state"))
        // The benchmark profiles' /data: agents on one machine cannot all
        // own /data, so each gets <slot>/data, a symlink to its workspace.
        .arg("--data-path")
        .arg(dir.join("data"))
        // Several agents share this machine's loopback.
        .arg("--mail-ports")
        .arg("auto")
        .arg("--name")
        .arg(id)
        .env("SANDBOX_AGENT_CONFIG", "/dev/null");
    if let Some(m) = manifest {
        cmd.arg("--manifest").arg(m);
    }
    Ok(cmd)
}

/// Where the slots' directories are, in the data dir.
pub fn slots_dir(data: &Path) -> PathBuf {
    data.join("slots")
}

/// Which accelerator the VMs get: `kvm` when a guest kernel really boots
/// under it, else `tcg` (run-qemu.sh's probe, run once for the whole pool
/// instead of once per VM).
pub fn probe_accel(run_script: &Path, image: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(run_script)
        .arg("--probe-accel")
        .arg("--initramfs")
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", run_script.display()))?;
    let accel = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    anyhow::ensure!(
        out.status.success() && (accel == "kvm" || accel == "tcg"),
        "{} --probe-accel failed: {}",
        run_script.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(accel)
}
