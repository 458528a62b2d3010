//! The process backend's isolation: every slot's agent runs in namespaces
//! of its own, as it would in a VM.
//!
//! - **User namespace** (util-linux `unshare` with shadow's `newuidmap`):
//!   the slot's 65,536 ids map to its own block of the host user's
//!   subordinate ids (`/etc/subuid`, `/etc/subgid`). The agent is root of
//!   that namespace (host uid `base`); tenants run as its uid 1000 (host
//!   `base + 1000`): unprivileged on the host, and a different uid in every
//!   slot.
//! - **Mount, pid, ipc, uts, cgroup and network namespaces** (bubblewrap):
//!   the agent is PID 1 of its pid namespace (`--as-pid-1`), so killing it
//!   ends every process of the slot whatever they did to their session,
//!   group or cgroup. The filesystem is an allow-list: system directories
//!   and the configured read-only paths, the slot's own workspace, state,
//!   executions and socket directories, fresh `/proc`, `/dev`, `/tmp`.
//!   Nothing of the data dir, other slots or the host's processes exists
//!   there.
//! - **Network**: a private network namespace; with `outbound`, pasta
//!   (Debian's `passt`) gives it user-mode outbound access with the host's
//!   loopback closed (`--no-map-gw`, no port forwarding), and link-local
//!   (cloud metadata) is unreachable.
//! - **cgroups**: the slot's own group(s) with `memory` and `pids` limits
//!   (cgroup v2 where those controllers are enabled, else v1), delegated to
//!   the agent (cgroup v2) for its servers' groups; tenants cannot leave
//!   them (the files belong to the host's root).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Ids per slot: one whole 16-bit id space, as a VM has.
pub const IDS_PER_SLOT: u32 = 65_536;
/// Where the slot's directories are inside its namespaces.
pub const IN_WORKSPACE: &str = "/workspace";
pub const IN_STATE: &str = "/var/lib/sandbox-agent/state";
pub const IN_EXEC: &str = "/var/lib/sandbox-agent/executions";
pub const IN_RUN: &str = "/run/sandbox-agent";
pub const IN_DATA: &str = "/data";
/// System directories shown read-only (when they exist on the host).
const SYSTEM_DIRS: &[&str] = &["/usr", "/etc", "/opt", "/var/lib/dpkg"];
/// Top-level names that are directories or (merged /usr) symlinks.
const SYSTEM_LINKS: &[&str] = &["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"];
/// Addresses a tenant never reaches: link-local (cloud metadata services at
/// 169.254.169.254, fd00:ec2::254).
const BLOCKED_ROUTES: &[&str] = &["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128"];
/// Tools this module runs (each from the host's PATH).
const TOOLS: &[(&str, &str)] = &[
    ("bwrap", "bubblewrap"),
    ("unshare", "util-linux"),
    ("newuidmap", "uidmap"),
    ("nsenter", "util-linux"),
];

/// `--isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Each slot in its own namespaces, unprivileged (the default).
    Namespaces,
    /// No isolation: tenants run as this host's user and reach its files,
    /// processes and loopback. Development only.
    None,
}

/// `--sandbox-network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Network {
    /// Outbound access through pasta; the host's loopback and link-local
    /// addresses unreachable.
    Outbound,
    /// Loopback only.
    None,
}

/// Settings of [`Isolation`], from the command line.
#[derive(Debug, Clone)]
pub struct IsolationConfig {
    /// Extra paths shown read-only at the same place (interpreters or
    /// servers installed outside the system directories).
    pub read_only: Vec<PathBuf>,
    /// memory.max (v2) / memory.limit_in_bytes (v1) of each slot.
    pub memory_max: u64,
    /// pids.max of each slot (processes and threads).
    pub pids_max: u64,
    pub network: Network,
    /// Ports of this host's loopback forwarded into every sandbox's own
    /// loopback (a local package mirror, or a test's stand-in).
    pub host_ports: Vec<u16>,
    /// The host's data dir and its listening port: never shown to a
    /// sandbox, through a read-only path or a forwarded port.
    pub data_dir: PathBuf,
    pub api_port: u16,
}

