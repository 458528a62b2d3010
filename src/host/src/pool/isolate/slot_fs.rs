//! An isolated slot's own file system: one tmpfs per slot, mounted by the
//! host at `<slot>/fs` before the slot's namespaces start. Everything a
//! tenant can write is on it: the workspace, the state root (the tenant's
//! home, the servers' state), the executions, and the sandbox's `/tmp`,
//! `/var/tmp` and `/dev/shm`. So
//! - what one lease can leave is bounded by the kernel: its size
//!   (`--slot-disk-bytes`) and inode count (`--slot-inodes`); a tenant past
//!   either gets ENOSPC, the host pays nothing later (its pages are charged
//!   to the slot's memory cgroup as well);
//! - a slot whose lease left many entries is discarded whole: an unmount,
//!   whatever the tenant made, instead of unlinking them one by one while
//!   the slot holds a place under `--max-slots` ([`used_inodes`], checked
//!   against `--recycle-max-inodes` at each Release).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use super::{IsolationError, io};

/// The mount point below the slot directory.
pub const DIR: &str = "fs";

/// The sandbox's temporary directories on it: (name on it, path inside).
pub const TMP_DIRS: [(&str, &str); 3] = [
    ("tmp", "/tmp"),
    ("var-tmp", "/var/tmp"),
    ("shm", "/dev/shm"),
];

/// The limits of each slot's file system.
#[derive(Debug, Clone, Copy)]
pub struct SlotFs {
    pub bytes: u64,
    pub inodes: u64,
}

/// The file system of slot directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(DIR)
}

/// Mounts the slot's file system, its root owned by the slot's root
/// (`uid`, `gid`, mode 0711), with the sandbox's temporary directories
/// (sticky, world-writable) made on it.
pub fn mount(dir: &Path, fs: SlotFs, (uid, gid): (u32, u32)) -> Result<(), IsolationError> {
    let at = path(dir);
    // A setup tried again on the same directory starts from nothing.
    unmount(dir);
    std::fs::create_dir_all(&at).map_err(io(format!("creating {}", at.display())))?;
    let data = format!(
        "size={},nr_inodes={},mode=0711,uid={uid},gid={gid}",
        fs.bytes, fs.inodes
    );
    nix::mount::mount(
        Some("sandbox-slot"),
        &at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| IsolationError::Setup(format!(
        "mounting the slot's file system (tmpfs, {data}) on {}: {e}; the process backend's isolation needs root (or run with --slot-disk-bytes 0, which leaves a lease's files unbounded)",
        at.display()
    )))?;
    for (name, _) in TMP_DIRS {
        let p = at.join(name);
        std::fs::create_dir(&p).map_err(io(format!("creating {}", p.display())))?;
        std::os::unix::fs::chown(&p, Some(uid), Some(gid))
            .map_err(io(format!("chown {}", p.display())))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777))
            .map_err(io(format!("chmod {}", p.display())))?;
    }
    Ok(())
}

/// Detaches the slot's file system (every one mounted there), if it has
/// one: the kernel frees it once the slot's namespaces are gone. Never
/// blocks on what it holds.
pub fn unmount(dir: &Path) {
    let at = path(dir);
    for _ in 0..8 {
        if !is_mounted(&at) {
            return;
        }
        if let Err(e) = nix::mount::umount2(&at, MntFlags::MNT_DETACH) {
            tracing::warn!(dir = %at.display(), error = %e, "cannot unmount a slot's file system");
            return;
        }
    }
}

/// How many inodes the slot's file system holds (`None` without one).
pub fn used_inodes(dir: &Path) -> Option<u64> {
    let at = path(dir);
    if !is_mounted(&at) {
        return None;
    }
    let s = nix::sys::statvfs::statvfs(&at).ok()?;
    Some((s.files() as u64).saturating_sub(s.files_free() as u64))
}

/// Whether `at` is a mount point (its device differs from its parent's).
fn is_mounted(at: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        std::fs::symlink_metadata(at),
        at.parent().map(std::fs::metadata),
    ) {
        (Ok(a), Some(Ok(p))) => a.dev() != p.dev(),
        _ => false,
    }
}
