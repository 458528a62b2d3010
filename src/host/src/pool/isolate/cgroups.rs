//! A slot's cgroups: its own group(s) with `memory.max` and `pids.max`
//! (cgroup v2 where those controllers are enabled, else v1), delegated to
//! its agent; killed and removed at teardown.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ids::release_block;
use super::{Isolation, IsolationError, io};

impl Isolation {
    /// The slot's cgroups, made and limited, before its agent starts.
    pub(in crate::pool) fn cgroups(
        &self,
        id: &str,
        block: u32,
    ) -> Result<SlotCgroups, IsolationError> {
        let (uid, gid) = self.ids(block);
        self.cgroups
            .create(id, uid, gid, self.cfg.memory_max, self.cfg.pids_max)
    }
}

/// Where the host makes slot groups: cgroup v2 (the unified hierarchy) for
/// delegation, and where the limits can be set (v2 controllers, else the
/// v1 `memory` and `pids` hierarchies).
#[derive(Debug, Clone, Default)]
pub(in crate::pool) struct CgroupLayout {
    /// `<v2 mount><own group>/sandbox-slots`
    v2: Option<PathBuf>,
    v2_limits: bool,
    /// `<v1 mount><own group>/sandbox-slots`, per controller.
    v1_memory: Option<PathBuf>,
    v1_pids: Option<PathBuf>,
}

const GROUP: &str = "sandbox-slots";

impl CgroupLayout {
    pub(super) fn detect() -> CgroupLayout {
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
pub(in crate::pool) struct SlotCgroups {
    v2: Option<PathBuf>,
    v1: Vec<PathBuf>,
}

impl SlotCgroups {
    pub(super) fn procs_fds(&self) -> Vec<OwnedFd> {
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
pub(in crate::pool) fn teardown(id: &str, dir: &Path) {
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

impl CgroupLayout {
    /// The bases that exist (without creating any), for teardown.
    pub(super) fn detect_existing() -> Vec<PathBuf> {
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
pub(super) fn remove_group(d: &Path) -> std::io::Result<()> {
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