/// Why the process backend cannot isolate its slots.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    #[error(
        "isolation needs {tool} (Debian package {package}), which is not on PATH; install it, or run with --isolation none (development only: tenants then reach this host)"
    )]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error(
        "isolation needs subordinate {kind}s for user {user} in {file}, at least {IDS_PER_SLOT} ({}); add a line such as `{user}:1000000:{}` to /etc/subuid and /etc/subgid (e.g. `usermod --add-subuids 1000000-{} --add-subgids 1000000-{} {user}`), or run with --isolation none (development only)",
        "one slot", IDS_PER_SLOT * 64, 1_000_000 + IDS_PER_SLOT * 64 - 1, 1_000_000 + IDS_PER_SLOT * 64 - 1
    )]
    NoSubIds {
        kind: &'static str,
        user: String,
        file: &'static str,
    },
    #[error("--slot-memory-max and --slot-pids-max must be at least 1")]
    ZeroLimit,
    #[error("--sandbox-ro {0}: not an absolute path to something that exists")]
    BadReadOnly(PathBuf),
    #[error(
        "--sandbox-ro {0} would show this host's data dir {1} (its signing key, database and every sandbox's files) to tenants; install what the sandboxes need elsewhere"
    )]
    ExposesData(PathBuf, PathBuf),
    #[error("--sandbox-host-port {0}: this host's own API port is never forwarded into a sandbox")]
    ForwardsApi(u16),
    #[error(
        "the data dir {0} is below {1}, which other users cannot pass through: each sandbox's root (an unprivileged user of this host) mounts its own directories from the data dir; use a data dir elsewhere (e.g. /var/lib/sandbox-host) or `chmod o+x {1}`"
    )]
    PrivateDataDir(PathBuf, PathBuf),
    #[error("--sandbox-host-port needs --sandbox-network outbound")]
    PortsWithoutNetwork,
    #[error("every one of the {0} subordinate id blocks is in use: no more slots can start")]
    Exhausted(u32),
    #[error("setting up the sandbox: {0}")]
    Setup(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> IsolationError {
    let what = what.into();
    move |source| IsolationError::Io { what, source }
}

/// A checked isolation setup, shared by every slot.
#[derive(Debug)]
pub struct Isolation {
    cfg: IsolationConfig,
    uid_start: u32,
    gid_start: u32,
    /// Blocks of IDS_PER_SLOT ids available.
    blocks: u32,
    cgroups: CgroupLayout,
}

impl Isolation {
    /// Checks the tools, the subordinate ids and the cgroup hierarchy.
    pub fn new(cfg: IsolationConfig) -> Result<Isolation, IsolationError> {
        let mut tools = TOOLS.to_vec();
        if cfg.network == Network::Outbound {
            tools.push(("pasta", "passt"));
            tools.push(("ip", "iproute2"));
        }
        for (tool, package) in tools {
            if which(tool).is_none() {
                return Err(IsolationError::MissingTool { tool, package });
            }
        }
        if cfg.memory_max == 0 || cfg.pids_max == 0 {
            return Err(IsolationError::ZeroLimit);
        }
        let data = std::fs::canonicalize(&cfg.data_dir).unwrap_or_else(|_| cfg.data_dir.clone());
        for p in &cfg.read_only {
            if !p.is_absolute() || !p.exists() {
                return Err(IsolationError::BadReadOnly(p.clone()));
            }
            let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            if data.starts_with(&real) || real.starts_with(&data) {
                return Err(IsolationError::ExposesData(p.clone(), data));
            }
        }
        if let Some(private) = unreachable_ancestor(&data) {
            return Err(IsolationError::PrivateDataDir(data, private));
        }
        if cfg.host_ports.contains(&cfg.api_port) {
            return Err(IsolationError::ForwardsApi(cfg.api_port));
        }
        if !cfg.host_ports.is_empty() && cfg.network == Network::None {
            return Err(IsolationError::PortsWithoutNetwork);
        }
        let uid = nix::unistd::getuid().as_raw();
        let user = nix::unistd::User::from_uid(uid.into())
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| uid.to_string());
        let (uid_start, ucount) =
            subids("/etc/subuid", &user, uid).ok_or_else(|| IsolationError::NoSubIds {
                kind: "uid",
                user: user.clone(),
                file: "/etc/subuid",
            })?;
        let (gid_start, gcount) =
            subids("/etc/subgid", &user, uid).ok_or_else(|| IsolationError::NoSubIds {
                kind: "gid",
                user: user.clone(),
                file: "/etc/subgid",
            })?;
        let blocks = ucount.min(gcount) / IDS_PER_SLOT;
        let cgroups = CgroupLayout::detect();
        tracing::info!(
            blocks,
            uid_start,
            cgroups = ?cgroups,
            network = ?cfg.network,
            "slots run isolated: own user, mount, pid, ipc, uts, cgroup and network namespaces"
        );
        Ok(Isolation {
            cfg,
            uid_start,
            gid_start,
            blocks,
            cgroups,
        })
    }

    /// Takes the lowest free id block for the new slot `dir`, machine-wide:
    /// each block in use is a symlink `BLOCK_REGISTRY/<n>` to its slot's
    /// directory, made atomically, so two hosts of one user (two data
    /// dirs) never give a uid to two sandboxes. A link whose slot is gone
    /// is taken over. The block is also recorded in `dir/uid_block`.
    pub(super) fn take_block(&self, dir: &Path) -> Result<u32, IsolationError> {
        let registry = Path::new(BLOCK_REGISTRY);
        std::fs::create_dir_all(registry)
            .map_err(io(format!("creating {}", registry.display())))?;
        // One taker at a time, machine-wide: two takers of one stale link
        // would otherwise both remove it and both believe the block theirs.
        let lock_path = registry.join(".lock");
        let lock = std::fs::File::create(&lock_path)
            .map_err(io(format!("creating {}", lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io(format!("locking {}", lock_path.display()))(e.into()))?;
        for block in 0..self.blocks {
            let link = registry.join(block.to_string());
            let taken = match std::os::unix::fs::symlink(dir, &link) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A slot that is gone (a host stopped uncleanly) frees
                    // its block.
                    let stale = std::fs::read_link(&link).is_ok_and(|t| !t.exists());
                    stale
                        && std::fs::remove_file(&link).is_ok()
                        && std::os::unix::fs::symlink(dir, &link).is_ok()
                }
                Err(e) => return Err(io(format!("creating {}", link.display()))(e)),
            };
            if taken {
                std::fs::write(dir.join("uid_block"), block.to_string())
                    .map_err(io(format!("writing {}/uid_block", dir.display())))?;
                return Ok(block);
            }
        }
        Err(IsolationError::Exhausted(self.blocks))
    }

    fn ids(&self, block: u32) -> (u32, u32) {
        (
            self.uid_start + block * IDS_PER_SLOT,
            self.gid_start + block * IDS_PER_SLOT,
        )
    }

    /// Makes the slot's directories, owned by the root of its namespace.
    pub(super) fn prepare_dirs(&self, dir: &Path, block: u32) -> Result<(), IsolationError> {
        let (uid, gid) = self.ids(block);
        // The host's root owns the slot directory (its log and pid files);
        // the agent only passes through it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io(format!("chmod {}", dir.display())))?;
        for sub in ["ws", "state", "exec", "run"] {
            let p = dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io(format!("creating {}", p.display())))?;
            std::os::unix::fs::chown(&p, Some(uid), Some(gid))
                .map_err(io(format!("chown {}", p.display())))?;
            // run/ holds the agent's sockets, which a tenant must not
            // reach; tenants pass through the others to what is theirs.
            let mode = match sub {
                "run" => 0o700,
                "ws" => 0o755,
                _ => 0o711,
            };
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
                .map_err(io(format!("chmod {}", p.display())))?;
        }
        Ok(())
    }

    /// The command that starts the slot's agent in its namespaces. Its
    /// bubblewrap writes the agent's host pid as JSON to `info` (fd 3).
    #[allow(clippy::too_many_arguments)] // the slot's parts, each once
    pub(super) fn command(
        &self,
        dir: &Path,
        block: u32,
        agent: &[String],
        agent_bin: &Path,
        manifest: Option<&Path>,
        cgroups: &SlotCgroups,
        info: OwnedFd,
    ) -> Command {
        let (uid, gid) = self.ids(block);
        let mut c = Command::new("unshare");
        c.arg("--user")
            .arg(format!("--map-users={uid},0,{IDS_PER_SLOT}"))
            .arg(format!("--map-groups={gid},0,{IDS_PER_SLOT}"))
            .args(["--setuid", "0", "--setgid", "0", "--", "bwrap"])
            .args(["--unshare-pid", "--unshare-ipc", "--unshare-uts"])
            .args(["--unshare-cgroup", "--unshare-net", "--as-pid-1"])
            .args(["--info-fd", "3", "--hostname", "sandbox"]);
        c.args(self.view(dir, agent_bin, manifest));
        c.arg("--").args(agent);
        // Only what the agent and its servers need of the host's
        // environment: never the host's own secrets.
        c.env_remove(crate::config::API_KEY_ENV);
        let procs = cgroups.procs_fds();
        let raw: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        let info_raw = info.as_raw_fd();
        // SAFETY: between fork and exec only async-signal-safe calls
        // (setsid, write, dup2); the fds were opened before the fork and
        // outlive it (moved into the closure).
        unsafe {
            c.pre_exec(move || {
                let _keep = (&procs, &info);
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                for fd in &raw {
                    let b = std::os::fd::BorrowedFd::borrow_raw(*fd);
                    nix::unistd::write(b, b"0").map_err(std::io::Error::from)?;
                }
                if nix::libc::dup2(info_raw, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    }

    /// bubblewrap's arguments for the slot's filesystem: every directory
    /// leading to a mount made first, world-traversable (bubblewrap would
    /// make them 0700, and the tenant must pass through them), then the
    /// mounts.
    fn view(&self, dir: &Path, agent_bin: &Path, manifest: Option<&Path>) -> Vec<OsString> {
        let mut mounts: Vec<(&str, PathBuf, PathBuf)> = Vec::new();
        // First (what is bound below /tmp must stay visible), and mount
        // points, so the agent (PID 1) mounts none over them; it mounts its
        // own sysfs and, in its cgroup namespace, the slot's
        // delegated cgroup v2 group at /sys/fs/cgroup.
        mounts.push(("--proc", PathBuf::new(), "/proc".into()));
        mounts.push(("--dev", PathBuf::new(), "/dev".into()));
        mounts.push(("--tmpfs", PathBuf::new(), "/run".into()));
        // World-writable and sticky, as on any machine (POSIX shm, Chromium,
        // multiprocessing and every program's temporary files need them).
        for t in ["/tmp", "/var/tmp", "/dev/shm"] {
            mounts.push(("--tmpfs-sticky", PathBuf::new(), t.into()));
        }
        for d in SYSTEM_DIRS.iter().filter(|d| Path::new(d).is_dir()) {
            mounts.push(("--ro-bind", d.into(), d.into()));
        }
        for l in SYSTEM_LINKS {
            match std::fs::read_link(l) {
                Ok(target) => mounts.push(("--symlink", target, l.into())),
                Err(_) if Path::new(l).is_dir() => mounts.push(("--ro-bind", l.into(), l.into())),
                Err(_) => {}
            }
        }
        let mut ro: Vec<PathBuf> = self.cfg.read_only.clone();
        ro.push(agent_bin.to_owned());
        // The manifest file alone (what it names must be in the system
        // directories or --sandbox-ro; its directory may hold secrets).
        ro.extend(manifest.map(Path::to_owned));
        for p in ro {
            mounts.push(("--ro-bind", p.clone(), p));
        }
        for (sub, inside) in [
            ("ws", IN_WORKSPACE),
            ("state", IN_STATE),
            ("exec", IN_EXEC),
            ("run", IN_RUN),
        ] {
            mounts.push(("--bind", dir.join(sub), inside.into()));
        }
        // Before each mount, the directories leading to it that are not
        // there yet (made world-traversable); none inside a read-only bind.
        let mut args: Vec<OsString> = Vec::new();
        let mut made: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
        let mut read_only: Vec<PathBuf> = Vec::new();
        for (op, src, dest) in mounts {
            let mut parents: Vec<&Path> = dest
                .ancestors()
                .skip(1)
                .filter(|a| a.parent().is_some())
                .collect();
            parents.reverse();
            for a in parents {
                if made.contains(a) || read_only.iter().any(|r| a.starts_with(r)) {
                    continue;
                }
                args.extend(["--perms".into(), "0755".into(), "--dir".into(), a.into()]);
                made.insert(a.to_owned());
            }
            if op == "--ro-bind" {
                read_only.push(dest.clone());
            }
            made.insert(dest.clone());
            let op = match op {
                "--tmpfs-sticky" => {
                    args.extend(["--perms".into(), "1777".into()]);
                    "--tmpfs"
                }
                op => op,
            };
            args.push(op.into());
            if !src.as_os_str().is_empty() {
                args.push(src.into());
            }
            args.push(dest.into());
        }
        args
    }

    /// Reads the agent's host pid from bubblewrap's info (the read end of
    /// the pipe given to [`Isolation::command`]).
    pub(super) fn agent_pid(&self, info: OwnedFd) -> Result<u32, IsolationError> {
        #[derive(serde::Deserialize)]
        struct Info {
            #[serde(rename = "child-pid")]
            child_pid: u32,
        }
        // One JSON object; read no further than its end (the fd may stay
        // open elsewhere), and no more than 64 KiB.
        let f = std::fs::File::from(info).take(64 << 10);
        let mut values = serde_json::Deserializer::from_reader(f).into_iter::<Info>();
        match values.next() {
            Some(Ok(i)) => Ok(i.child_pid),
            Some(Err(e)) => Err(IsolationError::Setup(format!(
                "bubblewrap did not report the sandbox's pid ({e})"
            ))),
            None => Err(IsolationError::Setup(
                "bubblewrap exited before the sandbox started".into(),
            )),
        }
    }

    /// Gives the slot's network namespace its outbound access (pasta) and
    /// closes link-local addresses. `pid` is the agent's host pid.
    pub(super) fn network(&self, dir: &Path, pid: u32) -> Result<(), IsolationError> {
        if self.cfg.network == Network::None {
            return Ok(());
        }
        let netns = format!("/proc/{pid}/ns/net");
        // pasta must open the namespace of a process of another user
        // namespace, which only this host's root may; it confines itself
        // (seccomp, its own empty namespaces) once set up.
        // -T: the sandbox's loopback ports that reach this host's loopback
        // (only those asked for); nothing is forwarded the other way.
        let to_host = if self.cfg.host_ports.is_empty() {
            "none".to_owned()
        } else {
            self.cfg
                .host_ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let out = Command::new("pasta")
            .args(["--runas", "0:0", "--config-net", "--no-map-gw", "--quiet"])
            .args(["-T", &to_host, "-U", "none", "-t", "none", "-u", "none"])
            .arg("--pid")
            .arg(dir.join("pasta.pid"))
            .arg("--netns")
            .arg(&netns)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io("running pasta"))?;
        if !out.status.success() {
            return Err(IsolationError::Setup(format!(
                "pasta failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        close_host_addresses(&netns)
    }

    /// Forbids user namespaces inside the slot's own (its
    /// `user.max_user_namespaces` set to 0, from this host: the sandbox
    /// sees /proc/sys read-only): a tenant cannot become root of a nested
    /// namespace to mount file systems or make network devices there,
    /// kernel surface a sandbox does not need.
    pub(super) fn no_nested_userns(&self, pid: u32) -> Result<(), IsolationError> {
        let out = Command::new("nsenter")
            .arg(format!("--user=/proc/{pid}/ns/user"))
            .args([
                "--",
                "sh",
                "-c",
                "echo 0 > /proc/sys/user/max_user_namespaces",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(io("running nsenter"))?;
        if !out.status.success() {
            return Err(IsolationError::Setup(format!(
                "forbidding nested user namespaces: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The slot's cgroups, made and limited, before its agent starts.
    pub(super) fn cgroups(&self, id: &str, block: u32) -> Result<SlotCgroups, IsolationError> {
        let (uid, gid) = self.ids(block);
        self.cgroups
            .create(id, uid, gid, self.cfg.memory_max, self.cfg.pids_max)
    }
}

/// Makes unreachable from the namespace `netns` every address pasta would
/// carry back to this host: link-local ones (cloud metadata, and the
/// host's own fe80:: addresses, by a policy rule that wins over the
/// kernel's on-link fe80::/64 route), and each address of this host that
/// the namespace does not hold itself (pasta copies the host's main
/// address into it, where it stays local; a second address, a bridge or a
/// VPN would lead back to the host's services). One `ip -batch` run.
fn close_host_addresses(netns: &str) -> Result<(), IsolationError> {
    let host = addresses(None)?;
    let own = addresses(Some(netns))?;
    let (mut v4, mut v6) = (String::new(), String::new());
    let line = |a: &str| format!("route add prohibit {a}\n");
    for prefix in BLOCKED_ROUTES {
        if prefix.contains(':') {
            v6.push_str(&line(prefix));
        } else {
            v4.push_str(&line(prefix));
        }
    }
    v6.push_str("rule add to fe80::/10 prohibit\n");
    for a in host.iter().filter(|a| !own.contains(a) && !a.is_loopback()) {
        match a {
            std::net::IpAddr::V4(a) => v4.push_str(&line(&format!("{a}/32"))),
            std::net::IpAddr::V6(a) => v6.push_str(&line(&format!("{a}/128"))),
        }
    }
    ip_batch(netns, "-4", &v4)?;
    // Without IPv6 in the namespace there is nothing to close there.
    match ip_batch(netns, "-6", &v6) {
        Err(IsolationError::Setup(e)) if e.contains("family not supported") => Ok(()),
        r => r,
    }
}

/// Runs `ip FAMILY -batch` in the namespace at `netns` over `lines`.
fn ip_batch(netns: &str, family: &str, lines: &str) -> Result<(), IsolationError> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["--", "ip", family, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io("running ip -batch"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(lines.as_bytes())
            .map_err(io("writing to ip -batch"))?;
    }
    let out = child.wait_with_output().map_err(io("running ip -batch"))?;
    if !out.status.success() {
        return Err(IsolationError::Setup(format!(
            "closing this host's addresses in the sandbox ({family}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The addresses of this host's interfaces (`None`) or of the network
/// namespace at `netns`, from `ip -json addr`.
fn addresses(netns: Option<&str>) -> Result<Vec<std::net::IpAddr>, IsolationError> {
    #[derive(serde::Deserialize)]
    struct Link {
        #[serde(default)]
        addr_info: Vec<Addr>,
    }
    #[derive(serde::Deserialize)]
    struct Addr {
        local: Option<String>,
    }
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={ns}")).args(["--", "ip"]);
            c
        }
        None => Command::new("ip"),
    };
    let out = c
        .args(["-json", "addr", "show"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(io("running ip -json addr"))?;
    let links: Vec<Link> = serde_json::from_slice(&out.stdout).map_err(|e| {
        IsolationError::Setup(format!(
            "reading `ip -json addr`: {e}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })?;
    Ok(links
        .iter()
        .flat_map(|l| &l.addr_info)
        .filter_map(|a| a.local.as_deref()?.parse().ok())
        .collect())
}

/// Where the id blocks in use on this machine are claimed (see
/// [`Isolation::take_block`]).
const BLOCK_REGISTRY: &str = "/run/sandbox-host/uid-blocks";

/// The first directory above `dir` that others cannot pass through (no
/// `o+x`), if any.
fn unreachable_ancestor(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().skip(1).find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| a.to_owned())
    })
}

/// The first range of `user` (by name or uid) in a subordinate id file.
fn subids(file: &str, user: &str, uid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let (name, start, count) = (f.next()?, f.next()?, f.next()?);
        if name != user && name != uid.to_string() {
            return None;
        }
        let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
        (count >= IDS_PER_SLOT).then_some((start, count))
    })
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Where the host makes slot groups: cgroup v2 (the unified hierarchy) for
/// delegation, and where the limits can be set (v2 controllers, else the
/// v1 `memory` and `pids` hierarchies).
#[derive(Debug, Clone, Default)]
struct CgroupLayout {
    /// `<v2 mount><own group>/sandbox-slots`
    v2: Option<PathBuf>,
    v2_limits: bool,
    /// `<v1 mount><own group>/sandbox-slots`, per controller.
    v1_memory: Option<PathBuf>,
    v1_pids: Option<PathBuf>,
}

const GROUP: &str = "sandbox-slots";

impl CgroupLayout {
    fn detect() -> CgroupLayout {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let path_of = |controller: &str| {
            own.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
                ctrls
                    .split(',')
                    .any(|c| c == controller)
                    .then(|| path.trim_start_matches('/').to_owned())
            })
        };
        let mut l = CgroupLayout::default();
        let v2_own = own
            .lines()
            .find_map(|x| x.strip_prefix("0::"))
            .map(|p| p.trim_start_matches('/').to_owned());
        for mount in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            if Path::new(mount).join("cgroup.controllers").is_file()
                && let Some(own) = &v2_own
            {
                let parent = Path::new(mount).join(own);
                let base = parent.join(GROUP);
                if std::fs::create_dir_all(&base).is_ok() {
                    let avail = std::fs::read_to_string(parent.join("cgroup.controllers"))
                        .unwrap_or_default();
                    let has = |c: &str| avail.split_whitespace().any(|x| x == c);
                    if has("memory") && has("pids") {
                        let _ =
                            std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids");
                        let _ =
                            std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids");
                        let on = std::fs::read_to_string(base.join("cgroup.controllers"))
                            .unwrap_or_default();
                        let _ =
                            std::fs::write(base.join("cgroup.subtree_control"), "+memory +pids");
                        l.v2_limits = on.contains("memory") && on.contains("pids");
                    }
                    l.v2 = Some(base);
                }
                break;
            }
        }
        if !l.v2_limits {
            for (ctrl, slot) in [("memory", &mut l.v1_memory), ("pids", &mut l.v1_pids)] {
                let mount = Path::new("/sys/fs/cgroup").join(ctrl);
                if let Some(own) = path_of(ctrl)
                    && mount.join("cgroup.procs").is_file()
                {
                    let base = mount.join(own).join(GROUP);
                    if std::fs::create_dir_all(&base).is_ok() {
                        *slot = Some(base);
                    }
                }
            }
        }
        l
    }

    fn create(
        &self,
        id: &str,
        uid: u32,
        gid: u32,
        memory: u64,
        pids: u64,
    ) -> Result<SlotCgroups, IsolationError> {
        let mut g = SlotCgroups::default();
        let mkdir = |base: &Path| -> Result<PathBuf, IsolationError> {
            let d = base.join(id);
            std::fs::create_dir_all(&d).map_err(io(format!("creating {}", d.display())))?;
            Ok(d)
        };
        let write = |p: PathBuf, v: String| {
            std::fs::write(&p, v).map_err(io(format!("writing {}", p.display())))
        };
        if let Some(base) = &self.v2 {
            let d = mkdir(base)?;
            if self.v2_limits {
                write(d.join("memory.max"), memory.to_string())?;
                write(d.join("pids.max"), pids.to_string())?;
            }
            // Delegation (cgroup v2's rules): the directory and the files
            // that move processes and enable controllers.
            for f in [
                "",
                "cgroup.procs",
                "cgroup.threads",
                "cgroup.subtree_control",
            ] {
                let p = d.join(f);
                let _ = std::os::unix::fs::chown(&p, Some(uid), Some(gid));
            }
            g.v2 = Some(d);
        }
        if let Some(base) = &self.v1_memory {
            let d = mkdir(base)?;
            write(d.join("memory.limit_in_bytes"), memory.to_string())?;
            g.v1.push(d);
        }
        if let Some(base) = &self.v1_pids {
            let d = mkdir(base)?;
            write(d.join("pids.max"), pids.to_string())?;
            g.v1.push(d);
        }
        if !self.v2_limits && g.v1.len() < 2 {
            tracing::warn!(
                "no cgroup hierarchy with memory and pids controllers is writable: slots run without --slot-memory-max and --slot-pids-max"
            );
        }
        Ok(g)
    }
}

/// One slot's groups.
#[derive(Debug, Default)]
pub(super) struct SlotCgroups {
    v2: Option<PathBuf>,
    v1: Vec<PathBuf>,
}

impl SlotCgroups {
    fn procs_fds(&self) -> Vec<OwnedFd> {
        self.v2
            .iter()
            .chain(self.v1.iter())
            .filter_map(|d| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .ok()
                    .map(OwnedFd::from)
            })
            .collect()
    }
}

/// Ends everything of a slot that the kill of its agent (PID 1 of its pid
/// namespace) leaves: its groups (cgroup.kill, then removed) and its pasta.
/// Blocking; safe to call for a slot that was never isolated.
pub(super) fn teardown(id: &str, dir: &Path) {
    if let Some(pid) = std::fs::read_to_string(dir.join("pasta.pid"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*dir.to_string_lossy()))
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    release_block(dir);
    let layout = CgroupLayout::detect_existing();
    for base in layout {
        let d = base.join(id);
        if !d.is_dir() {
            continue;
        }
        kill_group(&d);
        let deadline = Instant::now() + Duration::from_secs(5);
        while remove_group(&d).is_err() && Instant::now() < deadline {
            kill_group(&d);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Frees the id block the slot `dir` holds, if the registry still gives it
/// to that slot.
fn release_block(dir: &Path) {
    let Some(block) = std::fs::read_to_string(dir.join("uid_block"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    else {
        return;
    };
    let link = Path::new(BLOCK_REGISTRY).join(block.to_string());
    if std::fs::read_link(&link).is_ok_and(|t| t == dir) {
        let _ = std::fs::remove_file(&link);
    }
}

impl CgroupLayout {
    /// The bases that exist (without creating any), for teardown.
    fn detect_existing() -> Vec<PathBuf> {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mut out = Vec::new();
        for l in own.lines() {
            let mut f = l.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            let mounts: Vec<PathBuf> = if ctrls.is_empty() {
                vec!["/sys/fs/cgroup".into(), "/sys/fs/cgroup/unified".into()]
            } else {
                ctrls
                    .split(',')
                    .filter(|c| matches!(*c, "memory" | "pids"))
                    .map(|c| Path::new("/sys/fs/cgroup").join(c))
                    .collect()
            };
            for m in mounts {
                let b = m.join(rel).join(GROUP);
                if b.is_dir() {
                    out.push(b);
                }
            }
        }
        out
    }
}

/// SIGKILL to every process in a group and its descendants.
fn kill_group(d: &Path) {
    if std::fs::write(d.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let mut stack = vec![d.to_owned()];
    while let Some(g) = stack.pop() {
        for f in ["cgroup.procs", "tasks"] {
            if let Ok(t) = std::fs::read_to_string(g.join(f)) {
                for pid in t.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&g) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
}

/// Removes a group and the groups below it, deepest first.
fn remove_group(d: &Path) -> std::io::Result<()> {
    let mut all = vec![d.to_owned()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            all.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        i += 1;
    }
    for g in all.iter().rev() {
        std::fs::remove_dir(g)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_ranges_are_found_by_name_or_uid() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("subuid");
        std::fs::write(&f, "alice:100000:65536\n1001:300000:131072\nbob:5:10\n").unwrap();
        let f = f.to_str().unwrap();
        assert_eq!(subids(f, "alice", 1000), Some((100000, 65536)));
        assert_eq!(subids(f, "carol", 1001), Some((300000, 131072)));
        // Too small for one slot.
        assert_eq!(subids(f, "bob", 7), None);
        assert_eq!(subids(f, "dave", 8), None);
    }
}
