//! What an isolated slot leaves outside its namespaces when no host ends
//! it (its host killed, its data dir removed): its pasta, which runs beside
//! the slot's pid namespace and outlives the agent, and its cgroups. The
//! reclaim pass ends them.

use std::path::{Path, PathBuf};

use super::cgroups::{CgroupLayout, remove_group};

/// A slot's id: 32 hex digits (its directory's name).
fn is_slot_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Ends every pasta that serves a slot's network namespace (`--pid
/// <slot>/pasta.pid --netns /proc/<agent>/ns/net`, as `network` starts it)
/// whose agent is gone: that process no longer exists, or is no longer the
/// slot's (its command line does not name the slot). Whatever host started
/// it: such a pasta serves nothing. Returns how many it ended.
pub(in crate::pool) fn end_stray_pastas() -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut ended = 0;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if let Some((slot, agent)) = pasta_of(&args)
            && !slot_agent_alive(&slot, agent)
        {
            tracing::info!(pid, slot = %slot, "ending the pasta of a slot whose agent is gone");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            ended += 1;
        }
    }
    ended
}

/// The slot and the agent pid a pasta's command line names, if it is one
/// of a slot's.
fn pasta_of(args: &[String]) -> Option<(String, i32)> {
    let prog = Path::new(args.first()?).file_name()?.to_str()?;
    if prog != "pasta" {
        return None;
    }
    let after = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let pidfile = Path::new(after("--pid")?);
    if pidfile.file_name()?.to_str()? != "pasta.pid" {
        return None;
    }
    let slot = pidfile.parent()?.file_name()?.to_str()?;
    if !is_slot_id(slot) {
        return None;
    }
    let agent = after("--netns")?
        .strip_prefix("/proc/")?
        .strip_suffix("/ns/net")?
        .parse()
        .ok()?;
    Some((slot.to_owned(), agent))
}

/// Whether process `pid` runs and is slot `slot`'s agent (its command
/// line names the slot).
fn slot_agent_alive(slot: &str, pid: i32) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(c) => String::from_utf8_lossy(&c).contains(slot),
        // Gone for certain only when /proc says so.
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// The slot cgroups below this host's own cgroup that hold no process,
/// with their slot ids.
pub(in crate::pool) fn empty_slot_groups() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for base in CgroupLayout::detect_existing() {
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if is_slot_id(&id) && path.is_dir() && unpopulated(&path) {
                out.push((id, path));
            }
        }
    }
    out
}

/// No process in the group nor below it (cgroup v2 `populated 0`; v1: no
/// pid in its `cgroup.procs`, children included by the removal's failure).
fn unpopulated(group: &Path) -> bool {
    match std::fs::read_to_string(group.join("cgroup.events")) {
        Ok(ev) => ev.lines().any(|l| l.trim() == "populated 0"),
        Err(_) => {
            std::fs::read_to_string(group.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
        }
    }
}

/// Removes an empty slot group (a group with a process cannot be removed:
/// the kernel refuses, so a live slot never loses its group here).
pub(in crate::pool) fn remove_empty_group(group: &Path) -> std::io::Result<()> {
    remove_group(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_pasta_is_told_by_its_arguments() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let slot = "0123456789abcdef0123456789abcdef";
        let a = args(&format!(
            "/usr/bin/pasta --runas 0:0 --pid /d/slots/{slot}/pasta.pid --netns /proc/42/ns/net"
        ));
        assert_eq!(pasta_of(&a), Some((slot.to_owned(), 42)));
        // Another program, another pid file, no slot id: none.
        let b = args(&format!(
            "/usr/bin/passt --pid /d/slots/{slot}/pasta.pid --netns /proc/42/ns/net"
        ));
        assert_eq!(pasta_of(&b), None);
        let c = args("/usr/bin/pasta --pid /run/pasta.pid --netns /proc/42/ns/net");
        assert_eq!(pasta_of(&c), None);
        let d = args(&format!(
            "pasta --pid /d/{slot}/pasta.pid --netns /var/run/netns/x"
        ));
        assert_eq!(pasta_of(&d), None);
    }
}
