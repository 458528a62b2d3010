//! What `GetInfo` reports about the machine and the agent process.
//!
//! Reads sysinfo (memory, load, own RSS) and the OS (uname, boot id,
//! statvfs). Each field that cannot be read is left at its zero value and
//! logged, so a partial answer never becomes a failed RPC.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// A snapshot of the machine and the agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub boot_id: String,
    pub system_uptime_seconds: u64,
    pub agent_uptime_ms: u64,
    pub agent_pid: u32,
    pub hostname: String,
    pub kernel_release: String,
    pub kernel_version: String,
    pub arch: String,
    pub cpu_count: u32,
    pub load: [f64; 3],
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    pub workspace: FsUsage,
    pub agent_rss_bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct FsUsage {
    pub path: PathBuf,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub available_bytes: u64,
}

/// Collects [`Snapshot`]s. Keeps one sysinfo `System` to avoid re-reading
/// static data on every call.
pub struct Collector {
    started: Instant,
    workspace: PathBuf,
    pid: Pid,
    /// Created on first use; `None` while sysinfo cannot initialise.
    sys: Mutex<Option<System>>,
}

impl Collector {
    pub fn new(workspace: &Path) -> Collector {
        Collector {
            started: Instant::now(),
            workspace: workspace.to_owned(),
            pid: Pid::from_u32(std::process::id()),
            sys: Mutex::new(None),
        }
    }

    /// Reads everything now. Blocking (procfs, statvfs): call it from a
    /// blocking-capable thread.
    pub fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot {
            agent_uptime_ms: self.started.elapsed().as_millis() as u64,
            agent_pid: std::process::id(),
            system_uptime_seconds: System::uptime().unwrap_or_else(|e| {
                tracing::debug!(error = %e, "uptime unavailable");
                0
            }),
            hostname: System::host_name().unwrap_or_default(),
            cpu_count: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(0),
            ..Snapshot::default()
        };
        match System::load_average() {
            Ok(l) => snap.load = [l.one, l.five, l.fifteen],
            Err(e) => tracing::debug!(error = %e, "load average unavailable"),
        }

        match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            Ok(s) => snap.boot_id = s.trim().to_owned(),
            Err(e) => tracing::debug!(error = %e, "boot id unavailable"),
        }
        let uts = nix::sys::utsname::uname();
        match uts {
            Ok(u) => {
                snap.kernel_release = u.release().to_string_lossy().into_owned();
                snap.kernel_version = u.version().to_string_lossy().into_owned();
                snap.arch = u.machine().to_string_lossy().into_owned();
            }
            Err(e) => tracing::debug!(error = %e, "uname failed"),
        }

        {
            // A poisoned lock only means another snapshot panicked; the
            // System inside is still usable.
            let mut guard = self.sys.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                match System::new() {
                    Ok(s) => *guard = Some(s),
                    Err(e) => tracing::warn!(error = %e, "sysinfo unavailable"),
                }
            }
            if let Some(sys) = guard.as_mut() {
                sys.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
                snap.memory_total_bytes = sys.total_memory();
                snap.memory_available_bytes = sys.available_memory();
                sys.refresh_processes_specifics(
                    ProcessesToUpdate::Some(&[self.pid]),
                    false,
                    ProcessRefreshKind::nothing().with_memory(),
                );
                snap.agent_rss_bytes = sys.process(self.pid).map(|p| p.memory()).unwrap_or(0);
            }
        }

        snap.workspace.path = self.workspace.clone();
        match nix::sys::statvfs::statvfs(&self.workspace) {
            Ok(v) => {
                let frag = v.fragment_size();
                snap.workspace.total_bytes = v.blocks() * frag;
                snap.workspace.free_bytes = v.blocks_free() * frag;
                snap.workspace.available_bytes = v.blocks_available() * frag;
            }
            Err(e) => {
                tracing::warn!(path = %self.workspace.display(), error = %e, "statvfs of workspace failed")
            }
        }
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_reads_this_machine() {
        let dir = std::env::temp_dir();
        let s = Collector::new(&dir).snapshot();
        assert!(s.cpu_count >= 1);
        assert!(s.memory_total_bytes > 0 && s.memory_available_bytes <= s.memory_total_bytes);
        assert!(s.agent_rss_bytes > 0);
        assert!(s.workspace.total_bytes >= s.workspace.free_bytes);
        assert!(!s.kernel_release.is_empty());
        assert_eq!(s.boot_id.len(), 36);
    }
}
