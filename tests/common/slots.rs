//! What a `sandbox-host` started by a test or a benchmark leaves of its
//! slots when it stops (sandboxes outlive a host on purpose, for
//! restarts): ended here, and the read-only paths its isolated sandboxes
//! need. Shared by `tests/` and `benches/`.

use std::path::{Path, PathBuf};

/// `--sandbox-ro` for what the servers run from here: this source tree,
/// pyenv's interpreters, the installed benchmark data (a real host has
/// them under /opt).
pub fn sandbox_read_only(bench_data: &Path) -> Vec<String> {
    let mut out = vec![
        "--sandbox-ro".to_owned(),
        env!("CARGO_MANIFEST_DIR").to_owned(),
    ];
    let pyenv = std::env::var("PYENV_ROOT")
        .ok()
        .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.pyenv")));
    if let Some(p) = pyenv.filter(|p| Path::new(p).is_dir()) {
        out.extend(["--sandbox-ro".to_owned(), p]);
    }
    out.extend(["--sandbox-ro".to_owned(), bench_data.display().to_string()]);
    out
}

/// The host pids of the slots' agents under the data dir `data`.
pub fn agents(data: &Path) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir(data.join("slots")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("agent.pid")).ok())
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Ends every slot of the (stopped) host of `data`: an isolated agent is
/// PID 1 of its pid namespace, so its death ends every process there; its
/// pasta, whatever else is left in its cgroups (bubblewrap's own process
/// when the host was killed mid-way), the cgroups and its own file system
/// go after it.
pub fn end_all(data: &Path) {
    let sig = nix::sys::signal::Signal::SIGKILL;
    for pid in agents(data) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::killpg(pid, sig);
        let _ = nix::sys::signal::kill(pid, sig);
    }
    // A slot the host was starting when it died may still be setting up
    // (its bubblewrap names the slot's paths): a few passes catch it.
    for _ in 0..5 {
        if kill_mentioning(data) == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let Ok(rd) = std::fs::read_dir(data.join("slots")) else {
        return;
    };
    for slot in rd.flatten() {
        if let Some(p) = std::fs::read_to_string(slot.path().join("pasta.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), sig);
        }
        let id = slot.file_name().to_string_lossy().into_owned();
        let mut groups = kill_members(&id);
        groups.extend(
            [
                "/sys/fs/cgroup/unified/sandbox-slots",
                "/sys/fs/cgroup/sandbox-slots",
                "/sys/fs/cgroup/pids/sandbox-slots",
            ]
            .map(|base| Path::new(base).join(&id)),
        );
        for group in groups {
            remove_cgroup(&group);
        }
    }
    // The isolated slots' own file systems, which the host mounted and
    // leaves to a restarted host: detached, so the test's directory can go
    // and the kernel frees them.
    unmount_slot_file_systems(data);
}

/// SIGKILLs every process whose command line names a path under `data`;
/// returns how many.
fn kill_mentioning(data: &Path) -> usize {
    // With the separator: "data-a/" never matches another host's "data-ab/".
    let needle = format!("{}/", data.display());
    let mut n = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if pid != std::process::id() as i32 && String::from_utf8_lossy(&cmd).contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            n += 1;
        }
    }
    n
}

/// SIGKILLs every process in a cgroup of slot `id` (any hierarchy) and
/// returns those cgroups' directories.
fn kill_members(id: &str) -> Vec<PathBuf> {
    let needle = format!("/sandbox-slots/{id}");
    let mut groups = std::collections::BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path().join("cgroup")) else {
            continue;
        };
        let mut member = false;
        for line in text.lines() {
            // `N:controllers:/path`; v2's controllers are empty.
            let mut f = line.splitn(3, ':');
            let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            if let Some(at) = path.find(&needle) {
                member = true;
                let root = Path::new("/sys/fs/cgroup");
                let base = match controllers {
                    // v2: beside the v1 hierarchies (hybrid), or the root.
                    "" if root.join("unified").is_dir() => root.join("unified"),
                    "" => root.to_owned(),
                    c => root.join(c.split(',').next().unwrap_or(c)),
                };
                groups.insert(base.join(path[..at + needle.len()].trim_start_matches('/')));
            }
        }
        if member {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    groups.into_iter().collect()
}

/// Removes a (dead) slot's cgroup and the groups below it, deepest first.
fn remove_cgroup(d: &Path) {
    let mut all = vec![d.to_owned()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(rd) = std::fs::read_dir(&all[i]) {
            all.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        i += 1;
    }
    for _ in 0..50 {
        if all
            .iter()
            .rev()
            .all(|g| std::fs::remove_dir(g).is_ok() || !g.exists())
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A slot's workspace as its tenants see it, from the host: the tree an
/// isolated agent binds over /workspace (`<slot>/fs/ws/tree` on the slot's
/// own file system, its bookkeeping beside it), or `<slot>/ws` itself for
/// an agent that is not PID 1 of its own namespaces.
pub fn slot_workspace(slot: &Path) -> PathBuf {
    let ws = slot_place(slot, "ws");
    let tree = ws.join("tree");
    if tree.is_dir() { tree } else { ws }
}

/// Where a slot's directory `sub` (`ws`, `state`, `exec`) is on the host:
/// on the slot's own file system (`<slot>/fs/<sub>`) when it has one.
pub fn slot_place(slot: &Path, sub: &str) -> PathBuf {
    let own = slot.join("fs").join(sub);
    if own.is_dir() { own } else { slot.join(sub) }
}

/// Detaches the own file systems of the slots under data dir `data` (what
/// an operator does before removing the data dir of a dead host).
pub fn unmount_slot_file_systems(data: &Path) {
    for slot in std::fs::read_dir(data.join("slots"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let _ = nix::mount::umount2(&slot.path().join("fs"), nix::mount::MntFlags::MNT_DETACH);
    }
}
