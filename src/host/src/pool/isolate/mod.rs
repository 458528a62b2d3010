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
//!
//! Here: the configuration, the errors, the agent's command and its
//! filesystem view; `ids` (the id blocks), `network` (pasta, closed
//! addresses, no nested user namespaces), `cgroups` (groups, limits,
//! teardown).

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod cgroups;
mod checks;
mod ids;
mod network;
pub mod slot_fs;
mod strays;
mod users;

use cgroups::CgroupLayout;
pub(super) use cgroups::{SlotCgroups, teardown};
use checks::{check_config, check_host, is_filesystem_root};
use ids::subids;
pub(super) use strays::{empty_slot_groups, end_stray_pastas, remove_empty_group};

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
    /// Each slot's own file system (`None`: the data dir's, unbounded).
    pub slot_fs: Option<slot_fs::SlotFs>,
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
    #[error(
        "fs.protected_hardlinks is 0 on this machine: a tenant could hard-link a file it does not own into a tree its agent reads or packs as root; set it to 1 (sysctl -w fs.protected_hardlinks=1, and a file in /etc/sysctl.d to keep it)"
    )]
    HardlinksUnprotected,
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
    /// Slot starts refused for want of a free id block.
    exhausted: std::sync::atomic::AtomicU64,
    /// Where id blocks are claimed machine-wide (`ids::BLOCK_REGISTRY`).
    registry: PathBuf,
}

impl Isolation {
    /// Checks the tools, the subordinate ids and the cgroup hierarchy.
    pub fn new(cfg: IsolationConfig) -> Result<Isolation, IsolationError> {
        check_host(&cfg)?;
        let data = std::fs::canonicalize(&cfg.data_dir).unwrap_or_else(|_| cfg.data_dir.clone());
        check_config(&cfg, &data)?;
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
        if !is_filesystem_root(&data) {
            tracing::warn!(
                data_dir = %data.display(),
                "sandboxes can read the data dir's path in /proc/self/mountinfo (the root field \
                 of their bind mounts is the path inside its filesystem, whatever bubblewrap \
                 does); put the data dir on a filesystem of its own (mounted at it) to hide it"
            );
        }
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
            exhausted: Default::default(),
            registry: ids::BLOCK_REGISTRY.into(),
        })
    }

    /// Where the slot's directory `sub` is on the host: on the slot's own
    /// file system when it has one (all but `run`, the agent's sockets).
    fn place(&self, dir: &Path, sub: &str) -> PathBuf {
        match self.cfg.slot_fs {
            Some(_) if sub != "run" => slot_fs::path(dir).join(sub),
            _ => dir.join(sub),
        }
    }

    /// Makes the slot's directories, owned by the root of its namespace,
    /// on the slot's own file system (mounted first) when it has one.
    pub(super) fn prepare_dirs(&self, dir: &Path, block: u32) -> Result<(), IsolationError> {
        let (uid, gid) = self.ids(block);
        // The host's root owns the slot directory (its log and pid files);
        // the agent only passes through it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
            .map_err(io(format!("chmod {}", dir.display())))?;
        if let Some(fs) = self.cfg.slot_fs {
            slot_fs::mount(dir, fs, (uid, gid))?;
        }
        for sub in ["ws", "state", "exec", "run"] {
            let p = self.place(dir, sub);
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
        users::write(dir).map_err(io(format!("writing {}/users", dir.display())))?;
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
        // The environment is the caller's (`AgentEnv::apply`): cleared,
        // then an allow-list; never the host's own.
        c.env_remove(super::agent_env::API_KEY_ENV);
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
        // multiprocessing and every program's temporary files need them):
        // on the slot's own file system when it has one.
        for (name, t) in slot_fs::TMP_DIRS {
            match self.cfg.slot_fs {
                Some(_) => mounts.push(("--bind", slot_fs::path(dir).join(name), t.into())),
                None => mounts.push(("--tmpfs-sticky", PathBuf::new(), t.into())),
            }
        }
        for d in SYSTEM_DIRS.iter().filter(|d| Path::new(d).is_dir()) {
            mounts.push(("--ro-bind", d.into(), d.into()));
        }
        // The sandbox's own users over the host's (its /etc is the host's).
        for (from, to) in users::mounts(dir) {
            mounts.push(("--ro-bind", from, to));
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
            mounts.push(("--bind", self.place(dir, sub), inside.into()));
        }
        view_args(mounts)
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
}

/// bubblewrap's arguments for `mounts` (operation, source, destination):
/// before each mount, the directories leading to it that are not there yet
/// (made world-traversable); none inside a read-only bind.
fn view_args(mounts: Vec<(&str, PathBuf, PathBuf)>) -> Vec<OsString> {
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
