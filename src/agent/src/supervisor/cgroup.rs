//! cgroup v2 groups for servers, when the agent may create them.
//!
//! Each server runs in its own group below `<agent's cgroup>/sandbox-agent-<pid>`
//! (the pid keeps agents that share a cgroup apart; groups left by an agent
//! that died are emptied and removed by the next one).
//! The group lets a stop find and kill every process of the server, even
//! ones that left its session, and carries the `memory.max` limit when the
//! memory controller can be enabled there. Without a writable cgroup v2
//! hierarchy the supervisor falls back to process groups and sessions.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Magic number of a cgroup2 filesystem (statfs f_type).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where server groups are created.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    dir: PathBuf,
    memory: bool,
}

/// One server's group.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
}

// f_type's integer type differs between libc targets (glibc, musl).
#[allow(clippy::unnecessary_cast)]
fn is_cgroup2(p: &Path) -> bool {
    rustix::fs::statfs(p).is_ok_and(|s| s.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// `supervisor.cgroup` names a directory outside any cgroup v2 hierarchy.
#[derive(Debug, thiserror::Error)]
#[error("supervisor.cgroup: {} is not on a cgroup v2 filesystem", .0.display())]
pub struct NotCgroup2(pub PathBuf);

impl CgroupRoot {
    /// Finds a writable cgroup v2 hierarchy. `configured` is the
    /// `supervisor.cgroup` setting: "auto", "off", or a directory.
    pub fn detect(configured: &str) -> Result<Option<CgroupRoot>, NotCgroup2> {
        let dir = match configured {
            "off" => return Ok(None),
            "auto" => {
                let Some(mount) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                    .into_iter()
                    .map(Path::new)
                    .find(|p| is_cgroup2(p))
                else {
                    return Ok(None);
                };
                // "0::/path" is the v2 line of /proc/self/cgroup.
                let own = std::fs::read_to_string("/proc/self/cgroup")
                    .ok()
                    .and_then(|t| {
                        t.lines()
                            .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
                    })
                    .unwrap_or_else(|| "/".into());
                let parent = mount.join(own.trim_start_matches('/'));
                remove_stale(&parent);
                parent.join(format!("sandbox-agent-{}", std::process::id()))
            }
            path => {
                let p = PathBuf::from(path);
                if !is_cgroup2(p.parent().unwrap_or(&p)) && !is_cgroup2(&p) {
                    return Err(NotCgroup2(p));
                }
                p
            }
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                tracing::info!(dir = %dir.display(), error = %e, "cgroup v2 is not writable; stopping servers by process group and session");
                return Ok(None);
            }
        }
        // memory.max needs the memory controller enabled for our children,
        // which the kernel allows only where no process lives in the parent
        // (the root group is exempt). Try; a refusal only disables limits.
        if let Some(parent) = dir.parent() {
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
        }
        let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory");
        let memory = std::fs::read_to_string(dir.join("cgroup.subtree_control"))
            .is_ok_and(|s| s.split_whitespace().any(|c| c == "memory"));
        tracing::info!(dir = %dir.display(), memory_limits = memory, "servers run in cgroup v2 groups");
        Ok(Some(CgroupRoot { dir, memory }))
    }

    pub fn memory_limits(&self) -> bool {
        self.memory
    }

    /// A fresh group for `name`; a leftover one is emptied and replaced.
    pub fn create(&self, name: &str) -> io::Result<Cgroup> {
        let cg = Cgroup {
            dir: self.dir.join(name),
        };
        if cg.dir.exists() {
            cg.kill();
            cg.remove();
        }
        std::fs::create_dir(&cg.dir)?;
        Ok(cg)
    }
}

/// Empties and removes `sandbox-agent-<pid>` groups of agents that are gone.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("sandbox-agent-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(children) = std::fs::read_dir(e.path()) {
            for c in children.flatten().filter(|c| c.path().is_dir()) {
                let cg = Cgroup { dir: c.path() };
                cg.kill();
                cg.remove();
            }
        }
        let _ = std::fs::remove_dir(e.path());
    }
}

impl CgroupRoot {
    /// Removes the (empty) base group; called when the agent stops.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Cgroup {
    /// `cgroup.procs` opened for writing: a child writes "0" to it between
    /// fork and exec to join the group before it can fork anything.
    pub fn procs_fd(&self) -> io::Result<OwnedFd> {
        Ok(std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))?
            .into())
    }

    pub fn set_memory_max(&self, bytes: u64) -> io::Result<()> {
        std::fs::write(self.dir.join("memory.max"), bytes.to_string())
    }

    /// Every process in the group.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILL to every process in the group (cgroup.kill, or one by one on
    /// kernels before 5.14).
    pub fn kill(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Removes the (empty) group.
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "cgroup not removed");
        }
    }
}
