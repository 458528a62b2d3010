//! How slots are made: a local agent process, or a QEMU VM whose agent
//! is reached over hybrid vsock; and the accelerator probe.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::unix::process::CommandExt;

use super::PoolError;

use super::isolate::Isolation;

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
        /// vCPUs per VM; `None`: run-qemu.sh's default for the accelerator.
        cpus: Option<u32>,
        /// `kvm` or `tcg`, decided once (see [`probe_accel`]).
        accel: String,
    },
    /// Pods claimed from agent-sandbox's warm pools (`crate::fleet::cluster`):
    /// the pool makes no slot itself. (Made only with the `kubernetes`
    /// feature.)
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    Kubernetes,
}

impl Backend {
    pub fn kind(&self) -> Kind {
        match self {
            Backend::Process { .. } => Kind::Process,
            Backend::Qemu { .. } => Kind::Qemu,
            Backend::Kubernetes => Kind::Kubernetes,
        }
    }
    /// The sockets the host dials in a slot's directory (relative to it);
    /// none for a pod, reached over TCP.
    pub fn slot_sockets(&self) -> &'static [&'static str] {
        match self.kind() {
            Kind::Process => &["run/agent.sock", "run/mcp.sock"],
            Kind::Qemu => &["vsock.sock"],
            Kind::Kubernetes => &[],
        }
    }

    /// How long a new slot may take to serve, unless
    /// `--slot-start-timeout` says otherwise. Twenty isolated agents
    /// starting at once on two busy cores take tens of seconds.
    pub(super) fn start_deadline(&self) -> Duration {
        match self {
            Backend::Process { .. } => Duration::from_secs(60),
            // A VM under TCG boots in seconds, but slowly on a busy machine.
            Backend::Qemu { .. } => Duration::from_secs(300),
            Backend::Kubernetes => Duration::from_secs(120),
        }
    }
}

/// The kinds of backend (`--backend`): the one place they are named;
/// config makes the fleet of the kind chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Process,
    Qemu,
    /// Pods claimed from agent-sandbox's warm pools (docs/kubernetes.md).
    Kubernetes,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Process => "process",
            Kind::Qemu => "qemu",
            Kind::Kubernetes => "kubernetes",
        }
    }
}

/// The agent's arguments in slot `dir`: its paths as the agent sees them
/// (inside its namespaces when isolated, else the slot's directories).
pub(super) fn agent_args(
    dir: &Path,
    id: &str,
    agent_bin: &Path,
    manifest: Option<&Path>,
    isolated: bool,
) -> Result<Vec<String>, PoolError> {
    use super::isolate::{IN_DATA, IN_EXEC, IN_RUN, IN_STATE, IN_WORKSPACE};
    let s = |p: &Path| p.display().to_string();
    let (ws, exec, state, data, run) = if isolated {
        (
            IN_WORKSPACE.to_owned(),
            IN_EXEC.to_owned(),
            IN_STATE.to_owned(),
            IN_DATA.to_owned(),
            IN_RUN.to_owned(),
        )
    } else {
        for sub in ["ws", "run"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(PoolError::io(format!("creating {}/{sub}", dir.display())))?;
        }
        (
            s(&dir.join("ws")),
            s(&dir.join("exec")),
            s(&dir.join("state")),
            // The benchmark profiles' /data: agents on one machine cannot
            // all own /data, so each gets <slot>/data, a symlink to its
            // workspace.
            s(&dir.join("data")),
            s(&dir.join("run")),
        )
    };
    let mut a = vec![
        s(agent_bin),
        "--listen".into(),
        format!("unix://{run}/agent.sock"),
        "--mcp-listen".into(),
        format!("unix://{run}/mcp.sock"),
        "--workspace".into(),
        ws,
        "--exec-root".into(),
        exec,
        // Agents on one machine must not share server state.
        "--state-root".into(),
        state,
        "--data-path".into(),
        data,
        // Isolated, the agent owns its mount namespace: /data is a bind
        // mount, so servers that resolve paths see /data itself.
        "--data-link".into(),
        if isolated { "bind" } else { "symlink" }.into(),
        // Several agents may share this machine's loopback.
        "--mail-ports".into(),
        "auto".into(),
        "--name".into(),
        id.to_owned(),
    ];
    if !isolated {
        // Without namespaces the agent cannot switch users: tenants run as
        // it does (development only).
        a.extend(["--tenant-user".into(), "none".into()]);
    }
    if let Some(m) = manifest {
        a.push("--manifest".into());
        a.push(s(m));
    }
    Ok(a)
}

/// Where the slots' directories are, in the data dir.
pub fn slots_dir(data: &Path) -> PathBuf {
    data.join("slots")
}

/// Which accelerator the VMs get: `kvm` when a guest kernel really boots
/// under it, else `tcg` (run-qemu.sh's probe, run once for the whole pool
/// instead of once per VM).
pub fn probe_accel(run_script: &Path, image: &Path) -> Result<String, PoolError> {
    let out = std::process::Command::new(run_script)
        .arg("--probe-accel")
        .arg("--initramfs")
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(PoolError::io(format!("running {}", run_script.display())))?;
    let accel = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !(out.status.success() && (accel == "kvm" || accel == "tcg")) {
        return Err(PoolError::Probe(format!(
            "{} --probe-accel failed: {}",
            run_script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(accel)
}

/// Starts `cmd` in its own session (and process group), output to `log`:
/// a host restart (or its terminal closing) does not take the slot down,
/// and a stop reaches every process of it. Returns its pid; a thread reaps
/// it when it exits (while this host runs).
pub(super) fn spawn_in_session(
    mut cmd: std::process::Command,
    log: std::fs::File,
) -> Result<u32, PoolError> {
    cmd.stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(PoolError::io("the slot's log"))?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(PoolError::io(format!("starting {cmd:?}")))?;
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// How many times an isolated slot's namespaces are set up before its
/// start fails (bubblewrap's netlink setup of the loopback interface has
/// been seen to fail once in a while when slots start together).
const ISOLATED_START_TRIES: usize = 3;

/// [`spawn_isolated_once`], tried again when the setup failed before the
/// agent ran.
pub(super) fn spawn_isolated(
    iso: &Isolation,
    dir: &std::path::Path,
    id: &str,
    agent_bin: &std::path::Path,
    manifest: Option<&std::path::Path>,
    env: &super::AgentEnv,
    log: std::fs::File,
) -> Result<u32, PoolError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let log = log.try_clone().map_err(PoolError::io("the slot's log"))?;
        match spawn_isolated_once(iso, dir, id, agent_bin, manifest, env, log) {
            Ok(pid) => return Ok(pid),
            Err(e) if tries < ISOLATED_START_TRIES => {
                tracing::warn!(slot = %id, error = %e, "setting up a sandbox failed; trying again");
            }
            Err(e) => return Err(e),
        }
    }
}

/// Starts an isolated agent (see [`isolate`]): its id block, directories
/// and cgroups, then the agent in its namespaces, then its network.
/// Returns the agent's host pid (PID 1 of its pid namespace). Blocking.
fn spawn_isolated_once(
    iso: &Isolation,
    dir: &std::path::Path,
    id: &str,
    agent_bin: &std::path::Path,
    manifest: Option<&std::path::Path>,
    env: &super::AgentEnv,
    log: std::fs::File,
) -> Result<u32, PoolError> {
    let block = iso.take_block(dir)?;
    iso.prepare_dirs(dir, block)?;
    let cgroups = iso.cgroups(id, block)?;
    let args = agent_args(dir, id, agent_bin, manifest, true)?;
    let (info_r, info_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let mut cmd = iso.command(dir, block, &args, agent_bin, manifest, &cgroups, info_w);
    // unshare and bwrap pass their environment on to the agent.
    env.apply(&mut cmd);
    cmd.env("SANDBOX_AGENT_CONFIG", "/dev/null")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(PoolError::io("the slot's log"))?)
        .stderr(log);
    let mut monitor = cmd
        .spawn()
        .map_err(PoolError::io("starting unshare and bwrap"))?;
    // The parent's copy of the write end went with `cmd`.
    drop(cmd);
    let pid = match iso.agent_pid(info_r) {
        Ok(p) => p,
        Err(e) => {
            let _ = monitor.kill();
            let _ = monitor.wait();
            return Err(abandon(id, dir, e.into()));
        }
    };
    std::thread::spawn(move || {
        let _ = monitor.wait();
    });
    if let Err(e) = iso
        .network(dir, pid)
        .and_then(|()| iso.no_nested_userns(pid))
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        return Err(abandon(id, dir, e.into()));
    }
    Ok(pid)
}

/// Undoes a slot whose setup failed (its cgroups, its pasta) and returns
/// the error with the end of the slot's log, which says why.
fn abandon(id: &str, dir: &Path, e: PoolError) -> PoolError {
    super::isolate::teardown(id, dir);
    super::isolate::slot_fs::unmount(dir);
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    PoolError::Setup {
        error: Box::new(e),
        log: super::slot::tail(&log, 2000).to_owned(),
    }
}
